"""What the FLOP count keeps out of the model's FLOPs (each forward and backward once, as MFU
counts them), and says beside them: the forwards activation checkpointing recomputes in the
backward (reentrant and non-reentrant), and an optimizer's own matrix work (autograd off,
outside every module call and the autograd engine: Muon); an LBFGS closure's forward and
backward stay the model's; an operator without a formula outside the model is the optimizer's
to name, not a gap in the model's count."""

from __future__ import annotations

import gc
from dataclasses import replace

import pytest
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint
from torch.utils.data import DataLoader, TensorDataset

import traceml_nb
from traceml_nb.analysis import analyze
from traceml_nb.engine.instrument import flop_count, recompute, step_phases
from traceml_nb.engine.instrument.flop_count import _counter
from traceml_nb.engine.instrument.model_sizes import ModelSizes
from traceml_nb.views.text import _flops, metric_lines

WIDTH, HIDDEN, BATCH = 32, 128, 16


class Blocks(nn.Module):
    """Four residual MLP blocks, the last three checkpointed by ``reentrant`` (None: none)."""

    def __init__(self, reentrant: bool | None) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.blocks = nn.ModuleList(
            nn.Sequential(nn.Linear(WIDTH, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, WIDTH))
            for _ in range(4)
        )
        self.head = nn.Linear(WIDTH, 2)
        self.reentrant = reentrant

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for i, block in enumerate(self.blocks):
            if i and self.reentrant is not None:
                x = x + checkpoint(block, x, use_reentrant=self.reentrant)
            else:
                x = x + block(x)
        return self.head(x)


def _train(model: Blocks, steps: int = 8):
    opt = torch.optim.Adam(model.parameters())
    data = TensorDataset(torch.randn(steps * BATCH, WIDTH), torch.randint(0, 2, (steps * BATCH,)))

    def step(x, y) -> None:
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        opt.zero_grad()

    for x, y in DataLoader(data, batch_size=BATCH):
        step(x, y)
    return step, x, y


def _flops_line(run, result) -> str:
    """The report's "FLOPs per step" line."""
    lines = metric_lines(result.summary, run.capabilities)
    return next(line.text for line in lines if line.label == "FLOPs per step")


def _by_hand(reentrant: bool | None) -> tuple[int, int]:
    """(the model's FLOPs, the recomputed ones) of one step, counted by hand."""
    step, x, y = _train(Blocks(reentrant), steps=1)
    counter = _counter()
    with counter:
        step(x, y)
    return counter.get_total_flops() - counter.recomputed, counter.recomputed


@pytest.mark.parametrize("reentrant", [False, True])
def test_the_recomputed_forwards_are_counted_apart_from_the_models_flops(
    monkeypatch, reentrant
) -> None:
    monkeypatch.setattr(flop_count, "compiled_anything", lambda: False)
    plain, none_recomputed = _by_hand(None)
    model, recomputed = _by_hand(reentrant)
    assert none_recomputed == 0 and model == plain
    forward_of_three_blocks = 3 * 2 * (2 * BATCH * WIDTH * HIDDEN)
    if reentrant:  # the whole of each checkpointed block again
        assert recomputed == forward_of_three_blocks
    else:  # up to what the backward needs: each block's first product
        assert recomputed == forward_of_three_blocks // 2
    with traceml_nb.Run("checkpointed", sample=False) as run:
        _train(Blocks(reentrant))
    count = run.record.flops
    assert count is not None and count.why == ""
    assert (count.flops, count.recomputed_flops) == (model, recomputed)
    result = analyze(run.record.snapshot(), run.capabilities)
    assert result.summary.flops_per_step == model
    assert result.summary.recomputed_flops_per_step == recomputed
    amount = "786 kFLOP" if reentrant else "393 kFLOP"  # per step, as the report rounds it
    assert _flops_line(run, result) == (
        f"{model / 1e6:.3g} MFLOP (counted on one step; {amount} more recomputed by "
        "activation checkpointing, not counted as the model's)"
    )


