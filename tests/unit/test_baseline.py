"""Noise-aware baselines, what changed, and the idle-GPU cost: pure functions on hand-built
runs, each rule on both sides of its constant."""

from __future__ import annotations

import math

import pytest
from store_helpers import ENV, make_run

from traceml_nb.analysis.attribution import (
    environment_changes,
    load_sentence,
    loader_changes,
    other_cpu_share,
    source_diff,
    steal_sentence,
    steal_share,
    what_changed,
)
from traceml_nb.analysis.baseline import compare_with_baseline, is_regression
from traceml_nb.analysis.comparison import NO_CHANGE, SLOWER
from traceml_nb.analysis.cost import (
    DEFAULT_GPU_PRICES_USD_PER_HOUR,
    PRICE_SOURCE,
    cost_sentence,
    gpu_price,
    idle_cost,
    parse_prices,
)
from traceml_nb.analysis.noise import (
    RunPoint,
    default_noise_sigma,
    estimate_noise,
    is_busy,
    judge_change,
)
from traceml_nb.analysis.stats import f_sf
from traceml_nb.analysis.thresholds import (
    BUSY_MACHINE_SHARE,
    BUSY_NOISE_FACTOR,
    CLASS_OUTLIER_LEVEL,
    CLASS_PRIOR_MAX_DF,
    DEFAULT_NOISE_AT_10MS,
    DEFAULT_NOISE_EXPONENT,
    DEFAULT_NOISE_MAX,
    DEFAULT_PRIOR_DF,
    LOAD_CHANGE_SHARE,
    MATERIAL_STEAL_SHARE,
    OWN_NOISIER_LEVEL,
    SOURCE_DIFF_LINES,
    STEAL_CHANGE_SHARE,
    STEP_LENGTH_FACTOR,
)
from traceml_nb.views.comparison_words import headline, noise_source


# --- the noise ---------------------------------------------------------------------------------
def test_the_default_noise_grows_for_shorter_steps_up_to_its_cap():
    assert default_noise_sigma(10.0) == DEFAULT_NOISE_AT_10MS
    assert default_noise_sigma(100.0) == DEFAULT_NOISE_AT_10MS  # never below the 10 ms figure
    assert default_noise_sigma(0.5) == pytest.approx(
        DEFAULT_NOISE_AT_10MS * 20**DEFAULT_NOISE_EXPONENT
    )
    assert default_noise_sigma(1e-6) == DEFAULT_NOISE_MAX
    noise = estimate_noise([], 10.0)
    assert (noise.sigma, noise.df, noise.own_df) == (DEFAULT_NOISE_AT_10MS, DEFAULT_PRIOR_DF, 0)


def test_runs_of_one_configuration_estimate_the_noise_and_two_configurations_never_mix():
    a = [10.0, 10.2, 9.8, 10.1]
    b = [20.0, 20.4, 19.6, 20.2]  # another DataLoader: twice as slow, the same scatter
    pooled = estimate_noise([a, b], 10.0)
    assert pooled.own_df == 6 and pooled.own_runs == 8 and pooled.own_configs == 2
    assert pooled.sigma < DEFAULT_NOISE_AT_10MS  # the 2x between them is not noise
    mixed = estimate_noise([a + b], 10.0)
    assert mixed.sigma > 0.2


def test_other_configurations_of_the_machine_count_only_at_a_similar_step_length():
    def spread_group(config, ms, busy=False):
        return [RunPoint(config, ms * f, busy) for f in (0.8, 1.0, 1.25)]

    near = spread_group("near", 10.0 * STEP_LENGTH_FACTOR * 0.99)
    far = spread_group("far", 10.0 * STEP_LENGTH_FACTOR * 1.01)
    busy = spread_group("busy", 10.0, busy=True)
    mine = spread_group("mine", 10.0)
    noise = estimate_noise([], 10.0, [*near, *far, *busy, *mine], own_configs=["mine"])
    assert (noise.class_configs, noise.class_df) == (1, 2.0)
    assert noise.sigma > DEFAULT_NOISE_AT_10MS  # the near configuration's wide scatter counts
    many = [p for i in range(20) for p in spread_group(f"c{i}", 10.0)]
    assert estimate_noise([], 10.0, many).class_df == CLASS_PRIOR_MAX_DF


