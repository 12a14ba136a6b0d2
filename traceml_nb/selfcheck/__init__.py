"""GPU self-check of traceml_nb's measurements: ``python -m traceml_nb.selfcheck``.

On a CUDA machine, within a time budget (``--budget-s``, default 170 s), it checks, one
module each:

``env``        (:mod:`.environment`) Python, torch, its CUDA and the visible devices.
``stall``      (:mod:`.stall`) the CUDA-event input stall against injected data delays.
``nvml``       (:mod:`.nvml`) every NVML field the sampler reads, while the GPU is busy.
``sampler``    (:mod:`.sampler`) a ``Run``'s GPU samples against what NVML supports.
``mapping``    (:mod:`.mapping`) ``CUDA_VISIBLE_DEVICES``: torch index to NVML device by UUID,
               in this process and in children (:mod:`.mapping_child`).
``overhead``   (:mod:`.overhead`) what the tracer and the monitor add to a training loop.

:mod:`.report` holds the result type, the table, the budget and the watchdog; :mod:`.cli` the
driver; :mod:`.stats` the paired-difference statistics, also for benchmarks. Exit code 0 when
every check passed, 1 when one failed or crashed; without CUDA it says so and exits 0.
Importing this package does not import torch.
"""

from __future__ import annotations

from .report import CheckResult

__all__ = ["CheckResult", "main"]


def main(argv: list[str] | None = None) -> int:
    """Run the self-check as ``python -m traceml_nb.selfcheck`` does; returns its exit code."""
    # Imported here: a benchmark importing .stats should not load every check with it.
    from .cli import main as cli_main

    return cli_main(argv)
