"""The settings of an optimizer that stepped during a run, as the advice reads them (a fused
update is advised only to an optimizer that has one and does not use it)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

#: The optimizers of ``torch.optim`` that take ``fused=True`` (on CPUs and GPUs).
FUSABLE = frozenset({"Adam", "AdamW", "SGD", "Adagrad"})


@dataclass(frozen=True)
class OptimizerInfo:
    """``kind``: the optimizer's class name; ``fused``/``foreach``: its defaults' settings
    (None: left to torch's choice); ``tensors``: the parameter tensors it updates;
    ``fusable``: it is (or derives from) one of the ``FUSABLE`` optimizers of torch.optim."""

    kind: str
    fused: bool | None = None
    foreach: bool | None = None
    tensors: int = 0
    fusable: bool = False

    @property
    def can_fuse(self) -> bool:
        """It has a fused update and does not use it."""
        return self.fusable and not self.fused


def optimizer_info(optimizer: Any) -> OptimizerInfo:
    """What ``optimizer`` is and how it updates (never raises: an unusual optimizer gives what
    could be read)."""
    cls = type(optimizer)
    fusable = any(
        c.__name__ in FUSABLE and c.__module__.startswith("torch.optim") for c in cls.__mro__
    )
    try:
        defaults = getattr(optimizer, "defaults", None) or {}
        tensors = sum(len(g.get("params", ())) for g in optimizer.param_groups)
        fused, foreach = defaults.get("fused"), defaults.get("foreach")
        return OptimizerInfo(cls.__name__, fused, foreach, tensors, fusable)
    except Exception:
        return OptimizerInfo(cls.__name__, fusable=fusable)
