"""Every threshold of the analysis, in one place, each with its unit and the reason for its value.

docs/diagnosis.md and docs/comparisons.md explain them for users; tests/unit/test_diagnosis.py tests
each one on both sides. Shares are fractions 0..1, percentages 0..100 (CPU: 100 = one core busy).
"""

from __future__ import annotations

from ..engine.contracts import CLOCK_EVENT_REASONS

# --- warm-up ----------------------------------------------------------------------------------
#: With at least this many steps, the first step is always warm-up (it includes the first
#: fetch: worker start-up, lazy CUDA init, cuDNN autotuning, ``torch.compile``).
WARMUP_MIN_STEPS = 5
#: Following leading steps slower than this × the steady median are warm-up too.
WARMUP_SLOW_FACTOR = 1.5
#: At most this share of the steps is ever excluded as warm-up, so a run that slows down as a
#: whole is not explained away.
WARMUP_MAX_SHARE = 0.2

# --- enough data ------------------------------------------------------------------------------
#: Fewer steady steps than this: verdict ``insufficient-data``.
MIN_STEADY_STEPS = 10
#: Fewer steady steps than this lowers the confidence of any verdict by one level.
CONFIDENT_STEPS = 30

# --- the step time of a loader with workers (:mod:`.step_blocks`) -----------------------------
#: Where the training loader has two workers or more, the step time's median, percentiles and
#: the times a comparison judges are taken over the means of blocks of consecutive steady
#: steps, each at least this many steps and a whole number of rounds of the workers (torch
#: hands their batches over in turn: where they cannot keep up, a round is one long wait and
#: fast steps, whose median is a fast step: 0.58 ms for steps of 11.5 ms on average with 3
#: workers, `benchmarks/README.md`).
STEP_BLOCK_STEPS = 8
#: ...and short enough that the steady steps make at least this many blocks (down to one round).
MIN_STEP_BLOCKS = 4

# --- input-bound ------------------------------------------------------------------------------
#: Input stall share (GPU input stall on CUDA, host data wait on CPU) at or above which the run
#: is input-bound: roughly one step in seven spent waiting for data.
INPUT_BOUND_SHARE = 0.15
#: Input stall share at or above which a non-input-bound run gets a "minor input stalls" note.
INPUT_MINOR_SHARE = 0.05
#: An evaluation whose DataLoader starts its workers again for each pass (``num_workers`` > 0,
#: ``persistent_workers=False``), over at least ``EVAL_RESTART_MIN_PASSES`` passes, whose
#: passes' first batches waited at least ``EVAL_RESTART_RUN_SHARE`` of the run in all, gets a
#: note: ``persistent_workers=True`` keeps them. (A lower bound of what the restarts cost:
#: starting the workers in ``iter()`` and stopping them when an iterator is dropped are not
#: timed; on the 2-CPU VM, ``next(iter(val_loader))`` with 2 workers five times in a 0.4 s run
#: waited 0.09–0.14 s in the first batches, and the run took 0.09–0.31 s less with the
#: workers kept.)
EVAL_RESTART_MIN_PASSES = 2
EVAL_RESTART_RUN_SHARE = 0.05
#: A CPU run that iterates no DataLoader makes its batches somewhere in the step: where the
#: model's timed phases (forward, backward, optimizer) take at least this share of it, the rest,
#: which holds the batch making, is below ``INPUT_BOUND_SHARE``: the run is compute-bound
#: (1 - ``INPUT_BOUND_SHARE``).
MODEL_BOUND_SHARE = 0.85
#: Mean input stall per step (ms) below which a run is never input-bound, whatever the share:
#: a tiny model on an in-memory dataset waits microseconds per step; a large share of a tiny
#: step is no input problem.
MIN_INPUT_WAIT_MS = 1.0
#: A step whose input wait is more than this many times the median steady step is a *stall*
#: (a pause of the storage, the network, the garbage collector), not the pace of the pipeline:
#: the input-bound rules judge the run without it, and the report names it.
STALL_FACTOR = 10.0
#: ...as long as such steps are at most this share of the steady steps (at least one step);
#: more of them are the pipeline's pace after all, and are judged with the rest.
STALL_MAX_SHARE = 0.02
#: Evidence this many times past its threshold gives a "high" confidence.
STRONG_FACTOR = 2.0

