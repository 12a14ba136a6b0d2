"""The values a run was given beside its configuration (notebook values, a script's arguments):
which of them tell the configuration's runs apart, the baseline chosen by them and the noise
estimated within them, from the session's history and from a real store."""

from __future__ import annotations

import pytest
from store_helpers import ENV, make_run

from traceml_nb.analysis.noise import Noise
from traceml_nb.analysis.variants import (
    ARGUMENT_NAMES,
    ARGUMENTS,
    UNSETTLED_MIN_RUNS,
    agree,
    is_argument,
    other_values,
    repeating_names,
    unsettled_names,
    values_of,
    variant,
)
from traceml_nb.session.baselines import (
    EARLIER,
    OTHER_VALUES,
    SAME,
    SAME_VALUES,
    choose_baseline,
    machine_points,
    noise_for,
)
from traceml_nb.session.conclusion import MAX_NAMED_VALUES, baseline_title, values_words
from traceml_nb.session.history import History
from traceml_nb.session.store import Store


def given(step_ms: float, seed: int, **values: object):
    """A run of one configuration (the same cell, settings, machine) whose cell read
    ``values`` from the notebook (none given: a run stored before values were recorded)."""
    env = {**ENV, "cell_values": {k: str(v) for k, v in values.items()}} if values else ENV
    return make_run("tweak", step_ms=step_ms, seed=seed, env=env)


def test_a_name_tells_runs_apart_once_one_of_its_values_repeats():
    assert values_of({"cell_values": {"HIDDEN": "256"}, "script_args_sha": "ab12"}) == {
        "HIDDEN": "256",
        ARGUMENTS: "ab12",
    }
    assert values_of({"cell_values": None, "script_args_sha": None}) == {}
    stamps = [{"STAMP": str(1.7e9 + i), "HIDDEN": h} for i, h in enumerate(["256", "256", "1k"])]
    assert repeating_names(stamps) == {"HIDDEN"}  # a timestamp never repeats
    assert repeating_names(stamps[1:]) == set()  # 256 and 1k once each: not yet told apart
    assert agree({"HIDDEN": "256"}, {}, {"HIDDEN"})  # not recorded: agrees with any value
    assert not agree({"HIDDEN": "256"}, {"HIDDEN": "1k"}, {"HIDDEN"})
    assert variant(stamps[0], {"HIDDEN"}) == (("HIDDEN", "256"),)


def test_the_baseline_is_the_runs_given_the_same_values():
    """Three runs at ``HIDDEN = 256``, then 1024: judged against the three (other values:
    what changed names HIDDEN); the second at 1024 against the first; back at 256 against the
    three again, not against a mix of both sizes."""
    history = History()
    small = [history.add(given(10.0, i, HIDDEN=256)) for i in range(3)]
    large = given(20.0, 3, HIDDEN=1024)
    first = choose_baseline(large, history, None)
    assert (first.kind, first.values, first.split_by) == (SAME, OTHER_VALUES, ("HIDDEN",))
    assert first.runs == small
    history.add(large)
    second = choose_baseline(given(20.0, 4, HIDDEN=1024), history, None)
    assert (second.values, second.runs) == (SAME_VALUES, [large])
    back = choose_baseline(given(10.0, 5, HIDDEN=256), history, None)
    assert (back.values, back.runs) == (SAME_VALUES, small)


def test_the_configuration_before_an_edit_is_taken_at_the_judged_runs_values():
    """The cell edited while ``HIDDEN`` is 1024, after runs of the earlier code at 256 and at
    1024: the edit is judged against the earlier code's runs at 1024, not a mix of both."""
    history = History()
    for i, hidden in enumerate([256, 256, 1024, 1024, 256]):
        history.add(given(10.0 if hidden == 256 else 20.0, i, HIDDEN=hidden))
    env = {**ENV, "cell_values": {"HIDDEN": "1024"}}
    edited = make_run("tweak", step_ms=21.0, seed=9, env=env, source="train(loader, log=1)\n")
    chosen = choose_baseline(edited, history, None)
    assert (chosen.kind, chosen.values, chosen.split_by) == (EARLIER, SAME_VALUES, ("HIDDEN",))
    assert [r.summary.step_ms_median for r in chosen.runs] == pytest.approx([20.0] * 2, rel=0.02)
    title = baseline_title(edited, chosen.runs, EARLIER, ("code",), chosen.values, chosen.split_by)
    assert title == (
        "baseline: 2 runs of the earlier code of 'tweak' (#3\u2013#4), given the same values "
        "(HIDDEN)"
    )


