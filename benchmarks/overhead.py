"""What traceml_nb costs a training loop, against plain training and ``torch.profiler``.

The same CPU training loops (``workloads.py``: a real ``DataLoader`` over an in-memory
``TensorDataset``, ``num_workers=0``, with an optimizer; the bare loop, the tiny MLP, the
small conv net) are measured by every method of ``methods.py`` and ``hot_path.py``, and the
figures are judged against the budgets by ``report.py``:

* alternating repetitions of plain, ``tracer`` (``traceml_nb.Run(sample=False)``: the
  DataLoader wrapper and the optimizer post-step hook), ``monitor`` (plus the samplers at
  10 Hz and the live view's writer, headless) and ``profiler`` (``torch.profiler``);
* interleaved plain/traced blocks with the full monitor: the added time per step the budget
  is judged on; and torch.profiler's own interleaved blocks, for the ratio;
* the hot path alone on stand-ins with cold caches, beside the bare-wrapper floor;
* the samplers' and the live view's CPU, memory per step (``memory.py``), import time.

Usage::

    .venv/bin/python benchmarks/overhead.py            # the full benchmark (~20 minutes)
    .venv/bin/python benchmarks/overhead.py --quick    # well under a minute; the smoke test's
    .venv/bin/python benchmarks/overhead.py --json out.json
    .venv/bin/python benchmarks/overhead.py --breakdown 800   # where the hot path's time goes
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(1, str(HERE.parent))  # the checkout, when traceml_nb is not installed

import hot_path  # noqa: E402
import memory  # noqa: E402  (benchmarks/memory.py, beside this file)
import methods  # noqa: E402
import report  # noqa: E402
import torch  # noqa: E402
from workloads import EVICTIONS, LOOPS  # noqa: E402


@dataclass
class Sizes:
    """How much each method measures (``--quick``: just enough to run every one)."""

    reps: int
    conv_reps: int
    steps: int
    conv_steps: int
    pairs: int
    conv_pairs: int
    profiler_pairs: int
    block_steps: int  #: counted steps of an interleaved block
    memory_steps: int
    cold_samples: tuple[int, int, int]  #: per eviction of ``EVICTIONS``, each variant
    cold_block: int
    sampler_s: float
    steady_s: float
    import_runs: int
    #: the interleaved blocks start after the run's first phase samples (``methods.SETTLE_MAX_S``)
    settle: bool

    @classmethod
    def of(cls, args: argparse.Namespace) -> Sizes:
        q = args.quick
        return cls(
            reps=args.reps or (2 if q else 21),
            conv_reps=args.conv_reps or (2 if q else 5),
            steps=args.steps or (30 if q else 500),
            conv_steps=args.conv_steps or (3 if q else 300),
            pairs=args.pairs or (3 if q else 1500),
            conv_pairs=args.conv_pairs or (2 if q else 1000),
            profiler_pairs=args.profiler_pairs or (2 if q else 60),
            block_steps=3 if q else 8,
            memory_steps=args.memory_steps or (10_000 if q else 1_000_000),
            cold_samples=(30, 20, 10) if q else (2000, 1000, 800),
            cold_block=5 if q else 20,
            sampler_s=0.3 if q else 3.0,
            # three times the live view's SETTLE_S (5 s), when it sends whole series rather than
            # streams: a 3 s run measured that start alone, not the steady state
            steady_s=0.5 if q else 15.0,
            import_runs=1 if q else 7,
            settle=not q,
        )


_T0 = time.perf_counter()


def log(msg: str) -> None:
    """Progress on stderr, with the seconds since the start."""
    print(f"[{time.perf_counter() - _T0:6.1f} s] {msg}", file=sys.stderr, flush=True)


def cold_hot_path(sizes: Sizes) -> list[hot_path.ColdHotPath]:
    log("hot path alone, cold caches ...")
    return [
        hot_path.cold_hot_path_cost(eviction, n, sizes.cold_block)
        for eviction, n in zip(EVICTIONS, sizes.cold_samples, strict=True)
    ]


def breakdown(pairs: int, chosen: list[str], sizes: Sizes, json_path: Path | None) -> int:
    """``--breakdown``: the hot path's parts switched on one by one, then the cold hot path."""
    data: dict[str, Any] = {"date": time.strftime("%Y-%m-%d"), "machine": report.machine()}
    print(
        f"tracer breakdown, {time.strftime('%Y-%m-%d %H:%M')}: added us per step, interleaved "
        f"blocks ({pairs} pairs), 95% interval in brackets",
        flush=True,
    )
    for name in chosen:
        work = LOOPS[name](300 if name == "conv" else 500)
        log(f"breakdown of {work.name} ...")
        parts = hot_path.tracer_breakdown(work, pairs, sizes.block_steps, sizes.settle)
        data[work.name] = {part: v.__dict__ for part, v in parts.items()}
        print("\n".join(report.breakdown_lines(work.name, parts)), flush=True)
    lines, data["cold_hot_path"] = report.cold_section(cold_hot_path(sizes))
    print("\n".join(lines))
    if json_path is not None:
        json_path.write_text(json.dumps(data, indent=2, default=str))
    return 0


