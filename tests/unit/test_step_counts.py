"""What counts as a step, against ground truth the test keeps itself: the loop's own iteration
count and ``perf_counter``, batches counted in ``__getitem__``."""

from __future__ import annotations

import contextlib
import itertools
import time

import pytest
import torch
from torch.utils.data import DataLoader, Dataset

import traceml_nb
from traceml_nb.analysis.thresholds import MIN_STEADY_STEPS
from traceml_nb.session import Session
from traceml_nb.views.diagnosis_words import diagnosis_words


class Counted(Dataset):
    """Items that cost ``sleep_s`` each and are counted as they are made."""

    def __init__(self, n: int = 4000, sleep_s: float = 0.0) -> None:
        self.n = n
        self.sleep_s = sleep_s
        self.items = 0

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        self.items += 1
        if self.sleep_s:
            time.sleep(self.sleep_s)
        return torch.randn(8), torch.randn(1)


def model_and_opt():
    model = torch.nn.Linear(8, 1)
    return model, torch.optim.SGD(model.parameters(), lr=0.01)


def train_step(model, opt, x, y) -> None:
    loss = ((model(x) - y) ** 2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()


def result_of(run):
    """The run's result in a session of its own (no other run to compare with)."""
    return Session().result(run)


@pytest.mark.parametrize(
    "how", ["break", "islice", "exception after the step", "interrupt after the step"]
)
def test_a_loop_that_ends_without_another_fetch_keeps_its_last_step(how):
    model, opt = model_and_opt()
    loader = DataLoader(Counted(), batch_size=4)
    made = 0
    error = {"exception after the step": ValueError, "interrupt after the step": KeyboardInterrupt}
    with pytest.raises(error[how]) if how in error else contextlib.nullcontext():
        with traceml_nb.Run(how, sample=False) as run:
            batches = itertools.islice(loader, 40) if how == "islice" else loader
            for x, y in batches:
                train_step(model, opt, x, y)
                made += 1
                if made == 40:
                    if how == "break":
                        break
                    if how in error:
                        raise error[how]
    assert made == 40
    res = result_of(run)
    assert res.summary.total_steps == 40
    assert len(res.steps.wall_ms) == 40


@pytest.mark.parametrize("pause_s", [0.0, 0.05])
@pytest.mark.parametrize("how", ["break before the step", "break after the step", "islice"])
def test_a_loop_that_leaves_each_epoch_early_keeps_its_steps(how, pause_s):
    """Three epochs of 40 steps over a loader of 100 batches, each left early: the batch the
    loop fetched and broke on is no step (it read as a batch fetched ahead, and the run's
    steps as its optimizer rows: 1 step in all; with a pause between epochs, as a step: 122),
    and an epoch's last step ends at its optimizer step, not at the next epoch's first batch
    (it took the pause: 50 ms)."""
    model, opt = model_and_opt()
    loader = DataLoader(Counted(n=400), batch_size=4)
    made = 0
    with traceml_nb.Run(how, sample=False) as run:
        for _ in range(3):
            batches = itertools.islice(loader, 40) if how == "islice" else loader
            for i, (x, y) in enumerate(batches):
                if how == "break before the step" and i == 40:
                    break
                train_step(model, opt, x, y)
                time.sleep(0.001)  # a step's work, beside which a fetch alone is nothing
                made += 1
                if how == "break after the step" and i == 39:
                    break
            time.sleep(pause_s)  # between epochs: no step's time
    assert made == 120
    res = result_of(run)
    assert res.summary.total_steps == 120
    assert len(res.steps.wall_ms) == 120
    epochs_last = sorted(res.steps.wall_ms[k] for k in (39, 79, 119))
    assert epochs_last[1] < 40.0  # the median of the three: a busy machine may hold one up


def test_a_step_left_open_after_its_update_keeps_its_own_data_wait():
    """Two training loaders taking turns by epoch, each left by a break after the update of
    its 10th batch (Keras leaves each epoch's iterator so too): the step left open ends at its
    update, and the other loader's waits meanwhile are none of its own (one read 20 waits of
    the other's, 10 times its time)."""
    model, opt = model_and_opt()
    quick, slow = (
        DataLoader(Counted(n=400), batch_size=4),
        DataLoader(Counted(n=400, sleep_s=0.001), batch_size=4),
    )
    with traceml_nb.Run("turns", sample=False) as run:
        for loader in (quick, slow, quick, slow):
            for i, (x, y) in enumerate(loader):
                train_step(model, opt, x, y)
                if i == 9:
                    break
    steps = result_of(run).steps
    assert len(steps.wall_ms) == 40
    assert all(w <= wall for w, wall in zip(steps.data_wait_ms, steps.wall_ms, strict=True))


@pytest.mark.parametrize("look", ["fetch", "forward"])
def test_a_look_at_the_first_batch_before_training_is_no_step(look):
    """``x, y = next(iter(loader))``, and a shape check through the model, before the loop
    (Keras' ``model.fit`` builds its model so): no step of the 60 the loop made (it read 61
    with the forward); an inference loop of such looks keeps each as a step."""
    model, opt = model_and_opt()
    loader = DataLoader(Counted(n=80), batch_size=4)
    with traceml_nb.Run("look", sample=False) as run:
        x, _ = next(iter(loader))
        if look == "forward":
            model(x)
        for _ in range(3):
            for x, y in loader:
                train_step(model, opt, x, y)
    assert result_of(run).summary.total_steps == 60
    with traceml_nb.Run("looks", sample=False) as inference, torch.no_grad():
        for _ in range(20):
            model(next(iter(loader))[0])
    assert result_of(inference).summary.total_steps == 20


def _update_by_hand(model, x, y) -> None:
    loss = ((model(x) - y) ** 2).mean()
    model.zero_grad()
    loss.backward()
    with torch.no_grad():
        for p in model.parameters():
            p -= 0.01 * p.grad


@pytest.mark.parametrize(
    ("update", "how"),
    [
        ("optimizer", "break before the step"),
        ("optimizer", "break after the step"),
        ("by hand", "to the end"),
        ("by hand", "break after the step"),
        ("by hand, dataset anew", "to the end"),
        ("none, under no_grad", "to the end"),
        ("none, under no_grad", "break before the step"),
        ("none, in eval mode under no_grad", "to the end"),
    ],
)
def test_a_new_loader_each_epoch_keeps_its_steps(update, how):
    """A DataLoader built for each epoch over the same dataset goes on from the last one's
    epochs: left by a break, its broken-on batch is no step (122 steps of 120 read before,
    the batch credited with the next loader's first optimizer step; without an optimizer, 93:
    no optimizer step tells, the timed phases do, no model having run on it); without an
    optimizer, every loader's batches are the steps (the first loader's alone were, 60 of
    180, and the others an evaluation)."""
    model, opt = model_and_opt()
    data = Counted(n=160)
    tensors = torch.randn(160, 8), torch.randn(160, 1)
    made = 0
    with traceml_nb.Run(update, sample=False) as run:
        for _ in range(3):
            if update == "by hand, dataset anew":
                data = torch.utils.data.TensorDataset(*tensors)
            for i, (x, y) in enumerate(DataLoader(data, batch_size=4, shuffle=True)):
                if how == "break before the step" and i == 30:
                    break
                if update == "optimizer":
                    train_step(model, opt, x, y)
                elif update.startswith("by hand"):
                    _update_by_hand(model, x, y)
                else:
                    if update == "none, in eval mode under no_grad":
                        model.eval()  # the models' mode read at the second epoch: eval
                    with torch.no_grad():
                        model(x)
                made += 1
                if how == "break after the step" and i == 29:
                    break
    assert made == (120 if how == "to the end" else 90)
    summary = result_of(run).summary
    assert (summary.total_steps, summary.phases) == (made, [])


def test_two_new_loaders_each_epoch_drawn_together_keep_their_steps():
    """``zip`` of two DataLoaders over one dataset, both built for each epoch: the second's
    first batch leaves no epoch of the first (it is an epoch's first step, drawn beside it),
    and the first's next one leaves the second's epoch, which ``zip`` never ends."""
    model, opt = model_and_opt()
    data = Counted(n=160)
    made = 0
    with traceml_nb.Run("zip anew", sample=False) as run:
        for _ in range(3):
            first, second = DataLoader(data, batch_size=4, shuffle=True), DataLoader(data, 4)
            pairs = zip(first, second, strict=False)
            for (x, y), (x2, y2) in pairs:
                train_step(model, opt, torch.cat([x, x2]), torch.cat([y, y2]))
                made += 1
    assert made == 120
    summary = result_of(run).summary
    assert (summary.total_steps, summary.phases) == (120, [])


def test_an_inference_over_two_loaders_drawn_together_has_steady_steps():
    """``zip`` of two DataLoaders with no optimizer (images and masks, under no_grad): each
    step draws the other loader's batch, no evaluation set apart from a training that is not
    there (every step was left out as interleaved: "insufficient data, 0 steady steps");
    an evaluation drawn inside a training step still is."""
    model, _ = model_and_opt()
    images, masks = DataLoader(Counted(n=160), batch_size=4), DataLoader(Counted(n=160), 4)
    with traceml_nb.Run("zip inference", sample=False) as run, torch.no_grad():
        for (x, _), (x2, _) in zip(images, masks, strict=True):
            model(torch.cat([x, x2]))
    res = result_of(run)
    assert res.summary.total_steps == 40 and res.summary.steady_steps >= 30
    assert res.diagnosis.verdict != "insufficient-data"
    model, opt = model_and_opt()
    train, evaluation = DataLoader(Counted(n=160), batch_size=4), DataLoader(Counted(n=64), 16)
    with traceml_nb.Run("evaluation inside", sample=False) as run:
        for i, (x, y) in enumerate(train):
            if i % 10 == 5:
                with torch.no_grad():
                    for x_eval, _ in evaluation:
                        model(x_eval)
            train_step(model, opt, x, y)
    summary = result_of(run).summary
    assert summary.total_steps == 40 and summary.interleaved_steps == 4


@pytest.mark.parametrize("autograd", ["off", "on, eval mode"])
def test_an_evaluation_over_the_training_set_with_a_new_loader_leaves_no_epoch(autograd):
    """An evaluation over the training dataset with a DataLoader built for it, run inside a
    training step before its optimizer step: iterated another way (autograd off, or the
    model in eval mode), it leaves no training epoch, and its batches are a phase."""
    model, opt = model_and_opt()
    data = Counted(n=160)
    made = 0
    with traceml_nb.Run("evaluate anew", sample=False) as run:
        for _ in range(2):
            for i, (x, y) in enumerate(DataLoader(data, batch_size=4, shuffle=True)):
                if i % 20 == 5:
                    model.eval()
                    with torch.no_grad() if autograd == "off" else contextlib.nullcontext():
                        for x_eval, _ in DataLoader(data, batch_size=16):
                            model(x_eval)
                    model.train()
                train_step(model, opt, x, y)
                made += 1
    summary = result_of(run).summary
    assert summary.total_steps == made == 80
    [phase] = summary.phases
    assert (phase.batches, phase.passes) == (4 * 10, 4)


def test_a_batch_drawn_from_a_new_iterator_every_step_is_a_step_to_the_next():
    """``next(iter(loader))`` for each batch, accumulating four: every iterator is left after
    one batch, which is no epoch left early: each batch is a step, from its fetch to the
    next one (as a loop over one iterator accumulating four counts them)."""
    model, opt = model_and_opt()
    loader = DataLoader(Counted(n=400), batch_size=4, shuffle=True)
    with traceml_nb.Run("new iterator each step", sample=False) as run:
        for k in range(48):
            x, y = next(iter(loader))
            (((model(x) - y) ** 2).mean() / 4).backward()
            if k % 4 == 3:
                opt.step()
                opt.zero_grad()
            time.sleep(0.001)
    res = result_of(run)
    assert res.summary.total_steps == 48
    assert sum(res.steps.wall_ms) == pytest.approx(run.record.elapsed_ns / 1e6, rel=0.1)


@pytest.mark.parametrize("every", [10, 3])
def test_a_loop_that_skips_batches_keeps_its_steps(every):
    """``continue`` on every 10th (or 3rd) batch: a skipped batch is a row that only fetched,
    as a batch a trainer fetches ahead is. Read so once the loader's rows had been decided on,
    it made the run's steps the optimizer rows, which were no longer written: 1 step. The
    decision the first steps made is kept: each batch the loop iterated is a step, the skipped
    ones too (their fetch is the loop's data wait)."""
    model, opt = model_and_opt()
    trained = 0
    with traceml_nb.Run("skips batches", sample=False) as run:
        for i, (x, y) in enumerate(DataLoader(Counted(n=640), batch_size=4)):
            if i % every == every - 1:
                continue
            train_step(model, opt, x, y)
            time.sleep(0.001)  # a step's work, beside which a fetch alone is nothing
            trained += 1
    res = result_of(run)
    assert run.record.loaders[0].fetch_only_rows > 0  # (told apart as such)
    assert res.summary.total_steps == 160
    assert res.summary.step_ms_median > 1.0


def test_a_step_that_failed_before_its_optimizer_step_is_not_a_step():
    model, opt = model_and_opt()
    made = 0
    with pytest.raises(RuntimeError), traceml_nb.Run("fails mid-step", sample=False) as run:
        for x, y in DataLoader(Counted(), batch_size=4):
            if made == 12:
                raise RuntimeError("the forward pass of the 13th batch failed")
            train_step(model, opt, x, y)
            made += 1
    assert result_of(run).summary.total_steps == made == 12


@pytest.mark.parametrize("skipped", ["by GradScaler", "the first", "the first five"])
def test_a_step_whose_optimizer_step_was_skipped_is_a_step(skipped):
    # GradScaler skips optimizer.step() where the scaled gradients overflowed (a run's first
    # steps, at its starting scale): the first such step looked like a trainer's batch fetched
    # ahead (63 steps of 64), five like a gradient-accumulation cycle fetched ahead (59)
    torch.manual_seed(0)
    model, opt = model_and_opt()
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**127, backoff_factor=2.0**-4)
    stepped = []
    with traceml_nb.Run("skips", sample=False) as run:
        for k, (x, y) in enumerate(DataLoader(Counted(n=256), batch_size=4)):
            loss = ((model(x * 1e4) - y) ** 2).mean()
            opt.zero_grad()
            if skipped == "by GradScaler":
                scaler.scale(loss).backward()
                scale = scaler.get_scale()
                scaler.step(opt)
                scaler.update()
                stepped.append(scaler.get_scale() >= scale)
            else:
                loss.backward()
                stepped.append(k >= (1 if skipped == "the first" else 5))
                if stepped[-1]:
                    opt.step()
    assert not stepped[0] and sum(stepped) < len(stepped) == 64
    assert run.record.loaders[0].fetches_ahead is False
    assert result_of(run).summary.total_steps == 64


