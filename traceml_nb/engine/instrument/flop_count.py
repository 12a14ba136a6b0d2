"""The FLOPs of one training step, counted once per run with
``torch.utils.flop_counter.FlopCounterMode`` over one whole step (:class:`~.whole_step.WholeStep`:
from the end of an optimizer step to the same optimizer's next end, or where another optimizer
stepped in between, a GAN's, to the one after), after :data:`COUNT_AFTER_STEPS` optimizer
steps (past the first steps' one-off work). The counting slows the step it counts (every
operator goes through a Python dispatch mode), so the step that began inside it is left out of
the statistics, as profiled steps are
(:attr:`~traceml_nb.engine.flop_capture.FlopCount.window_ns`).

The count is of the model's FLOPs, its forwards and backwards: a forward that activation
checkpointing recomputes in the backward is counted apart (:mod:`.recompute`), as the MFU counts
each forward once, and so is work done with autograd off outside every module call and outside
the autograd engine (an optimizer's own matrix work: ``torch.optim.Muon``'s step on a two-layer
512-wide MLP did 95 times its forward and backward at a batch of 32).

Operators the counter has no formula for, which common models run, are counted by
:mod:`.flop_formulas` (the recurrent layers, attention on a CPU and in flash-attn, the
matrix-vector products); those that may compute and that no formula counts are named
(``FlopCount.uncounted_ops``, or ``uncounted_outside_ops`` outside the model). The counter
also adds each operator's FLOPs to the precision it ran in (its first tensor's dtype; float32
on a GPU with tensor cores for it, compute capability 8.0 or later, counts as tf32 where torch
allows it for that kind of operator, :mod:`.tf32`: convolutions and cuDNN's recurrent layers by
cuDNN's settings, the rest by the matmul precision), which the MFU's peak is looked up by.

A count during which a loader that does not train was iterated (an evaluation: the common
``if step % N == 0: evaluate()`` after the optimizer step runs one right after the first step)
counted the evaluation's forwards too: it is given up and the next step counted instead, up to
:data:`FLOP_COUNT_TRIES` steps; the steps of every try are left out of the statistics. An
evaluation on tensors, without a DataLoader (``with torch.no_grad(): model(X_val)``), shows as a
call of a model the optimizers train made with autograd off
(:class:`~.calls_without_grad.CallsWithoutGrad`): that count is tried again too, but where every
try saw one, such a call is part of each step (the pseudo-labels of a semi-supervised loop, a
model run twice, once without gradients) and the smallest count stands.

Where the loop changes the parameters it trains after the count stood (an unfreeze: fastai's
``fine_tune``), the steps after it do other work: the count is made again (:mod:`.trainable`),
and stands for the steps since.

Not counted, with why: a loop without an optimizer step (no step to count), a process that has
compiled a model with ``torch.compile`` (counting would make it compile again), a torch without
the FLOP counter, a run that ended during the counted step, an evaluation in every step tried.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

from ..flop_capture import (
    COMPILED,
    ENDED,
    EVALUATION_COUNTED,
    MODEL_CHANGED,
    TRAINABLE_CHANGING,
    FlopCount,
)
from .calls_without_grad import CallsWithoutGrad
from .compilation import compiled_anything
from .flop_formulas import WITHOUT_FORMULA, extra_formulas
from .model_sizes import ModelSizes
from .recompute import recomputing
from .tf32 import CONV, MATMUL, RNN, tf32_allowed
from .trainable import MAX_RECOUNTS, TRAINABLE_CHECK_STEPS, TrainableWatch
from .whole_step import WholeStep

#: Optimizer steps before the counted one: the second step is counted (the first does one-off
#: work; a count later would take a step from a short run's statistics that the warm-up does
#: not already take).
COUNT_AFTER_STEPS = 1
#: Steps counted at most, one after the other, while each count catches an evaluation: one
#: evaluation every few steps is missed by the second try; a loop that evaluates in every step
#: loses no more than this many steps from its statistics to the tries (its FLOPs are then
#: unavailable, or with a model called without autograd in each step, the smallest count).
FLOP_COUNT_TRIES = 3


#: The PyTorch dtypes the peak table has columns for, by their names there.
PRECISIONS = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16"}
#: Convolutions: their float32 work follows cuDNN's convolution TF32 setting (:mod:`.tf32`),
#: and their FLOPs are counted apart (``conv_flops``, for the channels_last advice).
CONVOLUTIONS = frozenset({"convolution", "convolution_backward", "_convolution"})
#: cuDNN's recurrent layers: their float32 work follows cuDNN's RNN TF32 setting (the other
#: operators follow the matmul one).
CUDNN_RNNS = frozenset({"_cudnn_rnn", "_cudnn_rnn_backward"})
#: Products of a matrix and a vector, or of two vectors: cuBLAS runs them without tensor cores
#: (gemv, dot), so their float32 work is fp32 whatever TF32 torch allows.
VECTOR_PRODUCTS = frozenset({"mv", "addmv", "dot", "vdot"})
#: Operator namespaces whose operators do no floating-point work of their own that a count would
#: miss: torch's own (``aten``, its primitives; but for those of
#: :data:`~.flop_formulas.WITHOUT_FORMULA`, an FFT, a solve), the profiler's marks
#: (``record_function``, which every optimizer step opens) and the collectives. An operator of
#: any other library (a custom attention kernel,
#: ``xformers::efficient_attention_forward_cutlass``) that the counter has no formula for
#: (:mod:`.flop_formulas`) is named in the count (``FlopCount.uncounted_ops``): its FLOPs, if
#: any, are not in it.
FLOP_FREE_NAMESPACES = frozenset(
    {"aten", "prims", "prim", "debugprims", "profiler", "c10d", "_c10d_functional",
     "_c10d_functional_autograd", "fsdp", "_dtensor", "symm_mem"}
)  # fmt: skip
#: At most this many such operators are named.
MAX_UNCOUNTED_OPS = 5


def _never(*_: Any) -> bool:
    return False


def _may_compute(packet: Any) -> str:
    """The name of an operator without a formula (``"ns::op"``) where it may do floating-point
    work: another library's, or torch's of :data:`~.flop_formulas.WITHOUT_FORMULA`; ''
    otherwise."""
    name = str(getattr(packet, "_qualified_op_name", packet))  # "ns::op" (or "ns.op")
    namespace, _, op = name.replace("::", ".").partition(".")
    if namespace not in FLOP_FREE_NAMESPACES or (namespace == "aten" and op in WITHOUT_FORMULA):
        return name
    return ""


def _first_tensor(values: Any) -> Any:
    import torch

    for value in values:
        if isinstance(value, torch.Tensor):
            return value
        if isinstance(value, (tuple, list)):
            found = _first_tensor(value)
            if found is not None:
                return found
    return None


def _channels_last(tensor: Any) -> bool:
    """A 4-D tensor laid out channels_last (and not also plain contiguous, as a 1x1 one is):
    a convolution runs channels_last when its input or weight is (a backward's gradient
    arrives in whatever layout the layers after it gave)."""
    import torch

    return (
        isinstance(tensor, torch.Tensor)
        and tensor.dim() == 4
        and tensor.is_contiguous(memory_format=torch.channels_last)
        and not tensor.is_contiguous()
    )


class _WholeStepOnly:
    """Stands in for the counter's module tracker (``torch.utils.module_tracker``): every
    operator's FLOPs count toward the step as a whole, none toward a module. The tracker would
    attribute them by module through global module hooks and gradient hooks on each module's
    inputs, and those hooks make ``torch.autograd.grad`` of a module's output with respect to
    its input (a gradient penalty, a physics-informed loss) raise "A leaf node was passed to
    _will_engine_execute_node": the user's step would fail because we counted it."""

    parents = frozenset({"Global"})

    def __enter__(self) -> _WholeStepOnly:
        return self

    def __exit__(self, *_: Any) -> None:
        return None