def test_a_value_that_never_repeats_or_was_not_recorded_splits_nothing():
    """A timestamp read by the cell differs in every run: the runs stay one kind (else each
    would be a configuration of its own); runs stored before values were recorded agree with
    the values of those after."""
    history = History()
    runs = [history.add(given(10.0, i, STAMP=1.7e9 + i)) for i in range(4)]
    stamped = choose_baseline(given(10.0, 9, STAMP=1.8e9), history, None)
    assert (stamped.values, stamped.runs) == ("", runs)
    history = History()
    before = [history.add(given(10.0, i)) for i in range(3)]
    after = history.add(given(10.0, 3, HIDDEN=256))
    now = choose_baseline(given(10.0, 4, HIDDEN=256), history, None)
    assert (now.values, now.runs) == ("", [*before, after])


def test_a_scripts_arguments_that_repeat_tell_its_runs_apart():
    """``--model small`` and ``--model big`` in turn (one hash each): each judged against its
    own; the title says so."""
    history = History()
    for i in range(4):
        sha = "1111222233334444" if i % 2 == 0 else "5555666677778888"
        env = {**ENV, "script_sha": "aaaa1111bbbb2222", "script_args_sha": sha}
        history.add(make_run("train", step_ms=10.0 * (1 + i % 2), seed=i, source=None, env=env))
    env = {**ENV, "script_sha": "aaaa1111bbbb2222", "script_args_sha": "5555666677778888"}
    big = make_run("train", step_ms=20.0, seed=9, source=None, env=env)
    chosen = choose_baseline(big, history, None)
    assert chosen.values == SAME_VALUES and chosen.split_by == (ARGUMENTS,)
    assert [r.summary.step_ms_median for r in chosen.runs] == pytest.approx([20.0, 20.0], rel=0.02)
    title = baseline_title(big, chosen.runs, chosen.kind, (), chosen.values, chosen.split_by)
    assert (
        title
        == "baseline: 2 runs of this configuration of 'train' (#2, #4), given the same arguments"
    )


def test_a_scripts_arguments_by_name_tell_its_runs_apart_past_a_run_id():
    """``--run-name`` new in every run (a CI job's id) and ``--model small``/``big`` in turn:
    one hash of all the arguments never repeats, so the baseline mixed both models; by name,
    ``--model`` repeats and chooses the runs, ``--run-name`` never does."""
    from traceml_nb.session.environment import argument_values

    def run(step_ms: float, seed: int, model: str, *, by_name: bool = True):
        argv = ["--run-name", f"job-{seed}", "--model", model]
        env = {**ENV, "script_sha": "aaaa1111bbbb2222", "script_args_sha": f"{seed:016x}"}
        if by_name:
            env["script_args"] = argument_values(argv)
        return make_run("train", step_ms=step_ms, seed=seed, source=None, env=env)

    for by_name, expected in ((False, [20.0, 10.0, 20.0, 10.0, 20.0]), (True, [20.0] * 3)):
        history = History()
        for i in range(6):
            history.add(run(10.0 * (1 + i % 2), i, ("small", "big")[i % 2], by_name=by_name))
        big = run(20.1, 9, "big", by_name=by_name)
        chosen = choose_baseline(big, history, None)
        medians = [r.summary.step_ms_median for r in chosen.runs]
        assert medians == pytest.approx(expected, rel=0.02), by_name
    assert chosen.split_by == ("--model",)
    title = baseline_title(big, chosen.runs, chosen.kind, (), chosen.values, chosen.split_by)
    assert title.endswith("(#2, #4, #6), given the same arguments (--model)")
    assert values_of(big.environment) == {
        **argument_values(["--run-name", "job-9", "--model", "big"]),
        ARGUMENT_NAMES: "--model --run-name",
        ARGUMENTS: f"{9:016x}",
    }


