"""``%%traceml`` and ``%traceml`` in a real IPython shell, on real torch DataLoader loops."""

from __future__ import annotations

import json
import re

import pytest
from IPython.core.error import UsageError
from ipython_shell import traceml_shell

from traceml_nb.api import default_session
from traceml_nb.notebook.cell import TOP_LEVEL_AWAIT
from traceml_nb.session.result import RunResult


def session_history():
    return default_session().history


SETUP = """
import torch
from torch.utils.data import DataLoader, TensorDataset
dataset = TensorDataset(torch.randn(96, 8), torch.randint(0, 2, (96,)))
model = torch.nn.Linear(8, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.1)

def train(loader, fail_at=None, interrupt_at=None):
    for i, (x, y) in enumerate(loader):
        if i == fail_at:
            raise ValueError(f"boom at step {i}")
        if i == interrupt_at:
            raise KeyboardInterrupt
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
"""

#: 24 training steps of batch 4
TRAIN = "train(DataLoader(dataset, batch_size=4))\n"


@pytest.fixture(scope="module")
def ip():
    with traceml_shell(SETUP) as shell:
        yield shell


@pytest.fixture(autouse=True)
def fresh_history():
    session_history().clear()
    yield
    session_history().clear()


def run(ip, source, **kwargs):
    return ip.run_cell(source, **kwargs)


def test_namespace_is_shared_both_ways(ip, capsys):
    ip.user_ns["seen_before"] = 41
    result = run(ip, "%%traceml --view none\nnew_var = seen_before + 1\n" + TRAIN)
    assert result.success, result.error_in_exec
    assert ip.user_ns["new_var"] == 42
    out = capsys.readouterr().out
    assert "traceml report:" in out
    assert "Verdict: " in out
    assert "the report failed" not in capsys.readouterr().err


def test_last_expression_is_displayed_like_a_plain_cell(ip, capsys):
    result = run(ip, "%%traceml --view none\n" + TRAIN + "shown = 21\nshown * 2\n")
    assert result.success
    assert result.result == 42
    assert ip.user_ns["_"] == 42
    out = capsys.readouterr().out
    assert "Out[" in out and "42" in out
    # the value is displayed before the report, as the cell's output
    assert out.index("42") < out.index("traceml report:")


def test_ast_node_interactivity_is_honoured(ip):
    saved = ip.ast_node_interactivity
    ip.ast_node_interactivity = "last_expr_or_assign"
    try:
        result = run(ip, "%%traceml --view none\nassigned = 6 * 7\n")
    finally:
        ip.ast_node_interactivity = saved
    assert result.result == 42


def test_trailing_semicolon_silences_the_last_expression(ip, capsys):
    result = run(ip, "%%traceml --view none\nsilenced = 7\nsilenced * 3;\n")
    assert result.success
    assert result.result is None
    assert "Out[" not in capsys.readouterr().out


def test_exception_propagates_unchanged_with_the_users_line(ip, capsys):
    source = (
        "%%traceml --view none\n"
        "loader = DataLoader(dataset, batch_size=4)\n"
        "train(loader, fail_at=3)\n"
    )
    result = run(ip, source)
    exc = result.error_in_exec
    assert type(exc) is ValueError
    assert str(exc) == "boom at step 3"
    out = capsys.readouterr().out
    traceback = out[out.index("Traceback") :]
    assert "----> 3 train(loader, fail_at=3)" in traceback  # the user's cell, its line number
    assert 'raise ValueError(f"boom at step {i}")' in traceback
    for internal in ("magic.py", "traceml_cell", "execute(", "compiled.statements"):
        assert internal not in traceback
    # the partial report came first, and the run is in the history as failed
    assert "Partial report: the cell failed (ValueError: boom at step 3)" in out
    assert out.index("Partial report") < out.index("Traceback")
    (entry,) = session_history().entries
    assert entry.status == "failed"
    assert entry.error == "ValueError: boom at step 3"


def test_keyboard_interrupt_propagates_and_the_run_is_recorded(ip, capsys):
    source = "%%traceml --view none\ntrain(DataLoader(dataset, batch_size=4), interrupt_at=5)\n"
    result = run(ip, source)
    assert type(result.error_in_exec) is KeyboardInterrupt
    (entry,) = session_history().entries
    assert entry.status == "interrupted"
    assert "Partial report: the cell was interrupted" in capsys.readouterr().out


