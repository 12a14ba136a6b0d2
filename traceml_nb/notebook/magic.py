"""``%%traceml`` (measure a cell) and ``%traceml`` (the session's runs): a thin shell holding
the kernel's :class:`~traceml_nb.session.Session`.

The cell runs as a plain cell would (:mod:`.cell`). The magic's own frames are hidden from
tracebacks; every exception, ``KeyboardInterrupt`` included, leaves the magic unchanged after
the run has been stopped, reported and recorded. Nothing here runs per training step.
"""

from __future__ import annotations

import sys
import threading
import traceback
from typing import TYPE_CHECKING, Any

from IPython.core.error import UsageError
from IPython.core.magic import Magics, cell_magic, line_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments

from ..api import Session, default_session
from ..engine.instrument.profiler import (
    DEFAULT_PROFILE_AFTER_STEPS,
    DEFAULT_PROFILE_DIR,
    DEFAULT_PROFILE_STEPS,
)
from ..engine.run import (
    MAX_INTERVAL_S,
    MIN_INTERVAL_S,
    Run,
    RunAlreadyActiveError,
)
from ..session.result import RunResult
from ..settings import PROFILE_DIR_ENV
from ..views.frontend import (
    VIEW_CHOICES,
    Frontend,
    choose_live_view,
    detect_frontend,
    prepare_widgets,
)
from .cell import cell_context, code_of_cell, compile_cell, default_name, execute
from .cell_options import (
    CellOptions,
    device_arg,
    identifier_arg,
    interval_arg,
    log_to_arg,
    name_arg,
    parse_options,
    profile_steps_arg,
    warmup_arg,
)

if TYPE_CHECKING:  # imported when a view starts (bokeh with the live one)
    from ..views.live.handle import HandleView
    from ..views.live.view import LiveView


