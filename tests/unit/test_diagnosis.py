"""Every verdict and every threshold of the diagnosis, on both sides, on hand-built records."""

from __future__ import annotations

import pytest
from builders import (
    CPU_ONLY,
    RecordBuilder,
    cpu_capabilities,
    gpu_capabilities,
)

from traceml_nb.analysis import analyze
from traceml_nb.analysis.advice import (
    Change,
    loader_changes,
    more_workers,
    setting_name,
    worker_target,
)
from traceml_nb.analysis.advice import loader_settings as advice_loader_settings
from traceml_nb.analysis.diagnosis import BATCHED_INDEXING
from traceml_nb.analysis.diagnosis_facts import confidence
from traceml_nb.analysis.findings import Diagnosis, Finding
from traceml_nb.analysis.input_bound import (
    CAUSE_CPU_SATURATED,
    CAUSE_FIRST_EPOCH,
    CAUSE_IN_MEMORY,
    CAUSE_PAGEABLE,
    CAUSE_STORAGE,
    CAUSE_TOO_FEW_WORKERS,
    CAUSE_UNKNOWN,
    TUNE_HINT,
)
from traceml_nb.analysis.pipeline import Analysis
from traceml_nb.analysis.profile_summary import PROFILE_SUGGESTION
from traceml_nb.analysis.thresholds import (
    CONFIDENT_STEPS,
    FIRST_EPOCH_FACTOR,
    GPU_BUSY_PCT,
    INPUT_BOUND_SHARE,
    INPUT_MINOR_SHARE,
    MAX_SUGGESTED_WORKERS,
    MEMORY_PRESSURE_SHARE,
    MIN_INPUT_WAIT_MS,
    MIN_STEADY_STEPS,
    SM_ACTIVE_BUSY_PCT,
    SMALL_BATCH,
    STALL_FACTOR,
    STALL_MAX_SHARE,
    STRONG_FACTOR,
    SYSTEM_SATURATED_PCT,
    THROTTLE_CLOCK_RATIO,
    THROTTLE_MIN_SHARE,
    THROTTLE_MIN_STEPS,
    THROTTLE_STEP_FACTOR,
    WORKER_BUSY_PCT,
    WORKER_SATURATED_PCT,
)
from traceml_nb.engine.capabilities import Capabilities
from traceml_nb.engine.contracts import VERDICTS
from traceml_nb.engine.record import SOURCE_MARKER, SOURCE_OPTIMIZER, LoaderInfo
from traceml_nb.views.diagnosis_words import (
    TUNE_HINT_TEXT,
    DiagnosisWords,
    change_text,
    diagnosis_words,
    sentence,
)

STEP_MS = 30.0
IDLE_HOST = {"proc_cpu_pct": 100.0, "sys_cpu_pct": 50.0, "workers_cpu_pct": 0.0}
HEALTHY_GPU = {
    "util_gpu_pct": 96.0,
    "mem_used_mb": 4096.0,
    "mem_total_mb": 16384.0,
    "sm_clock_mhz": 1590.0,
    "sm_clock_max_mhz": 1590.0,
    "throttle_reasons": 0.0,
}


def cpu_run(
    wait_share: float,
    *,
    step_ms: float = STEP_MS,
    steps: int = 100,
    workers: int = 0,
    cpus: int | None = 2,
    host: dict | None = None,
    batch: int = 8,
    dataset_type: str = "TensorDataset",
) -> Analysis:
    """A CPU-only run whose steps wait ``wait_share`` of their time for data (no warm-up)."""
    b = RecordBuilder()
    b.loader(num_workers=workers, batch_size=batch, dataset_type=dataset_type)
    b.steps(steps, step_ms, step_ms * wait_share, batch=batch)
    if host is not None:
        b.samples("host", **host)
    return analyze(
        b.finish(), cpu_capabilities(host=host is not None), warmup=0, cpus_available=cpus
    )


def gpu_run(
    stall_share: float,
    util: float | None = 96.0,
    *,
    wait_share: float | None = None,
    steps: int = 100,
    workers: int = 0,
    pin: bool = False,
    persistent: bool = False,
    cpus: int | None = 2,
    host: dict | None = None,
    gpu: dict | None = None,
    batch: int = 64,
    caps: Capabilities | None = None,
    dataset_type: str = "TensorDataset",
) -> Analysis:
    """A CUDA run whose GPU sat idle waiting for input ``stall_share`` of the step time."""
    b = RecordBuilder()
    b.loader(
        num_workers=workers,
        pin_memory=pin,
        persistent_workers=persistent,
        batch_size=batch,
        dataset_type=dataset_type,
    )
    wait = stall_share if wait_share is None else wait_share
    b.steps(steps, STEP_MS, STEP_MS * wait, stall_ms=STEP_MS * stall_share, batch=batch)
    b.samples("host", **(host if host is not None else {**IDLE_HOST, "workers": workers}))
    b.samples("gpu", **{**HEALTHY_GPU, "util_gpu_pct": util, **(gpu or {})})
    return analyze(b.finish(), caps or gpu_capabilities(), warmup=0, cpus_available=cpus)


def said(d: Diagnosis) -> DiagnosisWords:
    """The diagnosis as the report writes it (the golden texts below)."""
    return diagnosis_words(d)


def evidence(d: Diagnosis, label: str) -> str:
    [text] = [line.split(": ", 1)[1] for line in said(d).evidence if line.startswith(label + ": ")]
    return text


# --- insufficient data ----------------------------------------------------------------------------
def test_min_steady_steps_both_sides():
    assert cpu_run(0.6, steps=MIN_STEADY_STEPS).diagnosis.verdict == "input-bound"
    d = cpu_run(0.6, steps=MIN_STEADY_STEPS - 1).diagnosis
    assert d.verdict == "insufficient-data"
    assert (
        said(d).title == "Not enough steady steps to judge: 9 (at least 10 needed after 0 warm-up)"
    )
    assert d.confidence == "low"
    assert d.saving_bound_share is None


def test_no_steps_at_all():
    b = RecordBuilder()
    d = analyze(b.finish(), cpu_capabilities()).diagnosis
    assert d.verdict == "insufficient-data"
    assert said(d).title == (
        "No training steps seen: no DataLoader batches, optimizer steps or traceml_nb.step() markers"
    )


def test_nothing_tells_input_from_compute():
    b = RecordBuilder()
    b.steps(50, 10.0, source=SOURCE_MARKER)
    d = analyze(b.finish(), cpu_capabilities(), warmup=0).diagnosis
    assert d.verdict == "insufficient-data"
    assert (
        said(d).title
        == "Cannot judge: no DataLoader was iterated and no GPU utilisation was measured"
    )


# --- input-bound on CPU: the share and the absolute floor -----------------------------------------
def test_input_bound_share_both_sides():
    d = cpu_run(INPUT_BOUND_SHARE).diagnosis
    assert d.verdict == "input-bound"
    assert said(d).title == "Input-bound: the training loop waits for data 15% of step time"
    d = cpu_run(INPUT_BOUND_SHARE - 0.001).diagnosis
    assert d.verdict == "compute-bound"
    assert said(d).title == (
        "Compute-bound: the steps spend their time computing, not waiting for data "
        "(input stalls 15% of step time)"
    )
    assert said(d).also[0] == (  # one decimal: "15% (input-bound from 15%)" would contradict
        "Minor input stalls: data wait is 14.9% of step time (input-bound from 15%)."
    )