#: This VM's store when the demo's second run read its own fix "inconclusive" (ms): the
#: quickstart's two configurations, and three others of a similar step length, one of them a
#: script run with other arguments (two workloads under one key).
DEMO_OWN = [[44.5, 40.1, 42.0, 40.6, 42.5], [24.3, 27.3, 18.3, 25.4, 24.3]]
DEMO_MACHINE = [
    *(RunPoint("two workloads", ms) for ms in (45.4, 16.75, 42.1)),
    *(RunPoint("slow steps", ms) for ms in (68.05, 69.42, 68.03, 66.08)),
    *(RunPoint("fast steps", ms) for ms in (8.39, 9.32, 8.87)),
]


def test_a_configuration_whose_runs_scatter_far_beyond_the_rest_is_left_out():
    """The quickstart's own runs alike (its fixed cell's as quiet as its starved one's), the
    two quiet configurations beside them count; with the store's own runs, which scatter more
    (the fixed cell 15%), they are set aside too."""
    alike = [DEMO_OWN[0], [24.3 * ms / 42.0 for ms in DEMO_OWN[0]]]
    noise = estimate_noise(alike, 24.3, DEMO_MACHINE)
    assert (noise.class_configs, noise.class_left_out, noise.class_set_aside) == (2, 1, 0)
    assert noise.sigma == pytest.approx(0.052, abs=0.001)
    assert noise_source(noise) == (
        "10 runs of 2 configurations and 2 other configurations on this machine (1 more on "
        "this machine left out: its runs scattered far beyond the rest)"
    )
    assert "left out" not in noise_source(estimate_noise(alike, 24.3, DEMO_MACHINE[3:]))
    noise = estimate_noise(DEMO_OWN, 24.3, DEMO_MACHINE)
    assert (noise.class_configs, noise.class_left_out, noise.class_set_aside) == (0, 1, 2)
    assert noise.sigma == pytest.approx(0.102, abs=0.001)  # 0.199 with all, 0.088 with two
    assert judge_change([42.5], [24.3], noise, 0.10).verdict == "faster"
    assert noise_source(noise) == (
        "10 runs of 2 configurations (1 other configuration on this machine left out: its "
        "runs scattered far beyond the rest; 2 more set aside: their runs scatter less than "
        "these configurations')"
    )


def test_a_configuration_is_left_out_only_past_its_level():
    """The F test's two sides, a configuration's two runs against the default alone (8% on 4
    degrees of freedom): 7 and 13 ms (sd 44%), p ≈ 0.005, kept; 5 and 15 ms (sd 78%),
    p ≈ 0.0006, left out. With little evidence beside it, only a gross scatter is."""
    for apart, left_out in ((6.0, 0), (10.0, 1)):
        group = [RunPoint("c", 10.0 - apart / 2), RunPoint("c", 10.0 + apart / 2)]
        noise = estimate_noise([], 10.0, group)
        sd = abs(math.log((10.0 + apart / 2) / (10.0 - apart / 2))) / math.sqrt(2)
        p = f_sf(sd**2 / DEFAULT_NOISE_AT_10MS**2, 1, DEFAULT_PRIOR_DF)
        assert (p < CLASS_OUTLIER_LEVEL) is bool(left_out), p
        assert noise.class_left_out == left_out


def test_other_configurations_are_set_aside_only_past_their_level():
    """The F test's two sides, a configuration's four runs (ln ±d around their mean) against
    another configuration's four (ln ±0.03): twice as wide (F = 4, p ≈ 0.14), the other counts;
    2.65 times (F = 7, p ≈ 0.07), it is set aside, and the noise is the own runs' and the
    default's."""
    other = [RunPoint("c", 10.0 * math.exp(x)) for x in (-0.03, -0.03, 0.03, 0.03)]
    for ratio, set_aside in ((2.0, 0), (math.sqrt(7.0), 1)):
        own = [[10.0 * math.exp(x * 0.03 * ratio) for x in (-1, -1, 1, 1)]]
        noise = estimate_noise(own, 10.0, other, own_configs=["mine"])
        p = f_sf(ratio**2, 3, 3)
        assert (p < OWN_NOISIER_LEVEL) is bool(set_aside), p
        assert (noise.class_set_aside, noise.class_configs) == (set_aside, 1 - set_aside)
        alone = estimate_noise(own, 10.0, own_configs=["mine"])
        assert (noise.sigma == alone.sigma) is bool(set_aside)
        words = noise_source(noise)
        assert ("set aside: its runs scatter less than this configuration's" in words) is bool(
            set_aside
        ), words


