"""Never harm the user's training, seen from the notebook: ``%%traceml`` in a real IPython shell.

Faults in the cell and in the monitor, overlapping runs, fuzzed arguments, many runs in one
session, and what the monitor must never do (open a port, write a file unasked).
"""

from __future__ import annotations

import gc
import os
import threading
import tracemalloc

import psutil
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from IPython.core.error import UsageError
from IPython.core.interactiveshell import InteractiveShell
from IPython.testing.globalipapp import start_ipython
from leakcheck import ORIGINAL_NEXT
from torch.utils.data.dataloader import _BaseDataLoaderIter

import traceml_nb
from traceml_nb.api import default_session


def session_history():
    return default_session().history


SETUP = """
import time
import torch
from torch.utils.data import DataLoader, Dataset, TensorDataset

class Flaky(Dataset):
    def __len__(self):
        return 64
    def __getitem__(self, i):
        if i == 37:
            raise IOError(f"truncated file at index {i}")
        return torch.randn(8), i % 2

dataset = TensorDataset(torch.randn(64, 8), torch.randint(0, 2, (64,)))
model = torch.nn.Linear(8, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.1)

def step(x, y):
    loss = torch.nn.functional.cross_entropy(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
"""


@pytest.fixture(scope="module")
def ip():
    shell = InteractiveShell.instance() if InteractiveShell.initialized() else start_ipython()
    shell.run_line_magic("load_ext", "traceml_nb")
    assert shell.run_cell(SETUP).success
    yield shell


@pytest.fixture(autouse=True)
def fresh_history():
    session_history().clear()
    yield
    session_history().clear()


def only_entry():
    (entry,) = session_history().entries
    return entry


def test_system_exit_propagates_with_a_partial_report(ip, capsys):
    result = ip.run_cell(
        "%%traceml --view none\nfor x, y in DataLoader(dataset, batch_size=8):\n"
        "    step(x, y)\nraise SystemExit(3)\n"
    )
    assert type(result.error_in_exec) is SystemExit and result.error_in_exec.code == 3
    entry = only_entry()
    assert entry.status == "failed" and entry.error == "SystemExit: 3"
    assert "Partial report" in capsys.readouterr().out


def test_an_exception_in_a_dataloader_worker(ip, capsys):
    result = ip.run_cell(
        "%%traceml --view none\n"
        "for x, y in DataLoader(Flaky(), batch_size=4, num_workers=2):\n"
        "    step(x, y)\n"
    )
    exc = result.error_in_exec
    assert isinstance(exc, OSError) and "truncated file at index 37" in str(exc)
    entry = only_entry()
    assert entry.status == "failed" and "truncated file" in entry.error
    out = capsys.readouterr().out
    assert "Partial report: the cell failed" in out


def test_a_half_consumed_loader_with_workers(ip):
    result = ip.run_cell(
        "%%traceml --view none -o res\n"
        "for i, (x, y) in enumerate(DataLoader(dataset, batch_size=4, num_workers=2)):\n"
        "    step(x, y)\n"
        "    if i == 9:\n"
        "        break\n"
    )
    assert result.success
    assert ip.user_ns["res"].status == "completed"
    # the loop made 10 steps: the last one, cut short by the break, ran its optimizer step
    assert only_entry().summary.total_steps == 10


def test_a_sampler_that_crashes_mid_run_is_reported_and_training_goes_on(ip, monkeypatch, capsys):
    import traceml_nb.engine.sampling as sampling
    from traceml_nb.engine.record import SampleTable

    class Crashing:
        name = "gpu:0"
        table = SampleTable(["util_gpu_pct"])
        calls = 0

        def read(self):
            Crashing.calls += 1
            if Crashing.calls > 2:
                raise RuntimeError("driver returned garbage")
            return {"util_gpu_pct": 50.0}

        def close(self):
            pass

    real_open = sampling.open_sources

    def with_crashing(record, capabilities, devices, **kw):
        return [*real_open(record, capabilities, devices, **kw), Crashing()]

    monkeypatch.setattr(sampling, "open_sources", with_crashing)
    result = ip.run_cell(
        "%%traceml --view none --interval 0.02 -o res\n"
        "for _ in range(3):\n"
        "    for x, y in DataLoader(dataset, batch_size=4):\n"
        "        step(x, y)\n"
        "        time.sleep(0.01)\n"
    )
    assert result.success
    res = ip.user_ns["res"]
    assert res.summary.total_steps == 48
    notes = res.capabilities.notes
    assert any("gpu:0 sampler failed" in n and "driver returned garbage" in n for n in notes)
    assert "driver returned garbage" in capsys.readouterr().out  # the report says what was lost


def test_a_run_started_from_another_thread_while_one_is_active(ip):
    errors = []
    inner_patch = []

    def other_thread():
        try:
            with traceml_nb.Run("from a thread", sample=False):
                pass
        except traceml_nb.RunAlreadyActiveError as exc:
            errors.append(str(exc))
        inner_patch.append(_BaseDataLoaderIter.__next__)

    ip.user_ns["other_thread"] = other_thread
    result = ip.run_cell(
        "%%traceml --view none\nimport threading\n"
        "t = threading.Thread(target=other_thread)\nt.start()\nt.join()\n"
    )
    assert result.success
    assert errors and "still measuring" in errors[0]
    # patched once: our wrapper directly over torch's own method
    assert inner_patch[0].__wrapped__ is ORIGINAL_NEXT
    assert len(session_history().entries) == 1


