"""The GPU fields of a run's environment, read through PyTorch and the package's own NVML
binding: with the fakes at the hardware boundary (``fake_cuda.FakeCuda`` for ``torch.cuda``,
``fake_nvml.FakeNvml`` raising the real pynvml errors), every failure path, the real NVML
failure of a CPU machine, and the hardware class baselines are matched on."""

from __future__ import annotations

import ast
import sys
from pathlib import Path
from types import SimpleNamespace

import pynvml
import pytest
from fake_cuda import A100_40GB, TESLA_T4, FakeCuda, with_uuid
from fake_nvml import MIB, FakeField, FakeGpu, FakeNvml, make_gpus
from store_helpers import make_run

from traceml_nb.engine.sampling import nvml_binding as nb
from traceml_nb.session import environment as env_mod
from traceml_nb.session.check import check as run_check
from traceml_nb.session.environment import (
    GPU_FIELDS,
    NO_CUDA_VERSION,
    capture_environment,
    gpu_environment,
    hardware_class,
)
from traceml_nb.session.session import Session
from traceml_nb.session.store import Store

T4_MIB = round(TESLA_T4.total_memory / MIB)
A100_MIB = round(A100_40GB.total_memory / MIB)
CUDA_ERROR = RuntimeError("CUDA error: unspecified launch failure\nCUDA kernel errors ...")
TORCH_FAILED = (
    "PyTorch could not describe cuda:0 (RuntimeError: CUDA error: unspecified launch failure)"
)


def t4_gpu(**kwargs) -> FakeGpu:
    gpu = FakeGpu("GPU-7e57aaaa-0000-1111-2222-333344445555", name="Tesla T4", **kwargs)
    gpu.set("compute_capability", (7, 5))
    return gpu


def t4(nvml_gpu: FakeGpu | None = None, **kwargs) -> FakeCuda:
    """A T4 as PyTorch sees it (the same UUID as ``nvml_gpu``'s)."""
    props = with_uuid(TESLA_T4, nvml_gpu.uuid) if nvml_gpu is not None else TESLA_T4
    return FakeCuda([props], **kwargs)


def cuda_run(index: int = 0) -> SimpleNamespace:
    """What capture_environment reads of an ended CUDA run."""
    return SimpleNamespace(device_kind="cuda", cuda_index=index, record=None)


def assert_nvml_closed(nvml: FakeNvml) -> None:
    assert nvml.inits == nvml.shutdowns, (nvml.inits, nvml.shutdowns)


# --- what a working GPU gives ----------------------------------------------------------------
def test_torch_describes_the_device_and_nvml_gives_the_driver():
    gpu = t4_gpu()
    nvml = FakeNvml([gpu])
    values, why = gpu_environment(0, cuda=t4(gpu), nvml=nvml, environ={})
    assert values == {
        "gpu_name": "Tesla T4",
        "gpu_memory_mb": T4_MIB,
        "gpu_driver": "550.54.15",
        "gpu_compute_capability": "7.5",
        "gpu_count": 1,
    }
    assert why == {}
    assert nvml.inits == 1
    assert_nvml_closed(nvml)
    assert nvml.calls["nvmlDeviceGetCount"] == 0  # PyTorch said it all: no device lookup


def test_capture_environment_of_a_cuda_run():
    gpu = t4_gpu()
    env = capture_environment(cuda_run(), cuda=t4(gpu), nvml=FakeNvml([gpu]), environ={})
    assert env["device_kind"] == "cuda"
    assert (env["gpu_name"], env["gpu_memory_mb"], env["gpu_compute_capability"]) == (
        "Tesla T4",
        T4_MIB,
        "7.5",
    )
    assert env["gpu_driver"] == "550.54.15" and env["gpu_count"] == 1
    if env["cuda_version"] is None:  # this torch is a CPU build
        assert env["unavailable"] == {"cuda_version": NO_CUDA_VERSION}
    else:
        assert env["unavailable"] == {}
    assert hardware_class(env) == "GPU: Tesla T4"