def test_a_busy_machine_is_told_on_both_sides_of_its_thresholds():
    assert not is_busy({})
    assert not is_busy({"other_cpu_share": BUSY_MACHINE_SHARE - 0.01, "steal_share": None})
    assert is_busy({"other_cpu_share": BUSY_MACHINE_SHARE})
    assert not is_busy({"steal_share": MATERIAL_STEAL_SHARE - 0.001})
    assert is_busy({"steal_share": MATERIAL_STEAL_SHARE})


def test_a_run_on_a_busy_machine_is_judged_with_wider_noise():
    noise = estimate_noise([[10.0, 10.1, 9.9, 10.05, 9.95]], 10.0)
    quiet = judge_change([10.0] * 5, [12.5], noise, 0.10, one_sided=True)
    busy = judge_change([10.0] * 5, [12.5], noise, 0.10, one_sided=True, after_busy=True)
    assert quiet.verdict == SLOWER
    assert busy.verdict == "inconclusive"
    assert busy.se > BUSY_NOISE_FACTOR * 0.9 * quiet.se


def test_a_busy_runs_headline_says_its_noise_was_widened():
    """The band of a run judged on a busy machine names the factor that widened it; a quiet
    run's does not."""
    runs = baseline_runs([100.0, 101.0, 99.0, 100.5, 99.5])
    busy = compare_with_baseline(runs, make_run(step_ms=101.0, seed=9), after_busy=True)
    quiet = compare_with_baseline(runs, make_run(step_ms=101.0, seed=9))
    said = f"{BUSY_NOISE_FACTOR:g}\u00d7 for this run on a busy machine"
    assert said in headline(busy) and busy.after_busy and busy.to_dict()["after_busy"]
    assert said not in headline(quiet) and not quiet.after_busy
    assert busy.judgement.half_width > quiet.judgement.half_width


def baseline_runs(medians, steps=60, jitter=0.01):
    return [make_run(step_ms=m, steps=steps, jitter=jitter, seed=i) for i, m in enumerate(medians)]


def test_the_step_row_reads_the_mean_of_the_baseline_runs():
    runs = baseline_runs([100.0, 102.0, 98.0])
    result = compare_with_baseline(runs, make_run(step_ms=130.0, seed=4))
    assert result.rows[0].label == "median step time (mean of 3 runs)"
    assert result.baseline_ids == [r.id for r in runs]
    assert result.judgement is not None and result.noise is not None


def test_compare_judges_a_pair_with_the_noise_the_report_used(tmp_path):
    """``%traceml compare 5 6`` (``Session.compare``) and ``compare @5 @6`` read the noise of
    the runs' configuration made before 6, as its report's "vs previous run" line did:
    before, they took the default's 17% for two runs of 1.2 ms steps whose configuration
    scattered by 2%, and a stored run compared with itself counted in its own noise."""
    from traceml_nb.session.baselines import judging, machine_points
    from traceml_nb.session.session import Session

    session = Session(store=str(tmp_path / "runs.sqlite"))
    store = session.store()
    assert store is not None
    for i, median in enumerate([1.20, 1.23, 1.18, 1.21, 1.22, 1.19]):
        entry = session.history.add(make_run(step_ms=median, seed=i))
        entry.stored_id = store.add(entry)
    first, second = session.history.entries[4:6]
    report = judging(second, [first], machine_points(second, session.history, store))["noise"]
    by_number = session.compare(5, 6).noise
    before, after, _ = session.compare_refs("@5", "@6")
    by_id = session.judge_pair(before, after).noise
    assert by_number == report and by_id == report
    # and what changed between them, as the report says it (before: none from the API)
    assert session.compare(5, 6).changes[0].startswith("same code, same settings, same machine")
    assert report.own_runs == 5 and report.sigma < default_noise_sigma(1.2) - 0.04
    # runs made after 6, 30% slower (a slowdown no setting shows): its report's noise, still
    # (before, they widened it: "a change this small cannot be told" for what it had called
    # slower)
    for i, median in enumerate([1.58, 1.55, 1.60], start=6):
        entry = session.history.add(make_run(step_ms=median, seed=i))
        entry.stored_id = store.add(entry)
    assert session.compare(5, 6).noise == report
    before, after, _ = session.compare_refs("@5", "@6")
    assert session.judge_pair(before, after).noise == report


