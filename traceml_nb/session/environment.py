"""The environment of a run: the hardware, the software versions, the code's commit, the dataset.

Captured once at the end of each run (never while it trains) and stored with it, so a later
comparison can say what differs besides the code. Every field is a plain JSON value; a value
that cannot be read is ``None`` (never a guess):

======================== =========================================================================
``gpu_name``             CUDA device name as PyTorch reports it (``None`` for a CPU run)
``gpu_memory_mb``        the device's total memory, MiB
``gpu_driver``           NVIDIA driver version (from NVML), e.g. ``"550.54.15"``
``cuda_version``         the CUDA version PyTorch was built with, e.g. ``"12.1"``
``gpu_compute_capability`` e.g. ``"7.5"`` (a T4), ``"9.0"`` (an H100/H200)
``gpu_count``            CUDA devices visible to the process
``torch_version``        ``torch.__version__``
``python_version``       e.g. ``"3.11.7"``
``traceml_nb_version``   the installed traceml_nb
``cpu_model``            the CPU's model name (``/proc/cpuinfo``, else ``platform``)
``cpus_available``       CPUs this process may run on (its affinity mask)
``cpu_count``            CPUs of the machine
``host_hash``            first 12 hex digits of SHA-256 of the host name (the name is not stored)
``git_commit``           ``HEAD`` of the git repository holding the working directory, or ``None``
``git_dirty``            the work tree had uncommitted changes (``None`` outside a repository)
``dataset_type``         the training loader's dataset class, e.g. ``"ImageFolder"``
``dataset_len``          its length (``None`` for an iterable dataset)
======================== =========================================================================

The *hardware class* (:func:`hardware_class`) is what baselines are matched on: the GPU model
for a GPU run, the CPU model and usable CPU count for a CPU run.
"""

from __future__ import annotations

import functools
import hashlib
import os
import platform
import socket
import subprocess
from typing import Any

from ..analysis.attribution import ENVIRONMENT_FIELDS
from ..sampling.host import cpus_available

#: Seconds each git command may take (a huge or network-mounted repository must not stall the
#: end of the cell); past it the commit is unknown.
GIT_TIMEOUT_S = 2.0


def hardware_class(env: dict[str, Any] | None) -> str:
    """``"GPU: Tesla T4"`` or ``"CPU: AMD EPYC 7B13 ×2"``: runs are compared within a class."""
    env = env or {}
    if env.get("gpu_name"):
        return f"GPU: {env['gpu_name']}"
    cpus = env.get("cpus_available")
    model = env.get("cpu_model") or "unknown CPU"
    return f"CPU: {model} \u00d7{cpus}" if cpus else f"CPU: {model}"


@functools.lru_cache(maxsize=1)
def _static() -> dict[str, Any]:
    """What cannot change within a process: versions, the CPU, the host."""
    try:
        from importlib.metadata import version

        own: str | None = version("traceml_nb")
    except Exception:
        own = None
    try:
        import torch

        torch_version: str | None = str(torch.__version__)
        cuda_version = torch.version.cuda
    except Exception:
        torch_version = cuda_version = None
    return {
        "torch_version": torch_version,
        "cuda_version": cuda_version,
        "python_version": platform.python_version(),
        "traceml_nb_version": own,
        "cpu_model": _cpu_model(),
        "cpu_count": os.cpu_count(),
        "host_hash": hashlib.sha256(socket.gethostname().encode()).hexdigest()[:12],
    }


def _cpu_model() -> str | None:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as fh:
            for line in fh:
                key, _, value = line.partition(":")
                if key.strip() in ("model name", "Model", "cpu model") and value.strip():
                    return " ".join(value.split())
    except OSError:
        pass
    return platform.processor() or platform.machine() or None


@functools.lru_cache(maxsize=8)
def _gpu(index: int) -> dict[str, Any]:
    """The CUDA device ``index`` (cached: it does not change within a process)."""
    out: dict[str, Any] = {}
    try:
        import torch

        if not torch.cuda.is_available():
            return out
        props = torch.cuda.get_device_properties(index)
        out["gpu_name"] = str(props.name)
        out["gpu_memory_mb"] = round(props.total_memory / (1024 * 1024))
        out["gpu_compute_capability"] = f"{props.major}.{props.minor}"
        out["gpu_count"] = torch.cuda.device_count()
    except Exception:
        return out
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            driver = pynvml.nvmlSystemGetDriverVersion()
            out["gpu_driver"] = driver.decode() if isinstance(driver, bytes) else str(driver)
        finally:
            pynvml.nvmlShutdown()
    except Exception:
        pass
    return out


def _git(cwd: str) -> dict[str, Any]:
    """``git_commit`` and ``git_dirty`` of the repository holding ``cwd`` (None outside one)."""

    def git(*args: str) -> str | None:
        try:
            done = subprocess.run(
                ["git", *args],
                cwd=cwd,
                capture_output=True,
                text=True,
                timeout=GIT_TIMEOUT_S,
                check=False,
            )
        except (OSError, subprocess.SubprocessError):
            return None
        return done.stdout if done.returncode == 0 else None

    commit = git("rev-parse", "HEAD")
    if not commit:
        return {"git_commit": None, "git_dirty": None}
    status = git("status", "--porcelain", "--untracked-files=no")
    return {"git_commit": commit.strip(), "git_dirty": None if status is None else bool(status)}


def capture_environment(run: Any, *, cwd: str | None = None) -> dict[str, Any]:
    """The environment of the ended ``run`` (a :class:`traceml_nb.run.Run` or alike: its
    ``device_kind``, ``cuda_index`` and ``record.loaders`` are read), as a dict of the fields
    in the module docstring. Never raises: what cannot be read is ``None``."""
    env: dict[str, Any] = dict.fromkeys(ENVIRONMENT_FIELDS)
    env.update({"dataset_type": None, "dataset_len": None})
    try:
        env.update(_static())
        env["cpus_available"] = cpus_available()
        if getattr(run, "device_kind", "cpu") == "cuda":
            env.update(_gpu(int(getattr(run, "cuda_index", 0) or 0)))
        env.update(_git(cwd or os.getcwd()))
        loaders = list(getattr(getattr(run, "record", None), "loaders", ()) or ())
        training = [info for info in loaders if getattr(info, "is_training", False)]
        main = (training or loaders or [None])[0]
        if main is not None:
            env["dataset_type"] = main.dataset_type
            env["dataset_len"] = main.dataset_len
    except Exception:
        pass
    return env
