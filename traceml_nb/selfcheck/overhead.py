"""The ``overhead`` check: what traceml_nb adds to a training loop on the GPU.

Plain versus ``host-only`` (the step tracer with host clocks), ``tracer`` (plus CUDA events)
and ``monitor`` (plus samplers and the live view's writer, headless), in repetitions whose
order rotates: a ResNet-18-sized conv net (torch.nn only, synthetic tensors; the monitor must
add at most ``OVERHEAD_BUDGET_PCT``, median over the repetition pairs) and a tiny host-bound MLP
(informative); then the host cost of each CUDA call the tracer makes.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

from .cuda import cuda_call_costs_us, torch_module
from .paired_stats import paired_added
from .results import FAIL, PASS, Budget, CheckResult

OVERHEAD_BUDGET_PCT = 1.0  #: ResNet-18-sized loop: traced may add at most this, median
OVERHEAD_VARIANTS = ("plain", "host-only", "tracer", "monitor")


def judge_overhead(added: dict[str, float], budget_pct: float = OVERHEAD_BUDGET_PCT) -> bool:
    """The traced loop passes when its median added time (``paired_added``'s ``median_pct``) is
    within ``budget_pct`` percent of the plain loop."""
    return added["median_pct"] <= budget_pct


# --- the loops -----------------------------------------------------------------------------------
def resnet18_like(torch: Any, num_classes: int = 1000) -> Any:
    """ResNet-18's layout from torch.nn only (11.7 M parameters; torchvision may be missing)."""
    nn = torch.nn

    module_base: Any = nn.Module

    class BasicBlock(module_base):
        def __init__(self, cin: int, cout: int, stride: int) -> None:
            super().__init__()
            self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
            self.bn1 = nn.BatchNorm2d(cout)
            self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
            self.bn2 = nn.BatchNorm2d(cout)
            self.down = None
            if stride != 1 or cin != cout:
                self.down = nn.Sequential(
                    nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout)
                )

        def forward(self, x: Any) -> Any:
            out = torch.relu(self.bn1(self.conv1(x)))
            out = self.bn2(self.conv2(out))
            return torch.relu(out + (x if self.down is None else self.down(x)))

    layers: list[Any] = [
        nn.Conv2d(3, 64, 7, 2, 3, bias=False),
        nn.BatchNorm2d(64),
        nn.ReLU(inplace=True),
        nn.MaxPool2d(3, 2, 1),
    ]
    cin = 64
    for cout, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
        layers += [BasicBlock(cin, cout, stride), BasicBlock(cout, cout, 1)]
        cin = cout
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(512, num_classes)]
    return nn.Sequential(*layers)


def _overhead_loop(torch: Any, kind: str, steps: int) -> tuple[Any, Callable[[Any], None]]:
    """``(loader, train_step)``: the loader yields index batches, the step computes on fixed
    synthetic GPU tensors (so the loop measures the GPU work plus our per-step cost)."""
    from torch.utils.data import DataLoader, TensorDataset

    device = torch.device("cuda", torch.cuda.current_device())
    torch.manual_seed(0)
    if kind == "resnet18":
        model = resnet18_like(torch).to(device)
        batch = 64
        x = torch.randn(batch, 3, 224, 224, device=device)
        y = torch.randint(0, 1000, (batch,), device=device)
    else:
        model = torch.nn.Sequential(
            torch.nn.Linear(32, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10)
        ).to(device)
        batch = 64
        x = torch.randn(batch, 32, device=device)
        y = torch.randint(0, 10, (batch,), device=device)
    opt = torch.optim.SGD(model.parameters(), lr=1e-4, momentum=0.9)
    loss_fn = torch.nn.CrossEntropyLoss()
    loader = DataLoader(TensorDataset(torch.arange(steps * batch)), batch_size=batch, num_workers=0)

    def train_step(_batch: Any) -> None:
        opt.zero_grad(set_to_none=True)
        loss_fn(model(x), y).backward()
        opt.step()

    return loader, train_step


def _live_view() -> tuple[Any, str]:
    """``(LiveView class, '')`` or ``(None, why it cannot be imported)``."""
    try:
        from ..views.live.view import LiveView
    except Exception as exc:
        return None, f"{type(exc).__name__}: {exc}"
    return LiveView, ""


