"""A function recompiled with our statements inside it (the DataLoader's ``__next__``), and
where that is refused: every refusal falls back to a call of the function."""

from __future__ import annotations

import importlib
import linecache
import sys
import traceback

import pytest
import torch
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.dataloader import _BaseDataLoaderIter

import traceml_nb
from traceml_nb.instrument.recompile import Statements, calling, recompiled

LOGGING = Statements(
    entry="_traceml_log.append(('enter', {self}.n))",
    on_return="""
        _traceml_log.append(('return', _traceml_value))
        return _traceml_value
    """,
    on_stop="_traceml_log.append(('stop',))",
)

BOX = '''
def same(fn):
    return fn


class Guard:
    def __init__(self, box):
        self.box = box

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.box.events.append("out")


class Box:
    def __init__(self):
        self.__hidden = 3
        self.n = 0
        self.events = []

    def take(self, scale=2):
        """Counts; the second call returns a private attribute times ``scale``."""
        self.n += 1
        if self.n > 3:
            raise StopIteration
        if self.n == 2:
            return self.__hidden * scale
        return self.n

    def plain(self):
        self.n += 1

    def numbers(self):
        yield self.n

    @same
    def decorated(self):
        return 1

    def with_keyword(self, *, k=1):
        return k

    def guarded(self):
        with Guard(self):
            self.events.append("in")
            return 1

    def looping(self):
        for i in range(3):
            if i == 1:
                return i
        return -1

    def nested(self):
        def inner():
            return 1

        return inner()


def closure_of(value):
    def take(self):
        return value

    return take
'''


@pytest.fixture
def box_module(tmp_path, monkeypatch):
    path = tmp_path / "box_for_recompile.py"
    path.write_text(BOX)
    monkeypatch.syspath_prepend(str(tmp_path))
    module = importlib.import_module("box_for_recompile")
    yield module, path
    sys.modules.pop("box_for_recompile", None)
    linecache.checkcache()


def test_a_recompiled_method_runs_its_own_code_with_our_statements(box_module) -> None:
    module, path = box_module
    log: list = []
    take = recompiled(module.Box.take, {"_traceml_log": log}, LOGGING)
    assert take is not None
    box = module.Box()
    # scale keeps its default of 2, and the private name is mangled as in the class
    assert [take(box), take(box), take(box, 10)] == [1, 6, 3]
    with pytest.raises(StopIteration):
        take(box)
    assert log == [
        ("enter", 0),
        ("return", 1),
        ("enter", 1),
        ("return", 6),
        ("enter", 2),
        ("return", 3),
        ("enter", 3),
        ("stop",),
    ]
    assert take.__code__.co_filename == str(path)
    assert take.__code__.co_firstlineno == module.Box.take.__code__.co_firstlineno
    assert take.__qualname__ == "Box.take" and take.__doc__ == module.Box.take.__doc__
    assert take.__wrapped__ is module.Box.take


def test_a_function_without_a_return_returns_none_through_our_statements(box_module) -> None:
    module, _ = box_module
    log: list = []
    plain = recompiled(module.Box.plain, {"_traceml_log": log}, LOGGING)
    assert plain is not None
    assert plain(module.Box()) is None
    assert log == [("enter", 0), ("return", None)]


def test_our_statements_at_a_return_run_after_the_body_left_its_with_block(box_module) -> None:
    module, _ = box_module
    box = module.Box()
    guarded = recompiled(module.Box.guarded, {"_traceml_log": box.events}, LOGGING)
    assert guarded is not None
    assert guarded(box) == 1
    assert box.events == [("enter", 0), "in", "out", ("return", 1)]


