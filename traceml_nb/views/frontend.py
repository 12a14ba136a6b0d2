"""Which frontend the code runs under, and which live view suits it.

A kernel cannot ask the browser whether a widget rendered (while a cell runs, browser→kernel
messages wait until it ends), so the choice is made from what the kernel can see:

==============  ================================  ===========================================
frontend        how it is recognised              ``--view auto`` picks
==============  ================================  ===========================================
jupyter         an ipykernel shell (JupyterLab,   ``live``: the Bokeh widget. Under nbclient or
                Notebook 7, nbclient, Binder)     another headless client the widget output is
                                                  inert but harmless; the final report is
                                                  static anyway.
vscode          an ipykernel shell with           ``html``: VS Code loads a third-party
                ``VSCODE_PID`` or ``VSCODE_CWD``  widget's scripts from the network only when
                set (VS Code's kernels inherit    ``jupyter.widgetScriptSources`` allows it
                them; ``VSCODE_PID`` is missing   (jupyter_bokeh reported failing there,
                under WSL and in containers,      bokeh/jupyter_bokeh#209), and
                ``VSCODE_CWD`` is not)            ``push_notebook`` does not update there
                                                  (microsoft/vscode-jupyter#1714);
                                                  display-handle updates render.
pycharm         an ipykernel shell with           ``html``: PyCharm shows widgets only in
                ``PYCHARM_HOSTED`` set            its Professional edition and runs no
                                                  JavaScript in a notebook it does not trust
                                                  (one made outside the project); HTML
                                                  outputs and their updates need neither.
colab           ``google.colab`` is imported      ``html``: an HTML display updated in place.
                                                  jupyter_bokeh there has been seen rendering
                                                  empty and needs the custom widget manager;
                                                  display-handle updates always work.
kaggle          ``KAGGLE_KERNEL_RUN_TYPE`` set    ``html`` in the interactive editor (its
                                                  widget support depends on the image), nothing
                                                  live in a batch run ("Save & Run All").
terminal        ``TerminalInteractiveShell``      nothing live; the report is printed as text.
ipython         any other IPython shell           nothing live.
plain           no IPython at all                 nothing live.
==============  ================================  ===========================================

A Jupyter server started from a VS Code or PyCharm terminal passes those variables on to its
kernels, so JupyterLab opened from there gets the HTML view too: it works everywhere, and
``--view live`` still gives the widget.

``--view live`` forces the widget anywhere (in Colab the custom widget manager is enabled
first; in VS Code and PyCharm a note says what to do if it stays empty), ``html`` forces the
display-handle view, ``text`` prints the report as plain text at the end, ``none`` shows
nothing live (the final report is still displayed).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

VIEW_CHOICES = ("auto", "live", "html", "text", "none")

JUPYTER = "jupyter"
COLAB = "colab"
KAGGLE = "kaggle"
VSCODE = "vscode"
PYCHARM = "pycharm"
TERMINAL = "terminal"
IPYTHON = "ipython"
PLAIN = "plain"

#: Variables a kernel started by VS Code's Jupyter extension inherits from VS Code: either one
#: tells (holoviz/panel checks the same two; ``VSCODE_PID`` alone misses WSL and containers).
VSCODE_VARIABLES = ("VSCODE_PID", "VSCODE_CWD")
#: Set in the processes PyCharm runs, its notebook kernels among them.
PYCHARM_VARIABLE = "PYCHARM_HOSTED"


@dataclass(frozen=True)
class Frontend:
    """What we know about the frontend.

    ``widgets``: an ipywidget is expected to render live. ``rich``: HTML outputs render and
    can be updated in place. ``interactive``: someone may be watching while the cell runs.
    """

    kind: str
    widgets: bool
    rich: bool
    interactive: bool


def _class_names(obj: Any) -> set[str]:
    return {cls.__name__ for cls in type(obj).__mro__}


def detect_frontend(
    shell: Any = None,
    *,
    environ: Mapping[str, str] | None = None,
    modules: Mapping[str, Any] | None = None,
) -> Frontend:
    """Recognise the frontend from the running shell, the environment and the loaded modules."""
    environ = os.environ if environ is None else environ
    modules = sys.modules if modules is None else modules
    if shell is None:
        return Frontend(PLAIN, widgets=False, rich=False, interactive=False)
    names = _class_names(shell)
    if "TerminalInteractiveShell" in names:
        return Frontend(TERMINAL, widgets=False, rich=False, interactive=True)
    if "google.colab" in modules:
        return Frontend(COLAB, widgets=False, rich=True, interactive=True)
    run_type = environ.get("KAGGLE_KERNEL_RUN_TYPE")
    if run_type:
        interactive = run_type.strip().lower() == "interactive"
        return Frontend(KAGGLE, widgets=False, rich=True, interactive=interactive)
    if "ZMQInteractiveShell" in names or getattr(shell, "kernel", None) is not None:
        if any(environ.get(name) for name in VSCODE_VARIABLES):
            return Frontend(VSCODE, widgets=False, rich=True, interactive=True)
        if environ.get(PYCHARM_VARIABLE):
            return Frontend(PYCHARM, widgets=False, rich=True, interactive=True)
        return Frontend(JUPYTER, widgets=True, rich=True, interactive=True)
    return Frontend(IPYTHON, widgets=False, rich=False, interactive=True)


def choose_live_view(view: str, frontend: Frontend) -> str:
    """The live view to run: ``"live"`` (Bokeh widget), ``"html"`` (display handle), ``"none"``."""
    if view not in VIEW_CHOICES:
        raise ValueError(f"unknown view {view!r}: choose one of {', '.join(VIEW_CHOICES)}")
    if view in ("live", "html"):
        return view
    if view in ("text", "none"):
        return "none"
    if frontend.widgets:
        return "live"
    if frontend.rich and frontend.interactive:
        return "html"
    return "none"


#: The note of a Bokeh widget forced (``--view live``) where widgets may not render.
WIDGET_NOTES = {
    VSCODE: (
        'the live widget in VS Code needs its scripts: if the chart stays empty or reads "No '
        "version of module @bokeh/jupyter_bokeh is registered\", allow them with VS Code's "
        "jupyter.widgetScriptSources setting, or use --view html"
    ),
    PYCHARM: (
        "PyCharm shows the live widget only in its Professional edition and in a trusted "
        "notebook: if the chart stays empty, use --view html"
    ),
}


def prepare_widgets(frontend: Frontend, modules: Mapping[str, Any] | None = None) -> str | None:
    """Make third-party widgets renderable where that takes a call (Colab); a note on failure,
    or where the widget may stay empty (VS Code, PyCharm: :data:`WIDGET_NOTES`)."""
    if frontend.kind in WIDGET_NOTES:
        return WIDGET_NOTES[frontend.kind]
    if frontend.kind != COLAB:
        return None
    modules = sys.modules if modules is None else modules
    try:
        output: Any = modules.get("google.colab.output")
        if output is None:
            from google.colab import output  # type: ignore[import-not-found,no-redef]
        output.enable_custom_widget_manager()
    except Exception as exc:
        return f"could not enable Colab's custom widget manager: {type(exc).__name__}: {exc}"
    return None
