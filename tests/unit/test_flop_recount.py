"""A loop that changes the parameters it trains after the FLOPs were counted (an unfreeze, as
fastai's ``fine_tune`` and transfer-learning loops do): the count is made again and stands for
the steps since, up to ``MAX_RECOUNTS`` times; a loop that freezes a model for part of every
step (a GAN's discriminator) changes nothing."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import traceml_nb
from traceml_nb.analysis import analyze
from traceml_nb.engine.flop_capture import TRAINABLE_CHANGING
from traceml_nb.engine.instrument import flop_count
from traceml_nb.engine.instrument.flop_count import _counter
from traceml_nb.engine.instrument.trainable import MAX_RECOUNTS, TRAINABLE_CHECK_STEPS
from traceml_nb.views.text import metric_lines

#: steps trained between two changes: a look at the trainable parameters falls in each
PHASE_STEPS = 2 * TRAINABLE_CHECK_STEPS + 8


@pytest.fixture(autouse=True)
def _nothing_compiled(monkeypatch):
    monkeypatch.setattr(flop_count, "compiled_anything", lambda: False)


def _model() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 1)
    )


def _step(model, opt, x, y) -> None:
    nn.functional.mse_loss(model(x), y).backward()
    opt.step()
    opt.zero_grad()


def _freeze_body(model, frozen: bool) -> None:
    for p in model[:4].parameters():
        p.requires_grad_(not frozen)


def _by_hand(model, x, y) -> int:
    counter = _counter()
    with counter:
        nn.functional.mse_loss(model(x), y).backward()
    model.zero_grad()
    return counter.get_total_flops()


def _train_in_phases(changes: int):
    """Body frozen, then unfrozen, frozen… ``changes`` times, ``PHASE_STEPS`` steps each."""
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.001)
    x, y = torch.randn(8, 16), torch.randn(8, 1)
    with traceml_nb.Run("unfreeze", sample=False) as run:
        for phase in range(changes + 1):
            _freeze_body(model, frozen=phase % 2 == 0)
            for _ in range(PHASE_STEPS):
                _step(model, opt, x, y)
    return run, model, x, y


def test_an_unfreeze_counts_the_flops_again_for_the_steps_since():
    run, model, x, y = _train_in_phases(changes=1)
    summary = analyze(run.record.snapshot(), run.capabilities).summary
    unfrozen = _by_hand(model, x, y)
    _freeze_body(model, True)
    assert _by_hand(model, x, y) < 0.7 * unfrozen  # what the first count found
    assert summary.flops_per_step == unfrozen
    # seen at the first look after the change, at most TRAINABLE_CHECK_STEPS steps on
    assert PHASE_STEPS < summary.flops_since_step <= PHASE_STEPS + TRAINABLE_CHECK_STEPS + 2
    assert summary.flop_counted_steps == 2  # both counts' steps left out
    line = next(
        m.text for m in metric_lines(summary, run.capabilities) if m.label == "FLOPs per step"
    )
    assert line.endswith(
        "(counted on one step; counted again as the parameters it trains changed: the steps "
        f"from step {summary.flops_since_step} on)"
    )


def test_an_unfreeze_between_two_epochs_is_seen_at_the_next_epochs_first_step():
    """A loop unfreezes between epochs: the epoch's first fetch has the count look at the next
    optimizer step, not up to ``TRAINABLE_CHECK_STEPS`` later."""
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.001)
    data = TensorDataset(torch.randn(8 * 20, 16), torch.randn(8 * 20, 1))
    with traceml_nb.Run("unfreeze by epoch", sample=False) as run:
        for epoch in range(3):
            _freeze_body(model, frozen=epoch == 0)
            for x, y in DataLoader(data, batch_size=8):
                _step(model, opt, x, y)
    summary = analyze(run.record.snapshot(), run.capabilities).summary
    assert summary.flops_per_step == _by_hand(model, x, y)
    assert summary.flops_since_step == 22  # the second epoch's first step looked: 21 + 1


def test_a_run_that_trains_the_same_parameters_throughout_is_counted_once():
    run, model, x, y = _train_in_phases(changes=0)  # frozen throughout
    summary = analyze(run.record.snapshot(), run.capabilities).summary
    assert summary.flops_since_step is None and summary.flop_counted_steps == 1
    assert summary.flops_per_step == _by_hand(model, x, y)


@pytest.mark.parametrize("changes", [MAX_RECOUNTS, MAX_RECOUNTS + 1])
def test_past_max_recounts_no_count_holds(changes):
    run, model, x, y = _train_in_phases(changes)
    summary = analyze(run.record.snapshot(), run.capabilities).summary
    if changes == MAX_RECOUNTS:  # the last phase's count: frozen or not, as it ended
        assert summary.flops_per_step == _by_hand(model, x, y)
        assert summary.flop_counted_steps == MAX_RECOUNTS + 1
        return
    assert summary.flops_per_step is None
    assert summary.unavailable["flops_per_step"] == TRAINABLE_CHANGING.format(n=changes)
    assert summary.flop_counted_steps == MAX_RECOUNTS + 1


@pytest.mark.parametrize("first", ["generator", "discriminator"])
def test_a_discriminator_frozen_for_the_generators_step_changes_nothing(first):
    """pix2pix's ``set_requires_grad(netD, False)`` before the generator's update, True before
    the discriminator's, every iteration: each optimizer is read at its own steps, which find
    what its first look found (the looks fall on either optimizer's steps)."""
    torch.manual_seed(0)
    gen, disc = nn.Linear(8, 16), nn.Linear(16, 1)
    opt_g = torch.optim.Adam(gen.parameters())
    opt_d = torch.optim.Adam(disc.parameters())
    z = torch.randn(4, 8)

    def generator_step() -> None:
        disc.requires_grad_(False)
        (-disc(gen(z)).mean()).backward()
        opt_g.step()
        opt_g.zero_grad()

    def discriminator_step() -> None:
        disc.requires_grad_(True)
        disc(gen(z).detach()).mean().backward()
        opt_d.step()
        opt_d.zero_grad()

    order = [generator_step, discriminator_step]
    if first == "discriminator":
        order.reverse()
    with traceml_nb.Run("gan", sample=False) as run:
        for i in range(6 * TRAINABLE_CHECK_STEPS):
            order[0]()
            if i % 3 != 1:  # the other in two steps of three: looks fall on both
                order[1]()
    summary = analyze(run.record.snapshot(), run.capabilities).summary
    assert summary.flops_per_step is not None and summary.flops_since_step is None
