"""What the run installs in torch, and that it all goes away: the DataLoader ``__next__``
wrapper, the global optimizer post-step hook, and the phase instruments (optimizer pre- and
post-step hooks, module forward hooks, the ``torch.autograd.backward`` wrapper)."""

from __future__ import annotations

import contextlib
import copy
import pickle

import torch
import torch.optim.optimizer as optim_mod
from leakcheck import ORIGINAL_BACKWARD, ORIGINAL_NEXT
from torch.optim.optimizer import Optimizer
from torch.utils._python_dispatch import _get_current_dispatch_mode_stack
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.dataloader import _BaseDataLoaderIter

import traceml_nb
from traceml_nb.engine.instrument import hooks, step_phases
from traceml_nb.engine.instrument.step_phases import FIRST_SKIP
from traceml_nb.engine.instrument.tracer import EPOCH_PROCESS_EVENTS, StepTracer
from traceml_nb.engine.record import FLAG_OPTIMIZER_STEP, RunRecord


def _loader(n: int = 400, batch: int = 4) -> DataLoader:
    return DataLoader(TensorDataset(torch.randn(n, 8), torch.zeros(n).long()), batch_size=batch)


def _step(model, opt, x, y) -> None:
    opt.zero_grad()
    torch.nn.functional.cross_entropy(model(x), y).backward()
    opt.step()


def _model_and_opt(cls=torch.optim.SGD):
    model = torch.nn.Linear(8, 2)
    return model, cls(model.parameters(), lr=0.1)


def _train(model, opt, loader, on_step=None) -> int:
    steps = 0
    for i, (x, y) in enumerate(loader):
        _step(model, opt, x, y)
        steps += 1
        if on_step is not None:
            on_step(i)
    return steps


def test_the_run_installs_one_wrapper_and_one_global_hook_and_removes_both() -> None:
    model, opt = _model_and_opt()
    seen = {}
    with traceml_nb.Run("hooks", sample=False) as run:

        def look(i: int) -> None:
            if i in (FIRST_SKIP - 1, FIRST_SKIP):  # before the second sampled step, and in it
                seen[i] = {
                    "next": _BaseDataLoaderIter.__dict__["__next__"],
                    "hooks": list(optim_mod._global_optimizer_post_hooks.values()),
                    "pre_hooks": list(optim_mod._global_optimizer_pre_hooks.values()),
                    "module_hooks": (
                        dict(torch.nn.modules.module._global_forward_pre_hooks),
                        dict(torch.nn.modules.module._global_forward_hooks),
                    ),
                    "model_hooks": (len(model._forward_pre_hooks), len(model._forward_hooks)),
                    "backward": torch.autograd.backward,
                    "installed": hooks.is_installed(),
                }

        steps = _train(model, opt, _loader(), look)
    off, on = seen[FIRST_SKIP - 1], seen[FIRST_SKIP]
    assert on["installed"] and not hooks.is_installed()
    assert on["next"] is not ORIGINAL_NEXT and on["next"].__wrapped__ is ORIGINAL_NEXT
    assert on["next"].__qualname__ == ORIGINAL_NEXT.__qualname__
    assert [h.__name__ for h in on["hooks"]] == ["on_optimizer_step"]
    # the model was found in the first step: the global module hooks that sought it are gone;
    # the phases' hooks are on for the sampled step, off before it, and none is on the model
    # at the step boundary: one global pre-hook waits for the model's first call in the step
    assert off["module_hooks"] == ({}, {})
    assert [h.__name__ for h in on["module_hooks"][0].values()] == ["_arm"]
    assert on["module_hooks"][1] == {}
    assert [h.__name__ for h in on["pre_hooks"]] == ["optimizer_step_starts"]
    assert on["model_hooks"] == (0, 0) and on["backward"].__wrapped__ is ORIGINAL_BACKWARD
    assert off["pre_hooks"] == [] and off["model_hooks"] == (0, 0)
    assert off["backward"] is ORIGINAL_BACKWARD
    # everything put back
    assert _BaseDataLoaderIter.__dict__["__next__"] is ORIGINAL_NEXT
    assert dict(optim_mod._global_optimizer_post_hooks) == {}
    assert dict(optim_mod._global_optimizer_pre_hooks) == {}
    assert (dict(model._forward_pre_hooks), dict(model._forward_hooks)) == ({}, {})
    assert torch.autograd.backward is ORIGINAL_BACKWARD
    assert "_optimizer_step_code" not in vars(opt) and "step" not in vars(opt)
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

        steps = _train(model, opt, _loader(), second_optimizer)
    assert run.record.optimizer_steps == steps + (steps - 40)


