"""The analysis results: plain data, JSON-able, shared by the report, the history and ``-o``.

Units are in the field names (``_ms``, ``_s``, ``_mb``, ``_share`` = fraction 0..1,
``_pct`` = percent 0..100). ``None`` means unavailable; the reason is in ``unavailable``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import TYPE_CHECKING, Any, TypeVar

from ..engine.contracts import Confidence, StepSource, Verdict

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

_T = TypeVar("_T", bound="DataclassInstance")


def _from_dict(cls: type[_T], data: dict[str, Any]) -> _T:
    """Build dataclass ``cls`` from ``data``, ignoring unknown keys (forward compatible)."""
    names = {f.name for f in fields(cls)}
    return cls(**{k: v for k, v in data.items() if k in names})


@dataclass
class PhaseSummary:
    """A phase other than the measured steps (an eval loader, an extra loader)."""

    name: str  #: e.g. "eval (loader 1)", "eval (loaders 1–4)"
    batches: int
    total_s: float  #: time away from training the phase took, s
    data_wait_share: float | None
    slot: int | None = None  #: the phase's (first) loader
    #: of ``batches`` and ``total_s``, what came before the run's first optimizer step (a
    #: trainer's sanity check of its validation loader)
    before_training_batches: int = 0
    before_training_s: float = 0.0
    passes: int = 0  #: the epochs begun over it (``next(iter(loader))``: one a batch)
    #: its loader's ``num_workers`` (the largest of its loaders') and whether they are all
    #: kept between passes (``persistent_workers``)
    workers: int = 0
    persistent_workers: bool = False
    #: the waits of its passes' first batches, s: with workers that are not kept, each pass
    #: starts them again and waits for that
    pass_start_wait_s: float = 0.0
    driver: str | None = None  #: what iterates it (``LoaderInfo.driver``: "transformers"…)
    loaders: int = 1  #: the DataLoaders it iterated (one built anew for each evaluation)
    #: its loader trains too (an evaluation over the training loader): its settings are named
    #: as a training loader's (``advice.setting_name``)
    trains: bool = False


@dataclass
class Summary:
    """Steady-state statistics of one run (warm-up steps excluded, reported separately)."""

    step_source: StepSource
    total_steps: int  #: every step the loop made
    warmup_steps: int  #: leading steps excluded as warm-up / compile
    steady_steps: int  #: the steps the statistics are about
    elapsed_s: float  #: wall time of the run
    warmup_s: float  #: wall time of the warm-up steps
    #: the steady steps' median, 10th and 90th percentiles, ms; with ``step_block`` over 1, of
    #: the means of blocks of that many consecutive steps (:mod:`.step_blocks`)
    step_ms_median: float | None
    step_ms_p10: float | None
    step_ms_p90: float | None
    step_ms_mean: float | None
    data_wait_ms_median: float | None  #: (over the same blocks)
    compute_ms_median: float | None  #: the median of step less data wait (the same blocks)
    data_wait_share: float | None  #: sum(data wait) / sum(step time), steady steps
    first_fetch_ms: float | None  #: first batch of the run (worker start-up)
    batch_size: int | None  #: median batch size
    samples_per_s: float | None
    steps_per_s: float | None
    gpu_stall_share: float | None  #: sum(GPU input stall) / sum(step time), CUDA events
    gpu_util_median_pct: float | None  #: NVML, during the steady steps
    gpu_mem_peak_mb: float | None
    gpu_mem_total_mb: float | None
    process_cpu_median_pct: float | None  #: main process, 100 = one core
    workers_cpu_median_pct: float | None  #: DataLoader workers, summed, 100 = one core
    system_cpu_median_pct: float | None  #: whole machine, 0..100
    cpus_available: int | None
    phases: list[PhaseSummary] = field(default_factory=list)
    unavailable: dict[str, str] = field(default_factory=dict)  #: metric -> why
    #: steps an evaluation ran inside: counted, but left out of the statistics (their time is
    #: the evaluation's too)
    interleaved_steps: int = 0
    #: steps that ran under the profiler (``--profile``), left out of the statistics
    profiled_steps: int = 0
    #: the consecutive steady steps the step time's statistics average first: 1 (the steps'
    #: own), or whole rounds of the training loader's two or more workers (:mod:`.step_blocks`)
    step_block: int = 1
    #: steal time: the share of the machine's CPU time the hypervisor gave to other guests
    #: while this virtual machine wanted to run, percent 0..100 of all its CPUs' time, mean
    #: over the steady steps (None where the kernel reports none: not Linux)
    steal_mean_pct: float | None = None
    #: GPM metrics (Hopper and later GPUs), medians over the steady steps, percent 0..100: SM
    #: activity (the share of the SMs busy), SM occupancy (resident warps / the maximum),
    #: tensor-core activity (share of time) and DRAM bandwidth used (share of its maximum)
    sm_active_median_pct: float | None = None
    sm_occupancy_median_pct: float | None = None
    tensor_active_median_pct: float | None = None
    dram_bw_median_pct: float | None = None
    #: where the steady steps went (:mod:`traceml_nb.analysis.step_anatomy`): the median input
    #: copy, forward, backward, optimizer step and rest of the loop, ms (host clocks; GPU time
    #: when ``phases_on_gpu``)...
    copy_ms_median: float | None = None
    forward_ms_median: float | None = None
    backward_ms_median: float | None = None
    optimizer_ms_median: float | None = None
    other_ms_median: float | None = None
    #: ...and each part's share of the steps' time, 0..1, by part (data_wait, copy, forward,
    #: backward, optimizer, other; they sum to 1); empty where the phases were not measured
    phase_shares: dict[str, float] = field(default_factory=dict)
    #: ...and the phases that ran in at most half of the steps (median 0: gradient
    #: accumulation's optimizer step), by phase: [share of the steps it ran in, 0..1, its
    #: median over those steps, ms]
    occasional_phases: dict[str, list[float]] = field(default_factory=dict)
    #: the phases are GPU time (CUDA events), their data wait the GPU's stall for the batch
    phases_on_gpu: bool = False
    #: steps the FLOP count slowed, left out of the statistics
    flop_counted_steps: int = 0
    #: steps that began inside the FLOP count: one optimizer step's cycle (several under
    #: gradient accumulation, or where a second optimizer steps in between)
    flop_window_steps: int = 0
    #: floating-point operations of one training step (a multiply-add counts 2), counted once
    #: with FlopCounterMode (:mod:`traceml_nb.engine.instrument.flop_count`) over
    #: ``flop_window_steps`` steps, divided by them
    flops_per_step: float | None = None
    #: where the loop changed the parameters it trains after the first count (an unfreeze),
    #: the step (from 1, of all the run's) from which the count made again stands:
    #: ``flops_per_step`` and the FLOP/s are of the steady steps since; None: of the whole run
    flops_since_step: int | None = None
    #: floating-point operations per step of the forwards activation checkpointing recomputed
    #: in the backward: done, but not the model's (not in ``flops_per_step``, the FLOP/s or the
    #: MFU); 0 where none ran or none could be told
    recomputed_flops_per_step: float = 0.0
    #: ...and of the work done outside the model's forward and backward (with autograd off:
    #: an optimizer's own matrix work, as Muon's; before the step's first module call: the
    #: batch's preparation, fastai's batch transforms), likewise left out
    outside_flops_per_step: float = 0.0
    #: operators the count has no formula for, other libraries' and torch's that compute (their
    #: FLOPs, if any, are not in ``flops_per_step``, a lower bound then), by name
    #: ("xformers::efficient_attention_forward_cutlass", "aten::_fft_r2c")
    uncounted_ops: list[str] = field(default_factory=list)
    #: ...and those that ran outside the model (no part of ``flops_per_step``; whatever they
    #: did is not in ``outside_flops_per_step`` either)
    uncounted_outside_ops: list[str] = field(default_factory=list)
    #: where the steps' batches differ in their samples' size (padded to their longest
    #: sequence), the elements of their first tensor: [the counted steps' mean, the steps' mean,
    #: the least, the most]; ``flops_per_step`` is then the count taken in proportion to them,
    #: the steps' mean (:mod:`.input_sizes`); None: as counted
    flop_input_elements: list[float] | None = None
    #: those FLOPs over the median rest of the step (the step less its data wait), TFLOP/s;
    #: where the batches differ in size, the median of each step's FLOPs over its rest
    achieved_tflops: float | None = None
    #: the share (0..1) of those FLOPs each precision did: "fp32", "tf32", "fp16", "bf16"
    #: (empty: not told)
    flop_precisions: dict[str, float] = field(default_factory=dict)
    #: what they ran on: "cpu" or the CUDA device's name ("Tesla T4"); None: not counted
    flop_device: str | None = None
    #: the share (0..1) of those FLOPs in convolutions, and of the convolutions' FLOPs on
    #: inputs in channels_last memory format (None: not told)
    conv_share: float | None = None
    channels_last_share: float | None = None
    #: model FLOPs utilisation: achieved_tflops over the device's peak for the precisions the
    #: FLOPs ran in (``mfu_peak_tflops``, TFLOP/s; :mod:`traceml_nb.analysis.peak_flops`), 0..1
    mfu: float | None = None
    mfu_peak_tflops: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Summary:
        obj = _from_dict(cls, data)
        obj.phases = [
            p if isinstance(p, PhaseSummary) else _from_dict(PhaseSummary, p) for p in obj.phases
        ]
        return obj


#: The code of a finding stored before findings were data: ``facts["text"]`` is its sentence.
TEXT = "text"


@dataclass(frozen=True)
class Finding:
    """One statement of a diagnosis, as data: ``code`` says what it states (the views write its
    sentence: :mod:`traceml_nb.views.diagnosis_words`), ``facts`` the numbers and names it rests
    on (JSON-able; units in the keys as elsewhere: ``_ms``, ``_share`` 0..1, ``_pct`` 0..100)."""

    code: str
    facts: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def of(cls, data: Finding | dict[str, Any] | str) -> Finding:
        """A finding from its dict, or from a sentence stored before findings were data."""
        if isinstance(data, Finding):
            return data
        if isinstance(data, str):
            return cls(TEXT, {"text": data})
        return cls(str(data.get("code", TEXT)), dict(data.get("facts") or {}))


#: The code of evidence that was not measured: ``facts["why"]`` says why.
UNAVAILABLE = "unavailable"


@dataclass
class Evidence:
    """One number behind a verdict: ``label`` names it (``"data wait"``), ``value`` is the
    number the rules read (a share 0..1, a percent, ms or a count, by label; None: unavailable)
    and ``detail`` what the report shows with it, a :class:`Finding` (code :data:`UNAVAILABLE`
    with ``why`` where it was not measured)."""

    label: str
    value: float | None
    detail: Finding

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Evidence:
        """Stored evidence; evidence stored as a sentence (``text``) keeps it."""
        detail = data.get("detail")
        finding = (
            Finding.of(detail) if detail is not None else Finding.of(str(data.get("text", "")))
        )
        return cls(str(data.get("label", "")), data.get("value"), finding)


#: The causes an input-bound run names (``Diagnosis.cause``), by the sentence runs stored before
#: causes were codes (their ``cause`` column and diagnosis still hold it).
OLD_CAUSE_TEXTS = {
    "too few DataLoader workers": "too-few-workers",
    "DataLoader workers CPU-saturated (decode/augmentation bound)": "workers-cpu-saturated",
    "host-to-device copies from pageable memory": "pageable-copies",
    "slow storage on the first epoch (later epochs read from the cache)": "first-epoch-storage",
    "slow storage (the workers are idle, yet cannot keep up)": "slow-storage",
    "input pipeline too slow (worker CPU unavailable)": "input-unknown",
}


def cause_code(cause: str | None) -> str | None:
    """The cause's code, an old stored cause sentence mapped to it."""
    return OLD_CAUSE_TEXTS.get(cause, cause) if cause else None


