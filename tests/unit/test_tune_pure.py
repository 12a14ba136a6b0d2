"""The tuner's pure parts on hand-built measurements: the prediction, the ranking, every
threshold on both sides of its value, the candidate grid, the line to paste and the table."""

from __future__ import annotations

from dataclasses import replace

import pytest

from traceml_nb.analysis.formatting import fmt_ms
from traceml_nb.tune.candidates import (
    Candidate,
    LoaderSpec,
    extra_worker_counts,
    first_round,
    in_flight_bytes,
    memory_guard,
    paste_line,
    same_settings,
    variants,
    worker_counts,
)
from traceml_nb.tune.constants import (
    COMPUTE_CHANGE_SHARE,
    EARLY_DROP_FACTOR,
    IDLE_WORKER_SHARE,
    LOADING_HEADROOM_SHARE,
    MAX_TUNE_WORKERS,
    PREFETCH_CHOICES,
    RAM_SHARE,
    WITHIN_BEST_SHARE,
)
from traceml_nb.tune.predict import (
    DROPPED,
    MEASURED,
    Measurement,
    TuneResult,
    drop_slow,
    headroom_note,
    making_ms,
    predict_for_compute_ms,
    predict_ms,
    recommend,
    spare_share,
    update_predictions,
)
from traceml_nb.tune.prediction import Prediction
from traceml_nb.tune.tuner import _conclude, _idle_extension
from traceml_nb.views.comparison_words import prediction_rows, prediction_sentence
from traceml_nb.views.tune import TuneReport, render_html, render_text

MIB = 1 << 20


def measured(
    workers: int,
    between_ms: float,
    *,
    prefetch: int = 2,
    train_ms: float = 0.5,
    cpu: float | None = None,
    pin: bool = False,
) -> Measurement:
    m = Measurement(Candidate(workers, prefetch if workers else None, pin), status=MEASURED)
    m.steady_batches, m.steady_s = 10, between_ms * 10 / 1e3
    if workers:
        m.train_side_samples = [train_ms]
    m.worker_cpu_share = cpu
    return m


# --- the prediction ------------------------------------------------------------------------------
def test_without_workers_the_batch_is_made_between_the_steps():
    m = measured(0, 16.0)
    assert m.training_side_ms == 16.0
    assert predict_ms(m, 25.0, cpus=2) == pytest.approx(41.0)  # c + d


def test_workers_overlap_the_compute_and_cost_their_training_side():
    keeps_up = measured(2, 11.0, train_ms=2.0)
    update_predictions([keeps_up], 25.0, cpus=2)
    assert keeps_up.predicted_ms == pytest.approx(27.0)  # max(c + r, d) = c + r
    too_slow = measured(1, 40.0, train_ms=2.0)
    update_predictions([too_slow], 25.0, cpus=2)
    assert too_slow.predicted_ms == pytest.approx(40.0)  # the workers are the limit: d


def test_workers_that_need_the_cpu_share_it_with_the_training():
    m = measured(2, 8.0, train_ms=0.5)
    m.worker_cpu_ms_per_batch = 30.0
    # (w + c) / CPUs = (30 + 10) / 2 = 20 ms, more than max(c + r, d) = 10.5 ms
    update_predictions([m], 10.0, cpus=2)
    assert m.predicted_ms == pytest.approx(20.0)
    update_predictions([m], 10.0, cpus=8)
    assert m.predicted_ms == pytest.approx(10.5)


@pytest.mark.parametrize(
    ("over", "moves"), [(WITHIN_BEST_SHARE - 0.01, True), (WITHIN_BEST_SHARE + 0.01, False)]
)
def test_the_prediction_made_again_for_another_compute(over, moves):
    # measured with the tuned run's 40 ms of compute after each batch, r = 2 ms
    m = measured(1, (40.0 + 2.0) * (1 + over), train_ms=2.0)
    update_predictions([m], 40.0, cpus=2)
    d = m.between_ms
    assert predict_for_compute_ms(m, 40.0, 40.0, cpus=2) == pytest.approx(m.predicted_ms)
    again = predict_for_compute_ms(m, 40.0, 30.0, cpus=2)
    # a worker that kept up came when asked, 10 ms sooner; one that did not keeps its pace
    assert again == pytest.approx(d - 10.0 if moves else d)
    # without workers the batch is the main process's own fetch: c' + d
    alone = measured(0, 16.0)
    assert predict_for_compute_ms(alone, 40.0, 30.0, cpus=2) == pytest.approx(46.0)
    # the workers' CPU share with the training still bounds it: (30 + 30) / 2
    m.worker_cpu_ms_per_batch = 30.0
    assert predict_for_compute_ms(m, 40.0, 30.0, cpus=2) == pytest.approx(max(again, 30.0))
    unmeasured = Measurement(Candidate(1, 2, False))
    assert predict_for_compute_ms(unmeasured, 40.0, 30.0, cpus=2) is None