def test_the_same_exception_object_reaches_the_shell(ip):
    result = run(ip, "%%traceml --view none\nerr = KeyError('mine')\nraise err\n")
    assert result.error_in_exec is ip.user_ns["err"]


BAD_LINES = [
    ("--interval 0", "interval must be between 0.02 and 1.0 s"),
    ("--interval abc", "interval must be a number of seconds"),
    ("--interval 2", "interval must be between"),
    ("--warmup -1", "must not be negative"),
    ("--warmup soon", "must be 'auto' or a number of steps"),
    ("-o 1bad", "'1bad' is not a valid Python variable name"),
    ("--out class", "'class' is not a valid Python variable name"),
    ("--view fancy", "invalid choice: 'fancy'"),
    ("--device tpu", "unknown device 'tpu'"),
    ("--bogus", "unrecognized arguments: --bogus"),
    ("extra words", "unrecognized arguments: extra words"),
    ('--name "unclosed', "No closing quotation"),
    ('--name ""', "the run's name must not be empty"),
    ("--name '   '", "the run's name must not be empty"),
    ("--device cuda:7", "device cuda:7 does not exist"),
]


@pytest.mark.parametrize(("line", "message"), BAD_LINES)
def test_bad_arguments_are_usage_errors_and_nothing_runs(ip, line, message):
    ip.user_ns["side_effects"] = []
    result = run(ip, f"%%traceml {line}\nside_effects.append('ran')\n")
    assert isinstance(result.error_in_exec, UsageError)
    text = str(result.error_in_exec)
    assert text.startswith("usage: %%traceml [--name LABEL] [--interval SEC]")
    assert message in text
    assert ip.user_ns["side_effects"] == []
    assert session_history().entries == []


def test_empty_cell_is_a_usage_error(ip):
    result = run(ip, "%%traceml\n\n")
    assert isinstance(result.error_in_exec, UsageError)
    assert session_history().entries == []


def test_syntax_error_points_at_the_cell_line_and_runs_nothing(ip, capsys):
    ip.user_ns["side_effects"] = []
    result = run(ip, "%%traceml\nside_effects.append(1)\nfor x in\n")
    assert isinstance(result.error_in_exec, SyntaxError)
    assert result.error_in_exec.lineno == 3
    assert ip.user_ns["side_effects"] == []
    assert session_history().entries == []


def test_a_top_level_await_says_how_to_measure_an_async_loop(ip):
    """IPython runs a plain cell that awaits as a coroutine; a cell magic cannot (``%%time``
    fails the same way): the error says what to do instead, and that works."""
    result = run(ip, "%%traceml\nimport asyncio\nawait asyncio.sleep(0)\n")
    assert isinstance(result.error_in_exec, SyntaxError)
    assert result.error_in_exec.lineno == 3
    assert result.error_in_exec.msg == f"'await' outside function: {TOP_LEVEL_AWAIT}"
    assert session_history().entries == []
    instead = (
        "import asyncio, traceml_nb\n"
        "x = torch.randn(4, 8)\n"
        'with traceml_nb.Run("async") as run:\n'
        "    for _ in range(12):\n"
        "        await asyncio.sleep(0)\n"
        "        model(x).sum().backward(); opt.step(); opt.zero_grad()\n"
    )
    assert ip.run_cell(instead).success
    assert ip.user_ns["run"].status == "completed"
    assert ip.user_ns["run"].record.optimizer_steps == 12