def test_absolute_wait_floor_both_sides():
    share = 0.5
    at_floor = MIN_INPUT_WAIT_MS / share  # step time whose wait is exactly the floor
    assert cpu_run(share, step_ms=at_floor).diagnosis.verdict == "input-bound"
    d = cpu_run(share, step_ms=at_floor * 0.99).diagnosis
    assert d.verdict == "compute-bound"
    assert said(d).also[0] == (
        "The data wait is 50% of a very short step (0.99 ms per step, below the 1 ms floor): "
        "the cost of indexing and collating each batch, not an input pipeline that lags."
    )


def test_tiny_model_on_an_in_memory_dataset_is_not_input_bound():
    # TensorDataset + a tiny model: 0.05 ms of 0.15 ms per step is "waiting", a third of it
    d = cpu_run(1 / 3, step_ms=0.15).diagnosis
    assert d.verdict == "compute-bound"
    assert said(d).also[0] == (
        "The data wait is 33% of a very short step (0.05 ms per step, below the 1 ms floor): "
        "the cost of indexing and collating each batch, not an input pipeline that lags."
    )
    # headline, advice and what will not help say the same thing, and none calls 33% "only"
    assert said(d).title == (
        "Compute-bound: the steps are very short (0.15 ms): 33% of each is making its batch in "
        "the training process (indexing and collating, no input pipeline to wait for), the rest "
        "is the model's work"
    )
    assert d.advice == [Finding(BATCHED_INDEXING)] and "__getitems__" in said(d).advice[0]
    assert said(d).wont_help == [
        "More DataLoader workers: at 0.05 ms a batch, handing each batch over from a worker "
        "process costs about as much as making it in the training loop."
    ]
    assert not any(
        " is only " in line for line in [said(d).title, *said(d).wont_help, *said(d).also]
    )


def test_minor_share_both_sides():
    assert said(cpu_run(INPUT_MINOR_SHARE).diagnosis).also[0].startswith("Minor input stalls: ")
    d = cpu_run(INPUT_MINOR_SHARE - 0.001).diagnosis
    assert not any(s.startswith("Minor input stalls") for s in said(d).also)


def test_cpu_only_input_bound_full_diagnosis():
    d = cpu_run(0.6, host={**IDLE_HOST, "workers": 0}).diagnosis
    assert d.verdict == "input-bound"
    assert d.confidence == "high"
    assert d.cause == CAUSE_TOO_FEW_WORKERS
    assert said(d).advice == [
        "Change the training DataLoader: num_workers=0 \u2192 num_workers=2, "
        "persistent_workers=True, prefetch_factor=4",
        "With num_workers=0, the main process loads every batch while the training loop waits; "
        "2 workers (one per CPU available: 2) load batches in parallel with the compute.",
        "persistent_workers=True keeps the workers alive between epochs instead of starting them "
        "again (each start costs the first-batch wait again).",
        "prefetch_factor=4 keeps 4 batches per worker in flight, which absorbs slow samples.",
        TUNE_HINT_TEXT,
    ]
    assert d.advice[0].facts["changes"][0] == {"setting": "num_workers", "new": 2, "old": 0}
    # no workers measured: the loading may wait on storage, which more workers than CPUs overlap
    assert said(d).wont_help == []
    assert d.saving_bound_share == pytest.approx(0.6)
    assert said(d).saving == (
        "Data waits took 60% of this run (1.8 s of 3 s): without them it would take at most "
        "60% less time."
    )
    assert said(d).also == [
        "GPU evidence unavailable (no CUDA device in this run, CPU only): judged on host timings."
    ]
    texts = {e.label: sentence(e.detail) for e in d.evidence}
    assert texts == {
        "steady steps": "100 (0 warm-up steps excluded)",
        "step time": "median 30 ms (p10 30 ms, p90 30 ms)",
        "data wait": "60% of step time (18 ms per step)",
        "GPU input stall": f"unavailable ({CPU_ONLY})",
        "GPU utilisation": f"unavailable ({CPU_ONLY})",
        "SM activity": f"unavailable ({CPU_ONLY})",
        "DataLoader": "num_workers=0, pin_memory=False, prefetch_factor=None, "
        "persistent_workers=False, batch_size=8",
        "CPUs available": "2",
        "worker CPU": "no worker processes (num_workers=0): the main process loads the data",
        "main process CPU": "median 100% (100% = one core)",
        "system CPU": "median 50% of all CPUs",
        "SM clock": f"unavailable ({CPU_ONLY})",
        "throttling": f"unavailable ({CPU_ONLY})",
        "GPU memory": f"unavailable ({CPU_ONLY})",
        "batch size": "8",
    }
    unavailable = [e.label for e in d.evidence if e.value is None]
    assert "GPU utilisation" in unavailable and "steady steps" not in unavailable  # never 0
    assert [e.label for e in d.evidence][:4] == [
        "steady steps",
        "step time",
        "data wait",
        "GPU input stall",
    ]


def test_saving_bound_counts_warmup_waits_and_time_outside_steps():
    b = RecordBuilder()
    b.loader()
    b.steps(1, 500.0, 400.0)
    b.steps(99, 20.0, 10.0)
    record = b.finish(tail_ms=1510.0)  # 3.99 s in all, 1.39 s of it waiting
    d = analyze(record, cpu_capabilities(), cpus_available=2).diagnosis
    assert d.saving_bound_share == pytest.approx(1.39 / 3.99)
    assert said(d).saving == (
        "Data waits took 35% of this run (1.39 s of 3.99 s): without them it would take at most "
        "35% less time."
    )


# --- confidence -------------------------------------------------------------------------------------
def test_strong_factor_and_confident_steps_both_sides():
    assert cpu_run(STRONG_FACTOR * INPUT_BOUND_SHARE).diagnosis.confidence == "high"
    assert cpu_run(STRONG_FACTOR * INPUT_BOUND_SHARE - 0.01).diagnosis.confidence == "medium"
    assert cpu_run(0.6, steps=CONFIDENT_STEPS).diagnosis.confidence == "high"
    assert cpu_run(0.6, steps=CONFIDENT_STEPS - 1).diagnosis.confidence == "medium"
    assert confidence(False, CONFIDENT_STEPS - 1, weaker=1) == "low"


# --- input-bound on CUDA and its sub-causes ---------------------------------------------------------
def test_gpu_input_bound_too_few_workers_colab():
    d = gpu_run(0.44, 51.0).diagnosis
    assert d.verdict == "input-bound"
    assert said(d).title == "Input-bound: the GPU waits for data 44% of step time"
    assert d.cause == CAUSE_TOO_FEW_WORKERS
    assert said(d).advice[0] == (
        "Change the training DataLoader: num_workers=0 \u2192 num_workers=2, pin_memory=True, "
        "persistent_workers=True, prefetch_factor=4"
    )
    assert said(d).advice[2] == (
        "pin_memory=True puts batches in page-locked memory, so copying them to the GPU with "
        ".to(device, non_blocking=True) overlaps the compute."
    )
    assert said(d).saving == (
        "GPU input stalls took 44% of this run (1.32 s of 3 s): without them it would take at "
        "most 44% less time."
    )
    assert evidence(d, "GPU input stall") == "44% of step time (13.2 ms per step)"
    assert evidence(d, "GPU utilisation") == "median 51% during the steady steps"
    assert evidence(d, "SM clock") == "median 1590 of 1590 MHz (100%)"
    assert evidence(d, "throttling") == "none during the steady steps"
    assert evidence(d, "GPU memory") == "peak 4.0 GiB of 16.0 GiB (25%)"
    assert said(d).also == []


