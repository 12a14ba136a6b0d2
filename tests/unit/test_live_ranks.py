"""The ranks a run launches, on the live charts: a line per rank on the step-time chart (and a
dashed data-wait line, and a throughput line), added while the charts are shown, and the
header following the slowest rank. Two real gloo DDP ranks (``rank_fns``: rank 1's dataset
sleeps 20 ms more per batch, so it is the straggler by its data wait however busy the machine
is); every patch the widget sends is applied to a copy of the document by Bokeh itself."""

from __future__ import annotations

import json
import socket

import numpy as np
import pytest
import rank_fns
import torch.multiprocessing as mp

import traceml_nb
from traceml_nb.analysis.stragglers import RankFigures
from traceml_nb.engine.rank_record import RankRecord
from traceml_nb.engine.record import SOURCE_OPTIMIZER
from traceml_nb.views.live.bokeh_patch import BatchedBokehModel
from traceml_nb.views.live.charts import RANKS_CPU_LABEL, WORKERS_LABEL
from traceml_nb.views.live.data import RECENT_STEPS
from traceml_nb.views.live.handle import HandleView
from traceml_nb.views.live.rank_figures import recent_figures, slowest_parts
from traceml_nb.views.live.rank_lines import STEP_TITLE
from traceml_nb.views.live.view import LiveView

MS = 1_000_000


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# --- pure parts ---------------------------------------------------------------------------------
def figures(rank: int, step_ms: float | None, wait_ms: float, share: float) -> RankFigures:
    return RankFigures(
        rank,
        steps=10,
        step_ms_median=step_ms,
        data_wait_ms_median=wait_ms,
        data_wait_share=share,
    )


def test_the_header_follows_the_straggler_by_its_data_wait():
    # DDP: both ranks take the straggler's step time; rank 1 is the one that waits for data
    found = slowest_parts([figures(0, 25.0, 0.5, 0.02), figures(1, 25.0, 21.0, 0.84)])
    assert found is not None
    f, who, said = found
    assert f.rank == 1 and who == "rank 1 (slowest of 2)"
    assert said == "25 ms a step, data wait 84%: the straggler"


def test_without_a_straggler_the_header_follows_the_longest_step():
    # 10% longer steps: below the step-time factor, so no straggler, but still the slowest
    found = slowest_parts([figures(0, 10.0, 1.0, 0.1), figures(1, 11.0, 1.0, 0.09)])
    assert found is not None
    f, who, said = found
    assert f.rank == 1 and who == "rank 1 (slowest of 2)" and not said.endswith("straggler")
    assert slowest_parts([figures(0, None, 0.0, 0.0)]) is None
    assert slowest_parts([]) is None
    one = slowest_parts([figures(3, 5.0, 1.0, 0.2)])
    assert one is not None and one[1] == "rank 3"


def test_a_ranks_header_figures_are_its_latest_steps():
    rec = RankRecord(0)
    rec.record.optimizer_steps = 1  # no loader: the optimizer steps are the steps
    old = [(k * 100 * MS, 100 * MS, 90 * MS, 4, SOURCE_OPTIMIZER, 0) for k in range(30)]
    t0 = 30 * 100 * MS
    new = [(t0 + k * 10 * MS, 10 * MS, 1 * MS, 4, SOURCE_OPTIMIZER, 0) for k in range(RECENT_STEPS)]
    rec.record.steps.extend(old + new)
    f = recent_figures(rec, steps=len(old) + len(new))
    assert f.steps == 30 + RECENT_STEPS
    # the window holds only the latest steps: the 100 ms ones before it do not count
    assert f.step_ms_median == pytest.approx(10.0)
    assert f.data_wait_ms_median == pytest.approx(1.0)
    assert f.data_wait_share == pytest.approx(0.1)
    rec.record.steps.extend(old[:1])  # one slow step more moves the median by nothing
    assert recent_figures(rec, steps=0).step_ms_median == pytest.approx(10.0)
    empty = recent_figures(RankRecord(1), steps=0)
    assert empty.step_ms_median is None and empty.data_wait_share is None


# --- two real ranks under a live view -------------------------------------------------------------
@pytest.fixture
def patches(monkeypatch):
    """The content of every PATCH-DOC the widgets send, in order."""
    sent: list[dict] = []
    original = BatchedBokehModel.send

    def record(self, content, buffers=None):
        if isinstance(content, dict) and content.get("msg") == "patch":
            sent.append(content)
        return original(self, content, buffers)

    monkeypatch.setattr(BatchedBokehModel, "send", record)
    return sent


