"""The settings of an optimizer that stepped during a run, as the advice reads them (a fused
update is advised only to an optimizer that has one and does not use it; a torch optimizer in
place of fastai's own, where one does the same update)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

#: The optimizers of ``torch.optim`` that take ``fused=True`` (on CPUs and GPUs).
FUSABLE = frozenset({"Adam", "AdamW", "SGD", "Adagrad"})
#: fastai's optimizers by the callback that makes their update (the last of their ``cbs``):
#: ``opt_func`` as fastai names it.
FASTAI_KINDS = {
    "adam_step": "Adam",
    "sgd_step": "SGD",
    "momentum_step": "SGD",
    "radam_step": "RAdam",
    "lamb_step": "Lamb",
    "rms_prop_step": "RMSProp",
    "qhadam_step": "QHAdam",
    "larc_step": "Larc",
}
#: The ``torch.optim`` optimizer that makes the same update as a fastai one, by its kind and
#: how it decays weights (its ``weight_decay`` callback decouples the decay from the gradient,
#: as AdamW does; ``l2_reg`` adds it to the gradient, as torch's ``weight_decay`` argument
#: does). None listed: no torch optimizer makes that update.
FASTAI_TORCH_TWINS = {
    ("Adam", "weight_decay"): "AdamW",
    ("Adam", "l2_reg"): "Adam",
    ("SGD", "l2_reg"): "SGD",
}
#: The defaults of each twin's arguments that fastai's hyperparameters set: an argument whose
#: fastai value differs is given to the twin (fastai's Adam averages the squared gradients
#: with 0.99, not 0.999, and divides by eps 1e-5, not 1e-8).
TWIN_DEFAULTS: dict[str, dict[str, Any]] = {
    "AdamW": {"betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.01},
    "Adam": {"betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.0},
    "SGD": {"momentum": 0.0, "weight_decay": 0.0},
}


@dataclass(frozen=True)
class OptimizerInfo:
    """``kind``: the optimizer's class name (fastai's own: the ``opt_func`` that makes it,
    ``Adam``); ``fused``/``foreach``: its defaults' settings (None: left to torch's choice);
    ``tensors``: the parameter tensors it updates; ``fusable``: it is (or derives from) one of
    the ``FUSABLE`` optimizers of torch.optim; ``fastai_twin``: for fastai's own optimizers
    (one tensor at a time, in Python), the torch.optim optimizer that makes the same update,
    "" where none does; None for any other optimizer; ``twin_arguments``: what the twin is
    given to make it with the fastai optimizer's hyperparameters (``(name, value)`` pairs)."""

    kind: str
    fused: bool | None = None
    foreach: bool | None = None
    tensors: int = 0
    fusable: bool = False
    fastai_twin: str | None = None
    twin_arguments: tuple[tuple[str, Any], ...] = ()

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
        tensors = sum(len(g.get("params", ())) for g in optimizer.param_groups)
    except Exception:
        tensors = 0
    own = _fastai_own(optimizer) if cls.__module__.startswith("fastai.") else None
    if own is not None:
        return OptimizerInfo(own[0], tensors=tensors, fastai_twin=own[1], twin_arguments=own[2])
    try:
        defaults = getattr(optimizer, "defaults", None) or {}
        fused, foreach = defaults.get("fused"), defaults.get("foreach")
        return OptimizerInfo(cls.__name__, fused, foreach, tensors, fusable)
    except Exception:
        return OptimizerInfo(cls.__name__, tensors=tensors, fusable=fusable)


def _fastai_own(optimizer: Any) -> tuple[str, str, tuple[tuple[str, Any], ...]] | None:
    """For one of fastai's own optimizers (an update made by its callbacks, ``cbs``): the
    ``opt_func`` that made it (its class name where its callbacks do not tell), the torch
    optimizer that makes its update ("" none) and that optimizer's arguments; None for any
    other."""
    try:
        names = [getattr(cb, "__name__", None) or cb.func.__name__ for cb in optimizer.cbs]
    except Exception:  # OptimWrapper: a torch optimizer inside, no callbacks
        return None
    kind = FASTAI_KINDS.get(names[-1] if names else "", type(optimizer).__name__)
    decay = next((n for n in names if n in ("weight_decay", "l2_reg")), "")
    twin = FASTAI_TORCH_TWINS.get((kind, decay), "")
    try:
        hypers = dict(optimizer.hypers[0])
    except Exception:
        return kind, twin, ()
    values: dict[str, Any]
    if twin in ("Adam", "AdamW"):
        betas = (hypers.get("mom", 0.9), hypers.get("sqr_mom", 0.99))
        values = {"betas": betas, "eps": hypers.get("eps"), "weight_decay": hypers.get("wd")}
    elif twin == "SGD":
        momentum = hypers.get("mom", 0.0) if "momentum_step" in names else 0.0
        values = {"momentum": momentum, "weight_decay": hypers.get("wd")}
    else:
        return kind, twin, ()
    defaults = TWIN_DEFAULTS[twin]
    given = tuple((k, v) for k, v in values.items() if v is not None and v != defaults[k])
    return kind, twin, given