@pytest.mark.parametrize("kept", ["itertools.cycle(loader)", "list(loader)", "one batch"])
def test_a_loop_training_on_batches_it_kept_has_a_step_per_optimizer_step(kept):
    # after its first epoch cycle() replays the batches it kept and fetches none (16 steps of
    # 96 were counted); a list of the loader's batches, or one batch trained on over and over
    # (overfitting a batch, as a first check of a model), fetch all before training (16 steps
    # of fetching alone; 1 step)
    from traceml_nb.analysis.steps import select_rows

    model, opt = model_and_opt()
    loader = DataLoader(Counted(n=64), batch_size=4)
    made = 0
    with traceml_nb.Run("kept", sample=False) as run:
        if kept == "one batch":
            batches = itertools.repeat(next(iter(loader)))
        else:
            batches = itertools.cycle(loader if kept.startswith("itertools") else list(loader))
        for x, y in itertools.islice(batches, 96):
            train_step(model, opt, x, y)
            made += 1
    assert result_of(run).summary.total_steps == made == 96
    steps = select_rows(run.record.snapshot())
    ends = steps.start_s + steps.wall_ms / 1e3
    assert (steps.start_s[1:] >= ends[:-1] - 1e-9).all()  # one after the other, none twice


def test_a_step_after_each_epochs_last_batch_is_no_step_of_its_own():
    # accumulating 3 batches of an epoch of 16, the loop steps once more after the epoch on
    # the gradients of its last batch: an optimizer step after the last batch's step closed,
    # alone before the next epoch's first fetch, which is no step of its own
    model, opt = model_and_opt()
    loader = DataLoader(Counted(n=64), batch_size=4)
    with traceml_nb.Run("leftover", sample=False) as run:
        for _epoch in range(3):
            for i, (x, y) in enumerate(loader):
                ((model(x) - y) ** 2).mean().backward()
                if (i + 1) % 3 == 0:
                    opt.step()
                    opt.zero_grad()
            opt.step()
            opt.zero_grad()
    assert result_of(run).summary.total_steps == 3 * 16


