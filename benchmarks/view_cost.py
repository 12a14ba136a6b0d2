"""What the live view costs: kernel CPU time and messages to the frontend, in a real kernel.

A real IPython kernel (jupyter_client, this virtualenv's Python) runs a CPU training loop on a
real ``DataLoader`` for ``--seconds`` (default 60) under ``traceml_nb.Run`` with a displayed
``LiveView`` (exactly what ``%%traceml`` shows in JupyterLab; no frontend is attached, so
nothing renders, but the kernel does all its work and sends every message). Measured:

* **view CPU share**: CPU seconds of the view's writer thread (``LiveView.busy_s``: reading
  the record, binning, the running verdict, Bokeh serialisation, handing the messages to the
  kernel) divided by the run's wall time. The kernel's IOPub thread then writes the messages
  to the socket; that part is not in ``busy_s`` (it is a few microseconds a message).
* **messages per second**: the ``comm_msg`` messages the client received on IOPub while the
  cell ran (the widget's traffic), divided by the run's wall time; also their bytes.

Workloads: ``fast`` (an in-memory ``TensorDataset`` and a small MLP, hundreds to thousands of
steps a second: the worst case for the view) and ``input-bound`` (each sample takes 2 ms to
load, ~30 steps/s, like the browser test). On a machine with few cores the training competes
with the view for the CPU and inflates its cost; ``replay-20`` and ``replay-2000`` measure the
view alone: the record is written at 20 or 2,000 steps/s (and host samples at 10 Hz) by a main
thread that otherwise sleeps.

Usage::

    .venv/bin/python benchmarks/view_cost.py                 # both workloads, 60 s each
    .venv/bin/python benchmarks/view_cost.py --workload all  # and the view alone
    .venv/bin/python benchmarks/view_cost.py --seconds 10 --workload fast
    .venv/bin/python benchmarks/view_cost.py --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path
from queue import Empty
from typing import Any

REPO = Path(__file__).resolve().parent.parent

SETUP = r"""
import json, time
import torch
from torch.utils.data import DataLoader, Dataset, TensorDataset
import traceml_nb
from traceml_nb.views.live.view import LiveView

torch.manual_seed(0)


class SlowDecode(Dataset):
    def __len__(self):
        return 1_000_000

    def __getitem__(self, i):
        time.sleep(0.002)
        return torch.randn(64), i % 10


def make_loader(workload):
    if workload == "fast":
        data = TensorDataset(torch.randn(8192, 64), torch.randint(0, 10, (8192,)))
        return DataLoader(data, batch_size=32, shuffle=True)
    return DataLoader(SlowDecode(), batch_size=16)


def train_for(seconds, loader):
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    deadline = time.monotonic() + seconds
    steps = 0
    while True:
        for x, y in loader:
            loss = torch.nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            steps += 1
            if time.monotonic() > deadline:
                return steps
"""

RUN = r"""
loader = make_loader({workload!r})
with traceml_nb.Run("view-cost") as run:
    view = LiveView(run, tick_s={tick_s!r})
    view.start()
    steps = train_for({seconds!r}, loader)
view.stop()
print("VIEW-COST " + json.dumps(dict(
    steps=steps,
    elapsed_s=run.elapsed_s,
    busy_s=view.busy_s,
    analysis_busy_s=view.analysis_busy_s,
    ticks=view.ticks,
    updates=view.updates,
    messages=view.messages,
    k=view.step_series.k,
    points=view.step_series.points,
    error=view.error,
    notes=run.capabilities.notes,
)))
"""


# The view alone: no training competes for the CPU. The main thread writes a record the way
# the tracer and the host sampler do (a loader step row and an optimizer row per step, host
# samples at 10 Hz) at a fixed step rate and otherwise sleeps; the view runs as in a real run.
REPLAY = r"""
from traceml_nb.engine.record import SOURCE_OPTIMIZER, LoaderInfo, SampleTable