def test_out_stores_a_result_object(ip):
    result = run(ip, "%%traceml --view none -o res --name baseline --device cpu\n" + TRAIN)
    assert result.success
    res = ip.user_ns["res"]
    assert isinstance(res, RunResult)
    assert res.name == "baseline" and res.status == "completed" and res.error is None
    assert res.run_id == 1
    assert res.summary.step_source == "dataloader"
    assert res.summary.total_steps == 24
    assert res.diagnosis.verdict in (
        "input-bound",
        "host-bound",
        "compute-bound",
        "insufficient-data",
    )
    steps = res.steps
    assert len(steps) == 24
    assert set(steps.phase) <= {"warmup", "train", "train, FLOP-counted"}
    assert steps.phase.count("train, FLOP-counted") == res.summary.flop_counted_steps <= 1
    assert steps.phase[-1] == "train"
    assert steps.batch == [4] * 24
    assert steps.gpu_stall_ms == [None] * 24  # CPU-only: unavailable, never 0
    for wall, wait, compute in zip(
        steps.wall_ms, steps.data_wait_ms, steps.compute_ms, strict=True
    ):
        assert compute == pytest.approx(wall - wait)
    assert res.device == "cpu"
    host = res.samples["host"]
    assert len(host["t"]) >= 1  # the collector samples once at the start
    assert len(res.to_dataframe("host")) == len(host["t"])
    with pytest.raises(KeyError, match="no table 'gpu:0'"):
        res.to_dataframe("gpu:0")
    data = json.loads(res.to_json())
    assert data["name"] == "baseline" and data["summary"]["total_steps"] == 24
    assert data["capabilities"]["available"]["gpu_events"] is False
    frame = res.to_dataframe()
    assert list(frame.columns) == [
        "start_s",
        "wall_ms",
        "data_wait_ms",
        "compute_ms",
        "batch",
        "gpu_stall_ms",
        "phase",
    ]
    assert len(frame) == 24
    assert repr(res).startswith("<traceml_nb.RunResult #1 'baseline' completed: ")
    html = ip.display_formatter.formatters["text/html"]  # `res` in a notebook cell: the report
    assert "<svg" in html.lookup(res)(res)


def test_a_broken_report_never_changes_the_cells_outcome(ip, monkeypatch, capsys):
    from traceml_nb.session import Session

    def broken(*args, **kwargs):
        raise RuntimeError("renderer bug")

    monkeypatch.setattr(Session, "result", broken)
    ok = run(ip, "%%traceml --view none\nstill_ran = True\n" + TRAIN)
    assert ok.success and ip.user_ns["still_ran"] is True
    failed = run(ip, "%%traceml --view none\nraise LookupError('the users own')\n")
    assert type(failed.error_in_exec) is LookupError
    err = capsys.readouterr().err
    assert "traceml: the report could not be made (RuntimeError: renderer bug, at " in err
    assert "the cell itself completed" in err and "the cell itself raised the error" in err


def test_eval_loader_steps_are_their_own_phase(ip):
    source = (
        "%%traceml --view none -o with_eval\n"
        + TRAIN
        + "with torch.no_grad():\n"
        + "    for x, _ in DataLoader(dataset, batch_size=16):\n"
        + "        model(x)\n"
    )
    assert run(ip, source).success
    res = ip.user_ns["with_eval"]
    assert res.summary.total_steps == 24  # eval batches never count as training steps
    assert res.steps.phase.count("eval (loader 1)") == 6
    assert [p.name for p in res.summary.phases] == ["eval (loader 1)"]
    assert res.steps.start_s == sorted(res.steps.start_s)
    assert res.steps.phase[-6:] == ["eval (loader 1)"] * 6


def test_out_is_stored_for_a_failed_run_too(ip):
    result = run(
        ip,
        "%%traceml --view none -o failed_res\n"
        "train(DataLoader(dataset, batch_size=4), fail_at=6)\n",
    )
    assert type(result.error_in_exec) is ValueError
    assert ip.user_ns["failed_res"].status == "failed"


def test_default_names(ip):
    run(ip, "%%traceml --view none\n\n# ResNet-18, four workers\n" + TRAIN)
    run(ip, "%%traceml --view none\n" + TRAIN)
    first, second = session_history().entries
    assert first.name == "ResNet-18, four workers" and not first.named
    assert second.name.startswith("cell [") and second.name.endswith("]")


def test_reruns_of_a_cell_are_compared(ip, capsys):
    source = "%%traceml --view none -o again\n" + TRAIN
    run(ip, source, cell_id="cell-abc")
    capsys.readouterr()
    run(ip, source, cell_id="cell-abc")
    out = capsys.readouterr().out
    first, second = session_history().entries
    assert first.cell_id == second.cell_id == "cell-abc"
    assert "vs previous run #1 " in out and "step time " in out
    assert ip.user_ns["again"].comparison is not None
    assert ip.user_ns["again"].comparison.baseline_id == 1
    saved = json.loads(ip.user_ns["again"].to_json())["comparison"]
    assert saved["baseline_id"] == 1 and saved["candidate_id"] == 2
    assert saved["rows"][0]["label"] == "median step time"