def test_training_side_is_pooled_across_worker_candidates_of_the_same_pinning():
    a, b = measured(1, 20.0, train_ms=1.0), measured(2, 10.0, train_ms=3.0)
    c = measured(2, 10.0, train_ms=9.0, pin=True)
    update_predictions([a, b, c], 25.0, cpus=2)
    assert a.train_side_ms == b.train_side_ms == pytest.approx(2.0)
    assert c.train_side_ms == pytest.approx(9.0)


def test_without_a_compute_time_the_prediction_is_unavailable_and_batches_rank():
    slow, fast = measured(0, 20.0), measured(2, 10.0)
    update_predictions([slow, fast], None, cpus=2)
    assert slow.predicted_ms is None and fast.predicted_ms is None
    assert recommend([slow, fast]) is fast
    result = TuneResult(
        None,
        "#1 run",
        "completed",
        1.0,
        60.0,
        [slow, fast],
        None,
        recommended=fast.candidate,
        unavailable={"compute_ms": "the run has no steady steps"},
    )
    text = render_text(result)
    assert "unavailable (the run has no steady steps)" in text
    assert "predicted step time unavailable" in text
    assert " 0 ms" not in text and "0.0 ms" not in text


# --- the thresholds, both sides ------------------------------------------------------------------
@pytest.mark.parametrize(
    ("slower_by", "winner"), [(WITHIN_BEST_SHARE - 0.001, 1), (WITHIN_BEST_SHARE + 0.001, 2)]
)
def test_cheapest_within_share_of_the_best(slower_by, winner):
    best = measured(2, 100.0, train_ms=0.0)
    cheap = measured(1, 100.0 * (1 + slower_by), train_ms=0.0)
    update_predictions([best, cheap], 1.0, cpus=2)
    assert recommend([best, cheap]).candidate.num_workers == winner


def test_among_close_candidates_fewer_batches_in_flight_win():
    deep = measured(2, 100.0, prefetch=8, train_ms=0.0)
    shallow = measured(2, 101.0, prefetch=2, train_ms=0.0)
    update_predictions([deep, shallow], 1.0, cpus=2)
    assert recommend([deep, shallow]) is shallow


def balanced(making_ms: float) -> list[Measurement]:
    """The quickstart's tuning where a batch takes ``making_ms`` to make: the training takes
    20 ms a batch (compute 19 ms, training side 1 ms), and 1 and 2 workers both keep up."""
    own = measured(0, making_ms)
    one = measured(1, 20.5, train_ms=1.0)
    two = measured(2, 20.3, train_ms=1.0)
    update_predictions([own, one, two], 19.0, cpus=2)
    return [own, one, two]


@pytest.mark.parametrize(
    ("spare", "winner"),
    [(LOADING_HEADROOM_SHARE + 0.01, 1), (LOADING_HEADROOM_SHARE - 0.01, 2)],
)
def test_a_worker_count_with_too_little_to_spare_is_passed_over(spare, winner):
    # one worker making a batch in 20 × (1 − spare) ms: it keeps up with 20 ms a batch, and
    # only past LOADING_HEADROOM_SHARE would a rerun computing that much faster still keep it
    grid = balanced(20.0 * (1 - spare))
    assert recommend(grid, compute_ms=19.0).candidate.num_workers == winner
    assert recommend(grid, compute_ms=19.0, headroom=None).candidate.num_workers == 1


def test_the_room_is_judged_only_where_the_time_to_make_a_batch_is_known():
    _, one, two = balanced(20.0)
    assert recommend([one, two], compute_ms=19.0) is one  # no loader without workers measured
    assert recommend(balanced(20.0), compute_ms=None).candidate.num_workers == 1
    one.worker_cpu_ms_per_batch = 19.0  # the workers' CPU time a batch tells it too
    assert recommend([one, two], compute_ms=19.0) is two


def test_without_a_candidate_that_has_the_room_the_cheapest_close_one_stays():
    own, one, two = balanced(45.0)  # even 2 workers deliver only every 22.5 ms at best
    assert recommend([own, one, two], compute_ms=19.0) is one


