"""The live view: the pure chart-data functions, then ``LiveView`` against real runs."""

from __future__ import annotations

import json
import math
import threading
import time
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from bokeh.models import ColumnDataSource
from torch.utils.data import DataLoader, Dataset, TensorDataset

import traceml_nb
from traceml_nb.analysis.steps import StepRule, step_rule
from traceml_nb.engine.options import Backends
from traceml_nb.engine.record import (
    SOURCE_MARKER,
    SOURCE_OPTIMIZER,
    LoaderInfo,
    RunRecord,
    SampleTable,
)
from traceml_nb.engine.step_table import PhaseRows
from traceml_nb.views.live.bokeh_patch import BatchedBokehModel
from traceml_nb.views.live.charts import OTHER_LABEL, OWN_STEP_TITLE, PHASES_STEP_TITLE
from traceml_nb.views.live.data import (
    PHASE_FIELDS,
    STEP_FIELDS,
    SeriesUpdate,
    StepRows,
    StepSeries,
    _carried_shares,
    bin_samples,
    bin_steps,
    bucket_medians,
    bucket_size,
    recent_rate,
)
from traceml_nb.views.live.sample_series import SampleSeries
from traceml_nb.views.live.view import (
    MAX_TICK_S,
    VIEW_MAX_DUTY,
    LiveView,
    header_html,
    tick_wait_s,
)

NAN = float("nan")
MS = 1_000_000


# --- pure functions -----------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("rows", "expected"),
    [(0, 1), (1, 1), (2000, 1), (2001, 2), (4000, 2), (4001, 4), (100_000, 64)],
)
def test_bucket_size_is_the_smallest_power_of_two_that_fits(rows, expected):
    assert bucket_size(rows, 2000) == expected
    assert math.ceil(rows / expected) <= 2000


def test_bucket_medians_ignore_unmeasured_values():
    values = np.array([3.0, 1.0, 2.0, NAN, NAN, NAN, NAN, NAN, 4.0, 1.0, 3.0, 2.0, 7.0])
    assert bucket_medians(values, 1, partial=False).tolist()[:3] == [3.0, 1.0, 2.0]
    medians = bucket_medians(values, 4, partial=False)
    assert len(medians) == 3
    assert medians[0] == 2.0  # of 3, 1, 2: the NaN is ignored
    assert np.isnan(medians[1])  # nothing measured: stays unmeasured, never 0
    assert medians[2] == 2.5
    with_tail = bucket_medians(values, 4, partial=True)
    assert len(with_tail) == 4 and with_tail[-1] == 7.0
    assert len(bucket_medians(np.array([]), 4, partial=True)) == 0


@pytest.mark.parametrize("k", [1, 2, 4, 8])
@pytest.mark.parametrize("partial", [False, True])
def test_bucket_medians_of_several_series_are_each_series_own(k, partial):
    """The step chart's series go in one call, as rows: each row's medians are the ones it
    gets alone, NaN buckets, partly measured buckets and the partial tail included."""
    rng = np.random.default_rng(k)
    series = rng.random((5, 45))
    series[rng.random((5, 45)) < 0.25] = NAN
    series[2, 8:16] = NAN  # a bucket (of k = 8) measured nowhere
    together = bucket_medians(series, k, partial=partial)
    alone = [bucket_medians(row, k, partial=partial) for row in series]
    assert together.shape == (5, len(alone[0]))
    for row, expected in zip(together, alone, strict=True):
        np.testing.assert_array_equal(row, expected)  # (NaN where NaN)


def test_recent_rate():
    assert recent_rate([]) is None
    assert recent_rate([(1.0, 10)]) is None
    assert recent_rate([(1.0, 10), (1.0, 12)]) is None
    assert recent_rate([(1.0, 10), (2.0, 30), (3.0, 50)]) == 20.0


def _rows(walls_ms, waits_ms, batch=8, start_ms=0):
    starts, t = [], start_ms * MS
    for w in walls_ms:
        starts.append(t)
        t += w * MS
    n = len(walls_ms)
    cols = (starts, [w * MS for w in walls_ms], [w * MS for w in waits_ms], [batch] * n)
    return StepRows(*(np.array(c, dtype=np.int64) for c in cols))


def test_bin_steps_exact_medians_whole_buckets_only():
    rows = _rows([10, 20, 30, 40, 50], [1, 2, 3, 4, 5])
    data, used = bin_steps(rows, 0, 2, partial=False, rate_window=1)
    assert used == 4
    assert data["step"].tolist() == [1.5, 3.5]
    assert data["step_ms"].tolist() == [15.0, 35.0]
    assert data["wait_ms"].tolist() == [1.5, 3.5]
    assert data["compute_ms"].tolist() == [13.5, 31.5]
    assert data["t_s"] == pytest.approx([0.030, 0.100])
    assert data["steps_per_s"] == pytest.approx([2 / 0.030, 2 / 0.070])
    assert data["samples_per_s"] == pytest.approx([16 / 0.030, 16 / 0.070])


def test_bin_steps_partial_bucket_and_unknown_batch_size():
    rows = _rows([10, 20, 30], [1, 2, 3], batch=-1)
    data, used = bin_steps(rows, 100, 2, partial=True, rate_window=1)
    assert used == 3
    assert data["step"].tolist() == [101.5, 103.0]
    assert data["step_ms"].tolist() == [15.0, 30.0]
    assert np.isnan(data["samples_per_s"]).all()
    # the partial last bucket's throughput still spans k steps: steps 2 and 3
    assert data["steps_per_s"][1] == pytest.approx(2 / 0.050)


def test_bin_steps_throughput_over_a_trailing_window_with_context():
    rows = _rows([10, 10, 20, 20, 40], [0] * 5, batch=4)
    # the first two rows were sent already: context for the throughput only
    data, used = bin_steps(rows, 2, 1, partial=False, context=2, rate_window=3)
    assert used == 3
    assert data["step"].tolist() == [3.0, 4.0, 5.0]
    assert data["step_ms"].tolist() == [20.0, 20.0, 40.0]
    assert data["steps_per_s"] == pytest.approx([3 / 0.040, 3 / 0.050, 3 / 0.080])
    assert data["samples_per_s"] == pytest.approx([12 / 0.040, 12 / 0.050, 12 / 0.080])