run = traceml_nb.Run("view-cost-replay", sample=False)
rec = run.record
rec.t0_ns = time.perf_counter_ns()
run.status = "running"
rec.host = SampleTable(["proc_cpu_pct", "workers_cpu_pct", "sys_cpu_pct", "ram_used_mb"])
rec.loaders.append(LoaderInfo(0, 0, False, None, False, 32, "TensorDataset", None, False))
view = LiveView(run, tick_s={tick_s!r})
view.start()
rate = {rate!r}
start = time.perf_counter_ns()
written = 0
next_sample = 0.0
while True:
    now = time.perf_counter_ns()
    elapsed = (now - start) / 1e9
    if elapsed >= {seconds!r}:
        break
    due = int(elapsed * rate)
    wall = int(1e9 / rate)
    while written < due:
        t = start - rec.t0_ns + written * wall
        rec.steps.append(t, wall, wall // 3, 32, 0, 8)
        rec.steps.append(t, wall, wall // 3, 32, SOURCE_OPTIMIZER, 0)
        rec.loaders[0].fetches += 1
        rec.loaders[0].leads += 1
        rec.loaders[0].optimizer_steps += 1
        rec.optimizer_steps += 1
        written += 1
    if elapsed >= next_sample:
        rec.host.append(elapsed, dict(proc_cpu_pct=95.0, workers_cpu_pct=0.0, sys_cpu_pct=50.0))
        next_sample += 0.1
    time.sleep(0.005)
rec.elapsed_ns = time.perf_counter_ns() - rec.t0_ns
run.status = "completed"
view.stop()
steps = written
""" + RUN.split("view.stop()", 1)[1]


def execute(kc: Any, code: str, timeout: float) -> dict[str, Any]:
    """Run ``code``; count the IOPub messages it caused by type, and the comm bytes."""
    msg_id = kc.execute(code)
    counts: dict[str, int] = {}
    comm_bytes = 0
    stdout: list[str] = []
    errors: list[str] = []
    deadline = time.monotonic() + timeout
    while True:
        try:
            msg = kc.get_iopub_msg(timeout=max(0.1, deadline - time.monotonic()))
        except Empty:
            raise TimeoutError("the cell did not finish in time") from None
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        kind = msg["msg_type"]
        counts[kind] = counts.get(kind, 0) + 1
        content = msg["content"]
        if kind == "comm_msg":
            comm_bytes += len(json.dumps(content)) + sum(len(b) for b in msg.get("buffers", []))
        elif kind == "stream":
            stdout.append(content.get("text", ""))
        elif kind == "error":
            errors.append("\n".join(content.get("traceback", [])))
        elif kind == "status" and content["execution_state"] == "idle":
            break
    if errors:
        raise RuntimeError(errors[0])
    return {"counts": counts, "comm_bytes": comm_bytes, "stdout": "".join(stdout)}


def measure(workload: str, seconds: float, tick_s: float) -> dict[str, Any]:
    from jupyter_client.manager import start_new_kernel

    env = dict(os.environ, PYTHONPATH=str(REPO))
    km, kc = start_new_kernel(kernel_name="python3", env=env, cwd=str(REPO))
    try:
        execute(kc, SETUP, 120)
        if workload.startswith("replay-"):
            rate = float(workload.split("-")[1])
            code = REPLAY.format(rate=rate, seconds=seconds, tick_s=tick_s)
        else:
            code = RUN.format(workload=workload, seconds=seconds, tick_s=tick_s)
        out = execute(kc, code, seconds + 120)
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)
    line = next(ln for ln in out["stdout"].splitlines() if ln.startswith("VIEW-COST "))
    kernel = json.loads(line[len("VIEW-COST ") :])
    elapsed = kernel["elapsed_s"]
    comm_msgs = out["counts"].get("comm_msg", 0)
    return {
        "workload": workload,
        "seconds": seconds,
        "tick_s": tick_s,
        "steps": kernel["steps"],
        "steps_per_s": kernel["steps"] / elapsed,
        "elapsed_s": elapsed,
        "view_busy_s": kernel["busy_s"],
        "view_cpu_share": kernel["busy_s"] / elapsed,
        "verdict_cpu_share": kernel["analysis_busy_s"] / elapsed,
        "view_ms_per_tick": 1e3 * kernel["busy_s"] / max(1, kernel["ticks"]),
        "ticks": kernel["ticks"],
        "updates": kernel["updates"],
        "view_messages": kernel["messages"],
        "comm_msgs_received": comm_msgs,
        "comm_msgs_per_s": comm_msgs / elapsed,
        "comm_kbytes_per_s": out["comm_bytes"] / elapsed / 1e3,
        "iopub_by_type": out["counts"],
        "points_in_chart": kernel["points"],
        "steps_per_point": kernel["k"],
        "view_error": kernel["error"],
        "notes": kernel["notes"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument(
        "--workload",
        choices=("fast", "input-bound", "replay-20", "replay-2000", "both", "all"),
        default="both",
        help="both: fast and input-bound; all: also the view alone (replay-20, replay-2000 steps/s)",
    )
    parser.add_argument(
        "--tick-s",
        type=float,
        default=0.5,
        help="seconds between updates (default 0.5, the view's default; at least 0.25)",
    )
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args()
    workloads = {
        "both": ("fast", "input-bound"),
        "all": ("fast", "input-bound", "replay-20", "replay-2000"),
    }.get(args.workload, (args.workload,))
    results = [measure(w, args.seconds, args.tick_s) for w in workloads]
    print(f"python {platform.python_version()}, {os.cpu_count()} CPUs, {platform.platform()}")
    header = f"{'workload':<12} {'steps/s':>8} {'view CPU':>9} {'verdict':>8} {'ms/tick':>8} {'ticks':>6} {'comm msg/s':>11} {'kB/s':>7} {'points':>7} {'k':>4}"
    print(header)
    for r in results:
        print(
            f"{r['workload']:<12} {r['steps_per_s']:>8.1f} {100 * r['view_cpu_share']:>8.2f}% "
            f"{100 * r['verdict_cpu_share']:>7.2f}% "
            f"{r['view_ms_per_tick']:>8.2f} {r['ticks']:>6} {r['comm_msgs_per_s']:>11.2f} "
            f"{r['comm_kbytes_per_s']:>7.1f} {r['points_in_chart']:>7} {r['steps_per_point']:>4}"
        )
        if r["view_error"] or r["notes"]:
            print("   notes:", r["view_error"], r["notes"])
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    sys.exit(0 if all(r["view_error"] is None for r in results) else 1)


if __name__ == "__main__":
    main()
