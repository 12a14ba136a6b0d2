"""What the FLOP count of a run found (:mod:`traceml_nb.engine.instrument.flop_count` counts),
kept in the run record as :attr:`~traceml_nb.engine.record.RunRecord.flops`."""

from __future__ import annotations

from dataclasses import dataclass, field

NO_OPTIMIZER = "no optimizer step ran: FLOPs are counted over one training step"
COMPILED = (
    "a model was compiled with torch.compile in this process: counting its FLOPs would make "
    "torch compile it again"
)
ENDED = "the run ended during the step whose FLOPs were being counted"
#: The loop trained another model later in the run (:class:`~.instrument.model_sizes.ModelSizes`).
MODEL_CHANGED = (
    "the model changed during the run (its parameters {before:,} → {after:,}: a new model, as "
    "a sweep over model sizes in one cell makes): the FLOPs counted on one step are not every "
    "step's"
)
#: Each step counted had an evaluation inside (``FlopWindow`` tries ``FLOP_COUNT_TRIES``).
#: The trainable parameters changed more than ``trainable.MAX_RECOUNTS`` times.
TRAINABLE_CHANGING = (
    "the trained parameters changed {n} times during the run (parameters frozen and unfrozen): "
    "no FLOP count holds for its steps"
)
EVALUATION_COUNTED = (
    "an evaluation ran while the step's FLOPs were counted: its FLOPs cannot be told from the "
    "training step's"
)


@dataclass(frozen=True)
class FlopCount:
    """What the counting found: ``flops`` per step (floating-point operations, a multiply-add
    counting 2, as FlopCounterMode counts), ``window_ns`` when it counted (ns from the run
    start; the steps that began inside it are left out, being slowed by the counting), or
    ``why`` there is no count. ``counted_ns``: the part of ``window_ns`` the count that stands
    spans (the steps that began inside it divide ``flops``); it begins later where a count
    that caught an evaluation was given up and the next step counted instead.

    ``by_dtype``: the same FLOPs by the precision they ran in, as the peak table names them
    (``"fp32"``, ``"tf32"``: float32 on tensor cores where torch allows it, ``"fp16"``,
    ``"bf16"``; another dtype by its torch name); empty where this torch's counter could not
    tell. ``device``: what they ran on, ``"cpu"`` or the CUDA device's name (``"Tesla T4"``).
    ``conv_flops``: those of convolutions (forward and backward), and ``channels_last_flops``
    those of them whose input or weight was in channels_last memory format (both 0 where not
    told). ``recomputed_flops``: the FLOPs of the forwards that activation checkpointing
    recomputed in the backward, counted but not in ``flops`` (the model's: each forward once,
    as MFU counts them), over the same steps; 0 where none ran or none could be told.
    ``outside_flops``: those done outside every module call and outside the autograd engine,
    with autograd off (an optimizer's own matrix work, as Muon's) or before the step's first
    module call (the batch's preparation: fastai's batch transforms, an augmentation on the
    GPU), not in ``flops`` either; 0 where none, or where this torch could not tell module
    calls apart. ``uncounted_ops``: the
    operators of other libraries, and those of torch's that compute, that ran in the counted
    steps and that the counter has no formula for
    (``"xformers::efficient_attention_forward_cutlass"``, ``"aten::_fft_r2c"``): whatever FLOPs
    they did are not in ``flops``, a lower bound then.
    ``uncounted_outside_ops``: those that ran outside the model, as ``outside_flops`` tells it
    (an optimizer's eigendecompositions, as Shampoo's and SOAP's): not in ``outside_flops``, and
    no part of the model's ``flops``.
    ``since_ns``: where the loop changed the parameters it trains after an earlier count stood
    (an unfreeze: :mod:`.instrument.trainable`), when that was seen (ns from the run start):
    this count is of the steps since, counted again; None where the count is the whole run's.
    ``earlier_windows_ns``: the windows of the counts made before it, whose steps the counting
    slowed too.
    """

    flops: int | None = None
    window_ns: tuple[int, int] | None = None
    why: str = NO_OPTIMIZER
    by_dtype: dict[str, int] = field(default_factory=dict)
    device: str = ""
    conv_flops: int = 0
    channels_last_flops: int = 0
    counted_ns: tuple[int, int] | None = None
    recomputed_flops: int = 0
    outside_flops: int = 0
    uncounted_ops: tuple[str, ...] = ()
    uncounted_outside_ops: tuple[str, ...] = ()
    since_ns: int | None = None
    earlier_windows_ns: tuple[tuple[int, int], ...] = ()

    @property
    def count_window_ns(self) -> tuple[int, int] | None:
        """The window of the count that stands (``counted_ns``, else ``window_ns``)."""
        return self.counted_ns or self.window_ns
