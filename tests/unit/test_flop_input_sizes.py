"""The FLOPs of steps whose batches differ in size (:mod:`traceml_nb.analysis.input_sizes`):
batches padded to their longest sequence do work in proportion to their length, so one step's
count is taken in proportion to each batch's elements; batches of one size, a short last batch
among them, are left as counted."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader
from torch.utils.flop_counter import FlopCounterMode

import traceml_nb
from traceml_nb.analysis import analyze
from traceml_nb.analysis.input_sizes import input_sizes
from traceml_nb.analysis.summary import measure
from traceml_nb.analysis.thresholds import VARYING_INPUTS
from traceml_nb.engine.instrument import flop_count
from traceml_nb.engine.instrument.loader import batch_shape_of
from traceml_nb.engine.open_steps import batch_extent
from traceml_nb.engine.step_table import StepTable

BATCH = 8


@pytest.fixture(autouse=True)
def nothing_compiled(monkeypatch) -> None:
    """As in a process that never compiled a model (another test of the suite may have)."""
    monkeypatch.setattr(flop_count, "compiled_anything", lambda: False)


def _per_token_model() -> torch.nn.Module:
    """A model whose FLOPs are exactly in proportion to its input's tokens (no pooling)."""
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Embedding(100, 16),
        torch.nn.Linear(16, 32),
        torch.nn.ReLU(),
        torch.nn.Linear(32, 8),
    )


def _padded(items: list[torch.Tensor]) -> dict[str, torch.Tensor]:
    """A collate of one's own, as DataCollatorWithPadding: each batch to its longest."""
    ids = torch.nn.utils.rnn.pad_sequence(items, batch_first=True)
    return {"input_ids": ids, "labels": ids % 8}


def _loader(lengths: list[int]) -> DataLoader:
    data = [torch.randint(1, 100, (n,)) for n in lengths]
    return DataLoader(data, batch_size=BATCH, collate_fn=_padded)


def _step(model, opt, batch) -> None:
    logits = model(batch["input_ids"])
    torch.nn.functional.cross_entropy(logits.flatten(0, 1), batch["labels"].flatten()).backward()
    opt.step()
    opt.zero_grad()


def _train(lengths: list[int]) -> traceml_nb.Run:
    model = _per_token_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with traceml_nb.Run("padded", sample=False) as run:
        for batch in _loader(lengths):
            _step(model, opt, batch)
    return run


def _flops_per_element() -> float:
    model = _per_token_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    per_element = []
    for length in (5, 17):
        batch = _padded([torch.ones(length, dtype=torch.long)] * BATCH)
        with FlopCounterMode(display=False) as by_hand:
            _step(model, opt, batch)
        per_element.append(by_hand.get_total_flops() / (BATCH * length))
    assert per_element[0] == per_element[1]  # the model is what the test says it is
    return per_element[0]


def test_batches_padded_to_their_longest_are_counted_in_proportion_to_their_elements() -> None:
    """The count, one batch's, is scaled to the steps' mean elements (the figure FlopCounterMode
    gives over those steps, for this model exactly), and the FLOP/s is the median of each
    step's FLOPs over its time; as counted, the figure was the counted batch's alone."""
    rng = np.random.default_rng(3)
    lengths = [int(n) for n in rng.integers(4, 40, 48 * BATCH)]
    run = _train(lengths)
    snapshot = run.record.snapshot()
    summary = analyze(snapshot, run.capabilities).summary
    m = measure(snapshot, run.capabilities)
    per_element = _flops_per_element()
    elements = m.selection.elements[m.steady_index]
    assert len(elements) >= 40 and (elements > 0).all()
    assert summary.flop_input_elements is not None
    counted, mean, least, most = summary.flop_input_elements
    assert mean == pytest.approx(elements.mean()) and (least, most) == (
        elements.min(),
        elements.max(),
    )
    assert run.record.flops is not None
    assert run.record.flops.flops == pytest.approx(per_element * counted)
    assert summary.flops_per_step == pytest.approx(per_element * elements.mean())
    assert summary.flops_per_step != pytest.approx(run.record.flops.flops, rel=0.02)
    rates = per_element * elements / ((m.wall_ms - m.wait_ms) / 1e3)
    assert summary.achieved_tflops == pytest.approx(float(np.median(rates)) / 1e12)
    text = str(run.result())
    assert (
        f"(the steps' mean: counted on one step, of a batch of {counted:,.0f} elements, and taken "
        "in proportion to each step's; the batches differ in size, "
        f"{least:,.0f} to {most:,.0f} elements in their first tensor)"
    ) in text.replace("\n", " ")