def test_the_gate_asks_one_question_is_it_slower():
    runs = baseline_runs([100.0, 101.0, 99.0, 100.5, 99.5], jitter=0.002)
    slower = compare_with_baseline(
        runs, make_run(step_ms=125.0, jitter=0.002, seed=8), margin=0.10, one_sided=True
    )
    assert slower.verdict == SLOWER and is_regression(slower)
    faster = compare_with_baseline(
        runs, make_run(step_ms=60.0, jitter=0.002, seed=8), margin=0.10, one_sided=True
    )
    assert faster.verdict == NO_CHANGE and not is_regression(faster)
    assert compare_with_baseline(runs, make_run(step_ms=60.0, jitter=0.002, seed=8)).verdict == (
        "faster"
    )


# --- what changed ----------------------------------------------------------------------------
def test_the_source_diff_names_the_changed_lines():
    before = "for x, y in loader:\n    step(x, y)\n"
    after = "for x, y in loader:\n    time.sleep(0.01)\n    step(x, y)\n"
    assert source_diff(before, after) == ["+ time.sleep(0.01)"]
    assert source_diff(before, before + "\n\n") == []
    assert source_diff(None, after) == []
    many = "\n".join(f"line{i}" for i in range(20))
    diff = source_diff("", many)
    assert len(diff) == SOURCE_DIFF_LINES + 1 and diff[-1].endswith("more changed lines")


def test_loader_and_environment_changes():
    a = make_run(num_workers=0)
    b = make_run(num_workers=4)
    assert "num_workers 0 \u2192 4" in loader_changes(a.loaders, b.loaders)
    assert loader_changes(a.loaders, a.loaders) == []
    newer = dict(ENV, torch_version="2.4.0", host_hash="zzz")
    changes = environment_changes(ENV, newer)
    assert changes == ["torch_version 2.3.1 \u2192 2.4.0", "another host"]
    assert environment_changes({}, newer) == []  # not recorded: nothing claimed


def test_other_processes_cpu_share_from_the_host_samples():
    host = {"sys_cpu_pct": [90.0, 90.0], "proc_cpu_pct": [100.0, 100.0], "workers_cpu_pct": []}
    # two CPUs at 90%: 1.8 cores busy, 1.0 of them this process: others used 0.8 / 2 = 40%
    assert other_cpu_share(host, 2) == pytest.approx(0.4)
    assert other_cpu_share(None, 2) is None
    assert other_cpu_share({"sys_cpu_pct": [float("nan")]}, 2) is None


def test_the_load_is_named_only_beyond_its_thresholds():
    busy = BUSY_MACHINE_SHARE + 0.05
    assert load_sentence(busy, busy - LOAD_CHANGE_SHARE - 0.01) is not None
    assert load_sentence(busy, busy - LOAD_CHANGE_SHARE + 0.02) is None  # moved too little
    quiet = BUSY_MACHINE_SHARE - 0.06
    assert load_sentence(quiet, 0.0) is None  # never busy enough to matter
    assert load_sentence(None, 0.0) is None


def test_when_only_the_load_differs_the_slowdown_is_the_machines():
    before = make_run(load=0.02)
    after = make_run(load=0.8)
    changes = what_changed(before, after, verdict="slower")
    assert changes.only_load
    assert changes.summary == (
        "same code, same settings, same machine; other processes used 80% of the CPUs during "
        "this run: the slowdown is the machine's, not your code's."
    )
    code = what_changed(
        before, make_run(load=0.8, source="train(loader)\nsleep()\n"), verdict="slower"
    )
    assert not code.only_load and code.code == ["+ sleep()"]
    assert code.summary == "the code changed, same settings, same machine."
    same = what_changed(before, make_run(load=0.02))
    assert same.summary == "same code, same settings, same machine, same machine load."
    assert same.lines() == [same.summary]


def script_run(load: float = 0.02, sha: str = "aaaa1111bbbb2222", args_sha: str | None = None):
    """A run of a main script: its source's hash ``sha``, its arguments' ``args_sha`` (None:
    stored before arguments were), ``load`` the others' CPU share."""
    env = {**ENV, "script_sha": sha, "script_args_sha": args_sha}
    return make_run(load=load, source=None, env=env)


