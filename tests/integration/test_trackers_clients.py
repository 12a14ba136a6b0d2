"""``%%traceml --log-to ...`` in a real IPython shell, with the real tracker clients, read back
with each tracker's own API: W&B offline (its run files, decoded with W&B's record schema),
MLflow with local file and SQLite stores (``MlflowClient``), TensorBoard event files
(TensorBoard's ``EventAccumulator``). Nothing contacts a server: W&B runs offline and its
server URL, like every "unreachable" server here, is a closed port on 127.0.0.1."""

from __future__ import annotations

import os
import socket
import sys
import time

import pytest
from IPython.core.error import UsageError
from ipython_shell import traceml_shell
from wandb_records import offline_runs, read_offline_run

from traceml_nb.api import default_session
from traceml_nb.session.trackers.payload import slug

# before any client is imported: no usage data leaves this machine
os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
os.environ.setdefault("DO_NOT_TRACK", "1")

SETUP = """
import torch
from torch.utils.data import DataLoader, TensorDataset
dataset = TensorDataset(torch.randn(96, 8), torch.randint(0, 2, (96,)))
model = torch.nn.Linear(8, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.1)

def train(loader):
    for x, y in loader:
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
"""
#: 24 training steps of batch 4, then a variable the test reads: the cell ran to its end
TRAIN = "train(DataLoader(dataset, batch_size=4))\ncell_done = 42\n"


@pytest.fixture(scope="module")
def ip():
    with traceml_shell(SETUP) as shell:
        yield shell


@pytest.fixture(autouse=True)
def fresh(ip, monkeypatch):
    monkeypatch.delenv("TRACEML_NB_LOG_TO", raising=False)
    ip.user_ns.pop("cell_done", None)
    default_session().history.clear()
    yield
    default_session().history.clear()


def closed_port() -> int:
    """A port on 127.0.0.1 nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_cell(ip, line: str, capsys) -> tuple[object, list[str]]:
    """Run ``%%traceml LINE`` over TRAIN; the result object and the tracker lines printed."""
    result = ip.run_cell(f"%%traceml --view none -o res {line}\n{TRAIN}")
    assert result.success, result.error_in_exec
    assert ip.user_ns["cell_done"] == 42  # the cell is unaffected, whatever the trackers did
    out = capsys.readouterr().out
    lines = [ln for ln in out.splitlines() if ln.startswith("traceml: ")]
    res = ip.user_ns["res"]
    assert res.trackers == lines
    return res, lines


# --- W&B --------------------------------------------------------------------------------------
def wandb_children() -> list[str]:
    import psutil

    return [p.name() for p in psutil.Process().children(recursive=True) if "wandb" in p.name()]


@pytest.fixture
def wandb_env(tmp_path, monkeypatch):
    """W&B offline in this test's tmp directory; no W&B process is left at the end."""
    for key in [k for k in os.environ if k.startswith("WANDB_")]:
        monkeypatch.delenv(key)
    for key in ("WANDB_DIR", "WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR"):
        monkeypatch.setenv(key, str(tmp_path))
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_BASE_URL", f"http://127.0.0.1:{closed_port()}")  # never a server
    monkeypatch.setenv("NETRC", str(tmp_path / "no-netrc"))
    import wandb

    wandb.teardown()  # W&B reads its settings once per setup: a fresh one reads these
    yield tmp_path
    if wandb.run is not None:
        wandb.run.finish()
    wandb.teardown()
    deadline = time.monotonic() + 20
    while wandb_children() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert wandb_children() == []


