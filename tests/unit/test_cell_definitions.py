"""The notebook code a cell runs beyond its own text: functions and classes of other cells,
followed from the names the cell reads, each hashed by its source. Cells are run as a kernel
runs them: into one ``__main__`` namespace, their source in the line cache."""

from __future__ import annotations

import itertools
import linecache
from typing import Any

import torch

from traceml_nb.analysis.attribution import definition_changes, what_changed
from traceml_nb.analysis.configuration import code_of
from traceml_nb.notebook.cell_definitions import MAX_DEFINITIONS, cell_code

_cells = itertools.count(1)


def cell_definitions(code: str, namespace: dict[str, Any]) -> dict[str, str] | None:
    """The definitions of :func:`cell_code` alone (None: the code does not parse)."""
    found = cell_code(code, namespace)
    return None if found is None else found.definitions


def run_cell(namespace: dict[str, Any], source: str) -> None:
    """Run ``source`` as a notebook cell: its file in the line cache, ``__main__`` its module."""
    filename = f"<test-cell-{next(_cells)}>"
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    exec(compile(source, filename, "exec"), namespace)


def notebook(*cells: str) -> dict[str, Any]:
    namespace: dict[str, Any] = {"__name__": "__main__", "torch": torch}
    for cell in cells:
        run_cell(namespace, cell)
    return namespace


HELPERS = """
def scale(x):
    return x * 2

def train(model, batches):
    return [scale(model(b)) for b in batches]

class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(2, 2)

    def forward(self, x):
        return self.layer(x)

model = Net()
"""
CELL = "out = train(model, [torch.zeros(1, 2)])\n"


def test_the_functions_and_classes_a_cell_uses_are_followed_through_their_code():
    found = cell_definitions(CELL, notebook(HELPERS))
    # train (named), scale (named by train's code), Net (model is one); not torch's
    assert found is not None and sorted(found) == ["Net", "scale", "train"]
    assert all(len(h) == 16 and int(h, 16) >= 0 for h in found.values())


def test_an_edit_in_another_cell_changes_the_hash_of_what_was_edited_only():
    namespace = notebook(HELPERS)
    before = cell_definitions(CELL, namespace)
    run_cell(namespace, HELPERS)  # the cell run again as it was
    assert cell_definitions(CELL, namespace) == before
    run_cell(namespace, "def scale(x):\n    return x * 3\n")
    after = cell_definitions(CELL, namespace)
    assert before is not None and after is not None
    assert [n for n in before if before[n] != after[n]] == ["scale"]
    assert definition_changes({"cell_definitions": before}, {"cell_definitions": after}) == [
        "scale changed (defined outside the cell)"
    ]
    # a model class edited, the instance made again in its cell: the class changed
    edited = HELPERS.replace("return self.layer(x)", "return self.layer(x).relu()")
    run_cell(namespace, edited)
    again = cell_definitions(CELL, namespace)
    assert again is not None and again["Net"] != before["Net"]


def test_what_the_cell_does_not_read_and_library_code_are_not_followed():
    namespace = notebook(HELPERS, "def unused():\n    return 1\n")
    # an attribute of the same name as a function of the notebook is not that function
    run_cell(namespace, "def fit(m):\n    m.train()\n    return m\n")
    assert list(cell_definitions("fit(model)\n", namespace) or {}) == ["Net", "fit"]
    assert cell_definitions("y = torch.nn.Linear(2, 2)(torch.zeros(1, 2))\n", namespace) == {}
    assert cell_definitions("x = 1 +\n", namespace) is None  # does not parse: unknown


def test_what_the_cell_defines_or_assigns_itself_is_its_own_code():
    """A cell that defines ``step`` and builds ``model`` itself: at its second run the
    namespace holds the first run's ``step`` and ``model``; they are the cell's own source,
    not definitions of other cells (an edit of the cell would otherwise key its next run by
    the previous version of ``step``)."""
    cell = "def step(x):\n    return scale(x)\nmodel = Net()\nstep(model(torch.zeros(1, 2)))\n"
    namespace = notebook(HELPERS)
    run_cell(namespace, cell)  # the first run: step and a new model now in the namespace
    # scale (which its step calls) and Net are of other cells; step and model are its own
    assert list(cell_definitions(cell, namespace) or {}) == ["Net", "scale"]
    imported = "import train\nfrom x import scale as model\ntrain(model)\n"
    assert cell_definitions(imported, namespace) == {}


