"""The diagnosis in words: one sentence for each :class:`~traceml_nb.analysis.findings.Finding`
code, written from its facts, and :func:`diagnosis_words`, the whole diagnosis as the text, HTML
and Markdown reports and the trackers show it.

A code without a sentence here (a newer version's, read from a shared store) is shown as the
code and its facts, never dropped; a finding stored before findings were data (code
:data:`~traceml_nb.analysis.findings.TEXT`) is its stored sentence.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..analysis.advice import SKORCH_DRIVERS, setting_named_in, takes
from ..analysis.findings import TEXT, Diagnosis, Finding
from ..analysis.formatting import fmt_mb, fmt_ms, fmt_pct, fmt_s, fmt_share, fmt_share_below
from ..analysis.gpu_busy import GPM
from .anatomy_words import ANATOMY_SENTENCES
from .evidence_words import EVIDENCE_SENTENCES
from .input_words import CAUSES, INPUT_SENTENCES
from .profile_words import PROFILE_SENTENCES

Facts = dict[str, Any]

#: Where a DataLoader change goes, by what iterated the loader (``LoaderInfo.driver``).
WHERE: dict[str | None, str] = {
    None: "Change the training DataLoader",
    "transformers": "Change the Trainer's TrainingArguments",
    "lightning": "Change the DataLoader that your LightningModule's (or DataModule's) "
    "train_dataloader() returns",
    "accelerate": "Change the DataLoader you pass to Accelerator.prepare()",
    "fastai": "Change the arguments where your fastai DataLoaders are made (DataBlock.dataloaders, "
    "ImageDataLoaders.from_…, DataLoaders.from_dsets and DataLoader take them)",
    "keras": "Keras made this DataLoader of what model.fit was given, with num_workers=0: pass "
    "model.fit a torch DataLoader made with these arguments instead",
    "keras-fit": "Change the DataLoader you pass to model.fit()",
    **dict.fromkeys(SKORCH_DRIVERS, "Change the arguments of your skorch NeuralNet"),
}
#: ...where the loader does not train (an evaluation's, a prediction's): where that differs.
WHERE_EVALUATING: dict[str | None, str] = {
    **WHERE,
    None: "Change the DataLoader",
    "lightning": "Change the DataLoader that your LightningModule's (or DataModule's) "
    "val_dataloader(), test_dataloader() or predict_dataloader() returns",
    "keras": "Keras made this DataLoader of the arrays it was given, with num_workers=0: pass "
    "it a torch DataLoader made with these arguments instead",
    "keras-fit": "Change the DataLoader you pass to Keras",
}


def _where(role: Facts) -> str:
    """Where the loader whose role (``advice.role_of``) the facts give is set."""
    where = WHERE if role.get("trains", True) else WHERE_EVALUATING
    return where.get(role.get("driver"), where[None])


def _loop(role: Facts) -> str:
    """What waits for the loader's batches: the training loop, or the loop."""
    return "the training loop" if role.get("trains", True) else "the loop"


#: What builds its DataLoaders itself, by driver, where a sentence names it.
DRIVER_NAMES = dict.fromkeys(SKORCH_DRIVERS, "skorch")


#: Where a larger batch goes, by what made the loader (``advice.OWN_BATCHES``).
LARGER_BATCH_WHERE = {
    "fastai": "a larger bs where your fastai DataLoaders are made",
    "keras": "a larger batch_size in model.fit",
    "keras-pydataset": "larger batches from your PyDataset's __getitem__",
    "skorch-arrays": "a larger batch_size in your skorch NeuralNet",
}

#: The advice for steps that spend a large share making tiny batches.
BATCHED_INDEXING_TEXT = (
    "Make each batch in one call instead of item by item: give the dataset a __getitems__ "
    "(the DataLoader then fetches a whole batch at once), or slice the tensors directly "
    "instead of iterating a DataLoader over a TensorDataset."
)
#: The last line of the advice where the DataLoader's settings are (or may be) the cause.
TUNE_HINT_TEXT = (
    "To measure the DataLoader settings instead of following these rules: run %traceml tune "
    "(it iterates fresh loaders over your dataset, never your model; about a minute)."
)


def _s(n: int) -> str:
    return "s" if n != 1 else ""


def _input_label(kind: str | None) -> str:
    return "GPU input stall" if kind == "gpu" else "data wait"


def _not_input(f: Facts) -> str:
    """What a verdict other than input-bound says of the input."""
    share = f.get("input_share")
    if share is None:
        return f"input waits unavailable: {f.get('input_why', '')}"
    if f.get("tiny_steps"):
        return f"data loading is {fmt_share(share)} of very short steps"
    return f"input stalls {fmt_share(share)} of step time"