def test_wandb_offline_cell_starts_a_run_with_the_figures_verdict_and_report(ip, capsys, wandb_env):
    import wandb

    res, lines = run_cell(ip, "--log-to wandb --log-steps", capsys)
    assert len(lines) == 1 and lines[0].startswith("traceml: logged to a new W&B run 'cell [")
    assert "offline" in lines[0] and "wandb sync" in lines[0]
    assert wandb.run is None  # the run it started is finished
    wandb.teardown()  # W&B's service writes the run's log behind finish(): wait for all of it
    (folder,) = offline_runs(wandb_env)
    run = read_offline_run(folder)
    s = run.summary
    assert s["traceml/step_ms_median"] == res.summary.step_ms_median
    assert s["traceml/data_wait_share"] == res.summary.data_wait_share
    assert s["traceml/samples_per_s"] == res.summary.samples_per_s
    assert s["traceml/total_steps"] == 24
    assert s["traceml/verdict"] == res.diagnosis.verdict
    assert s["traceml/confidence"] == res.diagnosis.confidence
    # a CPU run: the GPU figures are left out, never 0, and the text says why
    assert "traceml/gpu_util_median_pct" not in s and "traceml/gpu_mem_peak_mb" not in s
    assert "- traceml/gpu_util_median_pct: " in s["traceml/summary"]
    assert f"**Verdict: {res.diagnosis.verdict}**" in s["traceml/summary"]
    (page,) = (run.files / "media" / "html" / "traceml").glob("report_*.html")
    assert "traceml-report" in page.read_text()
    (table,) = (run.files / "media" / "table" / "traceml").glob("steps_*.table.json")
    import json

    data = json.loads(table.read_text())
    assert data["columns"][:3] == ["step", "step_ms", "data_wait_ms"]
    assert [row[0] for row in data["data"]] == list(range(24))
    assert [row[1] for row in data["data"]] == pytest.approx(res.steps.wall_ms)
    assert run.exit_code == 0


def test_wandb_attaches_to_the_active_run_and_leaves_it_and_its_steps_alone(ip, capsys, wandb_env):
    import wandb

    user_run = wandb.init(project="mine", name="my-training")
    user_run.log({"loss": 1.0}, step=5)
    res, lines = run_cell(ip, "--log-to wandb", capsys)
    assert lines[0].startswith("traceml: logged to the active W&B run 'my-training'")
    assert wandb.run is user_run  # still open: it is the user's
    user_run.log({"loss": 0.5}, step=6)  # the user's next step is not refused
    user_run.finish()
    wandb.teardown()
    (folder,) = offline_runs(wandb_env)
    run = read_offline_run(folder)
    assert run.summary["traceml/verdict"] == res.diagnosis.verdict
    steps = [(h.get("_step"), h.get("loss")) for h in run.history if "loss" in h]
    assert steps == [(5, 1.0), (6, 0.5)]
    (row,) = [h for h in run.history if h.get("_step") == 5]
    assert row["traceml/report/_type"] == "html-file"  # added to the user's step, no new one


def test_wandb_online_without_a_key_is_one_line_and_starts_nothing(ip, capsys, wandb_env):
    os.environ["WANDB_MODE"] = "online"  # restored by the fixture's monkeypatch
    _, lines = run_cell(ip, "--log-to wandb", capsys)
    assert lines == [
        "traceml: W&B: not logged, not logged in to W&B and no run is active: run `wandb "
        "login`, set WANDB_API_KEY, or WANDB_MODE=offline to keep the run on this machine"
    ]
    assert offline_runs(wandb_env) == [] and wandb_children() == []


def test_wandb_online_with_an_unreachable_server_is_one_line(ip, capsys, wandb_env):
    os.environ["WANDB_MODE"] = "online"
    os.environ["WANDB_API_KEY"] = "0" * 40
    _, lines = run_cell(ip, "--log-to wandb", capsys)
    (line,) = lines
    assert line.startswith(
        f"traceml: W&B: not logged, the W&B server {os.environ['WANDB_BASE_URL']}"
    )
    assert "cannot be reached (ConnectionRefusedError" in line
    assert wandb_children() == []


def test_a_tracker_that_is_not_installed_is_one_line(ip, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)  # `import wandb` raises ImportError
    _, lines = run_cell(ip, "--log-to wandb", capsys)
    (line,) = lines
    assert line.startswith("traceml: W&B: not logged, its client is not installed (")
    assert line.endswith("pip install 'traceml_nb[wandb]'")