def test_a_scripts_changed_source_is_a_code_change_not_the_machines_slowdown():
    """Runs of a script store a hash of its source, not the source: with the hash changed,
    the code changed, and a slowdown on a busier machine is not called the machine's."""
    before = script_run(0.02, "aaaa1111bbbb2222")
    changed = what_changed(before, script_run(0.8, "cccc3333dddd4444"), verdict="slower")
    assert not changed.only_load and changed.code == []
    assert changed.summary == "the code changed, same settings, same machine."
    assert (
        "script: its source changed (stored as a hash, aaaa1111 \u2192 cccc3333: not its "
        "lines)" in changed.lines()
    )
    same = what_changed(before, script_run(0.8, "aaaa1111bbbb2222"), verdict="slower")
    assert same.only_load and same.script is None
    assert same.summary.endswith("the slowdown is the machine's, not your code's.")


def test_a_scripts_other_arguments_are_not_the_machines_slowdown():
    """``python train.py --model big`` after ``--model small``: one configuration (the
    arguments are not in its key), but not the same work: a slowdown on a busier machine is
    not called the machine's, and the words say the arguments changed (a hash, never them)."""
    before = script_run(0.02, args_sha="1111222233334444")
    other = what_changed(before, script_run(0.8, args_sha="5555666677778888"), verdict="slower")
    assert not other.only_load and not other.code_changed
    assert other.summary == "same code, other arguments, same settings, same machine."
    assert (
        "script: its arguments changed (stored as a hash, 11112222 \u2192 55556666: not the "
        "arguments)" in other.lines()
    )
    both = what_changed(before, script_run(0.02, "cccc3333dddd4444", "5555666677778888"))
    assert both.summary.startswith("the code and its arguments changed, same settings")
    same = what_changed(before, script_run(0.8, args_sha="1111222233334444"), verdict="slower")
    assert same.only_load and same.arguments is None
    assert same.summary.endswith("the slowdown is the machine's, not your code's.")
    unknown = what_changed(before, script_run(0.8), verdict="slower")  # stored before
    assert unknown.arguments is None and unknown.only_load
    quiet = what_changed(before, script_run(0.02, args_sha="5555666677778888"))
    assert quiet.summary == "same code, other arguments, same settings, same machine."


# --- steal time ---------------------------------------------------------------------------------
def with_steal(entry, steal: float | None):
    entry.load["steal_share"] = steal
    return entry


def test_steal_share_is_the_mean_of_the_samples_that_measured_it():
    host = {"steal_pct": [10.0, float("nan"), 20.0]}
    assert steal_share(host) == pytest.approx(0.15)
    assert steal_share({"steal_pct": [0.0, 0.0]}) == 0.0  # measured: nothing taken
    assert steal_share({"steal_pct": [float("nan")]}) is None  # the kernel reports none
    assert steal_share({"sys_cpu_pct": [50.0]}) is None  # a record from before steal_pct
    assert steal_share(None) is None


def test_other_processes_share_leaves_the_steal_time_to_the_hypervisor():
    # two CPUs at 90%: 1.8 cores busy, 1.0 of them this process, 20% of the CPU time stolen:
    # others used 0.9 - 0.5 - 0.2 = 20%, not the 40% the busy time alone suggests
    host = {"sys_cpu_pct": [90.0, 90.0], "proc_cpu_pct": [100.0, 100.0], "steal_pct": [20.0] * 2}
    assert other_cpu_share(host, 2) == pytest.approx(0.2)
    unmeasured = dict(host, steal_pct=[float("nan")] * 2)  # no steal time: as before
    assert other_cpu_share(unmeasured, 2) == pytest.approx(0.4)
    assert other_cpu_share(dict(host, steal_pct=[95.0, 95.0]), 2) == 0.0  # never below 0


def test_steal_time_is_named_only_when_material_and_moved():
    material = MATERIAL_STEAL_SHARE + 0.02
    assert steal_sentence(material, 0.0) == (
        "the hypervisor took 7% of the CPUs (steal time) during this run (0% during the baseline)"
    )
    assert steal_sentence(MATERIAL_STEAL_SHARE - 0.01, 0.0) is None  # never material
    assert steal_sentence(material, material - STEAL_CHANGE_SHARE + 0.01) is None  # too little
    assert steal_sentence(material, material - STEAL_CHANGE_SHARE - 0.01) is not None
    assert steal_sentence(0.0, material) is not None  # the baseline's was: it went away
    assert steal_sentence(material, None) == (
        "the hypervisor took 7% of the CPUs (steal time) during this run (not measured during "
        "the baseline)"
    )
    assert steal_sentence(MATERIAL_STEAL_SHARE - 0.01, None) is None
    assert steal_sentence(None, material) is None  # this run did not measure it