def test_bin_steps_splits_the_rest_of_each_step_by_its_latest_timed_phases():
    rows = _rows([10, 10, 20, 20], [2, 2, 4, 4])  # rests: 8, 8, 16, 16 ms
    untimed = [NAN] * 4
    timed = [1 * MS, 2 * MS, 3 * MS, 1 * MS]  # copy, forward, backward, optimizer of 8 ms
    phases = np.array([untimed, timed, untimed, untimed])
    rows.shares = _carried_shares(PhaseRows.of_dense(phases), rows.wall_ns - rows.wait_ns, None)
    data, used = bin_steps(rows, 0, 1, partial=True, rate_window=1)
    assert used == 4
    # before the first timed step: no phase, the whole rest is "other"
    assert all(np.isnan(data[name][0]) for name in PHASE_FIELDS)
    assert data["other_ms"][0] == pytest.approx(8.0)
    # the timed step itself, then the later ones split in its proportions
    assert [data[name][1] for name in PHASE_FIELDS] == pytest.approx([1.0, 2.0, 3.0, 1.0])
    assert data["other_ms"][1] == pytest.approx(1.0)
    assert [data[name][3] for name in PHASE_FIELDS] == pytest.approx([2.0, 4.0, 6.0, 2.0])
    parts = sum(data[name] for name in PHASE_FIELDS) + data["other_ms"]
    assert parts[1:] == pytest.approx(data["compute_ms"][1:])  # the layers add up to the rest
    # what a later read starts from: the shares carried over the last rows
    carried = _carried_shares(PhaseRows.none(), np.array([10 * MS]), rows.shares[-1])
    assert carried[0] == pytest.approx([1 / 8, 2 / 8, 3 / 8, 1 / 8])


def test_bin_samples_medians_per_column():
    cols = {"t": [0.1, 0.2, 0.3, 0.4, 0.5], "cpu": [10.0, NAN, 30.0, 50.0, 70.0]}
    data, used = bin_samples(cols, 2, partial=False)
    assert used == 4
    assert data["t"] == pytest.approx([0.15, 0.35])
    assert data["cpu"].tolist() == [10.0, 40.0]
    data, used = bin_samples(cols, 2, partial=True)
    assert used == 5 and data["cpu"][-1] == 70.0


def test_the_step_rule_the_chart_shares_with_the_report():
    def sources(rec: RunRecord) -> tuple[int, ...]:
        return step_rule(rec.loaders, rec.markers, rec.optimizer_steps).sources

    rec = RunRecord()
    assert step_rule(rec.loaders, rec.markers, rec.optimizer_steps).kind == "none"
    rec.optimizer_steps = 3
    assert sources(rec) == (SOURCE_OPTIMIZER,)
    loader = dict(num_workers=0, pin_memory=False, prefetch_factor=None, persistent_workers=False)
    common = dict(batch_size=8, dataset_type="D", dataset_len=8, iterable=False)
    rec.loaders.append(LoaderInfo(slot=0, fetches=50, **loader, **common))  # eval, iterated most
    rec.loaders.append(LoaderInfo(slot=1, fetches=10, **loader, **common))
    rec.optimizer_steps = 0
    assert sources(rec) == (0,)
    rec.loaders[1].optimizer_steps = 10
    assert sources(rec) == (1,)
    rec.markers = 1
    assert sources(rec) == (SOURCE_MARKER,)


class Chart:
    """What the browser holds for one source: applies updates like ``ColumnDataSource`` does
    (a replacement, or a stream with rollover) and records them."""

    def __init__(self, rollover: int) -> None:
        self.rollover = rollover
        self.data: dict[str, np.ndarray] = {}
        self.replacements = 0
        self.streams = 0
        self.max_points = 0

    def apply(self, update: SeriesUpdate | None) -> None:
        if update is None:
            return
        if update.replace:
            self.replacements += 1
            self.data = {k: v.copy() for k, v in update.data.items()}
        else:
            self.streams += 1
            for k, v in update.data.items():
                self.data[k] = np.concatenate([self.data[k], v])[-self.rollover :]
        self.max_points = max(self.max_points, len(self))

    def __len__(self) -> int:
        return len(next(iter(self.data.values()), []))


def _synthetic_record(
    rec: RunRecord, steps: int, *, chunk: int, series: StepSeries | None, chart: Chart | None
) -> RunRecord:
    """Add to ``rec`` (one training loader, slot 0) steps that interleave with optimizer rows;
    the series is updated every ``chunk`` steps, as the view's ticks would."""
    t = 0
    for i in range(steps):
        wall = (10 + i % 7) * MS
        wait = (i % 3) * MS
        rec.steps.append(t, wall, wait, 32, 0, 0)
        rec.steps.append(t, wall, wait, 32, SOURCE_OPTIMIZER, 0)
        t += wall
        if series is not None and chart is not None and (i + 1) % chunk == 0:
            chart.apply(series.update())
    return rec


def _training_record() -> RunRecord:
    rec = RunRecord()
    rec.optimizer_steps = 1
    rec.loaders.append(
        LoaderInfo(
            0, 0, False, None, False, 32, "D", None, False, fetches=1, optimizer_steps=1, leads=1
        )
    )
    return rec


def test_step_series_stays_bounded_over_100k_steps_and_ends_exact():
    rec = _training_record()
    series = StepSeries(rec.snapshot, max_points=2000)
    chart = Chart(rollover=2000)
    _synthetic_record(rec, 100_000, chunk=250, series=series, chart=chart)
    rec.steps.append(0, 5 * MS, 0, 32, 0, 0)  # one more step: a partial last bucket
    chart.apply(series.update(final=True))
    assert series.update(final=True) is None  # finished

    assert series.k == 64
    assert chart.max_points <= 2000
    assert series.points == len(chart) <= 2000
    # k doubled 6 times (1 -> 64): a replacement each time, plus the first one
    assert chart.replacements == 7
    assert chart.streams > 300
    # the optimizer rows were left out and every training step is in exactly one point
    assert series.steps == 100_001
    rows = StepRows.of_rule(rec.steps.snapshot(0), StepRule("dataloader", (0,)))
    expected, used = bin_steps(rows, 0, 64, partial=True)
    assert used == 100_001
    assert set(chart.data) == set(expected)
    for name, values in expected.items():
        np.testing.assert_array_equal(chart.data[name], values, err_msg=name)