def test_batches_of_one_size_and_a_short_last_one_are_left_as_counted() -> None:
    """Sequences of one length through the same collate, a short last batch after 19: the
    same size a sample, so the count stands as it is, and the FLOP/s is over the median step,
    as for any run."""
    run = _train([12] * (19 * BATCH + 3))
    snapshot = run.record.snapshot()
    summary = analyze(snapshot, run.capabilities).summary
    assert summary.flop_input_elements is None
    assert run.record.flops is not None
    assert summary.flops_per_step == run.record.flops.flops
    compute_s = summary.compute_ms_median / 1e3
    assert summary.achieved_tflops == pytest.approx(summary.flops_per_step / compute_s / 1e12)
    assert "the batches differ in size" not in str(run.result())


def test_the_spread_of_the_elements_a_sample_decides_on_both_sides_of_varying_inputs() -> None:
    """The per-sample elements' coefficient of variation at ``VARYING_INPUTS``: varying; just
    under it: as counted. Fewer samples in a batch of the same per-sample size: no spread."""
    samples = np.full(100, 8)

    def elements_with_spread(cv: float) -> np.ndarray:
        per_sample = 100 + cv * 100 * np.tile([1.0, -1.0], 50)  # std = cv x mean exactly
        return per_sample * samples

    at = input_sizes(np.array([800.0]), elements_with_spread(VARYING_INPUTS), samples)
    assert at is not None and at.factor == pytest.approx(1.0)
    assert (
        input_sizes(np.array([800.0]), elements_with_spread(VARYING_INPUTS * 0.99), samples) is None
    )
    short_last = np.array([8] * 9 + [2])
    assert input_sizes(np.array([800.0]), short_last * 100, short_last) is None
    unknown = elements_with_spread(0.3)
    unknown[5] = -1
    assert input_sizes(np.array([800.0]), unknown, samples) is None
    assert input_sizes(np.array([-1.0]), elements_with_spread(0.3), samples) is None


def test_a_trainers_steps_at_its_epochs_ends_are_no_spread() -> None:
    """Where a trainer fetches ahead, an epoch's first step holds two fetches' samples and its
    last none told, while each step's elements are the batch it trained on: batches of one size
    (a Trainer's 40 steps an epoch of 4 sequences of 16 read "the batches differ in size, 64 to
    64 elements" when the spread was of the elements a sample); padded ones still spread."""
    samples = np.array(([8] + [4] * 38 + [-1]) * 2)
    assert input_sizes(np.array([64.0]), np.full(80, 64), samples) is None
    padded = np.tile([40, 64, 52, 48], 20)
    varying = input_sizes(np.array([64.0]), padded, samples)
    assert varying is not None and (varying.least, varying.most) == (40, 64)


def test_a_batchs_first_tensor_tells_its_samples_and_elements() -> None:
    ids = torch.zeros(4, 7, dtype=torch.long)
    assert batch_extent(batch_shape_of({"input_ids": ids, "labels": ids[:, 0]})) == (4, 28)
    assert batch_extent(batch_shape_of((torch.zeros(3, 2, 5), torch.zeros(3)))) == (3, 30)
    assert batch_extent(batch_shape_of((torch.tensor(1.0), torch.zeros(6, 2)))) == (6, 12)
    assert batch_extent(batch_shape_of([["a", "b"], ["c"]])) == (-1, -1)
    assert batch_extent(batch_shape_of(torch.tensor(2.0))) == (-1, -1)
    assert batch_extent(None) == batch_extent(object()) == (-1, -1)


def test_the_elements_column_holds_minus_one_where_none_were_told() -> None:
    table = StepTable()
    table.extend([(0, 1, 0, 4, 0, 0)] * 2, elements=[-1, -1])
    assert list(table.elements) == [-1, -1]  # none told: the column never grew
    assert table.nbytes == StepTable().nbytes + 2 * 32
    table.extend([(2, 1, 0, 4, 0, 0)] * 3, elements=[-1, -1, 28])
    assert list(table.elements) == [-1, -1, -1, -1, 28]
    assert list(table.snapshot(3).elements) == [-1, 28]
    table.extend([(5, 1, 0, 4, 0, 0)])
    assert list(table.snapshot().window(4, 6).elements) == [28, -1]
