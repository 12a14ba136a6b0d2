"""``%traceml tune`` and ``%%traceml --tune`` in a real IPython shell, on the quickstart's
starved loader (the notebook's own dataset and model code): the recommendation, a rerun with it
that is no longer input-bound and runs at the predicted step time, the recommendation against
the best of the whole grid measured here, and the loop closed in the rerun's comparison."""

from __future__ import annotations

import contextlib
import ctypes
import gc
import json
import random
import statistics
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from IPython.core.error import UsageError
from ipython_shell import traceml_shell

from traceml_nb.analysis.formatting import fmt_ms
from traceml_nb.api import default_session
from traceml_nb.tune.candidates import Candidate, worker_counts
from traceml_nb.tune.constants import COMPUTE_CHANGE_SHARE, PREFETCH_CHOICES
from traceml_nb.tune.predict import MEASURED
from traceml_nb.tune.tuner import usable_cpus
from traceml_nb.views.comparison_words import headline, rows

NOTEBOOK = Path(__file__).resolve().parents[2] / "notebooks" / "01_quickstart.ipynb"
STARVED_LOADER = "loader = DataLoader(data, batch_size=32, shuffle=True, num_workers=0)"
#: The issue's performance target: tuning the quickstart's starved loader on 2 CPUs, s...
QUICKSTART_TUNE_S = 30.0
#: ...where its model's compute takes at most this long a step (39-48 ms on the 2-vCPU VM,
#: one core kept busy). Tuning is mostly batches times the compute, so a machine that runs the
#: model slower (a busier one) is given proportionally longer.
QUICKSTART_COMPUTE_MS = 50.0


def notebook_cells() -> list[str]:
    cells = json.loads(NOTEBOOK.read_text())["cells"]
    return ["".join(c["source"]) for c in cells if c["cell_type"] == "code"]


def setup_and_starved_cell() -> tuple[str, str]:
    """The notebook's dataset-and-model cell, and its first (starved) training cell."""
    code = notebook_cells()
    setup = next(c for c in code if "class SlowImages" in c)
    starved = next(c for c in code if STARVED_LOADER in c)
    return setup, starved


#: The reruns the must-show may take to find the model computing at the tuned run's speed.
RERUNS = 5
#: glibc's mallopt parameters, and what the test holds them at (see :func:`steady_allocator`).
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
STEADY_MMAP_THRESHOLD = 32 << 20  # glibc's largest: the model's activations stay on the heap
STEADY_TRIM_THRESHOLD = 256 << 20
DEFAULT_THRESHOLD = 128 << 10  # glibc's default for both


@contextlib.contextmanager
def steady_allocator() -> Iterator[None]:
    """Hold glibc's allocator steady while the quickstart's runs are compared.

    By default glibc serves a large block (the model's activations, MBs each) from fresh
    ``mmap`` pages or from its heap depending on what the process freed before, and trims the
    heap now and then. Measured on the 2-vCPU VM, the starved cell's step took 240 to 3,200
    minor page faults and 44 to 53 ms from one run to the next; with the thresholds held, 17
    faults and 39 to 43 ms. That is the process's history, not the loader, and the must-show is
    about the loader: the test fixes the two thresholds (which also stops glibc adjusting them)
    and puts the defaults back after (the adjustment stays off). Without glibc, nothing is
    changed."""
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        yield
        return
    mallopt(M_MMAP_THRESHOLD, STEADY_MMAP_THRESHOLD)
    mallopt(M_TRIM_THRESHOLD, STEADY_TRIM_THRESHOLD)
    try:
        yield
    finally:
        mallopt(M_MMAP_THRESHOLD, DEFAULT_THRESHOLD)
        mallopt(M_TRIM_THRESHOLD, DEFAULT_THRESHOLD)


@pytest.fixture(scope="module")
def ip():
    setup, _ = setup_and_starved_cell()
    with steady_allocator(), traceml_shell(setup + "\nSTEPS = 80\n") as shell:
        yield shell
        shell.user_ns.pop("loader", None)  # a rerun's persistent workers end with their loader
        gc.collect()


