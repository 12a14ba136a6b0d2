"""Frontend detection, the live-view choice per frontend, and the display-handle fallback view."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from html.parser import HTMLParser

import pytest
from ipykernel.zmqshell import ZMQInteractiveShell
from IPython.core.interactiveshell import InteractiveShell
from IPython.terminal.interactiveshell import TerminalInteractiveShell
from torch.utils.data import DataLoader, TensorDataset

import traceml_nb
from traceml_nb.notebook.magic import start_live_view
from traceml_nb.views.frontend import (
    COLAB,
    IPYTHON,
    JUPYTER,
    KAGGLE,
    PLAIN,
    PYCHARM,
    TERMINAL,
    VSCODE,
    WIDGET_NOTES,
    Frontend,
    choose_live_view,
    detect_frontend,
    prepare_widgets,
)
from traceml_nb.views.live.data import RECENT_STEPS
from traceml_nb.views.live.handle import MIN_TICK_S, THREAD_NAME, HandleView, LiveStatus


def bare(cls):
    """An instance of a real shell class without starting it (detection reads only its type)."""
    return object.__new__(cls)


class FakeColabOutput:
    """Stands in for ``google.colab.output``, which only exists inside Colab."""

    def __init__(self, fail: bool = False) -> None:
        self.fail = fail
        self.calls = 0

    def enable_custom_widget_manager(self) -> None:
        self.calls += 1
        if self.fail:
            raise RuntimeError("not in a Colab frontend")


@pytest.mark.parametrize(
    ("shell", "environ", "modules", "expected"),
    [
        (None, {}, {}, Frontend(PLAIN, widgets=False, rich=False, interactive=False)),
        (bare(TerminalInteractiveShell), {}, {}, Frontend(TERMINAL, False, False, True)),
        (bare(ZMQInteractiveShell), {}, {}, Frontend(JUPYTER, True, True, True)),
        (
            bare(ZMQInteractiveShell),
            {},
            {"google.colab": object()},
            Frontend(COLAB, False, True, True),
        ),
        (
            bare(ZMQInteractiveShell),
            {"KAGGLE_KERNEL_RUN_TYPE": "Interactive"},
            {},
            Frontend(KAGGLE, False, True, True),
        ),
        (
            bare(ZMQInteractiveShell),
            {"KAGGLE_KERNEL_RUN_TYPE": "Batch"},
            {},
            Frontend(KAGGLE, False, True, False),
        ),
        (bare(InteractiveShell), {}, {}, Frontend(IPYTHON, False, False, True)),
        (
            bare(ZMQInteractiveShell),
            {"VSCODE_PID": "4242"},
            {},
            Frontend(VSCODE, False, True, True),
        ),
        # WSL and containers: no VSCODE_PID, but VSCODE_CWD
        (
            bare(ZMQInteractiveShell),
            {"VSCODE_CWD": "/home/u"},
            {},
            Frontend(VSCODE, False, True, True),
        ),
        (bare(ZMQInteractiveShell), {"VSCODE_PID": ""}, {}, Frontend(JUPYTER, True, True, True)),
        (
            bare(ZMQInteractiveShell),
            {"VSCODE_IPC_HOOK": "x"},
            {},
            Frontend(JUPYTER, True, True, True),
        ),
        (
            bare(ZMQInteractiveShell),
            {"PYCHARM_HOSTED": "1"},
            {},
            Frontend(PYCHARM, False, True, True),
        ),
        (
            bare(ZMQInteractiveShell),
            {"PYCHARM_HOSTED": ""},
            {},
            Frontend(JUPYTER, True, True, True),
        ),
        # a terminal or plain IPython in those editors stays what it is
        (
            bare(TerminalInteractiveShell),
            {"VSCODE_PID": "1"},
            {},
            Frontend(TERMINAL, False, False, True),
        ),
        (
            bare(InteractiveShell),
            {"PYCHARM_HOSTED": "1"},
            {},
            Frontend(IPYTHON, False, False, True),
        ),
        # Colab and Kaggle are told first (their own variables and modules)
        (
            bare(ZMQInteractiveShell),
            {"VSCODE_PID": "1"},
            {"google.colab": object()},
            Frontend(COLAB, False, True, True),
        ),
    ],
    ids=[
        "plain",
        "terminal",
        "jupyter",
        "colab",
        "kaggle",
        "kaggle-batch",
        "ipython",
        "vscode",
        "vscode-wsl",
        "vscode-empty",
        "vscode-other-variable",
        "pycharm",
        "pycharm-empty",
        "terminal-in-vscode",
        "ipython-in-pycharm",
        "colab-first",
    ],
)
def test_detect_frontend(shell, environ, modules, expected):
    assert detect_frontend(shell, environ=environ, modules=modules) == expected


@pytest.mark.parametrize(
    ("kind", "auto"),
    [
        (JUPYTER, "live"),
        (COLAB, "html"),
        (KAGGLE, "html"),
        (VSCODE, "html"),
        (PYCHARM, "html"),
        (TERMINAL, "none"),
        (PLAIN, "none"),
    ],
)
def test_auto_view_per_frontend(kind, auto):
    shells = {
        JUPYTER: bare(ZMQInteractiveShell),
        COLAB: bare(ZMQInteractiveShell),
        KAGGLE: bare(ZMQInteractiveShell),
        VSCODE: bare(ZMQInteractiveShell),
        PYCHARM: bare(ZMQInteractiveShell),
        TERMINAL: bare(TerminalInteractiveShell),
        PLAIN: None,
    }
    modules = {"google.colab": object()} if kind == COLAB else {}
    environ = {
        KAGGLE: {"KAGGLE_KERNEL_RUN_TYPE": "Interactive"},
        VSCODE: {"VSCODE_PID": "4242"},
        PYCHARM: {"PYCHARM_HOSTED": "1"},
    }.get(kind, {})
    frontend = detect_frontend(shells[kind], environ=environ, modules=modules)
    assert choose_live_view("auto", frontend) == auto
    # the explicit choices hold everywhere
    assert choose_live_view("live", frontend) == "live"
    assert choose_live_view("html", frontend) == "html"
    assert choose_live_view("text", frontend) == "none"
    assert choose_live_view("none", frontend) == "none"


def test_kaggle_batch_run_gets_no_live_view():
    frontend = detect_frontend(
        bare(ZMQInteractiveShell), environ={"KAGGLE_KERNEL_RUN_TYPE": "Batch"}, modules={}
    )
    assert choose_live_view("auto", frontend) == "none"


def test_unknown_view_is_rejected():
    with pytest.raises(ValueError, match="unknown view 'fancy'"):
        choose_live_view("fancy", Frontend(JUPYTER, True, True, True))


def test_colab_custom_widget_manager_is_enabled_and_failures_become_notes():
    colab = Frontend(COLAB, False, True, True)
    output = FakeColabOutput()
    assert prepare_widgets(colab, modules={"google.colab.output": output}) is None
    assert output.calls == 1
    broken = FakeColabOutput(fail=True)
    note = prepare_widgets(colab, modules={"google.colab.output": broken})
    assert note == (
        "could not enable Colab's custom widget manager: RuntimeError: not in a Colab frontend"
    )
    # elsewhere nothing is called; outside Colab the import would fail and is never tried
    assert prepare_widgets(Frontend(JUPYTER, True, True, True), modules={}) is None


def test_importing_the_package_does_not_import_ipython():
    code = (
        "import sys, traceml_nb, traceml_nb.views.report, traceml_nb.session.result\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('IPython', 'bokeh')))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, env=os.environ
    )
    assert out.stdout.strip() == "[]"


# --- the display-handle view --------------------------------------------------------------------
def loader(n: int = 32) -> DataLoader:
    import torch

    return DataLoader(TensorDataset(torch.zeros(n, 4)), batch_size=4)


def test_handle_view_reports_the_steps_and_stops_its_thread():
    run = traceml_nb.Run("handled", sample=False)
    view = HandleView(run, tick_s=0.1, display=False)
    assert view.tick_s == MIN_TICK_S  # never more than one update a second
    with run:
        view.start()
        assert any(t.name == THREAD_NAME for t in threading.enumerate())
        for _ in loader():
            pass
    view.stop()
    view.stop()  # twice is harmless
    status = view.status()
    assert status.state == "completed"
    assert status.steps == 8
    assert len(status.recent_wall_ms) == 8
    assert status.headline().startswith('traceml · "handled" · completed; the report follows · ')
    assert " · 8 steps · step " in status.headline()
    assert "<svg" in status._repr_html_()
    assert view.updates >= 1  # the final update


def test_handle_view_before_any_step():
    run = traceml_nb.Run("idle", sample=False)
    with run:
        status = HandleView(run, display=False).status()
    assert status.steps == 0 and status.step_ms is None and status.data_wait_share is None
    assert "<svg" not in status._repr_html_()
    assert status.headline().endswith(" · 0 steps")


def test_the_handle_s_step_time_is_the_median_of_the_recent_steps():
    status = LiveStatus("even", "running", 1.0, 4, recent_wall_ms=[10.0, 40.0, 20.0, 30.0])
    assert status.step_ms == 25.0  # the mean of the middle two, like the live view's
    assert LiveStatus("odd", "running", 1.0, 3, recent_wall_ms=[9.0, 1.0, 5.0]).step_ms == 5.0
    old = [1000.0] * 10
    recent = LiveStatus("tail", "running", 1.0, 60, recent_wall_ms=old + [2.0] * RECENT_STEPS)
    assert recent.step_ms == 2.0  # only the latest RECENT_STEPS
    # three workers that cannot keep up: a round is one long wait and two fast steps; as the
    # report's, the step time is over blocks of whole rounds (its pace), not a fast step
    rounds = [0.4, 0.4, 34.0] * 20
    assert LiveStatus("w", "running", 1.0, 60, recent_wall_ms=rounds).step_ms == 0.4
    bursty = LiveStatus("w", "running", 1.0, 60, recent_wall_ms=rounds, workers=3)
    assert bursty.step_ms == pytest.approx(34.8 / 3)


def test_live_view_falls_back_to_the_handle_view_when_bokeh_view_cannot_load(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "traceml_nb.views.live.view", None)  # import now fails
    run = traceml_nb.Run("fallback", sample=False)
    with run:
        view = start_live_view(run, "live", Frontend(JUPYTER, True, True, True))
        assert isinstance(view, HandleView)
    view.stop()
    assert any("showing the HTML view" in note for note in run.capabilities.notes)
    assert 'traceml · "fallback"' in capsys.readouterr().out  # displayed (as text: no frontend)


def test_a_view_that_fails_to_start_is_a_note_not_an_error(monkeypatch):
    def broken_start(self):
        raise RuntimeError("no display here")

    monkeypatch.setattr(HandleView, "start", broken_start)
    run = traceml_nb.Run("broken", sample=False)
    with run:
        assert start_live_view(run, "html", Frontend(COLAB, False, True, True)) is None
    assert "live view failed to start: RuntimeError: no display here" in run.capabilities.notes


def test_no_view_for_none_and_text():
    run = traceml_nb.Run("quiet", sample=False)
    with run:
        for option in ("none", "text"):
            assert start_live_view(run, option, Frontend(JUPYTER, True, True, True)) is None


def test_a_widget_forced_in_vscode_or_pycharm_comes_with_a_note(monkeypatch):
    """``--view live`` still gives the widget there, with one line saying what to do if it
    stays empty (VS Code: the ``jupyter.widgetScriptSources`` setting); nowhere else."""
    monkeypatch.setitem(
        sys.modules, "traceml_nb.views.live.view", None
    )  # no Bokeh view needed here
    for kind, words in ((VSCODE, "jupyter.widgetScriptSources"), (PYCHARM, "--view html")):
        run = traceml_nb.Run(kind, sample=False)
        with run:
            view = start_live_view(run, "live", Frontend(kind, False, True, True))
        view.stop()
        assert WIDGET_NOTES[kind] in run.capabilities.notes and words in WIDGET_NOTES[kind]
        assert "\n" not in WIDGET_NOTES[kind]
    for kind in (VSCODE, PYCHARM):  # the HTML view they get by default needs no note
        run = traceml_nb.Run(kind, sample=False)
        with run:
            view = start_live_view(run, "auto", Frontend(kind, False, True, True))
            assert isinstance(view, HandleView)
        view.stop()
        assert not run.capabilities.notes
    assert prepare_widgets(Frontend(JUPYTER, True, True, True), modules={}) is None


class _Markup(HTMLParser):
    """Collects the tags and attributes of an HTML fragment."""

    def __init__(self) -> None:
        super().__init__()
        self.tags: list[str] = []
        self.attrs: list[tuple[str, str]] = []

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        self.attrs += [(name, value or "") for name, value in attrs]


def test_the_html_view_needs_no_script_no_stylesheet_and_nothing_from_the_network():
    """What a sanitizing frontend (VS Code, PyCharm, a notebook viewer) keeps: no script, no
    style element, no event handler, no external resource; inline styles only."""
    status = LiveStatus(
        "sanitized",
        "running",
        12.5,
        400,
        recent_wall_ms=[10.0 + (i % 7) for i in range(200)],
        recent_wait_ms=[4.0] * 200,
        rank="rank 1 (slowest of 2)",
    )
    markup = status._repr_html_()
    parsed = _Markup()
    parsed.feed(markup)
    assert "svg" in parsed.tags and "div" in parsed.tags
    assert not {"script", "style", "link", "iframe", "img", "object", "embed"} & set(parsed.tags)
    for name, value in parsed.attrs:
        assert not name.startswith("on"), name
        assert name not in ("src", "href", "xlink:href"), (name, value)
        if name == "xmlns":  # a namespace name, never fetched
            assert value == "http://www.w3.org/2000/svg"
        else:
            assert "//" not in value and "url(" not in value, (name, value)
    assert "<!--" not in markup and "javascript:" not in markup.lower()


def test_colab_live_option_enables_the_widget_manager(monkeypatch):
    output = FakeColabOutput()
    monkeypatch.setitem(sys.modules, "google.colab.output", output)
    monkeypatch.setitem(sys.modules, "traceml_nb.views.live.view", None)
    run = traceml_nb.Run("colab", sample=False)
    with run:
        view = start_live_view(run, "live", Frontend(COLAB, False, True, True))
    view.stop()
    assert output.calls == 1
