"""The child process of the ``mapping`` check, run as
``python -m traceml_nb.selfcheck.mapping_child`` with the ``CUDA_VISIBLE_DEVICES`` under test.

It prints one line, ``SELFCHECK-CHILD`` and a JSON object: ``count`` (CUDA devices torch sees),
``uuid0`` (torch's UUID of ``cuda:0``, when there is one), and what a ``Run`` with samplers
made of it: ``device_kind``, ``gpu_tables`` (CUDA indices with a GPU sample table),
``gpu_events`` (whether it timed the steps with CUDA events) and ``gpu_events_why`` (why not).
"""

from __future__ import annotations

import json
import time
from typing import Any

MARKER = "SELFCHECK-CHILD "  #: the start of the result line the parent looks for


def main() -> None:
    import torch

    out: dict[str, Any] = {"count": torch.cuda.device_count() if torch.cuda.is_available() else 0}
    if out["count"]:
        out["uuid0"] = str(torch.cuda.get_device_properties(0).uuid)
    from ..engine.run import Run

    with Run("selfcheck-child", sample=True) as run:
        time.sleep(0.3)
    out["device_kind"] = run.device_kind
    out["gpu_tables"] = sorted(run.record.gpus)
    out["gpu_events"] = run.capabilities.ok("gpu_events")
    out["gpu_events_why"] = run.capabilities.why("gpu_events")
    print(MARKER + json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
