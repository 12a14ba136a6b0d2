"""The environment of a run: the hardware, the software versions, the code's commit, the dataset.

Captured once at the end of each run (never while it trains) and stored with it, so a later
comparison can say what differs besides the code. Every field is a plain JSON value; a value
that cannot be read is ``None`` (never a guess), and for a GPU field of a CUDA run
``unavailable`` says why:

======================== =========================================================================
``device_kind``          ``"cuda"`` or ``"cpu"``: what the run trained on
``gpu_name``             the CUDA device's name (PyTorch's, else NVML's); ``None`` for a CPU run
``gpu_memory_mb``        the device's total memory, MiB (PyTorch's, else NVML's)
``gpu_driver``           NVIDIA driver version (from NVML), e.g. ``"550.54.15"``
``cuda_version``         the CUDA version PyTorch was built with, e.g. ``"12.1"``
``gpu_compute_capability`` e.g. ``"7.5"`` (a T4), ``"9.0"`` (an H100/H200); PyTorch's, else NVML's
``gpu_count``            CUDA devices visible to the process (PyTorch)
``torch_version``        ``torch.__version__``
``python_version``       e.g. ``"3.11.7"``
``traceml_nb_version``   the installed traceml_nb
``cpu_model``            the CPU's model name (``/proc/cpuinfo``, else ``platform``)
``cpus_available``       CPUs this process may run on (its affinity mask)
``cpu_count``            CPUs of the machine
``host_hash``            first 12 hex digits of SHA-256 of the host name (the name is not stored)
``git_commit``           ``HEAD`` of the git repository holding the working directory, or ``None``
``git_dirty``            the work tree had uncommitted changes (``None`` outside a repository)
``git_diff_sha``         first 16 hex digits of SHA-256 of ``git diff HEAD`` when the work tree is
                         dirty; ``None`` when clean, outside a repository, or git failed
``script_sha``           first 16 hex digits of SHA-256 of the main script's source (the bytes of
                         ``__main__.__file__``, a ``.py`` file); ``None`` in an IPython kernel or
                         shell, for ``python -c`` and when the file cannot be read
``script_args_sha``      first 16 hex digits of SHA-256 of the main script's arguments
                         (``sys.argv[1:]``, each ended by a NUL byte): never the arguments, which
                         may hold secrets; ``None`` where ``script_sha`` is
``script_args``          ...and each argument by name -> 16 hex digits of SHA-256 of its value
                         (:func:`argument_values`: ``--model big`` as ``--model``, a positional
                         one by its place, ``argument 1``): the names, never the values;
                         ``None`` where ``script_sha`` is
``cell_definitions``     a ``%%traceml`` cell's: name -> 16 hex digits of SHA-256 of the source of
                         each function and class of the notebook the cell uses (defined in other
                         cells: :mod:`traceml_nb.notebook.cell_definitions`); ``None`` elsewhere
``cell_values``          ...and name -> the plain value each name it reads holds, as written
                         (``512``, ``torch.bfloat16``; a string as ``str:`` and a hash); ``None``
                         elsewhere
``dataset_type``         the training loader's dataset class, e.g. ``"ImageFolder"``
``dataset_len``          its length (``None`` for an iterable dataset)
``unavailable``          field -> why it is ``None`` (a CUDA run's GPU fields and CUDA version)
======================== =========================================================================

PyTorch describes the device the run used; NVML is read through the package's own binding
(:mod:`traceml_nb.engine.sampling.nvml_binding`) for the driver, and for the device matched to the
CUDA index (:func:`~traceml_nb.engine.sampling.gpu_devices.match_cuda_device`) where PyTorch could not
say.

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
import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ..analysis.attribution import ENVIRONMENT_FIELDS
from ..engine.sampling import nvml_binding as nb
from ..engine.sampling.gpu_devices import (
    CudaDeviceIds,
    device_ids_of,
    list_nvml_devices,
    match_cuda_device,
)
from ..engine.sampling.host_readers import cpus_available

if TYPE_CHECKING:
    from ..engine.run import Run

#: Seconds each git command may take (a huge or network-mounted repository must not stall the
#: end of the cell); past it the commit is unknown.
GIT_TIMEOUT_S = 2.0
#: Hex digits of SHA-256 kept in ``script_sha``, ``script_args_sha`` and ``git_diff_sha``.
SHA_HEX_DIGITS = 16
#: The fields :func:`gpu_environment` reads.
GPU_FIELDS = ("gpu_name", "gpu_memory_mb", "gpu_driver", "gpu_compute_capability", "gpu_count")
#: The fields NVML stands in for when PyTorch cannot read them.
_NVML_STANDS_IN = ("gpu_name", "gpu_memory_mb", "gpu_compute_capability")
NO_CUDA_VERSION = "PyTorch reports no CUDA version (torch.version.cuda is None)"


def hardware_class(env: dict[str, Any] | None) -> str:
    """``"GPU: Tesla T4"`` or ``"CPU: AMD EPYC 7B13 ×2"``: runs are compared within a class.

    A GPU run whose model could not be read is ``"GPU: unknown model (compute capability 7.5,
    15360 MiB)"`` (what is known of it), never a CPU class."""
    env = env or {}
    if env.get("gpu_name"):
        return f"GPU: {env['gpu_name']}"
    if env.get("device_kind") == "cuda":
        known = []
        if env.get("gpu_compute_capability"):
            known.append(f"compute capability {env['gpu_compute_capability']}")
        if env.get("gpu_memory_mb"):
            known.append(f"{env['gpu_memory_mb']} MiB")
        return "GPU: unknown model" + (f" ({', '.join(known)})" if known else "")
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