def test_an_evaluation_over_the_training_loader_is_a_phase_not_steps():
    # the classic tutorial's evaluate(model, train_loader) after each epoch, under no_grad:
    # its batches were steps (96 of 48), now an evaluation of their own, as the val loader's
    model, opt = model_and_opt()
    train, val = DataLoader(Counted(n=64), batch_size=4), DataLoader(Counted(n=32), batch_size=4)

    def evaluate(loader) -> None:
        with torch.no_grad():
            for x, _ in loader:
                model(x)

    with traceml_nb.Run("evaluates", sample=False) as run:
        for _epoch in range(3):
            for x, y in train:
                train_step(model, opt, x, y)
            evaluate(train)
            evaluate(val)
    summary = result_of(run).summary
    assert summary.total_steps == 3 * 16
    assert {p.name: (p.batches, p.passes) for p in summary.phases} == {
        "eval (loader 0)": (3 * 16, 3),
        "eval (loader 1)": (3 * 8, 3),
    }


def _first_step_timed(monkeypatch) -> None:
    """Only the run's first step timed: no step of an evaluation says what it ran."""
    from traceml_nb.engine.instrument import step_phases

    monkeypatch.setattr(step_phases, "EARLY_SAMPLE_INTERVAL_S", 1e9)
    monkeypatch.setattr(step_phases, "SAMPLE_INTERVAL_S", 1e9)


