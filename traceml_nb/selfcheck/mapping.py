"""The ``mapping`` check: ``CUDA_VISIBLE_DEVICES``. Each torch device index must map to the
NVML device of the same UUID (and PCI bus), also in a child process that sees one GPU by its
UUID; and with ``CUDA_VISIBLE_DEVICES=''`` a run must fall back to CPU with a reason.

The children run :mod:`traceml_nb.selfcheck.mapping_child` with the variable set.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

from .cuda import torch_module
from .mapping_child import MARKER
from .nvml import nvml_handle_for_cuda, uuid_key, uuid_text
from .results import FAIL, PASS, Budget, CheckResult

CHILD_MODULE = "traceml_nb.selfcheck.mapping_child"


def run_child(env_value: str, timeout: float) -> dict[str, Any]:
    """What :mod:`~traceml_nb.selfcheck.mapping_child` reports with
    ``CUDA_VISIBLE_DEVICES=env_value``; ``RuntimeError`` (with its stderr) when it prints no
    result."""
    env = dict(os.environ, CUDA_VISIBLE_DEVICES=env_value)
    proc = subprocess.run(
        [sys.executable, "-m", CHILD_MODULE],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    for line in proc.stdout.splitlines():
        if line.startswith(MARKER):
            return dict(json.loads(line[len(MARKER) :]))
    raise RuntimeError(
        f"child with CUDA_VISIBLE_DEVICES={env_value!r} failed: {proc.stderr.strip()[-500:]}"
    )


def check_mapping(budget: Budget) -> CheckResult:
    torch = torch_module()
    import pynvml

    problems: list[str] = []
    mapping: dict[str, Any] = {}
    pynvml.nvmlInit()
    try:
        for i in range(torch.cuda.device_count()):
            props = torch.cuda.get_device_properties(i)
            try:
                handle = nvml_handle_for_cuda(pynvml, torch, i)
            except LookupError as exc:
                problems.append(str(exc))
                continue
            pci = pynvml.nvmlDeviceGetPciInfo(handle)
            nvml_index = pynvml.nvmlDeviceGetIndex(handle)
            mapping[f"cuda:{i}"] = {"nvml_index": nvml_index, "uuid": uuid_text(props.uuid)}
            bus = getattr(props, "pci_bus_id", None)
            if bus is not None and (bus, props.pci_device_id) != (pci.bus, pci.device):
                problems.append(
                    f"cuda:{i} PCI {bus}:{props.pci_device_id} != NVML {pci.bus}:{pci.device}"
                )
        last = torch.cuda.device_count() - 1
        # as CUDA_VISIBLE_DEVICES names a GPU by UUID: GPU- and the dashed hex
        target_uuid = "GPU-" + uuid_text(torch.cuda.get_device_properties(last).uuid)
    finally:
        pynvml.nvmlShutdown()
    for line in (f"{k} -> NVML {v['nvml_index']} ({v['uuid']})" for k, v in mapping.items()):
        print("  " + line, flush=True)
    children: dict[str, Any] = {}
    if budget.allows(40):
        child = run_child(target_uuid, timeout=min(60.0, budget.remaining() - 10))
        children[target_uuid] = child
        print(f"  CUDA_VISIBLE_DEVICES={target_uuid}: {child}", flush=True)
        if child["count"] != 1:
            problems.append(
                f"with CUDA_VISIBLE_DEVICES={target_uuid} torch sees {child['count']} devices, not 1"
            )
        elif uuid_key(child.get("uuid0", "")) != uuid_key(target_uuid):
            problems.append(
                f"with CUDA_VISIBLE_DEVICES={target_uuid} cuda:0 is {child.get('uuid0')}"
            )
        if child["device_kind"] != "cuda" or not child["gpu_events"]:
            problems.append(f"a run in that child did not use the GPU: {child}")
    else:
        problems.append("out of time budget for the child processes")
    if budget.allows(25):
        child = run_child("", timeout=min(60.0, budget.remaining() - 5))
        children[""] = child
        print(f"  CUDA_VISIBLE_DEVICES='': {child}", flush=True)
        if (
            child["count"] != 0
            or child["device_kind"] != "cpu"
            or child["gpu_events"]
            or not child["gpu_events_why"]
        ):
            problems.append(
                f"with no visible device a run should fall back to CPU with a reason: {child}"
            )
    details = {"mapping": mapping, "children": children, "problems": problems}
    summary = ", ".join(f"{k}->NVML {v['nvml_index']}" for k, v in mapping.items())
    if problems:
        return CheckResult("mapping", FAIL, summary + "; " + "; ".join(problems), details)
    return CheckResult(
        "mapping", PASS, summary + "; one-GPU child by UUID and no-GPU child behave", details
    )