def test_when_only_the_steal_time_differs_the_slowdown_is_the_machines():
    before = with_steal(make_run(load=0.02), 0.0)
    after = with_steal(make_run(load=0.02), 0.12)
    changes = what_changed(before, after, verdict="slower")
    assert changes.only_load and changes.load is None
    assert changes.summary == (
        "same code, same settings, same machine; the hypervisor took 12% of the CPUs (steal "
        "time) during this run: the slowdown is the machine's, not your code's."
    )
    assert changes.lines()[1] == (
        "machine load: the hypervisor took 12% of the CPUs (steal time) during this run "
        "(0% during the baseline)"
    )
    quieter = what_changed(after, before, verdict="faster")
    assert quieter.summary.endswith(
        "(steal time) during this run: the speed-up is the machine's, not your code's."
    )
    # the baseline did not measure it: said, but the slowdown is not blamed on it
    unknown = what_changed(with_steal(make_run(), None), after, verdict="slower")
    assert unknown.summary == (
        "same code, same settings, same machine; the hypervisor took 12% of the CPUs (steal "
        "time) during this run."
    )
    same = what_changed(with_steal(make_run(), 0.11), after, verdict="slower")
    assert same.steal is None
    assert same.summary == "same code, same settings, same machine, same machine load."


def test_busy_neighbours_and_steal_time_are_said_together():
    before = with_steal(make_run(load=0.02), 0.0)
    after = with_steal(make_run(load=0.6), 0.2)
    changes = what_changed(before, after, verdict="slower")
    assert changes.summary == (
        "same code, same settings, same machine; other processes used 60% of the CPUs during "
        "this run and the hypervisor took 20% of the CPUs (steal time) during this run: the "
        "slowdown is the machine's, not your code's."
    )
    code = what_changed(before, with_steal(make_run(source="sleep()\n"), 0.2), verdict="slower")
    assert not code.only_load and code.steal is not None
    assert code.summary == "the code changed, same settings, same machine."


def test_the_baseline_steal_time_given_wins_over_the_latest_runs():
    before = with_steal(make_run(), 0.2)
    after = with_steal(make_run(), 0.2)
    assert what_changed(before, after).steal is None
    changes = what_changed(before, after, baseline_steal_share=0.0)
    assert changes.baseline_steal_share == 0.0 and changes.steal is not None


# --- the idle GPU's cost ---------------------------------------------------------------------
def test_a_cpu_run_has_no_idle_gpu_cost():
    run = make_run()
    assert run.summary.gpu_util_median_pct is None and run.summary.gpu_stall_share is None
    assert idle_cost(run.summary, 10.0, None) is None
    assert cost_sentence(None) is None


def test_idle_cost_from_the_utilisation_and_the_default_price():
    summary = make_run().summary
    summary.gpu_util_median_pct = 40.0
    cost = idle_cost(summary, 3600.0, "Tesla T4")
    assert cost is not None
    assert cost.idle_share == pytest.approx(0.6) and cost.idle_gpu_s == pytest.approx(2160.0)
    assert cost.usd_per_hour == DEFAULT_GPU_PRICES_USD_PER_HOUR["T4"]
    assert cost.cost_usd == pytest.approx(0.6 * DEFAULT_GPU_PRICES_USD_PER_HOUR["T4"])
    assert cost.price_source == PRICE_SOURCE
    assert "36.0 GPU-min" in cost_sentence(cost) and "$0.32" in cost_sentence(cost)


def test_idle_cost_from_the_stall_share_and_a_configured_price():
    summary = make_run().summary
    summary.gpu_stall_share = 0.5
    cost = idle_cost(summary, 7200.0, "NVIDIA A100-SXM4-40GB", "A100=2.0,T4=0.3")
    assert cost.method == "GPU input stall" and cost.cost_usd == pytest.approx(2.0)
    assert idle_cost(summary, 3600.0, "Some GPU", "1.5").cost_usd == pytest.approx(0.75)
    unknown = idle_cost(summary, 3600.0, "Some GPU")
    assert unknown.cost_usd is None and "set TRACEML_NB_GPU_PRICE" in cost_sentence(unknown)