def test_a_rebuild_in_parts_gives_the_points_of_the_whole_record_at_once(monkeypatch):
    """A rebuild bins the record ``REBUILD_ROWS`` rows at a time (a long run's rebuild holds
    one part's steps, not all of them): its points are those of all the steps binned at
    once, the phases' shares carried across the parts."""
    import traceml_nb.views.live.data as data_module

    rec = _training_record()
    n = 20_000
    rows, phases = [], []
    t = 0
    for i in range(n):
        wall, wait = (10 + i % 7) * MS, (i % 3) * MS
        rows += [(t, wall, wait, 32, 0, 0), (t, wall, wait, 32, SOURCE_OPTIMIZER, 0)]
        phases += [(MS, 2 * MS, (i % 5) * MS, MS) if i % 37 == 5 else None, None]
        t += wall
    rec.steps.extend(rows, phases)
    expected, used = bin_steps(
        StepRows.of_rule(rec.steps.snapshot(0), StepRule("dataloader", (0,))), 0, 16, partial=True
    )
    assert used == n
    read = []
    of_rule = StepRows.of_rule.__func__
    monkeypatch.setattr(
        StepRows,
        "of_rule",
        classmethod(lambda cls, c, *a: read.append(len(c)) or of_rule(cls, c, *a)),
    )
    monkeypatch.setattr(data_module, "REBUILD_ROWS", 999)
    series = StepSeries(rec.snapshot, max_points=2000)
    update = series.update(final=True)
    assert update is not None and update.replace and series.k == 16
    assert max(read) == 999 and sum(read) == 2 * n  # the record in parts of 999 rows
    assert set(update.data) == set(expected)
    for name, values in expected.items():
        np.testing.assert_array_equal(update.data[name], values, err_msg=name)
    assert series.has_phases and series.points == len(expected["step"])


def test_step_series_sends_only_new_points_each_tick():
    rec = _training_record()
    series = StepSeries(rec.snapshot)
    chart = Chart(rollover=2000)
    _synthetic_record(rec, 10, chunk=5, series=series, chart=chart)
    assert chart.replacements == 1 and chart.streams == 1
    assert chart.data["step"].tolist() == [float(i) for i in range(1, 11)]
    assert series.update() is None  # nothing new


def test_step_series_rebuilds_when_the_step_source_changes():
    rec = RunRecord()
    train_info = LoaderInfo(0, 0, False, None, False, 32, "D", None, False, fetches=3)
    rec.loaders.append(train_info)
    for i in range(3):
        rec.steps.append(i * 10 * MS, 10 * MS, MS, 32, 0, 0)
    series = StepSeries(rec.snapshot)
    first = series.update()
    assert first is not None and first.replace and len(first) == 3
    # an eval loader is iterated more: before any optimizer step it is the best guess
    eval_info = LoaderInfo(1, 0, False, None, False, 32, "D", None, False, fetches=9)
    rec.loaders.append(eval_info)
    for i in range(9):
        rec.steps.append(i * MS, MS, 0, 32, 1, 0)
    upd = series.update()
    assert upd is not None and upd.replace and len(upd) == 9 and series.rule.sources == (1,)
    # the optimizer steps reveal the training loader: the chart is rebuilt from its rows
    train_info.optimizer_steps = 3
    upd = series.update()
    assert upd is not None and upd.replace and upd.data["step_ms"].tolist() == [10.0, 10.0, 10.0]
    assert series.update() is None


def test_sample_series_bounded_through_table_decimation():
    table = SampleTable(["util", "other"], cap=5000)
    series = SampleSeries(table, ["util"], max_points=1000)
    chart = Chart(rollover=1000)
    for i in range(100_000):
        table.append(i * 0.1, {"util": float(i % 100)})
        if i % 500 == 0:
            chart.apply(series.update())
    chart.apply(series.update(final=True))
    assert table.stride > 1  # the table halved itself on the way
    assert set(chart.data) == {"t", "util"}  # only the columns asked for
    assert chart.max_points <= 1000
    assert len(chart) == series.points
    assert chart.data["t"][-1] == pytest.approx(table.snapshot()["t"][-1], abs=30)
    assert all(0 <= v <= 99 for v in chart.data["util"])


def test_sample_series_keeps_unmeasured_values_unmeasured():
    table = SampleTable(["util"])
    for i in range(4):
        table.append(i, {"util": None})
    series = SampleSeries(table)
    upd = series.update(final=True)
    assert upd is not None and np.isnan(upd.data["util"]).all()


def test_header_html_escapes_and_labels_the_verdict():
    text = header_html("<mine>", "running", 1234, 12.34, 56.78, "verdict so far: input-bound")
    assert "&lt;mine&gt;" in text
    assert "1,234 steps" in text and "12.3 s" in text and "56.8 steps/s" in text
    assert "verdict so far: input-bound" in text
    done = header_html("r", "completed", 1, 1.0, None, "verdict: compute-bound")
    assert "– steps/s" in done and "verdict: compute-bound" in done
    assert ">1 step<" in done  # singular
    assert "verdict" not in header_html("r", "running", 0, 0.0, None, "")


