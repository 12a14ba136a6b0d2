"""While a step's FLOPs are counted (:mod:`.flop_count`), the calls of a trained model made with
autograd off: an evaluation on tensors, which the count cannot tell from the step's own
forwards."""

from __future__ import annotations

from typing import Any


class CallsWithoutGrad:
    """While a step is counted, global module hooks watch the outermost module calls for one of
    a model that ``optimizers`` train made with autograd off (``torch.no_grad()``,
    ``inference_mode()``): an evaluation on tensors, which the count cannot tell from the
    step's own forwards. A frozen backbone or a teacher, whose parameters no optimizer holds,
    is the step's. The same hooks know when no module call is open: :meth:`outside_model`.
    :meth:`remove` takes the hooks away and tells whether one was seen."""

    def __init__(self, optimizers: list[Any]) -> None:
        import torch
        from torch.nn.modules import module

        self.optimizers = optimizers
        self.seen = False
        self._depth = 0  #: module calls open
        self._trained: set[int] = set()
        self._read = 0  #: optimizers whose parameters are in ``_trained``
        self._grad_enabled = torch.is_grad_enabled
        self._graph_task = getattr(torch._C, "_current_graph_task_id", None)
        returned = module.register_module_forward_hook(self._returned, always_call=True)
        self._handles = [returned, module.register_module_forward_pre_hook(self._called)]

    def outside_model(self) -> bool:
        """The operator dispatched now runs with autograd off, outside every module call and
        outside the autograd engine (whose backward runs with autograd off too): an optimizer's
        own work, as Muon's orthogonalisation, not the model's forward or backward."""
        if self._depth or self._grad_enabled() or self._graph_task is None:
            return False
        return bool(self._graph_task() == -1)

    def _called(self, mod: Any, args: Any) -> None:
        if self._depth == 0 and not self.seen and not self._grad_enabled():
            self.seen = self._is_trained(mod)
        self._depth += 1

    def _returned(self, mod: Any, args: Any, out: Any) -> None:
        self._depth = max(0, self._depth - 1)  # a call open before the hooks has no pre-call

    def _is_trained(self, mod: Any) -> bool:
        for optimizer in self.optimizers[self._read :]:
            for group in optimizer.param_groups:
                self._trained.update(id(p) for p in group["params"])
        self._read = len(self.optimizers)
        return any(id(p) in self._trained for p in mod.parameters())

    def remove(self) -> bool:
        for handle in self._handles:
            handle.remove()
        self._handles = []
        return self.seen