def test_no_compare(ip, capsys):
    source = "%%traceml --view none --no-compare -o quiet\n" + TRAIN
    run(ip, source, cell_id="cell-nc")
    run(ip, source, cell_id="cell-nc")
    assert "vs previous run" not in capsys.readouterr().out
    assert ip.user_ns["quiet"].comparison is None
    assert len(session_history().entries) == 2


def test_view_text_prints_the_report(ip, capsys):
    result = run(ip, "%%traceml --view text\n" + TRAIN)
    assert result.success
    assert "traceml report: #1 " in capsys.readouterr().out


def test_view_html_runs_the_handle_view_and_stops_it(ip, capsys):
    result = run(ip, "%%traceml --view html --name handled\n" + TRAIN)
    assert result.success
    out = capsys.readouterr().out
    assert 'traceml · "handled"' in out  # the live status line
    assert "traceml report: #1 " in out
    # the conftest leak check verifies the view's thread is gone


def test_warmup_option_is_passed_to_the_analysis(ip):
    run(ip, "%%traceml --view none --warmup 7 -o warm\n" + TRAIN)
    assert ip.user_ns["warm"].summary.warmup_steps == 7
    assert ip.user_ns["warm"].steps.phase.count("warmup") == 7


def test_a_run_inside_another_run_is_a_usage_error(ip):
    source = (
        "import traceml_nb\n"
        "with traceml_nb.Run('outer', sample=False):\n"
        "    get_ipython().run_cell_magic('traceml', '--view none', 'inner_ran = True')\n"
    )
    result = run(ip, source)
    assert isinstance(result.error_in_exec, UsageError)
    assert "still measuring" in str(result.error_in_exec)
    assert "inner_ran" not in ip.user_ns


def test_help_lists_every_option_and_examples(ip, capsys):
    doc = ip.find_cell_magic("traceml").__doc__
    for option in (
        "--name",
        "--interval",
        "--view",
        "--warmup",
        "-o VAR",
        "--device",
        "--no-compare",
    ):
        assert option in doc
    assert "Examples" in doc and "%%traceml --name" in doc
    run(ip, "%%traceml?")
    assert "--no-compare" in capsys.readouterr().out


# --- %traceml -----------------------------------------------------------------------------------
def two_runs(ip):
    run(ip, "%%traceml --view none --name slow\ntrain(DataLoader(dataset, batch_size=2))\n")
    run(ip, "%%traceml --view none --name fast\n" + TRAIN)


def test_history_lists_the_runs(ip, capsys):
    two_runs(ip)
    capsys.readouterr()
    ip.run_line_magic("traceml", "history")
    out = capsys.readouterr().out
    assert "#1 slow" in out and "#2 fast" in out


def test_compare_two_runs(ip, capsys):
    two_runs(ip)
    capsys.readouterr()
    ip.run_line_magic("traceml", "compare 1 fast")
    out = capsys.readouterr().out
    # batch 2 against 4: judged per sample, the step time beside it
    assert out.startswith("#2 fast vs #1 slow: time per sample ")
    assert "the batch size went 2 \u2192 4, so the steps are compared per sample" in out
    assert "time per sample" in out and "median step time" in out


def test_save_clear_load(ip, tmp_path, capsys):
    two_runs(ip)
    path = tmp_path / "runs.json"
    ip.run_line_magic("traceml", f"save {path}")
    assert json.loads(path.read_text())["format"] == "traceml_nb.history"
    ip.run_line_magic("traceml", "clear")
    assert session_history().entries == []
    ip.run_line_magic("traceml", f"load {path}")
    assert [e.label for e in session_history().entries] == ["#1 slow", "#2 fast"]
    out = capsys.readouterr().out
    assert "saved 2 run(s)" in out and "cleared 2 run(s)" in out and "loaded 2 run(s)" in out


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("{not json", "is not valid JSON"),
        ('{"format": "someone-else", "runs": []}', "is not a traceml_nb history file"),
        ("[1, 2, 3]", "is not a traceml_nb history file"),
    ],
)
def test_load_rejects_bad_files_and_keeps_the_history(ip, tmp_path, content, message):
    two_runs(ip)
    path = tmp_path / "bad.json"
    path.write_text(content)
    with pytest.raises(UsageError, match=message) as info:
        ip.run_line_magic("traceml", f"load {path}")
    assert "the history is unchanged" in str(info.value)
    assert [e.label for e in session_history().entries] == ["#1 slow", "#2 fast"]