def _time_loop(
    torch: Any, loader: Any, train_step: Callable[[Any], None], variant: str
) -> dict[str, Any]:
    """One epoch under ``variant``: ``plain``; ``host-only`` (a Run on device ``cpu``: the
    step tracer with host clocks, no CUDA events); ``tracer`` (a Run on the GPU without
    samplers: the step tracer and its CUDA events); ``monitor`` (a Run with samplers and the
    live view's writer, headless). Wall time in ns from a synchronised start to a synchronised
    end; starting and stopping the run are outside it."""
    from ..engine.run import Run

    run = view = None
    if variant != "plain":
        device = "cpu" if variant == "host-only" else torch.cuda.current_device()
        run = Run("selfcheck-overhead", device=device, sample=variant == "monitor", interval=0.1)
        run.start()
        live_view, _why = _live_view() if variant == "monitor" else (None, "")
        if live_view is not None:
            view = live_view(run, display=False)
            view.start()
    try:
        torch.cuda.synchronize()
        t0 = time.perf_counter_ns()
        for b in loader:
            train_step(b)
        torch.cuda.synchronize()
        loop_ns = time.perf_counter_ns() - t0
    finally:
        try:
            if view is not None:
                getattr(view, "close", view.stop)()
        finally:
            if run is not None:
                run.stop()
    out: dict[str, Any] = {"loop_ns": loop_ns}
    if run is not None and variant == "monitor":
        out["sampler_core_pct"] = 100.0 * run.sampler_busy_s / max(run.elapsed_s, 1e-9)
        out["view_pct"] = (
            100.0 * float(getattr(view, "busy_s", 0.0)) / max(run.elapsed_s, 1e-9) if view else None
        )
    return out


# --- the check -----------------------------------------------------------------------------------
def check_overhead(budget: Budget) -> CheckResult:
    torch = torch_module()
    plan = [("resnet18", 30, 10, True), ("tiny-mlp", 200, 10, False)]  # kind, steps, reps, judged
    loops: dict[str, Any] = {}
    status = PASS
    lines = []
    for kind, steps, reps, judged in plan:
        loader, train_step = _overhead_loop(torch, kind, steps)
        warm = [_time_loop(torch, loader, train_step, v)["loop_ns"] for v in OVERHEAD_VARIANTS]
        per_rep_s = 1.5 * sum(warm) / 1e9 + 1.0
        runs: dict[str, list[dict[str, Any]]] = {v: [] for v in OVERHEAD_VARIANTS}
        for rep in range(reps):
            if not budget.allows(per_rep_s + 12):
                break
            k = rep % len(OVERHEAD_VARIANTS)
            for variant in OVERHEAD_VARIANTS[k:] + OVERHEAD_VARIANTS[:k]:
                runs[variant].append(_time_loop(torch, loader, train_step, variant))
        if not runs["plain"]:
            lines.append(f"{kind}: skipped, out of time budget")
            status = FAIL if judged else status
            print("  " + lines[-1], flush=True)
            continue
        plain = [r["loop_ns"] for r in runs["plain"]]
        entry: dict[str, Any] = {
            "steps": steps,
            "plain_step_ms": statistics.median(plain) / steps / 1e6,
        }
        parts = [f"{kind:<9} plain {entry['plain_step_ms']:7.3f} ms/step"]
        for variant in OVERHEAD_VARIANTS[1:]:
            added = paired_added(plain, [r["loop_ns"] for r in runs[variant]], steps)
            entry[variant] = added
            parts.append(
                f"{variant} {added['median_us']:+7.1f} us ({added['median_pct']:+.2f}%, "
                f"{added['min_pct']:+.2f} .. {added['max_pct']:+.2f}%)"
            )
        mon = [r for r in runs["monitor"] if r.get("sampler_core_pct") is not None]
        if mon:
            entry["sampler_core_pct"] = statistics.median(r["sampler_core_pct"] for r in mon)
        ok = judge_overhead(entry["monitor"])
        verdict = ("ok" if ok else "OVER") if judged else "info"
        if judged and not ok:
            status = FAIL
        if "sampler_core_pct" in entry:
            parts.append(f"samplers {entry['sampler_core_pct']:.1f}% of a core")
        lines.append("  ".join(parts) + f"  [{len(plain)} reps] {verdict}")
        print("  " + lines[-1], flush=True)
        loops[kind] = entry
    costs = cuda_call_costs_us(torch)
    live_view, why = _live_view()
    view_text = "on" if live_view is not None else f"not available ({why})"
    lines.append(
        "CUDA calls on the host, us each: " + ", ".join(f"{k} {v:.2f}" for k, v in costs.items())
    )
    lines.append(f"live view: {view_text}")
    print("  " + lines[-2] + "\n  " + lines[-1], flush=True)
    details = {
        "loops": loops,
        "cuda_call_us": costs,
        "view": view_text,
        "budget_pct": OVERHEAD_BUDGET_PCT,
        "lines": lines,
    }
    summary = "; ".join(
        f"{k} monitor {v['monitor']['median_pct']:+.2f}% ({v['monitor']['median_us']:+.1f} us/step), "
        f"tracer {v['tracer']['median_us']:+.1f}, host-only {v['host-only']['median_us']:+.1f} us/step"
        for k, v in loops.items()
    )
    return CheckResult("overhead", status, summary + f"; live view {view_text}", details)