def test_without_checkpointing_nothing_is_recomputed_and_the_report_says_nothing(
    monkeypatch,
) -> None:
    monkeypatch.setattr(flop_count, "compiled_anything", lambda: False)
    with traceml_nb.Run("plain", sample=False) as run:
        _train(Blocks(None))
    assert run.record.flops is not None and run.record.flops.recomputed_flops == 0
    result = analyze(run.record.snapshot(), run.capabilities)
    assert result.summary.recomputed_flops_per_step == 0
    assert _flops_line(run, result).endswith("(counted on one step)")


def test_a_torch_that_tells_nothing_counts_the_recomputed_forwards_as_the_models(
    monkeypatch,
) -> None:
    """Where torch's internals are named otherwise, the recomputation is not told apart: the
    count is the work done, as before (never less than the model's)."""

    def absent(*args):
        raise AttributeError("no such function in this torch")

    monkeypatch.setattr(torch._C, "_current_autograd_node", absent)
    assert recompute.recomputing() is False
    model, recomputed = _by_hand(True)
    monkeypatch.undo()
    told_model, told_recomputed = _by_hand(True)
    assert recomputed == 0 and model == told_model + told_recomputed


class _DirectedSGD(torch.optim.Optimizer):
    """SGD that steps each parameter along :meth:`direction` of its gradient (None: not at
    all), with autograd off, as an optimizer's step runs."""

    def __init__(self, params) -> None:
        super().__init__(params, {"lr": 0.01})

    def direction(self, grad: torch.Tensor) -> torch.Tensor | None:
        raise NotImplementedError

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            for p in group["params"]:
                g = None if p.grad is None else self.direction(p.grad)
                if g is not None:
                    p.add_(g, alpha=-group["lr"])


class MatrixStep(_DirectedSGD):
    """SGD whose step first multiplies each weight matrix by its own transpose (a stand-in for
    Muon's orthogonalisation, which this torch may not have)."""

    def direction(self, grad: torch.Tensor) -> torch.Tensor:
        return grad @ (grad.T @ grad) if grad.dim() == 2 else grad


def _outside_count(make_optimizer) -> tuple[int, int, int]:
    """(the run's model FLOPs, its FLOPs outside the model, the model's by hand with SGD)."""
    with traceml_nb.Run("optimizer", sample=False) as run:
        model = Blocks(None)
        opt = make_optimizer(model)
        data = TensorDataset(torch.randn(8 * BATCH, WIDTH), torch.randint(0, 2, (8 * BATCH,)))
        for x, y in DataLoader(data, batch_size=BATCH):
            nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
            opt.zero_grad()
    plain, _ = _by_hand(None)
    count = run.record.flops
    assert count is not None and count.why == ""
    return count.flops, count.outside_flops, plain


@pytest.mark.parametrize("name", ["matrix step", "Muon"])
def test_an_optimizers_own_matrix_work_is_counted_apart(monkeypatch, name) -> None:
    """Work done with autograd off, outside every module call and the autograd engine (the
    optimizer's step) is not the model's: MFU counts the forwards and backwards."""
    monkeypatch.setattr(flop_count, "compiled_anything", lambda: False)
    if name == "Muon" and not hasattr(torch.optim, "Muon"):
        pytest.skip("this torch has no Muon")

    def make(model):
        if name == "matrix step":
            return MatrixStep(model.parameters())
        return torch.optim.Muon([p for p in model.parameters() if p.dim() == 2])

    flops, outside, plain = _outside_count(make)
    assert flops == plain
    if name == "matrix step":  # a gradient g (out x in): g.T @ g, then g @ that
        weights = [(HIDDEN, WIDTH), (WIDTH, HIDDEN)] * 4 + [(2, WIDTH)]
        assert outside == sum(2 * i * o * i + 2 * o * i * i for o, i in weights)
    else:  # five Newton-Schulz iterations of three products for each weight matrix
        assert outside > 5 * flops