def cell(line: str, loader_line: str = STARVED_LOADER) -> str:
    """The notebook's starved training cell with ``line`` as its magic line."""
    _, starved = setup_and_starved_cell()
    body = starved.split("\n", 1)[1].replace(STARVED_LOADER, loader_line)
    return f"{line}\n{body}"


@pytest.fixture(scope="module")
def tuned(ip):
    """The starved run, then ``%traceml tune`` of it: (the run, the tuning, the wall time)."""
    default_session().history.clear()
    default_session().tunings.clear()
    result = ip.run_cell(cell("%%traceml --name quickstart -o starved"))
    assert result.success, result.error_in_exec
    started = time.perf_counter()
    result = ip.run_cell("%traceml tune -o tuning")
    wall = time.perf_counter() - started
    assert result.success, result.error_in_exec
    yield ip.user_ns["starved"], ip.user_ns["tuning"], wall
    default_session().history.clear()
    default_session().tunings.clear()


def test_quickstart_tune_recommends_and_the_rerun_runs_as_predicted(ip, tuned, capsys):
    starved, tuning, wall = tuned
    assert starved.diagnosis.verdict == "input-bound"
    assert tuning.status == "completed"
    assert tuning.recommended is not None and tuning.recommended.num_workers >= 1
    limit_s = QUICKSTART_TUNE_S * max(1.0, tuning.compute_ms / QUICKSTART_COMPUTE_MS)
    assert tuning.elapsed_s <= limit_s and wall <= limit_s + 5
    assert tuning.paste.startswith("DataLoader(data, batch_size=32, shuffle=True, num_workers=")
    assert tuning.predicted_ms < starved.summary.step_ms_median
    figures = []
    for attempt in range(RERUNS):
        rerun = ip.run_cell(
            cell("%%traceml --name quickstart -o fixed", f"loader = {tuning.paste}")
        )
        assert rerun.success, rerun.error_in_exec
        fixed = ip.user_ns["fixed"]
        out = capsys.readouterr().out
        measured = fixed.summary.step_ms_median
        assert fixed.diagnosis.verdict != "input-bound", fixed.diagnosis.title
        prediction = fixed.prediction
        assert prediction is not None and prediction.recommended
        beside = next(c for c in fixed.comparisons if c.comparison is fixed.comparison)
        assert beside.prediction is prediction  # beside the comparison with the previous run
        said = headline(beside.comparison, beside.prediction)
        if attempt == 0:  # the loop closed: the comparison shows the prediction beside it
            assert prediction.predicted_ms == pytest.approx(tuning.predicted_ms)
            assert "%traceml tune of #1 quickstart predicted" in said
            assert any(
                r.label.startswith("step time predicted by %traceml tune")
                for r in rows(beside.comparison, beside.prediction)
            )
            assert "%traceml tune of #1 quickstart predicted" in out
        # the prediction is for the compute the tuned run had; made again for the compute this
        # rerun had (each batch followed by it while the loader was measured), it holds always
        drift = prediction.compute_ms / tuning.compute_ms - 1
        again = prediction.predicted_for_compute_ms
        assert again is not None
        figures.append(
            f"predicted {tuning.predicted_ms:.1f} ms (compute {tuning.compute_ms:.1f} ms), "
            f"measured {measured:.1f} ms (compute {prediction.compute_ms:.1f} ms, drift "
            f"{drift:+.0%}); for that compute {again:.1f} ms"
        )
        with capsys.disabled():
            print(f"tune: {tuning.elapsed_s:.1f} s; rerun {attempt + 1}: {figures[-1]}")
        assert measured == pytest.approx(again, rel=0.15)
        # a rerun whose model ran within COMPUTE_CHANGE_SHARE of the tuned run's compute is
        # held to the original prediction: the must-show itself; one past it says so, and
        # gives the prediction for its own compute
        changed = "the model's own compute changed too" in said
        assert changed is (abs(drift) > COMPUTE_CHANGE_SHARE), said
        if not changed:
            assert measured == pytest.approx(tuning.predicted_ms, rel=0.15)
            return
        assert f"it is {fmt_ms(again)} (measured" in said
    # Every rerun's model computed more than COMPUTE_CHANGE_SHARE faster or slower than the
    # tuned run's: on some machines moving the loading off the main process changes the
    # model's own speed (CI once: 35.9 ms a step after in-process loading, 26.7-29.4 ms in all
    # five reruns with a worker), which the tuner, never running the model, cannot know. The
    # prediction for each rerun's compute held (above); against the original one there is
    # nothing to judge here.
    pytest.skip(f"the model's compute moved past the tuned run's in every rerun: {figures}")


