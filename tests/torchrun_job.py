"""A ``torchrun --nproc-per-node 2`` script (tests/test_ranks.py): each rank trains with DDP on
gloo inside a ``traceml_nb.Run`` and stores its run; rank 1's dataset sleeps longer."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from rank_fns import BASE_SLEEP_S, BATCH, BATCHES, EXTRA_SLEEP_S, SleepyDataset  # noqa: E402

import traceml_nb  # noqa: E402


def main(out_dir: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(8, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sleep = BASE_SLEEP_S + (EXTRA_SLEEP_S if rank == 1 else 0.0)
    loader = DataLoader(SleepyDataset(BATCHES * BATCH, sleep), batch_size=BATCH)
    count = 0
    with traceml_nb.Run("torchrun-job", sample=False) as run:
        for x, y in loader:
            loss = torch.nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            count += 1
    res = run.result()
    Path(out_dir, f"rank{rank}.json").write_text(
        json.dumps({"batches": count, "stored_id": res.stored_id, "note": res.store_note})
    )
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
