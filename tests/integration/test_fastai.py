"""fastai's Learner on a tiny model and synthetic data: its own optimizers, which torch's
optimizer hooks never see, and its own DataLoaders, whose iterators share one sampler; the
steps against fastai's own count, the phases, the FLOPs, and the advice in fastai's terms."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
import warnings
from functools import partial

import pytest
import torch
from phase_checks import assert_parts_fit
from torch.utils.data import Dataset
from torch.utils.flop_counter import FlopCounterMode

import traceml_nb
from traceml_nb.engine.instrument import optimizer_hooks
from traceml_nb.engine.optimizer_info import optimizer_info
from traceml_nb.session import Session
from traceml_nb.tune.of_run import tune_run
from traceml_nb.views.diagnosis_words import sentence
from traceml_nb.views.report import Report

fastai_basics = pytest.importorskip("fastai.basics")
fastai_optimizer = pytest.importorskip("fastai.optimizer")
import fastai.callback.progress  # noqa: E402, F401 (the progress bar, and Learner.no_bar)
import fastai.callback.schedule  # noqa: E402, F401 (Learner.fine_tune)
from fastai.callback.core import Callback  # noqa: E402

ITEM_SLEEP_S = 0.0005  #: each item costs this much (a decode): the loops wait for data
#: the tiny MLP's FLOPs a batch of 32: forward 2·32·(16·256 + 256), backward twice that less
#: the first layer's input gradient (its input needs none)
MLP_FLOPS = 2 * 32 * (16 * 256 + 256) * 3 - 2 * 32 * 16 * 256


class Pairs(Dataset):
    def __init__(self, n: int) -> None:
        gen = torch.Generator().manual_seed(n)
        self.x, self.y = torch.randn(n, 16, generator=gen), torch.randn(n, 1, generator=gen)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int):
        time.sleep(ITEM_SLEEP_S)
        return self.x[i], self.y[i]


class CountSteps(Callback):
    """fastai's own count of the optimizer steps it made."""

    def __init__(self) -> None:
        self.steps = 0

    def after_step(self) -> None:
        self.steps += 1


def learner(opt_func=None):
    warnings.filterwarnings("ignore", module="fastai")
    dls = fastai_basics.DataLoaders.from_dsets(Pairs(640), Pairs(128), bs=32, num_workers=0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 256), torch.nn.ReLU(), torch.nn.Linear(256, 1))
    learn = fastai_basics.Learner(
        dls, model, loss_func=fastai_basics.MSELossFlat(), opt_func=opt_func or fastai_basics.Adam
    )
    counted = CountSteps()
    learn.add_cb(counted)
    return learn, counted


def fit(learn, epochs: int = 2, label: str = "fastai"):
    with traceml_nb.Run(label, sample=False) as run:
        with learn.no_bar(), learn.no_logging():
            learn.fit(epochs)
    return Session().result(run)


def test_fastai_own_optimizer_steps_are_the_steps_with_their_phases_and_flops():
    original = fastai_optimizer.Optimizer.__dict__["step"]
    learn, counted = learner()
    with traceml_nb.Run("fastai", sample=False) as run:
        with learn.no_bar(), learn.no_logging():
            learn.fit(2)
    s = Session().result(run).summary
    assert s.total_steps == counted.steps == 40  # 640 // 32 a training epoch, twice
    assert s.optimizer_ms_median > 0 and s.forward_ms_median > 0 and s.backward_ms_median > 0
    assert_parts_fit(run)
    assert s.flops_per_step == pytest.approx(MLP_FLOPS, rel=0.05)
    # the validation loader is a loader of its own, though fastai's iterators share a sampler
    train, valid = run.record.loaders
    assert (train.batch_size, train.dataset_type, train.driver) == (32, "Pairs", "fastai")
    assert (valid.batch_size, valid.fetches, valid.driver) == (32, 8, "fastai")
    [phase] = s.phases
    assert phase.batches == 8
    # the step is fastai's own again, and calls no hook of ours
    assert fastai_optimizer.Optimizer.__dict__["step"] is original
    assert optimizer_hooks._pre == {} and optimizer_hooks._post == {}


@pytest.mark.parametrize("kind", ["torch-optimizer", "lookahead"])
def test_fastai_optimizers_that_step_another_count_each_step_once(kind):
    if kind == "torch-optimizer":  # torch's hooks see the optimizer it wraps, and only those
        opt_func = partial(fastai_optimizer.OptimWrapper, opt=torch.optim.Adam)
    else:  # fastai's ranger: a Lookahead stepping a fastai RAdam
        opt_func = fastai_optimizer.ranger
    learn, counted = learner(opt_func)
    res = fit(learn, epochs=1)
    assert res.summary.total_steps == counted.steps == 20
    assert res.summary.optimizer_ms_median > 0