def test_gpu_kaggle_four_cpus_two_workers():
    d = gpu_run(
        0.3, 60.0, workers=2, cpus=4, host={"workers_cpu_pct": 190.0, "workers": 2}
    ).diagnosis
    assert d.cause == CAUSE_TOO_FEW_WORKERS
    assert said(d).advice[0] == (
        "Change the training DataLoader: num_workers=2 \u2192 num_workers=4, pin_memory=True, "
        "persistent_workers=True, prefetch_factor=2 \u2192 prefetch_factor=4"
    )
    assert said(d).wont_help == ["More than 4 workers: only 4 CPUs are available to this process."]


@pytest.mark.parametrize("per_worker", [WORKER_BUSY_PCT, WORKER_BUSY_PCT - 1])
def test_more_workers_than_cpus_is_no_help_only_where_the_workers_were_busy(per_worker):
    """One worker of four CPUs: more are advised; that more than four will not help is said
    only where the worker used ``WORKER_BUSY_PCT`` of a core (its loading is CPU work); one
    that mostly waits, on storage, is helped by more workers than CPUs."""
    host = {"workers_cpu_pct": per_worker, "workers": 1}
    d = gpu_run(0.3, 60.0, workers=1, cpus=4, host=host, dataset_type="ImageFolder").diagnosis
    assert d.cause == CAUSE_TOO_FEW_WORKERS
    busy = per_worker >= WORKER_BUSY_PCT
    assert said(d).wont_help == (
        ["More than 4 workers: only 4 CPUs are available to this process."] if busy else []
    )


def test_gpu_stall_decides_not_the_host_wait():
    # the host waits 40% of the time but the GPU still had queued work: not input-bound
    d = gpu_run(0.02, 96.0, wait_share=0.4).diagnosis
    assert d.verdict == "compute-bound"
    assert evidence(d, "data wait") == "40% of step time (12 ms per step)"


def test_gpu_run_without_cuda_events_falls_back_on_data_wait():
    d = gpu_run(0.44, 51.0, caps=gpu_capabilities(events=False)).diagnosis
    assert d.verdict == "input-bound"
    assert said(d).title == "Input-bound: the training loop waits for data 44% of step time"
    assert d.confidence == "medium"  # one level lower: indirect evidence
    assert said(d).also[0] == (
        "GPU input stalls were not measured (CUDA events failed): judged on host data wait, "
        "which can overstate what the GPU lost."
    )
    assert said(d).saving.startswith("Data waits took 44% of this run")


def saturated_host(per_worker: float, system: float = 50.0, workers: int = 2) -> dict:
    return {"workers_cpu_pct": per_worker * workers, "workers": workers, "sys_cpu_pct": system}


def test_one_worker_is_told_as_one() -> None:
    one = saturated_host(90.0, workers=1)
    d = gpu_run(0.44, 51.0, workers=1, cpus=1, host=one).diagnosis
    assert d.cause == CAUSE_CPU_SATURATED
    evidence = {e.label: sentence(e.detail) for e in d.evidence}
    assert evidence["worker CPU"] == "median 90% across 1 worker (100% = one core)"
    assert "the 1 worker uses 90% CPU and the system CPU is at 50%" in said(d).advice[1]
    two = gpu_run(0.44, 51.0, workers=2, host=saturated_host(90.0, workers=2)).diagnosis
    assert {e.label: sentence(e.detail) for e in two.evidence}["worker CPU"] == (
        "median 180% across 2 workers (100% = one core)"
    )


def test_workers_cpu_saturated_both_sides():
    d = gpu_run(0.44, 51.0, workers=2, host=saturated_host(WORKER_SATURATED_PCT)).diagnosis
    assert d.cause == CAUSE_CPU_SATURATED
    assert (
        said(d).advice[0]
        == "Change the training DataLoader: pin_memory=True, persistent_workers=True"
    )
    assert said(d).advice[1] == (
        "The input pipeline is CPU-bound: the 2 workers use 170% CPU (85% each) and the system "
        "CPU is at 50%. Make each sample cheaper: store images pre-resized, cache decoded "
        "tensors, or run the augmentations on the GPU (e.g. torchvision.transforms.v2 on CUDA "
        "tensors)."
    )
    assert said(d).wont_help == [
        "More workers than the 2 CPUs available: the workers already saturate them (num_workers=2).",
        "A larger prefetch_factor: a deeper queue does not make saturated workers faster.",
    ]
    below = saturated_host(WORKER_SATURATED_PCT - 0.5)
    assert gpu_run(0.44, 51.0, workers=2, host=below).diagnosis.cause == CAUSE_PAGEABLE


def test_system_cpu_saturated_both_sides():
    busy = WORKER_BUSY_PCT
    host = saturated_host(busy, system=SYSTEM_SATURATED_PCT)
    assert gpu_run(0.44, 51.0, workers=2, host=host).diagnosis.cause == CAUSE_CPU_SATURATED
    host = saturated_host(busy, system=SYSTEM_SATURATED_PCT - 0.1)
    assert gpu_run(0.44, 51.0, workers=2, host=host).diagnosis.cause == CAUSE_PAGEABLE


def test_a_busy_machine_with_idle_workers_is_not_worker_saturation_both_sides():
    """Something else takes the CPU (another program, the loop itself) while the workers wait."""
    host = saturated_host(WORKER_BUSY_PCT - 0.5, system=100.0)
    assert gpu_run(0.44, 51.0, workers=2, host=host).diagnosis.cause == CAUSE_PAGEABLE
    host = saturated_host(WORKER_BUSY_PCT, system=100.0)
    assert gpu_run(0.44, 51.0, workers=2, host=host).diagnosis.cause == CAUSE_CPU_SATURATED


def test_saturated_cores_count():
    host = {**saturated_host(WORKER_BUSY_PCT), "cores_saturated": 2.0}
    assert gpu_run(0.44, 51.0, workers=2, host=host).diagnosis.cause == CAUSE_CPU_SATURATED
    host = {**saturated_host(WORKER_BUSY_PCT), "cores_saturated": 1.0}
    assert gpu_run(0.44, 51.0, workers=2, host=host).diagnosis.cause == CAUSE_PAGEABLE


def test_pageable_copies():
    d = gpu_run(0.44, 51.0, workers=2, host=saturated_host(20.0)).diagnosis
    assert d.cause == CAUSE_PAGEABLE
    assert said(d).advice[0] == (
        "Change the training DataLoader: pin_memory=True, persistent_workers=True, "
        "prefetch_factor=2 \u2192 prefetch_factor=4"
    )
    assert said(d).wont_help == [
        "More CPU: the 2 workers use 40% CPU (20% each) and the system CPU is at 50%, not saturated."
    ]


def test_idle_workers_wait_on_storage():
    d = gpu_run(
        0.44,
        51.0,
        workers=2,
        pin=True,
        persistent=True,
        host=saturated_host(20.0),
        dataset_type="ImageFolder",
    ).diagnosis
    assert d.cause == CAUSE_STORAGE
    assert said(d).advice[0] == (
        "Change the training DataLoader: num_workers=2 \u2192 num_workers=4, "
        "prefetch_factor=2 \u2192 prefetch_factor=4"
    )
    assert said(d).advice[1] == (
        "The workers are mostly idle (the 2 workers use 40% CPU (20% each) and the system CPU is "
        "at 50%) yet cannot keep up: they wait on storage. Waiting workers need little CPU, so "
        "more workers than CPUs overlap more reads; better still, copy the dataset to local disk "
        "or memory, or use fewer, larger files."
    )
    assert said(d).wont_help == ["A faster CPU: the workers are not CPU-bound."]