def test_nested_magic_is_refused_and_the_outer_run_goes_on(ip):
    result = ip.run_cell(
        "%%traceml --view none -o outer\n"
        "r = get_ipython().run_cell('%%traceml\\nx = 1\\n')\n"
        "inner_error = r.error_in_exec\n"
        "for x, y in DataLoader(dataset, batch_size=8):\n"
        "    step(x, y)\n"
    )
    assert result.success
    assert isinstance(ip.user_ns["inner_error"], UsageError)
    assert ip.user_ns["outer"].summary.total_steps == 8


OPTION_TOKENS = st.sampled_from(
    [
        "--name",
        "--interval",
        "--view",
        "--warmup",
        "-o",
        "--out",
        "--device",
        "--no-compare",
        "auto",
        "live",
        "html",
        "text",
        "none",
        "cpu",
        "cuda",
        "cuda:0",
        "0.1",
        "0.02",
        "1",
        "-1",
        "nan",
        "inf",
        "1e9",
        "res",
        "class",
        '"a b"',
        "'",
        "--",
        "-",
        "=",
        "--interval=0.5",
        "--name=x",
    ]
)
#: anything a user can type on the magic's line (no character that ends a line for IPython)
LINE_BREAKS = "\n\r\x00\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"
FREE_TEXT = st.text(
    alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters=LINE_BREAKS),
    max_size=12,
)


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(tokens=st.lists(st.one_of(OPTION_TOKENS, FREE_TEXT), max_size=6))
def test_fuzzed_arguments_give_a_usage_error_or_a_valid_run(ip, tokens):
    line = " ".join(tokens)
    ip.user_ns["fuzz_ran"] = []
    result = ip.run_cell(f"%%traceml {line}\nfuzz_ran.append(1)\n", silent=True)
    exc = result.error_in_exec or result.error_before_exec
    if exc is None:
        assert ip.user_ns["fuzz_ran"] == [1]
    else:
        assert isinstance(exc, UsageError), f"{line!r} raised {exc!r}"
        assert ip.user_ns["fuzz_ran"] == []


#: Runs of a cell the memory test makes, and the bytes a run may leave beyond what a plain cell
#: leaves IPython (256 KiB over 200 runs before; the same per run over fewer, faster runs).
LEAK_RUNS = 120
LEAK_BYTES_PER_RUN = 256 * 1024 // 200


def _forget_displayed_outputs(ip) -> None:
    """IPython keeps every displayed output in its own history (``HistoryOutput``), ours (the
    report, ~4 KB of text) like any other cell's: IPython's memory, not a leak of ours."""
    ip.history_manager.outputs.clear()


def _growth_over_runs(ip, cell: str) -> tuple[int, int]:
    """(bytes still allocated after ``LEAK_RUNS`` runs of ``cell``, after clearing our history
    too), IPython's record of displayed outputs let go of first."""

    def traced() -> int:
        _forget_displayed_outputs(ip)
        gc.collect()
        return tracemalloc.get_traced_memory()[0]

    _forget_displayed_outputs(ip)
    gc.collect()
    tracemalloc.start()  # one frame: ten made a traced run 5x slower
    try:
        base = traced()
        for _ in range(LEAK_RUNS):
            assert ip.run_cell(cell, silent=True).success
        with_history = traced()
        session_history().clear()
        without_history = traced()
    finally:
        tracemalloc.stop()
    return with_history - base, without_history - base


@pytest.mark.slow
def test_many_runs_in_one_session_do_not_grow(ip):
    """Beyond the bounded history, traced runs cost what as many plain cells cost IPython."""
    loop = "for x, y in DataLoader(dataset, batch_size=8):\n    step(x, y)\n"
    traced = "%%traceml --view none --interval 0.05\n" + loop
    for _ in range(10):
        assert ip.run_cell(traced, silent=True).success
    session_history().clear()
    threads = threading.active_count()
    plain, _ = _growth_over_runs(ip, loop)
    with_history, growth = _growth_over_runs(ip, traced)
    assert threading.active_count() == threads
    print(
        f"\n{LEAK_RUNS} runs: +{with_history / 1024:.0f} KiB with their history entries, "
        f"+{growth / 1024:.0f} KiB without; {LEAK_RUNS} plain cells: +{plain / 1024:.0f} KiB"
    )
    assert growth - plain < LEAK_RUNS * LEAK_BYTES_PER_RUN


def test_no_network_port_and_no_file_unless_asked(ip, tmp_path, monkeypatch):
    home = tmp_path / "home"
    work = tmp_path / "work"
    home.mkdir()
    work.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(work)
    me = psutil.Process()
    before = {c.laddr for c in me.net_connections(kind="inet")}
    result = ip.run_cell(
        "%%traceml --interval 0.02\n"
        "for _ in range(2):\n"
        "    for x, y in DataLoader(dataset, batch_size=4, num_workers=2):\n"
        "        step(x, y)\n",
        silent=True,
    )
    assert result.success
    after = {c.laddr for c in me.net_connections(kind="inet")}
    assert after <= before, f"new sockets: {after - before}"
    assert list(home.iterdir()) == [] and list(work.iterdir()) == []
    assert ip.run_cell(f"%traceml save {work / 'h.json'}").success
    assert [p.name for p in work.iterdir()] == ["h.json"]
    assert not [p for p in work.iterdir() if p.name.endswith(".tmp")]


def test_loading_never_executes_anything(ip, tmp_path):
    marker = tmp_path / "executed"
    evil = tmp_path / "evil.json"
    # a pickle that would create a file if it were ever unpickled
    import pickle

    class Boom:
        def __reduce__(self):
            return (open, (str(marker), "w"))

    evil.write_bytes(pickle.dumps(Boom()))
    result = ip.run_cell(f"%traceml load {evil}")
    assert isinstance(result.error_in_exec, UsageError)
    assert not marker.exists()
    assert os.path.getsize(evil) > 0