def test_runs_stored_before_the_arguments_were_recorded_by_name_stay_told_apart():
    """A CI job alternating ``--model small`` and ``big`` (no run id) stored its runs with one
    hash of the arguments; the first jobs of a version that records them by name share that
    hash with the runs before, so the big ones are judged against the big runs before, not
    against every run (which agreed with any argument they did not record)."""
    from traceml_nb.session.environment import argument_values, script_args_sha

    def run(step_ms: float, seed: int, model: str, *, by_name: bool):
        argv = ["--model", model]
        env = {**ENV, "script_sha": "a" * 16, "script_args_sha": script_args_sha(argv)}
        if by_name:
            env["script_args"] = argument_values(argv)
        return make_run("train", step_ms=step_ms, seed=seed, source=None, env=env)

    history = History()
    for i in range(8):
        model = ("small", "big")[i % 2]
        history.add(run(10.0 * (1 + i % 2), i, model, by_name=False))
    history.add(run(20.0, 8, "big", by_name=True))
    chosen = choose_baseline(run(20.1, 9, "big", by_name=True), history, None)
    assert [r.summary.step_ms_median for r in chosen.runs] == pytest.approx([20.0] * 5, rel=0.02)
    assert chosen.values == SAME_VALUES
    assert is_argument("--model") and is_argument("argument 1") and is_argument(ARGUMENTS)
    assert not is_argument("HIDDEN")


def test_a_flag_given_or_not_tells_a_scripts_runs_apart():
    """``--fp16`` in two runs, not in two others: the runs without it did not leave it
    unrecorded (which would agree with any value), they did not give it."""
    from traceml_nb.session.environment import argument_values

    def run(step_ms: float, seed: int, *flags: str):
        argv = ["--run-name", f"job-{seed}", "--model", "big", *flags]
        env = {**ENV, "script_sha": "a" * 16, "script_args_sha": f"{seed:016x}"}
        env["script_args"] = argument_values(argv)
        return make_run("train", step_ms=step_ms, seed=seed, source=None, env=env)

    history = History()
    for i in range(4):
        history.add(run(20.0, i) if i % 2 == 0 else run(12.0, i, "--fp16"))
    fp16 = choose_baseline(run(12.1, 8, "--fp16"), history, None)
    fp32 = choose_baseline(run(20.1, 9), history, None)
    assert [r.summary.step_ms_median for r in fp16.runs] == pytest.approx([12.0] * 2, rel=0.02)
    assert [r.summary.step_ms_median for r in fp32.runs] == pytest.approx([20.0] * 2, rel=0.02)
    assert values_words(fp16.values, fp16.split_by) == ", given the same arguments (--fp16)"
    assert values_words(fp32.values, fp32.split_by) == ", given the same arguments (--fp16)"
    # a flag given for the first time: the runs given the latest run's arguments, named
    first = History()
    for i in range(3):
        first.add(run(20.0, i))
    new = choose_baseline(run(12.0, 9, "--fp16"), first, None)
    assert (new.values, len(new.runs)) == (OTHER_VALUES, 3)
    assert values_words(new.values, new.split_by) == ", given other arguments (--fp16)"


