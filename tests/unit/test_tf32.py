"""Whether float32 runs as TF32, read from torch's settings, new or legacy (``tf32.py``): a
program that sets the new ``fp32_precision`` settings, as torch's notes now advise, gets its FLOPs
counted (the legacy getters raise then) and filed under the right peak, convolutions and
cuDNN's recurrent layers by their own settings."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

import traceml_nb
from traceml_nb.engine.instrument import flop_count, tf32
from traceml_nb.engine.instrument.tf32 import CONV, MATMUL, RNN, tf32_allowed

#: The new settings, nearest first within each chain (attribute paths under torch.backends).
SETTINGS = ("cuda.matmul", "cudnn.conv", "cudnn.rnn", "cudnn", "")
NEW_API = hasattr(torch.backends.cudnn, "rnn") and hasattr(torch.backends, "fp32_precision")


def _owner(path: str):
    owner = torch.backends
    for name in filter(None, path.split(".")):
        owner = getattr(owner, name)
    return owner


@pytest.fixture
def settings():
    """Torch's TF32 settings as they were, put back after the test (they are the process's):
    the legacy ones first (setting one sets the new ones too), then the new ones."""
    matmul, cudnn = torch.get_float32_matmul_precision(), torch.backends.cudnn.allow_tf32
    before = {path: _owner(path).fp32_precision for path in SETTINGS} if NEW_API else {}
    yield
    torch.set_float32_matmul_precision(matmul)
    torch.backends.cudnn.allow_tf32 = cudnn
    for path in ("", "cudnn", "cuda.matmul", "cudnn.conv", "cudnn.rnn"):
        if path in before:
            _owner(path).fp32_precision = before[path]


def _a100(monkeypatch):
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA A100-SXM4-40GB")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 0))
    return SimpleNamespace(dtype=torch.float32, device=torch.device("cuda", 0))


def _precisions(tensor) -> tuple[str, str, str]:
    counter = flop_count._counter()
    return (
        counter._precision(torch.ops.aten.mm, tensor),
        counter._precision(torch.ops.aten.convolution, tensor),
        counter._precision(torch.ops.aten._cudnn_rnn, tensor),
    )


def test_the_legacy_settings_decide_where_the_new_ones_say_nothing(settings, monkeypatch):
    tensor = _a100(monkeypatch)
    torch.set_float32_matmul_precision("highest")
    torch.backends.cudnn.allow_tf32 = True
    assert _precisions(tensor) == ("fp32", "tf32", "tf32")
    torch.set_float32_matmul_precision("high")
    torch.backends.cudnn.allow_tf32 = False
    assert _precisions(tensor) == ("tf32", "fp32", "fp32")


@pytest.mark.skipif(not NEW_API, reason="this torch has no fp32_precision settings")
def test_the_new_settings_decide_each_kind(settings, monkeypatch):
    tensor = _a100(monkeypatch)
    torch.backends.cuda.matmul.fp32_precision = "tf32"
    torch.backends.cudnn.conv.fp32_precision = "ieee"
    torch.backends.cudnn.rnn.fp32_precision = "tf32"
    assert _precisions(tensor) == ("tf32", "fp32", "tf32")
    torch.backends.cudnn.rnn.fp32_precision = "ieee"
    assert _precisions(tensor) == ("tf32", "fp32", "fp32")


def _backends(matmul="none", conv="none", rnn="none", cudnn="none", everything="none"):
    """A stand-in for ``torch.backends`` with these ``fp32_precision`` settings."""
    return SimpleNamespace(
        fp32_precision=everything,
        cuda=SimpleNamespace(matmul=SimpleNamespace(fp32_precision=matmul)),
        cudnn=SimpleNamespace(
            fp32_precision=cudnn,
            conv=SimpleNamespace(fp32_precision=conv),
            rnn=SimpleNamespace(fp32_precision=rnn),
            allow_tf32=False,
        ),
    )


def test_a_setting_of_none_defers_to_its_parent_and_all_none_to_the_legacy_ones(monkeypatch):
    """(A torch whose getters hand back "none" rather than the inherited value.)"""
    monkeypatch.setattr(torch, "get_float32_matmul_precision", lambda: "high")
    monkeypatch.setattr(torch, "backends", _backends(everything="tf32", cudnn="ieee"))
    assert tf32_allowed(MATMUL) is True  # from torch.backends
    assert tf32_allowed(CONV) is False and tf32_allowed(RNN) is False  # from cudnn
    monkeypatch.setattr(torch, "backends", _backends(rnn="tf32", cudnn="ieee"))
    assert tf32_allowed(RNN) is True and tf32_allowed(CONV) is False
    monkeypatch.setattr(torch, "backends", _backends())  # nothing said: the legacy settings
    assert tf32_allowed(MATMUL) is True and tf32_allowed(CONV) is False


def test_a_torch_without_the_new_settings_reads_the_legacy_ones(monkeypatch):
    monkeypatch.setattr(torch, "get_float32_matmul_precision", lambda: "highest")
    monkeypatch.setattr(torch, "backends", SimpleNamespace(cudnn=SimpleNamespace(allow_tf32=True)))
    assert tf32_allowed(MATMUL) is False and tf32_allowed(CONV) is tf32_allowed(RNN) is True

    def mixed() -> str:
        raise RuntimeError("you have used mix of the legacy and new APIs")

    monkeypatch.setattr(torch, "get_float32_matmul_precision", mixed)
    assert tf32_allowed(MATMUL) is None


def test_settings_that_cannot_be_read_leave_the_precision_unknown(monkeypatch):
    """(On a GPU without tensor cores, a T4, float32 is fp32 whatever torch says.)"""
    tensor = _a100(monkeypatch)
    monkeypatch.setattr(tf32, "tf32_allowed", lambda kind: None)
    monkeypatch.setattr(flop_count, "tf32_allowed", lambda kind: None)
    assert _precisions(tensor) == ("unknown",) * 3
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (7, 5))
    assert _precisions(tensor) == ("fp32",) * 3


@pytest.mark.skipif(not NEW_API, reason="this torch has no fp32_precision settings")
def test_a_run_that_set_the_new_settings_gets_its_flops_counted(settings, monkeypatch):
    """The FLOP counter read the legacy matmul precision, which raises once a program has set
    the new one: the count did not start ("the FLOP counter could not start")."""
    monkeypatch.setattr(flop_count, "compiled_anything", lambda: False)
    torch.backends.cuda.matmul.fp32_precision = "tf32"
    model = torch.nn.Linear(8, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    data = TensorDataset(torch.randn(64, 8), torch.randint(0, 2, (64,)))
    with traceml_nb.Run("tf32", sample=False) as run:
        for x, y in DataLoader(data, batch_size=8):
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
            opt.zero_grad()
    count = run.record.flops
    assert count is not None and count.why == "" and count.flops