def _failure(exc: BaseException) -> str:
    """One line for an exception (no traceback)."""
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


def _torch_cuda() -> Any:
    try:
        import torch
    except ImportError:
        return None
    return torch.cuda


def _from_torch(index: int, cuda: Any, values: dict[str, Any]) -> tuple[str, CudaDeviceIds]:
    """Fill ``values`` from PyTorch's view of ``cuda:index``; ``(why the device's properties
    could not be read or '', its ids for matching it in NVML)``."""
    if cuda is None:
        return "PyTorch is not installed", CudaDeviceIds()
    try:
        if not cuda.is_available():
            return "PyTorch's CUDA is not available in this process", CudaDeviceIds()
    except Exception as exc:
        return f"PyTorch's CUDA failed ({_failure(exc)})", CudaDeviceIds()
    try:
        values["gpu_count"] = int(cuda.device_count())
    except Exception:
        pass  # said by the caller
    try:
        props = cuda.get_device_properties(index)
        name, total = str(props.name), int(props.total_memory)
        capability = f"{int(props.major)}.{int(props.minor)}"
    except Exception as exc:
        return f"PyTorch could not describe cuda:{index} ({_failure(exc)})", CudaDeviceIds()
    values.update(gpu_name=name, gpu_memory_mb=round(total / nb.MIB))
    values["gpu_compute_capability"] = capability
    return "", device_ids_of(props)


def _nvml_failure(nvml: Any, exc: BaseException) -> str:
    return nb.error_text(exc) if nb.is_nvml_error(nvml, exc) else _failure(exc)


def _from_nvml(
    index: int,
    nvml: Any,
    ids: CudaDeviceIds,
    environ: Mapping[str, str],
    values: dict[str, Any],
    why: dict[str, str],
) -> str:
    """Fill the driver and, for the NVML device matched to ``cuda:index``, the fields PyTorch
    left ``None``; each field NVML failed on gets its reason in ``why``. Returns why the
    device itself could not be read ('' when it could, or was not needed)."""
    try:
        values["gpu_driver"] = nb.driver_version(nvml)
    except Exception as exc:
        why["gpu_driver"] = _nvml_failure(nvml, exc)
    if all(values[f] is not None for f in _NVML_STANDS_IN):
        return ""
    try:
        devices, handles = list_nvml_devices(nvml)
    except Exception as exc:
        return f"NVML could not list the GPUs ({_nvml_failure(nvml, exc)})"
    match = match_cuda_device(
        index, ids, devices, environ.get("CUDA_VISIBLE_DEVICES"), environ.get("CUDA_DEVICE_ORDER")
    )
    if match is None:
        return f"cuda:{index} could not be matched to an NVML device"
    handle = handles[match.device]
    reads = {
        "gpu_name": lambda: nb.name(nvml, handle),
        "gpu_memory_mb": lambda: round(nb.memory_mib(nvml, handle)[1]),
        "gpu_compute_capability": lambda: nb.cuda_compute_capability(nvml, handle),
    }
    for field, read in reads.items():
        if values[field] is None:
            try:
                values[field] = read()
            except Exception as exc:
                why[field] = _nvml_failure(nvml, exc)
    return ""