# --- the magics --------------------------------------------------------------------------------
@magics_class
class TraceMLMagics(Magics):
    """The ``%%traceml`` cell magic and the ``%traceml`` line magic."""

    @property
    def user_ns(self) -> dict[str, Any]:
        assert self.shell is not None
        return self.shell.user_ns

    @property
    def session(self) -> Session:
        """The kernel's session: its runs, their history and comparisons."""
        return default_session()

    @magic_arguments(name="%traceml")
    @argument(
        "--name",
        metavar="LABEL",
        type=name_arg,
        default=None,
        help="label of the run in the report and the history "
        "(default: the cell's leading comment, else 'cell [n]')",
    )
    @argument(
        "--interval",
        metavar="SEC",
        type=interval_arg,
        default=0.1,
        help=f"sampler period in seconds, {MIN_INTERVAL_S} to {MAX_INTERVAL_S} "
        "(default 0.1 = 10 Hz)",
    )
    @argument(
        "--view",
        metavar="VIEW",
        choices=VIEW_CHOICES,
        default="auto",
        help="live view: auto (pick for this frontend), live (Bokeh widget), html (an HTML "
        "output updated once a second), text (no live view, the report as plain text), none "
        "(no live view; the final report is still shown). Default: auto",
    )
    @argument(
        "--warmup",
        metavar="N",
        type=warmup_arg,
        default="auto",
        help="leading steps excluded from the statistics as warm-up: a number, or auto "
        "(default: detected from the step times)",
    )
    @argument(
        "-o",
        "--out",
        metavar="VAR",
        type=identifier_arg,
        default=None,
        help="store the RunResult in the variable VAR of the user namespace",
    )
    @argument(
        "--device",
        metavar="DEVICE",
        type=device_arg,
        default="auto",
        help="device to watch: auto, cpu, cuda or cuda:N (default: auto = the current CUDA "
        "device when there is one)",
    )
    @argument(
        "--no-compare",
        action="store_true",
        help="do not compare with earlier runs of this cell",
    )
    @argument(
        "--store",
        metavar="PATH|URL",
        default=None,
        help="run store to write the run to, a SQLite file or postgresql://user@host:port/db "
        "(default: TRACEML_NB_STORE, else $XDG_DATA_HOME/traceml_nb/runs.sqlite)",
    )
    @argument(
        "--no-store",
        action="store_true",
        help="do not write this run to the run store",
    )
    @argument(
        "--tune",
        action="store_true",
        help="when the run is input-bound, measure DataLoader settings right after it and "
        "recommend one (as %%traceml tune does)",
    )
    @argument(
        "--log-to",
        metavar="TRACKERS",
        type=log_to_arg,
        default=None,
        help="log the run's figures, verdict and report to experiment trackers: wandb, mlflow, "
        "tensorboard or tensorboard:DIR, several separated by commas, or off (default: "
        "TRACEML_NB_LOG_TO). An active W&B or MLflow run is logged into; otherwise one is "
        "started in your own configuration",
    )
    @argument(
        "--log-steps",
        action="store_true",
        help="with --log-to: the per-step series too (step time, data wait, compute, GPU "
        "stall; at most 2000 points each, the step index as x)",
    )
    @argument(
        "--profile",
        metavar="N",
        type=profile_steps_arg,
        nargs="?",
        const=DEFAULT_PROFILE_STEPS,
        default=None,
        help=f"profile N steady steps with torch.profiler (default {DEFAULT_PROFILE_STEPS}), "
        f"after the warm-up (--warmup N, else {DEFAULT_PROFILE_AFTER_STEPS} steps): the top "
        "operators and the cell lines they come from, the calls that wait for the GPU, a "
        "Chrome trace of those steps; the profiled steps are left out of the statistics",
    )
    @argument(
        "--profile-dir",
        metavar="DIR",
        default=None,
        help=f"directory of the --profile trace files (default: {PROFILE_DIR_ENV}, else "
        f"./{DEFAULT_PROFILE_DIR})",
    )
    @cell_magic("traceml")  # type: ignore[arg-type]
    def traceml_cell(self, line: str, cell: str) -> None:
        """Measure the training in this cell: live charts while it runs, a diagnosis at the end.

        Put ``%%traceml`` on the first line of a cell that trains a PyTorch model; the code
        itself needs no change. Every DataLoader batch is a step (without a DataLoader:
        every ``optimizer.step()``; custom loops: call ``traceml_nb.step()``). While the cell
        runs a live chart shows step time, data wait and GPU/CPU use; when it ends, however
        it ends, a report says whether the run was input-bound, host-bound, compute-bound or
        throttled, with the evidence, the fix taken from your DataLoader settings, an upper
        bound of what the fix saves, and a comparison with the previous and the best run of
        the same cell and its baseline. The run is added to the session history (``%traceml
        history``) and written to the run store (``--store PATH``, ``--no-store``), where
        later sessions and ``python -m traceml_nb check`` find it.

        The cell behaves like a plain cell: variables it assigns stay defined, its last
        expression is shown as ``Out[n]``, an exception stops the notebook as usual (after
        the partial report). Metrics that cannot be measured here (no GPU, no NVML, ...) are
        shown as "unavailable" with the reason, never as 0. Top-level ``await`` is not
        supported in a ``%%traceml`` cell (put the loop in a function and call it).

        Examples::

            %%traceml
            for x, y in train_loader:
                loss = loss_fn(model(x.cuda()), y.cuda())
                loss.backward(); opt.step(); opt.zero_grad()

            %%traceml --name "4 workers, pinned" -o res
            train(model, loader, epochs=1)

            res.diagnosis.verdict, res.to_dataframe()   # in a later cell
            %traceml history                            # every run of the session
            %traceml compare 1 2                        # run 2 against run 1

            %%traceml --view none --warmup 20 --interval 0.05 --device cuda:1
            ...

            %%traceml --log-to wandb,mlflow,tensorboard:runs/exp1 --log-steps
            train(model, loader)       # figures, verdict and report into the trackers too

            %%traceml --tune          # input-bound? then measure DataLoader settings
            train(model, loader)      # (the same as %traceml tune after the run)

            %%traceml --profile 10    # torch.profiler over 10 steady steps: which
            train(model, loader)      # operators and lines take the time
        """
        __tracebackhide__ = True  # noqa: F841 (read by IPython's traceback formatter)
        options = parse_options(self.traceml_cell, line)
        if not cell.strip():
            raise UsageError("%%traceml: the cell is empty; put the training code under %%traceml")
        context = cell_context(self.shell)
        compiled = compile_cell(self.shell, cell, context)
        run = self.session.run(
            options.name or default_name(cell, context.number),
            options=options.run,
            source=cell,
            cell_id=context.cell_id,
            code_file=compiled.filename,
        )
        run.named = options.name is not None
        code = code_of_cell(self.shell, cell)
        if code is not None:
            run.definitions, run.values = code
        frontend = detect_frontend(self.shell)
        try:
            run.start()
        except RunAlreadyActiveError as exc:
            raise UsageError(f"%%traceml: {exc}") from None
        view = None
        try:
            view = start_live_view(run, options.view, frontend)
            execute(compiled, self.user_ns)
        except BaseException as exc:
            self._finish(run, view, options, exc)
            raise
        self._finish(run, view, options, None)

    def _finish(
        self,
        run: Run,
        view: LiveView | HandleView | None,
        options: CellOptions,
        exc: BaseException | None,
    ) -> None:
        """Stop the run and the view, then report and record the run, whatever happened."""
        __tracebackhide__ = True  # noqa: F841
        try:
            run.stop(exc)
        finally:
            if view is not None:
                try:
                    view.stop()
                except Exception as view_exc:
                    run.capabilities.note(
                        f"live view failed: {type(view_exc).__name__}: {view_exc}"
                    )
        try:
            from ..views.report import Report

            result = self.session.result(run, log_to=False)  # logged below, once it is shown
            report = Report.of(result)
        except Exception as report_exc:  # a broken report must not hide the cell's own outcome
            where = traceback.extract_tb(report_exc.__traceback__)[-1]
            print(
                f"traceml: the report could not be made ({type(report_exc).__name__}: "
                f"{report_exc}, at {where.filename}:{where.lineno}); the cell itself "
                f"{'completed' if exc is None else 'raised the error shown below'}",
                file=sys.stderr,
            )
            return
        if options.view == "text":
            print(report)
        else:
            from IPython.display import display

            display(report)
        if options.out:
            self.user_ns[options.out] = result
        lines = self.session.export(result, run=run, render=lambda _: report._repr_html_())
        for tracker_line in lines:
            print(tracker_line)
        if options.tune and exc is None:
            self._tune_after(result)

    def _tune_after(self, result: RunResult) -> None:
        """``--tune``: tune the run's DataLoader when the run was input-bound."""
        verdict = result.diagnosis.verdict
        if verdict != "input-bound":
            print(f"traceml: --tune: the run is {verdict}, not input-bound: nothing to tune")
            return
        from .line_commands import run_tuning

        print("traceml: --tune: the run is input-bound; measuring DataLoader settings")
        try:
            run_tuning(self.shell, self.session, result.run_id)
        except UsageError as tune_exc:
            print(f"traceml: --tune: {tune_exc}")
        except Exception as tune_exc:  # the cell itself succeeded: a failure here is a line
            print(f"traceml: --tune failed: {type(tune_exc).__name__}: {tune_exc}")

    @line_magic("traceml")  # type: ignore[arg-type]
    def traceml_line(self, line: str) -> None:
        """The runs measured in this session: history, compare A B, save, load, clear, tune.

        ::

          %traceml history          table of the runs (name, status, verdict, step time...)
          %traceml history --all    the stored runs of every session; --name NAME: of NAME
          %traceml compare A B      compare run A (before) with run B (after); @17: stored
          %traceml baseline NAME [set RUNS|clear]   show, pin or unpin a baseline
          %traceml save PATH        write the history to a JSON file
          %traceml load PATH        replace the history with the runs saved in PATH
          %traceml clear            forget every run of this session
          %traceml tune [RUN] [--budget SEC] [--workers LIST] [--prefetch LIST] [--batches N]
                        [--loader VAR] [-o VAR]
                                    measure DataLoader settings for the training loader of
                                    the last run (or RUN) and recommend one
          %traceml help             the commands
        """
        from .line_commands import dispatch

        dispatch(self.session, self.shell, line)