def test_a_loader_without_workers_needs_no_room():
    own, one, two = balanced(1.0)  # the step of 20 ms with the batch made in it: the best
    assert spare_share(own, making_ms([own, one, two]), 19.0) is None
    assert spare_share(one, making_ms([own, one, two]), 19.0) == pytest.approx(0.95)
    assert recommend([own, one, two], compute_ms=19.0) is own


def test_the_note_says_why_a_costlier_loader_was_recommended():
    own, one, two = balanced(19.6)
    assert recommend([own, one, two], compute_ms=19.0) is two
    note = headroom_note(one, two, [own, one, two], 19.0)
    assert note.startswith("2 workers, prefetch 2 rather than 1 worker, prefetch 2")
    assert "with 2% to spare" in note and "makes a batch in about 19.6 ms" in note
    assert "so 1 worker delivers one every 19.6 ms at best" in note
    assert f"computes {LOADING_HEADROOM_SHARE:.0%} faster" in note
    # the tuning's result: the costlier loader to paste, and the note among its notes
    result = TuneResult(None, "#1 run", "completed", 1.0, 60.0, [own, one, two], None)
    result.compute_ms = 19.0
    _conclude(result, LoaderSpec("data", [("batch_size", "32")]), None, False, None)
    assert result.paste == "DataLoader(data, batch_size=32, num_workers=2, persistent_workers=True)"
    assert note in result.notes
    result = TuneResult(None, "#1 run", "completed", 1.0, 60.0, balanced(12.0), None)
    result.compute_ms = 19.0
    _conclude(result, LoaderSpec("data"), None, False, None)  # 1 worker has the room: no note
    assert result.recommended == one.candidate
    assert not any("rather than" in n for n in result.notes)


@pytest.mark.parametrize(
    ("factor", "dropped"), [(EARLY_DROP_FACTOR - 0.01, False), (EARLY_DROP_FACTOR + 0.01, True)]
)
def test_early_drop_factor(factor, dropped):
    best = measured(2, 100.0, train_ms=0.0)
    other = measured(1, 100.0 * factor, train_ms=0.0)
    update_predictions([best, other], 1.0, cpus=2)
    assert (other in drop_slow([best, other])) is dropped
    assert (other.status == DROPPED) is dropped
    assert best.status == MEASURED
    if dropped:
        assert "the best (100 ms)" in other.reason


def test_memory_guard_ram_share_both_sides():
    cand = Candidate(2, 4)  # 8 batches in flight
    need = in_flight_bytes(cand, MIB)
    assert need == 8 * MIB
    fits = int(need / RAM_SHARE)
    assert memory_guard(cand, MIB, fits) is None
    why = memory_guard(cand, MIB, fits - 1)
    assert why is not None and "8 batches in flight would take 8.0 MiB" in why
    assert f"more than {RAM_SHARE:.0%} of the" in why
    # pinning holds a second copy of each batch
    assert in_flight_bytes(Candidate(2, 4, True), MIB) == 16 * MIB
    # nothing to judge by: never skipped
    assert memory_guard(cand, None, fits) is None and memory_guard(cand, MIB, None) is None


@pytest.mark.parametrize(
    ("share", "extended"), [(IDLE_WORKER_SHARE - 0.01, True), (IDLE_WORKER_SHARE + 0.01, False)]
)
def test_more_workers_than_cpus_only_when_the_workers_idle(share, extended):
    ms = [measured(0, 40.0), measured(1, 30.0, cpu=share), measured(2, 20.0, cpu=share)]
    update_predictions(ms, 10.0, cpus=2)  # 2 workers: d = 20 ms > c + r = 10.5 ms
    assert (_idle_extension(ms, 2, 10.0) == [3, 4]) is extended


@pytest.mark.parametrize(
    ("over", "extended"), [(WITHIN_BEST_SHARE - 0.01, False), (WITHIN_BEST_SHARE + 0.01, True)]
)
def test_more_workers_than_cpus_only_when_the_best_is_clearly_behind_the_compute(over, extended):
    # c + r = 10.5 ms; the best (2 idle workers) a batch every 10.5 ms × (1 + over)
    d = 10.5 * (1 + over)
    ms = [measured(0, 40.0), measured(1, 30.0, cpu=0.1), measured(2, d, cpu=0.1)]
    update_predictions(ms, 10.0, cpus=2)
    assert (_idle_extension(ms, 2, 10.0) == [3, 4]) is extended


