"""A training smoke test for CI: a few hundred steps of the real training loop, measured and
stored under one name; ``python -m traceml_nb check --name smoke`` then fails the job when the
steps got slower than the baseline (see README, "A regression gate in CI").

``SMOKE_EXTRA_MS`` adds that many milliseconds of work to each step (a stand-in for a slower
change, used by the test of this example).
"""

import os
import time

import torch
from torch.utils.data import DataLoader, TensorDataset

import traceml_nb

torch.manual_seed(0)
torch.set_num_threads(1)
dataset = TensorDataset(torch.randn(256, 16), torch.randint(0, 4, (256,)))
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
opt = torch.optim.SGD(model.parameters(), lr=0.05)
extra_s = float(os.environ.get("SMOKE_EXTRA_MS", "0")) / 1000

session = traceml_nb.Session()  # stores to TRACEML_NB_STORE (or --store's default path)
with session.run("smoke") as run:
    for x, y in DataLoader(dataset, batch_size=4):
        time.sleep(0.01 + extra_s)  # stands for the GPU's share of a real step
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
result = run.result()
print(f"stored as @{result.stored_id}: median step {result.summary.step_ms_median:.1f} ms")
if result.store_note:
    print(result.store_note)
