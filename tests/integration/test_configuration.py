"""A run's configuration (the unit of run-to-run noise): its key is stable across processes and
whitespace-only edits, each part changes it and is named by ``changed_parts``, the code is the
cell's, the script's or git's (or unknown); and the environment fields it reads, captured from a
real script, a real IPython shell and a real git repository."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from types import SimpleNamespace

import pytest
from store_helpers import ENV, REPO, make_run, python

from traceml_nb.analysis.attribution import ENVIRONMENT_FIELDS, LOADER_FIELDS
from traceml_nb.analysis.configuration import (
    CHANGE_PARTS,
    KEY_HEX_DIGITS,
    Configuration,
    changed_parts,
    code_of,
    configuration_of,
)
from traceml_nb.session.environment import capture_environment, hardware_class

CPU = "CPU: Test CPU \u00d72"
SOURCE = "for x, y in loader:\n    step(x, y)\n"
LOADER = {
    "num_workers": 2,
    "pin_memory": True,
    "prefetch_factor": 2,
    "persistent_workers": False,
    "batch_size": 32,
    "dataset_type": "ImageFolder",
    "dataset_len": 50_000,
    "optimizer_steps": 100,
    "fetches": 101,  # not a setting: not part of the configuration
}
EVAL_LOADER = {**LOADER, "num_workers": 0, "batch_size": 256, "optimizer_steps": 0}
VERSIONS = {"torch_version": "2.3.1", "cuda_version": "12.1", "gpu_driver": "550.54.15"}
#: The key of ``base()``: stored runs keep their keys, so the canonical form must never move.
BASE_KEY = "ed82475072155c57"


def base(**changes) -> Configuration:
    args = {
        "name": "train",
        "source": SOURCE,
        "loaders": [EVAL_LOADER, LOADER],
        "environment": {**ENV, **VERSIONS},
        "hardware": CPU,
    }
    args.update(changes)
    return configuration_of(**args)


# --- the key ----------------------------------------------------------------------------------
def test_the_key_is_16_hex_digits_of_the_parts():
    config = base()
    assert len(config.key) == KEY_HEX_DIGITS == 16
    assert int(config.key, 16) >= 0
    assert config.parts == {
        "name": "train",
        "hardware": CPU,
        "code": code_of(SOURCE, {})[0],
        "code_kind": "cell",
        "loader": {field: LOADER[field] for field in LOADER_FIELDS},  # the training loader
        "versions": VERSIONS,
    }
    assert config == base() and hash(config) == hash(base())


def test_the_key_is_the_same_in_another_process():
    """SHA-256 of canonical JSON, never Python's randomised ``hash``: a fresh interpreter (its
    own hash seed) and a pinned value agree."""
    done = python(
        f"""
        from traceml_nb.analysis.configuration import configuration_of
        print(configuration_of("train", {SOURCE!r}, [{EVAL_LOADER!r}, {LOADER!r}],
                               {{**{ENV!r}, **{VERSIONS!r}}}, {CPU!r}).key)
        """,
        env={"PYTHONHASHSEED": "random"},
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == base().key == BASE_KEY


def test_whitespace_only_edits_of_the_cell_keep_the_key():
    edited = "\n\nfor x, y in loader:   \n\n    step(x, y)\t\n\n\n"
    assert base(source=edited).key == base().key
    assert base(source=SOURCE.replace("    step", "  step")).key != base().key  # indentation
    assert base(source=SOURCE + "print(loss)\n").key != base().key


def test_the_order_of_dict_keys_does_not_matter():
    loader = dict(reversed(list(LOADER.items())))
    environment = dict(reversed(list({**ENV, **VERSIONS}.items())))
    assert base(loaders=[EVAL_LOADER, loader], environment=environment).key == base().key


# --- each part --------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "changes, parts",
    [
        ({"source": SOURCE + "scheduler.step()\n"}, ("code",)),
        ({"loaders": [EVAL_LOADER, {**LOADER, "num_workers": 4}]}, ("loader",)),
        ({"loaders": [EVAL_LOADER, {**LOADER, "pin_memory": False}]}, ("loader",)),
        ({"loaders": [EVAL_LOADER, {**LOADER, "prefetch_factor": 4}]}, ("loader",)),
        ({"loaders": [EVAL_LOADER, {**LOADER, "persistent_workers": True}]}, ("loader",)),
        ({"loaders": [EVAL_LOADER, {**LOADER, "batch_size": 64}]}, ("loader",)),
        ({"loaders": [EVAL_LOADER, {**LOADER, "dataset_type": "CIFAR10"}]}, ("loader",)),
        ({"loaders": [EVAL_LOADER, {**LOADER, "dataset_len": 10_000}]}, ("loader",)),
        ({"loaders": []}, ("loader",)),
        ({"environment": {**ENV, **VERSIONS, "torch_version": "2.4.0"}}, ("versions",)),
        ({"environment": {**ENV, **VERSIONS, "cuda_version": "12.4"}}, ("versions",)),
        ({"environment": {**ENV, **VERSIONS, "gpu_driver": "560.28.03"}}, ("versions",)),
        ({"hardware": "GPU: Tesla T4"}, ("hardware",)),
        (
            {
                "source": "train()\n",
                "loaders": [],
                "environment": {**ENV, "torch_version": "2.4.0"},
                "hardware": "GPU: Tesla T4",
            },
            CHANGE_PARTS,
        ),
    ],
)
def test_each_part_changes_the_key_and_is_named(changes, parts):
    after = base(**changes)
    assert after.key != base().key
    assert changed_parts(base(), after) == parts
    assert changed_parts(after, base()) == parts


def test_the_name_changes_the_key_but_is_no_changed_part():
    assert base(name="eval").key != base().key
    assert changed_parts(base(), base(name="eval")) == ()
    assert changed_parts(base(), base()) == ()


def test_what_is_not_the_configuration_leaves_the_key():
    """The evaluation loader, the loop's counts, other environment fields (the host, Python,
    the dataset as the environment saw it, the commit of a cell's repository)."""
    assert base(loaders=[{**EVAL_LOADER, "num_workers": 8}, {**LOADER, "fetches": 7}]) == base()
    other = {**ENV, **VERSIONS, "host_hash": "def", "python_version": "3.12.1"}
    other.update(git_commit="a" * 40, git_dirty=True, git_diff_sha="0" * 16, script_sha="1" * 16)
    assert base(environment=other).key == base().key


