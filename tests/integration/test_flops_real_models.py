"""The anatomy of a step on real models, on CPU: a ResNet-18 (torch.nn only: torchvision's
layout and parameter count, small inputs) in a plain loop and a tiny BERT built from a config in
the transformers ``Trainer``. Each has its phases, and its FLOPs per step equal FlopCounterMode
run by hand on one step of the same shape; the BERT's are the analytic 6·N·tokens as well, and
with gradient checkpointing on, the same, the recomputed forwards apart; with batches padded to
their longest sentence, the steps' mean."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, Dataset, TensorDataset
from torch.utils.flop_counter import FlopCounterMode

import traceml_nb
from traceml_nb.analysis import analyze
from traceml_nb.analysis.summary import measure
from traceml_nb.engine.instrument import flop_count
from traceml_nb.selfcheck.overhead import resnet18_like

#: The BERT's sequence length and width: attention's own FLOPs (score and mix, s/(6·d) of the
#: weights' per layer) stay ~2% of 6·N·tokens, well inside the check's 10%.
SEQ, HIDDEN = 16, 128


@pytest.fixture(autouse=True)
def nothing_compiled(monkeypatch) -> None:
    """As in a process that never compiled a model (another test of the suite may have)."""
    monkeypatch.setattr(flop_count, "compiled_anything", lambda: False)


def summary_of(run):
    return analyze(run.record.snapshot(), run.capabilities).summary


def assert_phases(summary) -> None:
    for part in ("forward", "backward", "optimizer"):
        value = getattr(summary, f"{part}_ms_median")
        assert value is not None and value > 0, (part, summary.unavailable)


def test_a_resnet18_in_a_plain_loop() -> None:
    torch.manual_seed(0)
    model = resnet18_like(torch, num_classes=10)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    data = TensorDataset(torch.randn(40, 3, 32, 32), torch.randint(0, 10, (40,)))

    def step(x, y) -> None:
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        opt.zero_grad()

    with traceml_nb.Run("resnet18", sample=False) as run:
        for x, y in DataLoader(data, batch_size=4):
            step(x, y)
    x, y = next(iter(DataLoader(data, batch_size=4)))
    with FlopCounterMode(display=False) as by_hand:
        step(x, y)
    count = run.record.flops
    assert count is not None and count.why == "", count
    assert count.uncounted_ops == ()  # nothing of another library's
    assert count.flops == pytest.approx(by_hand.get_total_flops(), rel=0.05)
    summary = summary_of(run)
    assert summary.flops_per_step == count.flops
    assert_phases(summary)
    assert summary.conv_share is not None and summary.conv_share > 0.9  # a conv net


class Tokens(Dataset):
    def __len__(self) -> int:
        return 64

    def __getitem__(self, i: int):
        ids = torch.randint(0, 1000, (SEQ,), generator=torch.Generator().manual_seed(i))
        return {
            "input_ids": ids,
            "attention_mask": torch.ones(SEQ, dtype=torch.long),
            "labels": i % 2,
        }


@pytest.fixture
def fresh_accelerate():
    """The Trainer initialises accelerate's process-wide state; cleared after the test, as a new
    kernel would have it (``notebook_launcher`` refuses to start ranks in a process that holds
    it: tests/integration/test_ranks.py runs later in the same process)."""
    yield
    from accelerate.state import AcceleratorState, GradientState

    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()


def _tiny_bert(transformers):
    torch.manual_seed(0)
    config = transformers.BertConfig(
        vocab_size=1000, hidden_size=HIDDEN, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=4 * HIDDEN, max_position_embeddings=SEQ, num_labels=2,
    )  # fmt: skip
    return transformers.BertForSequenceClassification(config)


def _train_in_the_trainer(transformers, model, tmp_path, batch: int, **arguments):
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path), max_steps=6, per_device_train_batch_size=batch,
        logging_steps=1000, save_strategy="no", report_to=[], use_cpu=True, disable_tqdm=True,
        dataloader_num_workers=0, **arguments,
    )  # fmt: skip
    trainer = transformers.Trainer(model=model, args=args, train_dataset=Tokens())
    with traceml_nb.Run("bert", sample=False) as run:
        trainer.train()
    return run


def test_a_tiny_bert_in_the_transformers_trainer(tmp_path, fresh_accelerate) -> None:
    transformers = pytest.importorskip("transformers")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    transformers.logging.set_verbosity_error()
    model = _tiny_bert(transformers)
    batch = 8
    run = _train_in_the_trainer(transformers, model, tmp_path, batch)
    count = run.record.flops
    assert count is not None and count.why == "", count
    assert count.recomputed_flops == count.outside_flops == 0 and count.uncounted_ops == ()

    one = {
        "input_ids": torch.stack([Tokens()[i]["input_ids"] for i in range(batch)]),
        "attention_mask": torch.ones(batch, SEQ, dtype=torch.long),
        "labels": torch.zeros(batch, dtype=torch.long),
    }
    opt = torch.optim.AdamW(model.parameters())
    model.train()
    with FlopCounterMode(display=False) as by_hand:
        model(**one).loss.backward()
        opt.step()
    assert count.flops == pytest.approx(by_hand.get_total_flops(), rel=0.05)

    embeddings = sum(p.numel() for p in model.bert.embeddings.parameters())
    weights = sum(p.numel() for p in model.parameters()) - embeddings  # looked up, not multiplied
    assert count.flops == pytest.approx(6 * weights * batch * SEQ, rel=0.10)
    summary = summary_of(run)
    assert summary.flops_per_step == count.flops
    assert_phases(summary)


def test_gradient_checkpointing_in_the_trainer_keeps_the_models_flops(
    tmp_path, fresh_accelerate
) -> None:
    """``gradient_checkpointing=True`` recomputes each layer's forward in the backward: the
    count keeps the model's FLOPs, those of the same BERT without it, and the recomputed ones
    apart (the encoder's layers once more: a third of the model's at most)."""
    transformers = pytest.importorskip("transformers")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    transformers.logging.set_verbosity_error()
    plain = _train_in_the_trainer(transformers, _tiny_bert(transformers), tmp_path / "plain", 8)
    run = _train_in_the_trainer(
        transformers, _tiny_bert(transformers), tmp_path / "checkpointed", 8,
        gradient_checkpointing=True,
    )  # fmt: skip
    model, checkpointed = plain.record.flops, run.record.flops
    assert model is not None and checkpointed is not None and checkpointed.why == ""
    assert checkpointed.flops == model.flops
    assert 0.1 * model.flops < checkpointed.recomputed_flops <= model.flops / 3


def _word_tokenizer(transformers):
    """A tokenizer made here (no hub): words of a 1,000-word vocabulary, [PAD] 0."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"[PAD]": 0, "[UNK]": 1, **{f"w{i}": i for i in range(2, 1000)}}
    words = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    words.pre_tokenizer = pre_tokenizers.Whitespace()
    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=words, pad_token="[PAD]", unk_token="[UNK]"
    )