def _busy_text(f: Facts) -> str:
    """``SM activity 23% (GPM)`` or ``GPU utilisation 97% (NVML: a kernel was running)``."""
    if f.get("busy_source") == GPM:
        return f"SM activity {fmt_pct(f['busy_pct'])} (GPM)"
    return f"GPU utilisation {fmt_pct(f['busy_pct'])} (NVML: a kernel was running)"


def _busy_subject(f: Facts) -> str:
    return "the GPU's SMs are" if f.get("busy_source") == GPM else "the GPU is"


def _reasons(reasons: list[str], none: str) -> str:
    return ", ".join(reasons) or none


def change_text(change: Facts, role: Facts) -> str:
    """``num_workers=0 → num_workers=2`` or ``pin_memory=True``, named where the loader whose
    role (``advice.role_of``) the facts give is set."""
    name = setting_named_in(change["setting"], role)
    if change.get("old") is None:
        return f"{name}={change['new']}"
    return f"{name}={change['old']} \u2192 {name}={change['new']}"


def _why_num_workers(f: Facts) -> str:
    nw, cpus, new = f["num_workers"], f.get("cpus"), f["new"]
    if nw == 0:
        who = "the main process loads every batch"
    else:
        who = f"{nw} worker{_s(nw)} cannot keep up"
    waiter = "the GPU" if f.get("gpu") else _loop(f)
    if cpus is None:
        cpu_text = ""
    elif int(str(new)) <= cpus:
        cpu_text = f" (one per CPU available: {cpus})"
    else:
        cpu_text = f" (more than the {cpus} CPUs: workers that wait need little CPU)"
    name = setting_named_in("num_workers", f)
    return (
        f"With {name}={nw}, {who} while {waiter} waits; {new} workers"
        f"{cpu_text} load batches in parallel with the compute."
    )


def _stalls(f: Facts) -> str:
    """``One fetch, at step 37, took 1.0 s: a stall, not a slow pipeline; ...``"""
    stalls = f["stalls"]
    waits = [fmt_ms(s["wait_ms"]) for s in stalls]
    steps = [str(s["step"]) for s in stalls]
    if len(stalls) == 1:
        text = f"One fetch, at step {steps[0]}, took {waits[0]}: a stall, not a slow pipeline"
    else:
        listed = f"{', '.join(steps[:-1])} and {steps[-1]}"
        took = f"{', '.join(waits[:-1])} and {waits[-1]}"
        text = f"{len(stalls)} fetches, at steps {listed}, took {took}: stalls, not a slow pipeline"
    share = f.get("run_share")
    if share is not None:
        them = "it" if len(stalls) == 1 else "them"
        text += f"; without {them} the run would take at most {fmt_share(share)} less time"
    return text + "."


def _persistent(f: dict[str, Any]) -> str:
    return setting_named_in("persistent_workers", f)


def _evaluation_restarts(f: Facts) -> str:
    """An evaluation's workers started again for each pass: what they cost, and how to keep
    them (or, where its loaders are built anew each epoch, to do without)."""
    kept = takes(f.get("driver"), "persistent_workers")
    setting = f" ({_persistent(f)}=False)" if kept else ""
    head = (
        f"{f['phase']}: its DataLoader started its {_workers(f['workers'])} again for each of "
        f"its {f['passes']:,} passes{setting}; their first batches waited {fmt_s(f['wait_s'])}, "
        f"{fmt_share(f['run_share'])} of the run, besides starting and stopping them (in iter() "
        "and when an iterator is dropped, not timed). "
    )
    if kept:
        return head + _keep_workers(f)
    return head + (
        f"{DRIVER_NAMES.get(f.get('driver') or '', 'It')} builds its DataLoaders anew for each epoch, "
        f"so their workers cannot be kept: {setting_named_in('num_workers', f)}=0 leaves their "
        "start out where a batch is cheap to make in the main process."
    )


def _keep_workers(f: dict[str, Any]) -> str:
    """How to keep an evaluation's workers between its passes: the setting, or, where the loop
    builds a DataLoader for each pass (a trainer does so by itself), building it once too."""
    keep = f"{_persistent(f)}=True keeps the workers between passes."
    if f.get("loaders", 1) > 1 and f.get("driver") != "transformers":
        return f"Each pass built a DataLoader of its own: build it once, and {keep}"
    return keep


def _workers(n: int) -> str:
    return "worker" if n == 1 else f"{n} workers"