def _train_steps(ns, loader, steps: int, warm: int = 3) -> list[float]:
    """The notebook's training step on ``loader``'s batches: the steady step times, s."""
    import torch
    from torch import nn

    model = ns["make_model"]()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    times: list[float] = []
    it = iter(loader)
    try:
        last = time.perf_counter()
        for i, (x, y) in enumerate(it):
            loss = nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            now = time.perf_counter()
            if i >= warm:
                times.append(now - last)
            last = now
            if len(times) == steps:
                break
    finally:
        stop = getattr(it, "_shutdown_workers", None)
        if stop is not None:
            stop()
    return times


#: Interleaved passes over the whole grid (half choose the best, half judge it) and steady
#: steps per candidate in each: 4 passes of 8 steps once read one candidate 27% faster than an
#: identical one under CI's load (1 worker, prefetch 8 against prefetch 2, a worker that keeps
#: up), the machine's speed moving between the candidates' turns. With one core kept busy it
#: moves from one candidate's turn to the next by more than the test's 10%: three runs of 6
#: passes of 10 steps judged "1 worker, prefetch 2" against "2 workers, prefetch 2" at
#: 30.0/28.2, 36.3/31.4 and 28.8/33.5 ms, and "1 worker, prefetch 2" against "prefetch 8" at
#: 28.8/39.2 in the third; so the judging compares two candidates within each pass, and a
#: pass is the unit its noise is resampled by (:func:`best_is_10pct_faster`).
GRID_PASSES = 6
GRID_STEPS = 10


def test_the_recommendation_is_within_10pct_of_the_best_of_the_whole_grid(ip, tuned):
    from torch.utils.data import DataLoader

    _, tuning, _ = tuned
    # the grid's worker counts: 0 up to the CPUs, and those the tuner tried past them
    counts = sorted(
        {m.candidate.num_workers for m in tuning.measurements} | set(worker_counts(usable_cpus()))
    )
    grid = [
        Candidate(n, f if n else None) for n in counts for f in (PREFETCH_CHOICES if n else (None,))
    ]
    ns = ip.user_ns
    # interleaved passes, so that a busy machine's drift hits every candidate alike; the best
    # is chosen on the even passes and judged on the odd ones (the best of many noisy medians,
    # judged on the data that chose it, reads faster than it is)
    passes: list[dict[Candidate, list[float]]] = []
    for rep in range(GRID_PASSES):
        times: dict[Candidate, list[float]] = {}
        for cand in grid[rep:] + grid[:rep]:
            kwargs = {"num_workers": cand.num_workers}
            if cand.num_workers:
                kwargs["prefetch_factor"] = cand.prefetch_factor
            loader = DataLoader(ns["data"], batch_size=32, shuffle=True, **kwargs)
            times[cand] = _train_steps(ns, loader, steps=GRID_STEPS)
        passes.append(times)
    choosing = {c: statistics.median(sum((p[c] for p in passes[0::2]), [])) for c in grid}
    judging = passes[1::2]
    best = min(choosing, key=choosing.__getitem__)
    rec = tuning.recommended
    print(
        {
            c.label: round(statistics.median(sum((p[c] for p in judging), [])) * 1e3, 1)
            for c in grid
        },
        "best",
        best.label,
        "recommended",
        rec.label,
    )
    # and the best must be more than 10% faster beyond the noise of those passes to fail it
    assert not best_is_10pct_faster([p[best] for p in judging], [p[rec] for p in judging])


