"""Where a step goes: the model's forward, the backward and the optimizer's step, timed on the
training thread with the tracer's clock and logged as :class:`~traceml_nb.engine.events.Phase`
events (the segmenter adds each to the step it falls in, and times the input copy: from a
batch's arrival to the first forward after it). On CUDA each phase also records a CUDA event at
its start and its end (:class:`PhaseClock`), from which its GPU time is read once the GPU is past
them (:mod:`.gpu_events`).

**A sample of the steps.** Hooks on a module make every call of it take torch's slower path, and
putting them in place and taking them away costs tens of microseconds: over the budget of a
sub-millisecond step if paid on every one. So the phases are timed on the first step and then on
one step in about every :data:`EARLY_SAMPLE_INTERVAL_S` of training, and every
:data:`SAMPLE_INTERVAL_S` (and :data:`MIN_SAMPLE_SKIP` steps at least) once :data:`EARLY_SAMPLES`
were taken: the instruments are put in place at an optimizer step's end and taken away at the same
optimizer's next one (where a GAN's other optimizer stepped in between, at the one after), and each
switch is logged (:class:`~traceml_nb.engine.events.Sampling`), so the segmenter gives phases to
the steps that ran while they were on, and none to the others. How many steps to skip is told from
the steps' pace since the last sample. A loop without an optimizer (an evaluation) keeps them on
throughout.

**The model is found without being named.** Until the first optimizer step (or the first model
called a second time, or a compiled module called), global module forward hooks watch every module
call and take as the model each module called from outside any other module that holds parameters
(the loss function holds none); from then on only those modules carry hooks, while sampled, and
only during each of their calls (never at a step boundary, where a loop copies or saves its model:
a deep copy would keep them, a pickle fails on them). Several models (a GAN's two), a model called
twice a step and a DDP wrapper are all outermost modules; a model first called after that first
step is found by a sample that begins at the step of an optimizer no sample saw (a new model and
optimizer for each fold, each trial: :meth:`_seek_again`), and is not seen otherwise. The backward
is ``torch.autograd.backward`` (what ``loss.backward()`` calls), wrapped while sampled; the
optimizer's step starts at a global optimizer pre-step hook and ends in the tracer's post-step hook
(:meth:`StepPhases.optimizer_step_ended`), so a step's optimizer phase is logged before the step's
end. Putting the model's hooks in place at its call is timed as no phase (a
:data:`~traceml_nb.engine.events.SETUP`, which ends the input copy): the forward starts after.

A phase that starts inside another (a forward recomputed by activation checkpointing inside the
backward, the forward and backward of an optimizer's closure) is part of the outer one. Calls on
other threads than the one that started the run (``DataParallel``'s replicas) are not timed,
nor calls that ``torch.compile`` traces (the hooks return at once there, so the compiled graph
holds nothing of ours and breaks nowhere: a compiled model is timed from outside, whole; a
module compiled in place calls its hooks inside the compiled call, which runs ours as they are,
:mod:`.compilation`); the warning torch gives when a compiled module is called while global
hooks are in place is held back while the model is sought (it is about our hooks, not the
user's). A module that takes no hooks of its own (``torch.jit.script``'s) is not a model to
time: :attr:`StepPhases.notes` says so.
Everything is put back when the run ends, as :mod:`.hooks` does for the rest.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable
from typing import Any

from ..events import BACKWARD, FORWARD, OPTIMIZER, SAMPLING, EventLike
from .compilation import (
    compiled_anything,
    hold_compile_warning,
    is_compiled,
    is_compiled_wrapper,
    let_compile_warning_through,
    run_as_they_are,
)
from .model_sizes import ModelSizes
from .optimizer_hooks import register_pre
from .phase_clock import PhaseClock
from .sample_schedule import SampleSchedule
from .whole_step import WholeStep

#: The phases are timed on the first step, then on about one step in this much training time,
#: s, until :data:`EARLY_SAMPLES` steps were timed (so that a run of a few seconds, the demo's,
#: still times a few dozen)...
EARLY_SAMPLE_INTERVAL_S = 0.05
EARLY_SAMPLES = 32
#: ...and from then on one step in this much, s. A sample costs about 70 us on the 2-core VM
#: (the tiny MLP's step with the hooks, and the hooks put in place and taken away), and makes
#: the steps around it slower too: sampled every 0.05 s, the tiny MLP's median step (0.8 ms)
#: grew by 4-6 us more than sampled every 0.2 s (benchmarks/README.md, 2026-12-05).
SAMPLE_INTERVAL_S = 0.2
#: ...and, after the early samples, at most one step in this many optimizer steps: a sample's
#: switching costs the step before it and its own step tens of microseconds each inside
#: ``optimizer.step()``, and every 0.2 s is every few steps of a conv net's 30 ms or a GPU
#: model's 100 ms. Sampling one conv step in 7 moved the median step's time inside ``next()``
#: and ``optimizer.step()`` by 14-16 us; one in 33, by none measurable (benchmarks/README.md,
#: 2026-12-07). A step of 1 s is then timed every 33 s, after 32 steps timed at the start.
MIN_SAMPLE_SKIP = 32
#: Optimizer steps skipped after the first sample, before the steps' pace is known.
FIRST_SKIP = 4
#: A sample ends after this many optimizer step ends whatever it waits for (an optimizer's
#: ``step()`` that raised leaves its phase open, and its end never comes).
MAX_SAMPLE_ENDS = 16


#: The note of a model that takes no hooks (a TorchScript module), whose forward goes untimed.
NO_HOOKS = (
    "the forward of {name} is not timed: a TorchScript model takes no hooks (its time is in "
    "the rest of the step)"
)


def _nothing(*_: Any) -> None:
    return None


def _forward_hook(target: Any, hook: Callable[..., None]) -> Any:
    """``target.register_forward_hook(hook)`` called even when the forward raises, where torch
    can (2.1 and later); ``target`` a module, or the module package for a global hook."""
    register = getattr(target, "register_forward_hook", None) or target.register_module_forward_hook
    try:
        return register(hook, always_call=True)
    except TypeError:
        return register(hook)


class StepPhases:
    """The run's phase instruments: :meth:`install` them, :meth:`remove` them (twice is safe);
    the tracer's optimizer post-step hook calls :meth:`optimizer_step_ended` first thing."""

    def __init__(
        self,
        log: list[tuple[Any, ...]],
        clock: Callable[[], int],
        check: Callable[[], None],
        max_log: int,
        gpu_mark: Callable[[], EventLike | None] | None = None,
    ):
        self.clock = PhaseClock(log, clock, check, max_log, gpu_mark)
        #: the constants as they are when the run starts (the early interval never the longer)
        self.schedule = SampleSchedule(
            int(SAMPLE_INTERVAL_S * 1e9),
            int(min(EARLY_SAMPLE_INTERVAL_S, SAMPLE_INTERVAL_S) * 1e9),
            MIN_SAMPLE_SKIP,
            FIRST_SKIP,
            EARLY_SAMPLES,
        )
        #: the outermost modules with parameters seen so far, by id (the model or models),
        #: held weakly: a model the user's code lets go is freed then, as without the run (a
        #: model held to the run's end kept its memory through the next one's training, and a
        #: DDP model was freed after the user's ``destroy_process_group()``: a rank hung there)
        self.models: weakref.WeakValueDictionary[int, Any] = weakref.WeakValueDictionary()
        self.sampling = False  #: the instruments are on now
        #: optimizer steps until the next look at the sampling (a countdown, so that the
        #: tracer's hook does a subtraction a step, not a call)
        self.countdown = 1
        self._sample_step = WholeStep()  #: the step the sample waits to end (the first's: any)
        self._ends = 0  #: optimizer step ends seen in this sample (bounded: MAX_SAMPLE_ENDS)
        self._installed = False
        self._paused: bool | None = None  #: after :meth:`pause`: were the models still sought
        self._warning_filter: Any = None  #: the filter holding COMPILE_WARNING back, while seeking
        self._optimizer_hook: Any = None  #: the global optimizer pre-step hook, while sampling
        #: an optimizer's step was compiled (``torch.compile`` traced the pre-step hook): the
        #: hook then stays until the run's end, as each change to the global optimizer hooks
        #: would compile the step again, until torch's recompile limit
        self._optimizer_compiled = False
        self._model_handles: list[Any] = []  #: the models' own hooks, while they are on
        #: the global pre-hook that waits for a model's call while sampling (:meth:`_arm`)
        self._arming: Any = None
        #: the models' hooks come off after each forward, and the arming hook goes back (eager
        #: models: a step boundary, or a batch of an evaluation, sees the model as it was made)
        self._arming_again = False
        self._watching: list[Any] = []  #: the global module hooks, while the model is sought
        self._seeking_again = False  #: the models are sought again in this sample
        self.sizes = ModelSizes()  #: the parameters of the models each search found
        self._optimizers: weakref.WeakSet[Any] = weakref.WeakSet()  #: those samples saw step
        self._stack: list[bool] = []  #: per module call open: did it start the forward?
        self._has_parameters: dict[int, bool] = {}
        self.notes: list[str] = []  #: what the run should say of the phases (models not timed)
        #: the hooks and the wrapper of torch.autograd.backward, made once by :meth:`install`
        self._optimizer_starts: Callable[..., None] = _nothing
        self._forward_starts: Callable[..., None] = _nothing
        self._forward_ends: Callable[..., None] = _nothing
        self._backward: Any = None
        self._original_backward: Any = None

    # --- on and off --------------------------------------------------------------------------
    def install(self) -> None:
        """Start: sampling on, and the global module hooks seek the model. After
        :meth:`pause`, resume instead, where the sampling stood."""
        if self._paused is not None:
            self._resume()
            return
        import torch

        self._installed = True
        clock = self.clock
        original = self._original_backward = torch.autograd.backward

        def optimizer_step_starts(*_: Any) -> None:
            if clock.compiling():
                self._optimizer_compiled = True
            elif self.sampling:
                clock.start(OPTIMIZER)

        def forward_starts(*_: Any) -> None:
            clock.start(FORWARD)

        def forward_ends(*_: Any) -> None:
            clock.end()
            if self._arming_again and not clock.depth:
                self._arm_again()

        def backward(*args: Any, **kwargs: Any) -> Any:
            __tracebackhide__ = True  # noqa: F841
            clock.start(BACKWARD)
            try:
                return original(*args, **kwargs)
            finally:
                clock.end()

        backward.__wrapped__ = original  # type: ignore[attr-defined]
        backward.__doc__ = original.__doc__
        self._optimizer_starts, self._forward_starts, self._forward_ends = (
            optimizer_step_starts,
            forward_starts,
            forward_ends,
        )
        self._backward = backward
        run_as_they_are(forward_starts, forward_ends, self._seek_pre, self._seek_post, self._arm)
        self._watch()
        self._sample(True)

    def pause(self) -> None:
        """Take every instrument away and keep the models found and where the sampling stands:
        :meth:`install` resumes from there. The benchmarks' interleaved blocks (plain, traced,
        ...) stand for one long run this way; a run's end is :meth:`remove`."""
        if not self._installed:
            return
        self._paused = bool(self._watching)
        self._take_off(self._watching)
        self._take_off_sample(end=True)
        self._let_warnings_through()
        self._stack = []
        self._put_back_backward()
        self.clock.reset()

    def _resume(self) -> None:
        seeking, self._paused = self._paused, None
        self.clock.thread = threading.get_ident()
        if seeking:
            self._watch()
        if self.sampling:
            self._put_in_place()

    def _watch(self) -> None:
        """The global module hooks that seek the model, and the compile warning held back."""
        import torch.nn.modules.module as module_mod

        self._watching = [
            module_mod.register_module_forward_pre_hook(self._seek_pre),
            _forward_hook(module_mod, self._seek_post),
        ]
        self._warning_filter = hold_compile_warning()

    def optimizer_step_ended(self, optimizer: Any) -> None:
        """The tracer's hook, at an optimizer step's end (:attr:`countdown` ran out, or while
        sampling): the optimizer phase ends; the sampling may turn, off once a whole step fell
        inside (:class:`~.whole_step.WholeStep`; the first sample, at the first end), or after
        :data:`MAX_SAMPLE_ENDS` ends."""
        clock = self.clock
        self.countdown = 1
        if clock.depth and clock.phase == OPTIMIZER:
            clock.end()
            if clock.depth and self._ends < MAX_SAMPLE_ENDS:
                # the end of a step() inside another of the same optimizer (a subclass's step
                # calling its base's, both hooked by torch): the outer one ends the phase
                self._ends += 1
                return
        if not self._installed:
            self.countdown = 1 << 62
        elif not self.sampling:
            self._sample_step, self._ends = WholeStep(optimizer), 0
            self.schedule.on_at_ns = self.clock.clock()
            if not self._watching and self._note_sampled(optimizer):
                self._seek_again()
            self._sample(True)
        elif self._sample_step.closes_at(optimizer) or self._ends >= MAX_SAMPLE_ENDS:
            self._note_sampled(optimizer)  # (the first sample began at install, not here)
            self._sample(False)
            self.countdown = self.schedule.skip(self.clock.clock())
        else:
            self._ends += 1

    def _note_sampled(self, optimizer: Any) -> bool:
        """Note that a sample saw ``optimizer`` step: whether none had before (one that takes no
        weak reference counts as seen)."""
        try:
            new = optimizer not in self._optimizers
            self._optimizers.add(optimizer)
        except TypeError:
            return False
        return new

    def _seek_again(self) -> None:
        """A sample begins at the step of an optimizer no sample saw: the global hooks seek the
        models again in it (a model made since, each fold's, had its forward timed by nothing);
        not where ``torch.compile`` compiled anything, which the hooks would compile again."""
        if self._optimizer_compiled or compiled_anything():
            return
        self._seeking_again = True
        self._watch()

    def _sample(self, on: bool) -> None:
        if self._watching and not on:
            self._settle()
        self.sampling = on
        self.clock.log.append((SAMPLING, on))
        if on:
            self.schedule.samples += 1
            self._put_in_place()
            return
        self._take_off_sample()
        self._put_back_backward()
        self.clock.reset()  # a phase left open (a step() that raised) ends with the sample

    def _put_in_place(self) -> None:
        """The sampled step's instruments: the optimizer pre-step hook (it stays once a compile
        traced it), the models' hooks (unless the global ones seek them), the backward's
        wrapper. An eager model's hooks go on at each of its calls (:meth:`_arm`) and come off
        when its forward returns, never at the step boundary, where a loop copies or saves its
        model (a copy would keep our hooks, a pickle fails on them); the wrapper
        ``torch.compile(model)`` returns gets them at once (a global hook around it warns)."""
        import torch
        import torch.nn.modules.module as module_mod

        if self._optimizer_hook is None:
            self._optimizer_hook = register_pre(self._optimizer_starts)
        if not self._watching and self.models:
            if self._any_compiled_wrapper():
                self._add_model_hooks()
            else:
                self._arming = module_mod.register_module_forward_pre_hook(self._arm)
        torch.autograd.backward = self._backward

    def _arm(self, module: Any, args: Any) -> None:
        """A global pre-hook while sampling, until a model is called: its call puts the models'
        hooks in place (this call's forward started here, ended by the model's post-hook)."""
        clock = self.clock
        if id(module) not in self.models or clock.compiling():
            return
        if threading.get_ident() != clock.thread:
            return
        t_start = clock.clock()
        if self._arming is not None:
            self._arming.remove()
            self._arming = None
        self._add_model_hooks()
        self._arming_again = True
        # putting the hooks in place (tens of microseconds, the code cold in a sampled step)
        # is neither the loop's input copy nor the model's forward
        clock.set_up(t_start)
        clock.start(FORWARD)

    def _arm_again(self) -> None:
        """A model's forward ended: its hooks come off, the arming hook goes back on (a cycle
        costs ~4.6 us on the 2-core VM, once a sampled step, or once a batch of an evaluation)."""
        import torch.nn.modules.module as module_mod

        self._take_off(self._model_handles)
        self._arming_again = False
        if self.sampling and self._arming is None:
            self._arming = module_mod.register_module_forward_pre_hook(self._arm)

    def _put_back_backward(self) -> None:
        import torch

        if self._backward is not None and torch.autograd.backward is self._backward:
            torch.autograd.backward = self._original_backward

    # --- seeking the model -------------------------------------------------------------------
    def _seek_pre(self, module: Any, args: Any) -> None:
        if self.clock.compiling() or threading.get_ident() != self.clock.thread:
            return
        stack = self._stack
        # a compiled module (the wrapper, or compiled in place): the global hooks go before it
        # traces its forward, else the graph it compiles would be compiled again once they are
        # gone
        compiled = is_compiled(module)
        if not stack and self._holds_parameters(module):
            again = id(module) in self.models and not self._seeking_again
            if not again and not self._takes_hooks(module):
                stack.append(False)  # inside it, no module is the model either
                return
            self.models[id(module)] = module
            self.sizes.found(module)
            if again or compiled:  # a model called again (no optimizer step yet), or compiled
                self._settle()
                self._add_model_hooks()  # the model's own post-hook ends this forward
                self._arming_again = not self._any_compiled_wrapper()
            else:
                stack.append(True)
            self.clock.start(FORWARD)
        elif compiled:
            self._settle()
            self._add_model_hooks()
        else:
            stack.append(False)

    def _seek_post(self, module: Any, args: Any, output: Any) -> None:
        if self.clock.compiling() or threading.get_ident() != self.clock.thread:
            return
        stack = self._stack
        if stack and stack.pop():
            self.clock.end()

    def _holds_parameters(self, module: Any) -> bool:
        known = self._has_parameters.get(id(module))
        if known is None:
            known = next(iter(module.parameters()), None) is not None
            self._has_parameters[id(module)] = known
        return known

    def _takes_hooks(self, module: Any) -> bool:
        """Whether ``module`` takes hooks of its own, as a model must (``torch.jit.script``'s
        module takes none; ``torch.jit.trace``'s does); one that does not is noted once
        (:attr:`notes`) and never timed."""
        try:
            module.register_forward_pre_hook(_nothing).remove()
        except Exception:
            self._has_parameters[id(module)] = False  # no candidate, from now on
            note = NO_HOOKS.format(name=type(module).__name__)
            if note not in self.notes:
                self.notes.append(note)
            return False
        return True

    def _settle(self) -> None:
        """Stop watching every module call: the models found are the models."""
        self._take_off(self._watching)
        self._let_warnings_through()
        self._stack = []
        self._has_parameters = {}
        self.sizes.settled(self._seeking_again)
        self._seeking_again = False

    def _any_compiled_wrapper(self) -> bool:
        return any(is_compiled_wrapper(model) for model in self.models.values())

    @staticmethod
    def _take_off(handles: list[Any]) -> None:
        for handle in handles:
            handle.remove()
        handles.clear()

    def _take_off_sample(self, end: bool = False) -> None:
        """Every hook of the sample: the global ones (a compiled optimizer step's pre-step
        hook only at the run's ``end``), the models', the arming one."""
        if self._optimizer_hook is not None and (end or not self._optimizer_compiled):
            self._optimizer_hook.remove()
            self._optimizer_hook = None
        self._take_off(self._model_handles)
        if self._arming is not None:
            self._arming.remove()
            self._arming = None
        self._arming_again = False

    def _add_model_hooks(self) -> None:
        """The models' own hooks, while sampling without the global ones. A call under way
        that started its forward through the global pre-hook is ended by the model's own
        post-hook, in place before its forward returns."""
        for model in self.models.values():
            self._model_handles += [
                model.register_forward_pre_hook(self._forward_starts),
                _forward_hook(model, self._forward_ends),
            ]

    def _let_warnings_through(self) -> None:
        """Take back the filter that held torch's compile warning."""
        held, self._warning_filter = self._warning_filter, None
        let_compile_warning_through(held)

    # --- the end -----------------------------------------------------------------------------
    def models_training(self) -> bool | None:
        """Whether a model found is in training mode (``Module.training``): False where each
        is in eval mode (``model.eval()``), None where none was found."""
        models = list(self.models.values())
        if not models:
            return None
        return any(getattr(model, "training", True) for model in models)

    def remove(self) -> None:
        """Put back what :meth:`install` changed; what is left open logs nothing."""
        self._take_off(self._watching)
        self._take_off_sample(end=True)
        self._let_warnings_through()
        self._stack = []
        self.models = weakref.WeakValueDictionary()
        self._has_parameters = {}
        self._put_back_backward()
        self._backward = None
        self._paused = None
        self._installed = False
        self.sampling = False
        self.countdown = 1 << 62
        self.clock.reset()
        self.clock.thread = -1  # a wrapper left beneath another's logs nothing from now on
