"""DataLoader workers short of CPU: idle workers on a busy machine that wait for a CPU (on the
run queue) are starved by other threads, not waiting on storage. Each threshold on both sides,
on hand-built records of a CPU-only run (Colab's 2 CPUs)."""

from __future__ import annotations

from builders import RecordBuilder, cpu_capabilities

from traceml_nb.analysis import analyze
from traceml_nb.analysis.findings import Diagnosis
from traceml_nb.analysis.input_bound import (
    CAUSE_CPU_SATURATED,
    CAUSE_CPU_STARVED,
    CAUSE_IN_MEMORY,
    CAUSE_STORAGE,
    CAUSE_TOO_FEW_WORKERS,
    TUNE_HINT,
)
from traceml_nb.analysis.thresholds import (
    TRAINING_CORES_PCT,
    WORKER_BUSY_PCT,
    WORKER_STARVED_PCT,
)
from traceml_nb.views.diagnosis_words import diagnosis_words


def _run(
    per_worker: float,
    wait: float | None,
    *,
    training: float = 125.0,
    cpus: int = 2,
    workers: int = 2,
    dataset_type: str = "ImageFolder",
    system: float = 100.0,
) -> Diagnosis:
    """A CPU-only run waiting 40% of its steps for data, its ``workers`` each using
    ``per_worker`` % CPU and waiting ``wait`` % of the time for one (None: not measured), the
    training process ``training`` %, the machine ``system`` % busy."""
    b = RecordBuilder()
    b.loader(num_workers=workers, batch_size=8, dataset_type=dataset_type)
    b.steps(100, 30.0, 12.0, batch=8)
    host = {
        "workers_cpu_pct": per_worker * workers,
        "workers": workers,
        "sys_cpu_pct": system,
        "proc_cpu_pct": training,
    }
    if wait is not None:
        host["workers_cpu_wait_pct"] = wait * workers
    b.samples("host", **host)
    return analyze(b.finish(), cpu_capabilities(host=True), warmup=0, cpus_available=cpus).diagnosis


def test_workers_waiting_for_a_cpu_the_training_threads_take_are_told_to_leave_them_one():
    """Measured on this 2-core VM: 2 workers spinning 1 ms an item beside a training process
    with 2 intra-op threads used 35% CPU each and waited 33-37% for a CPU; with
    ``torch.set_num_threads(1)`` the step took 9.6 ms instead of 12.9."""
    d = _run(35.0, 35.0)
    assert d.verdict == "input-bound" and d.cause == CAUSE_CPU_STARVED
    words = diagnosis_words(d)
    assert words.cause == (
        "DataLoader workers short of CPU (they wait for one; other threads take it)"
    )
    assert words.advice[0] == (
        "The training process itself uses 125% CPU (torch's intra-op threads) on 2 CPUs, and "
        "its workers wait for a CPU (the 2 workers use 70% CPU (35% each, waiting 35% of the "
        "time for a CPU) and the system CPU is at 100%). Call torch.set_num_threads(1) before "
        "the loop to leave the workers the CPUs they need, and keep it if the steps are faster."
    )
    assert words.advice[1].startswith("The input pipeline is CPU-bound")
    # tune iterates the loaders without the model, whose threads the workers wait for
    assert TUNE_HINT not in [f.code for f in d.advice]
    assert words.wont_help[0] == (
        "More DataLoader workers: the workers already wait for a CPU; more would wait too."
    )
    assert "slow storage" not in " ".join(words.advice + [words.cause or ""])


def test_a_worker_waiting_that_long_for_a_cpu_is_starved_both_sides():
    """At ``WORKER_STARVED_PCT`` a worker is starved; just below, a worker that would use
    ``WORKER_BUSY_PCT`` with the CPU it waits for is still CPU-bound (saturated)."""
    assert _run(35.0, WORKER_STARVED_PCT).cause == CAUSE_CPU_STARVED
    assert _run(35.0, WORKER_STARVED_PCT - 0.5).cause == CAUSE_CPU_SATURATED


def test_a_worker_is_cpu_bound_on_a_busy_machine_by_its_cpu_and_its_wait_both_sides():
    """Idle workers that wait for a CPU want it; those that sleep (on storage) do not."""
    wait = WORKER_STARVED_PCT - 0.5  # not starved by itself
    assert _run(WORKER_BUSY_PCT - wait, wait).cause == CAUSE_CPU_SATURATED
    assert _run(WORKER_BUSY_PCT - wait - 0.5, wait).cause == CAUSE_STORAGE
    assert _run(4.0, 2.0).cause == CAUSE_STORAGE  # sleeping workers, as measured here: 1-4%


def test_workers_waiting_for_a_cpu_are_starved_however_busy_the_machine_reads():
    """Measured on this VM with one intra-op thread: the workers used 50% CPU each and waited
    28% for a CPU while the system CPU read 90% on average (just under
    ``SYSTEM_SATURATED_PCT``); they had been called "slow storage"."""
    assert _run(50.0, 28.0, training=80.0, system=85.0).cause == CAUSE_CPU_STARVED
    assert _run(50.0, WORKER_STARVED_PCT - 0.5, system=85.0).cause == CAUSE_STORAGE


def test_without_the_wait_measured_idle_workers_of_a_busy_machine_are_as_before():
    assert _run(35.0, None).cause == CAUSE_STORAGE


def test_the_training_threads_are_named_only_where_they_take_the_workers_cpus_both_sides():
    def first_advice(d: Diagnosis) -> str:
        return d.advice[0].code

    assert first_advice(_run(35.0, 35.0, training=TRAINING_CORES_PCT)) == "fewer-training-threads"
    below = _run(35.0, 35.0, training=TRAINING_CORES_PCT - 0.5)
    assert first_advice(below) == "workers-short-of-cpu"
    assert diagnosis_words(below).advice[0] == (
        "The workers wait for a CPU (the 2 workers use 70% CPU (35% each, waiting 35% of the "
        "time for a CPU) and the system CPU is at 100%) that the training process (120% CPU) "
        "and any other processes take: the 2 CPUs cannot run them all. Make each sample cheaper "
        "(below), stop what else runs on this machine, or run where the workers have CPUs of "
        "their own."
    )
    # 4 CPUs, 2 workers: the training process may use 2 of them
    assert first_advice(_run(35.0, 35.0, training=190.0, cpus=4)) == "workers-short-of-cpu"
    more = _run(35.0, 35.0, training=210.0, cpus=4)
    assert first_advice(more) == "fewer-training-threads"
    assert "torch.set_num_threads(2)" in diagnosis_words(more).advice[0]


def test_starved_workers_of_a_dataset_in_memory_are_its_hand_over():
    d = _run(35.0, 35.0, dataset_type="TensorDataset")
    assert d.cause == CAUSE_IN_MEMORY


def test_idle_workers_of_a_dataset_in_memory_are_not_asked_to_be_more_where_cpus_are_free():
    """4 CPUs, 2 idle workers of a TensorDataset: the hand-over, not "too few workers"; busy
    workers with CPUs free are still too few."""
    assert _run(20.0, 2.0, cpus=4, dataset_type="TensorDataset").cause == CAUSE_IN_MEMORY
    busy = _run(95.0, 2.0, cpus=4, dataset_type="TensorDataset", system=60.0)
    assert busy.cause == CAUSE_TOO_FEW_WORKERS
