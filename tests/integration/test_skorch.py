"""skorch's ``NeuralNet``, as its users write it: ``fit`` on arrays (skorch holds a fifth out
for validation) and on a torch Dataset that loads slowly. The steps are skorch's training
batches, its validation is an evaluation phase, and the advice names the arguments skorch takes
for its training DataLoader (``iterator_train__num_workers``...) and for its prediction's
(``iterator_valid__``)."""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch

skorch = pytest.importorskip("skorch")

from phase_checks import assert_parts_fit  # noqa: E402

import traceml_nb  # noqa: E402
from traceml_nb.analysis import analyze  # noqa: E402
from traceml_nb.session import Session  # noqa: E402


class Count(skorch.callbacks.Callback):
    """skorch's own count of its training and validation batches."""

    def initialize(self):
        self.train = self.valid = 0
        return self

    def on_batch_end(self, net, batch=None, training=None, **kwargs) -> None:
        if training:
            self.train += 1
        else:
            self.valid += 1


def _net(**arguments):
    torch.manual_seed(0)
    module = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
    return skorch.NeuralNetRegressor(
        module, max_epochs=3, batch_size=32, lr=0.01, verbose=0, callbacks=[Count()], **arguments
    )


def _arrays(n: int = 640):
    rng = np.random.default_rng(0)
    return rng.standard_normal((n, 16)).astype("float32"), rng.standard_normal((n, 1)).astype(
        "float32"
    )


def _count(net) -> Count:
    return next(cb for _, cb in net.callbacks_ if isinstance(cb, Count))


def test_fit_counts_skorchs_training_batches_and_its_validation_apart() -> None:
    x, y = _arrays()
    net = _net()
    session = Session()
    with traceml_nb.Run("skorch", sample=False) as run:
        net.fit(x, y)
    session.result(run)
    count = _count(net)
    summary = analyze(run.record.snapshot(), run.capabilities).summary
    assert count.train == 48 and summary.total_steps == count.train
    assert_parts_fit(run)  # skorch's closure: its way to the model is the copy's alone
    assert [p.batches for p in summary.phases] == [count.valid]
    # skorch's own Dataset of the arrays: the batches are skorch's to make, not the user's
    assert {info.driver for info in run.record.loaders} == {"skorch-arrays"}
    with pytest.raises(LookupError, match="is a DataLoader skorch made of the arrays given to fit"):
        session.tune()


def test_a_slow_dataset_is_advised_in_the_arguments_skorch_takes() -> None:
    x, y = _arrays()

    class Slow(torch.utils.data.Dataset):
        def __len__(self) -> int:
            return len(x)

        def __getitem__(self, i: int):
            time.sleep(0.0005)
            return x[i], y[i]

    net = _net(train_split=None)
    dataset = Slow()
    with traceml_nb.Run("skorch", sample=False) as run:
        net.fit(dataset, None)
    assert run.record.optimizer_steps == _count(net).train == 60
    session = Session()
    session.result(run)
    text = str(run.result())
    assert (
        "Change the arguments of your skorch NeuralNet: iterator_train__num_workers=0 → "
        "iterator_train__num_workers="
    ) in text
    assert "DataLoader: iterator_train__num_workers=0, iterator_train__pin_memory=False" in text
    assert {info.driver for info in run.record.loaders} == {"skorch"}  # the user's dataset
    # skorch's loader is gone after fit: tuned on one of the user's, pasted where skorch takes it
    loader = torch.utils.data.DataLoader(dataset, batch_size=32)
    tuned = session.tune(loader=loader, workers=[0, 2], budget_s=10, batches=8)
    # skorch builds its DataLoaders anew each epoch (``get_iterator``): no workers to keep
    assert net.get_iterator(dataset, training=True) is not net.get_iterator(dataset, training=True)
    assert "persistent_workers" not in text
    assert tuned.paste == "NeuralNet(\u2026, iterator_train__num_workers=2)"
    # a prediction's loader is set with iterator_valid__
    with traceml_nb.Run("skorch-predict", sample=False) as predicting:
        net.predict(dataset)
    session.result(predicting)
    text = str(predicting.result())
    assert (
        "Change the arguments of your skorch NeuralNet: iterator_valid__num_workers=0 → "
        "iterator_valid__num_workers="
    ) in text and "iterator_train__" not in text
    tuned = session.tune(loader=loader, workers=[0, 2], budget_s=10, batches=8)
    assert tuned.paste == "NeuralNet(\u2026, iterator_valid__num_workers=2)"