def test_price_parsing():
    assert parse_prices("0.53") == (0.53, {})
    assert parse_prices("T4=0.35, A100=2.9") == (None, {"T4": 0.35, "A100": 2.9})
    for bad in ("cheap", "T4=", "=3", "-1"):
        with pytest.raises(ValueError):
            parse_prices(bad)
    assert gpu_price("Tesla T4", "garbage")[1] == PRICE_SOURCE  # a bad setting is ignored
    assert gpu_price(None) is None


# --- how a baseline names its runs --------------------------------------------------------------
def test_a_baseline_with_a_gap_names_only_its_own_runs():
    """The demo's second session: the runs of its configuration are @1 and @3 (@2 is the
    other DataLoader setting), which a range @1–@3 would claim too."""
    from traceml_nb.analysis.formatting import fmt_run_span
    from traceml_nb.session.baselines import SAME
    from traceml_nb.session.check import subject
    from traceml_nb.session.conclusion import baseline_title
    from traceml_nb.views.check_words import baseline_words

    def stored(stored_id: int):
        run = make_run("q", seed=stored_id)
        run.stored_id, run.origin, run.session_id = stored_id, "store", "earlier"
        return run

    entry = make_run("q", seed=9)
    assert baseline_title(entry, [stored(1), stored(3)], SAME) == (
        "baseline: 2 runs of this configuration of 'q' (@1, @3), from an earlier session"
    )
    assert baseline_title(entry, [stored(i) for i in (2, 3, 4)], SAME).endswith(
        "(@2\u2013@4), from an earlier session"
    )
    assert baseline_words([stored(1), stored(3)], [None, None]) == "2 runs @1, @3"  # the gate's
    assert fmt_run_span([("@", 1), ("@", 2), ("@", 3), ("@", 5), ("#", 6), ("#", 7)]) == (
        "@1\u2013@3, @5, #6\u2013#7"
    )
    assert fmt_run_span([("@", 4)]) == "@4"
    # the gate's latest runs of a name, between which another name's runs were stored
    assert subject("q", stored(14), None, [stored(10), stored(14)], [stored(12)]) == (
        "'q' @10, @12, @14 (its latest 3 runs; @12 left out: it ran on a busy machine)"
    )


def argv_run(*argv: str, args_sha: str = "1" * 16):
    """A run of a main script that recorded its arguments by name (``script_args``)."""
    from traceml_nb.session.environment import argument_values

    env = {**ENV, "script_sha": "a" * 16, "script_args_sha": args_sha}
    return make_run(source=None, env={**env, "script_args": argument_values(list(argv))})


def test_a_scripts_arguments_recorded_by_name_are_named_where_they_changed():
    from traceml_nb.views.shift_lines import changes_clause

    before = argv_run("--model", "small", "--debug", "data")
    after = argv_run("--model", "big", "--fp16", "data", args_sha="2" * 16)
    changed = what_changed(before, after)
    assert changed.argument_names == ["--model", "--fp16", "--debug"]
    assert changed.arguments == (
        "its arguments changed: --model, --fp16 (given now), --debug (no longer given) "
        "(each stored as a hash: not its value)"
    )
    assert changed.summary.startswith("same code, other arguments, same settings")
    assert changes_clause(what_changed(before, argv_run("--model", "big", "--debug", "data"))) == (
        "where the script's argument --model changed"
    )
    assert changes_clause(changed) == (
        "where the script's arguments --model, --fp16, --debug changed"
    )
    # the same arguments in another order: an argument parser reads them alike
    flags = argv_run("data", "--model", "small", "--debug")
    reordered = what_changed(flags, argv_run("data", "--debug", "--model", "small"))
    assert reordered.arguments is None and reordered.argument_names == []
    # one run recorded them by name, the other only their hash: the hashes are compared
    older = script_run(args_sha="9" * 16)
    assert what_changed(older, after).arguments.startswith("its arguments changed (stored as")


def test_a_scripts_arguments_are_read_as_an_argument_parser_reads_them():
    from traceml_nb.session.environment import argument_values

    named = argument_values(["--model=big", "--lr", "-0.5", "-v", "--", "--not-an-option"])
    assert list(named) == ["--model", "--lr", "-v", "argument 1"]
    assert named == argument_values(["--model", "big", "--lr=-0.5", "-v", "--", "--not-an-option"])
    assert argument_values(["-"]) == argument_values(["-"]) and "argument 1" in argument_values(
        ["-"]
    )
    assert argument_values(["--tag", "a", "--tag", "b"]) != argument_values(
        ["--tag", "b", "--tag", "a"]
    )
    assert argument_values([]) == {}


