"""What the waste costs: a run's idle accelerator time, in GPU-seconds and in money.

The idle share of a run is ``1 - GPU utilisation`` (NVML's median share of time a kernel ran,
during the steady steps) where NVML measured it, else the GPU input stall share (CUDA events);
× the run's wall time = idle GPU-seconds. A CPU-only run has none.

The price of a GPU-hour comes from ``TRACEML_NB_GPU_PRICE`` (read by the session and passed in
here): either one number, USD per GPU-hour for any GPU (``0.53``), or ``MODEL=PRICE`` pairs
(``T4=0.35,A100=2.9``), matched as substrings of the GPU's name. Without it,
``DEFAULT_GPU_PRICES_USD_PER_HOUR`` holds approximate public on-demand list prices (see
``PRICE_SOURCE``); they vary by provider, region and month, so set yours.
"""

from __future__ import annotations

from .findings import IdleCost, Summary

#: Approximate on-demand USD per GPU-hour: the smallest instance with that GPU, divided by its
#: GPU count (T4: g4dn.xlarge; A10G: g5.xlarge; L4: g6.xlarge; V100: p3.2xlarge; A100:
#: p4d.24xlarge / 8; H100: p5.48xlarge / 8; L40S: g6e.xlarge). Matched in this order (longer names first).
DEFAULT_GPU_PRICES_USD_PER_HOUR: dict[str, float] = {
    "A100": 4.10,
    "H100": 12.29,
    "A10G": 1.01,
    "V100": 3.06,
    "L40S": 1.86,
    "L4": 0.80,
    "T4": 0.53,
}
PRICE_SOURCE = "approximate AWS EC2 on-demand list prices (us-east-1, 2024), per GPU"
ENV_PRICE_SOURCE = "TRACEML_NB_GPU_PRICE"


def parse_prices(text: str) -> tuple[float | None, dict[str, float]]:
    """``TRACEML_NB_GPU_PRICE`` as ``(price for any GPU, {model: price})``; ``ValueError``
    naming the part that is not a price."""
    text = text.strip()
    if not text:
        return None, {}
    if "=" not in text:
        return _price(text), {}
    prices: dict[str, float] = {}
    for part in text.split(","):
        if not part.strip():
            continue
        model, sep, value = part.partition("=")
        if not sep or not model.strip():
            raise ValueError(f"{part.strip()!r} is not MODEL=PRICE")
        prices[model.strip()] = _price(value)
    return None, prices


def _price(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"{text.strip()!r} is not a price in USD per GPU-hour") from None
    if not value >= 0 or value == float("inf"):
        raise ValueError(f"{text.strip()!r} is not a price in USD per GPU-hour")
    return value


def gpu_price(gpu_name: str | None, override: str | None = None) -> tuple[float, str] | None:
    """``(USD per GPU-hour, source)`` for ``gpu_name``, or None when no price is known.
    ``override``: the ``TRACEML_NB_GPU_PRICE`` text (an invalid one is ignored)."""
    if override:
        try:
            any_gpu, by_model = parse_prices(override)
        except ValueError:
            any_gpu, by_model = None, {}
        if any_gpu is not None:
            return any_gpu, ENV_PRICE_SOURCE
        for model, price in sorted(by_model.items(), key=lambda kv: -len(kv[0])):
            if gpu_name and model.lower() in gpu_name.lower():
                return price, ENV_PRICE_SOURCE
    if not gpu_name:
        return None
    for model, price in DEFAULT_GPU_PRICES_USD_PER_HOUR.items():
        if model.lower() in gpu_name.lower():
            return price, PRICE_SOURCE
    return None


def idle_cost(
    summary: Summary, elapsed_s: float, gpu_name: str | None, override: str | None = None
) -> IdleCost | None:
    """The idle GPU time of a run and its price (see the module docstring); None for a CPU
    run, or when neither NVML utilisation nor the GPU input stall was measured."""
    if summary.gpu_util_median_pct is not None:
        share = min(1.0, max(0.0, 1 - summary.gpu_util_median_pct / 100))
        method = "1 - GPU utilisation"
    elif summary.gpu_stall_share is not None:
        share = min(1.0, max(0.0, summary.gpu_stall_share))
        method = "GPU input stall"
    else:
        return None
    idle_s = share * max(0.0, elapsed_s)
    found = gpu_price(gpu_name, override)
    price, source = found if found is not None else (None, None)
    return IdleCost(
        idle_gpu_s=idle_s,
        idle_share=share,
        method=method,
        gpu_name=gpu_name,
        usd_per_hour=price,
        cost_usd=None if price is None else idle_s / 3600 * price,
        price_source=source,
    )


def cost_sentence(cost: IdleCost | None) -> str | None:
    """``GPU idle 42% of the run: 3.1 GPU-min ≈ $0.03 (at $0.53/GPU-hour, source)``."""
    if cost is None:
        return None
    minutes = cost.idle_gpu_s / 60
    amount = f"{minutes:.1f} GPU-min" if minutes < 120 else f"{minutes / 60:.1f} GPU-hours"
    text = f"GPU idle {cost.idle_share * 100:.0f}% of the run ({cost.method}): {amount}"
    if cost.cost_usd is not None and cost.usd_per_hour is not None:
        text += (
            f" \u2248 ${cost.cost_usd:.2f} (at ${cost.usd_per_hour:.2f}/GPU-hour, "
            f"{cost.price_source})"
        )
    else:
        text += f" (no price for this GPU: set {ENV_PRICE_SOURCE})"
    return text