def test_optimizers_with_a_step_of_their_own_are_counted() -> None:
    class PlainSGD(torch.optim.Optimizer):
        """A custom optimizer: torch wraps every subclass's ``step`` with the hooks."""

        def __init__(self, params, lr: float) -> None:
            super().__init__(params, {"lr": lr})

        @torch.no_grad()
        def step(self, closure=None):
            for group in self.param_groups:
                for p in group["params"]:
                    if p.grad is not None:
                        p.add_(p.grad, alpha=-group["lr"])

    model, opt = _model_and_opt(PlainSGD)
    lbfgs_model, lbfgs = _model_and_opt(torch.optim.LBFGS)
    x, y = torch.randn(4, 8), torch.zeros(4).long()

    def closure():
        lbfgs.zero_grad()
        loss = torch.nn.functional.cross_entropy(lbfgs_model(x), y)
        loss.backward()
        return loss

    with traceml_nb.Run("own step", sample=False) as run:
        steps = _train(model, opt, _loader(n=80))
        lbfgs.step(closure)
    assert run.record.optimizer_steps == steps + 1


def test_a_users_own_global_hook_runs_alongside_ours_and_stays() -> None:
    calls = []
    handle = optim_mod.register_optimizer_step_post_hook(lambda o, a, k: calls.append(o))
    try:
        model, opt = _model_and_opt()
        with traceml_nb.Run("their hook", sample=False) as run:
            steps = _train(model, opt, _loader(n=40))
        _step(model, opt, torch.randn(4, 8), torch.zeros(4).long())
        assert len(calls) == steps + 1
        assert run.record.optimizer_steps == steps
        assert len(optim_mod._global_optimizer_post_hooks) == 1  # theirs only
    finally:
        handle.remove()


def test_an_optimizer_can_be_copied_and_pickled_while_it_is_counted() -> None:
    model, opt = _model_and_opt()
    with traceml_nb.Run("copy", sample=False) as run:
        _train(model, opt, _loader(n=200))
        clone = copy.deepcopy(opt)
        restored = pickle.loads(pickle.dumps(opt))
        _step(model, clone, torch.randn(4, 8), torch.zeros(4).long())
    assert clone.state_dict()["param_groups"] == opt.state_dict()["param_groups"]
    assert restored.state_dict()["param_groups"] == opt.state_dict()["param_groups"]
    assert run.record.optimizer_steps == 50 + 1


def test_torch_profiler_with_python_stacks_works_inside_a_run_and_after() -> None:
    model, opt = _model_and_opt()
    with traceml_nb.Run("profiler", sample=False) as run:
        _train(model, opt, _loader(n=200))
        with torch.profiler.profile(with_stack=True) as prof:
            for x, y in _loader(n=40):
                _step(model, opt, x, y)
    assert any("Optimizer.step" in e.name for e in prof.events())
    assert run.record.optimizer_steps == 50 + 10
    with torch.profiler.profile(with_stack=True) as prof:  # after the run: as without us
        _step(model, opt, torch.randn(4, 8), torch.zeros(4).long())
    assert any("Optimizer.step" in e.name for e in prof.events())


def test_a_wrapper_stacked_on_ours_is_left_alone_and_ours_goes_inert() -> None:
    with traceml_nb.Run("stacked", sample=False) as run:
        ours = _BaseDataLoaderIter.__next__

        def theirs(self):
            return ours(self)

        _BaseDataLoaderIter.__next__ = theirs
    try:
        assert _BaseDataLoaderIter.__dict__["__next__"] is theirs
        assert any("another wrapper" in n for n in run.capabilities.notes)
        assert len(list(_loader(n=8))) == 2  # theirs works, ours only calls through
        assert len(run.record.steps) == 0
        assert not hooks.is_installed()
    finally:
        _BaseDataLoaderIter.__next__ = ORIGINAL_NEXT
    assert Optimizer.__dict__["step"] is not None


