"""Training functions the rank tests launch (module level, so the spawn start method can
pickle them by reference): two ranks of DDP on gloo over a tiny model and a synthetic dataset
that sleeps per batch, rank 1 longer."""

from __future__ import annotations

import faulthandler
import json
import os
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, Dataset

#: Batches each rank trains on.
BATCHES = 24
BATCH = 4
#: Seconds each batch of every rank sleeps in the dataset, and what rank 1 sleeps more.
BASE_SLEEP_S = 0.002
EXTRA_SLEEP_S = 0.020
#: Seconds a rank may take before it writes every thread's stack to ``rank{k}.stack`` in its
#: output directory and exits: a hung rank fails its test with where it hung, not the suite's
#: timeout (a rank takes well under 10 s on a busy machine).
RANK_DEADLINE_S = 150.0
#: Seconds a rank may take from the end of its training to its exit (the rank's run stopped
#: and its rows sent, then the process's own exit: well under a second) before it writes every
#: thread's stack to ``rank{k}.exit.stack`` and exits: the launch that waits for it then
#: fails with where it hung. Three times, in runs of the whole suite under load, ranks
#: finished training and never exited; the third time this watchdog showed where: the rank's
#: run, stopping, dropped the DDP model its phases held, after ``destroy_process_group()``
#: (the model is now held weakly and freed as ``_train`` returns, as without a run).
EXIT_DEADLINE_S = 60.0
#: the file the exit watchdog writes to, kept open past ``train_rank``'s return
_exit_stacks: list = []


class SleepyDataset(Dataset):
    def __init__(self, n: int, sleep_s: float) -> None:
        self.x = torch.randn(n, 8)
        self.y = torch.randint(0, 2, (n,))
        self.sleep_s = sleep_s

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int):
        if i % BATCH == 0:
            time.sleep(self.sleep_s)
        return self.x[i], self.y[i]


def train_rank(rank: int, world: int, port: int, out_dir: str, fail_rank: int = -1) -> int:
    """One DDP rank: counts its batches into ``out_dir/rank{rank}.json``; ``fail_rank`` raises
    a ValueError at its 5th batch. Past :data:`RANK_DEADLINE_S` it dumps its stacks and exits."""
    with open(Path(out_dir, f"rank{rank}.stack"), "w") as stacks:
        faulthandler.dump_traceback_later(RANK_DEADLINE_S, exit=True, file=stacks)
        try:
            os.environ["MASTER_ADDR"] = "127.0.0.1"
            os.environ["MASTER_PORT"] = str(port)
            torch.set_num_threads(1)
            dist.init_process_group("gloo", rank=rank, world_size=world)
            try:
                return _train(rank, out_dir, fail_rank)
            finally:
                dist.destroy_process_group()
        finally:
            faulthandler.cancel_dump_traceback_later()
            _exit_stacks.append(open(Path(out_dir, f"rank{rank}.exit.stack"), "w"))  # noqa: SIM115
            faulthandler.dump_traceback_later(EXIT_DEADLINE_S, exit=True, file=_exit_stacks[-1])


def hung_ranks(out_dir: str) -> str:
    """The stacks of the ranks that passed their deadline (what to show when a launch failed)."""
    dumps = [p for p in sorted(Path(out_dir).glob("rank*.stack")) if p.stat().st_size]
    # (rank*.stack matches the exit watchdog's rank*.exit.stack too)
    return "\n".join(f"{p.name}:\n{p.read_text()}" for p in dumps) or "no rank passed its deadline"


def _train(rank: int, out_dir: str, fail_rank: int) -> int:
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(8, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sleep = BASE_SLEEP_S + (EXTRA_SLEEP_S if rank == 1 else 0.0)
    loader = DataLoader(SleepyDataset(BATCHES * BATCH, sleep), batch_size=BATCH)
    count = 0
    for i, (x, y) in enumerate(loader):
        if rank == fail_rank and i == 4:
            raise ValueError(f"rank {rank} fails at batch {i}")
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        count += 1
        Path(out_dir, f"rank{rank}.json").write_text(json.dumps({"batches": count}))
    return count


def accelerate_rank(out_dir: str) -> None:
    """A rank under ``accelerate.notebook_launcher`` (it sets up the process group)."""
    from accelerate import Accelerator

    torch.set_num_threads(1)
    acc = Accelerator(cpu=True)
    rank = acc.process_index
    model = torch.nn.Linear(8, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sleep = BASE_SLEEP_S + (EXTRA_SLEEP_S if rank == 1 else 0.0)
    loader = DataLoader(SleepyDataset(BATCHES * BATCH, sleep), batch_size=BATCH)
    model, opt = acc.prepare(model, opt)
    count = 0
    for x, y in loader:
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        acc.backward(loss)
        opt.step()
        count += 1
    Path(out_dir, f"rank{rank}.json").write_text(json.dumps({"batches": count}))
