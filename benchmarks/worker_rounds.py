"""The step time of a loader whose workers cannot keep up, in fresh processes.

Each run: a tiny MLP over a dataset that sleeps ``--sample-ms`` a sample, batches of 16,
``--steps`` steps, under ``traceml_nb.Run`` (no store); it prints the run's pace by hand (its
loop's time over its steps), the report's step time (the median of block means,
:mod:`traceml_nb.analysis.step_blocks`) and the steps' own median. The table gives, for each
worker count, each statistic over the pace (median over the runs) and its scatter between the
identical runs (coefficient of variation): what a comparison of two such runs judges.

    .venv/bin/python benchmarks/worker_rounds.py --workers 0,2,3,4 --runs 5   # ~2 minutes
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

import numpy as np

CHILD = r"""
import json, sys, time, torch, numpy as np, traceml_nb
from torch.utils.data import DataLoader, Dataset
from traceml_nb.analysis import analyze
from traceml_nb.analysis.summary import measure
workers, steps, sample_ms = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
torch.manual_seed(0)
class Slow(Dataset):
    def __init__(self, n): self.x, self.y = torch.randn(n, 32), torch.randn(n, 1)
    def __len__(self): return len(self.x)
    def __getitem__(self, i): time.sleep(sample_ms / 1e3); return self.x[i], self.y[i]
model = torch.nn.Sequential(torch.nn.Linear(32, 256), torch.nn.ReLU(), torch.nn.Linear(256, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
loader = DataLoader(Slow(16 * steps), batch_size=16, num_workers=workers)
marks = []
with traceml_nb.Run("rounds", sample=False) as run:
    for x, y in loader:
        marks.append(time.perf_counter())
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad(); loss.backward(); opt.step()
    marks.append(time.perf_counter())
snap = run.record.snapshot()
s = analyze(snap, run.capabilities).summary
m = measure(snap, run.capabilities)
skip = s.total_steps - s.steady_steps  # (the warm-up and the FLOP-counted step, first)
pace = (marks[-1] - marks[skip]) / (len(marks) - 1 - skip) * 1e3
print(json.dumps({"pace": pace, "report": s.step_ms_median, "steps_median": float(np.median(m.wall_ms)),
                  "block": s.step_block}))
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", default="0,2,3,4")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--steps", type=int, default=128)
    ap.add_argument("--sample-ms", type=float, default=2.0)
    args = ap.parse_args()
    env = {**os.environ, "TRACEML_NB_STORE": "off"}
    print("workers  block  report/pace  steps' median/pace  CV report  CV steps' median  pace")
    for workers in (int(w) for w in args.workers.split(",")):
        rows = []
        for _ in range(args.runs):
            cmd = [sys.executable, "-c", CHILD, str(workers), str(args.steps), str(args.sample_ms)]
            out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
            rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
        pace = np.array([r["pace"] for r in rows])
        report = np.array([r["report"] for r in rows])
        own = np.array([r["steps_median"] for r in rows])
        print(
            f"{workers:7d}  {rows[0]['block']:5d}  {np.median(report / pace):11.2f}  "
            f"{np.median(own / pace):18.2f}  {report.std() / report.mean():8.1%}  "
            f"{own.std() / own.mean():16.1%}  {np.median(pace):.1f} ms"
        )


if __name__ == "__main__":
    main()
