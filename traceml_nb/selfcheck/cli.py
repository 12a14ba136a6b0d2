"""The driver of ``python -m traceml_nb.selfcheck``: its flags, the order of the checks and the
time each needs at least, and the exit code.

Every check runs in its own ``try`` (:func:`~traceml_nb.selfcheck.results.run_check`): an error
is printed and the next check runs. Output is a table on stdout and, with ``--json PATH``, a
JSON file. Exit code 0 when every check passed, 1 when one failed (the table says which).
Without CUDA it says so and exits 0.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

from .anatomy_check import check_anatomy
from .environment_check import check_environment
from .formulas_check import check_formulas
from .gpm_check import check_gpm
from .host_cost import check_host_cost
from .mapping import check_mapping
from .nvml import check_nvml
from .overhead import check_overhead
from .results import (
    DEFAULT_BUDGET_S,
    SKIP,
    Budget,
    CheckResult,
    Watchdog,
    exit_code,
    format_table,
    report_dict,
    run_check,
    write_json,
)
from .sampler import check_sampler
from .sampler_cpu import check_sampler_cpu
from .stall import check_stall

CHECKS: list[tuple[str, Callable[[Budget], CheckResult], float]] = [
    # (name, check, seconds it needs at least)
    ("env", check_environment, 1),
    ("stall", check_stall, 8),
    ("nvml", check_nvml, 5),
    ("gpm", check_gpm, 6),
    ("sampler", check_sampler, 6),
    ("samplercpu", check_sampler_cpu, 12),
    ("mapping", check_mapping, 30),
    ("hostcost", check_host_cost, 15),
    ("anatomy", check_anatomy, 15),
    ("formulas", check_formulas, 5),
    ("overhead", check_overhead, 20),
]


def cuda_available() -> tuple[bool, str]:
    """``(True, '')`` when torch sees a CUDA device, else ``(False, why not)``."""
    try:
        import torch

        has_cuda = torch.cuda.is_available()
        why = (
            ""
            if has_cuda
            else f"torch {torch.__version__} (built for CUDA {torch.version.cuda}) sees no CUDA device"
        )
    except Exception as exc:
        has_cuda, why = False, f"torch could not be imported: {type(exc).__name__}: {exc}"
    return has_cuda, why


def main(argv: list[str] | None = None) -> int:
    """Run the checks ``argv`` asks for (default: all) and return the exit code."""
    parser = argparse.ArgumentParser(
        prog="python -m traceml_nb.selfcheck",
        description="GPU self-check of traceml_nb's measurements: python -m traceml_nb.selfcheck.",
    )
    parser.add_argument(
        "--budget-s", type=float, default=DEFAULT_BUDGET_S, help="total time budget (s)"
    )
    parser.add_argument("--json", help="also write the results as JSON to this path")
    parser.add_argument("--only", help="comma-separated checks to run (default: all)")
    args = parser.parse_args(argv)
    budget = Budget(args.budget_s)
    results: list[CheckResult] = []
    watchdog = Watchdog(args.budget_s, results, args.json)
    watchdog.start()
    try:
        has_cuda, why = cuda_available()
        if not has_cuda:
            msg = f"no CUDA: {why}; nothing to check on this machine"
            print(msg, flush=True)
            write_json(args.json, report_dict([CheckResult("cuda", SKIP, msg)], args.budget_s, msg))
            return 0
        only = {s.strip() for s in args.only.split(",")} if args.only else None
        for name, check, needs in CHECKS:
            if only is not None and name not in only:
                continue
            watchdog.current = name
            print(f"[{name}] ...", flush=True)
            result = run_check(name, check, budget, needs)
            results.append(result)
            print(
                f"[{name}] {result.status} ({result.seconds:.1f} s): {result.summary}", flush=True
            )
        print(format_table(results), flush=True)
        write_json(args.json, report_dict(results, args.budget_s))
        return exit_code(results)
    finally:
        watchdog.cancel()
