"""Real trainers on tiny models built from a config and synthetic data (nothing downloaded):
the steps counted against the trainer's own counter, the evaluation phase against the time the
trainer spent evaluating, and the advice in the trainer's own terms."""

from __future__ import annotations

import logging
import os
import time
import warnings

import pytest
import torch
from phase_checks import assert_parts_fit
from torch.utils.data import DataLoader, Dataset

import traceml_nb
from traceml_nb.engine.instrument import flop_count
from traceml_nb.session import Session
from traceml_nb.views.diagnosis_words import diagnosis_words, sentence

ITEM_SLEEP_S = 0.002  #: each item costs this much (a decode): the loops wait for data


#: What each token item costs: the tiny GPT-2's step on a batch of 4 takes ~20 ms on an idle
#: core and up to ~50 ms beside another busy process, so 4 × 8 ms of waiting keeps the wait
#: share near 40% or more, far above INPUT_BOUND_SHARE (15%), however busy the machine.
TOKEN_SLEEP_S = 0.008


class Tokens(Dataset):
    """Token ids, as a tokenized text dataset holds them; each item sleeps (a decode)."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        time.sleep(TOKEN_SLEEP_S)
        ids = torch.randint(0, 100, (16,), generator=torch.Generator().manual_seed(i))
        return {"input_ids": ids, "labels": ids}


class Pairs(Dataset):
    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        time.sleep(ITEM_SLEEP_S)
        return torch.randn(8), torch.randn(1)


def result_of(run):
    return Session().result(run)


def tiny_gpt2():
    """transformers (skipped where missing), offline and quiet, and a tiny GPT-2 from a config."""
    transformers = pytest.importorskip("transformers")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    transformers.logging.set_verbosity_error()
    config = transformers.GPT2Config(
        vocab_size=100, n_positions=32, n_embd=32, n_layer=2, n_head=2, bos_token_id=0,
        eos_token_id=0,
    )  # fmt: skip
    return transformers, transformers.GPT2LMHeadModel(config)


def test_transformers_trainer_counts_its_own_steps_and_one_evaluation_phase(tmp_path):
    transformers, model = tiny_gpt2()
    evaluations: list[float] = []

    class Timed(transformers.TrainerCallback):
        def on_evaluate(self, args, state, control, metrics=None, **kwargs):
            evaluations.append(metrics["eval_runtime"])

    args = transformers.TrainingArguments(
        output_dir=str(tmp_path), max_steps=40, per_device_train_batch_size=4,
        per_device_eval_batch_size=8, eval_strategy="steps", eval_steps=10, logging_steps=1000,
        save_strategy="no", report_to=[], use_cpu=True, disable_tqdm=True,
        dataloader_num_workers=0,
    )  # fmt: skip
    trainer = transformers.Trainer(
        model=model, args=args, train_dataset=Tokens(400), eval_dataset=Tokens(32),
        callbacks=[Timed()],
    )  # fmt: skip
    with traceml_nb.Run("hf", sample=False) as run:
        trainer.train()
    res = result_of(run)
    assert res.summary.total_steps == trainer.state.global_step == 40
    assert_parts_fit(run)
    # the evaluations after steps 10, 20 and 30 ran inside a step; the one after the last
    # step ran after it
    assert res.summary.interleaved_steps == 3
    [phase] = res.summary.phases  # the Trainer's four evaluation loaders: one phase
    assert phase.name == "eval (loaders 1\u20134)" and phase.batches == 4 * 4
    assert phase.total_s == pytest.approx(sum(evaluations), rel=0.25)
    d = res.diagnosis
    assert d.verdict == "input-bound", d.title
    assert d.advice[0].code == "change-loader" and d.advice[0].facts["driver"] == "transformers"
    advice = diagnosis_words(d).advice
    assert advice[0].startswith(
        "Change the Trainer's TrainingArguments: dataloader_num_workers=0 \u2192 "
        "dataloader_num_workers="
    )
    assert "DataLoader(" not in " ".join(advice)
    loader = {e.label: sentence(e.detail) for e in d.evidence}["DataLoader"]
    assert loader.startswith("dataloader_num_workers=0, dataloader_pin_memory=")


def test_a_trainer_accumulating_gradients_has_a_step_per_optimizer_step(tmp_path, monkeypatch):
    """The Trainer fetches every batch of a gradient-accumulation cycle, then trains on them:
    the steps are its optimizer steps (its own count), each with the cycle's forwards and
    backwards. Stepped by fetches, half the steps were a bare fetch and the others the whole
    cycle: a median step of a fetch, and FLOP/s beyond any CPU's."""
    transformers, model = tiny_gpt2()
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path), max_steps=8, per_device_train_batch_size=4,
        gradient_accumulation_steps=2, logging_steps=1000, save_strategy="no", report_to=[],
        use_cpu=True, disable_tqdm=True, dataloader_num_workers=0,
    )  # fmt: skip
    trainer = transformers.Trainer(model=model, args=args, train_dataset=Tokens(400))
    # as in a process that never compiled a model (an earlier test of the suite may have)
    monkeypatch.setattr(flop_count, "compiled_anything", lambda: False)
    with traceml_nb.Run("hf-accumulation", sample=False) as run:
        trainer.train()
    summary = result_of(run).summary
    assert summary.total_steps == trainer.state.global_step == 8
    assert summary.occasional_phases == {}  # every step has its forwards, backwards, update
    assert summary.step_ms_median > summary.forward_ms_median + summary.backward_ms_median
    assert summary.flop_window_steps == 1 and summary.achieved_tflops < 1.0  # a CPU's
    # a step's samples are its cycle's: 2 batches of 4 (the last batch alone read 4, and the
    # throughput half the Trainer's own)
    assert summary.batch_size == 8
    assert summary.samples_per_s == pytest.approx(8 * summary.steps_per_s)
    evidence = {e.label: sentence(e.detail) for e in result_of(run).diagnosis.evidence}
    assert evidence["batch size"] == (
        "8 a step (2 batches of 4 between two optimizer steps: gradient accumulation)"
    )