def test_idle_workers_of_a_dataset_in_memory_wait_on_no_storage():
    """A TensorDataset with workers on few CPUs (MNIST in memory, ``num_workers=2``): the
    workers are idle, not for storage but for the hand-over and the CPU the loop takes;
    no more workers are asked for, and what to set is left to measuring."""
    d = gpu_run(
        0.44, 51.0, workers=2, pin=True, persistent=True, host=saturated_host(20.0)
    ).diagnosis
    assert d.cause == CAUSE_IN_MEMORY
    assert said(d).cause == (
        "batches in memory, handed over by worker processes (no storage to wait on)"
    )
    assert said(d).advice[0] == (
        "The dataset is a TensorDataset, already in memory: its workers wait on no storage "
        "(the 2 workers use 40% CPU (20% each) and the system CPU is at 50%). The loop waits "
        "while each batch is handed over from a worker process, and on few CPUs the workers "
        "take CPU from the training process. Try num_workers=0 with each batch made in one call "
        "(slice the tensors, or give the dataset a __getitems__), and keep whichever is faster."
    )
    assert said(d).advice[1].startswith("To measure the DataLoader settings")
    assert "num_workers=4" not in " ".join(said(d).advice)
    assert said(d).wont_help == [
        "More DataLoader workers: the samples are already in memory; more processes add "
        "hand-overs and take CPU from the training process."
    ]


def test_a_tiny_step_waiting_for_workers_is_a_hand_over_not_indexing_in_the_loop():
    d = cpu_run(0.5, step_ms=0.4, workers=2).diagnosis
    assert d.verdict == "compute-bound"
    assert said(d).title == (
        "Compute-bound: the steps are very short (0.4 ms): 50% of each is receiving its batch "
        "from 2 DataLoader worker processes (the hand-over between processes, no input pipeline "
        "that lags), the rest is the model's work"
    )
    assert said(d).advice == [
        "Make the batches in the training process: with num_workers=2 each batch is handed "
        "over from a worker process, which costs about as much as making it. Try num_workers=0 "
        "with each batch made in one call (give the dataset a __getitems__, or slice the "
        "tensors directly), and keep whichever is faster."
    ]
    handing = "the cost of handing each batch over from a worker process, not an input pipeline"
    assert said(d).also[0].endswith(f"{handing} that lags.")
    # a dataset that decodes keeps its workers: making each batch in one call is the advice
    decoding = cpu_run(0.5, step_ms=0.4, workers=2, dataset_type="ImageFolder").diagnosis
    assert said(decoding).title == said(d).title
    assert decoding.advice == [Finding(BATCHED_INDEXING)]
    assert "num_workers=0" not in said(decoding).advice[0]


def test_unknown_cause_without_host_sampling():
    d = gpu_run(0.44, 51.0, workers=2, pin=True, persistent=True, host={}).diagnosis
    assert d.cause == CAUSE_UNKNOWN
    assert said(d).advice[1] == (
        "The loader already has a worker per CPU; whether its workers are CPU- or "
        "storage-bound is unknown (worker CPU unavailable: workers_cpu_pct is not reported by "
        "this sampler)."
    )


def first_epoch_run(
    first_share: float, later_share: float, dataset_type: str = "ImageFolder"
) -> Diagnosis:
    b = RecordBuilder()
    b.loader(num_workers=2, pin_memory=True, persistent_workers=True, dataset_type=dataset_type)
    b.steps(50, STEP_MS, STEP_MS * first_share, flags=0, epoch_len=50)
    b.steps(100, STEP_MS, STEP_MS * later_share, epoch_len=50)
    b.samples("host", **saturated_host(20.0))
    return analyze(b.finish(), cpu_capabilities(), warmup=0, cpus_available=2).diagnosis


def test_first_epoch_factor_both_sides():
    later = 0.14
    d = first_epoch_run(FIRST_EPOCH_FACTOR * later + 0.01, later)
    assert d.verdict == "input-bound"
    assert d.cause == CAUSE_FIRST_EPOCH
    assert said(d).advice == [
        "The first epoch waited 29% of its step time, later epochs only 14%: the first pass "
        "reads from slow storage and later ones from the page cache. Copy the dataset to local "
        "disk or memory before training, or cache decoded samples."
    ]
    assert said(d).wont_help == [
        "More DataLoader workers: the later epochs already keep up with the current ones."
    ]
    d = first_epoch_run(FIRST_EPOCH_FACTOR * later - 0.02, later)
    assert d.verdict == "input-bound"
    assert d.cause == CAUSE_STORAGE  # the idle workers, not the first epoch
    assert said(d).advice[1].startswith("The workers are mostly idle")
    # tensors in memory read from no storage, on the first epoch or later
    in_memory = first_epoch_run(FIRST_EPOCH_FACTOR * later + 0.01, later, "TensorDataset")
    assert in_memory.cause == CAUSE_IN_MEMORY


def test_first_epoch_pattern_needs_later_epochs_below_the_input_share():
    d = first_epoch_run(0.9, INPUT_BOUND_SHARE)
    assert d.verdict == "input-bound"
    assert not any(line.startswith("The first epoch") for line in said(d).advice)


# --- host-bound and compute-bound -----------------------------------------------------------------
def test_gpu_busy_threshold_both_sides():
    d = gpu_run(0.02, GPU_BUSY_PCT).diagnosis
    assert d.verdict == "compute-bound"
    assert said(d).title == (
        "Compute-bound (healthy): the GPU is busy, median GPU utilisation 80% (NVML: a kernel "
        "was running); input stalls 2% of step time"
    )
    assert said(d).advice == [
        "The GPU is the limit: speed-ups come from the model side (mixed precision with "
        "torch.autocast, channels_last, torch.compile)."
    ]
    assert said(d).wont_help == [
        "DataLoader tuning (workers, pin_memory, prefetch): GPU input stall is only 2% of step time."
    ]
    assert d.confidence == "high"
    d = gpu_run(0.02, GPU_BUSY_PCT - 0.1, batch=SMALL_BATCH).diagnosis
    assert d.verdict == "host-bound"
    assert said(d).title == (
        "Host-bound: input stalls 2% of step time, but the GPU is idle much of the time: "
        "median GPU utilisation 80% (NVML: a kernel was running)"
    )
    assert said(d).advice == [
        "Remove per-step host syncs: .item(), .cpu(), float(loss), printing tensors; accumulate "
        "metrics on the GPU and read them every N steps.",
        'Cut launch overhead: torch.compile(model), or CUDA graphs via torch.compile(mode="reduce-overhead").',
        "To see which operations and lines take the time: rerun this cell with %%traceml "
        "--profile 10 (torch.profiler over 10 steady steps, left out of the statistics).",
    ]
    # host-bound: where the host's time goes is the next question
    assert [f.code for f in d.advice][-1] == PROFILE_SUGGESTION
    assert d.saving_bound_share == pytest.approx(0.201)
    assert said(d).saving == (
        "The GPU was idle about 20% of the time: removing host overhead saves at most 20%."
    )


def gpm_capabilities() -> Capabilities:
    """A CUDA run on a GPU with GPM (Hopper and later)."""
    from traceml_nb.engine.sampling.gpm import COLUMN_CAPABILITY, GPM_CAPABILITY

    caps = gpu_capabilities()
    for name in (GPM_CAPABILITY, *COLUMN_CAPABILITY.values()):
        caps.set(name, True)
    return caps