@dataclass
class Diagnosis:
    """The verdict on a run, with its evidence and the concrete fix, as findings (the views
    write their sentences).

    ``title``: what the verdict rests on, one line; ``cause``: an input-bound run's sub-cause, a
    code (``"too-few-workers"``, :mod:`.input_bound`); ``profiled_cause``: what the profile
    (``--profile``) names as the cause; ``advice``: concrete changes, from the user's loader;
    ``wont_help``: what will not help, and why; ``saving_bound_share``: fixing the cause saves
    at most this share of the wall time, ``saving`` says of what; ``secondary``: other findings
    (memory pressure, throttling, stalls).
    """

    verdict: Verdict
    title: Finding
    confidence: Confidence
    cause: str | None = None
    profiled_cause: Finding | None = None
    evidence: list[Evidence] = field(default_factory=list)
    advice: list[Finding] = field(default_factory=list)
    wont_help: list[Finding] = field(default_factory=list)
    saving_bound_share: float | None = None
    saving: Finding | None = None
    secondary: list[Finding] = field(default_factory=list)

    def codes(self) -> list[str]:
        """Every finding's code, title first: what a test or a tracker can match on."""
        found = [self.title, *self.advice, *self.wont_help, *self.secondary]
        found += [f for f in (self.profiled_cause, self.saving) if f is not None]
        return [f.code for f in found]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Diagnosis:
        """A stored diagnosis, those stored with sentences included (each becomes a
        :data:`TEXT` finding; ``saving_text`` the ``saving``)."""
        data = dict(data)
        if "saving_text" in data and "saving" not in data:
            data["saving"] = data.pop("saving_text")
        obj = _from_dict(cls, data)
        obj.title = Finding.of(obj.title if obj.title is not None else "")
        obj.cause = cause_code(obj.cause)
        for name in ("profiled_cause", "saving"):
            value = getattr(obj, name)
            setattr(obj, name, Finding.of(value) if value else None)
        for name in ("advice", "wont_help", "secondary"):
            setattr(obj, name, [Finding.of(f) for f in getattr(obj, name) or []])
        obj.evidence = [
            e if isinstance(e, Evidence) else Evidence.from_dict(e) for e in obj.evidence
        ]
        return obj