def test_the_runs_judged_together_are_given_the_same_values_but_a_run_id(tmp_path):
    """``check --runs K``: the K latest runs are one job trained K times; ``--model small``
    among them is not (refused, as another configuration is); a ``--run-name`` new in every run
    is no other job."""
    import traceml_nb
    from traceml_nb.session.environment import argument_values

    store = Store(tmp_path / "runs.sqlite")
    for i, model in enumerate(["big"] * 5 + ["small", "big", "big"]):
        argv = ["--run-name", f"job-{i}", "--model", model]
        env = {**ENV, "script_sha": "a" * 16, "script_args_sha": f"{i:016x}"}
        env["script_args"] = argument_values(argv)
        step_ms = 10.0 if model == "small" else 20.0
        store.add(make_run("train", step_ms=step_ms, seed=i, source=None, env=env))
    mixed = traceml_nb.check("train", store=store.path, runs=3)
    assert mixed.exit_code == 2
    assert "and @6 was given other values than @8 (--model):" in mixed.text()
    together = traceml_nb.check("train", store=store.path, runs=2)
    assert together.exit_code in (0, 3), together.text()
    assert [r.stored_id for r in together.result.candidates] == [7, 8]
    assert other_values({"--fp16": "h", ARGUMENT_NAMES: "--fp16"}, {ARGUMENT_NAMES: ""}) == [
        "--fp16"
    ]
    assert other_values({"HIDDEN": "1"}, {}) == []  # not recorded: agrees


@pytest.mark.parametrize("runs", [UNSETTLED_MIN_RUNS - 1, UNSETTLED_MIN_RUNS])
def test_an_argument_or_string_that_differs_in_every_run_is_an_identifier(runs):
    given = [
        {"--run-name": f"h{i}", "--model": "big", "STAMP": f"str:{i:08x}", "LR": f"0.{i + 1}"}
        for i in range(runs)
    ]
    unsettled = unsettled_names(given)
    assert unsettled == ({"--run-name", "STAMP"} if runs >= UNSETTLED_MIN_RUNS else set())
    # a value two runs hold alike is a setting however many runs there are
    assert unsettled_names([*given, {"--run-name": "h0"}]) == unsettled - {"--run-name"}


def test_what_changed_names_an_identifier_apart_from_the_changes():
    """A notebook cell that reads a run id (a string) and a HIDDEN size: the id differs in
    every run and is no change of the work; HIDDEN is shown as written whatever it does."""
    from traceml_nb.analysis.attribution import unsettled_of, what_changed

    def cell(i: int, hidden: int):
        values = {"RUN_ID": f"str:{i:08x}", "HIDDEN": str(hidden)}
        return make_run("tweak", seed=i, env={**ENV, "cell_values": values})

    runs = [cell(0, 256), cell(1, 256), cell(2, 256)]
    same = what_changed(runs[1], runs[2], unsettled=unsettled_of(runs))
    assert same.summary.startswith("same code (RUN_ID differs in every run), same settings,")
    assert same.values == [] and same.unsettled == ["RUN_ID"]
    other = what_changed(runs[2], cell(3, 1024), unsettled=unsettled_of([*runs, cell(3, 1024)]))
    assert other.values == ["HIDDEN 256 \u2192 1024"]
    assert other.summary.startswith("same code, other values (RUN_ID differs in every run)")
    unknown = what_changed(runs[1], runs[2])  # nothing says RUN_ID is an identifier
    assert unknown.values == ["RUN_ID changed (a string, stored as a hash)"]


def test_the_titles_words_for_the_values_that_chose_the_runs():
    assert values_words("", ("HIDDEN",)) == ""
    assert values_words(OTHER_VALUES, ("HIDDEN",)) == ", given other values (HIDDEN)"
    assert values_words(SAME_VALUES, ("HIDDEN", ARGUMENTS)) == (
        ", given the same values (HIDDEN) and arguments"
    )
    assert values_words(OTHER_VALUES, ("--model", "argument 1")) == (
        ", given other arguments (--model, argument 1)"
    )
    assert values_words(SAME_VALUES, ("HIDDEN", "--lr")) == (
        ", given the same values (HIDDEN) and arguments (--lr)"
    )
    names = tuple(f"V{i}" for i in range(MAX_NAMED_VALUES + 2))
    assert values_words(SAME_VALUES, names) == ", given the same values (V0, V1, V2 and 2 more)"
    assert MAX_NAMED_VALUES == 3


