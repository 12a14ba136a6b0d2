"""Where users already look: a finished run's figures, verdict and report, logged to W&B,
MLflow or TensorBoard (``--log-to wandb,mlflow,tensorboard[:DIR]``, ``TRACEML_NB_LOG_TO``).

The dispatcher: it parses the option, builds what every tracker gets (:mod:`.payload`) once,
and hands it to one module per tracker (:mod:`.to_wandb`, :mod:`.to_mlflow`,
:mod:`.to_tensorboard`), each imported only when asked, as is its tracker's package. It runs
at the run's end, after the report; a tracker that is missing, not logged in or unreachable,
or that fails, is one line saying why, and never fails the user's cell.

Attach, never hijack: a W&B run (``wandb.run``) or an MLflow run (``mlflow.active_run()``)
that is already active is logged into and left open; otherwise a run is started in the
user's own configuration and ended after.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from ...settings import LOG_TO_ENV, log_to_setting

#: tracker name -> (module of this package, the name people read, the extra that installs it)
TRACKERS: dict[str, tuple[str, str, str]] = {
    "wandb": ("to_wandb", "W&B", "wandb"),
    "mlflow": ("to_mlflow", "MLflow", "mlflow"),
    "tensorboard": ("to_tensorboard", "TensorBoard", "tensorboard"),
}
#: what turns the option off (``--log-to off`` overrides ``TRACEML_NB_LOG_TO``)
OFF = ("", "off", "none", "no", "false", "0")
#: at most this many characters of a tracker's error in the line that reports it
MAX_ERROR_CHARS = 300


@dataclass(frozen=True)
class Target:
    """One tracker to log to: ``kind`` (a key of :data:`TRACKERS`), ``path`` (TensorBoard's
    log directory, None: the default)."""

    kind: str
    path: str | None = None

    @property
    def label(self) -> str:
        return TRACKERS[self.kind][1]

    def __str__(self) -> str:
        return self.kind + (f":{self.path}" if self.path else "")


def parse_log_to(value: str | Iterable[str] | bool | None) -> list[Target]:
    """The trackers of a ``--log-to`` value: ``"wandb,mlflow"``, ``"tensorboard:runs/x"``, a
    list of such, ``True`` (all three), or ``None``/``False``/``"off"`` (none). ``ValueError``
    naming what is wrong otherwise; each tracker once, in the order given."""
    if value is None or value is False:
        return []
    if value is True:
        return [Target(kind) for kind in TRACKERS]
    items = value.split(",") if isinstance(value, str) else list(value)
    targets: list[Target] = []
    for raw in items:
        text = str(raw).strip()
        if text.lower() in OFF:
            continue
        kind, _, path = text.partition(":")  # a Windows path keeps its own ':'
        kind = kind.strip().lower()
        if kind not in TRACKERS:
            raise ValueError(
                f"unknown tracker {text!r}: use wandb, mlflow, tensorboard or tensorboard:DIR "
                "(several separated by commas), or off"
            )
        if path and kind != "tensorboard":
            raise ValueError(f"{text!r}: only tensorboard takes a directory (tensorboard:DIR)")
        if any(t.kind == kind for t in targets):
            raise ValueError(f"{kind} is named twice in {value!r}")
        targets.append(Target(kind, path.strip() or None))
    return targets


def resolve_log_to(*choices: Any) -> list[Target]:
    """The trackers of the first choice that is not None, else of ``TRACEML_NB_LOG_TO``."""
    for choice in choices:
        if choice is not None:
            return parse_log_to(choice)
    env = log_to_setting()
    try:
        return parse_log_to(env)
    except ValueError as exc:
        raise ValueError(f"{LOG_TO_ENV}={env!r}: {exc}") from None


def export(
    result: Any,
    targets: list[Target],
    *,
    log_steps: bool = False,
    render: Callable[[Any], str] | None = None,
    words: Callable[[Any], Any] | None = None,
) -> list[str]:
    """Log ``result`` to each of ``targets``; one line per tracker saying what was logged where,
    or why nothing was. ``render`` gives the HTML report (None: the report is left out, saying
    why); ``words`` the diagnosis in words (a
    :class:`~traceml_nb.session.result.DiagnosisText`; None: its findings' codes are logged);
    ``log_steps`` adds the per-step series. Never raises (but for KeyboardInterrupt)."""
    if not targets:
        return []
    from .payload import build_payload

    html, html_note = None, None
    if render is None:
        html_note = "no report renderer in this process (use traceml_nb.Session or the magic)"
    else:
        try:
            html = render(result)
        except Exception as exc:
            html_note = f"the HTML report could not be made ({type(exc).__name__}: {exc})"
    try:
        text = words(result.diagnosis) if words is not None else None
        payload = build_payload(
            result, log_steps=log_steps, html=html, html_note=html_note, words=text
        )
    except Exception as exc:  # our bug: still a line, never the user's cell
        return [f"traceml: not logged to {', '.join(map(str, targets))}: {error_text(exc)}"]
    return [f"traceml: {_export_one(payload, target)}" for target in targets]


def _export_one(payload: Any, target: Target) -> str:
    module_name, label, extra = TRACKERS[target.kind]
    try:
        module = importlib.import_module(f"{__name__}.{module_name}")
        return str(module.export(payload, target))
    except ImportError as exc:
        return (
            f"{label}: not logged, its client is not installed ({exc}); "
            f"pip install 'traceml_nb[{extra}]'"
        )
    except Exception as exc:  # a tracker's failure is a line, never the user's cell
        return f"{label}: not logged, it failed: {error_text(exc)}"


def error_text(exc: BaseException) -> str:
    """``Type: message``, on one line and at most :data:`MAX_ERROR_CHARS` characters."""
    text = " ".join(f"{type(exc).__name__}: {exc}".split())
    return text if len(text) <= MAX_ERROR_CHARS else text[: MAX_ERROR_CHARS - 1] + "\u2026"
