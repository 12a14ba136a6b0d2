"""MLflow: the figures as metrics, the verdict, confidence and advice as tags
(``traceml/verdict``...), the text summary and the report as artifacts
(``traceml/<name>/summary.txt``, ``traceml/<name>/report.html``), the per-step series as
metric histories with the step index as the step (``--log-steps``).

An active run (``mlflow.active_run()``) is logged into and left open. Without one, a run is
started at the user's tracking URI and experiment (``MLFLOW_TRACKING_URI``,
``mlflow.set_tracking_uri``, ``mlflow.set_experiment``) and ended after, with the traced
run's status. Nothing is logged when the tracking server does not answer.
"""

from __future__ import annotations

import time
from typing import Any

from . import Target, error_text
from .net import unreachable

LABEL = "MLflow"
#: MLflow's limit of metrics per ``log_batch`` call
BATCH = 1000
#: tag values longer than this are cut (the full text is the summary artifact)
MAX_TAG_CHARS = 5000
#: the traced run's status -> the status of an MLflow run we started
END_STATUS = {"completed": "FINISHED", "failed": "FAILED", "interrupted": "KILLED"}


def export(payload: Any, target: Target) -> str:
    import mlflow

    active = mlflow.active_run()
    uri = mlflow.get_tracking_uri()
    why = unreachable(uri)  # else MLflow's client retries for minutes at the cell's end
    if why:
        return f"{LABEL}: not logged, the tracking server {uri} {why}"
    if active is not None:
        log_to_run(mlflow, active.info.run_id, payload)
        return f"logged to the active MLflow run {_describe(active, uri)}: {payload.what}"
    try:
        run = mlflow.start_run(run_name=payload.name, tags={"traceml/source": "traceml_nb"})
    except Exception as exc:
        return f"{LABEL}: not logged, a run could not start at {uri}: {error_text(exc)}"
    status = END_STATUS.get(payload.status, "FINISHED")
    try:
        log_to_run(mlflow, run.info.run_id, payload)
    except BaseException:
        status = "FAILED"
        raise
    finally:
        mlflow.end_run(status=status)
    return f"logged to a new MLflow run {_describe(run, uri)}: {payload.what}"


def _describe(run: Any, uri: str) -> str:
    name = getattr(run.info, "run_name", None) or run.info.run_id
    return f"{name!r} (id {run.info.run_id}, experiment {run.info.experiment_id}, at {uri})"


def _tag(value: str) -> str:
    return value if len(value) <= MAX_TAG_CHARS else value[: MAX_TAG_CHARS - 1] + "\u2026"


def log_to_run(mlflow: Any, run_id: str, payload: Any) -> None:
    """Write ``payload`` into the run ``run_id`` (through the client: the fluent run stack is
    the user's)."""
    from mlflow.entities import Metric, RunTag

    client = mlflow.MlflowClient()
    now = int(time.time() * 1000)
    metrics = [Metric(k, v, now, payload.step) for k, v in payload.metrics.items()]
    for name, points in (payload.steps or {}).items():
        metrics += [Metric(name, value, now, index) for index, value in points]
    tags = [RunTag(k, _tag(v)) for k, v in payload.tags.items()]
    for start in range(0, max(len(metrics), 1), BATCH):
        client.log_batch(run_id, metrics=metrics[start : start + BATCH], tags=tags)
        tags = []
    folder = f"traceml/{payload.slug}"
    client.log_text(run_id, payload.text, f"{folder}/summary.txt")
    if payload.html is not None:
        client.log_text(run_id, payload.html, f"{folder}/report.html")