def test_each_rank_gets_its_lines_and_the_header_names_the_straggler(tmp_path, patches):
    from bokeh.core.json_encoder import serialize_json
    from bokeh.document import Document

    with traceml_nb.Run("ranks-live", interval=0.1) as run:
        view = LiveView(run, display=False, settle_s=0)
        view.start()
        handle = HandleView(run, display=False)  # the display-handle view (Colab, Kaggle)
        handle.start()
        # the document as the frontend gets it when the widget is shown
        bundle = json.loads(serialize_json(view.widget.render_bundle))
        (doc_json,) = bundle["docs_json"].values()
        doc = Document.from_json(doc_json)
        sent_before = len(patches)
        try:
            mp.start_processes(
                rank_fns.train_rank,
                args=(2, free_port(), str(tmp_path)),
                nprocs=2,
                start_method="fork",
            )
        except BaseException as exc:
            view.stop()
            handle.stop()
            if isinstance(exc, mp.ProcessExitedException):
                pytest.fail(rank_fns.hung_ranks(str(tmp_path)))
            raise
    view.stop()
    handle.stop()
    assert view.error is None, run.capabilities.notes
    assert [rec.status for rec in run.ranks] == ["completed", "completed"]

    lines = view.rank_lines
    assert lines is not None and sorted(lines.lines) == [(0, 0), (0, 1)]
    for line in lines.lines.values():
        source = line.source
        assert source is not None
        # every step of the rank, one point each (k is 1), on the run's clock
        assert line.series.steps == rank_fns.BATCHES
        assert len(source.data["step"]) == rank_fns.BATCHES
        assert source.data["step"].tolist() == [float(i) for i in range(1, rank_fns.BATCHES + 1)]
        t_s = np.asarray(source.data["t_s"])
        assert t_s[0] > 0 and t_s[-1] <= run.elapsed_s + 0.01
        assert np.all(np.diff(t_s) > 0)
    # rank 1 waits ~20 ms a step more for its data than rank 0
    wait_1 = np.median(lines.lines[(0, 1)].source.data["wait_ms"])
    wait_0 = np.median(lines.lines[(0, 0)].source.data["wait_ms"])
    assert wait_1 - wait_0 >= 0.8 * 1e3 * rank_fns.EXTRA_SLEEP_S

    charts = view.charts
    labels = [item.label.value for item in charts.step_fig.legend[0].items]
    assert labels == ["rank 0", "rank 1"]  # the launching process's own entries are gone
    assert [len(item.renderers) for item in charts.step_fig.legend[0].items] == [2, 2]
    assert [item.label.value for item in charts.rate_fig.legend[0].items] == labels
    assert charts.step_fig.title.text == STEP_TITLE
    # this process's children are the ranks, not DataLoader workers: their CPU is read
    cpu_labels = [item.label.value for item in charts.cpu_fig.legend[0].items]
    assert RANKS_CPU_LABEL in cpu_labels and WORKERS_LABEL not in cpu_labels
    assert run.record.host is not None
    ranks_cpu = [v for v in run.record.host.column("workers_cpu_pct") if v == v and v]
    assert ranks_cpu and max(run.record.host.column("workers")) == 2

    header = charts.header.text
    assert 'class="traceml-rank">rank 1 (slowest of 2)<' in header
    assert f">{rank_fns.BATCHES} steps<" in header
    assert ": the straggler<" in header and "completed" in header
    assert "collecting" not in header

    # the display-handle view follows the same rank
    status = handle.status()
    assert status.rank == "rank 1 (slowest of 2)" and status.steps == rank_fns.BATCHES
    headline = status.headline()
    assert f"rank 1 (slowest of 2) · {rank_fns.BATCHES} steps · " in headline
    assert headline.endswith(": the straggler") and handle.updates >= 1

    # the patches, applied in order by Bokeh to the document as the frontend got it at the
    # start, give the charts as the kernel holds them: the new lines and all their points
    for content in patches[sent_before + 2 :: 3]:  # header, metadata, content: the content
        doc.apply_json_patch(json.loads(content["payload"]))
    mirrored = {m.id: m for m in doc.models}
    for line in lines.lines.values():
        copy = mirrored[line.source.id]
        assert copy.data["step"] == pytest.approx(line.source.data["step"].tolist())
    step_copy = mirrored[charts.step_fig.id]
    assert len(step_copy.renderers) == len(charts.step_fig.renderers)
    assert mirrored[charts.header.id].text == header