def _left_out(what: str) -> Callable[[Facts], str]:
    def sentence(f: Facts) -> str:
        n = f["steps"]
        verb = "are" if n != 1 else "is"
        return f"{n:,} step{_s(n)} that {what} {verb} left out of the statistics."

    return sentence


#: The sentence of each finding code, from its facts.
SENTENCES: dict[str, Callable[[Facts], str]] = {
    TEXT: lambda f: str(f.get("text", "")),
    # titles
    "no-steps": lambda f: (
        "No training steps seen: no DataLoader batches, optimizer steps or traceml_nb.step() markers"
    ),
    "too-few-steady-steps": lambda f: (
        f"Not enough steady steps to judge: {f['steady_steps']} (at least "
        f"{f['needed_steps']} needed after {f['warmup_steps']} warm-up)"
    ),
    "no-input-or-gpu-signal": lambda f: (
        "Cannot judge: no DataLoader was iterated and no GPU utilisation was measured"
    ),
    "input-bound": lambda f: (
        f"Input-bound: {'the GPU' if f['input_kind'] == 'gpu' else _loop(f)} waits"
        f" for data {fmt_share(f['input_share'])} of step time"
    ),
    "throttled": lambda f: (
        f"Throttled: steps take {f['slowdown']:.2f}\u00d7 as long while the GPU clock is reduced "
        f"({_reasons(f['reasons'], 'reduced clock')})"
    ),
    "host-bound": lambda f: (
        f"Host-bound: {_not_input(f)}, but {_busy_subject(f)} idle much of the time: "
        f"median {_busy_text(f)}"
    ),
    "memory-pressure": lambda f: (
        f"Memory pressure: GPU memory peaked at {fmt_share(f['peak_share'])} of "
        f"{fmt_mb(f['total_mb'])}"
    ),
    "compute-bound-gpu": lambda f: (
        f"Compute-bound (healthy): {_busy_subject(f)} busy, median {_busy_text(f)}; {_not_input(f)}"
    ),
    "gpu-busy-unknown": lambda f: (
        f"Not input-bound ({_not_input(f)}); GPU utilisation unavailable ({f['busy_why']}), "
        "so host- and compute-bound cannot be told apart"
    ),
    "compute-bound-tiny-steps": lambda f: (
        f"Compute-bound: the steps are very short ({fmt_ms(f['step_ms'])}): "
        f"{fmt_share(f['input_share'])} of each is {_making_batches(f)}, the rest is the "
        "model's work"
    ),
    "compute-bound-model-phases": lambda f: (
        f"Compute-bound: the model's forward, backward and optimizer step take "
        f"{fmt_share(f['model_share'])} of each step; no DataLoader was iterated, so making "
        f"the batches is inside the other {fmt_share(1.0 - f['model_share'])}"
    ),
    "compute-bound-cpu": lambda f: (
        "Compute-bound: the steps spend their time computing, not waiting for data "
        f"({_not_input(f)})"
    ),
    # advice
    "iterate-a-loader": lambda f: (
        "Iterate a torch DataLoader in the cell, or run on a GPU, to get a verdict."
    ),
    "check-cooling-and-power": lambda f: (
        "The GPU lowers its clock for power or heat: check cooling and the power limit "
        "(nvidia-smi -q -d PERFORMANCE,POWER,TEMPERATURE). On a shared cloud GPU this is "
        "outside your code."
    ),
    "remove-host-syncs": lambda f: (
        "Remove per-step host syncs: .item(), .cpu(), float(loss), printing tensors; "
        "accumulate metrics on the GPU and read them every N steps."
    ),
    "larger-batch": lambda f: (
        f"Batch size {f['batch_size']} is small: a larger batch (e.g. {f['suggested']}) gives "
        "the GPU more work per kernel launch."
    ),
    "cut-launch-overhead": lambda f: (
        "Cut launch overhead: torch.compile(model), or CUDA graphs via "
        'torch.compile(mode="reduce-overhead").'
    ),
    "free-gpu-memory": lambda f: (
        "No headroom: a larger batch will not fit and the allocator may free and retry. "
        "Free memory with mixed precision (torch.autocast), gradient checkpointing or a "
        "smaller batch; PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True reduces fragmentation."
    ),
    "gpu-is-the-limit": lambda f: (
        "The GPU is the limit: speed-ups come from the model side (mixed precision with "
        "torch.autocast, channels_last, torch.compile)."
    ),
    "batched-indexing": lambda f: (
        BATCHED_INDEXING_TEXT
        if not f.get("workers")
        else (
            f"Make the batches in the training process: with num_workers={f['workers']} each "
            "batch is handed over from a worker process, which costs about as much as making "
            "it. Try num_workers=0 with each batch made in one call (give the dataset a "
            "__getitems__, or slice the tensors directly), and keep whichever is faster."
        )
    ),
    "larger-batches": lambda f: (
        "Make fewer, larger batches: the loader makes each one itself, at a cost per batch that "
        "these short steps cannot hide, and "
        f"{LARGER_BATCH_WHERE.get(f.get('driver') or '', 'a larger batch size')} pays it for more "
        "samples at once."
    ),
    "cpu-is-the-limit": lambda f: (
        "The CPU computing the model is the limit: a GPU, or a smaller model or inputs, is what "
        "makes it faster."
    ),
    "tune-hint": lambda f: TUNE_HINT_TEXT,
    "profile-suggestion": lambda f: (
        "To see which operations and lines take the time: rerun this cell with "
        f"%%traceml --profile {f.get('steps', 10)} (torch.profiler over {f.get('steps', 10)} "
        "steady steps, left out of the statistics)."
    ),
    "change-loader": lambda f: (
        f"{_where(f)}: " + ", ".join(change_text(c, f) for c in f["changes"])
    ),
    "why-num_workers": _why_num_workers,
    "iterable-sharding": lambda f: (
        f"The dataset is an IterableDataset: each of the {f['workers']} workers iterates a copy "
        "of it, so unless its __iter__ splits the stream by worker "
        f"(torch.utils.data.get_worker_info()), every sample comes {f['workers']} times."
    ),
    "why-pin_memory": lambda f: (
        f"{setting_named_in('pin_memory', f)}=True puts batches in page-locked memory, "
        "so copying them to the GPU with .to(device, non_blocking=True) overlaps the compute."
    ),
    "why-persistent_workers": lambda f: (
        f"{setting_named_in('persistent_workers', f)}=True keeps the workers alive "
        "between epochs instead of starting them again (each start costs the first-batch wait "
        "again)."
    ),
    "why-prefetch_factor": lambda f: (
        f"{setting_named_in('prefetch_factor', f)}={f['new']} keeps {f['new']} batches "
        "per worker in flight, which absorbs slow samples."
    ),
    # what will not help
    "more-workers-for-tiny-batches": lambda f: (
        f"More DataLoader workers: at {fmt_ms(f['per_step_ms'])} a batch, handing each batch "
        "over from a worker process costs about as much as making it in the training loop."
    ),
    "loader-tuning-minor": lambda f: (
        f"DataLoader tuning (workers, pin_memory, prefetch): {_input_label(f['input_kind'])} is "
        f"only {fmt_share(f['input_share'])} of step time."
    ),
    "more-workers-than-cpus": lambda f: (
        f"More than {f['workers']} workers: only {f['cpus']} "
        f"CPU{'s are' if f['cpus'] != 1 else ' is'} available to this process."
    ),
    # the saving
    "input-saving": lambda f: (
        f"{'GPU input stalls' if f['input_kind'] == 'gpu' else 'Data waits'} took "
        f"{fmt_share(f['share'])} of this run ({fmt_s(f['wait_s'])} of {fmt_s(f['elapsed_s'])}): "
        f"without them it would take at most {fmt_share(f['share'])} less time."
    ),
    "throttle-saving": lambda f: (
        f"The throttled steps ({fmt_share(f['throttled_share'])} of the steps) cost about "
        f"{fmt_share(f['excess_share'])} of the steady time over steps at full clock."
    ),
    "host-idle-saving": lambda f: (
        (
            f"The SMs were idle about {fmt_share(f['idle_share'])} of their time"
            if f.get("busy_source") == GPM
            else f"The GPU was idle about {fmt_share(f['idle_share'])} of the time"
        )
        + f": removing host overhead saves at most {fmt_share(f['idle_share'])}."
    ),
    # other findings
    "evaluation-steps-left-out": _left_out("contained an evaluation"),
    "profiled-steps-left-out": _left_out("ran under the profiler"),
    "no-gpu-evidence": lambda f: f"GPU evidence unavailable ({f['why']}): judged on host timings.",
    "judged-on-host-wait": lambda f: (
        f"GPU input stalls were not measured ({f['why']}): judged on host data wait, which can "
        "overstate what the GPU lost."
    ),
    "stalls": _stalls,
    "evaluation-restarts-workers": _evaluation_restarts,
    "input-of-tiny-steps": lambda f: (
        f"The {_input_label(f['input_kind'])} is {fmt_share(f['input_share'])} of a very short "
        f"step ({fmt_ms(f['per_step_ms'])} per step, below the {fmt_ms(f['floor_ms'])} floor): "
        + (
            "the cost of handing each batch over from a worker process"
            if f.get("workers")
            else "the cost of indexing and collating each batch"
        )
        + ", not an input pipeline that lags."
    ),
    "minor-input-stalls": lambda f: (
        f"Minor input stalls: {_input_label(f['input_kind'])} is "
        f"{fmt_share_below(f['input_share'], f['bound_share'])} of step time (input-bound from "
        f"{fmt_share(f['bound_share'])})."
    ),
    "throttling": lambda f: (
        f"Throttling: {fmt_share(f['throttled_share'])} of the steps ran at a reduced clock "
        f"({_reasons(f['reasons'], 'clock below its maximum')}) and took "
        f"{f['slowdown']:.2f}\u00d7 as long."
    ),
    "reduced-clock": lambda f: (
        f"The SM clock ran at {fmt_share(f['clock_ratio'])} of its maximum during the steady "
        f"steps ({_reasons(f['reasons'], 'no reason reported')}); steps would be faster at full "
        "clock."
    ),
    "memory-pressure-too": lambda f: (
        f"Memory pressure: GPU memory peaked at {fmt_share(f['peak_share'])} of "
        f"{fmt_mb(f['total_mb'])}; a larger batch will not fit."
    ),
    "nvml-overstates": lambda f: (
        f"NVML's GPU utilisation reads {fmt_pct(f['util_pct'])}: it counts the time any kernel "
        "ran, and small kernels keep it high while most SMs are idle (SM activity "
        f"{fmt_pct(f['sm_active_pct'])})."
    ),
    **INPUT_SENTENCES,
    **PROFILE_SENTENCES,
    **EVIDENCE_SENTENCES,
    **ANATOMY_SENTENCES,
}


