"""What the run installs in torch, and that it all goes away: the DataLoader wrapper and the
optimizer step counting (``Optimizer._optimizer_step_code``, with a post-step hook where that
cannot work)."""

from __future__ import annotations

import copy
import functools
import gc
import pickle
import warnings

import pytest
import torch
import torch.optim.optimizer as optim_mod
from torch.optim.optimizer import Optimizer
from torch.utils.data import DataLoader, TensorDataset

import traceml_nb
from traceml_nb.instrument import patches
from traceml_nb.record import FLAG_OPTIMIZER_STEP

ORIGINAL_STEP_CODE = Optimizer.__dict__["_optimizer_step_code"]


def _loader(n: int = 400, batch: int = 4) -> DataLoader:
    return DataLoader(TensorDataset(torch.randn(n, 8), torch.zeros(n).long()), batch_size=batch)


def _step(model, opt, x, y) -> None:
    opt.zero_grad()
    torch.nn.functional.cross_entropy(model(x), y).backward()
    opt.step()


def _model_and_opt(cls=torch.optim.SGD):
    model = torch.nn.Linear(8, 2)
    return model, cls(model.parameters(), lr=0.1)


def _train(run, model, opt, loader, on_step=None) -> int:
    steps = 0
    for i, (x, y) in enumerate(loader):
        _step(model, opt, x, y)
        steps += 1
        if i == 20:
            run.process_steps()  # as the live view does: a loader step is known from here on
        if on_step is not None:
            on_step(i)
    return steps


def test_torchs_optimizer_calls_the_step_code_method_so_the_counting_is_used() -> None:
    assert patches.step_code_is_usable(Optimizer)


def test_after_the_first_loader_step_optimizer_steps_are_counted_in_c() -> None:
    model, opt = _model_and_opt()
    seen = {}
    # A bare functools.partial read as a method warns (FutureWarning) from Python 3.13 on and
    # is bound to the optimizer from 3.14 on: the counter must be reached without either.
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        with traceml_nb.Run("c-counter", sample=False) as run:

            def look(i: int) -> None:
                if i == 30:
                    seen["class"] = Optimizer.__dict__["_optimizer_step_code"]
                    seen["read"] = opt._optimizer_step_code
                    seen["hooks"] = dict(optim_mod._global_optimizer_post_hooks)

            steps = _train(run, model, opt, _loader(), look)
    counter = run._tracer.step_counter
    assert type(counter) is functools.partial  # of the log's append: C only
    installed = seen["class"]
    if hasattr(functools.partial, "__get__"):  # Python 3.13 on
        assert type(installed) is staticmethod and installed.__func__ is counter
    else:
        assert installed is counter
    assert seen["read"] is counter  # what torch's step wrapper calls, unbound
    assert seen["hooks"] == {}  # no Python hook per step
    # dressed as the method it stands in for (torch.profiler reads its __code__)
    assert counter.__code__ is ORIGINAL_STEP_CODE.__code__
    assert counter.__name__ == "_optimizer_step_code"
    # everything put back
    assert Optimizer.__dict__["_optimizer_step_code"] is ORIGINAL_STEP_CODE
    assert "_optimizer_step_code" not in vars(opt)
    # and every step counted
    assert run.record.optimizer_steps == steps == run.record.loaders[0].optimizer_steps
    s = run.record.steps
    loader_rows = [i for i in range(len(s)) if s.source[i] == 0]
    assert len(loader_rows) == steps
    assert all(s.flags[i] & FLAG_OPTIMIZER_STEP for i in loader_rows)


def test_an_optimizer_made_during_the_run_is_counted() -> None:
    model, opt = _model_and_opt()
    other = {}
    with traceml_nb.Run("new-optimizer", sample=False) as run:

        def second_optimizer(i: int) -> None:
            if i == 40:
                other["model"], other["opt"] = _model_and_opt(torch.optim.Adam)
            if i >= 40:
                x = torch.randn(4, 8)
                _step(other["model"], other["opt"], x, torch.zeros(4).long())

        steps = _train(run, model, opt, _loader(), second_optimizer)
    assert run.record.optimizer_steps == steps + (steps - 40)