def _every_other_step_timed(monkeypatch) -> None:
    from traceml_nb.engine.instrument import step_phases

    monkeypatch.setattr(step_phases, "EARLY_SAMPLE_INTERVAL_S", 0.0)
    monkeypatch.setattr(step_phases, "SAMPLE_INTERVAL_S", 0.0)


TIMINGS = {"timed": _every_other_step_timed, "untimed": _first_step_timed}


@pytest.mark.parametrize("timing", TIMINGS)
def test_an_evaluation_over_the_training_loader_with_autograd_on_is_a_phase_not_steps(
    timing, monkeypatch
):
    # model.eval() without torch.no_grad(), a beginner's evaluate(model, train_loader): by its
    # events an epoch of batches without an optimizer step, as in gradient accumulation; its
    # batches were steps (96 of 48). An epoch begun with the model in eval mode that ends
    # without an optimizer step is an evaluation's; the live chart, which read its rows as
    # steps meanwhile, reads them again.
    from traceml_nb.views.live.data import StepSeries

    TIMINGS[timing](monkeypatch)
    model, opt = model_and_opt()
    train, val = DataLoader(Counted(n=64), batch_size=4), DataLoader(Counted(n=32), batch_size=4)

    def evaluate(loader) -> None:
        model.eval()
        for x, _ in loader:
            model(x)
        model.train()

    with traceml_nb.Run("evaluates with autograd on", sample=False) as run:
        chart = StepSeries(lambda row: run.snapshot(row, samples=False))
        for _epoch in range(3):
            for x, y in train:
                train_step(model, opt, x, y)
            chart.update()
            evaluate(train)
            chart.update()
            evaluate(val)
    chart.update(final=True)
    summary = result_of(run).summary
    assert summary.total_steps == chart.steps == 3 * 16
    assert {p.name: (p.batches, p.passes) for p in summary.phases} == {
        "eval (loader 0)": (3 * 16, 3),
        "eval (loader 1)": (3 * 8, 3),
    }
    assert [len(info.evaluation_rows) for info in run.record.loaders] == [3, 0]


