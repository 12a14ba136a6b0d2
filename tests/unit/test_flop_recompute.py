"""Activation checkpointing recomputes forwards in the backward: the FLOP count keeps the
model's FLOPs (each forward once, as MFU counts them) and the recomputed ones apart, for the
reentrant and the non-reentrant checkpoint, and says so in the report."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint
from torch.utils.data import DataLoader, TensorDataset

import traceml_nb
from traceml_nb.analysis import analyze
from traceml_nb.engine.instrument import flop_count, recompute
from traceml_nb.engine.instrument.flop_count import _counter
from traceml_nb.views.text import metric_lines

WIDTH, HIDDEN, BATCH = 32, 128, 16


class Blocks(nn.Module):
    """Four residual MLP blocks, the last three checkpointed by ``reentrant`` (None: none)."""

    def __init__(self, reentrant: bool | None) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.blocks = nn.ModuleList(
            nn.Sequential(nn.Linear(WIDTH, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, WIDTH))
            for _ in range(4)
        )
        self.head = nn.Linear(WIDTH, 2)
        self.reentrant = reentrant

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for i, block in enumerate(self.blocks):
            if i and self.reentrant is not None:
                x = x + checkpoint(block, x, use_reentrant=self.reentrant)
            else:
                x = x + block(x)
        return self.head(x)


def _train(model: Blocks, steps: int = 8):
    opt = torch.optim.Adam(model.parameters())
    data = TensorDataset(torch.randn(steps * BATCH, WIDTH), torch.randint(0, 2, (steps * BATCH,)))

    def step(x, y) -> None:
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        opt.zero_grad()

    for x, y in DataLoader(data, batch_size=BATCH):
        step(x, y)
    return step, x, y


def _flops_line(run, result) -> str:
    """The report's "FLOPs per step" line."""
    lines = metric_lines(result.summary, run.capabilities)
    return next(line.text for line in lines if line.label == "FLOPs per step")


def _by_hand(reentrant: bool | None) -> tuple[int, int]:
    """(the model's FLOPs, the recomputed ones) of one step, counted by hand."""
    step, x, y = _train(Blocks(reentrant), steps=1)
    counter = _counter()
    with counter:
        step(x, y)
    return counter.get_total_flops() - counter.recomputed, counter.recomputed


@pytest.mark.parametrize("reentrant", [False, True])
def test_the_recomputed_forwards_are_counted_apart_from_the_models_flops(
    monkeypatch, reentrant
) -> None:
    monkeypatch.setattr(flop_count, "_compiled_anything", lambda: False)
    plain, none_recomputed = _by_hand(None)
    model, recomputed = _by_hand(reentrant)
    assert none_recomputed == 0 and model == plain
    forward_of_three_blocks = 3 * 2 * (2 * BATCH * WIDTH * HIDDEN)
    if reentrant:  # the whole of each checkpointed block again
        assert recomputed == forward_of_three_blocks
    else:  # up to what the backward needs: each block's first product
        assert recomputed == forward_of_three_blocks // 2
    with traceml_nb.Run("checkpointed", sample=False) as run:
        _train(Blocks(reentrant))
    count = run.record.flops
    assert count is not None and count.why == ""
    assert (count.flops, count.recomputed_flops) == (model, recomputed)
    result = analyze(run.record.snapshot(), run.capabilities)
    assert result.summary.flops_per_step == model
    assert result.summary.recomputed_flops_per_step == recomputed
    amount = "786 kFLOP" if reentrant else "393 kFLOP"  # per step, as the report rounds it
    assert _flops_line(run, result) == (
        f"{model / 1e6:.3g} MFLOP (counted on one step; {amount} more recomputed by "
        "activation checkpointing, not counted as the model's)"
    )


def test_without_checkpointing_nothing_is_recomputed_and_the_report_says_nothing(
    monkeypatch,
) -> None:
    monkeypatch.setattr(flop_count, "_compiled_anything", lambda: False)
    with traceml_nb.Run("plain", sample=False) as run:
        _train(Blocks(None))
    assert run.record.flops is not None and run.record.flops.recomputed_flops == 0
    result = analyze(run.record.snapshot(), run.capabilities)
    assert result.summary.recomputed_flops_per_step == 0
    assert _flops_line(run, result).endswith("(counted on one step)")


def test_a_torch_that_tells_nothing_counts_the_recomputed_forwards_as_the_models(
    monkeypatch,
) -> None:
    """Where torch's internals are named otherwise, the recomputation is not told apart: the
    count is the work done, as before (never less than the model's)."""

    def absent(*args):
        raise AttributeError("no such function in this torch")

    monkeypatch.setattr(torch._C, "_current_autograd_node", absent)
    assert recompute.recomputing() is False
    model, recomputed = _by_hand(True)
    monkeypatch.undo()
    told_model, told_recomputed = _by_hand(True)
    assert recomputed == 0 and model == told_model + told_recomputed