def _counter() -> Any:
    """A FlopCounterMode with formulas for the operators it has none for
    (:mod:`.flop_formulas`: recurrent layers, attention, matrix-vector products) that also
    sums each operator's FLOPs by the precision it ran in (``by_dtype``) and notes the device
    (``device``), through the counter's per-operator method: where a torch has no such method,
    the count stands and ``by_dtype`` stays empty; FLOPs whose precision cannot be read count
    as ``"unknown"`` (the MFU then says so)."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    tf32 = {kind: tf32_allowed(kind) for kind in (MATMUL, CONV, RNN)}

    failed: list[str] = []  # "<operator> (<error>)" of each formula that failed

    def note(name: str, exc: Exception) -> None:
        failed.append(f"{name} ({exc!r})")

    try:
        formulas = extra_formulas(note)
    except Exception:  # a torch whose counter has no registry to add to: its own formulas
        formulas = {}

    class PrecisionFlopCounter(FlopCounterMode):
        def __init__(self) -> None:
            try:
                super().__init__(display=False, custom_mapping=formulas)
            except TypeError:  # a counter that takes no formulas: its own
                super().__init__(display=False)
            if hasattr(self, "mod_tracker"):
                self.mod_tracker = _WholeStepOnly()  # type: ignore[assignment]
            self.by_dtype: dict[str, int] = {}
            self.failed_formulas = failed
            self.device = ""
            self.conv_flops = self.channels_last_flops = 0
            self.recomputed = 0  #: of the total, the forwards activation checkpointing redid
            self.outside = 0  #: ...and the work outside the model (``outside_model``)
            #: of the operator's inputs: whether it runs outside the model
            self.outside_model: Callable[[Any], bool] = _never
            #: operators without a formula that may compute (other libraries', torch's of
            #: WITHOUT_FORMULA), in the order seen: in the model's work, and outside it
            self.uncounted: dict[str, None] = {}
            self.uncounted_outside: dict[str, None] = {}
            #: each operator without a formula looked at: its name where it may compute, or ""
            self._names: dict[Any, str] = {}
            self._tensor_cores: dict[int, bool] = {}

        def _count_flops(self, *args: Any, **kwargs: Any) -> Any:
            packet = args[0] if args else None
            inputs = args[2] if len(args) > 2 else ()
            if packet not in self.flop_registry:
                name = self._names.get(packet)
                if name is None:
                    name = self._names[packet] = _may_compute(packet)
                if name:
                    uncounted = (
                        self.uncounted_outside if self.outside_model(inputs) else self.uncounted
                    )
                    uncounted[name] = None
            before = self.get_total_flops()
            result = super()._count_flops(*args, **kwargs)  # type: ignore[misc]
            added = self.get_total_flops() - before
            if added and recomputing():
                self.recomputed += added  # the model's FLOPs count each forward once
            elif added and self.outside_model(inputs):
                self.outside += added
            elif added:
                try:
                    func_packet, out, op_args = args[0], args[1], args[2]
                    tensor = _first_tensor((out, *op_args))
                    key = self._precision(func_packet, tensor)
                    if str(func_packet).split(".")[-1] in CONVOLUTIONS:
                        self.conv_flops += added
                        if any(_channels_last(a) for a in op_args[:3]):
                            self.channels_last_flops += added
                except Exception:
                    key = "unknown"
                self.by_dtype[key] = self.by_dtype.get(key, 0) + added
            return result

        def _precision(self, func_packet: Any, tensor: Any) -> str:
            name = str(tensor.dtype).removeprefix("torch.")
            device = tensor.device
            if not self.device:
                self.device = (
                    torch.cuda.get_device_name(device) if device.type == "cuda" else device.type
                )
            if name != "float32" or device.type != "cuda":
                return PRECISIONS.get(name, name)
            index = device.index or 0
            if index not in self._tensor_cores:
                self._tensor_cores[index] = torch.cuda.get_device_capability(index) >= (8, 0)
            if not self._tensor_cores[index]:
                return "fp32"
            op = str(func_packet).split(".")[-1]
            if op in VECTOR_PRODUCTS:
                return "fp32"
            allowed = tf32[CONV if op in CONVOLUTIONS else RNN if op in CUDNN_RNNS else MATMUL]
            if allowed is None:  # torch's settings could not be read
                return "unknown"
            return "tf32" if allowed else "fp32"

    return PrecisionFlopCounter()


class FlopWindow:
    """Counts the FLOPs of one step; the tracer's optimizer post-step hook calls
    :meth:`optimizer_step_ended` when :attr:`countdown` runs out. ``found`` is handed the
    :class:`FlopCount` as soon as the counted step ends (the live view shows the MFU from
    then on); :meth:`close` at the run's end gives it too, or why there is none.
    ``evaluated_since(t_ns)``: whether an evaluation's loader was fetched since ``t_ns``
    (:meth:`~.tracer.StepTracer.evaluated_since`); a count that caught one is tried again."""

    def __init__(
        self,
        clock: Callable[[], int],
        t0_ns: int,
        found: Callable[[FlopCount], None],
        evaluated_since: Callable[[int], bool] | None = None,
    ) -> None:
        self.clock = clock
        self.t0_ns = t0_ns
        self.found = found
        self.evaluated_since = evaluated_since
        self.countdown = COUNT_AFTER_STEPS
        self.result: FlopCount | None = None
        self._mode: Any = None
        self._first_ns = 0  #: when the first try began
        self._start_ns = 0  #: ...and the one under way
        self._tries = 0
        self._step: WholeStep | None = None  #: the step counted, while it is
        self._optimizers: list[Any] = []  #: those that stepped since the first try began
        self._calls: CallsWithoutGrad | None = None  #: watching the try under way
        #: the tries that saw a trained model called without autograd, and nothing else
        self._without_grad: list[FlopCount] = []
        #: the models the phase instruments found (:func:`.hooks.install` sets it): where the
        #: run changed its model, the count is no longer the run's at :meth:`close`
        self.sizes: ModelSizes | None = None
        self._watch = TrainableWatch()  #: what the optimizers trained when the count stood
        self._recounts = 0
        self._since_ns: int | None = None  #: when the change counted again for was seen
        self._earlier: tuple[tuple[int, int], ...] = ()  #: the windows of the counts before

    def optimizer_step_ended(self, optimizer: Any) -> None:
        self.countdown = 1
        if self.result is not None:
            self.countdown = 1 << 62
            if self.result.flops is not None:  # a count stands: the trained parameters watched
                self.countdown = TRAINABLE_CHECK_STEPS
                if self._watch.changed(optimizer):
                    self._count_again(optimizer)
            return
        if not any(o is optimizer for o in self._optimizers):
            self._optimizers.append(optimizer)
        if self._mode is None:
            self._begin(optimizer)
        elif self._step is not None and self._step.closes_at(optimizer):
            self._end(optimizer)

    def look_at_next_step(self) -> bool:
        """An epoch began: where a count stood, look at the trained parameters at the next
        optimizer step (True), not only every ``TRAINABLE_CHECK_STEPS``."""
        if self.result is None or self.result.flops is None:
            return False
        self.countdown = 1
        return True

    def _count_again(self, optimizer: Any) -> None:
        """``optimizer`` trains other parameters than when the count stood: count the next
        step, which stands for the steps from now (after ``MAX_RECOUNTS``, no count does)."""
        done = self.result
        assert done is not None
        if done.window_ns is not None:
            self._earlier += (done.window_ns,)
        if self._recounts >= MAX_RECOUNTS:
            self._conclude(FlopCount(why=TRAINABLE_CHANGING.format(n=self._recounts + 1)))
            return
        self._recounts += 1
        self._since_ns = self.clock() - self.t0_ns
        self.result, self._tries, self._without_grad = None, 0, []
        self._optimizers = [optimizer]
        self._begin(optimizer)
        self.countdown = 1

    def _begin(self, optimizer: Any) -> None:
        if compiled_anything():
            self._conclude(FlopCount(why=COMPILED))
            return
        try:
            mode = _counter()
            mode.__enter__()
        except Exception as exc:
            self._conclude(FlopCount(why=f"the FLOP counter could not start ({exc!r})"))
            return
        self._mode, self._step = mode, WholeStep(optimizer)
        try:
            modules = self.sizes is not None and self.sizes.found_any
            self._calls = CallsWithoutGrad(self._optimizers, modules)
        except Exception:  # an older torch, whose global forward hooks have no always_call
            self._calls = None
        else:
            mode.outside_model = self._calls.outside_model
        self._tries += 1
        self._start_ns = self.clock()
        if self._tries == 1:
            self._first_ns = self._start_ns

    def _end(self, optimizer: Any) -> None:
        mode, self._mode, self._step = self._mode, None, None
        end_ns = self.clock()
        without_grad = self._stop_watching()
        try:
            mode.__exit__(None, None, None)
            flops = int(mode.get_total_flops()) - mode.recomputed - mode.outside
        except Exception as exc:
            self._conclude(FlopCount(why=f"the FLOP counter failed ({exc!r})"))
            return
        window = (self._first_ns - self.t0_ns, end_ns - self.t0_ns)
        if mode.failed_formulas:  # part of the step counted nothing: no count rather than less
            why = f"the FLOP formula for {mode.failed_formulas[0]} failed"
            self._conclude(FlopCount(why=why, window_ns=window))
            return
        count = FlopCount(
            flops,
            window,
            "",
            dict(mode.by_dtype),
            mode.device,
            mode.conv_flops,
            mode.channels_last_flops,
            counted_ns=(self._start_ns - self.t0_ns, window[1]),
            recomputed_flops=mode.recomputed,
            outside_flops=mode.outside,
            uncounted_ops=tuple(mode.uncounted)[:MAX_UNCOUNTED_OPS],
            uncounted_outside_ops=tuple(mode.uncounted_outside)[:MAX_UNCOUNTED_OPS],
        )
        evaluated = self.evaluated_since is not None and self.evaluated_since(self._start_ns)
        if not evaluated and not without_grad:
            self._stand(count, optimizer)
            return
        if not evaluated:
            self._without_grad.append(count)
        if self._tries < FLOP_COUNT_TRIES:
            self._begin(optimizer)
        if self._mode is not None:
            return
        if self._tries == FLOP_COUNT_TRIES and self._without_grad:  # part of every step
            least = min(self._without_grad, key=lambda c: c.flops or 0)
            self._stand(replace(least, window_ns=window), optimizer)
            return
        why = self.result.why if self.result is not None else EVALUATION_COUNTED
        self._conclude(FlopCount(why=why, window_ns=window))  # no try left, or none could start

    def _stand(self, count: FlopCount, optimizer: Any) -> None:
        self._watch.note(optimizer)
        self._conclude(count)
        self.countdown = TRAINABLE_CHECK_STEPS
        self.found(self.result or count)

    def _conclude(self, result: FlopCount) -> None:
        """The count is over: ``result`` stands, and no optimizer is held (an optimizer holds
        its model's parameters and state, which the user's code may let go during the run)."""
        self.result = self._after_earlier(result)
        self.countdown = 1 << 62
        self._optimizers = []
        self._step = None

    def _stop_watching(self) -> bool:
        calls, self._calls = self._calls, None
        return calls is not None and calls.remove()

    def leave(self) -> None:
        """Leave a count under way without a result: in a process forked during it (a
        DataLoader worker), whose thread inherited the counter's dispatch mode. Where the
        child's code has put a mode of its own above it, it stays."""
        self._stop_watching()
        mode, self._mode = self._mode, None
        if mode is None:
            return
        from torch.utils._python_dispatch import _get_current_dispatch_mode

        if _get_current_dispatch_mode() is getattr(mode, "mode", mode):  # torch < 2.4: itself
            try:
                mode.__exit__(None, None, None)
            except Exception:
                pass

    def close(self) -> FlopCount:
        """The count (a count under way is given up: the run ended inside it)."""
        self._stop_watching()
        self._optimizers = []
        if self._mode is not None:
            mode, self._mode = self._mode, None
            try:
                mode.__exit__(None, None, None)
            except Exception:
                pass
            self.result = FlopCount(why=ENDED, window_ns=(self._first_ns - self.t0_ns, 1 << 62))
        result = self.result or FlopCount()
        changed = self.sizes.changed if self.sizes is not None else None
        if changed is not None and result.flops is not None:
            why = MODEL_CHANGED.format(before=changed[0], after=changed[1])
            result = FlopCount(why=why, window_ns=result.window_ns)
        return self._after_earlier(result)

    def _after_earlier(self, result: FlopCount) -> FlopCount:
        """``result`` with the windows of the counts made before it, and where it was counted
        again, since when it stands."""
        if not self._earlier:
            return result
        return replace(result, since_ns=self._since_ns, earlier_windows_ns=self._earlier)