# --- input-bound sub-causes -------------------------------------------------------------------
#: A DataLoader worker using at least this much CPU (percent of one core) is saturated.
WORKER_SATURATED_PCT = 85.0
#: The machine is saturated when the system CPU (0..100) is at least this.
SYSTEM_SATURATED_PCT = 90.0
#: A saturated machine (``SYSTEM_SATURATED_PCT`` or every core busy) makes the workers the
#: bottleneck only when they use at least this much CPU each (percent of one core); below it
#: they mostly wait (on storage, a remote source, a lock) while something else takes the CPU.
#: Only workers measured this busy make "more workers than CPUs will not help" a fact: the
#: loading is then the CPUs' work (with no workers, or idle ones, it may wait on storage).
WORKER_BUSY_PCT = 50.0
#: A DataLoader worker that waits for a CPU (ready to run, on the run queue) at least this share
#: of the time (percent) is short of CPU, however busy the machine reads on average: other
#: threads take the cores it needs. A worker waiting on storage sleeps, and waits for a CPU
#: only for the moments after it wakes (1-4% measured on a busy 2-core machine; starved
#: workers there waited 24-38%). A busy machine's workers count as saturated when their CPU
#: and their wait for one reach ``WORKER_BUSY_PCT``.
WORKER_STARVED_PCT = 20.0
#: The training process uses more than one core (torch's intra-op threads) from this CPU on
#: (percent, 100 = one core): the threads that starved workers compete with.
TRAINING_CORES_PCT = 120.0
#: "Slow storage / first epoch": the first epoch's data-wait share is at least this many times
#: that of the later epochs (which then hit the page cache or a warm storage layer).
FIRST_EPOCH_FACTOR = 2.0
#: Largest number of workers the advice ever suggests (beyond it the returns are small and
#: every worker holds a copy of the dataset object).
MAX_SUGGESTED_WORKERS = 8
#: prefetch_factor the advice suggests (torch's default is 2).
SUGGESTED_PREFETCH = 4

# --- host-bound / compute-bound ----------------------------------------------------------------
#: Median NVML GPU utilisation (percent of time a kernel was running) at or above which the GPU
#: is busy (compute-bound, healthy); below it with little input stall the run is host-bound.
GPU_BUSY_PCT = 80.0
#: Median GPM SM activity (percent: the share of the SMs busy, averaged over time; Hopper and
#: later) at or above which the GPU is busy; below it, with little input stall, the run is
#: host-bound. Where the GPU has it, SM activity decides instead of ``GPU_BUSY_PCT``: NVML's
#: utilisation counts the time any kernel ran, and one small kernel keeps it at 100% while most
#: SMs are idle. Below half the SMs busy the GPU's compute is mostly unused (NVIDIA's DCGM
#: guide reads SM activity under 50% as a likely ineffective use of the GPU).
SM_ACTIVE_BUSY_PCT = 50.0
#: Batches smaller than this are called small in the host-bound advice.
SMALL_BATCH = 32

# --- throttled --------------------------------------------------------------------------------
#: A sample is "at reduced clock" when the SM clock is below this share of its maximum.
THROTTLE_CLOCK_RATIO = 0.9
#: Steps during throttling must be at least this many times slower than the others.
THROTTLE_STEP_FACTOR = 1.1
#: ...and make at least this share of the steady steps...
THROTTLE_MIN_SHARE = 0.1
#: ...with at least this many steps in each group (throttled and not).
THROTTLE_MIN_STEPS = 5

#: NVML clock-event reasons that slow a busy GPU down (bits of ``CLOCK_EVENT_REASONS``): the power
#: cap, hardware slowdown, thermal slowdown and the power brake. Idle, the applications clocks
#: setting, sync boost and the display clock are not counted.
THROTTLE_REASON_NAMES = {bit: CLOCK_EVENT_REASONS[bit] for bit in (0x4, 0x8, 0x20, 0x40, 0x80)}
THROTTLE_REASON_MASK = sum(THROTTLE_REASON_NAMES)

# --- memory pressure --------------------------------------------------------------------------
#: Peak GPU memory at or above this share of the device's memory: memory pressure (the
#: allocator starts freeing and retrying, and a larger batch will not fit).
MEMORY_PRESSURE_SHARE = 0.95

