"""The diagnosis is data and the views write it: every code the analysis states has words, a
diagnosis stored as sentences (before findings were data) reads and shows as it was stored, and
a code this version does not know is shown, never dropped."""

from __future__ import annotations

import ast
import json
from pathlib import Path

from traceml_nb.analysis import input_bound
from traceml_nb.analysis.diagnosis import BATCHED_INDEXING
from traceml_nb.analysis.findings import OLD_CAUSE_TEXTS, Diagnosis, Evidence, Finding
from traceml_nb.analysis.profile_summary import PROFILE_SUGGESTION
from traceml_nb.views.diagnosis_words import CAUSES, SENTENCES, diagnosis_words, sentence

ANALYSIS = Path(input_bound.__file__).parent
#: Codes made from a setting's name (``why-num_workers``): each setting the advice can change.
SETTINGS = ("num_workers", "pin_memory", "persistent_workers", "prefetch_factor")


def stated_codes() -> set[str]:
    """Every code written as a string literal in a ``Finding(...)`` or ``Evidence(...)`` of the
    analysis package, and the code constants it passes instead."""
    codes = {BATCHED_INDEXING, input_bound.TUNE_HINT, PROFILE_SUGGESTION}
    codes |= {f"why-{setting}" for setting in SETTINGS}
    for path in ANALYSIS.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "Finding":
                first = node.args[0] if node.args else None
                if isinstance(first, ast.Constant) and isinstance(first.value, str):
                    codes.add(first.value)
    return codes


def test_every_code_the_analysis_states_has_words():
    codes = stated_codes()
    assert len(codes) > 50  # the scan found them
    assert sorted(codes - set(SENTENCES)) == []


def test_every_cause_has_words_and_every_old_cause_sentence_maps_to_a_cause():
    causes = {v for k, v in vars(input_bound).items() if k.startswith("CAUSE_")}
    assert set(CAUSES) == causes
    assert set(OLD_CAUSE_TEXTS.values()) <= causes  # a cause added since has no old sentence
    old = set(OLD_CAUSE_TEXTS.values())
    assert {CAUSES[code]: code for code in old} == OLD_CAUSE_TEXTS  # the words did not change


def test_a_diagnosis_stored_as_sentences_reads_and_shows_as_it_was_stored():
    stored = {
        "verdict": "input-bound",
        "title": "Input-bound: the training loop waits for data 60% of step time",
        "confidence": "high",
        "cause": "too few DataLoader workers",
        "profiled_cause": None,
        "evidence": [{"label": "data wait", "value": 0.6, "text": "60% of step time"}],
        "advice": ["Change the training DataLoader: num_workers=0 → num_workers=2"],
        "wont_help": ["More than 2 workers: only 2 CPUs are available to this process."],
        "saving_bound_share": 0.6,
        "saving_text": "Data waits took 60% of this run.",
        "secondary": ["GPU evidence unavailable (CPU only): judged on host timings."],
    }
    d = Diagnosis.from_dict(json.loads(json.dumps(stored)))
    assert d.cause == input_bound.CAUSE_TOO_FEW_WORKERS
    assert d.title.code == "text"
    words = diagnosis_words(d)
    assert words.title == stored["title"]
    assert words.cause == "too few DataLoader workers"
    assert words.evidence == ["data wait: 60% of step time"]
    assert words.advice == stored["advice"] and words.wont_help == stored["wont_help"]
    assert words.saving == "Data waits took 60% of this run."
    assert words.also == stored["secondary"]


def test_a_diagnosis_round_trips_through_json():
    d = Diagnosis(
        verdict="host-bound",
        title=Finding("host-bound", {"input_share": 0.02, "busy_source": "nvml", "busy_pct": 40}),
        confidence="medium",
        evidence=[Evidence("GPU utilisation", 40.0, Finding("gpu-utilisation", {"pct": 40.0}))],
        advice=[Finding("remove-host-syncs")],
        saving_bound_share=0.6,
        saving=Finding("host-idle-saving", {"busy_source": "nvml", "idle_share": 0.6}),
    )
    back = Diagnosis.from_dict(json.loads(json.dumps(d.to_dict())))
    assert back == d
    assert diagnosis_words(back) == diagnosis_words(d)
    assert back.codes() == ["host-bound", "remove-host-syncs", "host-idle-saving"]


def test_a_code_without_words_is_shown_with_its_facts_never_dropped():
    assert sentence(Finding("from-a-newer-version", {"share": 0.5})) == (
        "from-a-newer-version (share=0.5)"
    )
    assert sentence(Finding("from-a-newer-version")) == "from-a-newer-version"
    # facts a sentence cannot be written from (a newer version's): the same, not an exception
    assert sentence(Finding("larger-batch", {"size": 8})) == "larger-batch (size=8)"