@pytest.mark.parametrize("ended", ["completed", "interrupted"])
def test_an_evaluation_left_by_a_break_at_the_run_s_end_is_over_if_the_run_completed(ended):
    # each epoch's evaluation over 4 batches of the training loader (model.eval(), autograd
    # on), left by a break: the last one is followed by no epoch, only by the run's end. A run
    # that completed ended its loop, so that epoch is over (its batches were 4 steps more); an
    # interrupted one may have been training, and its batches stay steps
    model, opt = model_and_opt()
    loader = DataLoader(Counted(n=64), batch_size=4)
    with contextlib.suppress(KeyboardInterrupt), traceml_nb.Run(ended, sample=False) as run:
        for _epoch in range(3):
            model.train()
            for x, y in loader:
                train_step(model, opt, x, y)
            model.eval()
            for i, (x, _) in enumerate(loader):
                if i == 4:
                    break
                model(x)
        if ended == "interrupted":
            raise KeyboardInterrupt
    summary = result_of(run).summary
    told = 3 if ended == "completed" else 2
    assert summary.total_steps == 3 * 16 + 4 * (3 - told)
    assert {p.name: p.passes for p in summary.phases} == {"eval (loader 0)": told}


@pytest.mark.parametrize("timing", TIMINGS)
def test_a_loop_that_trains_in_eval_mode_keeps_its_steps(timing, monkeypatch):
    # the other side: model.eval() called once and model.train() never again (a validation
    # before training): every epoch begins in eval mode, and its optimizer steps make it a
    # training epoch
    TIMINGS[timing](monkeypatch)
    model, opt = model_and_opt()
    loader = DataLoader(Counted(n=64), batch_size=4)
    model.eval()
    with traceml_nb.Run("trains in eval mode", sample=False) as run:
        for _epoch in range(3):
            for x, y in loader:
                train_step(model, opt, x, y)
    assert result_of(run).summary.total_steps == 3 * 16
    assert run.record.loaders[0].evaluation_rows == []


def test_gradient_accumulation_over_more_batches_than_an_epoch_in_eval_mode_keeps_its_steps(
    monkeypatch,
):
    # an epoch in eval mode without an optimizer step whose timed steps ran a backward trains:
    # 8 batches an epoch, an optimizer step every 16 (every other epoch has none)
    _every_other_step_timed(monkeypatch)
    model, opt = model_and_opt()
    loader = DataLoader(Counted(n=32), batch_size=4)
    made = 0
    model.eval()
    with traceml_nb.Run("accumulates across epochs", sample=False) as run:
        for _epoch in range(6):
            for x, y in loader:
                ((model(x) - y) ** 2).mean().backward()
                made += 1
                if made % 16 == 0:
                    opt.step()
                    opt.zero_grad()
    summary = result_of(run).summary
    assert summary.total_steps == made == 48
    assert summary.phases == [] and run.record.loaders[0].evaluation_rows == []


def test_an_inference_loop_under_no_grad_has_its_batches_as_steps():
    # its epochs begin with autograd off as an evaluation's do; nothing trains, so they are
    # the steps
    model = torch.nn.Linear(8, 1)
    with traceml_nb.Run("inference", sample=False) as run, torch.no_grad():
        for x, _ in DataLoader(Counted(n=64), batch_size=4):
            model(x)
    summary = result_of(run).summary
    assert (summary.total_steps, summary.step_source, summary.phases) == (16, "dataloader", [])


