"""A ``torchrun --nproc-per-node 2`` script (tests/integration/test_ranks.py): each rank trains with DDP on
gloo inside a ``traceml_nb.Run`` and stores its run; rank 1's dataset sleeps longer, and rank 1
asks for its result :data:`LATE_S` later than rank 0, which gathers the job's figures. Then a
second run whose result rank 1 never asks for: rank 0 reports it alone after
:data:`ALONE_TIMEOUT_S`."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from rank_fns import BASE_SLEEP_S, BATCH, BATCHES, EXTRA_SLEEP_S, SleepyDataset  # noqa: E402

import traceml_nb  # noqa: E402
from traceml_nb.session import job as job_module  # noqa: E402
from traceml_nb.views.report import Report  # noqa: E402

#: Seconds rank 1 asks for its result after rank 0: far inside the gather's timeout.
LATE_S = 0.5
#: The gather's timeout for the run rank 1 never asks the result of.
ALONE_TIMEOUT_S = 1.0


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
    if rank == 1:
        time.sleep(LATE_S)
    res = run.result()
    report = Report.of(res)
    data = res.to_dict()
    Path(out_dir, f"rank{rank}.json").write_text(
        json.dumps(
            {
                "batches": count,
                "stored_id": res.stored_id,
                "note": res.store_note,
                "text": str(report),
                "html": report._repr_html_(),
                "repr": repr(res),
                "ranks": data["ranks"],
                "job": data["job"],
                "notes": list(res.capabilities.notes),
            }
        )
    )
    job_module.GATHER_TIMEOUT_S = ALONE_TIMEOUT_S
    with traceml_nb.Session(store=False).run("torchrun-alone", sample=False) as alone:
        pass
    if rank == 0:
        started = time.perf_counter()
        res = alone.result()
        waited_s = time.perf_counter() - started
        Path(out_dir, "alone0.json").write_text(
            json.dumps(
                {"waited_s": waited_s, "job": res.to_dict()["job"], "text": str(Report.of(res))}
            )
        )
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
