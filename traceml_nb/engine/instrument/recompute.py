"""Whether the autograd engine is recomputing a forward for activation checkpointing
(``torch.utils.checkpoint``, which transformers' ``gradient_checkpointing_enable()`` uses) at
this moment: the FLOP count leaves those FLOPs out of the model's (MFU counts a forward once).

Told by what torch runs the recomputation under, which it does not publish as an interface:
the reentrant checkpoint (``use_reentrant=True``) recomputes inside its backward node,
``CheckpointFunctionBackward`` (``torch._C._current_autograd_node``); the non-reentrant one under
its ``_recomputation_hook`` saved-tensor hooks (the innermost hooks' pack function, from
``torch._C._autograd._top_saved_tensors_default_hooks``). A torch that names them otherwise, or
lacks the two functions, tells nothing: the recomputed FLOPs then count as the model's, as they
did before this module.
"""

from __future__ import annotations

from typing import Any

#: The reentrant checkpoint's backward node, by its class name.
REENTRANT_NODE = "CheckpointFunctionBackward"
#: The qualified-name prefix of the non-reentrant checkpoint's recomputation hooks.
RECOMPUTATION_HOOKS = "_recomputation_hook."


def recomputing() -> bool:
    """The operator dispatched now runs in a forward recomputed for activation checkpointing."""
    import torch

    try:
        node: Any = torch._C._current_autograd_node()
        if node is not None and type(node).__name__ == REENTRANT_NODE:
            return True
        hooks = torch._C._autograd._top_saved_tensors_default_hooks(True)
    except Exception:  # a torch without these: nothing told
        return False
    pack = hooks[0] if hooks else None
    return getattr(pack, "__qualname__", "").startswith(RECOMPUTATION_HOOKS)
