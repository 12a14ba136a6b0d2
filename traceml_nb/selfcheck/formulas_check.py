"""The ``formulas`` check: the FLOP formulas the count adds for cuDNN's recurrent layers
(:mod:`traceml_nb.engine.instrument.flop_formulas`), on the GPU.

Each of an LSTM and a GRU (``FORMULA_LAYERS`` layers, bidirectional, width ``FORMULA_WIDTH``,
``FORMULA_BATCH`` sequences of ``FORMULA_STEPS`` steps, float32) runs a forward and backward
twice under the run's FLOP counter: as cuDNN runs it (one ``_cudnn_rnn`` operator, counted by
the formula) and with cuDNN switched off (the layer as matrix products, which torch's counter
counts itself), every gradient asked for (the input's and the initial state's too, which the
fused kernel computes anyway). Judged (:func:`judge_formulas`): the two counts within
``FORMULA_TOLERANCE``. The precision the counter files the fused layer's FLOPs under is
reported beside it (tf32 where the GPU has tensor cores and cuDNN's RNN setting allows it).
"""

from __future__ import annotations

from typing import Any

from .cuda import torch_module
from .results import FAIL, PASS, Budget, CheckResult

FORMULA_LAYERS = 2
FORMULA_WIDTH = 512
FORMULA_BATCH = 64
FORMULA_STEPS = 32
FORMULA_TOLERANCE = 0.01  #: the fused layer's count against its matrix products', relative


def judge_formulas(counts: dict[str, tuple[int, int]]) -> list[str]:
    """What is wrong (empty: it passes): ``counts`` holds, by layer, ``(as the fused kernel
    runs, as matrix products)`` FLOPs of one forward and backward."""
    problems = []
    for name, (fused, products) in counts.items():
        if products <= 0 or abs(fused / products - 1) > FORMULA_TOLERANCE:
            problems.append(f"{name}: {fused:.4g} FLOPs fused, {products:.4g} as products")
    return problems


def layer_counts(torch: Any, device: Any) -> tuple[dict[str, tuple[int, int]], dict[str, str]]:
    """``(counts for judge_formulas, the precisions the fused FLOPs were filed under)`` on
    ``device``: on a GPU cuDNN against cuDNN off; on a CPU (the tests) oneDNN against oneDNN off
    (an LSTM only: oneDNN runs no other)."""
    from ..engine.instrument.flop_count import _counter

    cuda = torch.device(device).type == "cuda"
    backend = torch.backends.cudnn if cuda else torch.backends.mkldnn
    kinds = {"LSTM": torch.nn.LSTM, "GRU": torch.nn.GRU} if cuda else {"LSTM": torch.nn.LSTM}
    counts, precisions = {}, {}
    for name, kind in kinds.items():
        torch.manual_seed(0)
        layer = kind(
            FORMULA_WIDTH, FORMULA_WIDTH, FORMULA_LAYERS, batch_first=True, bidirectional=True
        ).to(device)
        x = torch.randn(FORMULA_BATCH, FORMULA_STEPS, FORMULA_WIDTH, device=device)
        x.requires_grad_(True)
        state = torch.zeros(2 * FORMULA_LAYERS, FORMULA_BATCH, FORMULA_WIDTH, device=device)
        h0 = state.clone().requires_grad_(True)
        first = (h0, state.clone().requires_grad_(True)) if name == "LSTM" else h0

        def step(layer: Any = layer, x: Any = x, first: Any = first) -> None:
            layer(x, first)[0].sum().backward()

        fused = _counter()
        with fused:
            step()
        with backend.flags(enabled=False):
            products = _counter()
            with products:
                step()
        counts[name] = (int(fused.get_total_flops()), int(products.get_total_flops()))
        precisions[name] = ", ".join(sorted(fused.by_dtype)) or "not told"
    return counts, precisions


def check_formulas(budget: Budget) -> CheckResult:
    torch = torch_module()
    counts, precisions = layer_counts(torch, torch.device("cuda", torch.cuda.current_device()))
    problems = judge_formulas(counts)
    text = "; ".join(
        f"{name} {fused / 1e9:.4g} GFLOP fused ({precisions[name]}), {products / 1e9:.4g} as "
        "matrix products"
        for name, (fused, products) in counts.items()
    )
    details = {"counts": counts, "precisions": precisions}
    if problems:
        return CheckResult("formulas", FAIL, "; ".join(problems) + " — " + text, details)
    return CheckResult("formulas", PASS, text, details)
