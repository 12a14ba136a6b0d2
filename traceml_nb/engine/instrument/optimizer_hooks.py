"""The optimizer hooks a run puts in place: torch's global pre- and post-step hooks, and the same
calls around the step of an optimizer those hooks never see.

torch calls its global hooks from ``torch.optim.Optimizer``'s step wrapper, so an optimizer of
another base class steps unseen: fastai's own optimizers (``Learner(opt_func=Adam)``, fastai's
default, is a ``fastai.optimizer.Optimizer``) stepped hundreds of times in a run that read "no
optimizer step", and so did Keras' on its torch backend (``model.fit``: a third of the steps,
no FLOPs). While a run's hooks are in place, the update method of each class of
:data:`FOREIGN_OPTIMIZERS` whose module is imported is wrapped (:func:`wrap_foreign`): it calls
the run's pre-step hooks before and its post-step hooks after the update, as torch's wrapper
calls them (``hook(optimizer, args, kwargs)``), and no one else's. :func:`unwrap_foreign` puts
each method back; one that another wrapper covered meanwhile stays beneath it, calling nothing.
A subclass with a ``step`` of its own (fastai's ``Lookahead``; Keras' ``LossScaleOptimizer``,
whose ``apply`` applies its inner optimizer's) is seen through the optimizer it steps.
"""

from __future__ import annotations

import functools
import itertools
import sys
from collections.abc import Callable
from typing import Any

#: The optimizer classes torch's global hooks do not see, as ``(module, class name, the method
#: that makes one update)``: ``apply_gradients`` calls ``apply`` in Keras.
FOREIGN_OPTIMIZERS = (
    ("fastai.optimizer", "Optimizer", "step"),
    ("keras.src.optimizers.base_optimizer", "BaseOptimizer", "apply"),
)

Hook = Callable[[Any, tuple[Any, ...], dict[str, Any]], None]

_pre: dict[int, Hook] = {}
_post: dict[int, Hook] = {}
_keys = itertools.count()
#: the classes wrapped, with the name of the method, the method each had before and our wrapper
_wrapped: dict[type, tuple[str, Any, Any]] = {}


class Handle:
    """Removes a hook from torch's registry and from ours; safe to call twice."""

    def __init__(self, torch_handle: Any, ours: dict[int, Hook], key: int) -> None:
        self._torch_handle = torch_handle
        self._ours = ours
        self._key = key

    def remove(self) -> None:
        self._torch_handle.remove()
        self._ours.pop(self._key, None)


def register_pre(hook: Hook) -> Handle:
    """``hook`` runs before every optimizer step, torch's and the foreign ones'."""
    import torch.optim.optimizer as optim_mod

    key = next(_keys)
    _pre[key] = hook
    return Handle(optim_mod.register_optimizer_step_pre_hook(hook), _pre, key)


def register_post(hook: Hook) -> Handle:
    """``hook`` runs after every optimizer step, torch's and the foreign ones'."""
    import torch.optim.optimizer as optim_mod

    key = next(_keys)
    _post[key] = hook
    return Handle(optim_mod.register_optimizer_step_post_hook(hook), _post, key)


def wrap_foreign() -> None:
    """Wrap the update of each foreign optimizer class imported by now and not wrapped yet (a
    cell may import fastai after the run began: called again as each epoch starts)."""
    for module_name, class_name, method in FOREIGN_OPTIMIZERS:
        module = sys.modules.get(module_name)
        cls = getattr(module, class_name, None)
        if not isinstance(cls, type) or cls in _wrapped:
            continue
        original = cls.__dict__.get(method)
        if callable(original):
            wrapper = _calling_hooks(original)
            _wrapped[cls] = (method, original, wrapper)
            setattr(cls, method, wrapper)


def unwrap_foreign() -> None:
    """Put back each method :func:`wrap_foreign` wrapped, where it is still ours; one left
    beneath another's wrapper calls no hook from now on."""
    for cls, (method, original, wrapper) in list(_wrapped.items()):
        wrapper.live = False
        if cls.__dict__.get(method) is wrapper:
            setattr(cls, method, original)
        del _wrapped[cls]


def _calling_hooks(step: Any) -> Any:
    @functools.wraps(step)
    def step_calling_hooks(optimizer: Any, *args: Any, **kwargs: Any) -> Any:
        __tracebackhide__ = True  # noqa: F841 (IPython and pytest hide this frame)
        live = step_calling_hooks.live  # type: ignore[attr-defined]
        if live and _pre:
            for hook in list(_pre.values()):
                hook(optimizer, args, kwargs)
        out = step(optimizer, *args, **kwargs)
        if live and _post:
            for hook in list(_post.values()):
                hook(optimizer, args, kwargs)
        return out

    step_calling_hooks.live = True  # type: ignore[attr-defined]
    return step_calling_hooks