def _instruments(model) -> dict:
    """What of ours is in torch now: the fetch, the global hooks, the model's, the backward."""
    return {
        "next": _BaseDataLoaderIter.__dict__["__next__"] is not ORIGINAL_NEXT,
        "post": len(optim_mod._global_optimizer_post_hooks),
        "pre": len(optim_mod._global_optimizer_pre_hooks),
        "module": len(torch.nn.modules.module._global_forward_pre_hooks)
        + len(torch.nn.modules.module._global_forward_hooks),
        "model": len(model._forward_pre_hooks) + len(model._forward_hooks),
        "backward": torch.autograd.backward is not ORIGINAL_BACKWARD,
    }


NOTHING = {"next": False, "post": 0, "pre": 0, "module": 0, "model": 0, "backward": False}


def test_a_paused_install_takes_everything_away_and_resumes_the_phase_sampling_where_it_stood() -> (
    None
):
    model, opt = _model_and_opt()
    it = iter(_loader())

    def steps(n: int) -> None:
        for _ in range(n):
            x, y = next(it)
            _step(model, opt, x, y)

    with traceml_nb.Run("pause", sample=False) as run:
        steps(2)  # the model is found in the first step, and the second is not sampled
        phases, hook = hooks._installed.phases, hooks._installed.hook
        countdown = phases.countdown
        assert phases.models and not phases.sampling and countdown > 1
        hooks.uninstall(pause=True)
        assert _instruments(model) == NOTHING
        steps(3)  # plain steps, outside the run
        hooks.install(run.tracer)
        run.tracer.active = True
        assert hooks._installed.phases is phases and phases.countdown == countdown
        assert hooks._installed.hook is hook  # its countdown to the phases goes on
        assert _instruments(model)["module"] == 0  # the model is not sought again
        steps(countdown)  # the sample starts at the schedule's step end, as in one long run
        assert phases.sampling and _instruments(model)["module"] == 1  # waits for the model
        hooks.uninstall(pause=True)
        assert _instruments(model) == NOTHING  # a pause mid-sample takes the sample's hooks too
        hooks.install(run.tracer)
        run.tracer.active = True
        assert _instruments(model)["module"] == 1 and _instruments(model)["backward"]
        during = []  # the model's own hooks on it during its forward (ours, and this one)
        mine = model.register_forward_hook(lambda *_: during.append(_instruments(model)))
        model(torch.zeros(1, 8))  # its first call in the sampled step: the model's own hooks
        mine.remove()
        assert during[0]["module"] == 0 and during[0]["model"] == 2 + 1
        # and off again after it: the arming hook waits for its next call
        assert _instruments(model)["module"] == 1 and _instruments(model)["model"] == 0
        steps(2)
    assert _instruments(model) == NOTHING and hooks._paused is None
    assert not phases.models  # the run's end dropped what the pause kept


def test_a_pause_kept_for_one_tracer_is_dropped_when_another_installs() -> None:
    model, opt = _model_and_opt()
    x, y = torch.randn(4, 8), torch.zeros(4).long()
    with traceml_nb.Run("first", sample=False) as first:
        _step(model, opt, x, y)
        kept = hooks._installed.phases
        hooks.uninstall(pause=True)
        other = StepTracer(RunRecord())
        hooks.install(other)
        try:
            assert hooks._installed.phases is not kept
            assert not kept.models  # removed: the first tracer's model is not held
        finally:
            hooks.uninstall()
        hooks.install(first.tracer)  # the first tracer again: new instruments
        assert hooks._installed.phases is not kept
    assert _instruments(model) == NOTHING and hooks._paused is None


class _WhatTheWorkerHas(torch.utils.data.Dataset):
    """Each item: what of the run is installed in the DataLoader worker that made it."""

    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int) -> torch.Tensor:
        import torch.nn.modules.module as module_mod

        assert torch.utils.data.get_worker_info() is not None  # made in a worker
        return torch.tensor(
            [
                len(module_mod._global_forward_pre_hooks) + len(module_mod._global_forward_hooks),
                len(optim_mod._global_optimizer_pre_hooks),
                len(optim_mod._global_optimizer_post_hooks),
                torch.autograd.backward is not ORIGINAL_BACKWARD,
                _BaseDataLoaderIter.__dict__["__next__"] is not ORIGINAL_NEXT,
                hooks.is_installed(),
                len(_get_current_dispatch_mode_stack()),  # the FLOP counter's, for one
            ]
        )