def test_a_definition_without_source_is_hashed_by_its_code_and_the_count_is_capped():
    namespace = notebook()
    exec("def anonymous():\n    return 41\n", namespace)  # no line cache: no source to read
    found = cell_definitions("anonymous()\n", namespace)
    assert found is not None and list(found) == ["anonymous"]
    chain = "".join(f"def f{i}():\n    return f{i + 1}()\n" for i in range(MAX_DEFINITIONS + 10))
    run_cell(namespace, chain)
    assert len(cell_definitions("f0()\n", namespace) or {}) == MAX_DEFINITIONS


def test_the_definitions_join_the_cells_code_in_its_configuration():
    source = "train(model, loader)\n"
    plain = code_of(source, {})
    assert code_of(source, {"cell_definitions": None}) == plain  # runs stored before: same key
    assert code_of(source, {"cell_definitions": {}}) == plain  # nothing of the notebook's used
    one = code_of(source, {"cell_definitions": {"train": "aaaa"}})
    other = code_of(source, {"cell_definitions": {"train": "bbbb"}})
    assert one != plain and one != other and one[1] == other[1] == "cell"


class _Run:
    """What :func:`what_changed` reads of a run."""

    def __init__(self, definitions: dict[str, str] | None) -> None:
        self.source = CELL
        self.loaders: list[dict[str, Any]] = []
        self.environment = {"cell_definitions": definitions}
        self.load: dict[str, Any] = {}


def test_what_changed_says_the_notebook_code_changed_though_the_cell_did_not():
    changes = what_changed(_Run({"scale": "aaaa", "train": "cccc"}), _Run({"train": "dddd"}))
    assert changes.code == [] and changes.code_changed
    assert changes.summary.startswith("the code changed, same settings")
    assert changes.lines()[1:] == [
        "notebook code: scale is no longer used",
        "notebook code: train changed (defined outside the cell)",
    ]
    added = definition_changes({"cell_definitions": {}}, {"cell_definitions": {"g": "ee"}})
    assert added == ["g is used now (defined outside the cell)"]
    # a run stored before they were recorded: the code cannot be shown to be the same
    unrecorded = what_changed(_Run(None), _Run({"train": "dddd"}))
    assert unrecorded.definitions == [] and not unrecorded.code_changed
    assert unrecorded.summary == (
        "the same cell (the code of other cells it uses was not recorded before), same "
        "settings, same machine, same machine load."
    )
    assert what_changed(_Run({"train": "dddd"}), _Run({"train": "dddd"})).summary == (
        "same code, same settings, same machine, same machine load."
    )


def test_runs_stored_before_the_notebook_code_was_recorded_stay_the_cells_baseline():
    """An upgrade starts recording the notebook code a cell uses: the cell's runs stored
    before are still its baseline (the same cell, settings and versions; their other code
    unrecorded), not the runs of another cell of the name that ran last."""
    from store_helpers import ENV, make_run

    from traceml_nb.session.baselines import EARLIER, SAME, choose_baseline
    from traceml_nb.session.history import History

    history = History()
    starved = [history.add(make_run("demo", source=CELL, seed=i)) for i in range(3)]
    history.add(make_run("demo", source="other(cell)\n", seed=9))  # another cell, run last
    recorded = {**ENV, "cell_definitions": {"train": "aaaa"}}
    now = make_run("demo", source=CELL, env=recorded, seed=11)
    assert now.configuration.key != starved[0].configuration.key  # the code is a part
    baseline = choose_baseline(now, history, None)
    assert baseline.kind == SAME and baseline.runs == starved
    # the same upgrade for an edited cell: the configuration before it, as for any edit
    edited = make_run("demo", source="train(model, loader, epochs=2)\n", env=recorded, seed=12)
    baseline = choose_baseline(edited, history, None)
    assert baseline.kind == EARLIER and [r.source for r in baseline.runs] == ["other(cell)\n"]
    # once a run of it recorded them, the earlier ones stay beside it, in the order they ran
    history.add(now)
    later = make_run("demo", source=CELL, env=recorded, seed=13)
    assert choose_baseline(later, history, None).runs == [*starved, now]


