"""How the phase instruments live with ``torch.compile``.

A module is compiled in one of two ways: ``torch.compile(model)`` returns a wrapper (an
``OptimizedModule``) whose own call, hooks included, runs as it is and compiles the model's
forward inside; ``model.compile()`` compiles the module's call in place, so its hooks are
called while the compiled call is under way. There ``torch.compile`` would compile each hook
of ours as a function of its own, and since the instruments return at once while it traces
(:func:`compiling_check`: a compiled graph holds nothing of ours), the compiled hook would do
nothing at all: the model never found, its forward never timed, and the global hooks that seek
it still in place when its forward compiled, so that the forward compiled again once they were
gone. :func:`run_as_they_are` has it run our hooks as they are instead.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any, cast

#: The warning torch gives when a compiled module is called while global module hooks are in
#: place (ours, while the model is sought), held back meanwhile.
COMPILE_WARNING = r"Using `torch\.compile\(module\)` when there are global hooks"


def compiling_check() -> Callable[[], bool]:
    """torch's "is ``torch.compile`` tracing this call" (older versions: dynamo's own)."""
    import torch

    check: Any = getattr(getattr(torch, "compiler", None), "is_compiling", None)
    if check is None:
        try:
            from torch._dynamo import is_compiling as check
        except ImportError:
            return lambda: False
    return cast(Callable[[], bool], check)


def is_compiled_wrapper(module: Any) -> bool:
    """``module`` is the wrapper ``torch.compile(model)`` returns."""
    return type(module).__name__ == "OptimizedModule"


def is_compiled(module: Any) -> bool:
    """``module`` is compiled: the wrapper ``torch.compile(model)`` returns, or a module that
    ``model.compile()`` compiled in place."""
    return is_compiled_wrapper(module) or getattr(module, "_compiled_call_impl", None) is not None


def compiled_anything() -> bool:
    """``torch.compile`` has compiled a graph in this process."""
    try:
        from torch._dynamo.utils import counters
    except Exception:
        return False
    return bool(counters["stats"].get("unique_graphs"))


def run_as_they_are(*functions: Callable[..., Any]) -> bool:
    """Have ``torch.compile`` run ``functions``, and what they call, as they are when one is
    called on its own inside a compiled call (the hooks of a module compiled in place); traced
    inline into a graph they are traced as before. False where torch has no such setting (a
    private one, the per-code strategy of its frame evaluator: torch 2.13 has it), and our
    hooks compile as before."""
    try:
        from torch._C._dynamo import eval_frame

        action = eval_frame._FrameAction.SKIP
        strategy = eval_frame._FrameExecStrategy(action, action)  # the frame, and its callees
        for function in functions:
            eval_frame.set_code_exec_strategy(function.__code__, strategy)
    except Exception:  # a private API: missing or changed, our hooks compile as before
        return False
    return True


def hold_compile_warning() -> Any:
    """Hold :data:`COMPILE_WARNING` back; the filter that does, for
    :func:`let_compile_warning_through`."""
    warnings.filterwarnings("ignore", COMPILE_WARNING, UserWarning)
    return warnings.filters[0]


def let_compile_warning_through(held: Any) -> None:
    """Take back the filter :func:`hold_compile_warning` gave (None: none)."""
    if held is not None and held in warnings.filters:
        cast(list[Any], warnings.filters).remove(held)
        warnings._filters_mutated()  # type: ignore[attr-defined]