def test_two_trainer_trials_in_one_run_count_both_trials_steps(tmp_path):
    """A hyperparameter search by hand: a new model, Trainer and optimizer for each trial. The
    Trainer's steps are its optimizer's rows (it fetches ahead), and the second trial's
    optimizer takes the lead (only the first trial's were rows: 10 of 20)."""
    transformers, _ = tiny_gpt2()
    made = 0
    with traceml_nb.Run("hf-trials", sample=False) as run:
        for trial, lr in enumerate((1e-3, 1e-4)):
            _, model = tiny_gpt2()
            args = transformers.TrainingArguments(
                output_dir=str(tmp_path / str(trial)), max_steps=10, learning_rate=lr,
                per_device_train_batch_size=4, logging_steps=1000, save_strategy="no",
                report_to=[], use_cpu=True, disable_tqdm=True, dataloader_num_workers=0,
            )  # fmt: skip
            trainer = transformers.Trainer(model=model, args=args, train_dataset=Tokens(400))
            trainer.train()
            made += trainer.state.global_step
    assert result_of(run).summary.total_steps == made == 20


def test_lightning_counts_its_steps_times_validation_and_shows_the_sanity_check_apart():
    pl = pytest.importorskip("pytorch_lightning")
    warnings.filterwarnings("ignore", module="pytorch_lightning")
    logging.getLogger("pytorch_lightning").setLevel(logging.ERROR)
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    spent = {"val": 0.0, "sanity": 0.0}

    class Module(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(8, 1)

        def training_step(self, batch, i):
            x, y = batch
            return ((self.layer(x) - y) ** 2).mean()

        def validation_step(self, batch, i):
            x, y = batch
            time.sleep(0.01)  # validation costs something of its own
            return ((self.layer(x) - y) ** 2).mean()

        def on_validation_epoch_start(self) -> None:
            self._t0 = time.perf_counter()

        def on_validation_epoch_end(self) -> None:
            key = "sanity" if self.trainer.sanity_checking else "val"
            spent[key] += time.perf_counter() - self._t0

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

        def train_dataloader(self):
            return DataLoader(Pairs(160), batch_size=4)

        def val_dataloader(self):
            return DataLoader(Pairs(40), batch_size=4)

    trainer = pl.Trainer(
        max_epochs=2, accelerator="cpu", logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, val_check_interval=20,
        num_sanity_val_steps=2,
    )  # fmt: skip
    with traceml_nb.Run("lightning", sample=False) as run:
        trainer.fit(Module())
    res = result_of(run)
    assert res.summary.total_steps == trainer.global_step == 80
    # Lightning runs training_step and the backward in the optimizer's closure: timed apart
    unavailable = [f for f in res.summary.unavailable if f.endswith("_ms_median")]
    assert unavailable == [] and res.summary.forward_ms_median > 0
    assert res.summary.backward_ms_median > 0
    # ...and its way from the closure's start to the model is the copy's, not the update's
    # too: each timed step's parts fit in it
    assert_parts_fit(run)
    [phase] = res.summary.phases
    assert phase.before_training_batches == 2  # the sanity check, apart
    assert phase.before_training_s == pytest.approx(spent["sanity"], rel=0.5, abs=0.02)
    validation = phase.total_s - phase.before_training_s
    assert validation == pytest.approx(spent["val"], rel=0.25)
    # not the whole run: its four validations of 10 batches take about as long as the 80
    # training steps, so half the run was a coin's toss (0.758 s of 1.515 s, once in two)
    assert validation < 0.75 * res.elapsed_s
    d = res.diagnosis
    assert d.verdict == "input-bound", d.title
    assert d.advice[0].facts["driver"] == "lightning"
    assert sentence(d.advice[0]).startswith(
        "Change the DataLoader that your LightningModule's (or DataModule's) train_dataloader() "
        "returns: num_workers=0 \u2192 num_workers="
    )


def test_accelerate_prepared_loader_counts_the_loops_steps():
    accelerate = pytest.importorskip("accelerate")
    model = torch.nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    accelerator = accelerate.Accelerator(cpu=True)
    model, opt, loader = accelerator.prepare(model, opt, DataLoader(Pairs(200), batch_size=4))
    made, starts = 0, []
    with traceml_nb.Run("accelerate", sample=False) as run:
        for x, y in loader:
            starts.append(time.perf_counter())
            loss = ((model(x) - y) ** 2).mean()
            opt.zero_grad()
            accelerator.backward(loss)
            opt.step()
            made += 1
    res = result_of(run)
    assert res.summary.total_steps == made == 50
    assert_parts_fit(run)
    # each step waited for its batch's four 2 ms items (a sleep never ends early)
    assert res.summary.data_wait_ms_median >= 4 * ITEM_SLEEP_S * 1e3
    d = res.diagnosis
    assert d.verdict == "input-bound", d.title
    assert d.advice[0].facts["driver"] == "accelerate"
    assert sentence(d.advice[0]).startswith(
        "Change the DataLoader you pass to Accelerator.prepare(): num_workers=0 \u2192 "
    )


@pytest.mark.parametrize(("accumulation", "per_epoch"), [(2, 20), (4, 21), (1, 20)])
def test_accelerate_with_gradient_accumulation_and_breaks_counts_the_batches_trained(
    accumulation, per_epoch
):
    """accelerate's prepared loader fetches a batch ahead: an epoch's first row holds its
    first fetch alone, and its last batch is trained on after the exhausting fetch. An epoch
    left by a ``break`` (HF's no_trainer scripts at ``max_train_steps``, or a break out of
    each epoch) has no such batch: its first row is no step (with accumulation the steps are
    the batches; before, one step too many each epoch left so: 63 of 60)."""
    accelerate = pytest.importorskip("accelerate")
    model = torch.nn.Linear(16, 1)
    opt = torch.optim.AdamW(model.parameters())
    data = torch.utils.data.TensorDataset(torch.randn(400, 16), torch.randn(400, 1))
    accelerator = accelerate.Accelerator(cpu=True, gradient_accumulation_steps=accumulation)
    model, opt, loader = accelerator.prepare(model, opt, DataLoader(data, batch_size=8))
    made = updates = 0

    def train(x, y) -> None:
        nonlocal made, updates
        with accelerator.accumulate(model):
            accelerator.backward(((model(x) - y) ** 2).mean())
            opt.step()
            opt.zero_grad()
        made += 1
        updates += accelerator.sync_gradients

    with traceml_nb.Run("accelerate-breaks", sample=False) as run:
        for _ in range(2):  # two epochs, each left at its per_epoch-th batch
            for i, (x, y) in enumerate(loader):
                if i == per_epoch:
                    break
                train(x, y)
        for x, y in loader:  # a last epoch left at max_train_steps, after the update
            train(x, y)
            if updates == 30:
                break
    assert result_of(run).summary.total_steps == made