# --- advice from the anatomy of a step (:mod:`.anatomy_advice`) ---------------------------------
#: On a GPU, an input copy that takes at least this share of the step is worth overlapping with
#: the compute (pinned memory, ``non_blocking=True``): a tenth of every step, for a setting.
COPY_SHARE_ADVICE = 0.10
#: Mixed precision is advised where at least this share of the model's FLOPs ran in float32
#: (or tf32)...
FP32_SHARE_ADVICE = 0.5
#: ...on a GPU whose half-precision peak (bf16, else fp16) is at least this many times the
#: peak those FLOPs ran at (a T4: 8x; an A100 with tf32 allowed: 2x).
HALF_PRECISION_GAIN = 2.0
#: channels_last is advised where at least this share of the FLOPs are convolutions run in a
#: tensor-core precision (fp16, bf16, tf32) on inputs in the default (NCHW) layout, whose
#: cuDNN kernels work in NHWC and transpose each input first.
CONV_SHARE_ADVICE = 0.5
#: ...where less than this share of the convolutions' FLOPs are channels_last already and at
#: least this share of all FLOPs ran in a tensor-core precision.
MOSTLY = 0.5
#: An optimizer step that takes at least this share of the step is worth a fused update
#: (``fused=True``): with many small parameters a per-tensor loop is mostly dispatch (and on a
#: GPU, launch) overhead.
OPTIMIZER_SHARE_ADVICE = 0.15

# --- the FLOPs of batches that differ in size (:mod:`.input_sizes`) ---------------------------
#: The steps' batches differ in their samples' size where the elements of the first tensor of
#: the batches of the most common number of samples (the full ones) spread by at least this
#: coefficient of variation (standard deviation over mean): batches padded to their longest
#: sequence (0.23-0.27 on SST-2-like lengths at a batch of 32), images of several sizes. A
#: short last batch, a trainer's step holding two fetches, are not among them. The FLOPs
#: counted on one step are then taken in proportion to each batch's elements.
VARYING_INPUTS = 0.05

# --- comparison -------------------------------------------------------------------------------
#: A part of the step (data wait, input copy, forward, backward, optimizer step, the rest) moved
#: between two runs when its median changed by at least this share of itself...
PHASE_MOVED_SHARE = 0.10
#: ...and by at least this share of the earlier run's median step (:mod:`.phase_shift`).
PHASE_MOVED_STEP_SHARE = 0.05
#: Bootstrap resamples for the confidence interval of the ratio of median step times.
BOOTSTRAP_RESAMPLES = 2000
#: Fixed seed: the same two runs always give the same interval.
BOOTSTRAP_SEED = 20240601
#: Two-sided confidence level of the interval.
CONFIDENCE_LEVEL = 0.95
#: A share of the step time, throughput or memory that moved by less than this is shown as
#: neutral in a comparison's rows (the step time's own verdict is :mod:`.judge`'s).
MIN_PRACTICAL_EFFECT = 0.05
#: Changes of a share (data wait, GPU utilisation) smaller than this many percentage points are
#: shown as neutral.
NEUTRAL_POINTS = 2.0
#: At most this many steady step times are kept per run in the history (evenly downsampled).
MAX_STORED_STEPS = 4000

# --- baselines ------------------------------------------------------------------------------
#: The baseline of a run: this many earlier completed runs of its configuration (or of the
#: configuration before it; unless a baseline is pinned).
BASELINE_RUNS = 5
#: A configuration's runs at one level of step time (:mod:`.levels`): a change no setting shows
#: (a class edited in another cell, data on slower storage) moves its later runs to another
#: level; this many runs at the new level make it the baseline (until then the level before it
#: is, and a lasting slowdown is called slower again), and this many runs in a row decided
#: apart from their level begin a new one (one alone is the machine's noise)...
LEVEL_RUNS = 3
LEVEL_CONFIRMATIONS = 2
#: ...looked for among the configuration's latest this-many quiet runs.
LEVEL_LOOKBACK = 60
#: The CI gates' default slowdown to catch (``check``/``ab --max-slowdown``, a share of the
#: step time): a regression is slower with confidence and by at least half of it (:mod:`.judge`).
DEFAULT_MAX_SLOWDOWN = 0.10