def sentence(finding: Finding) -> str:
    """The finding in words (an unknown code, or facts it cannot be written from: the code and
    its facts)."""
    write = SENTENCES.get(finding.code)
    if write is not None:
        try:
            return write(finding.facts)
        except (KeyError, TypeError, ValueError, IndexError):
            pass
    facts = ", ".join(f"{k}={v}" for k, v in finding.facts.items())
    return f"{finding.code} ({facts})" if facts else finding.code


def _making_batches(f: Facts) -> str:
    """What a tiny step's data wait is: the batch made in the loop, or handed over."""
    workers = f.get("workers")
    if workers:
        return (
            f"receiving its batch from {workers} DataLoader worker process"
            f"{'es' if workers > 1 else ''} (the hand-over between processes, no input "
            "pipeline that lags)"
        )
    return (
        "making its batch in the training process (indexing and collating, no input pipeline "
        "to wait for)"
    )


def cause_words(cause: str | None) -> str | None:
    """An input-bound run's cause in words (an unknown code as it is)."""
    return CAUSES.get(cause, cause) if cause else None


def saving_sentence(saving: Finding | None, saving_bound_share: float | None) -> str | None:
    """The upper bound of what the fix saves, as one sentence."""
    if saving is not None:
        return sentence(saving)
    if saving_bound_share is not None and saving_bound_share == saving_bound_share:
        return f"Fixing the cause saves at most {fmt_share(saving_bound_share)} of the wall time."
    return None