def test_without_an_optimizer_step_the_first_loader_is_the_training_one():
    config = base(loaders=[{**LOADER, "optimizer_steps": 0}])
    assert config.parts["loader"] == {field: LOADER[field] for field in LOADER_FIELDS}
    assert base(loaders=[]).parts["loader"] is None


# --- the code ---------------------------------------------------------------------------------
GIT = {"git_commit": "c0ffee" * 6 + "beef", "git_dirty": False, "git_diff_sha": None}


def test_the_code_is_the_cells_then_the_scripts_then_gits():
    script = {"script_sha": "0123456789abcdef", **GIT}
    assert code_of(SOURCE, script)[1] == "cell"  # a cell is its source, wherever it runs
    assert code_of(None, script) == ("0123456789abcdef", "script")
    code, kind = code_of(None, GIT)
    assert kind == "git" and len(code or "") == 16
    dirty = code_of(None, {**GIT, "git_dirty": True, "git_diff_sha": "aaaa" * 4})
    other_diff = code_of(None, {**GIT, "git_dirty": True, "git_diff_sha": "bbbb" * 4})
    other_commit = code_of(None, {**GIT, "git_commit": "f" * 40})
    assert len({code, dirty[0], other_diff[0], other_commit[0]}) == 4
    assert {dirty[1], other_diff[1], other_commit[1]} == {"git"}
    assert code_of("", script)[1] == "cell"  # an empty cell is still a cell