# --- judging a change (:mod:`.judge`, :mod:`.noise`) -------------------------------------------
#: The chance, per decision, that identical code is called slower (or faster): the one-sided
#: level of the confidence bound a "slower"/"faster" verdict must clear. Kept well under the 1%
#: the false alarm rate is held to in tests/unit/test_gate_statistics.py, since run-to-run
#: noise has heavier tails than the normal the t bounds assume.
FALSE_ALARM_RATE = 0.005
#: The chance a change of the full margin is let through as "no significant change" (a gate's
#: "not slower"): the one-sided level of the bound that must rule the margin out.
MISS_RATE = 0.10
#: Runs whose batch sizes (the median samples of a step) differ by at least this share are
#: compared per sample (median step / batch size): a real change of the batch is a factor (32 →
#: 64), while a sampler that buckets by length moves its median batch by a few percent between
#: runs of one configuration, which would make the step time judged per sample one run and per
#: step the next.
BATCH_SIZE_CHANGE_SHARE = 0.10
#: The least change of the median step time that matters in a comparison of runs (a fraction):
#: a verdict "slower"/"faster" needs at least half of it, and "no
#: significant change" needs the whole of it ruled out.
CHANGE_MARGIN = 0.10
#: An inconclusive verdict says how many more runs (or A/B rounds) would decide, up to this
#: many; beyond it, that the change is too small for this noise.
MAX_RUNS_NEEDED = 30

# --- run-to-run noise (:mod:`.noise`) -----------------------------------------------------------
#: The run-to-run noise assumed at a 10 ms median step before any run says otherwise (standard
#: deviation of ln(median step), ≈ relative): identical ~10 ms CPU jobs in fresh processes on
#: this 2-core VM class scattered by 3.9% back to back and 8.8% over minutes (benchmarks/README.md,
#: 2026-12-03), and in CI a third demo run's fixed cell ran 33% slower than the first two with
#: nothing to show why. The default takes the noisy end: with 5% it called that run "slower".
DEFAULT_NOISE_AT_10MS = 0.08
#: Shorter steps are noisier (timer resolution, the scheduler, caches matter more): the default
#: grows as (10 ms / step) ** this; 0.5 ms steps get ~23%, as identical sub-millisecond reruns
#: in one kernel moved by -12% to +32% here and by +83% in CI (a core kept busy).
DEFAULT_NOISE_EXPONENT = 0.35
#: ...and is never above this.
DEFAULT_NOISE_MAX = 0.30
#: Runs of different sessions (kernels, jobs: different processes) scatter more than runs of
#: one: where a process's threads and memory landed moves all its steps. Measured on this
#: 2-core VM class (2026-12-04, a small CPU conv net, 80 steps a run): 8.7% between runs of one
#: process (6 processes of 6 runs), 12.6% and 14.6% between runs of 30 fresh processes. A
#: comparison with runs of another session adds this (in quadrature) to the default above;
#: without it, two demo runs in CI read "faster, beyond the run-to-run noise" for one
#: configuration whose two runs differed by 36%.
SESSION_NOISE = 0.10
#: The default counts as this many degrees of freedom (as many as five runs would give): enough
#: to judge a 2x change from two runs, little enough that a configuration's own runs soon
#: outweigh it.
DEFAULT_PRIOR_DF = 4.0
#: Other configurations of the machine class count toward the noise when their median step is
#: within this factor of the compared runs' (either way): noise depends on the step's length.
STEP_LENGTH_FACTOR = 3.0
#: ...worth at most this many degrees of freedom together, so that the compared
#: configurations' own runs still matter.
CLASS_PRIOR_MAX_DF = 12.0
#: ...and one of them is left out when its runs scatter so much more than the rest of the
#: evidence (the default, the compared configurations' runs, the other configurations) that
#: identical runs would do so with at most this chance (an F test of its variance): two
#: workloads under one key, as a script run with other arguments gives, not the machine's
#: noise. One such configuration (runs of 45, 17 and 42 ms) made the noise of this VM's demo
#: comparison 20% instead of 9%, and the demo's own fix (-43%) read "inconclusive".
CLASS_OUTLIER_LEVEL = 0.001
#: The other configurations are set aside altogether where the compared configurations' own
#: runs scatter more than theirs, so that identical runs would do so with at most this chance
#: (an F test, upper tail): configurations differ in noise (a loader whose workers contend
#: for the cores scatters more), and a quieter class narrows the noise of a noisier one. On
#: this VM the quickstart's fixed cell (its 7 runs 11% apart; 17.6% over 10 since) was judged
#: at 9.9% beside the starved one (5.5%), and a run like the next two read "+41%, slower,
#: beyond the run-to-run noise"; with the starved cell set aside, 11.8%: inconclusive.
#: Simulated (tests/unit/test_noise_statistics.py, 2,000 gates each): a configuration at 15%
#: beside three at 3-5%, identical runs, 2.95% false alarms, 1.6% with this; five at 5% alike,
#: +20% caught in 40% after 5 runs (43% never set aside, 14% never counted).
OWN_NOISIER_LEVEL = 0.10
#: A run made on a busy machine (``BUSY_MACHINE_SHARE``, ``MATERIAL_STEAL_SHARE``) against a quiet
#: baseline is judged with this many times the noise: such runs measured 20-60% slower than
#: quiet ones, against 3-9% between quiet runs; with 3 times, busy candidates still made half of
#: the simulated false alarms (tests/unit/test_noise_statistics.py).
BUSY_NOISE_FACTOR = 5.0