def every_second(value: float):
    """A GPM column: a value once a second (the rows of the 10 Hz samples between have none)."""
    return lambda t: value if round(t * 10) % 10 == 0 else float("nan")


def gpm_run(sm_active: float, util: float = 97.0, **gpu: float) -> Analysis:
    columns = {"sm_active_pct": every_second(sm_active)}
    columns.update({k: every_second(v) for k, v in gpu.items()})
    return gpu_run(0.02, util, gpu=columns, caps=gpm_capabilities())


def test_sm_activity_decides_host_bound_both_sides_when_the_gpu_has_it():
    """NVML reads 97% (a kernel ran all the time); SM activity says how much of the GPU worked."""
    d = gpm_run(SM_ACTIVE_BUSY_PCT).diagnosis
    assert d.verdict == "compute-bound"
    assert said(d).title == (
        "Compute-bound (healthy): the GPU's SMs are busy, median SM activity 50% (GPM); "
        "input stalls 2% of step time"
    )
    a = gpm_run(SM_ACTIVE_BUSY_PCT - 0.1, sm_occupancy_pct=12.0, tensor_active_pct=4.0)
    d = a.diagnosis
    assert d.verdict == "host-bound"
    assert said(d).title == (
        "Host-bound: input stalls 2% of step time, but the GPU's SMs are idle much of the time: "
        "median SM activity 50% (GPM)"
    )
    assert d.saving_bound_share == pytest.approx(0.501)
    assert said(d).saving == (
        "The SMs were idle about 50% of their time: removing host overhead saves at most 50%."
    )
    assert said(d).also[0] == (
        "NVML's GPU utilisation reads 97%: it counts the time any kernel ran, and small kernels "
        "keep it high while most SMs are idle (SM activity 50%)."
    )
    assert a.summary.sm_active_median_pct == pytest.approx(49.9)
    assert a.summary.sm_occupancy_median_pct == pytest.approx(12.0)
    assert a.summary.dram_bw_median_pct is None
    assert evidence(d, "SM activity") == (
        "median 50% of the SMs busy during the steady steps (GPM; SM occupancy 12%, tensor "
        "cores 4%)"
    )
    assert evidence(d, "GPU utilisation") == "median 97% during the steady steps"


def test_sm_activity_strong_host_bound_below_half_the_threshold():
    assert gpm_run(SM_ACTIVE_BUSY_PCT / 2 - 0.1).diagnosis.confidence == "high"
    assert gpm_run(SM_ACTIVE_BUSY_PCT / 2).diagnosis.confidence == "medium"


def test_sm_activity_busy_overrides_a_low_nvml_reading():
    d = gpm_run(85.0, util=60.0).diagnosis
    assert d.verdict == "compute-bound"
    assert "median SM activity 85% (GPM)" in said(d).title


def test_without_gpm_nvml_decides_and_sm_activity_says_why_not():
    d = gpu_run(0.02, 97.0).diagnosis
    assert d.verdict == "compute-bound"
    assert "GPU utilisation 97% (NVML: a kernel was running)" in said(d).title
    assert (
        evidence(d, "SM activity") == "unavailable (sm_active_pct is not reported by this sampler)"
    )
    caps = gpu_capabilities()
    caps.set(
        "gpm_sm_active", False, "this GPU has no GPM metrics (Hopper and later GPUs have them)"
    )
    a = gpu_run(0.02, 97.0, caps=caps)
    assert a.summary.sm_active_median_pct is None
    assert a.summary.unavailable["sm_active_median_pct"] == (
        "this GPU has no GPM metrics (Hopper and later GPUs have them)"
    )
    assert evidence(a.diagnosis, "SM activity") == (
        "unavailable (this GPU has no GPM metrics (Hopper and later GPUs have them))"
    )


def test_small_batch_advice_both_sides():
    d = gpu_run(0.02, 40.0, batch=SMALL_BATCH - 1).diagnosis
    assert d.verdict == "host-bound"
    assert said(d).advice[1] == (
        "Batch size 31 is small: a larger batch (e.g. 124) gives the GPU more work per kernel launch."
    )
    advice = said(gpu_run(0.02, 40.0, batch=SMALL_BATCH).diagnosis).advice
    assert len(advice) == 3 and not any("is small" in a for a in advice)


def test_gpu_utilisation_unavailable_cannot_tell_host_from_compute():
    d = gpu_run(0.02, None, caps=gpu_capabilities(utilisation=False)).diagnosis
    assert d.verdict == "compute-bound"
    assert d.confidence == "low"
    assert said(d).title == (
        "Not input-bound (input stalls 2% of step time); GPU utilisation unavailable "
        "(utilisation is not supported on MIG devices), so host- and compute-bound cannot be "
        "told apart"
    )


def test_cpu_compute_bound():
    d = cpu_run(0.01).diagnosis
    assert d.verdict == "compute-bound"
    assert d.confidence == "high"
    assert said(d).advice == [
        "The CPU computing the model is the limit: a GPU, or a smaller model or inputs, is what "
        "makes it faster."
    ]


# --- throttled ------------------------------------------------------------------------------------
def throttle_run(
    throttled_steps: int,
    slowdown: float,
    *,
    steps: int = 100,
    ratio: float = 0.75,
    reasons: float | None = 0x4,
) -> Diagnosis:
    """``throttled_steps`` trailing steps run at clock ``ratio`` and take ``slowdown``× as long."""
    b = RecordBuilder()
    b.loader(num_workers=2, pin_memory=True)
    normal = steps - throttled_steps
    b.steps(normal, 100.0, 0.0, stall_ms=0.0)
    boundary = normal * 0.1
    b.steps(throttled_steps, 100.0 * slowdown, 0.0, stall_ms=0.0)
    b.samples("host", **saturated_host(20.0))
    gpu = {
        **HEALTHY_GPU,
        "sm_clock_mhz": lambda t: 1600.0 * ratio if t >= boundary else 1600.0,
        "sm_clock_max_mhz": 1600.0,
        "throttle_reasons": (lambda t: reasons if t >= boundary else 0.0)
        if reasons is not None
        else None,
    }
    b.samples("gpu", interval_s=0.01, **gpu)
    return analyze(b.finish(), gpu_capabilities(), warmup=0, cpus_available=2).diagnosis


def test_throttled_verdict():
    d = throttle_run(30, 1.25)
    assert d.verdict == "throttled"
    assert said(d).title == (
        "Throttled: steps take 1.25\u00d7 as long while the GPU clock is reduced (software power cap)"
    )
    assert d.confidence == "high"
    assert d.saving_bound_share == pytest.approx(30 * 25.0 / (70 * 100 + 30 * 125))
    assert said(d).saving == (
        "The throttled steps (30% of the steps) cost about 7% of the steady time over steps at "
        "full clock."
    )
    assert (
        evidence(d, "throttling")
        == "30% of the steps (software power cap), 1.25\u00d7 as long as the others"
    )


def test_throttle_step_factor_both_sides():
    assert throttle_run(30, THROTTLE_STEP_FACTOR + 0.001).verdict == "throttled"
    d = throttle_run(30, THROTTLE_STEP_FACTOR - 0.01)
    assert d.verdict == "compute-bound"


def test_throttle_min_share_both_sides():
    n = 100
    at = round(THROTTLE_MIN_SHARE * n)
    assert throttle_run(at, 1.5, steps=n).verdict == "throttled"
    assert throttle_run(at - 1, 1.5, steps=n).verdict == "compute-bound"