def test_the_plain_values_the_cell_and_its_functions_read_are_kept_as_written():
    """``HIDDEN = 512`` in a settings cell, read by ``make``: kept as written, not in the
    configuration (a run id read by the cell would split every run), named in what changed;
    a string only as a hash; data is not a value."""
    from traceml_nb.notebook.cell_definitions import value_text

    settings = 'HIDDEN = 512\nSHAPE = (3, 32, 32)\nDTYPE = torch.bfloat16\nTOKEN = "s3cret"\n'
    make = "def make():\n    return torch.nn.Linear(HIDDEN, 2).to(DTYPE)\n"
    namespace = notebook(settings, make, "table = torch.zeros(1000)\n")
    code = cell_code("m = make()\nx = torch.zeros(SHAPE)\nlog(TOKEN, table)\n", namespace)
    assert code is not None and list(code.definitions) == ["make"]
    assert code.values == {
        "DTYPE": "torch.bfloat16",
        "HIDDEN": "512",
        "SHAPE": "(3, 32, 32)",
        "TOKEN": "str:" + code.values["TOKEN"][4:],
    }
    assert "s3cret" not in code.values["TOKEN"] and len(code.values["TOKEN"]) == 12
    assert value_text(list(range(9))) is None and value_text("x" * 100) is not None
    assert value_text(10**70) is None  # longer than MAX_VALUE_CHARS: data
    run_cell(namespace, settings.replace("512", "1024").replace("s3cret", "other"))
    again = cell_code("m = make()\nx = torch.zeros(SHAPE)\nlog(TOKEN, table)\n", namespace)
    assert again is not None and again.definitions == code.definitions
    before, after = _Run({"make": "aaaa"}), _Run({"make": "aaaa"})
    before.environment["cell_values"], after.environment["cell_values"] = code.values, again.values
    changes = what_changed(before, after, verdict="slower")
    assert changes.summary == "same code, other values, same settings, same machine."
    assert changes.lines()[1:] == [
        "notebook values: HIDDEN 512 \u2192 1024",
        "notebook values: TOKEN changed (a string, stored as a hash)",
    ]
    assert code_of(CELL, before.environment) == code_of(CELL, after.environment)
    # other values and a busier machine: not the machine's slowdown
    from traceml_nb.analysis.findings import Changes

    assert not Changes(values=["HIDDEN 512 \u2192 1024"], load="busier").only_load
    assert Changes(load="busier").only_load


DATA = """
class Slow(torch.utils.data.Dataset):
    def __len__(self):
        return 8

    def __getitem__(self, i):
        return torch.zeros(2)

def pad(batch):
    return torch.stack(batch)

loader = torch.utils.data.DataLoader(
    torch.utils.data.Subset(Slow(), [0, 1, 2]), batch_size=2, collate_fn=pad
)
"""


def test_a_loader_built_in_another_cell_leads_to_its_dataset_and_collate_code():
    """``for x in loader: ...`` runs the dataset's ``__getitem__`` and the collate function of
    the cell that built ``loader``: an edit of either is a change of the code the cell runs
    (a probe edited its Dataset class and read "same code, same settings"), looked through
    a ``Subset``; torch's own classes are not followed."""
    namespace = notebook(DATA)
    cell = "for x in loader:\n    model(x)\n"
    before = cell_definitions(cell, namespace)
    assert before is not None and sorted(before) == ["Slow", "pad"]
    run_cell(namespace, DATA.replace("torch.zeros(2)", "torch.ones(2)"))
    after = cell_definitions(cell, namespace)
    assert after is not None and [n for n in before if before[n] != after[n]] == ["Slow"]
    plain = notebook("loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset("
                     "torch.zeros(4, 2)), batch_size=2)\n")  # fmt: skip
    assert cell_definitions(cell, plain) == {}