def test_fastai_input_bound_advice_names_fastai_settings_and_no_prefetch_factor():
    learn, _ = learner()
    res = fit(learn)
    d = res.diagnosis
    assert d.verdict == "input-bound", d.title
    first = sentence(d.advice[0])
    assert first.startswith("Change the arguments where your fastai DataLoaders are made"), first
    assert "num_workers=0 \u2192 num_workers=" in first
    report = repr(Report.of(res))
    assert "prefetch_factor" not in report and "%traceml tune" not in report
    assert "DataLoader: num_workers=0, pin_memory=False, persistent_workers=False, bs=32" in report


def test_fastai_optimizers_are_told_by_their_update_with_the_torch_optimizer_that_makes_it():
    params = [torch.nn.Parameter(torch.zeros(2))]

    def plain_step(p, lr, **kwargs):
        p.data.add_(p.grad, alpha=-lr)

    told = {
        "Adam": fastai_optimizer.Adam(params, lr=0.1),
        "Adam, L2": fastai_optimizer.Adam(params, lr=0.1, decouple_wd=False),
        "SGD": fastai_optimizer.SGD(params, lr=0.1),
        "SGD, L2": fastai_optimizer.SGD(params, lr=0.1, mom=0.9, decouple_wd=False),
        "ranger": fastai_optimizer.ranger(params, lr=0.1).opt,  # the RAdam it steps
        "own update": fastai_optimizer.Optimizer(params, [plain_step], lr=0.1),
        "wrapper": fastai_optimizer.OptimWrapper(params, torch.optim.AdamW),
    }
    infos = {k: optimizer_info(o) for k, o in told.items()}
    # the twin made with fastai's hyperparameters where torch's defaults differ (trained
    # side by side here, the losses of fit_one_cycle(3) matched within 2e-5; 7e-5 without)
    assert infos["Adam"].twin_arguments == (("betas", (0.9, 0.99)), ("eps", 1e-05))
    assert infos["Adam, L2"].twin_arguments[-1] == ("weight_decay", 0.01)
    assert infos["SGD, L2"].twin_arguments == (("momentum", 0.9),)
    assert {k: (i.kind, i.fastai_twin) for k, i in infos.items()} == {
        "Adam": ("Adam", "AdamW"),  # fastai's Adam decouples its weight decay
        "Adam, L2": ("Adam", "Adam"),
        "SGD": ("SGD", ""),  # torch's SGD adds its weight decay to the gradient
        "SGD, L2": ("SGD", "SGD"),
        "ranger": ("RAdam", ""),
        "own update": ("Optimizer", ""),
        "wrapper": ("OptimWrapper", None),  # a torch optimizer inside, seen by torch's hooks
    }


def test_fastais_own_optimizer_taking_much_of_the_step_is_advised_its_fused_torch_twin():
    warnings.filterwarnings("ignore", module="fastai")
    blocks = [[torch.nn.Linear(64, 64), torch.nn.LayerNorm(64)] for _ in range(40)]
    model = torch.nn.Sequential(*[m for block in blocks for m in block], torch.nn.Linear(64, 1))
    data = torch.utils.data.TensorDataset(torch.randn(1024, 64), torch.randn(1024, 1))
    dls = fastai_basics.DataLoaders.from_dsets(data, data, bs=32, num_workers=0)
    learn = fastai_basics.Learner(dls, model, loss_func=fastai_basics.MSELossFlat())
    res = fit(learn, epochs=1)
    # 162 tensors updated one by one: about half of each step here, 3.5 ms of 7 ms
    assert res.summary.phase_shares["optimizer"] > 0.3
    [advised] = [f for f in res.diagnosis.advice if f.code == "fastai-optimizer"]
    assert advised.facts["tensors"] == 162
    assert "opt=partial(torch.optim.AdamW, fused=True, betas=(0.9, 0.99), eps=1e-05)" in sentence(
        advised
    )