def test_a_dataloader_worker_forked_during_the_run_has_none_of_its_hooks() -> None:
    """Workers are forked when the loop first iterates the loader, before the first optimizer
    step, when every hook of the run is in place (the global module hooks seeking the model,
    the optimizer hooks, the backward's wrapper, the fetch's): the worker takes its copy away,
    else it would run them for every module its dataset calls, as long as it lives."""
    loader = DataLoader(
        _WhatTheWorkerHas(), batch_size=4, num_workers=1, multiprocessing_context="fork"
    )
    with traceml_nb.Run("fork", sample=False):
        in_parent = [
            len(torch.nn.modules.module._global_forward_pre_hooks),
            len(optim_mod._global_optimizer_pre_hooks),
            len(optim_mod._global_optimizer_post_hooks),
            torch.autograd.backward is not ORIGINAL_BACKWARD,
        ]
        in_workers = torch.cat(list(loader))
    assert in_parent == [1, 1, 1, True]  # the run's, in place when the worker was forked
    assert in_workers.tolist() == [[0, 0, 0, 0, 0, 0, 0]] * 8
    assert torch.autograd.backward is ORIGINAL_BACKWARD and not hooks.is_installed()


def test_a_worker_forked_while_the_flops_are_counted_leaves_the_counter() -> None:
    """The FLOP count runs the step under a dispatch mode of the training thread, which a
    worker forked inside it inherits: an evaluation's loader iterated right after the first
    optimizer step (the count's step), or an epoch that begins in it, had every operator of
    its dataset counted for as long as the worker lived. It leaves the counter; the count in
    the parent goes on."""
    model = torch.nn.Linear(8, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = DataLoader(
        _WhatTheWorkerHas(), batch_size=4, num_workers=1, multiprocessing_context="fork"
    )
    with traceml_nb.Run("fork in the count", sample=False) as run:
        for i in range(4):
            model(torch.randn(4, 8)).sum().backward()
            opt.step()
            opt.zero_grad()
            if i == 0:
                counting = len(_get_current_dispatch_mode_stack())
                with torch.no_grad():
                    in_workers = torch.cat(list(loader))
    assert counting == 1  # the count was under way when the worker was forked
    assert in_workers.tolist() == [[0, 0, 0, 0, 0, 0, 0]] * 8
    assert run.record.flops.flops == 2 * (2 * 4 * 8 * 2)  # the forward and the weight gradient
    assert len(_get_current_dispatch_mode_stack()) == 0


def test_a_model_the_loop_lets_go_is_freed_during_the_run() -> None:
    """The phases hold the models they found weakly, and neither they nor the FLOP count
    hold an optimizer past the step they watch (an optimizer holds the parameters and their
    state): a model trained in a function (one of a sweep, a rank's DDP model before its
    ``destroy_process_group()``) is freed when the function returns, as without the run, not
    at the run's end; its optimizer once the log that names it is processed."""
    import gc
    import weakref

    def train() -> tuple[weakref.ref, weakref.ref]:
        model = torch.nn.Linear(8, 2)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(20):
            model(torch.randn(4, 8)).sum().backward()
            opt.step()
            opt.zero_grad()
        return weakref.ref(model), weakref.ref(opt.param_groups[0]["params"][0])

    with traceml_nb.Run("sweep", sample=False) as run:
        first, first_weight = train()
        run._tracer.process()  # the live view's thread, or the log's length, does this
        gc.collect()
        freed_during_the_run = first() is None, first_weight() is None
        second, _ = train()
    assert freed_during_the_run == (True, True)
    assert second() is None and run.status == "completed"


def test_a_window_over_a_step_does_not_keep_its_optimizer_alive() -> None:
    """A sample or a FLOP count open when a sweep's stage ends (its optimizer dropped with the
    model) lets the optimizer, and so the weights, go; the window then closes at the next end
    (the CI run that failed the test above had a sample open at the stage's end)."""
    import gc
    import weakref

    from traceml_nb.engine.instrument.whole_step import WholeStep

    opt = torch.optim.SGD(torch.nn.Linear(2, 2).parameters(), lr=0.1)
    other = torch.optim.SGD(torch.nn.Linear(2, 2).parameters(), lr=0.1)
    window = WholeStep(opt)
    assert not window.closes_at(other) and window.opened_by is opt  # open: a GAN's other step
    freed = weakref.ref(opt)
    del opt
    gc.collect()
    assert freed() is None and window.opened_by is None
    assert window.closes_at(other)


def test_an_iterator_the_loop_breaks_out_of_keeps_its_workers_no_longer_than_an_epoch() -> None:
    """A loop that breaks out of each epoch leaves the iterator to be freed, which stops its
    workers at once; the run's log names each iterator until it is processed (every 256 events
    without a live view), so 8 such epochs of 2 workers kept 16 worker processes alive, 2 more
    each epoch. The log is now processed as an iterator with workers begins its epoch: at most
    the last iterator left lives on, until the next epoch's first batch; none after the run."""
    import psutil

    me = psutil.Process()
    before = len(me.children(recursive=True))
    loader = DataLoader(TensorDataset(torch.randn(64, 8), torch.zeros(64).long()), batch_size=4,
                        num_workers=2)  # fmt: skip
    model, opt = _model_and_opt()
    alive = []
    with traceml_nb.Run("breaks", sample=False) as run:
        for _ in range(8):
            alive.append(len(me.children(recursive=True)) - before)
            for i, (x, y) in enumerate(loader):
                _step(model, opt, x, y)
                if i == 2:
                    break
    assert alive == [0] + [2] * 7  # the epoch before's workers, not every epoch's
    assert len(me.children(recursive=True)) == before
    assert run.record.optimizer_steps == 24


def test_a_sweeps_earlier_models_are_freed_as_without_the_run() -> None:
    """Trials in one cell, each a fresh model, optimizer and loader for 30 steps (or slices of
    tensors, no loader): the log's optimizer steps name the optimizer (and so its parameters
    and state) until processed, which kept up to 4 earlier trials' parameters alive with a
    loader and 7 without (256 events); now, as without a run, only the trial before, which the
    loop's own names still hold at the next trial's start."""
    import weakref

    data = TensorDataset(torch.randn(120, 8), torch.zeros(120).long())
    alive: dict[tuple[str, bool], list[int]] = {}
    for loader in (True, False):  # a trial without a loader: its new optimizer lets go
        for traced in (False, True):
            refs: list[weakref.ref] = []
            seen = alive.setdefault(("traced" if traced else "plain", loader), [])
            with traceml_nb.Run("sweep", sample=False) if traced else contextlib.nullcontext():
                for _ in range(8):
                    seen.append(sum(r() is not None for r in refs))
                    model, opt = _model_and_opt(torch.optim.Adam)
                    refs.append(weakref.ref(model.weight))
                    if loader:
                        _train(model, opt, DataLoader(data, batch_size=4))
                    else:
                        for i in range(30):
                            _step(
                                model, opt, data.tensors[0][i : i + 4], data.tensors[1][i : i + 4]
                            )
    for loader in (True, False):
        assert alive[("traced", loader)] == alive[("plain", loader)] == [0] + [1] * 7, alive


def test_a_new_iterator_processes_the_log_once_it_holds_epoch_process_events(monkeypatch) -> None:
    """A fresh iterator a step without workers (``next(iter(loader))``): its epoch's start
    processes the log exactly when the log holds ``EPOCH_PROCESS_EVENTS`` or more (3 events a
    step here, past the first steps), never below."""
    seen: list[tuple[int, bool]] = []
    original = StepTracer.epoch_started

    def spy(self: StepTracer, it: object) -> None:
        logged, processed = len(self.log) + 1, self.processing_ns  # with its EPOCH_STARTED
        original(self, it)
        seen.append((logged, self.processing_ns != processed))

    monkeypatch.setattr(StepTracer, "epoch_started", spy)
    # the phases timed on the first steps only: a sampled step logs more than 3 events, and
    # which steps are sampled follows their pace (a busy machine's, more of them)
    monkeypatch.setattr(step_phases, "EARLY_SAMPLE_INTERVAL_S", 3600.0)
    monkeypatch.setattr(step_phases, "SAMPLE_INTERVAL_S", 3600.0)
    loader = _loader(n=40)
    model, opt = _model_and_opt()
    with traceml_nb.Run("one batch a step", sample=False):
        for _ in range(60):
            _step(model, opt, *next(iter(loader)))
    assert [processed for _, processed in seen] == [n >= EPOCH_PROCESS_EVENTS for n, _ in seen]
    assert sum(processed for _, processed in seen) >= 3
    # both sides, within a step's 3 events: left below it, processed as soon as past it
    assert max(n for n, processed in seen if not processed) >= EPOCH_PROCESS_EVENTS - 3
    assert max(n for n, processed in seen if processed) < EPOCH_PROCESS_EVENTS + 3
    assert EPOCH_PROCESS_EVENTS == 32