def gpu_environment(
    index: int,
    *,
    cuda: Any = None,
    nvml: Any = None,
    environ: Mapping[str, str] | None = None,
) -> tuple[dict[str, Any], dict[str, str]]:
    """The :data:`GPU_FIELDS` of CUDA device ``index`` and, for each that is ``None``, why.

    PyTorch (``torch.cuda.get_device_properties``, ``device_count``) gives the name, the
    memory, the compute capability and the count; NVML (:func:`nb.start_nvml`) gives the
    driver, and stands in for the first three where PyTorch could not read them. ``cuda``
    injects ``torch.cuda``, ``nvml`` the NVML module and ``environ`` the environment variables
    (tests); by default the real ones. Never raises; NVML is shut down again.
    """
    values: dict[str, Any] = dict.fromkeys(GPU_FIELDS)
    why: dict[str, str] = {}
    torch_why, ids = _from_torch(index, _torch_cuda() if cuda is None else cuda, values)
    module, nvml_why = nb.start_nvml(nvml)
    if module is not None:
        try:
            nvml_why = _from_nvml(
                index, module, ids, os.environ if environ is None else environ, values, why
            )
        except Exception as exc:  # a fault of ours or the binding's: still a reason
            nvml_why = f"NVML failed ({_failure(exc)})"
        finally:
            nb.shutdown(module)
    else:
        why["gpu_driver"] = nvml_why
    for field in GPU_FIELDS:
        if values[field] is not None:
            why.pop(field, None)
        elif field == "gpu_count":
            why[field] = torch_why or "PyTorch could not count the CUDA devices"
        elif field in _NVML_STANDS_IN:
            parts = [torch_why, why.get(field) or nvml_why]
            why[field] = "; ".join(p for p in parts if p) or "not reported"
        elif field not in why:
            why[field] = nvml_why or "not reported"
    return values, why


@functools.lru_cache(maxsize=8)
def _gpu(index: int) -> tuple[dict[str, Any], dict[str, str]]:
    """:func:`gpu_environment` of the real device ``index`` (cached: it does not change
    within a process)."""
    return gpu_environment(index)


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:SHA_HEX_DIGITS]


def _git(cwd: str) -> dict[str, Any]:
    """``git_commit``, ``git_dirty`` and ``git_diff_sha`` of the repository holding ``cwd``
    (None outside one)."""

    def git(*args: str) -> bytes | None:
        try:
            done = subprocess.run(
                ["git", *args],
                cwd=cwd,
                capture_output=True,
                timeout=GIT_TIMEOUT_S,
                check=False,
            )
        except (OSError, subprocess.SubprocessError):
            return None
        return done.stdout if done.returncode == 0 else None

    commit = git("rev-parse", "HEAD")
    if not commit:
        return {"git_commit": None, "git_dirty": None, "git_diff_sha": None}
    status = git("status", "--porcelain", "--untracked-files=no")
    dirty = None if status is None else bool(status)
    diff = None
    if dirty:  # the user's diff tools and text conversions left out: the bytes git stores
        diff = git("diff", "--no-ext-diff", "--no-textconv", "--no-color", "HEAD")
    return {
        "git_commit": commit.decode("utf-8", "replace").strip(),
        "git_dirty": dirty,
        "git_diff_sha": None if diff is None else _sha(diff),
    }


def _in_ipython() -> bool:
    """This process is an IPython kernel or shell (its ``__main__`` is not a script)."""
    ipython = sys.modules.get("IPython")
    get = getattr(ipython, "get_ipython", None)
    try:
        return get is not None and get() is not None
    except Exception:
        return False


@functools.lru_cache(maxsize=4)
def _file_sha(path: str) -> str | None:
    """:func:`_sha` of the file at ``path``, read once per process (the code that ran is the
    code first read, not a later edit); None when it cannot be read."""
    try:
        with open(path, "rb") as fh:
            return _sha(fh.read())
    except OSError:
        return None


def script_sha() -> str | None:
    """``script_sha``: the hash of the main script's source, or None (see the module
    docstring)."""
    if _in_ipython():
        return None
    path = getattr(sys.modules.get("__main__"), "__file__", None)
    if not isinstance(path, str) or not path.endswith(".py") or not os.path.isfile(path):
        return None
    return _file_sha(os.path.abspath(path))