def test_load_of_a_missing_file(ip, tmp_path):
    with pytest.raises(UsageError, match="cannot read history file"):
        ip.run_line_magic("traceml", f"load {tmp_path / 'nope.json'}")


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("compare 1 99", "no run '99'"),
        ("compare 1", "expected 2 argument(s), got 1"),
        ("frobnicate", "unknown command 'frobnicate'"),
        ("save", "expected 1 argument(s), got 0"),
        ('compare "1', "No closing quotation"),
    ],
)
def test_line_magic_rejects_bad_input(ip, line, message):
    two_runs(ip)
    with pytest.raises(UsageError) as info:
        ip.run_line_magic("traceml", line)
    assert message in str(info.value)
    assert len(session_history().entries) == 2


def test_line_magic_help(ip, capsys):
    ip.run_line_magic("traceml", "help")
    out = capsys.readouterr().out
    for command in ("history", "compare A B", "save PATH", "load PATH", "clear"):
        assert f"%traceml {command}" in out
    ip.run_line_magic("traceml", "")
    assert "%traceml history" in capsys.readouterr().out


def test_unload_and_reload(ip):
    ip.run_line_magic("unload_ext", "traceml_nb")
    assert ip.find_cell_magic("traceml") is None and ip.find_line_magic("traceml") is None
    ip.run_line_magic("load_ext", "traceml_nb")
    assert ip.find_cell_magic("traceml") is not None


@pytest.mark.parametrize(
    "line",
    ['--name "4 workers, pinned"', "--name '4 workers, pinned'", "--name 4\\ workers,\\ pinned"],
)
def test_a_quoted_name_is_parsed_as_a_shell_would_in_both_magics(ip, capsys, line):
    run(ip, "%%traceml --view none --name slow\ntrain(DataLoader(dataset, batch_size=2))\n")
    assert run(ip, f"%%traceml --view none {line}\n" + TRAIN).success
    assert [e.name for e in session_history().entries] == ["slow", "4 workers, pinned"]
    capsys.readouterr()
    ip.run_line_magic("traceml", 'compare slow "4 workers, pinned"')
    assert capsys.readouterr().out.startswith("#2 4 workers, pinned vs #1 slow: time per sample ")


def test_compare_of_a_name_that_is_the_other_run_takes_the_latest_other_run_of_that_name(
    ip, capsys
):
    for _ in range(2):
        run(ip, "%%traceml --view none --name base\n" + TRAIN)
    run(ip, "%%traceml --view none --name solo\n" + TRAIN)
    capsys.readouterr()
    ip.run_line_magic("traceml", "compare base 2")  # 'base' is #2 itself: #1 is meant
    out = capsys.readouterr().out
    assert "the first run, 'base', would have been the other run itself" in out
    assert "latest other run of that name, #1 base" in out
    assert "#2 base vs #1 base: step time " in out
    ip.run_line_magic("traceml", "compare 1 base")  # the latest 'base' is #2: no question
    assert "#2 base vs #1 base" in capsys.readouterr().out
    with pytest.raises(UsageError, match="'solo' is run #3 solo itself, and no other run"):
        ip.run_line_magic("traceml", "compare solo 3")
    with pytest.raises(UsageError, match="are the same run, #1 base"):
        ip.run_line_magic("traceml", "compare 1 #1")


def test_one_count_of_steps_in_the_report_the_history_and_the_result(ip, capsys):
    """The report's header, the history table and the result say the same number of steps, and
    the steps an evaluation ran inside are said in words."""
    source = (
        "%%traceml --view text -o counted\n"
        "for i, (x, y) in enumerate(DataLoader(dataset, batch_size=4)):\n"
        "    loss = torch.nn.functional.cross_entropy(model(x), y)\n"
        "    opt.zero_grad(); loss.backward(); opt.step()\n"
        "    if i in (5, 15):\n"
        "        with torch.no_grad():\n"
        "            for ex, _ in DataLoader(dataset, batch_size=32):\n"
        "                model(ex)\n"
    )
    assert run(ip, source).success
    report = capsys.readouterr().out
    res = ip.user_ns["counted"]
    assert res.summary.total_steps == 24 and res.summary.interleaved_steps == 2
    assert "24 steps (" in report and "2 with an evaluation inside" in report
    assert "2 steps that contained an evaluation are left out of the statistics." in report
    from traceml_nb.views.history_table import history_cells, history_table

    [row] = history_table(session_history())
    assert history_cells(row)["steps"] == "24"  # what %traceml history shows