def test_fine_tune_counts_the_flops_again_once_the_body_is_unfrozen():
    """fastai's fine_tune trains the head with the body frozen, then the whole model: the
    count of a frozen step (about two thirds of an unfrozen one here) would stand for all."""
    warnings.filterwarnings("ignore", module="fastai")
    torch.manual_seed(0)
    body = torch.nn.Sequential(
        torch.nn.Conv2d(3, 16, 3, padding=1), torch.nn.BatchNorm2d(16), torch.nn.ReLU(),
        torch.nn.Conv2d(16, 16, 3, padding=1), torch.nn.BatchNorm2d(16), torch.nn.ReLU(),
        torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(),
    )  # fmt: skip
    model = torch.nn.Sequential(body, torch.nn.Linear(16, 4))
    x, y = torch.randn(512, 3, 16, 16), torch.randint(0, 4, (512,))
    data = torch.utils.data.TensorDataset(x, y)
    dls = fastai_basics.DataLoaders.from_dsets(data, data, bs=16, num_workers=0)
    learn = fastai_basics.Learner(
        dls, model, loss_func=fastai_basics.CrossEntropyLossFlat(),
        splitter=lambda m: [list(m[0].parameters()), list(m[1].parameters())],
    )  # fmt: skip
    with traceml_nb.Run("fine_tune", sample=False) as run:
        with learn.no_bar(), learn.no_logging():
            learn.fine_tune(2, freeze_epochs=1)  # 32 steps frozen, 64 unfrozen
    s = Session().result(run).summary
    with FlopCounterMode(display=False) as by_hand:
        torch.nn.functional.cross_entropy(model(x[:16]), y[:16]).backward()
    assert s.flops_per_step == pytest.approx(by_hand.get_total_flops(), rel=0.05)
    # looked at as the second fit's first epoch began: counted again after its first step
    assert s.flops_since_step == 34


def test_tune_says_it_cannot_build_a_fastai_loader_afresh():
    learn, _ = learner()
    session = Session()
    with traceml_nb.Run("fastai tune", sample=False) as run:
        with learn.no_bar(), learn.no_logging():
            learn.fit(1)
    res = session.result(run)
    entry = session.history.get(res.run_id)
    with pytest.raises(LookupError, match="is a fastai DataLoader, which tune cannot build"):
        tune_run(entry, namespace={"learn": learn})


def test_a_step_wrapped_over_ours_keeps_working_and_ours_beneath_calls_nothing():
    cls = fastai_optimizer.Optimizer
    original = cls.__dict__["step"]
    calls = []
    learn, counted = learner()
    try:
        with traceml_nb.Run("wrapped over", sample=False) as run:
            ours = cls.__dict__["step"]

            def theirs(self, *args, **kwargs):
                calls.append(1)
                return ours(self, *args, **kwargs)

            cls.step = theirs
            with learn.no_bar(), learn.no_logging():
                learn.fit(1)
        assert cls.__dict__["step"] is theirs  # theirs stays
        assert Session().result(run).summary.total_steps == counted.steps == 20
        stepped = []  # the next run wraps theirs; ours beneath it calls no hook twice
        handle = optimizer_hooks.register_post(lambda optimizer, args, kwargs: stepped.append(1))
        try:
            res = fit(learn, epochs=1, label="next run")
        finally:
            handle.remove()
        assert res.summary.total_steps == 20 and len(stepped) == 20 and len(calls) == 40
    finally:
        cls.step = original


def test_fastai_imported_after_the_run_began_is_seen(tmp_path):
    """A cell that imports fastai and trains: the step is wrapped as the first epoch begins."""
    script = textwrap.dedent(
        """
        import warnings
        import torch
        import traceml_nb
        from traceml_nb.session import Session
        with traceml_nb.Run("late import", sample=False) as run:
            from fastai.basics import Adam, DataLoaders, Learner, MSELossFlat
            import fastai.callback.progress
            x, y = torch.randn(256, 16), torch.randn(256, 1)
            ds = torch.utils.data.TensorDataset(x, y)
            dls = DataLoaders.from_dsets(ds, ds, bs=32, num_workers=0)
            learn = Learner(dls, torch.nn.Linear(16, 1), loss_func=MSELossFlat(), opt_func=Adam)
            warnings.filterwarnings("ignore")
            with learn.no_bar(), learn.no_logging():
                learn.fit(2)
        s = Session().result(run).summary
        print("steps", s.total_steps, "optimizer", s.optimizer_ms_median > 0, s.flops_per_step)
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=240,
        cwd=tmp_path, env={**os.environ, "TRACEML_NB_STORE": "off"},
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]
    # the linear model's FLOPs a batch of 32: forward 2·32·16, and its weights' gradient
    assert "steps 16 optimizer True 2048" in out.stdout, out.stdout + out.stderr[-2000:]