def test_dynamic_padding_in_the_trainer_is_the_steps_mean(tmp_path, fresh_accelerate) -> None:
    """``DataCollatorWithPadding`` pads each batch to its longest sentence: the FLOPs per step
    are the steps' mean (FlopCounterMode by hand on a batch of each step's length, within 3%:
    attention and the classifier's head are not in proportion to the tokens), not the one
    counted batch's."""
    transformers = pytest.importorskip("transformers")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    transformers.logging.set_verbosity_error()
    tokenizer = _word_tokenizer(transformers)
    generator = torch.Generator().manual_seed(5)
    lengths = torch.randint(2, SEQ + 1, (96,), generator=generator).tolist()
    texts = [" ".join(f"w{2 + (7 * i + j) % 998}" for j in range(n)) for i, n in enumerate(lengths)]
    data = [{**tokenizer(text), "labels": i % 2} for i, text in enumerate(texts)]
    model = _tiny_bert(transformers)
    batch = 4
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path), max_steps=24, per_device_train_batch_size=batch,
        logging_steps=1000, save_strategy="no", report_to=[], use_cpu=True, disable_tqdm=True,
        dataloader_num_workers=0,
    )  # fmt: skip
    collator = transformers.DataCollatorWithPadding(tokenizer)
    trainer = transformers.Trainer(
        model=model, args=args, train_dataset=data, data_collator=collator
    )
    with traceml_nb.Run("padded", sample=False) as run:
        trainer.train()
    snapshot = run.record.snapshot()
    summary = analyze(snapshot, run.capabilities).summary
    m = measure(snapshot, run.capabilities)
    padded = m.selection.elements[m.steady_index] // batch  # each step's length
    assert len(padded) >= 16 and len(set(padded.tolist())) > 1
    assert summary.flop_input_elements is not None

    opt = torch.optim.AdamW(model.parameters())
    by_length = {}
    for length in set(padded.tolist()):
        one = collator([{**tokenizer(" ".join(["w5"] * length)), "labels": 0}] * batch)
        with FlopCounterMode(display=False) as by_hand:
            model(**one).loss.backward()
            opt.step()
        by_length[length] = by_hand.get_total_flops()
    truth = float(np.mean([by_length[n] for n in padded.tolist()]))
    assert summary.flops_per_step == pytest.approx(truth, rel=0.03)
    assert run.record.flops is not None
    assert run.record.flops.flops != pytest.approx(truth, rel=0.03)  # as counted: one batch's