def test_a_function_edited_in_another_cell_is_what_changed(ip, capsys):
    """The cell's text stays ``train(...)``; ``train``, defined in the setup cell, is edited
    and run again: a new configuration, and what changed names it. Run again unedited, the
    same configuration."""
    edited = SETUP.replace("opt.step()\n", "opt.step()\n        loss.item()\n")
    cell = "%%traceml --view none --name edited\n" + TRAIN
    try:
        assert run(ip, cell).success
        assert run(ip, SETUP).success  # the setup cell run again as it was
        assert run(ip, cell).success
        assert run(ip, edited).success
        capsys.readouterr()
        assert run(ip, cell).success
        out = capsys.readouterr().out
    finally:
        assert run(ip, SETUP).success
    first, same, changed = session_history().entries
    assert first.environment["cell_definitions"] == same.environment["cell_definitions"]
    assert list(first.environment["cell_definitions"]) == ["train"]
    assert first.configuration.key == same.configuration.key != changed.configuration.key
    assert "vs previous run #2 edited" in out
    assert "what changed: the code changed, same settings" in out
    assert "notebook code: train changed (defined outside the cell)" in out


def test_a_value_set_in_another_cell_is_named_in_what_changed(ip, capsys):
    """A settings cell's ``LIMIT = 24`` read by the traced cell, then 25: the same
    configuration (a value is not a part of it), and what changed names the value."""
    cell = "%%traceml --view none --name valued\nassert LIMIT > 0\n" + TRAIN
    assert run(ip, "LIMIT = 24").success
    assert run(ip, cell).success
    assert run(ip, "LIMIT = 25").success
    capsys.readouterr()
    assert run(ip, cell).success
    out = capsys.readouterr().out
    first, second = session_history().entries
    assert first.environment["cell_values"] == {"LIMIT": "24"}
    assert first.configuration.key == second.configuration.key
    assert "what changed: same code, other values, same settings" in out
    assert "notebook values: LIMIT 24 \u2192 25" in out


def test_runs_given_the_same_values_are_the_baseline(ip, capsys):
    """``LIMIT`` 24 twice, then 25 (judged against the runs at 24, named), 25 again, then 24:
    judged against the two runs at 24, not a mix of both values (whose scatter would be taken
    for the machine's noise)."""
    cell = "%%traceml --view none --name given\nassert LIMIT > 0\n" + TRAIN
    outs = []
    for limit in (24, 24, 25, 25, 24):
        assert run(ip, f"LIMIT = {limit}").success
        capsys.readouterr()
        assert run(ip, cell).success
        outs.append(capsys.readouterr().out)
    assert re.search(r"2 runs of this configuration of 'given' \([#@]1\u2013[#@]2\), given other "
                     r"values \(LIMIT\)", outs[2]), outs[2]  # fmt: skip
    assert "notebook values: LIMIT 24 \u2192 25" in outs[2]
    assert "vs baseline" not in outs[3]  # its baseline is its previous run, #3
    assert re.search(r"2 runs of this configuration of 'given' \([#@]1\u2013[#@]2\), given the "
                     r"same values \(LIMIT\)", outs[4]), outs[4]  # fmt: skip


def test_a_run_id_the_cell_reads_is_named_apart_from_what_changed(ip, capsys):
    """A settings cell sets ``RUN_ID`` (a string) anew before every run: from the third run on,
    it differs in every run and is no change of the work; the previous run, which is also the
    baseline's latest, counts once."""
    cell = "%%traceml --view none --name tagged\nassert RUN_ID\n" + TRAIN
    outs = []
    for i in range(3):
        assert run(ip, f"RUN_ID = 'run-{i}'").success
        capsys.readouterr()
        assert run(ip, cell).success
        outs.append(capsys.readouterr().out)
    assert "notebook values: RUN_ID changed (a string, stored as a hash)" in outs[1]
    assert "what changed: same code (RUN_ID differs in every run), same settings" in outs[2]
    assert "notebook values: RUN_ID" not in outs[2], outs[2]
    # %traceml compare of the same two runs says what the report said
    assert run(ip, "%traceml compare 2 3").success
    compared = capsys.readouterr().out
    assert "same code (RUN_ID differs in every run), same settings" in compared, compared
