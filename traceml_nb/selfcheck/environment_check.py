"""The ``env`` check: what the self-check runs on (Python, torch and its CUDA, the visible
devices). Informative only: it never fails."""

from __future__ import annotations

import os
import platform

from .cuda import torch_module
from .results import INFO, Budget, CheckResult


def check_environment(budget: Budget) -> CheckResult:
    torch = torch_module()
    props = [torch.cuda.get_device_properties(i) for i in range(torch.cuda.device_count())]
    details = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "devices": [
            {
                "index": i,
                "name": p.name,
                "capability": f"{p.major}.{p.minor}",
                "memory_gb": p.total_memory / 1e9,
            }
            for i, p in enumerate(props)
        ],
    }
    names = ", ".join(f"cuda:{d['index']} {d['name']}" for d in details["devices"])
    return CheckResult(
        "env",
        INFO,
        f"torch {torch.__version__} (CUDA {torch.version.cuda}), {names}; "
        f"CUDA_VISIBLE_DEVICES={details['cuda_visible_devices']!r}",
        details,
    )
