"""The job of the CI gates' power study (``gate_power.py``): a real ~10 ms CPU training step.

A small conv net on 3×32×32 inputs, batch 32, one intra-op thread, ``GATE_STEPS`` steps (default
150) of a real ``DataLoader`` under ``traceml_nb.Session().run(GATE_NAME)`` (default "smoke"),
stored into ``$TRACEML_NB_STORE``. ``GATE_WIDTH`` is the first conv layer's channels (the
study calibrates it so a step takes ~10 ms on the machine); ``GATE_EXTRA`` adds that many
64×64 matmuls to each step: the stand-in for a slower change, added compute, never a sleep.
Every job of the study runs this same file, so every run is of one configuration (the
script's source is its code); the slowdown comes from the environment only.

``python benchmarks/gate_job.py`` runs one job; ``--widths TARGET_MS`` instead times the loop
(without traceml_nb) at a few widths and prints, as JSON, the median step time of each (up to
one past the target) and the cost of one added matmul alone: ``gate_power.py``'s calibration.
"""

from __future__ import annotations

import json
import math
import os
import statistics
import sys
import time

import torch
from torch.utils.data import DataLoader, TensorDataset

BATCH = 32
#: Widths (the first conv layer's channels) ``--widths`` tries, smallest first.
WIDTHS = (2, 4, 6, 8, 10, 12, 16, 20, 24, 32)
#: The side of the square matrices of the added compute.
EXTRA_N = 64


def model(width: int) -> torch.nn.Module:
    return torch.nn.Sequential(
        torch.nn.Conv2d(3, width, 3, padding=1),
        torch.nn.ReLU(),
        torch.nn.MaxPool2d(2),
        torch.nn.Conv2d(width, 2 * width, 3, padding=1),
        torch.nn.ReLU(),
        torch.nn.MaxPool2d(2),
        torch.nn.Flatten(),
        torch.nn.Linear(2 * width * 8 * 8, 10),
    )


def loader(steps: int) -> DataLoader:
    g = torch.Generator().manual_seed(0)
    data = TensorDataset(
        torch.randn(steps * BATCH, 3, 32, 32, generator=g),
        torch.randint(0, 10, (steps * BATCH,), generator=g),
    )
    return DataLoader(data, batch_size=BATCH)


def extra_operands() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return torch.randn(EXTRA_N, EXTRA_N, generator=g), torch.randn(EXTRA_N, EXTRA_N, generator=g)


def add_work(extra: int, a: torch.Tensor, b: torch.Tensor) -> None:
    """``extra`` matmuls of two 64×64 matrices: the added compute of a slower change."""
    for _ in range(extra):
        torch.mm(a, b)


def train(width: int, steps: int, extra: int, step_times: list[float] | None = None) -> None:
    """The training loop; ``step_times`` (when given) gets each step's seconds."""
    torch.manual_seed(0)
    net = model(width)
    opt = torch.optim.SGD(net.parameters(), lr=0.01)
    a, b = extra_operands()
    last = time.perf_counter()
    for x, y in loader(steps):
        loss = torch.nn.functional.cross_entropy(net(x), y)
        opt.zero_grad()
        loss.backward()
        add_work(extra, a, b)
        opt.step()
        if step_times is not None:
            now = time.perf_counter()
            step_times.append(now - last)
            last = now


def step_ms(width: int, steps: int, extra: int = 0) -> float:
    """The median step time (ms) of a loop of ``steps`` steps, its first 5 left out."""
    times: list[float] = []
    train(width, steps + 5, extra, times)
    return statistics.median(times[5:]) * 1000


def widths(target_ms: float, steps: int) -> dict[str, object]:
    """The median step time of each width up to the first past 1.5 × ``target_ms``, and the
    cost (ms) of one added matmul alone."""
    step_ms(WIDTHS[0], 5)  # the first loop of a process pays torch's lazy imports
    times: dict[int, float] = {}
    for w in WIDTHS:
        times[w] = step_ms(w, steps)
        if times[w] > 1.5 * target_ms:
            break
    a, b = extra_operands()
    n = max(50, math.ceil(2 * target_ms / 0.01))
    started = time.perf_counter()
    add_work(n, a, b)
    alone_ms = (time.perf_counter() - started) / n * 1000
    return {"widths_ms": times, "matmul_alone_ms": alone_ms, "torch": torch.__version__}


def main() -> int:
    torch.set_num_threads(1)
    if sys.argv[1:2] == ["--widths"]:
        target = float(sys.argv[2]) if len(sys.argv) > 2 else 10.0
        steps = int(os.environ.get("GATE_STEPS", "40"))
        print(json.dumps(widths(target, steps)))
        return 0
    import traceml_nb

    width = int(os.environ.get("GATE_WIDTH", "8"))
    steps = int(os.environ.get("GATE_STEPS", "150"))
    extra = int(os.environ.get("GATE_EXTRA", "0"))
    name = os.environ.get("GATE_NAME", "smoke")
    with traceml_nb.Session().run(name) as run:
        train(width, steps, extra)
    result = run.result()
    print(f"stored as @{result.stored_id}: median step {result.summary.step_ms_median:.2f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