# --- the batching widget ------------------------------------------------------------------------
def test_batched_model_sends_one_patch_per_batch():
    from bokeh.layouts import column
    from bokeh.models.widgets.markups import Div
    from bokeh.plotting import figure

    a = ColumnDataSource({"x": [], "y": []})
    b = ColumnDataSource({"x": [], "y": []})
    fig = figure()
    fig.line("x", "y", source=a)
    fig.line("x", "y", source=b)
    header = Div(text="")
    widget = BatchedBokehModel(column(header, fig))
    sent: list[dict] = []
    original_send = BatchedBokehModel.send

    def record(self, content, buffers=None):
        sent.append(content)
        original_send(self, content, buffers)

    BatchedBokehModel.send = record  # type: ignore[method-assign]
    try:
        with widget.batch():
            a.stream({"x": [1.0, 2.0], "y": [3.0, NAN]}, rollover=10)
            b.stream({"x": [1.0], "y": [4.0]}, rollover=10)
            header.text = "changed"
        assert len(sent) == 3 == widget.sent_messages
        events = json.loads(sent[2]["payload"])["events"]
        assert [e["kind"] for e in events] == ["ColumnsStreamed", "ColumnsStreamed", "ModelChanged"]
        header.text = "again"  # outside a batch: one patch per change, as BokehModel does
        assert widget.sent_messages == 6
    finally:
        BatchedBokehModel.send = original_send  # type: ignore[method-assign]
        widget.close()


def test_arrays_go_inline_as_gzip_at_our_level_and_bokehs_setting_is_left_alone():
    import base64
    import gzip

    from bokeh.plotting import figure
    from bokeh.settings import settings

    from traceml_nb.views.live.bokeh_patch import INLINE_GZIP_LEVEL, patch_message

    values = np.linspace(0.0, 1.0, 300, dtype=np.float32)
    source = ColumnDataSource({"x": np.zeros(0, dtype=np.float32)})
    fig = figure()
    fig.line("x", "x", source=source)
    widget = BatchedBokehModel(fig)  # puts the source in a document
    level_before = settings.compression_level()
    events = []
    source.document.on_change(lambda event: events.append(event))
    source.data = {"x": values}
    try:
        message = patch_message(events)
        found = []

        def walk(node):
            if isinstance(node, dict):
                if node.get("type") == "bytes" and isinstance(node.get("data"), str):
                    found.append(node["data"])
                for value in node.values():
                    walk(value)
            elif isinstance(node, list):
                for value in node:
                    walk(value)

        walk(json.loads(message.content_json))
        assert message.buffers == []  # inline: three comm messages, no buffers
        assert len(found) == 1
        packed = base64.b64decode(found[0])
        assert packed[:2] == b"\x1f\x8b"  # gzip, which BokehJS always gunzips
        assert INLINE_GZIP_LEVEL == 0 and packed[10] & 0b110 == 0  # a stored deflate block
        assert np.array_equal(np.frombuffer(gzip.decompress(packed), np.float32), values)
        assert settings.compression_level() == level_before
    finally:
        widget.close()


# --- LiveView against real runs ------------------------------------------------------------------
class SleepyDataset(Dataset):
    """Each item takes ``delay`` seconds to load, like a slow decoder."""

    def __init__(self, n: int, delay: float) -> None:
        self.n = n
        self.delay = delay

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        time.sleep(self.delay)
        return torch.randn(8), torch.randn(1)