def benchmark(chosen: list[str], sizes: Sizes, json_path: Path | None) -> int:
    info = report.machine()
    live_view, why = methods.live_view_class()
    view_status = "available" if live_view is not None else f"not available ({why})"
    out = [
        f"traceml_nb overhead benchmark, {time.strftime('%Y-%m-%d %H:%M')}",
        f"machine: nproc {info['nproc']}, {info['cpu']}, python {info['python']}, torch "
        f"{info['torch']} ({info['torch_threads']} intra-op threads)",
        f"view: {view_status}",
        "",
    ]
    data: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d"),
        "machine": info,
        "view": view_status,
        "loops": {},
    }
    for name in chosen:
        conv = name == "conv"
        work = LOOPS[name](sizes.conv_steps if conv else sizes.steps)
        pairs = sizes.conv_pairs if conv else sizes.pairs
        log(f"timing {work.name} ...")
        results = methods.repetitions(work, sizes.conv_reps if conv else sizes.reps, log)
        log(f"  {work.name}: interleaved blocks, {pairs} pairs ...")
        inter = methods.interleaved_cost(work, pairs, sizes.block_steps, settle=sizes.settle)
        log(f"  {work.name}: torch.profiler, interleaved blocks, {sizes.profiler_pairs} pairs ...")
        prof = methods.profiler_interleaved_cost(work, sizes.profiler_pairs, sizes.block_steps)
        lines, data["loops"][work.name] = report.loop_section(
            work, results, inter, prof, sizes.profiler_pairs
        )
        out += [*lines, ""]

    lines, data["cold_hot_path"] = report.cold_section(cold_hot_path(sizes))
    out += [*lines, ""]
    log("samplers and live view ...")
    data["sampler_idle"] = methods.sampler_idle_cost(sizes.sampler_s)
    out.append(report.sampler_idle_line(data["sampler_idle"]))
    data["monitor_steady"] = methods.monitor_steady_cost(LOOPS["mlp"](sizes.steps), sizes.steady_s)
    out.append(report.monitor_steady_line(data["monitor_steady"]))
    log("memory ...")
    data["memory"] = memory.memory_per_step(sizes.memory_steps)
    out.append(report.memory_line(data["memory"]))
    log("import time ...")
    data["import"] = methods.import_time(sizes.import_runs)
    out += [report.import_line(data["import"]), ""]

    data["verdicts"] = report.verdicts(data)
    out += report.verdict_lines(data["verdicts"])
    print("\n".join(out), flush=True)
    if json_path is not None:
        json_path.write_text(json.dumps(data, indent=2, default=str))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--quick", action="store_true", help="a few steps and block pairs (well under a minute)"
    )
    parser.add_argument("--reps", type=int, help="repetitions of the short loops (default 21)")
    parser.add_argument("--conv-reps", type=int, help="repetitions of the conv loop (default 5)")
    parser.add_argument("--steps", type=int, help="steps of the short loops (default 500)")
    parser.add_argument("--conv-steps", type=int, help="steps of the conv net loop (default 300)")
    parser.add_argument(
        "--pairs", type=int, help="block pairs of the interleaved short loops (default 1500)"
    )
    parser.add_argument(
        "--conv-pairs", type=int, help="block pairs of the interleaved conv loop (default 1000)"
    )
    parser.add_argument(
        "--profiler-pairs",
        type=int,
        help="block pairs of the interleaved torch.profiler measurement (default 60)",
    )
    parser.add_argument("--memory-steps", type=int, help="steps of the memory run (default 1e6)")
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch intra-op threads (default 1: on a shared 2-core VM, OpenMP workers spinning "
        "against other processes make the loop time swing tenfold; 0 keeps torch's default)",
    )
    parser.add_argument(
        "--breakdown",
        type=int,
        metavar="PAIRS",
        help="instead of the benchmark: the hot path's cost with the wrapper's parts switched on "
        "one by one, interleaved with PAIRS block pairs on the --loops (default: the bare loop "
        "and the tiny MLP), then the hot path alone with cold caches (smaller with --quick)",
    )
    parser.add_argument(
        "--loops",
        help="which loops to time, comma-separated from bare, mlp, conv (default: all three; "
        "with --breakdown: bare,mlp)",
    )
    parser.add_argument("--json", type=Path, help="also write the figures as JSON to this path")
    args = parser.parse_args(argv)
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    default = "bare,mlp" if args.breakdown else "bare,mlp,conv"
    chosen = [name.strip() for name in (args.loops or default).split(",") if name.strip()]
    unknown = sorted(set(chosen) - set(LOOPS))
    if unknown or not chosen:
        parser.error(
            f"--loops: unknown {', '.join(unknown) or '(none given)'}; use bare, mlp, conv"
        )
    sizes = Sizes.of(args)
    if args.breakdown:
        return breakdown(args.breakdown, chosen, sizes, args.json)
    return benchmark(chosen, sizes, args.json)


if __name__ == "__main__":
    sys.exit(main())