# --- what changed -----------------------------------------------------------------------------
#: Other processes using at least this share of the machine's CPUs during a run load the
#: machine enough to slow a training loop that needs the CPU (a quarter of the cores).
BUSY_MACHINE_SHARE = 0.25
#: ...and the load differs between two runs when the share moved by at least this much.
LOAD_CHANGE_SHARE = 0.15
#: Steal time (the hypervisor running other guests on this virtual machine's CPUs while it
#: wanted to run) of at least this share of the machine's CPU time is material: one CPU tick
#: in twenty taken away from a loop that needs the CPU. A VM on a quiet host reads well under
#: 1%; an oversubscribed one (a "noisy neighbour") reads 5-20% and more.
MATERIAL_STEAL_SHARE = 0.05
#: ...and steal time differs between two runs when it moved by at least this much (as a
#: share of the machine's CPU time; a baseline that did not measure it differs whenever this
#: run's is material).
STEAL_CHANGE_SHARE = 0.05
#: At most this many changed lines of the cell source are listed in a comparison.
SOURCE_DIFF_LINES = 6

# --- the profile (``--profile``) ----------------------------------------------------------------
#: Operators the profile summary lists, by self CPU time and by self GPU time.
PROFILE_TOP_OPS = 10
#: A call that makes the host wait for the GPU (``.item()``, ``.cpu()``, a synchronize) is named
#: as the cause of a host- or compute-bound verdict when its waits take at least this share of
#: the profiled steps' time: a tenth of every step spent idle on the host.
SYNC_CAUSE_SHARE = 0.10
#: The GPU ran no kernel for at least this share of the profiled time: a host-bound run whose
#: host does not launch work fast enough (launch-bound), named as such.
LAUNCH_BOUND_IDLE_SHARE = 0.30

# --- ranks (DDP launched from the run, torchrun jobs) -------------------------------------------
#: A rank is the straggler by its data wait when its data wait share (of its step time) exceeds
#: the median share of the other ranks by at least this much (0..1): a tenth of every step
#: spent waiting where the others do not. Synchronised ranks (DDP) all take the straggler's
#: step time (the others wait for it at the all-reduce), so the wait, not the step time, is
#: what tells the straggler apart.
STRAGGLER_WAIT_SHARE_MARGIN = 0.10
#: ...and its median data wait exceeds the others' median by at least this many milliseconds
#: (a large share of a tiny step is no straggler: the same floor as ``MIN_INPUT_WAIT_MS``).
STRAGGLER_MIN_WAIT_MS = 1.0
#: A rank is the straggler by its step time when its median step is at least this many times
#: the median of the other ranks' medians (ranks that do not synchronise every step).
STRAGGLER_STEP_FACTOR = 1.2

