"""W&B: the figures and the verdict into the run summary, the report as ``wandb.Html``, the
per-step series as a ``wandb.Table`` with a line chart (``--log-steps``).

An active run (``wandb.run``) is logged into and left open, and its step counter is left
alone: the report and the table are added to its current step (``commit=False``), so the
user's own ``wandb.log(..., step=N)`` goes on as before. Without one, a run is started in the
user's configured mode (``WANDB_MODE``, ``wandb offline``, the settings files) and finished
after; not when that mode is online and no API key is configured (``wandb.init`` would wait
for one at a prompt), nor when the server cannot be reached.
"""

from __future__ import annotations

import netrc
import os
from typing import Any

from . import Target, error_text
from .net import unreachable

LABEL = "W&B"
#: W&B's modes that send nothing anywhere
LOCAL_MODES = ("offline", "dryrun")


def export(payload: Any, target: Target) -> str:
    import wandb

    run = wandb.run
    started = False
    if run is None:
        why = cannot_start(wandb)
        if why:
            return f"{LABEL}: not logged, {why}"
        try:
            run = wandb.init(name=payload.name, job_type="traceml")
        except Exception as exc:
            return f"{LABEL}: not logged, the run could not start: {error_text(exc)}"
        started = True
    try:
        log_to_run(wandb, run, payload, commit=started)
        where = describe(run)
    finally:
        if started:
            run.finish(exit_code=0 if payload.status == "completed" else 1)
    how = "a new W&B run" if started else "the active W&B run"
    return f"logged to {how} {where}: {payload.what}"


def log_to_run(wandb: Any, run: Any, payload: Any, *, commit: bool) -> None:
    """Write ``payload`` into ``run``."""
    summary: dict[str, Any] = dict(payload.metrics)
    summary.update(payload.tags)
    summary["traceml/summary"] = payload.text
    run.summary.update(summary)
    media: dict[str, Any] = {}
    if payload.html is not None:
        media["traceml/report"] = wandb.Html(payload.html, inject=False)
    columns, rows = payload.step_rows()
    if rows:
        table = wandb.Table(columns=columns, data=rows)
        media["traceml/steps"] = table
        media["traceml/step_ms_chart"] = wandb.plot.line(
            table, "step", "step_ms", title=f"traceml: step time (ms), {payload.name}"
        )
    if media:
        run.log(media, commit=commit)


def describe(run: Any) -> str:
    """``'name' (offline, in DIR: `wandb sync DIR` uploads it)`` or ``'name' (URL)``."""
    name = getattr(run, "name", None) or getattr(run, "id", "?")
    mode = _mode(run)
    if mode in LOCAL_MODES:
        folder = os.path.dirname(str(getattr(run, "dir", "") or "").rstrip(os.sep))
        return f"{name!r} (offline, in {folder}: `wandb sync {folder}` uploads it)"
    if mode == "disabled":
        return f"{name!r} (W&B is disabled, WANDB_MODE=disabled: nothing is kept)"
    url = getattr(run, "url", None)
    return f"{name!r} ({url})" if url else repr(name)


def _mode(run: Any) -> str | None:
    settings = getattr(run, "settings", None)
    return getattr(settings, "mode", None)


def cannot_start(wandb: Any) -> str | None:
    """Why no run should be started here (None: start one). Reads W&B's resolved settings
    (environment, settings files); in online mode, needs an API key and a server that
    answers."""
    settings = wandb.setup().settings
    mode = str(getattr(settings, "mode", "online"))
    if mode in LOCAL_MODES:
        return None
    if mode == "disabled":
        return "W&B is disabled (WANDB_MODE=disabled)"
    base_url = str(getattr(settings, "base_url", "") or "")
    if not has_credentials(settings, base_url):
        wandb.teardown()  # nothing of W&B's stays running for a run that never started
        return (
            "not logged in to W&B and no run is active: run `wandb login`, set WANDB_API_KEY, "
            "or WANDB_MODE=offline to keep the run on this machine"
        )
    why = unreachable(base_url)
    if why:
        wandb.teardown()
        return f"the W&B server {base_url} {why} (WANDB_MODE=offline keeps the run on this machine)"
    return None


def has_credentials(settings: Any, base_url: str) -> bool:
    """An API key in the environment, the settings or the netrc file (``wandb login``)."""
    if os.environ.get("WANDB_API_KEY") or os.environ.get("WANDB_IDENTITY_TOKEN_FILE"):
        return True
    if getattr(settings, "api_key", None):
        return True
    try:  # W&B's own reader knows which netrc host stands for its server
        from wandb.sdk.lib.wbauth.wbnetrc import read_netrc_auth

        if read_netrc_auth(host=base_url):
            return True
    except Exception:
        pass
    try:
        path = os.environ.get("NETRC") or os.path.join(os.path.expanduser("~"), ".netrc")
        hosts = netrc.netrc(path).hosts
    except (OSError, netrc.NetrcParseError):
        return False
    from urllib.parse import urlsplit

    netloc = urlsplit(base_url).netloc
    return netloc in hosts or any("wandb" in host for host in hosts)
