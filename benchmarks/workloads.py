"""The training loops the benchmark times, and the stand-ins of the cold hot path.

Loops (``LOOPS``): a real ``DataLoader`` over an in-memory ``TensorDataset``
(``num_workers=0``) feeding an optimizer, in three sizes: the bare loop (no model), the tiny
MLP and the small conv net.

The cold hot path (:func:`benchmarks.methods.cold_hot_path_cost`) needs a loader and an
optimizer whose own work is nothing, so that only what is wrapped around them is timed: a real
DataLoader iterator whose ``__next__`` is :func:`trivial_next`, a real ``torch.optim.Optimizer``
whose step does nothing (:class:`NullOptimizer`), and :func:`after_step`, the end of torch's
``Optimizer.step`` wrapper as torch writes it. :func:`evictor` makes the caches cold before
each timed call.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch
import torch.optim.optimizer as optim_mod
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


# --- the loops ----------------------------------------------------------------------------------
@dataclass
class Workload:
    """A training loop: ``loader`` batches fed to ``compute`` (zero_grad, forward, backward),
    then ``optimizer.step()``; ``steps`` per repetition."""

    name: str
    loader: DataLoader
    compute: Callable[[Any], None]
    optimizer: torch.optim.Optimizer
    steps: int

    def train_step(self, batch: Any) -> None:
        self.compute(batch)
        self.optimizer.step()


def _classifier_loop(
    name: str, model: nn.Module, inputs: torch.Tensor, batch: int, steps: int
) -> Workload:
    targets = torch.randint(0, 10, (inputs.shape[0],), generator=torch.Generator().manual_seed(1))
    loader = DataLoader(TensorDataset(inputs, targets), batch_size=batch, num_workers=0)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-4, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()

    def compute(batch_: Any) -> None:
        x, y = batch_
        optimizer.zero_grad(set_to_none=True)
        loss_fn(model(x), y).backward()

    return Workload(name, loader, compute, optimizer, steps)


def bare_loop(steps: int) -> Workload:
    """No model: a loader batch of 64 rows and an ``optimizer.step()`` on one parameter, about
    0.15 ms a step. The smallest denominator, so the added microseconds show best."""
    param = nn.Parameter(torch.zeros(1))
    optimizer = torch.optim.SGD([param], lr=0.0)
    inputs = torch.randn(64 * min(steps, 200), 32)
    targets = torch.zeros(inputs.shape[0], dtype=torch.long)
    loader = DataLoader(TensorDataset(inputs, targets), batch_size=64, num_workers=0)

    def compute(batch_: Any) -> None:
        return None

    return Workload("bare loop", loader, compute, optimizer, steps)


def tiny_mlp(steps: int) -> Workload:
    """An MLP of ~21k parameters, batch 64: about 0.5 ms a step on the 2-core VM."""
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Linear(32, 128), nn.ReLU(), nn.Linear(128, 128), nn.ReLU(), nn.Linear(128, 10)
    )
    inputs = torch.randn(64 * min(steps, 200), 32)
    return _classifier_loop("tiny MLP", model, inputs, 64, steps)


def small_convnet(steps: int) -> Workload:
    """Three 3x3 convolutions on 3x32x32 images, batch 20: about 20 ms a step on the 2-core VM."""
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(3, 32, 3, padding=1),
        nn.ReLU(),
        nn.Conv2d(32, 64, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(64, 64, 3, padding=1),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(64, 10),
    )
    inputs = torch.randn(20 * min(steps, 25), 3, 32, 32)
    return _classifier_loop("small conv net", model, inputs, 20, steps)


#: ``--loops`` name -> the loop's maker (its argument: steps per repetition).
LOOPS: dict[str, Callable[[int], Workload]] = {
    "bare": bare_loop,
    "mlp": tiny_mlp,
    "conv": small_convnet,
}


def run_loop(work: Workload, stamps: list[int]) -> None:
    """``work.steps`` training steps, over as many epochs of the loader as that takes;
    appends ``perf_counter_ns()`` after each step to ``stamps`` (the same ~0.1 us in every
    variant)."""
    clock = time.perf_counter_ns
    append = stamps.append
    done = 0
    while done < work.steps:
        for batch in work.loader:
            work.train_step(batch)
            append(clock())
            done += 1
            if done == work.steps:
                return


# --- the stand-ins of the cold hot path --------------------------------------------------------
class NullOptimizer(torch.optim.Optimizer):
    """A real ``torch.optim.Optimizer`` whose ``step()`` does nothing."""

    def __init__(self) -> None:
        super().__init__([torch.zeros(1, requires_grad=True)], {})

    def step(self, closure: Any = None) -> None:  # type: ignore[override]
        return None


def after_step(optimizer: torch.optim.Optimizer) -> None:
    """What torch's ``Optimizer.step`` wrapper (``Optimizer.profile_hook_step``) runs after the
    step itself, as torch writes it: the ``_optimizer_step_code()`` call and the loop over the
    optimizer's and the global post-step hooks, each called with ``(optimizer, args, kwargs)``
    (``args`` holds the optimizer, as in torch). A global post-step hook, ours or the floor's,
    runs inside this loop. The rest of the wrapper (a ``record_function`` op, ~60 us cold, and
    the empty pre-hook loop) is the same with and without a hook, and would bury the
    difference in its noise."""
    args = (optimizer,)
    kwargs: dict[str, Any] = {}
    optimizer._optimizer_step_code()  # type: ignore[attr-defined]
    for post_hook in itertools.chain(
        optimizer._optimizer_step_post_hooks.values(),  # type: ignore[attr-defined]
        optim_mod._global_optimizer_post_hooks.values(),
    ):
        post_hook(optimizer, args, kwargs)


#: What runs before each timed call of the cold hot path.
EVICTIONS = ("24 MB", "64 MB", "conv step")


def evictor(eviction: str) -> Callable[[], None]:
    """``"24 MB"`` / ``"64 MB"``: write that much (evicts data: 24 MB fits in this VM's 32 MB L3
    with what it evicts, 64 MB goes to memory, TLB included); ``"conv step"``: a forward and
    backward of the small conv net on 4 images (evicts code as well: oneDNN kernels, autograd,
    the interpreter's other paths, as the conv net's own step does)."""
    if eviction == "conv step":
        work = small_convnet(1)
        batch = next(iter(DataLoader(work.loader.dataset, batch_size=4)))
        return partial(work.compute, batch)
    mb = int(eviction.split()[0])
    return partial(torch.Tensor.add_, torch.zeros(mb * (1 << 20) // 4), 1.0)


#: Batches the stand-in iterator's dataset holds; :func:`rewind` keeps it far from its end.
STAND_IN_BATCHES = 1000
_trivial_batch: Any = None


def trivial_next(self: Any) -> Any:
    """The stand-in loader's ``__next__``: counts the batch, as torch's does, and returns a
    new batch of the same data each time: a new tuple of new tensors, as a collate makes
    (fresh in the caches, as a real batch is), without the loader's own work and its noise."""
    self._num_yielded += 1
    x, y = _trivial_batch
    return (x.view(x.shape), y.view(y.shape))


def stand_in_iterator() -> Any:
    """A real DataLoader iterator (64-row batches of an in-memory dataset) for
    :func:`trivial_next`; its first batch is the one :func:`trivial_next` returns."""
    global _trivial_batch
    n = 64 * STAND_IN_BATCHES
    loader = DataLoader(TensorDataset(torch.zeros(n, 3), torch.zeros(n)), batch_size=64)
    it = iter(loader)
    _trivial_batch = next(it)
    return it


def rewind(it: Any) -> None:
    """Keep the stand-in iterator's batch count from its epoch's end (its sampler is never
    used, so only the count matters); a fetch never reads a count of 1 again, so no new epoch is
    logged either."""
    if it._num_yielded > STAND_IN_BATCHES - 100:
        it._num_yielded = 1