def test_throttle_min_steps_both_sides():
    # a short run: the share is met but each group needs THROTTLE_MIN_STEPS steps
    assert throttle_run(THROTTLE_MIN_STEPS, 1.5, steps=20).verdict == "throttled"
    assert throttle_run(THROTTLE_MIN_STEPS - 1, 1.5, steps=12).verdict == "compute-bound"


def test_throttle_clock_ratio_both_sides():
    assert throttle_run(30, 1.3, ratio=THROTTLE_CLOCK_RATIO - 0.01).verdict == "throttled"
    assert throttle_run(30, 1.3, ratio=THROTTLE_CLOCK_RATIO).verdict == "compute-bound"


def test_idle_clock_reason_is_not_throttling():
    assert throttle_run(30, 1.3, reasons=0x1).verdict == "compute-bound"


def test_low_clock_counts_when_no_reasons_are_reported():
    d = throttle_run(30, 1.3, reasons=None)
    assert d.verdict == "throttled"
    assert said(d).title.endswith("(reduced clock)")
    assert d.confidence == "medium"


def test_clock_low_for_the_whole_run_is_a_note():
    d = gpu_run(
        0.02,
        97.0,
        gpu={"sm_clock_mhz": 1200.0, "sm_clock_max_mhz": 1590.0, "throttle_reasons": 4.0},
    )
    assert d.diagnosis.verdict == "compute-bound"
    assert said(d.diagnosis).also == [
        "The SM clock ran at 75% of its maximum during the steady steps (software power cap); steps would "
        "be faster at full clock."
    ]


# --- memory pressure ------------------------------------------------------------------------------
def test_memory_pressure_both_sides():
    total = 16384.0
    d = gpu_run(0.02, 97.0, gpu={"mem_used_mb": total * MEMORY_PRESSURE_SHARE}).diagnosis
    assert d.verdict == "memory-pressure"
    assert said(d).title == "Memory pressure: GPU memory peaked at 95% of 16.0 GiB"
    assert d.confidence == "high"
    d = gpu_run(0.02, 97.0, gpu={"mem_used_mb": total * (MEMORY_PRESSURE_SHARE - 0.001)}).diagnosis
    assert d.verdict == "compute-bound"


def test_memory_pressure_is_secondary_to_a_problem():
    d = gpu_run(0.02, 40.0, gpu={"mem_used_mb": 16000.0}).diagnosis
    assert d.verdict == "host-bound"
    assert said(d).also == [
        "Memory pressure: GPU memory peaked at 98% of 16.0 GiB; a larger batch will not fit."
    ]


def test_memory_from_the_torch_allocator_when_nvml_memory_is_missing():
    d = gpu_run(0.02, 97.0, gpu={"mem_used_mb": None, "torch_peak_mb": 16000.0}).diagnosis
    assert d.verdict == "memory-pressure"


# --- advice unit rules ------------------------------------------------------------------------------
def loader(**kw) -> LoaderInfo:
    base = dict(
        slot=0,
        num_workers=0,
        pin_memory=False,
        prefetch_factor=None,
        persistent_workers=False,
        batch_size=8,
        dataset_type="D",
        dataset_len=None,
        iterable=False,
    )
    return LoaderInfo(**{**base, **kw})


def starved_run(
    *,
    driver: str | None = None,
    iterable: bool = False,
    training: bool = True,
    dataset_type: str = "Pairs",
) -> Analysis:
    """A CPU run whose single loader, of no workers and ``driver``, waits 60% of each step
    while the host is idle: input-bound for too few workers."""
    b = RecordBuilder()
    info = b.loader(num_workers=0, batch_size=8, dataset_type=dataset_type, training=training)
    info.driver, info.iterable = driver, iterable
    b.steps(100, STEP_MS, STEP_MS * 0.6, batch=8)
    b.samples("host", **{**IDLE_HOST, "workers": 0})
    return analyze(b.finish(), cpu_capabilities(host=True), warmup=0, cpus_available=2)


def test_worker_target():
    assert worker_target(2, gpu=True) == 2
    assert worker_target(4, gpu=False) == 4
    assert worker_target(64, gpu=True) == MAX_SUGGESTED_WORKERS
    assert worker_target(None, gpu=True) == 2
    assert worker_target(1, gpu=True) == 1
    assert worker_target(1, gpu=False) == 0  # a worker would only compete for the one CPU
    assert more_workers(loader(num_workers=2), 2, gpu=True) is None
    assert more_workers(loader(num_workers=0), 1, gpu=False) is None


def test_pin_memory_only_with_a_gpu():
    cpu = [
        change_text(c.to_dict(), {"driver": None})
        for c in loader_changes(loader(), workers=2, gpu=False)
    ]
    assert cpu == [
        "num_workers=0 \u2192 num_workers=2",
        "persistent_workers=True",
        "prefetch_factor=4",
    ]
    gpu = [
        change_text(c.to_dict(), {"driver": None})
        for c in loader_changes(loader(), workers=2, gpu=True)
    ]
    assert "pin_memory=True" in gpu
    assert loader_changes(loader(num_workers=0), workers=None, gpu=False) == []
    assert loader_changes(loader(num_workers=4, prefetch_factor=8), workers=None, gpu=False) == [
        Change("persistent_workers", True)
    ]


def test_fastai_loaders_take_no_prefetch_factor_and_call_the_batch_size_bs():
    fastai = [
        change_text(c.to_dict(), {"driver": "fastai"})
        for c in loader_changes(loader(driver="fastai"), workers=2, gpu=False)
    ]
    assert fastai == ["num_workers=0 \u2192 num_workers=2", "persistent_workers=True"]
    assert setting_name("batch_size", "fastai") == "bs"
    assert setting_name("batch_size", None) == "batch_size"
    assert "prefetch_factor" not in advice_loader_settings(loader(driver="fastai"))
    assert "prefetch_factor" in advice_loader_settings(loader())


def test_a_fastai_input_bound_run_is_advised_in_fastai_terms_without_the_tuner():
    d = starved_run(driver="fastai").diagnosis
    assert d.cause == CAUSE_TOO_FEW_WORKERS
    assert said(d).advice == [
        "Change the arguments where your fastai DataLoaders are made (DataBlock.dataloaders, "
        "ImageDataLoaders.from_\u2026, DataLoaders.from_dsets and DataLoader take them): "
        "num_workers=0 \u2192 num_workers=2, persistent_workers=True",
        "With num_workers=0, the main process loads every batch while the training loop waits; "
        "2 workers (one per CPU available: 2) load batches in parallel with the compute.",
        "persistent_workers=True keeps the workers alive between epochs instead of starting them "
        "again (each start costs the first-batch wait again).",
    ]
    assert evidence(d, "DataLoader") == (
        "num_workers=0, pin_memory=False, persistent_workers=False, bs=8"
    )


@pytest.mark.parametrize(
    ("driver", "setting"),
    [(None, "num_workers"), ("transformers", "dataloader_num_workers"),
     ("skorch", "iterator_train__num_workers")],
)  # fmt: skip
def test_no_workers_is_said_in_the_name_the_user_sets(driver, setting):
    d = starved_run(driver=driver).diagnosis
    assert evidence(d, "worker CPU") == (
        f"no worker processes ({setting}=0): the main process loads the data"
    )