def start_live_view(run: Run, view_option: str, frontend: Frontend) -> LiveView | HandleView | None:
    """Start the live view the option and the frontend call for; ``None`` for no view.

    A view that fails to start is noted in the run's capabilities and the run goes on.
    """
    kind = choose_live_view(view_option, frontend)
    if kind == "none":
        return None
    view: LiveView | HandleView | None = None
    try:
        if kind == "live":
            note = prepare_widgets(frontend)
            if note:
                run.capabilities.note(note)
            try:
                from ..views.live.view import LiveView
            except ImportError as exc:
                run.capabilities.note(f"live Bokeh view unavailable ({exc}); showing the HTML view")
                kind = "html"
            else:
                view = LiveView(run)
        if kind == "html":
            from ..views.live.handle import HandleView

            view = HandleView(run)
        assert view is not None, kind  # "live" or "html" here
        view.start()
    except Exception as exc:
        run.capabilities.note(f"live view failed to start: {type(exc).__name__}: {exc}")
        if view is not None:
            try:
                view.stop()
            except Exception:
                pass
        return None
    return view


# --- extension hooks ----------------------------------------------------------------------------
WARMUP_THREAD = "traceml-warmup"


def _warm_up_imports() -> None:
    """Import the live view (bokeh, jupyter_bokeh) and the analysis (numpy) ahead of the
    first ``%%traceml`` cell, so its chart appears sooner; a failure here is left to the cell."""
    try:
        import traceml_nb.analysis  # noqa: F401
        import traceml_nb.views.live.view  # noqa: F401
    except Exception:
        pass


def register(ipython: Any) -> None:
    """Register the magics with ``ipython`` (``%load_ext traceml_nb``).

    A ``RunResult`` shown in a cell (``res`` after ``-o res``) is shown as its report. In a
    frontend that shows widgets, the live view's imports start at once on a short-lived
    background thread, while the user's next cells run.
    """
    ipython.register_magics(TraceMLMagics)
    html = ipython.display_formatter.formatters["text/html"]
    html.for_type_by_name("traceml_nb.session.result", "RunResult", _result_html)
    if choose_live_view("auto", detect_frontend(ipython)) == "live":
        threading.Thread(target=_warm_up_imports, name=WARMUP_THREAD, daemon=True).start()


def unregister(ipython: Any) -> None:
    """Remove the magics (``%unload_ext traceml_nb``)."""
    magics = ipython.magics_manager.magics
    for kind in ("line", "cell"):
        magics[kind].pop("traceml", None)
    ipython.magics_manager.registry.pop(TraceMLMagics.__name__, None)
    ipython.display_formatter.formatters["text/html"].pop(RunResult, None)


def _result_html(result: RunResult) -> str:
    """A :class:`~traceml_nb.session.result.RunResult` shown in a cell: its report."""
    from ..views.report import Report

    return Report.of(result)._repr_html_()