def test_an_lbfgs_closure_is_the_models_work_and_adam_does_none_outside(monkeypatch) -> None:
    """LBFGS runs the forward and backward inside its step (autograd on again in the closure):
    the model's; its own dot products over the flat gradients are counted apart. Adam's step is
    elementwise: nothing counted outside."""
    monkeypatch.setattr(flop_count, "compiled_anything", lambda: False)
    flops, outside, plain = _outside_count(lambda model: torch.optim.Adam(model.parameters()))
    assert (flops, outside) == (plain, 0)
    with traceml_nb.Run("lbfgs", sample=False) as run:
        model = Blocks(None)
        opt = torch.optim.LBFGS(model.parameters(), max_iter=3)
        data = TensorDataset(torch.randn(8 * BATCH, WIDTH), torch.randint(0, 2, (8 * BATCH,)))
        for x, y in DataLoader(data, batch_size=BATCH):

            def closure(x=x, y=y):
                opt.zero_grad()
                loss = nn.functional.cross_entropy(model(x), y)
                loss.backward()
                return loss

            opt.step(closure)
    count = run.record.flops
    assert count is not None and count.why == ""
    assert count.flops >= 3 * plain  # a closure call per iteration, each a step's work
    params = sum(p.numel() for p in model.parameters())
    assert 2 * params <= count.outside_flops < count.flops / 4  # (at least one dot product)


@torch.library.custom_op("tracemltest::project", mutates_args=())
def project(x: torch.Tensor, basis: torch.Tensor) -> torch.Tensor:
    """Another library's operator: a matrix product the counter cannot see into."""
    return x @ basis


@project.register_fake
def _(x: torch.Tensor, basis: torch.Tensor) -> torch.Tensor:
    return x.new_empty(x.shape[0], basis.shape[1])


def test_operators_of_other_libraries_are_named_and_the_figures_read_as_lower_bounds(
    monkeypatch,
) -> None:
    """A custom operator (as ``xformers::efficient_attention_forward_cutlass``) counts nothing:
    the count names it, and the report reads the FLOPs and FLOP/s as lower bounds. The
    profiler's marks (``record_function``, every optimizer step's) and torch's own operators
    without a formula's kind of work are not named."""
    monkeypatch.setattr(flop_count, "compiled_anything", lambda: False)
    basis = torch.randn(WIDTH, WIDTH)
    blocks = Blocks(None)

    class Projected(nn.Module):  # the operator inside the model's forward, as attention is
        def __init__(self) -> None:
            super().__init__()
            self.blocks = blocks

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            with torch.profiler.record_function("features"):
                features = project(x, basis)
            return self.blocks(features)

    model = Projected()
    opt = torch.optim.Adam(model.parameters())
    data = TensorDataset(torch.randn(8 * BATCH, WIDTH), torch.randint(0, 2, (8 * BATCH,)))
    with traceml_nb.Run("custom", sample=False) as run:
        for x, y in DataLoader(data, batch_size=BATCH):
            nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
            opt.zero_grad()
    count = run.record.flops
    assert count is not None and count.why == ""
    assert count.uncounted_ops == ("tracemltest::project",)
    assert count.flops == _by_hand(None)[0]  # the blocks', without the projection's
    result = analyze(run.record.snapshot(), run.capabilities)
    assert result.summary.uncounted_ops == ["tracemltest::project"]
    line = _flops_line(run, result)
    assert line.startswith("at least ") and line.endswith(
        "without whatever FLOPs these operators did, which the counter has no formula for: "
        "tracemltest::project)"
    )
    rate = next(
        m.text for m in metric_lines(result.summary, run.capabilities)
        if m.label == "achieved FLOP/s"
    )  # fmt: skip
    assert rate.startswith("at least ")


class EigenStep(_DirectedSGD):
    """SGD preconditioned by the eigenvectors of each weight gradient's Gram matrix, as Shampoo
    and SOAP precondition: an eigendecomposition (no formula) and matrix products; the biases
    stay as they are."""

    def direction(self, grad: torch.Tensor) -> torch.Tensor | None:
        if grad.dim() != 2:
            return None
        _, vectors = torch.linalg.eigh(grad.T @ grad)
        return grad @ vectors @ vectors.T