@pytest.mark.parametrize(
    "which",
    [
        "source edited since the import",
        "generator",
        "decorated",
        "keyword-only parameter",
        "nested function",
        "a return inside a loop",
        "closure",
        "a name of ours",
        "no source",
        "bound method",
    ],
)
def test_what_cannot_be_recompiled_exactly_is_refused(box_module, which) -> None:
    module, path = box_module
    if which == "source edited since the import":
        path.write_text(BOX.replace("return self.n\n", "return self.n + 1\n"))
        linecache.checkcache(str(path))
        fn = module.Box.take
    elif which == "a name of ours":
        path.write_text(BOX + "\n\ndef ours(self, _traceml_value=1):\n    return 1\n")
        linecache.checkcache(str(path))
        fn = importlib.reload(module).ours
    elif which == "no source":
        namespace: dict = {}
        exec("def take(self):\n    return 1\n", namespace)
        fn = namespace["take"]
    else:
        fn = {
            "generator": module.Box.numbers,
            "decorated": module.Box.decorated,
            "keyword-only parameter": module.Box.with_keyword,
            "nested function": module.Box.nested,
            "a return inside a loop": module.Box.looping,
            "closure": module.closure_of(1),
            "bound method": module.Box().take,
        }[which]
    assert recompiled(fn, {"_traceml_log": []}, LOGGING) is None


def test_the_call_of_a_function_carries_the_same_statements(box_module) -> None:
    module, _ = box_module
    log: list = []
    box = module.Box()
    take = calling(module.Box.take, {"_traceml_log": log}, LOGGING)
    assert [take(box), take(box), take(box)] == [1, 6, 3]
    with pytest.raises(StopIteration):
        take(box)
    assert log[-2:] == [("enter", 3), ("stop",)]
    assert len(log) == 8


def test_names_of_ours_must_carry_the_prefix(box_module) -> None:
    module, _ = box_module
    with pytest.raises(ValueError, match="_traceml_"):
        calling(module.Box().take, {"log": []}, LOGGING)


def test_torchs_next_is_recompiled_in_its_own_file_and_lines() -> None:
    original = _BaseDataLoaderIter.__dict__["__next__"]
    with traceml_nb.Run("recompiled", sample=False, device="cpu"):
        ours = _BaseDataLoaderIter.__dict__["__next__"]
        assert ours is not original and ours.__wrapped__ is original
        assert ours.__code__.co_filename == original.__code__.co_filename
        assert ours.__code__.co_firstlineno == original.__code__.co_firstlineno
    assert _BaseDataLoaderIter.__dict__["__next__"] is original


class _Failing(Dataset):
    def __len__(self) -> int:
        return 16

    def __getitem__(self, i: int) -> torch.Tensor:
        if i == 9:
            raise KeyError(f"no sample {i}")
        return torch.zeros(2)


def _frames_of_a_failing_epoch() -> list[tuple[str, int | None, str, str | None]]:
    try:
        for _ in DataLoader(_Failing(), batch_size=4):
            pass
    except KeyError as exc:
        return [
            (f.filename, f.lineno, f.name, f.line) for f in traceback.extract_tb(exc.__traceback__)
        ]
    raise AssertionError("the epoch did not fail")


def test_an_error_in_a_dataset_has_the_same_traceback_with_and_without_a_run() -> None:
    plain = _frames_of_a_failing_epoch()
    with traceml_nb.Run("traceback", sample=False, device="cpu"):
        traced = _frames_of_a_failing_epoch()
    assert traced == plain
    assert not any("traceml_nb" in frame[0] for frame in traced)


def test_torchs_next_without_its_source_is_called_by_a_copy_of_ours(monkeypatch) -> None:
    from traceml_nb.instrument import recompile

    original = _BaseDataLoaderIter.__dict__["__next__"]
    monkeypatch.setattr(recompile, "_cache", {})
    monkeypatch.setattr(linecache, "getlines", lambda *_args, **_kw: [])
    with traceml_nb.Run("called", sample=False, device="cpu") as run:
        ours = _BaseDataLoaderIter.__dict__["__next__"]
        assert ours.__code__.co_filename.startswith("<traceml_nb: calls ")
        assert ours.__wrapped__ is original
        for _ in DataLoader(torch.zeros(12, 2), batch_size=4):
            pass
    assert len(run.record.loaders) == 1 and run.record.loaders[0].fetches == 3
