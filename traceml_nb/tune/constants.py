"""Every threshold and default of the tuner, in one place, each with the reason for its value.

docs/tune.md explains them for users; ``tests/unit/test_tune_pure.py`` tests each one on both sides
of its value.
"""

from __future__ import annotations

#: Tuning's default time budget, seconds (``%traceml tune --budget``).
TUNE_BUDGET_S = 60.0
#: The recommendation is the cheapest candidate (fewest workers, then fewest batches in
#: flight, then unpinned) whose predicted step time is within this share of the best one's: a
#: loader 3% faster that needs twice the workers (each a process holding the dataset, a share
#: of the CPUs) is not worth it, and on a shared machine two measurements of one loader differ
#: by a few percent.
WITHIN_BEST_SHARE = 0.05
#: After a round, a candidate predicted at least this many times slower than the best is
#: dropped (successive halving): a few batches already tell a loader 25% slower, while the
#: few-percent differences are what the next, longer round is for.
EARLY_DROP_FACTOR = 1.25
#: A candidate is skipped when the batches it keeps in flight (workers × prefetch_factor ×
#: the bytes of one batch) would take more than this share of the RAM available now: the rest
#: is for the training, the workers' own copies of the dataset and the other programs.
RAM_SHARE = 0.25
#: prefetch_factor values tried with workers (torch's default is 2).
PREFETCH_CHOICES = (2, 4, 8)
#: The most workers ever tried: past it the returns are small and every worker holds a copy
#: of the dataset object (as the advice's ``MAX_SUGGESTED_WORKERS``).
MAX_TUNE_WORKERS = 8
#: Workers using less than this share of a core each while the loader is iterated are
#: idle-waiting (on storage, a sleep, a remote source): then more workers than CPUs are
#: tried, since waiting workers need little CPU (as the diagnosis's ``WORKER_BUSY_PCT``).
IDLE_WORKER_SHARE = 0.5
#: Steady batches measured per candidate in the first round; each later round doubles it.
#: Each takes at least the run's compute time (the paced consumer of :mod:`.measure`): 6, 12
#: and 24 batches keep the quickstart's tuning within half a minute.
FIRST_ROUND_BATCHES = 6
#: At most this many rounds of successive halving.
MAX_ROUNDS = 3
#: Ready batches timed after a pause to measure what a worker loader costs the training
#: process per batch (taking a batch from the queue: unpickling, pinning).
TRAIN_SIDE_BATCHES = 4
#: ...and the pause's length, in times between batches, that lets that many batches queue up.
TRAIN_SIDE_PAUSE_FACTOR = 1.5
#: The other prefetch and pinning choices are tried for this many of the best worker counts
#: after the first round (more would spend the budget on settings that differ only when the
#: consumer is late: a deeper queue absorbs a late batch, it does not make the workers faster).
VARIANT_WORKER_COUNTS = 2
#: Of the budget left, the share the first round may use, so that the survivors get their
#: longer rounds.
FIRST_ROUND_BUDGET_SHARE = 0.5
#: A rerun with the tuned settings whose compute time per step (step less data wait) differs
#: from the tuned run's by more than this share says so beside the prediction: the prediction
#: is for the tuned run's compute, and the tuner does not run the model. Below it is the
#: run-to-run noise of a model's compute in the same settings (a few percent, measured on the
#: 2-vCPU VM in alternating runs); past it the compute itself changed (reruns with one core
#: kept busy ran the quickstart's model up to 20% faster or 10% slower).
COMPUTE_CHANGE_SHARE = 0.10
#: A worker candidate is recommended only where its workers would have this share of the
#: training's time per batch (*c* + *r*) to spare: *n* workers, each making a batch in about
#: the time the main process took without workers, deliver one every that time / *n* at best.
#: The paced measurement cannot see it (every loader that keeps up reads *c* + *r*, however
#: much it has to spare), and a rerun's model computed up to 20% faster than the tuned run's
#: (docs/tune.md): a loader with less to spare than that leaves the rerun waiting for data.
LOADING_HEADROOM_SHARE = 0.20