def test_no_more_workers_when_the_workers_keep_up_or_are_not_the_best():
    ms = [measured(0, 40.0), measured(1, 30.0, cpu=0.1), measured(2, 8.0, cpu=0.1)]
    update_predictions(ms, 10.0, cpus=2)
    assert _idle_extension(ms, 2, 10.0) == []  # d = 8 ms ≤ c + r: they keep up
    ms = [measured(0, 40.0), measured(1, 20.0, cpu=0.1), measured(2, 30.0, cpu=0.1)]
    update_predictions(ms, 10.0, cpus=2)
    assert _idle_extension(ms, 2, 10.0) == []  # the most workers are not the best


# --- the grid ------------------------------------------------------------------------------------
def test_worker_counts_up_to_the_cpus_then_past_them():
    assert worker_counts(2) == [0, 1, 2]
    assert worker_counts(None) == [0, 1, 2]
    assert worker_counts(64) == list(range(MAX_TUNE_WORKERS + 1))
    assert worker_counts(2, [4, 0, 4]) == [0, 4]
    assert extra_worker_counts(2, [0, 1, 2]) == [3, 4]
    assert extra_worker_counts(8, list(range(9))) == []  # at most MAX_TUNE_WORKERS
    assert extra_worker_counts(None, [0]) == []


def test_first_round_and_variants():
    assert first_round([0, 2], gpu=False) == [Candidate(0), Candidate(2, PREFETCH_CHOICES[0])]
    assert first_round([2], gpu=True) == [Candidate(2, 2, True)]
    other = variants(Candidate(2, 2, True), gpu=True)
    assert len(other) == len(PREFETCH_CHOICES) * 2 - 1 and Candidate(2, 2, True) not in other
    assert variants(Candidate(0), gpu=False) == []
    assert variants(Candidate(0, None, True), gpu=True) == [Candidate(0, None, False)]


def test_the_line_to_paste():
    spec = LoaderSpec("data", [("batch_size", "32"), ("shuffle", "True")])
    assert paste_line(spec, Candidate(2, 4)) == (
        "DataLoader(data, batch_size=32, shuffle=True, num_workers=2, persistent_workers=True, "
        "prefetch_factor=4)"
    )
    assert paste_line(spec, Candidate(1, 2, True)) == (
        "DataLoader(data, batch_size=32, shuffle=True, num_workers=1, pin_memory=True, "
        "persistent_workers=True)"
    )
    assert paste_line(spec, Candidate(0)) == "DataLoader(data, batch_size=32, shuffle=True)"


def test_each_loader_tune_cannot_build_is_named_in_words():
    from traceml_nb.analysis.advice import UNTUNABLE_DRIVERS
    from traceml_nb.tune.of_run import MADE_BY

    assert set(MADE_BY) == UNTUNABLE_DRIVERS


def test_the_line_to_paste_where_a_trainer_builds_the_loader():
    """The Trainer and skorch build the training DataLoader from their own arguments: the
    tuned settings go there, by their names there (a DataLoader line of the Trainer's own
    sampler and collate was no line its user can paste); a user's own DataLoader that
    Lightning or accelerate iterates keeps the DataLoader line."""
    spec = LoaderSpec("train", [("batch_sampler", "batch_sampler")], driver="transformers")
    assert paste_line(spec, Candidate(4, 4, True)) == (
        "TrainingArguments(\u2026, dataloader_num_workers=4, dataloader_pin_memory=True, "
        "dataloader_persistent_workers=True, dataloader_prefetch_factor=4)"
    )
    # skorch builds its DataLoaders anew each epoch: no persistent workers to keep; a
    # prediction's loader is set with iterator_valid__
    skorch = LoaderSpec("dataset", [("batch_size", "32")], driver="skorch")
    assert paste_line(skorch, Candidate(2, 2, True)) == (
        "NeuralNet(\u2026, iterator_train__num_workers=2, iterator_train__pin_memory=True)"
    )
    skorch.trains = False
    assert paste_line(skorch, Candidate(2, 2)) == "NeuralNet(\u2026, iterator_valid__num_workers=2)"
    evaluation = LoaderSpec("train", [], driver="transformers", trains=False)
    assert paste_line(evaluation, Candidate(2, 2)) == (
        "TrainingArguments(\u2026, dataloader_num_workers=2, dataloader_persistent_workers=True)"
    )
    for driver in ("lightning", "accelerate", "keras-fit", None):
        own = LoaderSpec("data", [("batch_size", "32")], driver=driver)
        assert paste_line(own, Candidate(2, 2)) == (
            "DataLoader(data, batch_size=32, num_workers=2, persistent_workers=True)"
        )