@pytest.mark.parametrize("autograd", ["off", "on"])
def test_a_validation_loader_beside_training_on_tensors_is_an_evaluation(autograd, monkeypatch):
    # the loop trains on tensors it slices itself and validates on a DataLoader after each
    # epoch; with autograd on (no torch.no_grad()) the validation loader was credited with the
    # optimizer steps that followed it and read as the training loader: 96 steps of 64, and
    # "32% of each is making its batch"; and a fetch of it before a sample ran to the
    # sample's first forward, a "copy" of 0.5 ms in steps that copy nothing
    from traceml_nb.engine.instrument import step_phases

    # every other step timed: a run of a few milliseconds has timed steps among its steady ones
    monkeypatch.setattr(step_phases, "SAMPLE_INTERVAL_S", 0.0)
    model, opt = model_and_opt()
    x_all, y_all = torch.randn(64, 8), torch.randn(64, 1)
    val = DataLoader(Counted(n=32), batch_size=4)
    grad = contextlib.nullcontext() if autograd == "on" else torch.no_grad()
    with traceml_nb.Run("tensors", sample=False) as run:
        for _epoch in range(4):
            for i in range(0, 64, 4):
                train_step(model, opt, x_all[i : i + 4], y_all[i : i + 4])
            with grad:
                for x, _ in val:
                    model(x)
    summary = result_of(run).summary
    assert (summary.total_steps, summary.step_source) == (4 * 16, "optimizer")
    assert {p.name: (p.batches, p.passes) for p in summary.phases} == {
        "eval (loader 0)": (4 * 8, 4)
    }
    assert summary.copy_ms_median is None and "no DataLoader batch" in summary.unavailable.get(
        "copy_ms_median", ""
    )


def test_an_interrupted_run_of_enough_steps_gets_a_verdict():
    model, opt = model_and_opt()
    loader = DataLoader(Counted(sleep_s=0.001), batch_size=4)
    made = 0
    with pytest.raises(KeyboardInterrupt), traceml_nb.Run("stopped", sample=False) as run:
        for x, y in loader:
            train_step(model, opt, x, y)
            made += 1
            if made == 16:
                raise KeyboardInterrupt  # the stop button right after the 16th step
    res = result_of(run)
    assert res.status == "interrupted"
    # the warm-up (1 step, or 2 where the machine is busy) and the step whose FLOPs were
    # counted (none where a model was compiled earlier in the process) are left out
    s = res.summary
    assert s.total_steps == 16
    assert s.steady_steps == 16 - s.warmup_steps - s.flop_counted_steps >= MIN_STEADY_STEPS
    assert res.diagnosis.verdict != "insufficient-data", res.diagnosis.title