def script_args_sha(argv: list[str] | None = None) -> str:
    """``script_args_sha``: the hash of ``argv`` (default ``sys.argv[1:]``); one of the main
    script's runs only (an IPython kernel's arguments name its connection file)."""
    return _args_sha(sys.argv[1:] if argv is None else argv)


def _args_sha(args: list[str]) -> str:
    """The hash of ``args``, each ended by a NUL byte (so ``a b`` is not ``ab``)."""
    return _sha(b"".join(arg.encode("utf-8", "surrogateescape") + b"\0" for arg in args))


def argument_values(argv: list[str] | None = None) -> dict[str, str]:
    """``script_args``: the main script's arguments (default ``sys.argv[1:]``) by name, each
    -> the hash of its value, as an argument parser reads them: ``--model big`` and
    ``--model=big`` as ``--model``; an option followed by another option or by nothing a flag
    (``--fp16``, the hash of ""); any other argument, and every one after ``--``, positional,
    named by its place (``argument 1``). An option given twice hashes its values in order.
    Which of them repeat from run to run tells a script's runs apart
    (:mod:`traceml_nb.analysis.variants`)."""
    args = sys.argv[1:] if argv is None else argv
    given: dict[str, list[str]] = {}
    positional = 0
    options = True
    i = 0
    while i < len(args):
        arg = args[i]
        i += 1
        if options and arg == "--":
            options = False
        elif options and _is_option(arg):
            name, equals, value = arg.partition("=")
            if not equals and i < len(args) and not _is_option(args[i]):
                value, i = args[i], i + 1
            given.setdefault(name, []).append(value)
        else:
            positional += 1
            given[f"argument {positional}"] = [arg]
    return {name: _args_sha(values) for name, values in given.items()}


def _is_option(arg: str) -> bool:
    """``-m``, ``--lr=0.1``; not ``-``, ``-0.5`` (a negative number is a value)."""
    if not arg.startswith("-") or arg == "-":
        return False
    try:
        float(arg)
    except ValueError:
        return True
    return False


def capture_environment(
    run: Run,
    *,
    cwd: str | None = None,
    cuda: Any = None,
    nvml: Any = None,
    environ: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """The environment of the ended ``run`` (a :class:`traceml_nb.engine.run.Run` or alike: its
    ``device_kind``, ``cuda_index`` and ``record.loaders`` are read), as a dict of the fields
    in the module docstring. ``cuda``, ``nvml`` and ``environ`` inject the hardware's side
    (:func:`gpu_environment`). Never raises: what cannot be read is ``None``."""
    env: dict[str, Any] = dict.fromkeys(ENVIRONMENT_FIELDS)
    env.update({"dataset_type": None, "dataset_len": None})
    env.update({"git_diff_sha": None, "script_sha": None, "script_args_sha": None})
    env["script_args"] = None
    env.update({"cell_definitions": None, "cell_values": None})
    unavailable: dict[str, str] = {}
    env["unavailable"] = unavailable
    try:
        env.update(_static())
        env["cpus_available"] = cpus_available()
        kind = "cuda" if getattr(run, "device_kind", "cpu") == "cuda" else "cpu"
        env["device_kind"] = kind
        if kind == "cuda":
            index = int(getattr(run, "cuda_index", 0) or 0)
            if cuda is None and nvml is None and environ is None:
                values, why = _gpu(index)
            else:
                values, why = gpu_environment(index, cuda=cuda, nvml=nvml, environ=environ)
            env.update(values)
            unavailable.update(why)
            if env.get("cuda_version") is None:
                unavailable["cuda_version"] = NO_CUDA_VERSION
        env.update(_git(cwd or os.getcwd()))
        for field, attribute in (("cell_definitions", "definitions"), ("cell_values", "values")):
            found = getattr(run, attribute, None)
            env[field] = dict(found) if isinstance(found, dict) else None
        env["script_sha"] = script_sha()
        if env["script_sha"] is not None:
            env["script_args_sha"] = script_args_sha()
            env["script_args"] = argument_values()
        loaders = list(getattr(getattr(run, "record", None), "loaders", ()) or ())
        training = [info for info in loaders if getattr(info, "is_training", False)]
        main = (training or loaders or [None])[0]
        if main is not None:
            env["dataset_type"] = main.dataset_type
            env["dataset_len"] = main.dataset_len
    except Exception:
        pass
    return env