@dataclass
class DiagnosisWords:
    """A diagnosis as the reports show it: ``title``, ``cause`` and ``profiled_cause`` (None
    where the diagnosis has none), ``evidence`` lines (``label: value``), ``advice``,
    ``wont_help``, ``saving`` (its bound's sentence) and ``also`` (the other findings)."""

    verdict: str
    confidence: str
    title: str
    cause: str | None = None
    profiled_cause: str | None = None
    evidence: list[str] = field(default_factory=list)
    advice: list[str] = field(default_factory=list)
    wont_help: list[str] = field(default_factory=list)
    saving: str | None = None
    also: list[str] = field(default_factory=list)


def diagnosis_words(d: Diagnosis) -> DiagnosisWords:
    """The diagnosis ``d`` in words."""
    return DiagnosisWords(
        verdict=str(d.verdict),
        confidence=str(d.confidence),
        title=sentence(d.title),
        cause=cause_words(d.cause),
        profiled_cause=sentence(d.profiled_cause) if d.profiled_cause is not None else None,
        evidence=[f"{e.label}: {sentence(e.detail)}" for e in d.evidence],
        advice=[sentence(f) for f in d.advice],
        wont_help=[sentence(f) for f in d.wont_help],
        saving=saving_sentence(d.saving, d.saving_bound_share),
        also=[sentence(f) for f in d.secondary],
    )