def best_is_10pct_faster(best: list[list[float]], recommended: list[list[float]]) -> bool:
    """True when median(best) / median(recommended) is below 1 / 1.10 with 95% confidence.

    ``best[i]`` and ``recommended[i]``: the step times of the two candidates in judging pass
    *i*. A percentile bootstrap in two stages: the passes resampled, the same ones for both
    candidates (the machine's state in a pass is shared by its candidates), then each chosen
    pass's steps of each candidate. Resampling the steps alone took the steps of a pass,
    which share its state, for independent ones, and called a gap that the passes' states
    made, not the loader (:func:`test_a_gap_the_passes_disagree_on_is_not_called`)."""
    rng = random.Random(0)
    ratios = []
    for _ in range(2000):
        chosen = rng.choices(range(len(best)), k=len(best))
        b = [t for i in chosen for t in rng.choices(best[i], k=len(best[i]))]
        r = [t for i in chosen for t in rng.choices(recommended[i], k=len(recommended[i]))]
        ratios.append(statistics.median(b) / statistics.median(r))
    ratios.sort()
    return ratios[int(0.975 * len(ratios))] < 1 / 1.10


def _passes(ms_each: list[float], steps: int = GRID_STEPS) -> list[list[float]]:
    """A candidate's judging passes: ``steps`` times within 2% of each pass's figure."""
    return [[ms * (1 + 0.02 * ((k % 5) - 2) / 2) for k in range(steps)] for ms in ms_each]


def test_a_recommendation_slower_in_every_pass_is_found():
    assert best_is_10pct_faster(_passes([30, 31, 29]), _passes([36, 37, 35]))  # 20% slower
    assert not best_is_10pct_faster(_passes([30, 31, 29]), _passes([32, 33, 31]))  # 7%


def test_a_gap_the_passes_disagree_on_is_not_called():
    # the recommendation 30% slower in two passes and as fast in the third: the machine's
    # state in a pass, not the loader, as three loaded runs of the grid read
    best, rec = _passes([30, 31, 29]), _passes([39, 40, 29])
    assert not best_is_10pct_faster(best, rec)
    # the statistic it replaced, every step taken as independent, called it
    flat_best, flat_rec = sum(best, []), sum(rec, [])
    rng = random.Random(0)
    ratios = sorted(
        statistics.median(rng.choices(flat_best, k=len(flat_best)))
        / statistics.median(rng.choices(flat_rec, k=len(flat_rec)))
        for _ in range(2000)
    )
    assert ratios[int(0.975 * len(ratios))] < 1 / 1.10


LINEAR = "lin = torch.nn.Linear(8, 2); lopt = torch.optim.SGD(lin.parameters(), lr=0.1)\n"


def test_tune_after_an_input_bound_run_with_the_cell_option(ip, capsys):
    default_session().history.clear()
    assert ip.run_cell(LINEAR).success
    setup = (
        "class Quick(torch.utils.data.Dataset):\n"
        "    def __len__(self): return 128\n"
        "    def __getitem__(self, i):\n"
        "        time.sleep(0.002)\n"
        "        return torch.randn(8), i % 2\n"
        "quick = DataLoader(Quick(), batch_size=4)\n"
    )
    assert ip.run_cell(setup).success
    loop = (
        "for x, y in quick:\n"
        "    l = torch.nn.functional.cross_entropy(lin(x), y)\n"
        "    lopt.zero_grad(); l.backward(); lopt.step()\n"
    )
    result = ip.run_cell("%%traceml --tune --name quick\n" + loop)
    assert result.success, result.error_in_exec
    out = capsys.readouterr().out
    assert "--tune: the run is input-bound; measuring DataLoader settings" in out
    assert "traceml tune of #1 quick: done" in out
    assert "paste: DataLoader(dataset, batch_size=4, num_workers=" in out  # an unnamed dataset
    tuning = default_session().tunings[-1]
    assert tuning.run_label == "#1 quick" and tuning.loader_name == "quick"
    assert any(m.status == MEASURED for m in tuning.measurements)
    # a run that is not input-bound is not tuned
    assert ip.run_cell("x = torch.randn(4)").success
    result = ip.run_cell("%%traceml --tune\nfor i in range(3): lopt.step()\n")
    assert result.success
    assert "not input-bound: nothing to tune" in capsys.readouterr().out