@pytest.mark.parametrize(
    "environment",
    [
        {},
        {"git_commit": None, "git_dirty": None},  # outside a repository
        {**GIT, "git_dirty": True},  # dirty, its diff not hashed (stored before it was)
        {**GIT, "git_dirty": None},  # git status failed
    ],
)
def test_unknown_code(environment):
    assert code_of(None, environment) == (None, None)
    config = configuration_of("job", None, [LOADER], environment, CPU)
    assert (config.parts["code"], config.parts["code_kind"]) == (None, None)
    assert changed_parts(configuration_of("job", None, [LOADER], environment, CPU), config) == ()
    known = configuration_of("job", None, [LOADER], {**environment, **GIT}, CPU)
    assert changed_parts(config, known) == ("code",)  # known on one side only: a change


def test_a_script_and_a_cell_of_one_text_are_two_codes():
    script = configuration_of("job", None, [LOADER], {"script_sha": "0" * 16}, CPU)
    cell = configuration_of("job", SOURCE, [LOADER], {"script_sha": "0" * 16}, CPU)
    assert changed_parts(script, cell) == ("code",)


# --- a run entry ------------------------------------------------------------------------------
def test_a_run_entrys_configuration_follows_its_environment():
    entry = make_run(env={})
    first = entry.configuration
    assert first == configuration_of(
        entry.name, entry.source, entry.loaders, {}, hardware_class({})
    )
    entry.environment = {**ENV, **VERSIONS}  # filled in after the entry was made
    assert entry.configuration.key != first.key
    assert entry.configuration.parts["hardware"] == hardware_class(entry.environment)
    assert entry.configuration.parts["loader"]["batch_size"] == 8
    assert changed_parts(first, entry.configuration) == ("versions", "hardware")


def test_the_history_file_format_is_unchanged():
    entry = make_run()
    entry.id = 1  # as the history numbers it
    data = entry.to_dict()
    assert "configuration" not in data
    back = type(entry).from_dict(json.loads(json.dumps(data)))
    assert back.configuration == entry.configuration


# --- the environment fields it reads ----------------------------------------------------------
CAPTURE = """
import json, sys
from types import SimpleNamespace
from traceml_nb.session.environment import capture_environment
env = capture_environment(SimpleNamespace(device_kind="cpu"), cwd={cwd!r})
print(json.dumps({{key: env[key] for key in ("script_sha", "script_args_sha", "git_diff_sha")}}))
print(json.dumps(env["script_args"]))
"""


def run_script(path, *args: str, by_name: bool = False) -> dict:
    """The script's environment fields (``by_name``: its ``script_args`` instead)."""
    done = subprocess.run(
        [sys.executable, str(path), *args],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=str(REPO),
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1 if by_name else -2])