@pytest.mark.parametrize(
    "driver", [None, "fastai", "keras", "keras-pydataset", "skorch-arrays", "skorch"]
)
def test_tiny_steps_of_a_frameworks_own_loader_are_advised_larger_batches(driver):
    """Tiny steps whose batches a framework's loader makes (fastai's, Keras', skorch's of the
    arrays given to ``fit``): no ``__getitems__`` to give, but fewer, larger batches, named as
    that framework takes them; the user's own dataset (skorch iterating one too) keeps the
    advice to make each batch in one call."""
    from traceml_nb.analysis.diagnosis import LARGER_BATCHES

    b = RecordBuilder()
    b.loader(num_workers=0, batch_size=8, dataset_type="Pairs").driver = driver
    b.steps(100, 0.15, 0.05, batch=8)
    d = analyze(b.finish(), cpu_capabilities(), warmup=0, cpus_available=2).diagnosis
    assert d.verdict == "compute-bound"
    if driver in (None, "skorch"):
        assert d.advice == [Finding(BATCHED_INDEXING)]
        return
    assert d.advice == [Finding(LARGER_BATCHES, {"driver": driver})]
    where = {
        "fastai": "a larger bs where your fastai DataLoaders are made",
        "keras": "a larger batch_size in model.fit",
        "keras-pydataset": "larger batches from your PyDataset's __getitem__",
        "skorch-arrays": "a larger batch_size in your skorch NeuralNet",
    }[driver]
    assert said(d).advice == [
        "Make fewer, larger batches: the loader makes each one itself, at a cost per batch that "
        f"these short steps cannot hide, and {where} pays it for more samples at once."
    ]


@pytest.mark.parametrize("driver", ["keras", "keras-fit"])
def test_a_keras_input_bound_run_is_advised_where_its_dataloader_is_made(driver):
    """The DataLoader Keras made of arrays: give model.fit one of your own with these settings;
    the one the user gave model.fit: change it. Neither is offered to ``tune``."""
    d = starved_run(driver=driver).diagnosis
    assert d.cause == CAUSE_TOO_FEW_WORKERS
    where = {
        "keras": "Keras made this DataLoader of what model.fit was given, with num_workers=0: "
        "pass model.fit a torch DataLoader made with these arguments instead",
        "keras-fit": "Change the DataLoader you pass to model.fit()",
    }[driver]
    assert said(d).advice[0] == (
        f"{where}: num_workers=0 → num_workers=2, persistent_workers=True, prefetch_factor=4"
    )
    assert (Finding("tune-hint") in d.advice) is (driver == "keras-fit")


def test_system_cpu_evidence_names_the_busiest_core():
    d = cpu_run(0.6, host={**IDLE_HOST, "max_core_pct": 100.0}).diagnosis
    assert evidence(d, "system CPU") == "median 50% of all CPUs (busiest core 100%)"


def test_throttle_reason_names_match_the_gpu_sampler():
    from traceml_nb.analysis.thresholds import THROTTLE_REASON_NAMES
    from traceml_nb.engine.contracts import CLOCK_EVENT_REASONS as CLOCK_EVENT_BITS

    for bit, name in THROTTLE_REASON_NAMES.items():
        assert CLOCK_EVENT_BITS[bit] == name


def test_every_verdict_is_reachable():
    reached = {
        cpu_run(0.6).diagnosis.verdict,
        cpu_run(0.6, steps=3).diagnosis.verdict,
        gpu_run(0.02, 40.0).diagnosis.verdict,
        gpu_run(0.02, 96.0).diagnosis.verdict,
        gpu_run(0.02, 96.0, gpu={"mem_used_mb": 16300.0}).diagnosis.verdict,
        throttle_run(30, 1.5).verdict,
    }
    assert reached == set(VERDICTS)


def test_diagnosis_round_trips_through_a_dict():
    d = gpu_run(0.44, 51.0).diagnosis
    assert Diagnosis.from_dict(d.to_dict()) == d


def test_optimizer_steps_on_cpu_with_a_loader():
    b = RecordBuilder()
    b.loader(training=False)
    b.steps(5, 1.0, 0.5)
    b.steps(50, 20.0, 15.0, source=SOURCE_OPTIMIZER)
    d = analyze(b.finish(), cpu_capabilities(), warmup=0, cpus_available=2).diagnosis
    assert d.verdict == "input-bound"
    assert d.cause == CAUSE_TOO_FEW_WORKERS


def test_a_one_epoch_run_is_never_said_to_be_slow_on_its_first_epoch():
    b = RecordBuilder()
    b.loader(num_workers=2, pin_memory=True, persistent_workers=True, dataset_type="ImageFolder")
    b.steps(150, STEP_MS, STEP_MS * 0.5, epoch_len=1000)  # one epoch, waiting half the time
    b.samples("host", **saturated_host(20.0))
    d = analyze(b.finish(), cpu_capabilities(), warmup=0, cpus_available=2).diagnosis
    assert d.verdict == "input-bound"
    assert d.cause == CAUSE_STORAGE != CAUSE_FIRST_EPOCH
    assert "first epoch" not in d.cause and not any("first epoch" in a for a in said(d).advice)


# --- stalls: one long pause is not an input pipeline -------------------------------------------
def stall_run(stall_ms: float, stalls: int = 1, *, steps: int = 150, step_ms: float = 3.4):
    """Fast steps (0.5 ms of data wait each) with ``stalls`` fetches that wait ``stall_ms``."""
    b = RecordBuilder()
    b.loader(num_workers=0, batch_size=8)
    at = {37 + 20 * k for k in range(stalls)}
    b.steps(
        steps,
        lambda i: step_ms + (stall_ms if i + 1 in at else 0.0),
        lambda i: 0.5 + (stall_ms if i + 1 in at else 0.0),
    )
    return analyze(b.finish(), cpu_capabilities(), warmup=0, cpus_available=2)


def test_one_long_pause_is_a_stall_named_not_an_input_bound_pipeline():
    a = stall_run(1000.0)
    d = a.diagnosis
    assert a.summary.data_wait_share > 0.6  # the plain share: one second of 1.5
    assert d.verdict == "compute-bound", said(d).title
    assert "15%" in said(d).title  # the share without the stall: 0.5 ms of 3.4 ms
    stall_line = [line for line in said(d).also if line.startswith("One fetch")]
    assert stall_line == [
        "One fetch, at step 37, took 1 s: a stall, not a slow pipeline; without it the run "
        "would take at most 66% less time."
    ]
    evidence = {e.label: sentence(e.detail) for e in d.evidence}["data wait"]
    assert evidence.startswith("15% of step time (0.5 ms per step) without the stall at step 37")
    assert not any("input-bound" in line.lower() for line in [said(d).title, *said(d).advice])


def test_stall_factor_both_sides():
    # 3.4 ms steps: a wait above 10x the median step (34 ms) is a stall, one below is not
    below = stall_run(STALL_FACTOR * 3.4 - 1.0).diagnosis
    above = stall_run(STALL_FACTOR * 3.4 + 1.0).diagnosis
    assert not any("a stall" in line for line in said(below).also)
    assert any("One fetch, at step 37" in line for line in said(above).also)


def test_stall_max_share_both_sides():
    # 150 steps: up to 2% (3 steps) are stalls; a fourth makes them the pipeline's pace
    three = stall_run(200.0, stalls=int(STALL_MAX_SHARE * 150)).diagnosis
    four = stall_run(200.0, stalls=int(STALL_MAX_SHARE * 150) + 1).diagnosis
    assert three.verdict == "compute-bound"
    assert any(
        line.startswith("3 fetches, at steps 37, 57 and 77, took 200 ms, 200 ms and 200 ms")
        for line in said(three).also
    )
    assert four.verdict == "input-bound"  # many long waits: a slow pipeline after all
    assert not any("a stall" in line or "stalls, not" in line for line in said(four).also)