def test_a_tuning_that_fails_after_the_cell_is_one_line_not_an_error(ip, capsys, monkeypatch):
    import traceml_nb.notebook.line_commands as commands

    def broken(*args, **kwargs):
        raise RuntimeError("tuner bug")

    monkeypatch.setattr(commands, "run_tuning", broken)
    default_session().history.clear()
    assert ip.run_cell(LINEAR).success
    setup = (
        "class Slow(torch.utils.data.Dataset):\n"
        "    def __len__(self): return 64\n"
        "    def __getitem__(self, i):\n"
        "        time.sleep(0.003)\n"
        "        return torch.randn(8), i % 2\n"
        "slow = DataLoader(Slow(), batch_size=4)\n"
    )
    assert ip.run_cell(setup).success
    loop = (
        "for x, y in slow:\n"
        "    l = torch.nn.functional.cross_entropy(lin(x), y)\n"
        "    lopt.zero_grad(); l.backward(); lopt.step()\n"
        "after = 1\n"
    )
    result = ip.run_cell("%%traceml --tune --name slow\n" + loop)
    assert result.success, result.error_in_exec
    assert ip.user_ns["after"] == 1
    assert "traceml: --tune failed: RuntimeError: tuner bug" in capsys.readouterr().out


def test_tune_finds_a_loader_held_outside_the_namespace(ip, capsys):
    default_session().history.clear()
    assert ip.run_cell(LINEAR).success
    code = (
        "class Holder: pass\n"
        "holder = Holder()\n"
        "holder.train = DataLoader(torch.utils.data.TensorDataset(torch.randn(64, 8), "
        "torch.randint(0, 2, (64,))), batch_size=4)\n"
    )
    assert ip.run_cell(code).success
    loop = (
        "%%traceml --name held\n"
        "for x, y in holder.train:\n"
        "    l = torch.nn.functional.cross_entropy(lin(x), y)\n"
        "    lopt.zero_grad(); l.backward(); lopt.step()\n"
    )
    assert ip.run_cell(loop).success
    assert ip.run_cell("%traceml tune --workers 0,1 --budget 5 -o held").success
    held = ip.user_ns["held"]
    assert held.loader_name is None and held.recommended is not None
    assert held.run_label == "#1 held"


def test_tune_usage_errors(ip, capsys):
    default_session().history.clear()
    assert ip.run_cell(LINEAR).success
    with pytest.raises(UsageError, match="no run to tune yet"):
        ip.run_line_magic("traceml", "tune")
    with pytest.raises(UsageError, match="expected numbers"):
        ip.run_line_magic("traceml", "tune --workers two")
    with pytest.raises(UsageError, match="must be positive"):
        ip.run_line_magic("traceml", "tune --budget 0")
    with pytest.raises(UsageError, match="no variable 'nope'"):
        ip.run_line_magic("traceml", "tune --loader nope")
    ip.user_ns["not_a_loader"] = 3
    with pytest.raises(UsageError, match="is a int, not a DataLoader"):
        ip.run_line_magic("traceml", "tune --loader not_a_loader")
    ip.run_line_magic("traceml", "tune --help")
    assert "--budget SEC" in capsys.readouterr().out
    # a run whose loader is gone: the reason and what to do
    inline = (
        "%%traceml --name gone --view none\n"
        "for x, y in DataLoader(torch.utils.data.TensorDataset(torch.randn(48, 8), "
        "torch.randint(0, 2, (48,))), batch_size=4):\n"
        "    l = torch.nn.functional.cross_entropy(lin(x), y)\n"
        "    lopt.zero_grad(); l.backward(); lopt.step()\n"
    )
    assert ip.run_cell(inline).success
    gc.collect()
    with pytest.raises(UsageError, match="is no longer alive; pass it: %traceml tune --loader"):
        ip.run_line_magic("traceml", "tune")