@dataclass
class IdleCost:
    """What a run's idle accelerator time cost.

    ``idle_gpu_s`` idle GPU seconds (the run's wall time × the idle share); ``idle_share`` the
    idle share, 0..1, from ``method``: ``"1 - GPU utilisation"`` (NVML's median busy share)
    or ``"GPU input stall"`` (CUDA events); ``usd_per_hour`` the price of one GPU-hour used,
    ``cost_usd`` the idle time's price (both None without a price for the GPU), ``price_source``
    where the price comes from.
    """

    idle_gpu_s: float
    idle_share: float
    method: str
    gpu_name: str | None
    usd_per_hour: float | None
    cost_usd: float | None
    price_source: str | None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Changes:
    """What differs between a run and its baseline (each list: one item a difference).

    ``code``: changed lines of the cell source (``- old`` / ``+ new``); ``definitions``: the
    notebook's functions and classes the cell uses (defined in other cells) that changed, one
    line each (``train changed (defined outside the cell)``); ``definitions_unrecorded``: the
    earlier run was stored before they were recorded; ``values``: the plain values the cell
    reads from the notebook that differ (``HIDDEN 512 → 1024``); ``script``: a sentence
    when the main script's source changed (runs of a script store a hash of it, not the
    source: no lines to show); ``arguments``: a sentence when its arguments changed (a hash
    too), ``argument_names`` the arguments that changed where each was recorded by name
    (``--model``); ``settings``: the
    training DataLoader's settings and dataset (``num_workers 0 → 4``); ``environment``: the
    hardware and software fields (``torch_version 2.2.0 → 2.3.1``); ``load``: a sentence on
    the machine's load when it differs (others' CPU share ``load_share``, 0..1, in this run,
    ``baseline_load_share`` in the baseline); ``steal``: a sentence on the steal time when it
    was material and differs (the hypervisor's share of the CPU time ``steal_share``, 0..1, in
    this run, ``baseline_steal_share`` in the baseline; None where not measured);
    ``summary``: one sentence over all of it.
    """

    code: list[str] = field(default_factory=list)
    definitions: list[str] = field(default_factory=list)
    definitions_unrecorded: bool = False
    values: list[str] = field(default_factory=list)
    script: str | None = None
    arguments: str | None = None
    argument_names: list[str] = field(default_factory=list)
    #: identifiers that differ here, left out of the changes (``--run-name``: in every run)
    unsettled: list[str] = field(default_factory=list)
    settings: list[str] = field(default_factory=list)
    environment: list[str] = field(default_factory=list)
    load: str | None = None
    load_share: float | None = None
    baseline_load_share: float | None = None
    summary: str = ""
    steal: str | None = None
    steal_share: float | None = None
    baseline_steal_share: float | None = None

    @property
    def only_load(self) -> bool:
        """Code, arguments, values, settings and environment are the same; only the machine's load
        (other processes' CPU use, steal time or both) differs."""
        machine = self.load is not None or self.steal is not None
        changed = self.code_changed or self.arguments is not None or bool(self.values)
        return machine and not (changed or self.settings or self.environment)

    @property
    def code_changed(self) -> bool:
        """The cell's source, the notebook code it uses or the script's source changed."""
        return bool(self.code or self.definitions) or self.script is not None

    def lines(self) -> list[str]:
        """Every difference as one line, the summary sentence first."""
        out = [self.summary] if self.summary else []
        out += [f"cell source: {line}" for line in self.code]
        out += [f"notebook code: {line}" for line in self.definitions]
        out += [f"notebook values: {line}" for line in self.values]
        for sentence in (self.script, self.arguments):
            if sentence is not None:
                out.append(f"script: {sentence}")
        out += [f"DataLoader: {line}" for line in self.settings]
        out += [f"environment: {line}" for line in self.environment]
        for sentence in (self.load, self.steal):
            if sentence:
                out.append(f"machine load: {sentence}")
        return out

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