def test_the_noise_is_each_values_scatter_around_its_own_mean(tmp_path):
    """Three runs at 10 ms (``HIDDEN = 256``) and three at 20 ms (1024) are two kinds of run,
    not a configuration whose runs scatter by 37%: the noise is that of each kind, from the
    session's history and from a store alike; unrecorded, the same runs taking turns read as
    scatter (three of one kind, then three of the other, are two levels: :mod:`~traceml_nb.
    analysis.levels`)."""

    def noise(earlier: list, judged, store: Store | None) -> Noise:
        history: History | None = History()
        for run in earlier:
            history.add(run)
        if store is not None:
            store.add_many(earlier)
            history = None
        points = machine_points(judged, history, store)
        return noise_for(judged, {judged.configuration.key}, points, 20.0)

    told = [given(m, i, HIDDEN=h) for i, (m, h) in enumerate(SIX)]
    taking_turns = [SIX[i] for i in (0, 3, 1, 4, 2, 5)]
    mixed = [given(m, i) for i, (m, _) in enumerate(taking_turns)]
    judged = given(20.1, 9, HIDDEN=1024)
    from_history = noise(told, judged, None)
    from_store = noise(told, judged, Store(tmp_path / "told.sqlite"))
    unrecorded = noise(mixed, given(20.1, 9), Store(tmp_path / "mixed.sqlite"))
    assert from_history.sigma == pytest.approx(from_store.sigma)
    assert from_store.sigma < 0.10 < 0.20 < unrecorded.sigma
    # one configuration (two kinds of run in it), as the noise's words count them
    assert (from_store.own_configs, from_store.own_runs) == (1, 6)
    # 256 and 1024 once each: the judged run's 256 makes HIDDEN repeat, as for its baseline
    once = noise(
        [given(10.0, 0, HIDDEN=256), given(20.0, 1, HIDDEN=1024)], given(10.1, 2, HIDDEN=256), None
    )
    assert once.own_runs == 0


SIX = [(10.0, 256), (10.2, 256), (9.9, 256), (20.0, 1024), (20.3, 1024), (19.8, 1024)]


@pytest.mark.parametrize("by_name", [False, True])
def test_the_gate_judges_a_script_against_its_runs_given_the_same_arguments(tmp_path, by_name):
    """``train.py --model small`` and ``--model big`` in turn in CI, then ``big`` once more at
    its usual speed: against the runs given the same arguments it passes, where the last five
    runs of both and a noise of both sizes in one made it "+32%, inconclusive" (exit 3), as
    every later run of either would have been. ``by_name``: each job also given its own
    ``--run-name``, its arguments recorded one by one (one hash of all never repeats)."""
    import traceml_nb
    from traceml_nb.session.environment import argument_values

    store = Store(tmp_path / "gate.sqlite")
    small, big = "1111222233334444", "5555666677778888"

    def script(step_ms: float, seed: int, args: str):
        env = {**ENV, "script_sha": "aaaa1111bbbb2222", "script_args_sha": args}
        if by_name:
            model = "small" if args == small else "big"
            argv = ["--run-name", f"job-{seed}", "--model", model]
            env.update(script_args_sha=f"{seed:016x}", script_args=argument_values(argv))
        return make_run("train", step_ms=step_ms, seed=seed, source=None, env=env)

    for i in range(12):
        args = small if i % 2 == 0 else big
        store.add(script((10.0 if args == small else 20.0) * (1 + 0.005 * (i % 3)), i, args))
    store.add(script(20.1, 99, big))
    report = traceml_nb.check("train", store=store.path)
    result = report.result
    assert result.exit_code == 0, result.why
    split = ("--model",) if by_name else (ARGUMENTS,)
    assert (result.baseline_values, result.baseline_split_by) == (SAME_VALUES, split)
    said = "given the same arguments (--model):" if by_name else "given the same arguments:"
    assert said in report.text(), report.text()
    assert result.to_dict()["baseline_split_by"] == list(split)
    # the job's own --run-name, new in every run, is no change of the work
    if by_name:
        assert "Same code (--run-name differs in every run), same settings" in report.text()
    else:  # one hash of all the arguments, the same in every run of a model
        assert "Same code, same settings" in report.text()
    assert [r.summary.step_ms_median for r in result.baseline] == pytest.approx([20.0] * 5, rel=0.1)