class SpectralHead(nn.Module):
    """The blocks, then a Fourier transform of their features (as a Fourier neural operator's
    layer): an FFT in the model's own work."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = Blocks(None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.fft.rfft(self.blocks(x), n=4).abs()[:, :2]


@pytest.mark.parametrize("where", ["optimizer", "model"])
def test_operators_without_a_formula_outside_the_model_leave_its_count_whole(
    monkeypatch, where
) -> None:
    """An optimizer's eigendecomposition is named with the optimizer's work, and the model's
    FLOPs, FLOP/s and MFU stay whole (no "at least"); an FFT in the model's forward makes them
    lower bounds."""
    monkeypatch.setattr(flop_count, "compiled_anything", lambda: False)
    model = SpectralHead() if where == "model" else Blocks(None)
    opt = (
        EigenStep(model.parameters())
        if where == "optimizer"
        else torch.optim.SGD(model.parameters(), lr=0.01)
    )
    data = TensorDataset(torch.randn(8 * BATCH, WIDTH), torch.randint(0, 2, (8 * BATCH,)))
    with traceml_nb.Run("eigen", sample=False) as run:
        for x, y in DataLoader(data, batch_size=BATCH):
            nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
            opt.zero_grad()
    count = run.record.flops
    assert count is not None and count.why == ""
    summary = analyze(run.record.snapshot(), run.capabilities).summary
    line = _flops(summary, summary.flops_per_step)
    if where == "optimizer":
        assert count.uncounted_ops == () and count.flops == _by_hand(None)[0]
        assert count.uncounted_outside_ops == ("aten::_linalg_eigh",) and count.outside_flops > 0
        assert not line.startswith("at least ")
        assert "; at least " in line and line.endswith(
            "more outside the model (an optimizer's own work, the batch's preparation; without "
            "whatever "
            "FLOPs there of operators the counter has no formula for: aten::_linalg_eigh), not "
            "counted as the model's)"
        )
        alone = replace(summary, outside_flops_per_step=0.0)  # the eigendecomposition alone
        assert _flops(alone, summary.flops_per_step).endswith(
            "; more work outside the model (an optimizer's own work, the batch's preparation, by "
            "operators the counter has no formula for: aten::_linalg_eigh), not counted as the "
            "model's)"
        )
    else:
        assert count.uncounted_ops == ("aten::_fft_r2c", "aten::_fft_c2c")  # its backward too
        assert count.uncounted_outside_ops == ()
        assert line.startswith("at least ") and "outside the model" not in line


@pytest.mark.parametrize("widths", [(16, 64, 256), (64, 64, 64)])
def test_a_model_of_another_size_later_in_the_run_makes_the_flops_unavailable(
    monkeypatch, widths
) -> None:
    """A sweep over model sizes in one cell, a new model and optimizer for each: the FLOPs
    counted on the first model's step are not the run's (they read 4× too few a step, and the
    achieved FLOP/s with them), so they are unavailable, with why; the same model made again
    for each fold of a cross-validation keeps its count."""
    monkeypatch.setattr(flop_count, "compiled_anything", lambda: False)
    monkeypatch.setattr(step_phases, "SAMPLE_INTERVAL_S", 0.0)
    x, y = torch.randn(8, 16), torch.randn(8, 1)
    with traceml_nb.Run("sweep", sample=False) as run:
        for width in widths:
            model = torch.nn.Sequential(
                torch.nn.Linear(16, width), torch.nn.ReLU(), torch.nn.Linear(width, 1)
            )
            opt = torch.optim.SGD(model.parameters(), lr=0.01)
            for _ in range(20):
                torch.nn.functional.mse_loss(model(x), y).backward()
                opt.step()
                opt.zero_grad()
    summary = analyze(run.record.snapshot(), run.capabilities).summary
    if len(set(widths)) == 1:
        # 2·8·16·64 + 2·8·64 forward; as much again for the weights' gradients, and the
        # second layer's input gradient (2·8·64)
        assert summary.flops_per_step == 2 * (2 * 8 * 16 * 64 + 2 * 8 * 64) + 2 * 8 * 64
        assert summary.total_steps == 60  # (the later folds' optimizers take the lead)
        return
    assert summary.flops_per_step is None
    assert summary.unavailable["flops_per_step"] == (
        "the model changed during the run (its parameters 289 → 1,153: a new model, as a "
        "sweep over model sizes in one cell makes): the FLOPs counted on one step are not "
        "every step's"
    )


def test_a_model_found_only_by_a_later_search_changed_nothing() -> None:
    """The searches for the models, as :class:`ModelSizes` hears of them: a GAN's generator
    found by the second search beside the discriminator found by the first is no change, nor
    is a model found by a search after one that found none; a model of another size found
    alone is one, and the first change is the one told."""
    small, big, other = nn.Linear(2, 2), nn.Linear(8, 8), nn.Linear(4, 4)
    sizes = ModelSizes()
    sizes.settled(again=False)  # the first search found nothing
    sizes.found(small)
    sizes.settled(again=True)
    assert sizes.changed is None
    sizes.found(small)
    sizes.found(other)  # beside a model found before: a GAN's second model
    sizes.settled(again=True)
    assert sizes.changed is None
    sizes.found(big)  # alone, another size: a sweep's next trial
    sizes.settled(again=True)
    sizes.found(small)
    sizes.settled(again=True)
    assert sizes.changed == (6 + 20, 72)


def test_a_model_made_where_a_freed_one_was_is_a_new_model() -> None:
    """A trial run in a function of its own frees its model at the return, and the next
    trial's may take its ``id()``: told by identity, not by id, it is a new model."""
    sizes = ModelSizes()
    first = nn.Linear(8, 8)
    sizes.found(first)
    sizes.settled(again=False)
    other = nn.Linear(2, 2)
    sizes._seen[id(other)] = sizes._seen.pop(id(first))  # as if made where the first was
    del first
    gc.collect()
    sizes.found(other)
    sizes.settled(again=True)
    assert sizes.changed == (72, 6)