# --- MLflow -----------------------------------------------------------------------------------
@pytest.fixture
def mlflow_uri(tmp_path, monkeypatch):
    """A local MLflow file store in this test's tmp directory (``sqlite:`` where the test
    asks); no run left active at the end."""
    import mlflow

    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3 keeps file stores opt-in
    monkeypatch.chdir(tmp_path)  # a SQLite store's artifacts go to ./mlruns
    before = mlflow.get_tracking_uri()

    def use(uri: str) -> str:
        mlflow.set_tracking_uri(uri)
        return uri

    use((tmp_path / "mlruns").as_uri())
    yield use
    while mlflow.active_run() is not None:
        mlflow.end_run()
    mlflow.set_tracking_uri(before)


def test_mlflow_cell_starts_a_run_read_back_through_mlflowclient(ip, capsys, mlflow_uri):
    import mlflow
    from mlflow import MlflowClient

    res, lines = run_cell(ip, "--log-to mlflow --log-steps", capsys)
    (line,) = lines
    assert line.startswith("traceml: logged to a new MLflow run 'cell [")
    assert mlflow.active_run() is None
    client = MlflowClient()
    (run,) = client.search_runs(["0"])
    assert run.info.status == "FINISHED"
    m, tags = run.data.metrics, run.data.tags
    assert m["traceml/step_ms_median"] == pytest.approx(res.summary.step_ms_median)
    assert m["traceml/data_wait_share"] == pytest.approx(res.summary.data_wait_share)
    assert m["traceml/steady_steps"] == res.summary.steady_steps
    assert "traceml/gpu_util_median_pct" not in m  # CPU run: left out, not 0
    assert tags["traceml/verdict"] == res.diagnosis.verdict
    assert tags["traceml/confidence"] == res.diagnosis.confidence
    history = client.get_metric_history(run.info.run_id, "traceml/steps/step_ms")
    assert [h.step for h in sorted(history, key=lambda h: h.step)] == list(range(24))
    folder = f"traceml/{slug(res.name)}"
    paths = {a.path for a in client.list_artifacts(run.info.run_id, folder)}
    assert paths == {f"{folder}/summary.txt", f"{folder}/report.html"}
    local = client.download_artifacts(run.info.run_id, f"{folder}/summary.txt")
    with open(local) as f:
        summary = f.read()
    assert f"**Verdict: {res.diagnosis.verdict}**" in summary
    assert "- traceml/gpu_util_median_pct: " in summary


def test_mlflow_attaches_to_the_active_run_in_a_sqlite_store(ip, capsys, mlflow_uri, tmp_path):
    pytest.importorskip("sqlalchemy")
    import mlflow
    from mlflow import MlflowClient

    uri = mlflow_uri(f"sqlite:///{tmp_path / 'mlflow.db'}")
    user_run = mlflow.start_run(run_name="my-training")
    mlflow.log_metric("loss", 1.0, step=3)
    res, lines = run_cell(ip, "--log-to mlflow", capsys)
    assert lines[0].startswith("traceml: logged to the active MLflow run 'my-training'")
    assert mlflow.active_run().info.run_id == user_run.info.run_id  # left open: the user's
    mlflow.end_run()
    run = MlflowClient(uri).get_run(user_run.info.run_id)
    assert run.data.metrics["loss"] == 1.0
    assert run.data.metrics["traceml/step_ms_median"] == pytest.approx(res.summary.step_ms_median)
    assert run.data.tags["traceml/verdict"] == res.diagnosis.verdict
    assert "traceml/advice" in run.data.tags or not res.diagnosis.advice
    folder = f"traceml/{slug(res.name)}"
    listed = MlflowClient(uri).list_artifacts(user_run.info.run_id, folder)
    assert {a.path for a in listed} == {f"{folder}/summary.txt", f"{folder}/report.html"}


