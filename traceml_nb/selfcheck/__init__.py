"""GPU self-check of traceml_nb's measurements: ``python -m traceml_nb.selfcheck``.

On a CUDA machine, within a time budget (``--budget-s``, default 170 s), it checks, one
module each:

``env``        (:mod:`.environment`) Python, torch, its CUDA and the visible devices.
``stall``      (:mod:`.stall`) the CUDA-event input stall against injected data delays.
``nvml``       (:mod:`.nvml`) every NVML field the sampler reads, while the GPU is busy, and
               the host time of each read.
``gpm``        (:mod:`.gpm`) the GPM metrics (SM activity, occupancy, tensor cores, DRAM
               bandwidth) for a one-thread spin and for fp16 matmuls; on a GPU without GPM,
               why not.
``sampler``    (:mod:`.sampler`) a ``Run``'s GPU samples against what NVML and GPM support.
``samplercpu`` (:mod:`.sampler_cpu`) the samplers' CPU share at 10 Hz (at most 1% of a core),
               and each source's alone.
``mapping``    (:mod:`.mapping`) ``CUDA_VISIBLE_DEVICES``: torch index to NVML device by UUID,
               in this process and in children (:mod:`.mapping_child`).
``hostcost``   (:mod:`.host_cost`) the host time the tracer adds to a step of a host-bound GPU
               loop, phases timed as in any run, from interleaved blocks (at most 10 us),
               and its event pool's reuse.
``anatomy``    (:mod:`.anatomy_check`) a step's phases on the GPU against CUDA events of its
               own, and the MFU of a loop whose FLOPs are known by hand.
``overhead``   (:mod:`.overhead`) what the tracer and the monitor add to a training loop.

:mod:`.report` holds the result type, the table, the budget and the watchdog; :mod:`.cli` the
driver; :mod:`.stats` the paired-difference statistics, also for benchmarks. Exit code 0 when
every check passed, 1 when one failed or crashed; without CUDA it says so and exits 0.
Importing this package does not import torch.
"""

from __future__ import annotations

from .results import CheckResult

__all__ = ["CheckResult", "main"]


def main(argv: list[str] | None = None) -> int:
    """Run the self-check as ``python -m traceml_nb.selfcheck`` does; returns its exit code."""
    # Imported here: a benchmark importing .stats should not load every check with it.
    from .cli import main as cli_main

    return cli_main(argv)