@pytest.mark.parametrize("model_kind", ["module", "plain tensors", "plain first layer"])
def test_the_batchs_preparation_before_the_forward_is_not_the_models(monkeypatch, model_kind):
    """A batch warped before the model (fastai's batch transforms, an augmentation on the GPU:
    a matrix product here, with autograd on) is counted apart as work outside the model where
    the model is a module; a model of plain tensors has no call to tell its forward by, and
    all its step's work stays its own; a first layer of plain parameters before a module is
    the model's (its inputs need a gradient)."""
    monkeypatch.setattr(flop_count, "compiled_anything", lambda: False)
    torch.manual_seed(0)
    warp = torch.randn(WIDTH, WIDTH)
    layer = nn.Linear(WIDTH, 2, bias=False)
    weight = layer.weight.detach().clone().requires_grad_(True)
    first = torch.randn(WIDTH, WIDTH, requires_grad=True)
    params = {
        "module": list(layer.parameters()),
        "plain tensors": [weight],
        "plain first layer": [first, *layer.parameters()],
    }[model_kind]
    opt = torch.optim.SGD(params, lr=0.01)
    data = TensorDataset(torch.randn(8 * BATCH, WIDTH), torch.randint(0, 2, (8 * BATCH,)))
    with traceml_nb.Run("prepared", sample=False) as run:
        for x, y in DataLoader(data, batch_size=BATCH):
            x = x @ warp  # the batch's preparation: 2·BATCH·WIDTH·WIDTH
            if model_kind == "plain tensors":
                out = x @ weight.T
            elif model_kind == "plain first layer":
                out = layer(x @ first)
            else:
                out = layer(x)
            nn.functional.cross_entropy(out, y).backward()
            opt.step()
            opt.zero_grad()
    count = run.record.flops
    assert count is not None and count.why == ""
    model = 2 * BATCH * WIDTH * 2 * 2  # its forward, and its weight's gradient
    prepared = 2 * BATCH * WIDTH * WIDTH
    if model_kind == "module":
        assert (count.flops, count.outside_flops) == (model, prepared)
    elif model_kind == "plain tensors":
        assert (count.flops, count.outside_flops) == (model + prepared, 0)
    else:  # the first layer's forward, its weight's gradient and its output's for the layer
        first_layer = prepared * 2 + 2 * BATCH * WIDTH * 2
        assert (count.flops, count.outside_flops) == (model + first_layer, prepared)
