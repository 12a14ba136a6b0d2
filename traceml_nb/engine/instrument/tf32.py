"""Whether float32 work may run on tensor cores (TF32) as torch is set, for each kind of
operator torch sets apart: matrix products (cuBLAS), convolutions and recurrent layers (cuDNN).
The FLOP count files a GPU's float32 FLOPs under the peak they run at by it.

Torch says it two ways: the legacy settings (``torch.set_float32_matmul_precision``,
``torch.backends.cudnn.allow_tf32``) and, in newer versions, ``fp32_precision`` — ``"tf32"``,
``"ieee"``, or ``"none"`` (as its parent says) — on ``torch.backends.cuda.matmul``,
``torch.backends.cudnn.conv`` and ``.rnn``, their parent ``torch.backends.cudnn``, and
``torch.backends``. Once a program has set the new ones, the legacy getters raise ("a mix of the
legacy and new APIs"), so the new ones are read first, each up its chain of parents.
"""

from __future__ import annotations

from typing import Any

MATMUL = "matmul"
CONV = "conv"
RNN = "rnn"

#: Each kind's settings, nearest first (attribute paths under ``torch.backends``).
_CHAINS = {
    MATMUL: ("cuda.matmul", ""),
    CONV: ("cudnn.conv", "cudnn", ""),
    RNN: ("cudnn.rnn", "cudnn", ""),
}


def tf32_allowed(kind: str) -> bool | None:
    """Whether float32 operators of ``kind`` (:data:`MATMUL`, :data:`CONV`, :data:`RNN`) may
    run as TF32; None where torch's settings cannot be read."""
    import torch

    for path in _CHAINS[kind]:
        owner: Any = torch.backends
        for name in filter(None, path.split(".")):
            owner = getattr(owner, name, None)
        try:
            precision = getattr(owner, "fp32_precision", None)
        except Exception:
            return None
        if precision not in ("tf32", "ieee", "none"):
            break  # a torch without these settings (or one that says something else): legacy
        if precision != "none":
            return precision == "tf32"
    try:
        if kind == MATMUL:
            return torch.get_float32_matmul_precision() != "highest"
        return bool(torch.backends.cudnn.allow_tf32)
    except Exception:
        return None
