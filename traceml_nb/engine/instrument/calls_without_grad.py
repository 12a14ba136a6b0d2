"""While a step's FLOPs are counted (:mod:`.flop_count`), the calls of a trained model made with
autograd off: an evaluation on tensors, which the count cannot tell from the step's own
forwards; and where no module call is open, the work that is not the model's."""

from __future__ import annotations

from typing import Any


class CallsWithoutGrad:
    """While a step is counted, global module hooks watch the outermost module calls for one of
    a model that ``optimizers`` train made with autograd off (``torch.no_grad()``,
    ``inference_mode()``): an evaluation on tensors, which the count cannot tell from the
    step's own forwards. A frozen backbone or a teacher, whose parameters no optimizer holds,
    is the step's. The same hooks know when no module call is open: :meth:`outside_model`.
    :meth:`remove` takes the hooks away and tells whether one was seen. ``modules``: the loop's
    models are modules (the phase instruments found one), so that the work before a step's
    first module call is the batch's preparation, not the model's (a model of plain tensors
    has no call to tell its forward by)."""

    def __init__(self, optimizers: list[Any], modules: bool = False) -> None:
        import torch
        from torch.nn.modules import module

        self.optimizers = optimizers
        self.seen = False
        self._depth = 0  #: module calls open
        self._trained: set[int] = set()
        self._read = 0  #: optimizers whose parameters are in ``_trained``
        self._grad_enabled = torch.is_grad_enabled
        self._graph_task = getattr(torch._C, "_current_graph_task_id", None)
        self._modules = modules
        #: no module call since the count began or the last backward: preparing the batch
        self._preparing = modules
        returned = module.register_module_forward_hook(self._returned, always_call=True)
        self._handles = [returned, module.register_module_forward_pre_hook(self._called)]

    def outside_model(self, inputs: Any = ()) -> bool:
        """The operator dispatched now on ``inputs`` runs outside every module call and outside
        the autograd engine, with autograd off (an optimizer's own work, as Muon's
        orthogonalisation) or before the step's first module call on inputs that need no
        gradient (the batch's preparation: fastai's batch transforms, an augmentation on the
        GPU; a first layer of plain parameters is the model's): not the model's forward or
        backward."""
        if self._depth or self._graph_task is None:
            return False
        if self._graph_task() != -1:  # a backward: the next batch is prepared after it
            self._preparing = self._modules
            return False
        if not self._grad_enabled():
            return True
        return self._preparing and not _needs_grad(inputs)

    def _called(self, mod: Any, args: Any) -> None:
        if self._depth == 0:
            self._preparing = False
            if not self.seen and not self._grad_enabled():
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


def _needs_grad(inputs: Any) -> bool:
    """A tensor among ``inputs`` (or in a list of them) requires a gradient."""
    for value in inputs:
        if isinstance(value, (list, tuple)):
            if _needs_grad(value):
                return True
        elif getattr(value, "requires_grad", False):
            return True
    return False