def test_a_shift_says_a_scripts_source_or_arguments_changed():
    """The clause under a change point names what a script's run stores only as hashes."""
    from traceml_nb.views.shift_lines import changes_clause

    before = script_run(sha="a" * 16, args_sha="1" * 16)
    assert changes_clause(what_changed(before, script_run(sha="a" * 16, args_sha="1" * 16))) == (
        "with the same code, settings and environment"
    )
    assert changes_clause(what_changed(before, script_run(sha="a" * 16, args_sha="2" * 16))) == (
        "where the script's arguments changed"
    )
    assert changes_clause(what_changed(before, script_run(sha="b" * 16, args_sha="2" * 16))) == (
        "where the script's source changed, the script's arguments changed"
    )


def _judged(session, step_ms: float, seed: int):
    """A new run of the session's configuration, judged against its baseline as its report
    judges it: ``(comparison, baseline)``."""
    from traceml_nb.session.baselines import judging, machine_points

    entry = session.history.add(make_run(step_ms=step_ms, seed=seed))
    baseline = session.baseline_for(entry)
    points = machine_points(entry, session.history, None)
    return compare_with_baseline(baseline.runs, entry, **judging(entry, baseline.runs, points)), (
        baseline
    )


def test_a_lasting_slowdown_no_setting_shows_is_slower_until_it_has_held_for_level_runs():
    """Five runs, then the data 27% slower with nothing in the configuration to show it (a
    probe: "slower" once, then "+22%, inconclusive", "+16%, inconclusive" as the slow runs
    joined the fast ones' noise). Each slow run is judged against the runs before the shift,
    with the noise of each level around its own mean, until ``LEVEL_RUNS`` slow runs make
    the slow level the baseline; a further slowdown is judged against that level."""
    from traceml_nb.analysis.formatting import plural
    from traceml_nb.analysis.thresholds import LEVEL_RUNS
    from traceml_nb.session.session import Session

    session = Session(store=False)
    fast = [17.0, 17.1, 16.9, 17.05, 16.95]
    for i, median in enumerate(fast):
        session.history.add(make_run(step_ms=median, seed=i))
    sigmas = []
    for n in range(LEVEL_RUNS):
        c, baseline = _judged(session, 21.6 + 0.05 * n, seed=10 + n)
        assert c.verdict == SLOWER, (n, c.judgement)
        assert [r.id for r in baseline.runs] == [1, 2, 3, 4, 5]
        sigmas.append(c.noise.sigma)  # the levels' scatter with the prior, not the shift
        assert c.noise.sigma <= sigmas[0] * 1.05
        if n:
            assert baseline.note.startswith(f"the later {plural(n, 'run')} of this config")
    c, baseline = _judged(session, 21.7, seed=20)  # the slow level is the baseline now
    assert c.verdict != SLOWER and [r.id for r in baseline.runs] == [6, 7, 8]
    c, _ = _judged(session, 26.3, seed=21)  # and a further +21% is slower than it
    assert c.verdict == SLOWER


def test_one_slow_run_among_identical_ones_stays_in_their_level():
    """A run decided apart from its level with the next back at it is the machine's noise (a
    busy moment its load did not show): it stays in the baseline and in the noise."""
    from traceml_nb.analysis.levels import run_levels

    medians = [17.0, 17.1, 16.9, 17.05, 21.5, 16.95, 17.02]
    assert run_levels(medians, 17.0) == [0] * len(medians)
    steady = [17.0, 17.1, 16.9, 17.05, 16.95]
    assert run_levels([*steady, 21.5], 17.0)[-1] == -1  # the latest alone: pending
    assert run_levels([*steady, 21.5, 21.6], 17.0)[-2:] == [1, 1]  # two in a row: a level


def test_a_shifts_load_clause_says_the_load_before_it_too():
    """A shift beside a change of the machine's load names both loads: "+39% from @6, where
    other processes used 19% of the CPUs" read as the machine's blame where the load before
    the shift was the higher one."""
    from traceml_nb.views.shift_lines import changes_clause

    lighter = what_changed(make_run(load=0.6), make_run(load=0.19, seed=1))
    assert changes_clause(lighter) == "where other processes used 19% of the CPUs (60% before)"
    assert changes_clause(what_changed(make_run(load=0.2), make_run(load=0.21, seed=1))) == (
        "with the same code, settings and environment"
    )