def test_a_script_has_the_hash_of_its_source(tmp_path):
    import hashlib

    script = tmp_path / "train.py"
    script.write_text(CAPTURE.format(cwd=str(tmp_path)))
    first = run_script(script, "--model", "small")
    expected = hashlib.sha256(script.read_bytes()).hexdigest()[:16]
    arguments = hashlib.sha256(b"--model\0small\0").hexdigest()[:16]
    assert first == {"script_sha": expected, "script_args_sha": arguments, "git_diff_sha": None}
    assert run_script(script, "--model", "small") == first  # tmp_path: outside git
    assert run_script(script, "--model small")["script_args_sha"] not in (None, arguments)
    assert run_script(script)["script_args_sha"] not in (None, arguments)
    # each argument by name, its value a hash: what tells a script's runs apart
    by_name = run_script(script, "--model", "small", "--lr=0.1", "data", by_name=True)
    assert list(by_name) == ["--model", "--lr", "argument 1"]
    assert by_name["--model"] == hashlib.sha256(b"small\0").hexdigest()[:16]
    assert "small" not in json.dumps(by_name)
    script.write_text(CAPTURE.format(cwd=str(tmp_path)) + "# an edit\n")
    assert run_script(script)["script_sha"] not in (None, expected)
    code = CAPTURE.format(cwd=str(tmp_path))
    done = subprocess.run(  # python -c: no script, so no arguments of one
        [sys.executable, "-c", code, "--model", "small"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=str(REPO),
        check=False,
    )
    assert done.returncode == 0, done.stderr
    last = json.loads(done.stdout.strip().splitlines()[-2])
    assert last["script_sha"] is None and last["script_args_sha"] is None
    assert done.stdout.strip().splitlines()[-1] == "null"  # nor its arguments by name


def test_an_ipython_shell_has_no_script():
    from ipython_shell import traceml_shell

    with traceml_shell("from types import SimpleNamespace") as shell:
        result = shell.run_cell(
            "from traceml_nb.session.environment import capture_environment\n"
            "_env = capture_environment(SimpleNamespace(device_kind='cpu'))"
        )
        assert result.success, result.error_in_exec
        env = shell.user_ns["_env"]
    assert "script_sha" in env and env["script_sha"] is None
    assert "script_args_sha" in env and env["script_args_sha"] is None  # the kernel's own argv
    assert "script_args" in env and env["script_args"] is None


def git(cwd, *args: str) -> str:
    done = subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@example.org", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return done.stdout


def test_the_uncommitted_diff_of_a_real_repository(tmp_path):
    run = SimpleNamespace(device_kind="cpu")
    git(tmp_path, "init", "-q")
    (tmp_path / "model.py").write_text("LAYERS = 4\n")
    git(tmp_path, "add", "model.py")
    git(tmp_path, "commit", "-q", "-m", "first")
    clean = capture_environment(run, cwd=str(tmp_path))
    assert clean["git_commit"] == git(tmp_path, "rev-parse", "HEAD").strip()
    assert (clean["git_dirty"], clean["git_diff_sha"]) == (False, None)
    (tmp_path / "model.py").write_text("LAYERS = 8\n")  # an uncommitted edit
    dirty = capture_environment(run, cwd=str(tmp_path))
    assert dirty["git_dirty"] is True and len(dirty["git_diff_sha"]) == 16
    (tmp_path / "model.py").write_text("LAYERS = 16\n")  # another one
    other = capture_environment(run, cwd=str(tmp_path))
    assert other["git_diff_sha"] not in (None, dirty["git_diff_sha"])
    (tmp_path / "model.py").write_text("LAYERS = 8\n")  # the first edit again: the same hash
    assert capture_environment(run, cwd=str(tmp_path))["git_diff_sha"] == dirty["git_diff_sha"]
    codes = {code_of(None, env)[0] for env in (clean, dirty, other)}
    assert len(codes) == 3 and None not in codes
    git(tmp_path, "commit", "-q", "-am", "second")
    committed = capture_environment(run, cwd=str(tmp_path))
    assert (committed["git_dirty"], committed["git_diff_sha"]) == (False, None)
    outside = capture_environment(run, cwd=str(tmp_path.parent))
    assert outside["git_diff_sha"] is None


def test_the_code_fields_are_not_compared_field_by_field():
    """A comparison shows the configuration's changed parts, not two opaque hashes."""
    hashes = ("script_sha", "script_args_sha", "script_args", "git_diff_sha")
    assert not set(hashes) & set(ENVIRONMENT_FIELDS)


def test_the_module_docstring_lists_the_new_fields():
    from traceml_nb.session import environment

    doc = textwrap.dedent(environment.__doc__ or "")
    assert "``script_sha``" in doc and "``git_diff_sha``" in doc
    assert "``script_args_sha``" in doc and "``script_args``" in doc


def test_a_cell_given_no_name_is_its_code():
    """``cell [n]`` names no cell across sessions: two unnamed runs of one code share a
    configuration whatever their numbers; a name given keeps its own."""
    first, later = make_run("cell [3]"), make_run("cell [12]")
    first.named = later.named = False
    assert first.configuration == later.configuration
    assert first.configuration.parts["name"] == ""
    named = make_run("cell [3]")  # --name "cell [3]": the user's own name
    assert named.named and named.configuration.key != first.configuration.key