# --- change points (:mod:`.changepoints`, ``%traceml history --name``, ``check --history``) ----
# Measured at these defaults (tests/unit/test_changepoints.py; 3,000 other simulated histories of
# 20-30 runs, run-to-run noise lognormal 3-10% per history, one run in 20 on a busy machine and
# 20-60% slower): identical runs show a shift in 0.3% of histories (0.07% a slowdown beyond 10%
# that ``check --history`` fails on); a +20% shift in the middle is found within two runs of
# where it happened in 80%, a +10% shift in 31% (this much noise hides most +10% shifts).
#: The least runs on each side of a shift (runs): a shift is told once this many runs follow it,
#: and one or two busy-machine runs at the end of a history cannot make one.
CHANGE_MIN_RUNS = 4
#: The least runs a history needs before its shifts are looked for (runs). With 10 runs a
#: clean +20% step reaches the significance level in 8% of histories (the runs can only be
#: shuffled into 210-252 distinct halves); with 12, in 77%.
CHANGE_MIN_HISTORY = 12
#: The permutation test's level: the chance that a history of identical runs shows a shift
#: (exact for runs whose noise is exchangeable). At 0.01 the measured false alarm rate was
#: 0.8-1.0%, with no margin under the 1% it is held to; at 0.005 it is 0.3-0.7%.
CHANGE_SIGNIFICANCE = 0.005
#: Shuffles of the runs in the permutation test: with 399, a split is significant when at most
#: one shuffle scores as high (p = 2/400); more only sharpen p-values far from the level.
CHANGE_PERMUTATIONS = 399
#: The least shift reported, as the ratio of the segments' median step times less 1, either
#: way (0.05 = 5% slower, or faster by the same ratio): a significant move of a few percent (a
#: long history tells 3% apart) is noise of the machine, not a change worth a line. At 0.05
#: a third more identical histories showed a (small) shift than at 0.08.
CHANGE_MIN_SHIFT = 0.08

# --- the A/B gate (``python -m traceml_nb ab``, :mod:`.paired`) ---------------------------------
# Chosen by the simulation study in tests/unit/test_paired.py (10,000 simulated A/B decisions per
# case: per-run lognormal noise of 3-8% of a 10 ms step, a slow drift across the job, busy
# spells of 1-3 runs 20-60% slower). At these defaults and --max-slowdown 0.10: identical code
# called slower in 0.25% of decisions (1.5% inconclusive), +10% caught in 82%, +20% in 99.9%;
# 8.3 rounds used on average for identical code, 14.6 at +10%, 8.4 at +20%. At the noisiest
# machine of the study (8% on every run) the false alarm rate is 0.5% and +10% is caught in 68%.
#: The most rounds (one run of the base and one of the head each, ABBA) a gate makes before it
#: answers "inconclusive" (exit 3): 30 rounds = 60 runs of the command. Fewer (25) catch +10% in
#: under 80% of the study's decisions; most decisions stop long before (early stopping).
DEFAULT_AB_ROUNDS = 30
#: The gate looks at the rounds (and may stop) from this many rounds on: with fewer, a spread
#: from 2-4 ratios is itself too uncertain (and a busy spell too strong) to be worth a look of
#: the false alarm budget. Also the least ``--rounds`` allowed. 5 or 6 gave the same rates.
MIN_AB_ROUNDS = 5
#: The one-sided level of the "slower" bound at each look (a probability). The gate looks after
#: every round from ``MIN_AB_ROUNDS`` on (up to 26 looks), so each look gets far less than the
#: ``FALSE_ALARM_RATE`` of one comparison: 0.001 keeps the whole sequential procedure at 0.25%
#: (0.5% on the noisiest machine); 0.002 gave 0.5% (1.1% with 8% noise on every run).
AB_FALSE_ALARM_PER_LOOK = 0.001
#: The one-sided level of the bound that must rule out a slowdown of ``--max-slowdown`` for a
#: "not slower" at each look (a probability): smaller than ``MISS_RATE``, since a true +10%
#: slowdown gets a chance to pass at every look. 0.05 caught +10% in 78%, 0.03 in 81%.
AB_MISS_PER_LOOK = 0.03
#: A failed or empty run's report shows at most this many of the last lines of its output.
AB_OUTPUT_TAIL_LINES = 20