def test_a_stall_on_top_of_a_slow_pipeline_is_input_bound_and_named():
    b = RecordBuilder()
    b.loader(num_workers=0, batch_size=8)
    b.steps(
        150,
        lambda i: 20.0 + (2000.0 if i == 36 else 0.0),
        lambda i: 10.0 + (2000.0 if i == 36 else 0.0),
    )
    d = analyze(b.finish(), cpu_capabilities(), warmup=0, cpus_available=2).diagnosis
    assert d.verdict == "input-bound" and "50%" in said(d).title  # judged without the stall
    assert any(line.startswith("One fetch, at step 37, took 2.01 s") for line in said(d).also)
    assert d.saving_bound_share > 0.5  # the bound still counts the stall


def test_input_bound_advice_names_the_tuner_where_the_settings_are_the_cause():
    d = cpu_run(0.6, host={**IDLE_HOST, "workers": 0}).diagnosis
    assert d.cause == CAUSE_TOO_FEW_WORKERS
    assert d.advice[-1].code == TUNE_HINT and "%traceml tune" in said(d).advice[-1]
    d = first_epoch_run(0.4, 0.1)  # slow storage on the first pass: no loader setting helps
    assert d.cause == CAUSE_FIRST_EPOCH
    assert TUNE_HINT not in d.codes()


def test_an_evaluation_restarting_its_workers_is_noted_past_both_constants():
    """``EVAL_RESTART_MIN_PASSES`` passes and ``EVAL_RESTART_RUN_SHARE`` of the run waited in
    their first batches, with workers not kept: a note; one short of either, or workers kept,
    or none: no note."""
    from types import SimpleNamespace

    from traceml_nb.analysis.diagnosis import _evaluation_restarts
    from traceml_nb.analysis.findings import PhaseSummary
    from traceml_nb.analysis.thresholds import EVAL_RESTART_MIN_PASSES, EVAL_RESTART_RUN_SHARE

    def notes(passes=EVAL_RESTART_MIN_PASSES, wait_s=EVAL_RESTART_RUN_SHARE * 10, **loader):
        phase = PhaseSummary("eval (loader 1)", passes, 1.0, 0.9, slot=1, passes=passes)
        phase.workers, phase.pass_start_wait_s = loader.get("workers", 2), wait_s
        phase.persistent_workers = loader.get("persistent", False)
        phase.driver = loader.get("driver")
        phase.loaders = loader.get("loaders", 1)
        summary = SimpleNamespace(phases=[phase])
        facts = SimpleNamespace(summary=summary, m=SimpleNamespace(elapsed_s=10.0))
        return _evaluation_restarts(facts)  # type: ignore[arg-type]

    [note] = notes()
    assert note.facts["run_share"] == pytest.approx(EVAL_RESTART_RUN_SHARE)
    assert sentence(note) == (
        "eval (loader 1): its DataLoader started its 2 workers again for each of its 2 passes "
        "(persistent_workers=False); their first batches waited 0.5 s, 5% of the run, besides "
        "starting and stopping them (in iter() and when an iterator is dropped, not timed). "
        "persistent_workers=True keeps the workers between passes."
    )
    assert notes(passes=EVAL_RESTART_MIN_PASSES - 1) == []
    assert notes(wait_s=EVAL_RESTART_RUN_SHARE * 10 - 0.001) == []
    assert notes(persistent=True) == [] and notes(workers=0) == []
    [built] = notes(loaders=2)  # a DataLoader built for each pass: keeping workers needs one
    assert sentence(built).endswith(
        "Each pass built a DataLoader of its own: build it once, and persistent_workers=True "
        "keeps the workers between passes."
    )
    # a Trainer's evaluation (which builds its loaders itself): its argument's name
    [trainer] = notes(driver="transformers", loaders=6)
    assert sentence(trainer).endswith(
        "dataloader_persistent_workers=True keeps the workers between passes."
    )
    # skorch builds its loaders anew each epoch, whatever persistent_workers says: none kept
    [skorch] = notes(driver="skorch", loaders=4)
    assert sentence(skorch) == (
        "eval (loader 1): its DataLoader started its 2 workers again for each of its 2 passes; "
        "their first batches waited 0.5 s, 5% of the run, besides starting and stopping them "
        "(in iter() and when an iterator is dropped, not timed). skorch builds its DataLoaders "
        "anew for each epoch, so their workers cannot be kept: iterator_valid__num_workers=0 "
        "leaves their start out where a batch is cheap to make in the main process."
    )


@pytest.mark.parametrize("training", [True, False])
@pytest.mark.parametrize(
    ("driver", "where", "workers", "batch_size"),
    [
        (None, "Change the training DataLoader|Change the DataLoader", "num_workers",
         "batch_size"),
        ("transformers", "Change the Trainer's TrainingArguments", "dataloader_num_workers",
         "per_device_train_batch_size|per_device_eval_batch_size"),
        ("skorch", "Change the arguments of your skorch NeuralNet",
         "iterator_train__num_workers|iterator_valid__num_workers", "batch_size"),
        ("lightning", "Change the DataLoader that your LightningModule's (or DataModule's) "
         "train_dataloader() returns|Change the DataLoader that your LightningModule's (or "
         "DataModule's) val_dataloader(), test_dataloader() or predict_dataloader() returns",
         "num_workers", "batch_size"),
    ],
)  # fmt: skip
def test_a_loader_that_does_not_train_is_advised_by_its_own_names(
    driver, where, workers, batch_size, training
):
    """An inference's or a prediction's loader (no optimizer step follows its batches) is set
    where an evaluation's is: skorch's ``iterator_valid__`` prefix, the Trainer's
    ``per_device_eval_batch_size``, Lightning's evaluation loaders; the loop that waits is
    no training loop. Each "a|b" is the training loader's, then the other's. skorch builds
    its loaders anew each epoch: persistent workers are never advised there."""

    def pick(text: str) -> str:
        both = text.split("|")
        return both[0] if training or len(both) == 1 else both[1]

    d = starved_run(driver=driver, training=training).diagnosis
    assert d.cause == CAUSE_TOO_FEW_WORKERS
    loop = "the training loop" if training else "the loop"
    assert said(d).title.startswith(f"Input-bound: {loop} waits for data")
    name = pick(workers)
    persistent = "" if driver == "skorch" else f", {name.replace('num', 'persistent')}=True"
    prefetch = f"{name.replace('num_workers', 'prefetch_factor')}=4"
    assert said(d).advice[0] == (f"{pick(where)}: {name}=0 → {name}=2{persistent}, {prefetch}")
    assert f"while {loop} waits" in said(d).advice[1]
    assert evidence(d, "DataLoader").endswith(f"{pick(batch_size)}=8")
    assert ("persistent_workers" in evidence(d, "DataLoader")) is (driver != "skorch")


@pytest.mark.parametrize("iterable", [True, False])
def test_more_workers_for_an_iterable_dataset_say_what_each_worker_yields(iterable):
    """Each worker iterates its own copy of an ``IterableDataset``: advised more workers, the
    advice says that a stream not split by worker comes once a worker (a probe followed the
    advice and trained on every sample twice); a map-style dataset's indices are split by
    the DataLoader itself: nothing to say."""
    d = starved_run(iterable=iterable, dataset_type="Stream").diagnosis
    assert d.cause == CAUSE_TOO_FEW_WORKERS
    note = (
        "The dataset is an IterableDataset: each of the 2 workers iterates a copy of it, so "
        "unless its __iter__ splits the stream by worker (torch.utils.data.get_worker_info()), "
        "every sample comes 2 times."
    )
    assert (note in said(d).advice) is iterable