def test_same_settings_reads_the_run_loader():
    info = {"num_workers": 2, "pin_memory": False, "prefetch_factor": None}
    assert same_settings(Candidate(2, 2), info)  # torch's default prefetch
    assert not same_settings(Candidate(2, 4), info)
    assert same_settings(Candidate(0), {"num_workers": 0, "pin_memory": False})
    assert not same_settings(Candidate(0, None, True), {"num_workers": 0, "pin_memory": False})


def test_the_report_says_what_to_paste_and_what_it_saves():
    ms = [measured(0, 20.0), measured(2, 10.0, train_ms=2.0, cpu=0.2)]
    update_predictions(ms, 25.0, cpus=2)
    ms[0].status, ms[0].reason = DROPPED, "1.4× the best"
    result = TuneResult(
        1,
        "#1 quickstart",
        "completed",
        4.2,
        60.0,
        ms,
        Candidate(0),
        recommended=ms[1].candidate,
        predicted_ms=27.0,
        run_step_ms=45.0,
        paste="DataLoader(data, num_workers=2)",
    )
    assert result.saving_share == pytest.approx(0.4)
    text = render_text(result)
    assert (
        "recommended: 2 workers, prefetch 2, predicted step 27 ms (the run measured 45 ms" in text
    )
    assert "paste: DataLoader(data, num_workers=2)" in text
    assert "predicted saving: 40% of the step time (45 ms \u2192 27 ms)" in text
    assert "dropped (the run's setting)" in text and "1.4× the best" in text
    assert "20% of a core each" in text
    html = render_html(result)
    assert "<pre" in html and "DataLoader(data, num_workers=2)" in html
    assert repr(TuneReport(result)) == text


def rerun_prediction(
    predicted_ms: float, measured_ms: float, *, tuned_compute_ms: float, compute_ms: float
) -> Prediction:
    """A rerun's ``RunResult.prediction`` of the quickstart's recommended loader."""
    return Prediction(
        tuned_run="#1 quickstart",
        candidate="1 worker, prefetch 2",
        recommended=True,
        predicted_ms=predicted_ms,
        measured_ms=measured_ms,
        tuned_compute_ms=tuned_compute_ms,
        compute_ms=compute_ms,
    )


@pytest.mark.parametrize(
    ("change", "said"), [(COMPUTE_CHANGE_SHARE - 0.01, False), (COMPUTE_CHANGE_SHARE + 0.01, True)]
)
def test_the_rerun_says_when_the_model_itself_ran_at_another_speed(change, said):
    prediction = rerun_prediction(43.0, 40.0, tuned_compute_ms=40.0, compute_ms=40.0 * (1 - change))
    sentence = prediction_sentence(prediction)
    assert sentence.startswith(
        "%traceml tune of #1 quickstart predicted 43 ms a step for these settings "
        "(1 worker, prefetch 2): measured 40 ms (−7%)"
    )
    assert ("the model's own compute changed too (40 ms \u2192" in sentence) is said
    if said:
        assert sentence.endswith(f"−{change:.0%}), and the prediction was for 40 ms")
    # a run without a compute time (no steady DataLoader steps) says nothing of it
    assert prediction_sentence(replace(prediction, compute_ms=None)) == sentence.split(";")[0]
    assert len(prediction_rows(prediction)) == 1


@pytest.mark.parametrize(
    ("change", "said"), [(COMPUTE_CHANGE_SHARE - 0.01, False), (COMPUTE_CHANGE_SHARE + 0.01, True)]
)
def test_the_rerun_gives_the_prediction_for_its_own_compute_when_that_changed(change, said):
    prediction = rerun_prediction(40.0, 30.0, tuned_compute_ms=38.0, compute_ms=38.0 * (1 - change))
    prediction = replace(prediction, predicted_for_compute_ms=31.0)
    sentence = prediction_sentence(prediction)
    now = fmt_ms(prediction.compute_ms)
    assert sentence.endswith(f": for {now} it is 31 ms (measured −3%)") is said
    rows = prediction_rows(prediction)
    assert [r.label.startswith("step time predicted for this run's compute") for r in rows] == [
        False,
        *([True] if said else []),
    ]
    if said:
        assert (rows[1].before, rows[1].after, rows[1].delta) == ("31 ms", "30 ms", "−3%")
    # where it could not be made again, the sentence stops at what the prediction was for
    unknown = replace(prediction, predicted_for_compute_ms=None)
    assert prediction_sentence(unknown).endswith("the prediction was for 38 ms") is said
    assert len(prediction_rows(unknown)) == 1