def test_mlflow_with_an_unreachable_tracking_server_is_one_line(ip, capsys, mlflow_uri):
    uri = mlflow_uri(f"http://127.0.0.1:{closed_port()}")
    _, lines = run_cell(ip, "--log-to mlflow", capsys)
    (line,) = lines
    assert line.startswith(f"traceml: MLflow: not logged, the tracking server {uri} cannot be")


# --- TensorBoard ------------------------------------------------------------------------------
def read_events(folder):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(folder), size_guidance={"scalars": 0, "tensors": 0})
    events.Reload()
    return events


def test_tensorboard_cell_writes_events_read_back_with_tensorboard(ip, capsys, tmp_path):
    folder = tmp_path / "tb" / "my run"
    res, lines = run_cell(ip, f"--log-to 'tensorboard:{folder}' --log-steps", capsys)
    (line,) = lines
    assert line.startswith(f"traceml: logged to TensorBoard in {folder}")
    events = read_events(folder)
    (median,) = events.Scalars("traceml/step_ms_median")
    assert (median.step, median.value) == (24, pytest.approx(res.summary.step_ms_median))
    assert "traceml/gpu_util_median_pct" not in events.Tags()["scalars"]
    steps = events.Scalars("traceml/steps/step_ms")
    assert [e.step for e in steps] == list(range(24))
    assert [e.value for e in steps] == pytest.approx(res.steps.wall_ms, rel=1e-6)
    (text,) = events.Tensors("traceml/summary/text_summary")
    summary = text.tensor_proto.string_val[0].decode()
    assert f"**Verdict: {res.diagnosis.verdict}**" in summary
    assert "- traceml/gpu_util_median_pct: " in summary
    (page,) = folder.glob("traceml-report-*.html")
    assert "traceml-report" in page.read_text()


def test_the_default_comes_from_the_environment_and_off_overrides_it(
    ip, capsys, tmp_path, monkeypatch
):
    folder = tmp_path / "tb-env"
    monkeypatch.setenv("TRACEML_NB_LOG_TO", f"tensorboard:{folder}")
    _, lines = run_cell(ip, "", capsys)
    assert len(lines) == 1 and folder.is_dir()
    monkeypatch.setenv("TRACEML_NB_LOG_TO", f"tensorboard:{tmp_path / 'not-this'}")
    _, lines = run_cell(ip, "--log-to off", capsys)
    assert lines == [] and not (tmp_path / "not-this").exists()
    monkeypatch.setenv("TRACEML_NB_LOG_TO", "wandbb")
    _, lines = run_cell(ip, "", capsys)
    assert lines == [
        "traceml: not logged to any tracker: TRACEML_NB_LOG_TO='wandbb': unknown tracker "
        "'wandbb': use wandb, mlflow, tensorboard or tensorboard:DIR (several separated by "
        "commas), or off"
    ]


def test_a_misspelt_tracker_is_a_usage_error_before_the_cell_runs(ip):
    with pytest.raises(UsageError, match="unknown tracker 'tensorbord'"):
        ip.run_cell_magic("traceml", "--log-to tensorbord", "cell_done = 1\n")
    assert "cell_done" not in ip.user_ns


def test_run_and_session_log_without_the_magic(tmp_path, capsys):
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    import traceml_nb

    session = traceml_nb.Session(store=False, log_to=f"tensorboard:{tmp_path / 'session'}")
    data = DataLoader(TensorDataset(torch.randn(16, 4)), batch_size=4)
    with session.run("plain", device="cpu") as run:
        for _ in data:
            pass
    result = run.result()
    assert result.trackers[0].startswith(f"traceml: logged to TensorBoard in {tmp_path}")
    assert "the report as" in result.trackers[0]  # the package gave the session a renderer
    assert capsys.readouterr().out.splitlines()[-1] == result.trackers[0]
    assert read_events(tmp_path / "session").Scalars("traceml/total_steps")[0].value == 4
    # a run's own option comes before the session's
    with traceml_nb.Run("own", session=session, device="cpu", log_to="off") as run:
        for _ in data:
            pass
    assert run.result().trackers == []