def train(seconds: float, on_step=None) -> int:
    """A real small training loop over a real DataLoader for about ``seconds``, or until
    ``on_step(steps so far)`` returns true; steps run."""
    model = torch.nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = DataLoader(SleepyDataset(100_000, 0.0005), batch_size=8)
    deadline = time.monotonic() + seconds
    steps = 0
    for x, y in loader:
        loss = ((model(x) - y) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        steps += 1
        if on_step is not None and on_step(steps):
            break
        if time.monotonic() > deadline:
            break
    return steps


@pytest.fixture
def stream_calls(monkeypatch):
    """Every ``ColumnDataSource.stream`` call as ``(thread name, source id)``."""
    calls: list[tuple[str, str]] = []
    original = ColumnDataSource.stream

    def recording(self, new_data, rollover=None):
        calls.append((threading.current_thread().name, self.id))
        return original(self, new_data, rollover)

    monkeypatch.setattr(ColumnDataSource, "stream", recording)
    return calls


def test_live_view_updates_from_one_thread_with_batched_messages(stream_calls):
    with traceml_nb.Run("live-test", interval=0.05) as run:
        # max_duty: on a busy machine a first tick of 10 ms would put the next one off past
        # the run's end (VIEW_MAX_DUTY, tested on its own); this test is about the thread
        view = LiveView(run, display=False, settle_s=0, max_duty=1.0)
        view.start()
        assert [t.name for t in threading.enumerate()].count("traceml-view") == 1
        steps = train(1.5)
    view.stop()
    view.stop()  # twice is fine
    assert view.error is None, run.capabilities.notes
    assert not view.running

    # 2 ticks a second by default (the first after 0.25 s), however fast the steps come
    assert view.tick_s == 0.5
    assert view.ticks <= run.elapsed_s / 0.5 + 2
    assert view.updates >= 2
    # one PATCH-DOC (3 comm messages) per update, whatever was in it
    assert view.messages == 3 * view.updates
    assert view.busy_s > 0

    # at most one stream call per source per tick, all from the writer thread except the
    # final update (made by stop() in this thread)
    writer_calls = [c for c in stream_calls if c[0] == "traceml-view"]
    final_calls = [c for c in stream_calls if c[0] != "traceml-view"]
    per_source: dict[str, int] = {}
    for _, source_id in writer_calls:
        per_source[source_id] = per_source.get(source_id, 0) + 1
    assert writer_calls and max(per_source.values()) <= view.ticks
    assert len(final_calls) <= len(view.charts.sample_series) + 1

    # the chart holds every training step (the final update adds the last partial bucket)
    # and no optimizer rows
    data = view.charts.steps.data
    assert len(data["step"]) == steps == view.step_series.steps
    assert data["step"].tolist() == [float(i) for i in range(1, steps + 1)]
    assert all(v >= 0 for v in data["wait_ms"])
    assert "live-test" in view.charts.header.text
    assert f"{steps:,} steps" in view.charts.header.text
    assert "completed" in view.charts.header.text


def test_the_step_chart_stacks_the_phases_once_a_steps_phases_are_timed():
    with traceml_nb.Run("phases-live", interval=0.05) as run:
        view = LiveView(run, display=False, settle_s=0, max_duty=1.0)
        view.start()
        train(1.0)
    view.stop()
    assert view.error is None, run.capabilities.notes
    charts = view.charts
    legend = charts.step_fig.legend[0].items
    assert [item.label.value for item in legend] == [
        "data wait",
        OTHER_LABEL,
        "input copy",
        "forward",
        "backward",
        "optimizer",
    ]
    assert all(item.visible for item in legend)
    assert charts.step_fig.title.text.startswith(PHASES_STEP_TITLE)
    data = charts.steps.data
    assert np.isnan(data["forward_ms"][0]) or data["forward_ms"][0] > 0
    timed = ~np.isnan(np.asarray(data["forward_ms"], dtype=float))
    assert timed.sum() >= len(timed) - 5  # from the first timed step on (the first step)
    for name in ("forward_ms", "backward_ms", "optimizer_ms"):
        assert (np.asarray(data[name])[timed] > 0).all(), name


def test_a_loop_without_a_dataloader_stacks_its_phases_without_an_input_copy():
    model = torch.nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(64, 8), torch.randn(64, 1)
    with traceml_nb.Run("phases-no-loader", interval=0.05) as run:
        view = LiveView(run, display=False, settle_s=0, max_duty=1.0)
        view.start()
        deadline = time.monotonic() + 1.0
        while time.monotonic() < deadline:  # batches sliced from tensors: no arrival is seen
            for i in range(0, 64, 8):
                loss = ((model(x[i : i + 8]) - y[i : i + 8]) ** 2).mean()
                opt.zero_grad()
                loss.backward()
                opt.step()
                time.sleep(0.0005)
    view.stop()
    assert view.error is None, run.capabilities.notes
    charts = view.charts
    assert charts.phases_shown
    assert [item.label.value for item in charts.step_fig.legend[0].items if item.visible] == [
        "data wait",
        OTHER_LABEL,
        "forward",
        "backward",
        "optimizer",
    ]


@pytest.mark.filterwarnings("ignore:`torch.jit.:DeprecationWarning")
def test_a_phase_never_timed_has_no_legend_entry():
    """A TorchScript model takes no hooks: its forward is never timed, and neither is the input
    copy that ends at it; the chart names the phases that took time and no others (the report
    gives those two as unavailable)."""
    model = torch.jit.script(torch.nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = DataLoader(TensorDataset(torch.randn(64, 8), torch.randn(64, 1)), batch_size=8)
    with traceml_nb.Run("phases-scripted", interval=0.05) as run:
        view = LiveView(run, display=False, settle_s=0, max_duty=1.0)
        view.start()
        deadline = time.monotonic() + 1.0
        while time.monotonic() < deadline:
            for x, y in loader:
                loss = ((model(x) - y) ** 2).mean()
                opt.zero_grad()
                loss.backward()
                opt.step()
    view.stop()
    assert view.error is None, run.capabilities.notes
    assert view.step_series.phases_seen == {"backward_ms", "optimizer_ms"}
    assert [item.label.value for item in view.charts.step_fig.legend[0].items if item.visible] == [
        "data wait",
        OTHER_LABEL,
        "backward",
        "optimizer",
    ]


def test_a_loop_without_a_model_keeps_the_step_chart_in_two_parts():
    loader = DataLoader(SleepyDataset(400, 0.0005), batch_size=8)
    with traceml_nb.Run("no-model", interval=0.05) as run:
        view = LiveView(run, display=False, settle_s=0, max_duty=1.0)
        view.start()
        for _ in loader:
            time.sleep(0.001)
    view.stop()
    legend = view.charts.step_fig.legend[0].items
    assert [item.label.value for item in legend if item.visible] == [
        "data wait",
        "compute (rest of the step)",
    ]
    assert view.charts.step_fig.title.text.startswith(OWN_STEP_TITLE)
    # timed, and nothing of a model ran: areas of no height, not in the legend
    assert (np.asarray(view.charts.steps.data["forward_ms"], dtype=float) == 0).all()


def test_live_view_on_cpu_says_why_there_is_no_gpu_chart(cpu_only_torch):
    with traceml_nb.Run("cpu") as run:
        view = LiveView(run, display=False)
        view.start()
        train(0.3)
    view.stop()
    texts = [
        m.text
        for m in view.charts.layout.references()
        if hasattr(m, "text") and isinstance(m.text, str)
    ]
    expected = f"GPU unavailable: {run.capabilities.why('nvml')}"
    assert run.capabilities.why("nvml")
    assert any(expected in t for t in texts), texts
    assert view.charts.gpus == {}


def test_live_view_shows_host_samples_when_the_host_sampler_runs():
    with traceml_nb.Run("host", interval=0.05) as run:
        view = LiveView(run, display=False)
        view.start()
        train(0.8)
    view.stop()
    if run.record.host is None:
        pytest.skip(f"host sampling unavailable here: {run.capabilities.why('host')}")
    data = view.charts.host.data
    assert set(data) == {"t", "proc_cpu_pct", "workers_cpu_pct", "sys_cpu_pct"}
    assert len(data["t"]) == len(run.record.host)


def test_first_seconds_send_the_whole_series_so_a_late_frontend_misses_nothing(stream_calls):
    """The frontend drops messages that come before the widget's view exists: while settling,
    every update replaces the whole (small) series instead of appending to it."""
    replaced: list[int] = []
    with traceml_nb.Run("settle") as run:
        view = LiveView(run, display=False, settle_s=60)
        view.start()
        steps_source = view.charts.steps

        def watch(attr, old, new):
            replaced.append(len(new["step"]))

        steps_source.on_change("data", watch)
        train(1.2)
    view.stop()
    assert stream_calls == []
    assert len(replaced) >= 2
    assert replaced == sorted(replaced)  # each replacement holds everything sent before
    assert replaced[-1] == len(view.charts.steps.data["step"]) == view.step_series.steps


def _gpu_view(nvml) -> tuple[LiveView, object]:
    with traceml_nb.Run("gpu", device="cuda:0", backends=Backends(nvml=nvml), interval=0.02) as run:
        view = LiveView(run, display=False)
        view.start()
        train(0.6)
    view.stop()
    return view, run


def test_live_view_charts_gpu_utilisation_and_memory_from_nvml():
    from fake_nvml import MIB, FakeNvml, make_gpus

    view, run = _gpu_view(FakeNvml(make_gpus(1)))  # NVML faked: the hardware boundary
    assert run.capabilities.ok("nvml"), run.capabilities.reasons
    assert list(view.charts.gpus) == [0]
    data = view.charts.gpus[0].data
    assert set(data) >= {"t", "util_gpu_pct", "mem_used_mb"}
    assert len(data["t"]) == len(run.record.gpus[0]) >= 3
    assert set(np.asarray(data["util_gpu_pct"]).tolist()) == {87.0}
    assert set(np.asarray(data["mem_used_mb"]).tolist()) == {16384 / 4 * MIB / MIB}
    titles = [
        m.title.text
        for m in view.charts.layout.references()
        if hasattr(m, "title") and hasattr(m.title, "text")
    ]
    assert "GPU utilisation" in titles and "GPU memory" in titles


def legend_labels(view: LiveView) -> list[str]:
    """Every legend entry's label in the view's charts."""
    return [
        item.label.value
        for model in view.charts.layout.references()
        if hasattr(model, "items")
        for item in model.items
        if hasattr(item, "label")
    ]


def test_live_view_shows_sm_activity_as_dots_where_gpm_reads_it(monkeypatch):
    from fake_nvml import FakeNvml, make_gpus

    from traceml_nb.engine.sampling import gpm

    monkeypatch.setattr(gpm, "GPM_PERIOD_S", 0.1)
    view, run = _gpu_view(FakeNvml([make_gpus(1)[0].enable_gpm(sm_active=23.0)]))
    assert run.capabilities.ok("gpm_sm_active"), run.capabilities.reasons
    active = np.asarray(view.charts.gpus[0].data["sm_active_pct"])
    assert set(active[~np.isnan(active)].tolist()) == {23.0}  # between GPM reads: gaps, not 0
    assert "GPU 0 SM activity (GPM)" in legend_labels(view)
    # a GPU without GPM (a T4): no SM activity entry at all
    view, run = _gpu_view(FakeNvml(make_gpus(1)))
    assert not run.capabilities.ok("gpm_sm_active")
    assert "GPU 0 SM activity (GPM)" not in legend_labels(view)


def test_live_view_says_why_gpu_utilisation_is_missing_on_mig():
    from fake_nvml import FakeNvml, make_gpus

    view, run = _gpu_view(FakeNvml(make_gpus(1, mig_on=[0])))
    reason = run.capabilities.why("gpu_utilisation")
    assert reason, run.capabilities.to_dict()
    utilisation = np.asarray(view.charts.gpus[0].data["util_gpu_pct"])
    assert np.isnan(utilisation).all()  # shown as a gap, never as 0
    titles = [
        m.title.text
        for m in view.charts.layout.references()
        if hasattr(m, "title") and hasattr(m.title, "text")
    ]
    assert f"GPU utilisation unavailable: {reason}" in titles


class FailingView(LiveView):
    """A view whose second update raises."""

    def _update(self, final: bool) -> None:
        if self.ticks >= 1:
            raise RuntimeError("boom")
        super()._update(final)


def test_a_failing_view_does_not_break_training():
    with traceml_nb.Run("failing") as run:
        view = FailingView(run, display=False)
        view.start()
        # the second tick comes after the first one's wait: up to MAX_TICK_S on a busy machine
        steps, deadline = 0, time.monotonic() + 2 * MAX_TICK_S + 3
        while view.running and time.monotonic() < deadline:
            steps += train(0.2)
        assert not view.running  # it stopped itself after the failure
    view.stop()
    assert steps > 10 and run.status == "completed"
    assert "live view stopped updating: RuntimeError: boom" in run.capabilities.notes
    assert view.error == "RuntimeError: boom"


def test_a_view_that_cannot_start_notes_why_and_raises_nothing(monkeypatch):
    def broken(*_args, **_kwargs):
        raise ValueError("no charts today")

    monkeypatch.setattr("traceml_nb.views.live.view.LiveCharts", broken)
    with traceml_nb.Run("broken") as run:
        view = LiveView(run, display=False)
        view.start()
        train(0.1)
    view.stop()
    assert "live view failed to start: ValueError: no charts today" in run.capabilities.notes
    assert view.widget is None and not view.running


def test_running_verdict_comes_from_the_analysis_at_most_once_a_second(monkeypatch):
    import traceml_nb.analysis as analysis_pkg
    from traceml_nb.analysis.findings import TEXT, Diagnosis, Finding
    from traceml_nb.analysis.pipeline import Analysis

    calls: list[float] = []

    def fake_analyze(record, capabilities):  # the analysis is another module's job
        calls.append(time.monotonic())
        diag = Diagnosis(
            verdict="input-bound",
            title=Finding(TEXT, {"text": "input-bound: data wait 60%"}),
            confidence="high",
        )
        enough = SimpleNamespace(steady_steps=100, mfu=None)
        return Analysis(summary=enough, diagnosis=diag)  # type: ignore[arg-type]

    monkeypatch.setattr(analysis_pkg, "analyze", fake_analyze, raising=False)
    with traceml_nb.Run("verdict") as run:
        view = LiveView(run, display=False)
        view.start()
        # until two running verdicts came (about 1.3 s quiet): on a busy machine the loop's
        # first steps, and so the first verdict, may come late
        train(10.0, on_step=lambda _: len(calls) >= 2)
    view.stop()
    assert "verdict: input-bound: data wait 60%" in view.charts.header.text
    assert 3 <= len(calls) <= run.elapsed_s + 2  # the running ones (≤ 1/s) and the final one
    gaps = [b - a for a, b in zip(calls, calls[1:-1], strict=False)]
    assert all(g >= view.analysis_interval_s == 1.0 for g in gaps)


def test_a_failing_analysis_drops_the_verdict_after_repeated_errors(monkeypatch):
    import traceml_nb.analysis as analysis_pkg
    import traceml_nb.views.live.view as live

    calls: list[int] = []

    def broken_analyze(record, capabilities):
        calls.append(1)
        raise ZeroDivisionError("no steady steps yet")

    monkeypatch.setattr(analysis_pkg, "analyze", broken_analyze, raising=False)
    with traceml_nb.Run("no-verdict") as run:
        # every tick analyses (max_duty: however long a tick takes on a busy machine)
        view = LiveView(run, display=False, analysis_interval_s=0.0, max_duty=1.0)
        view.start()
        steps = train(1.5)
    view.stop()
    assert steps > 10 and view.error is None
    assert len(calls) == live.ANALYSIS_MAX_ERRORS  # then it stops asking
    notes = [n for n in run.capabilities.notes if n.startswith("running verdict unavailable")]
    assert notes == ["running verdict unavailable: ZeroDivisionError: no steady steps yet"]
    assert "traceml-verdict" not in view.charts.header.text


def test_live_view_is_bounded_at_any_step_rate(stream_calls):
    """A tiny ``max_points`` forces the rebinning path in a real run."""
    with traceml_nb.Run("bounded") as run:
        view = LiveView(run, display=False, max_points=16, settle_s=0)
        view.start()
        steps = train(1.0)
    view.stop()
    data = view.charts.steps.data
    assert len(data["step"]) <= 16 < steps
    assert view.step_series.k > 1
    assert "median per" in view.charts.step_fig.title.text
    assert set(data) == set(STEP_FIELDS) - {"step_ms", "compute_ms"}


def test_in_a_real_kernel_bokehjs_travels_inline_with_the_widget():
    """In a real kernel the cell's own output holds the inline BokehJS bundle (no CDN: in
    Colab each output is its own page) followed by the widget; its updates are comm messages.
    When the run is over the bundle's outputs are emptied, so the saved notebook stays small."""
    import copy

    import nbformat
    from nbclient import NotebookClient

    start = (
        "import time, torch, traceml_nb\n"
        "from traceml_nb.views.live.view import LiveView\n"
        "from torch.utils.data import DataLoader, TensorDataset\n"
        "loader = DataLoader(TensorDataset(torch.randn(4096, 8)), batch_size=8)\n"
        "run = traceml_nb.Run('kernel')\n"
        "run.start()\n"
        "view = LiveView(run)\n"
        "view.start()\n"
    )
    train = (
        "try:\n"
        "    deadline = time.monotonic() + 1.0\n"
        "    while time.monotonic() < deadline:\n"
        "        for (x,) in loader:\n"
        "            time.sleep(0.001)\n"
        "finally:\n"
        "    run.stop()\n"
        "view.stop()\n"
        "print('updates', view.updates, 'messages', view.messages, 'error', view.error)\n"
    )
    nb = nbformat.v4.new_notebook(
        cells=[nbformat.v4.new_code_cell(start), nbformat.v4.new_code_cell(train)]
    )
    while_running = {}

    def keep(cell, cell_index, **_):
        if cell_index == 0:
            while_running["outputs"] = copy.deepcopy(cell.outputs)

    NotebookClient(nb, timeout=120, kernel_name="python3", on_cell_executed=keep).execute()
    outputs = while_running["outputs"]
    kinds = [next(iter(o.get("data", {"stream": 0}))) for o in outputs]
    load = next(
        i
        for i, o in enumerate(outputs)
        if "application/vnd.bokehjs_load.v0+json" in o.get("data", {})
    )
    widget = next(
        i
        for i, o in enumerate(outputs)
        if "application/vnd.jupyter.widget-view+json" in o.get("data", {})
    )
    assert load < widget, kinds
    bundle = outputs[load]["data"]["application/vnd.bokehjs_load.v0+json"]
    assert len(bundle) > 500_000  # BokehJS itself, not a <script src=...> pointing elsewhere
    assert "<script src=" not in bundle
    saved = nb.cells[0].outputs  # after the run: the bundle's output is emptied in place
    assert saved[load]["data"] == {"text/plain": ""}
    assert len(nbformat.writes(nb)) < 200_000
    outputs = nb.cells[1].outputs
    printed = "".join(o.get("text", "") for o in outputs if o.get("output_type") == "stream")
    updates = int(printed.split("updates ")[1].split()[0])
    messages = int(printed.split("messages ")[1].split()[0])
    assert updates >= 2 and messages == 3 * updates and "error None" in printed


def test_the_tick_is_never_shorter_than_a_quarter_second():
    run = traceml_nb.Run("tick", sample=False)
    assert LiveView(run, display=False, tick_s=0.01).tick_s == 0.25
    assert LiveView(run, display=False, tick_s=2.0).tick_s == 2.0


def test_the_view_thread_turns_the_step_log_into_rows_not_the_training_loop(monkeypatch):
    """With a live view the training loop only logs its steps: the view's thread has them
    segmented before each update, so the loop never does (it would every few hundred events),
    and the rows are complete at the end. The exceptions, by design: the FLOP count's end
    asks whether an evaluation ran during it, which segments the log there, once a try (in
    the suite it seldom shows: once a test has compiled a model, no FLOPs are counted); and
    an iterator with workers beginning its epoch (``EPOCH_PROCESS_EVENTS``; none here)."""
    from traceml_nb.engine.instrument.flop_count import FLOP_COUNT_TRIES
    from traceml_nb.engine.instrument.tracer import PROCESS_EVENTS, StepTracer

    asked = StepTracer.evaluated_since
    at_the_count_end: list[int] = []  # what the loop processed there, ns, each time

    def evaluated_since(tracer: StepTracer, t_ns: int) -> bool:
        before = tracer.processing_ns
        answer = asked(tracer, t_ns)
        at_the_count_end.append(tracer.processing_ns - before)
        return answer

    monkeypatch.setattr(StepTracer, "evaluated_since", evaluated_since)
    with traceml_nb.Run("reader", sample=False) as run:
        view = LiveView(run, display=False, settle_s=0)
        view.start()
        steps = train(1.3)
        assert run.tracer.reader_processing_ns > 0
        loop_processing_ns = run.tracer.processing_ns
    view.stop()
    assert len(at_the_count_end) <= FLOP_COUNT_TRIES
    assert loop_processing_ns - sum(at_the_count_end) == 0
    assert list(run.record.steps.source).count(0) == steps  # the loader's steps, all there
    assert run.tracer.max_log == PROCESS_EVENTS  # the view has stopped: the loop's own trigger


def test_a_loop_faster_than_the_ticks_still_leaves_its_log_to_the_view():
    """Ticks paced to ``MAX_TICK_S`` (a view whose drawing is slow for its duty cap) and a loop
    whose log would pass ``READER_MAX_EVENTS`` in that time (the training loop would segment
    it itself): the view's thread turns it into rows every ``READ_EVERY_S`` between ticks,
    ~2,000 events each, so the loop never does."""
    from traceml_nb.engine.instrument.tracer import READER_MAX_EVENTS

    loader = DataLoader(range(10_000_000), batch_size=None)  # a fetch costs microseconds
    with traceml_nb.Run("fast reader", sample=False) as run:
        view = LiveView(run, display=False, settle_s=0, max_duty=1e-9)
        view.start()
        fetches, deadline = 0, time.monotonic() + 2 * MAX_TICK_S + 0.5
        started = time.monotonic()
        for _ in loader:  # READER_MAX_EVENTS in under a second, paced by sleeps
            fetches += 1
            if not fetches % 200:
                time.sleep(0.02)
            if time.monotonic() > deadline:
                break
        rate = fetches / (time.monotonic() - started)
        loop_processing_ns = run.tracer.processing_ns
        ticks = view.ticks
    view.stop()
    assert rate * MAX_TICK_S > READER_MAX_EVENTS  # without the reads, the loop would segment
    assert ticks <= 3, ticks  # ...between two ticks
    assert loop_processing_ns == 0
    assert view.reading_s > 0 and len(run.record.steps) == fetches


def test_a_tick_that_costs_more_puts_the_next_one_off_within_bounds():
    assert tick_wait_s(0.0, 0.5) == 0.5
    assert tick_wait_s(0.5 * VIEW_MAX_DUTY, 0.5) == 0.5  # within the duty: the usual rate
    assert tick_wait_s(0.8 * VIEW_MAX_DUTY, 0.5) == pytest.approx(0.8)  # past it: spaced out
    assert tick_wait_s(10.0, 0.5) == MAX_TICK_S  # the charts never stand still longer
    assert tick_wait_s(10.0, 5.0) == 5.0  # nor update more often than asked


def _spin(cpu_s: float) -> None:
    end = time.thread_time() + cpu_s
    while time.thread_time() < end:
        pass


def test_a_verdict_tick_counts_the_engines_work_as_reading_not_as_its_own(monkeypatch):
    """The verdict's tick copies the whole record; the rows are brought up to date first, and
    that time is the engine's (``reading_s``), not the view's own, which paces its ticks."""
    with traceml_nb.Run("verdict-reading", sample=False) as run:
        original_catch_up = run.catch_up

        def slow_catch_up():
            _spin(0.2)
            original_catch_up()

        run.catch_up = slow_catch_up
        view = LiveView(run, display=False, settle_s=0)
        view.start(background=False)
        train(0.3)
        assert view.tick(final=True)  # the last tick always has the verdict
    assert view.error is None, run.capabilities.notes
    assert view.reading_s >= 0.2
    assert view.busy_s - view.reading_s < 0.2


@pytest.mark.parametrize("slow", ["drawing", "reading"])
def test_the_view_spaces_its_ticks_by_its_own_work_not_by_the_engines(monkeypatch, slow):
    """20 ms of the view's own CPU a tick puts the next one off by MAX_TICK_S; the same time
    spent getting the step rows (the engine's work, paid with or without a view) does not.
    The running verdict is left out: its analysis is the view's own work too, and on a busy
    machine its first one alone put the second tick off by MAX_TICK_S (CI under load: one tick
    in 1.9 s)."""
    import traceml_nb.views.live.view as view_module

    original_header = LiveView._header
    monkeypatch.setattr(
        LiveView,
        "_header",
        lambda self, final=False: (
            (_spin(0.02) if slow == "drawing" else None) or original_header(self, final)
        ),
    )
    monkeypatch.setattr(LiveView, "_analysis_due", lambda self, final: False)
    own: list[float] = []  # the view's own CPU of each tick, as its pacing is told it

    def paced(own_s: float, tick_s: float, max_duty: float = VIEW_MAX_DUTY) -> float:
        own.append(own_s)
        return tick_wait_s(own_s, tick_s, max_duty)

    monkeypatch.setattr(view_module, "tick_wait_s", paced)
    with traceml_nb.Run("duty", sample=False) as run:
        original_snapshot = run.snapshot

        def slow_snapshot(*args, **kwargs):
            if slow == "reading" and kwargs.get("samples") is False:  # the rows, not the verdict's
                _spin(0.02)
            return original_snapshot(*args, **kwargs)

        run.snapshot = slow_snapshot
        original_catch_up = run.catch_up

        def slow_catch_up():  # the rows brought up to date before the verdict's copy
            if slow == "reading":
                _spin(0.02)
            original_catch_up()

        run.catch_up = slow_catch_up
        view = LiveView(run, display=False)
        started = time.monotonic()
        view.start()
        train(2.4)  # past a tick put off by MAX_TICK_S after the first
    view.stop()
    shown_s = time.monotonic() - started
    assert view.error is None, run.capabilities.notes
    writer_ticks = view.ticks - 1  # the final update is stop()'s
    assert len(own) == writer_ticks
    if slow == "drawing":  # the first tick after 0.25 s, then one every MAX_TICK_S
        assert 1 <= writer_ticks <= 1 + (shown_s - 0.25) / MAX_TICK_S
        assert min(own) >= 0.02
    else:  # 0.25 s, then every 0.5-1 s (4 ms of own work here), never MAX_TICK_S for the rows
        assert view.reading_s >= 0.02 * writer_ticks  # the rows copied, each tick
        assert max(own) < 0.02, own  # which the pacing is not told of
        assert writer_ticks >= 2, (writer_ticks, shown_s, own)
