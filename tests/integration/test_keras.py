"""Keras 3 on its torch backend, as its users write it: ``model.fit`` on arrays, with a validation
split, on a ``keras.utils.PyDataset``, on a torch DataLoader. Keras' optimizers are no
``torch.optim.Optimizer`` and it makes its own DataLoaders (a new one each epoch): the steps are
Keras' own count, its updates are the optimizer's phase, the FLOPs are counted, its validation
is one evaluation phase, and the advice speaks of what the user gave ``model.fit``."""

from __future__ import annotations

import os
import time

import numpy as np
import pytest

os.environ.setdefault("KERAS_BACKEND", "torch")
keras = pytest.importorskip("keras")
if keras.backend.backend() != "torch":
    pytest.skip("Keras runs on another backend here", allow_module_level=True)

from phase_checks import assert_parts_fit  # noqa: E402

import traceml_nb  # noqa: E402
from traceml_nb.analysis import analyze  # noqa: E402
from traceml_nb.analysis.input_bound import CAUSE_KERAS_PYDATASET  # noqa: E402

#: Keras' own warning on each batch of numpy arrays it converts (numpy 2's ``copy`` keyword)
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

#: FLOPs of a step of Dense 16 -> 256 -> 1 at a batch of 32: 2 per multiply-add, forward and
#: the weights' gradients of both layers, the hidden layer's input gradient (the inputs' is not
#: computed)
DENSE_FLOPS = 2 * 32 * (16 * 256 + 256) * 2 + 2 * 32 * 256


class Count(keras.callbacks.Callback):
    """Keras' own count of the batches it trained on and evaluated."""

    def __init__(self) -> None:
        super().__init__()
        self.train = self.test = 0

    def on_train_batch_end(self, batch, logs=None) -> None:
        self.train += 1

    def on_test_batch_end(self, batch, logs=None) -> None:
        self.test += 1


def _dense():
    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [keras.Input((16,)), keras.layers.Dense(256, activation="relu"), keras.layers.Dense(1)]
    )
    model.compile(optimizer="adam", loss="mse")
    return model


def _arrays(n: int = 1000):
    rng = np.random.default_rng(0)
    return rng.standard_normal((n, 16)).astype("float32"), rng.standard_normal((n, 1)).astype(
        "float32"
    )


def test_fit_on_arrays_counts_keras_steps_its_updates_and_flops() -> None:
    from keras.src.optimizers.base_optimizer import BaseOptimizer

    apply = BaseOptimizer.__dict__["apply"]
    x, y = _arrays()
    model, count = _dense(), Count()
    with traceml_nb.Run("keras", sample=False) as run:
        model.fit(x, y, batch_size=32, epochs=3, validation_split=0.2, verbose=0, callbacks=[count])
    assert BaseOptimizer.__dict__["apply"] is apply  # put back
    summary = analyze(run.record.snapshot(), run.capabilities).summary
    assert count.train == 75 and summary.total_steps == count.train
    assert run.record.optimizer_steps == count.train
    assert summary.flops_per_step == DENSE_FLOPS
    assert summary.optimizer_ms_median is not None and summary.optimizer_ms_median > 0
    assert_parts_fit(run)
    validation = [p for p in summary.phases if p.batches == count.test]
    assert len(validation) == 1 and validation[0].name.startswith("eval (loaders ")
    assert {info.driver for info in run.record.loaders} == {"keras"}


def test_a_slow_pydataset_is_advised_in_its_own_arguments() -> None:
    """A ``PyDataset`` that sleeps for each batch: input-bound, and the advice names the
    PyDataset's arguments, none of the DataLoader Keras wraps it in; each step's wait is its
    own (Keras never exhausts an epoch's iterator: its last step, left open, no longer takes
    the next epochs' waits: a data wait of 105% of the steps' time)."""
    x, y = _arrays(640)

    class Slow(keras.utils.PyDataset):
        def __len__(self) -> int:
            return 20

        def __getitem__(self, i: int):
            time.sleep(0.01)
            return x[i * 32 : (i + 1) * 32], y[i * 32 : (i + 1) * 32]

    model, count = _dense(), Count()
    with traceml_nb.Run("keras", sample=False) as run:
        model.fit(Slow(), epochs=3, verbose=0, callbacks=[count])
    analysis = analyze(run.record.snapshot(), run.capabilities)
    summary, diagnosis = analysis.summary, analysis.diagnosis
    assert summary.total_steps == count.train == 60
    assert summary.data_wait_share is not None and summary.data_wait_share <= 1.0
    assert diagnosis.verdict == "input-bound" and diagnosis.cause == CAUSE_KERAS_PYDATASET
    text = str(run.result())
    assert "Give your keras.utils.PyDataset workers=" in text and "use_multiprocessing=True" in text
    assert "num_workers=0 →" not in text and "%traceml tune" not in text
    assert "DataLoader: none of its settings are yours" in text


def test_a_dataloader_given_to_fit_is_advised_where_it_is_made() -> None:
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    from traceml_nb.views.diagnosis_words import WHERE

    x, y = _arrays(640)

    class Slow(TensorDataset):
        def __getitem__(self, i: int):
            time.sleep(0.0005)
            return super().__getitem__(i)

    loader = DataLoader(Slow(torch.from_numpy(x), torch.from_numpy(y)), batch_size=32)
    model, count = _dense(), Count()
    with traceml_nb.Run("keras", sample=False) as run:
        model.fit(loader, epochs=2, verbose=0, callbacks=[count])
    assert {info.driver for info in run.record.loaders} == {"keras-fit"}
    assert run.record.optimizer_steps == count.train == 40
    # the batch Keras builds its model with, before training, is no step (it read 41)
    assert analyze(run.record.snapshot(), run.capabilities).summary.total_steps == 40
    assert f"{WHERE['keras-fit']}: num_workers=0 → num_workers=" in str(run.result())