def test_a_cpu_run_has_no_gpu_fields_and_nothing_to_excuse():
    env = capture_environment(SimpleNamespace(device_kind="cpu", record=None))
    assert env["device_kind"] == "cpu"
    assert all(env[f] is None for f in GPU_FIELDS)
    assert env["unavailable"] == {}  # not unavailable: there is no GPU to describe
    assert hardware_class(env).startswith("CPU: ")


# --- NVML's failures ---------------------------------------------------------------------------
def test_nvml_not_installed(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # `import pynvml` raises ImportError
    values, why = gpu_environment(0, cuda=t4(), environ={})
    assert values["gpu_driver"] is None
    assert why == {
        "gpu_driver": (
            "nvidia-ml-py, the pynvml module, is not installed, so GPU counters cannot be read"
        )
    }
    assert values["gpu_name"] == "Tesla T4" and values["gpu_compute_capability"] == "7.5"


@pytest.mark.parametrize(
    ("code", "reason"),
    [
        (pynvml.NVML_ERROR_DRIVER_NOT_LOADED, "the NVIDIA driver is not loaded"),
        (pynvml.NVML_ERROR_LIBRARY_NOT_FOUND, "libnvidia-ml, was not found"),
        (pynvml.NVML_ERROR_NO_PERMISSION, "NVML: Insufficient Permissions"),
    ],
)
def test_nvml_init_failing(code, reason):
    nvml = FakeNvml([t4_gpu()], init_error=code)
    values, why = gpu_environment(0, cuda=t4(), nvml=nvml, environ={})
    assert values["gpu_driver"] is None and reason in why["gpu_driver"]
    assert "\n" not in why["gpu_driver"] and "NVMLError" not in why["gpu_driver"]
    assert set(why) == {"gpu_driver"}  # PyTorch's fields are still there
    assert nvml.shutdowns == 0  # never started: nothing to shut down


def test_the_driver_call_raising():
    gpu = t4_gpu()
    nvml = FakeNvml([gpu], driver=FakeField(error=pynvml.NVML_ERROR_NOT_SUPPORTED))
    values, why = gpu_environment(0, cuda=t4(gpu), nvml=nvml, environ={})
    assert values["gpu_driver"] is None
    assert why == {"gpu_driver": "NVML: Not Supported"}
    assert values["gpu_name"] == "Tesla T4"
    assert_nvml_closed(nvml)


def test_the_real_nvml_of_this_machine():
    """The real path: the package's binding loads the real pynvml. On a CPU machine
    ``nvmlInit`` really fails, and the reason is the binding's one line."""
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        values, why = gpu_environment(0, cuda=t4(), environ={})
        assert values["gpu_driver"] is None
        assert why["gpu_driver"] == nb.init_failure_reason(exc)
        return
    try:
        driver = nb.text(pynvml.nvmlSystemGetDriverVersion())
    finally:
        pynvml.nvmlShutdown()
    values, why = gpu_environment(0, cuda=t4(), environ={})
    assert values["gpu_driver"] == driver and "gpu_driver" not in why


# --- PyTorch's failures: NVML stands in ----------------------------------------------------------
def test_nvml_stands_in_when_torch_cannot_describe_the_device():
    gpu = t4_gpu(memory_total_mib=15360.0)
    nvml = FakeNvml([gpu])
    values, why = gpu_environment(0, cuda=t4(properties_error=CUDA_ERROR), nvml=nvml, environ={})
    assert values == {
        "gpu_name": "Tesla T4",
        "gpu_memory_mb": 15360,  # NVML's figure (PyTorch's is a little lower)
        "gpu_driver": "550.54.15",
        "gpu_compute_capability": "7.5",
        "gpu_count": 1,  # device_count still answered
    }
    assert why == {}
    assert_nvml_closed(nvml)


def test_nvml_reads_the_device_cuda_numbers_0_not_nvmls_0():
    """CUDA_VISIBLE_DEVICES=1: cuda:0 is NVML's GPU 1 (PyTorch gave no UUID to match)."""
    gpus = make_gpus(2)
    gpus[1].set("name", "NVIDIA A100-SXM4-40GB")
    nvml = FakeNvml(gpus)
    values, why = gpu_environment(
        0,
        cuda=FakeCuda([TESLA_T4], properties_error=CUDA_ERROR),
        nvml=nvml,
        environ={"CUDA_VISIBLE_DEVICES": "1"},
    )
    assert values["gpu_name"] == "NVIDIA A100-SXM4-40GB"
    assert why == {}


def test_a_field_call_raising_after_torch_failed_gives_both_reasons():
    gpu = t4_gpu()
    gpu.set("compute_capability", error=pynvml.NVML_ERROR_NOT_SUPPORTED)
    nvml = FakeNvml([gpu])
    values, why = gpu_environment(0, cuda=t4(properties_error=CUDA_ERROR), nvml=nvml, environ={})
    assert values["gpu_compute_capability"] is None
    assert why == {"gpu_compute_capability": f"{TORCH_FAILED}; NVML: Not Supported"}
    assert values["gpu_name"] == "Tesla T4"  # the other fields are still read
    assert_nvml_closed(nvml)


def test_an_old_binding_without_the_call_is_a_reason_too():
    nvml = FakeNvml([t4_gpu()], missing={"nvmlDeviceGetCudaComputeCapability"})
    values, why = gpu_environment(0, cuda=t4(properties_error=CUDA_ERROR), nvml=nvml, environ={})
    assert values["gpu_compute_capability"] is None
    assert why["gpu_compute_capability"].startswith(f"{TORCH_FAILED}; AttributeError: ")
    assert_nvml_closed(nvml)


def test_a_device_nvml_cannot_match_says_so():
    nvml = FakeNvml(make_gpus(2))  # two GPUs, no UUID from PyTorch, no CUDA_VISIBLE_DEVICES...
    values, why = gpu_environment(
        1,  # ...and a CUDA index NVML does not have: not even a match by position
        cuda=FakeCuda([TESLA_T4, TESLA_T4, TESLA_T4], properties_error=CUDA_ERROR),
        nvml=nvml,
        environ={"CUDA_VISIBLE_DEVICES": "GPU-ffff"},
    )
    assert values["gpu_name"] is None and values["gpu_driver"] == "550.54.15"
    assert why["gpu_name"] == (
        "PyTorch could not describe cuda:1 (RuntimeError: CUDA error: unspecified launch "
        "failure); cuda:1 could not be matched to an NVML device"
    )
    assert_nvml_closed(nvml)


def test_listing_the_gpus_failing_is_a_reason():
    gpu = t4_gpu()
    gpu.set("uuid", error=pynvml.NVML_ERROR_GPU_IS_LOST)
    nvml = FakeNvml([gpu])
    values, why = gpu_environment(0, cuda=t4(properties_error=CUDA_ERROR), nvml=nvml, environ={})
    assert values["gpu_name"] is None
    assert why["gpu_name"] == f"{TORCH_FAILED}; NVML could not list the GPUs (NVML: GPU is lost)"
    assert_nvml_closed(nvml)


def test_everything_failing_leaves_every_field_unavailable_with_a_reason():
    cuda = FakeCuda([TESLA_T4], properties_error=CUDA_ERROR, count_error=CUDA_ERROR)
    nvml = FakeNvml([], init_error=pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)
    env = capture_environment(cuda_run(), cuda=cuda, nvml=nvml, environ={})
    missing = nb.init_failure_reason(pynvml.NVMLError(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND))
    assert all(env[f] is None for f in GPU_FIELDS)
    assert env["unavailable"]["gpu_name"] == f"{TORCH_FAILED}; {missing}"
    assert env["unavailable"]["gpu_driver"] == missing
    assert env["unavailable"]["gpu_count"] == TORCH_FAILED
    assert set(GPU_FIELDS) <= set(env["unavailable"])
    # still a GPU run: never compared with the CPU runs of this machine
    assert hardware_class(env) == "GPU: unknown model"


def test_torch_without_cuda_is_a_reason():
    values, why = gpu_environment(
        0, cuda=FakeCuda([], available=False), nvml=FakeNvml([]), environ={}
    )
    assert values["gpu_count"] is None
    assert why["gpu_count"] == "PyTorch's CUDA is not available in this process"


def test_the_environment_reads_nvml_only_through_the_binding():
    """One way to NVML: environment.py imports no pynvml of its own."""
    tree = ast.parse(Path(env_mod.__file__).read_text())
    imported = [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
    imported += [n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
    assert not [m for m in imported if m.split(".")[0] == "pynvml"], imported


# --- the hardware class --------------------------------------------------------------------------
def test_the_hardware_class_of_a_gpu_run_without_a_name_says_what_is_known():
    env = {"device_kind": "cuda", "gpu_compute_capability": "7.5", "gpu_memory_mb": 15360}
    assert hardware_class(env) == "GPU: unknown model (compute capability 7.5, 15360 MiB)"
    assert hardware_class({"gpu_name": None, "cpu_model": "X", "cpus_available": 2}) == (
        "CPU: X \u00d72"
    )  # an environment stored before device_kind: as it was


def _gpu_env(props, name: str) -> dict:
    gpu = FakeGpu("GPU-1234aaaa-0000-1111-2222-333344445555", name=name)
    return capture_environment(
        cuda_run(), cuda=FakeCuda([with_uuid(props, gpu.uuid)]), nvml=FakeNvml([gpu]), environ={}
    )


@pytest.fixture
def t4_and_a100(tmp_path):
    """A store with three A100 runs (20 ms steps) and then a T4 run (40 ms): @1-@3, @4."""
    a100 = _gpu_env(A100_40GB, "NVIDIA A100-SXM4-40GB")
    tesla = _gpu_env(TESLA_T4, "Tesla T4")
    assert hardware_class(a100) != hardware_class(tesla)
    store = Store(tmp_path / "runs.sqlite")
    for seed in range(3):
        store.add(make_run(step_ms=20.0, seed=seed, env=a100))
    store.add(make_run(step_ms=40.0, seed=9, env=tesla))
    return store, a100, tesla


def test_a_t4_run_is_not_compared_with_a100_runs_by_default(t4_and_a100):
    store, a100, tesla = t4_and_a100
    session = Session(store=store.path)
    candidate = make_run(step_ms=40.0, seed=10, env=tesla)
    runs = session.baseline_for(candidate, store).runs
    assert [r.stored_id for r in runs] == [4]  # the T4 run only
    runs = session.baseline_for(make_run(env=a100), store).runs
    assert [r.stored_id for r in runs] == [1, 2, 3]
    runs = session.baseline_for(candidate, store, any_hardware=True).runs
    assert [r.stored_id for r in runs] == [1, 2, 3, 4]  # on request


def test_the_ci_gate_finds_no_baseline_for_the_t4_among_a100_runs(t4_and_a100):
    store, _, _ = t4_and_a100
    result = run_check("smoke", store=store.path)
    assert result.exit_code == 2 and result.status == "no baseline"
    assert "on GPU: Tesla T4" in result.why
    across = run_check("smoke", store=store.path, any_hardware=True)
    assert across.exit_code == 1  # twice the A100's step time: a regression, when asked


def test_a_comparison_across_classes_says_so_first(t4_and_a100):
    store, _, _ = t4_and_a100
    _, _, note = Session(store=store.path).compare_refs("@1", "@4", store=store)
    assert note == "across hardware classes: GPU: NVIDIA A100-SXM4-40GB \u2192 GPU: Tesla T4"