def test_a_loader_drawn_inside_each_step_is_part_of_the_step():
    """A second loader drawn three batches a step (a memory bank, an auxiliary loss): the steps
    are the outer loader's, and the inner draws' wait is the step's wait."""
    model, opt = model_and_opt()
    outer = DataLoader(Counted(sleep_s=0.0), batch_size=4)
    inner_data = Counted(sleep_s=0.002)
    inner = itertools.cycle(DataLoader(inner_data, batch_size=2))
    made, starts = 0, []
    with traceml_nb.Run("inner draws", sample=False) as run:
        for x, y in outer:
            starts.append(time.perf_counter())
            for _ in range(3):
                next(inner)
            train_step(model, opt, x, y)
            made += 1
            if made == 40:
                break
        end = time.perf_counter()
    res = result_of(run)
    assert res.summary.total_steps == made == 40
    # step times: the loop's own clock (from one step's start to the next) against ours
    truth_ms = sorted((b - a) * 1e3 for a, b in zip(starts, [*starts[1:], end], strict=True))
    ours_ms = sorted(res.steps.wall_ms[i] for i, p in enumerate(res.steps.phase) if p != "eval")
    assert ours_ms[len(ours_ms) // 2] == pytest.approx(truth_ms[len(truth_ms) // 2], rel=0.15)
    # each step waited for its three inner batches of two 2 ms items (a sleep never ends early)
    assert res.summary.data_wait_ms_median >= 3 * 2 * 2.0
    assert res.summary.phases == []  # the inner loader is no phase of its own


@pytest.mark.parametrize(
    ("where", "batches", "autograd"),
    [
        ("top", 1, False),
        ("top", 4, False),
        ("after", 1, False),
        ("after", 4, False),
        ("every", 1, False),
        ("top", 1, True),
        ("top", 4, True),
        ("after", 1, True),
        ("after", 4, True),
    ],
)
def test_an_evaluation_every_few_steps_is_no_step_wherever_it_sits_in_the_loop(
    where, batches, autograd
):
    """``if i % 10 == 0: evaluate()`` before the step or after it, on one batch
    (``next(iter(val_loader))``) or several, under ``torch.no_grad()`` or with autograd on (a
    validation loss computed without it); ``every``: one batch after each step. Before, one
    batch made the validation loader a loader trained alongside (its batches were steps: 71 of
    64, or 127 with one every step), and an evaluation before the step was no evaluation (none
    left out); with autograd on, one batch or four every few steps made it a loader trained
    alongside until 2026-12-06 (one: 69 steps of 64; four: 7 optimizer steps credited to it).
    Its epochs begin now and then: an evaluation's, not a second dataset's."""
    model, opt = model_and_opt()
    train = DataLoader(Counted(256), batch_size=4)
    val = DataLoader(Counted(64), batch_size=16)
    every = 1 if where == "every" else 10

    def evaluate() -> None:
        with torch.set_grad_enabled(autograd):
            for vx, _ in itertools.islice(val, batches):
                model(vx)

    evaluations = 0
    with traceml_nb.Run("evaluations", sample=False) as run:
        for i, (x, y) in enumerate(train):
            if where == "top" and i % every == 0:
                evaluate()
                evaluations += 1
            train_step(model, opt, x, y)
            if where != "top" and i % every == 0:
                evaluate()
                evaluations += 1
    res = result_of(run)
    assert res.summary.total_steps == 64
    # with autograd on, the one inside the first step is told only at the second (the first
    # step, its warm-up, is left out of the statistics anyway)
    first_unflagged = autograd and where == "top"
    assert res.summary.interleaved_steps == evaluations - first_unflagged
    [phase] = res.summary.phases
    assert phase.batches == evaluations * batches
    assert [info.optimizer_steps for info in run.record.loaders] == [64, 0]


@pytest.mark.parametrize("where", ["top", "inside", "with a second optimizer"])
def test_a_batch_of_a_fresh_iterator_drawn_in_every_step_trains(where):
    """``next(iter(unlabeled_loader))`` in every step, autograd on (a second dataset's batch,
    as semi-supervised loops draw it), before the training batch or between it and the
    optimizer step, or in a GAN's step (two optimizers, nothing fetched between them): a loader
    trained alongside, its batches inside the steps, not an evaluation's; drawn alone, each of
    its draws is a step."""
    model, opt = model_and_opt()
    other, opt_other = model_and_opt()
    train = DataLoader(Counted(256), batch_size=4)
    second = DataLoader(Counted(64), batch_size=4, shuffle=True)
    with traceml_nb.Run("second dataset", sample=False) as run:
        for x, y in train:
            if where != "inside":
                ux, _ = next(iter(second))
            loss = ((model(x) - y) ** 2).mean()
            if where == "inside":
                ux, _ = next(iter(second))
            loss = loss + model(ux).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            if where == "with a second optimizer":
                train_step(other, opt_other, x, y)
    res = result_of(run)
    assert res.summary.total_steps == 64
    assert res.summary.interleaved_steps == 0 and res.summary.phases == []
    # (the loader fetched last is credited each optimizer's step: twice a GAN's step)
    assert min(info.optimizer_steps for info in run.record.loaders) == 64
    with traceml_nb.Run("draws alone", sample=False) as run:
        for _ in range(20):
            x, y = next(iter(second))
            train_step(model, opt, x, y)
    res = result_of(run)
    assert res.summary.total_steps == 20
    assert [info.optimizer_steps for info in run.record.loaders] == [20]


class OnePause(Dataset):
    """Fast items, but one of them takes ``pause_s`` (a storage hiccup, a cold cache)."""

    def __init__(self, n: int, pause_at: int, pause_s: float) -> None:
        self.n, self.pause_at, self.pause_s = n, pause_at, pause_s

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        if i == self.pause_at:
            time.sleep(self.pause_s)
        return torch.randn(8), torch.randn(1)


def test_one_long_pause_in_a_real_loop_is_named_not_called_a_slow_pipeline():
    model, opt = model_and_opt()
    loader = DataLoader(OnePause(600, pause_at=4 * 36, pause_s=0.6), batch_size=4)
    compute = time.sleep  # each step computes 3 ms, so that the pause is one step's wait

    with traceml_nb.Run("one pause", sample=False) as run:
        for x, y in loader:
            train_step(model, opt, x, y)
            compute(0.003)
    res = result_of(run)
    assert res.summary.total_steps == 150
    assert res.summary.data_wait_share > 0.3  # the pause dominates the plain share
    d = res.diagnosis
    assert d.verdict != "input-bound", d.title
    [found] = [f for f in d.secondary if f.code == "stalls"]
    assert [s["step"] for s in found.facts["stalls"]] == [37]
    stall = [line for line in diagnosis_words(d).also if line.startswith("One fetch, at step 37")]
    assert stall and "a stall, not a slow pipeline" in stall[0], d.secondary
    assert "less time" in stall[0]  # what removing it would save, still counted


@pytest.mark.parametrize("loader", ["kept", "persistent", "built for each pass"])
def test_an_evaluation_that_starts_its_workers_for_each_batch_is_told_to_keep_them(loader):
    """``next(iter(val_loader))`` every 10 steps from a loader with 2 workers: each pass starts
    them again unless they are kept (``persistent_workers=True``), and the note says so; a
    loader built for each pass needs building once too."""
    model, opt = model_and_opt()
    train = DataLoader(Counted(240), batch_size=4)
    persistent = loader == "persistent"
    val_set = Counted(64)

    def val_loader() -> DataLoader:
        return DataLoader(val_set, batch_size=16, num_workers=2, persistent_workers=persistent)

    val = val_loader()
    with traceml_nb.Run("restarts", sample=False) as run:
        for i, (x, y) in enumerate(train):
            train_step(model, opt, x, y)
            if i % 10 == 0:
                vx, vy = next(iter(val_loader() if loader == "built for each pass" else val))
                ((model(vx) - vy) ** 2).mean().item()
    res = result_of(run)
    [phase] = res.summary.phases
    assert (phase.batches, phase.passes, phase.workers) == (6, 6, 2)
    assert phase.persistent_workers is persistent
    assert phase.loaders == (6 if loader == "built for each pass" else 1)
    notes = [f for f in res.diagnosis.secondary if f.code == "evaluation-restarts-workers"]
    assert len(notes) == (0 if persistent else 1), res.diagnosis.secondary
    if not persistent:
        assert notes[0].facts["wait_s"] == pytest.approx(phase.pass_start_wait_s)
        [line] = [line for line in diagnosis_words(res.diagnosis).also if "passes" in line]
        assert line.endswith("persistent_workers=True keeps the workers between passes.")
        assert ("build it once" in line) is (loader == "built for each pass")


def test_two_tasks_trained_in_turn_are_both_training_loaders():
    """Round-robin multi-task training: one step on task A's loader, the next on task B's,
    each iterator kept: both loaders train (neither is taken for an evaluation, though each is
    drawn every other step and begins its epoch where the other was drawn), every batch is a
    step."""
    model, opt = model_and_opt()
    task_a = DataLoader(Counted(128), batch_size=4)
    task_b = DataLoader(Counted(128), batch_size=4)
    with traceml_nb.Run("two tasks", sample=False) as run:
        for _epoch in range(2):
            a, b = iter(task_a), iter(task_b)
            for _ in range(len(task_a)):
                train_step(model, opt, *next(a))
                train_step(model, opt, *next(b))
    res = result_of(run)
    assert res.summary.phases == [] and res.summary.interleaved_steps == 0
    assert all(info.optimizer_steps > 0 for info in run.record.loaders)
    assert res.summary.total_steps == 2 * 2 * 32


@pytest.mark.parametrize("how", ["break before the step", "break after the step"])
def test_two_loaders_taking_turns_by_epoch_each_left_early_keep_their_steps(how):
    """A curriculum: task A's loader for an epoch, then task B's, in turn, each left by a
    ``break`` after 40 batches. The batch A was fetched and broken on is no step, and B's
    first batch's optimizer step is B's (each switch read one step too many: 163 of 160)."""
    model, opt = model_and_opt()
    task_a = DataLoader(Counted(400), batch_size=4)
    task_b = DataLoader(Counted(320), batch_size=4)
    made = 0
    with traceml_nb.Run(how, sample=False) as run:
        for loader in (task_a, task_b, task_a, task_b):
            for i, (x, y) in enumerate(loader):
                if how == "break before the step" and i == 40:
                    break
                train_step(model, opt, x, y)
                time.sleep(0.001)
                made += 1
                if how == "break after the step" and i == 39:
                    break
    res = result_of(run)
    assert made == 160 and res.summary.total_steps == 160
    assert res.summary.phases == [] and res.summary.interleaved_steps == 0
    assert all(info.optimizer_steps > 0 for info in run.record.loaders)


def test_a_model_whose_mode_cannot_be_read_leaves_the_loop_as_it_was(monkeypatch):
    # the models' training mode is read at each epoch's first batch, inside the user's next():
    # a failure there is the mode unknown, never the user's exception
    from traceml_nb.engine.instrument.step_phases import StepPhases

    def raises(self):
        raise RuntimeError("a model whose attributes raise")

    monkeypatch.setattr(StepPhases, "models_training", raises)
    model, opt = model_and_opt()
    with traceml_nb.Run("mode unknown", sample=False) as run:
        for _epoch in range(2):
            for x, y in DataLoader(Counted(n=32), batch_size=4):
                train_step(model, opt, x, y)
    assert run.status == "completed" and result_of(run).summary.total_steps == 2 * 8


@pytest.mark.parametrize("model", ["a module", "plain tensors"])
def test_an_inference_loop_that_breaks_counts_the_batches_it_used(model):
    """``for i, (x, y) in enumerate(loader): if i == 40: break; model(x)`` under no_grad, each
    epoch: the batch broken on is fetched and never used, which the phases, timed on every
    step of a loop without an optimizer, tell (41 a pass before). A model of plain tensors
    shows no forward on any step, so nothing tells the batch apart: it stays."""
    net = torch.nn.Linear(8, 1)
    weight = torch.randn(8, 1)
    loader = DataLoader(Counted(n=400), batch_size=4)
    with traceml_nb.Run("inference break", sample=False) as run, torch.no_grad():
        for _ in range(3):
            for i, (x, _) in enumerate(loader):
                if i == 40:
                    break
                net(x) if model == "a module" else x @ weight
    assert result_of(run).summary.total_steps == (120 if model == "a module" else 123)
