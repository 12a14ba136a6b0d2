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


@dataclass(frozen=True)
class FlopCount:
    """What the counting found: ``flops`` per step (floating-point operations, a multiply-add
    counting 2, as FlopCounterMode counts), ``window_ns`` when it counted (ns from the run
    start; the steps that began inside it are left out), or ``why`` there is no count.

    ``by_dtype``: the same FLOPs by the precision they ran in, as the peak table names them
    (``"fp32"``, ``"tf32"``: float32 on tensor cores where torch allows it, ``"fp16"``,
    ``"bf16"``; another dtype by its torch name); empty where this torch's counter could not
    tell. ``device``: what they ran on, ``"cpu"`` or the CUDA device's name (``"Tesla T4"``).
    ``conv_flops``: those of convolutions (forward and backward), and ``channels_last_flops``
    those of them whose input or weight was in channels_last memory format (both 0 where not
    told).
    """

    flops: int | None = None
    window_ns: tuple[int, int] | None = None
    why: str = NO_OPTIMIZER
    by_dtype: dict[str, int] = field(default_factory=dict)
    device: str = ""
    conv_flops: int = 0
    channels_last_flops: int = 0