@pytest.mark.parametrize("why", ["a subclass has its own method", "torch does not call it"])
def test_where_the_step_code_method_cannot_serve_a_post_step_hook_counts(monkeypatch, why) -> None:
    if why == "a subclass has its own method":

        class OwnStepCode(torch.optim.SGD):
            def _optimizer_step_code(self) -> None:
                pass

        cls = OwnStepCode
    else:
        monkeypatch.setattr(patches, "step_code_is_usable", lambda _cls: False)
        cls = torch.optim.SGD
    model, opt = _model_and_opt(cls)
    with traceml_nb.Run("hook", sample=False) as run:
        hooks = dict(optim_mod._global_optimizer_post_hooks)
        steps = _train(run, model, opt, _loader())
    assert len(hooks) == 1
    assert Optimizer.__dict__["_optimizer_step_code"] is ORIGINAL_STEP_CODE
    assert run.record.optimizer_steps == steps == run.record.loaders[0].optimizer_steps
    del cls, opt, model
    gc.collect()  # the subclass must not outlive the test (step_code_is_usable looks at them)


def test_an_optimizer_can_be_copied_and_pickled_while_it_counts() -> None:
    model, opt = _model_and_opt()
    with traceml_nb.Run("copy", sample=False) as run:
        _train(run, model, opt, _loader(n=200))
        assert opt._optimizer_step_code is run._tracer.step_counter
        clone = copy.deepcopy(opt)
        restored = pickle.loads(pickle.dumps(opt))
        _step(model, clone, torch.randn(4, 8), torch.zeros(4).long())
    assert clone.state_dict()["param_groups"] == opt.state_dict()["param_groups"]
    assert restored.state_dict()["param_groups"] == opt.state_dict()["param_groups"]
    assert run.record.optimizer_steps == 50 + 1


def test_torch_profiler_with_python_stacks_works_inside_a_run_and_after() -> None:
    model, opt = _model_and_opt()
    with traceml_nb.Run("profiler", sample=False) as run:
        _train(run, model, opt, _loader(n=200))
        with torch.profiler.profile(with_stack=True) as prof:
            for x, y in _loader(n=40):
                _step(model, opt, x, y)
    assert any("Optimizer.step" in e.name for e in prof.events())
    assert run.record.optimizer_steps == 50 + 10
    with torch.profiler.profile(with_stack=True) as prof:  # after the run: as without us
        _step(model, opt, torch.randn(4, 8), torch.zeros(4).long())
    assert any("_optimizer_step_code" in e.name for e in prof.events())


def test_a_wrapper_stacked_on_ours_and_a_replaced_step_code_are_left_alone() -> None:
    from torch.utils.data.dataloader import _BaseDataLoaderIter

    theirs = lambda self: None  # noqa: E731
    with traceml_nb.Run("stacked", sample=False) as run:
        Optimizer._optimizer_step_code = theirs
    try:
        assert Optimizer.__dict__["_optimizer_step_code"] is theirs
        assert any("_optimizer_step_code" in n for n in run.capabilities.notes)
    finally:
        Optimizer._optimizer_step_code = ORIGINAL_STEP_CODE
    assert _BaseDataLoaderIter.__dict__["__next__"] is not None


def _optimizer_like(calls_it: bool = True, has_method: bool = True) -> type:
    """A stand-in for ``torch.optim.Optimizer``'s layout, for ``step_code_is_usable``."""

    def calling(func):
        def wrapper(*args, **kwargs):
            out = func(*args, **kwargs)
            args[0]._optimizer_step_code()
            return out

        return wrapper

    def not_calling(func):
        def wrapper(*args, **kwargs):
            return func(*args, **kwargs)

        return wrapper

    attrs = {"profile_hook_step": staticmethod(calling if calls_it else not_calling)}
    if has_method:
        attrs["_optimizer_step_code"] = lambda self: None
    return type("OptimizerLike", (), attrs)


def test_the_step_code_method_is_used_only_where_every_step_calls_it() -> None:
    assert patches.step_code_is_usable(_optimizer_like())
    assert not patches.step_code_is_usable(_optimizer_like(calls_it=False))
    assert not patches.step_code_is_usable(_optimizer_like(has_method=False))
    base = _optimizer_like()
    own = type("OwnMethod", (base,), {"_optimizer_step_code": lambda self: None})
    assert not patches.step_code_is_usable(base)
    del own
    gc.collect()
    assert patches.step_code_is_usable(base)
