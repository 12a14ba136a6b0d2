"""The FLOP formulas for the operators torch's counter has none for (``flop_formulas``): a
recurrent layer run as one operator counts what the same layer counts run as matrix products
(oneDNN switched off), attention on a CPU what torch counts for flash attention, and a run of an
LSTM model counts its recurrent layers."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.flop_counter import FlopCounterMode, sdpa_backward_flop_count, sdpa_flop_count

import traceml_nb
from traceml_nb.engine.instrument import flop_count, flop_formulas
from traceml_nb.engine.instrument.flop_count import _counter
from traceml_nb.engine.instrument.flop_formulas import recurrent_flops

SEQ, BATCH, INPUT, HIDDEN = 10, 16, 32, 64


def _flops(step, mode) -> int:
    with mode as counter:
        step()
    return int(counter.get_total_flops())


def _torch_count(step) -> int:
    """torch's own count of ``step``: its counter, without our formulas."""
    return _flops(step, FlopCounterMode(display=False))


def _decomposed(step) -> int:
    """torch's own count of ``step`` with oneDNN off: the layers run as matrix products."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (the flags' own note on TF32 for Intel GPUs)
        with torch.backends.mkldnn.flags(enabled=False):
            return _torch_count(step)


def _lstm_step(layer: nn.LSTM):
    """A forward and backward in which every gradient is needed (the input's and the initial
    state's too: a fused kernel computes them, where autograd over matrix products skips
    those nobody asked for)."""
    layers = layer.num_layers * (2 if layer.bidirectional else 1)
    x = torch.randn(BATCH, SEQ, INPUT, requires_grad=True)
    h0 = torch.zeros(layers, BATCH, layer.proj_size or HIDDEN, requires_grad=True)
    c0 = torch.zeros(layers, BATCH, HIDDEN, requires_grad=True)
    return lambda: layer(x, (h0, c0))[0].sum().backward()


@pytest.mark.parametrize("shape", [{}, {"num_layers": 2, "bidirectional": True}])
def test_an_lstm_on_onednn_counts_as_its_matrix_products(shape) -> None:
    torch.manual_seed(0)
    layer = nn.LSTM(INPUT, HIDDEN, batch_first=True, **shape)
    step = _lstm_step(layer)
    assert _torch_count(step) < _decomposed(step) / 10  # (uncounted)
    assert _flops(step, _counter()) == _decomposed(step) > 0


@pytest.mark.parametrize("cls", [nn.GRU, nn.RNN])
def test_layers_torch_runs_as_matrix_products_on_a_cpu_are_not_counted_twice(cls) -> None:
    layer = cls(INPUT, HIDDEN, num_layers=2, batch_first=True)
    x = torch.randn(BATCH, SEQ, INPUT)

    def step() -> None:
        layer(x)[0].sum().backward()

    assert _flops(step, _counter()) == _torch_count(step) > 0


@pytest.mark.parametrize("shape", [{}, {"num_layers": 2, "bidirectional": True}, {"proj_size": 16}])
def test_the_cudnn_formula_counts_an_lstm_as_its_matrix_products(shape) -> None:
    """cuDNN's operator cannot run here: its formula, as the counter calls it (the
    arguments' shapes), on an LSTM's own weights, against the layer run as matrix products;
    with ``proj_size`` too (which oneDNN does not run)."""
    torch.manual_seed(0)
    layer = nn.LSTM(INPUT, HIDDEN, batch_first=True, **shape)
    x = torch.randn(BATCH, SEQ, INPUT)
    common = (x, layer._flat_weights, 4, None, None, None)
    stack = (2, HIDDEN, layer.proj_size, layer.num_layers, True, 0.0, True, layer.bidirectional)
    formulas = _counter().flop_registry
    forward = formulas[torch.ops.aten._cudnn_rnn](*common, *stack, [], None, out_val=None)
    backward = formulas[torch.ops.aten._cudnn_rnn_backward]
    both = backward(*common, None, None, None, *stack, [], None, None, [True] * 4, out_val=None)
    frozen = backward(*common, None, None, None, *stack, [], None, None, [True] * 3 + [False])
    assert forward + both == _decomposed(_lstm_step(layer)) > 0
    assert both == 2 * forward and frozen == forward  # no weight gradients: the data's only


def test_a_recurrent_stack_counts_two_flops_per_weight_element_per_input_row() -> None:
    weights = [(4 * 8, 3), (4 * 8, 8), (4 * 8,), (4 * 8,)]  # w_ih, w_hh, the two biases
    assert recurrent_flops((5, 2, 3), weights) == 2 * 5 * 2 * (4 * 8 * 3 + 4 * 8 * 8)
    assert recurrent_flops((7, 3), weights) == 2 * 7 * (4 * 8 * 3 + 4 * 8 * 8)  # packed rows


def test_attention_on_a_cpu_counts_as_torch_counts_flash_attention() -> None:
    q, k, v = (torch.randn(2, 4, 32, 16, requires_grad=True) for _ in "qkv")

    def step() -> None:
        nn.functional.scaled_dot_product_attention(q, k, v).sum().backward()

    shape = (2, 4, 32, 16)
    expected = sdpa_flop_count(shape, shape, shape) + sdpa_backward_flop_count(*[shape] * 4)
    assert _torch_count(step) == 0  # the CPU kernel: uncounted
    assert _flops(step, _counter()) == expected > 0
    with torch.no_grad():  # the forward alone: the math backend's two matrix products
        forward = _flops(lambda: nn.functional.scaled_dot_product_attention(q, k, v), _counter())
    assert forward == sdpa_flop_count(shape, shape, shape) == 2 * 2 * (2 * 4 * 32 * 32 * 16)


def test_products_torch_counts_nothing_for_count_as_the_same_matrix_products() -> None:
    """``torch.mv``, ``dot``, ``addmv``, ``addbmm`` and ``cdist``'s matrix-product path: each
    counts what torch counts for the same work written with the products it counts."""
    a, b = torch.randn(6, 5), torch.randn(3, 5, 4)
    v, w, bias = torch.randn(5), torch.randn(5), torch.randn(6)
    pairs = {
        "mv": (lambda: torch.mv(a, v), lambda: a @ v.unsqueeze(1)),
        "addmv": (lambda: torch.addmv(bias, a, v), lambda: a @ v.unsqueeze(1)),
        "dot": (lambda: torch.dot(v, w), lambda: v.unsqueeze(0) @ w.unsqueeze(1)),
        "vdot": (lambda: torch.vdot(v, w), lambda: v.unsqueeze(0) @ w.unsqueeze(1)),
        "addbmm": (lambda: torch.addbmm(torch.randn(6, 4), a.expand(3, 6, 5), b),
                   lambda: torch.bmm(a.expand(3, 6, 5), b)),
    }  # fmt: skip
    for name, (op, products) in pairs.items():
        assert _torch_count(op) == 0, name  # torch's counter: nothing
        assert _flops(op, _counter()) == _torch_count(products) > 0, name
    x1, x2 = torch.randn(2, 30, 8), torch.randn(2, 40, 8)  # points, coordinates

    def cdist() -> None:
        torch.cdist(x1, x2, compute_mode="use_mm_for_euclid_dist")

    def its_product() -> None:  # each point, its squared norm and a 1, against the other set's
        torch.bmm(torch.randn(2, 30, 8 + 2), torch.randn(2, 8 + 2, 40))

    assert _flops(cdist, _counter()) == _torch_count(its_product) > 0


def test_torch_operators_that_compute_without_a_formula_are_named() -> None:
    """An FFT, a solve and ``nn.Bilinear`` count nothing: the count names them (its figures
    are then lower bounds); torch's operators without such work (the solve's error check, the
    reshapes) are not named. Every name in the list is an operator of this torch."""
    x = torch.randn(4, 64, requires_grad=True)
    bilinear = nn.Bilinear(8, 8, 2)

    def step() -> None:
        spectrum = torch.fft.rfft(x).abs()
        solved = torch.linalg.solve(torch.eye(4) * 2, spectrum[:, :8])
        bilinear(solved, solved).sum().backward()

    with _counter() as mode:
        step()
    assert mode.get_total_flops() == 0
    assert list(mode.uncounted) == [
        "aten::_fft_r2c", "aten::_linalg_solve_ex", "aten::_trilinear", "aten::linalg_lu_solve",
        "aten::_fft_c2c",
    ]  # fmt: skip
    assert all(hasattr(torch.ops.aten, name) for name in flop_formulas.WITHOUT_FORMULA)


# flash-attn's kernels as its 2.6+ registers them (their signatures; it needs CUDA to build), each
# done here with torch's operations on a CPU, and its autograd Functions, as in flash_attn_func
# and flash_attn_varlen_func. Layout (batch, sequence, heads, size); packed: (tokens, heads, size).
@torch.library.custom_op("flash_attn::_flash_attn_forward", mutates_args=())
def _flash_forward(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dropout_p: float, softmax_scale: float,
    causal: bool, window_size_left: int, window_size_right: int, softcap: float,
    alibi_slopes: torch.Tensor | None, return_softmax: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:  # fmt: skip
    out = _attend(q, k, v, softmax_scale)
    return out, q.new_zeros(q.shape[:3]), q.new_empty(0), q.new_empty(0)


@torch.library.custom_op("flash_attn::_flash_attn_backward", mutates_args=("dq", "dk", "dv"))
def _flash_backward(
    dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
    softmax_lse: torch.Tensor, dq: torch.Tensor, dk: torch.Tensor, dv: torch.Tensor,
    dropout_p: float, softmax_scale: float, causal: bool, window_size_left: int,
    window_size_right: int, softcap: float, alibi_slopes: torch.Tensor | None,
    deterministic: bool, rng_state: torch.Tensor | None = None,
) -> torch.Tensor:  # fmt: skip
    for grad, into in zip(
        _attention_grads(dout, q, k, v, softmax_scale), (dq, dk, dv), strict=True
    ):
        into.copy_(grad)
    return softmax_lse.clone()


@torch.library.custom_op("flash_attn::_flash_attn_varlen_forward", mutates_args=())
def _varlen_forward(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor, max_seqlen_q: int, max_seqlen_k: int, dropout_p: float,
    softmax_scale: float, causal: bool, window_size_left: int, window_size_right: int,
    softcap: float, alibi_slopes: torch.Tensor | None, return_softmax: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:  # fmt: skip
    spans = _spans(cu_seqlens_q, cu_seqlens_k)
    out = torch.cat([_attend(q[a:b][None], k[c:d][None], v[c:d][None], softmax_scale)[0]
                     for (a, b), (c, d) in spans])  # fmt: skip
    return out, q.new_zeros(q.shape[:2]), q.new_empty(0), q.new_empty(0)


@torch.library.custom_op("flash_attn::_flash_attn_varlen_backward", mutates_args=("dq", "dk", "dv"))
def _varlen_backward(
    dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
    softmax_lse: torch.Tensor, dq: torch.Tensor, dk: torch.Tensor, dv: torch.Tensor,
    cu_seqlens_q: torch.Tensor, cu_seqlens_k: torch.Tensor, max_seqlen_q: int,
    max_seqlen_k: int, dropout_p: float, softmax_scale: float, causal: bool,
    window_size_left: int, window_size_right: int, softcap: float,
    alibi_slopes: torch.Tensor | None, deterministic: bool,
    rng_state: torch.Tensor | None = None,
) -> torch.Tensor:  # fmt: skip
    for (a, b), (c, d) in _spans(cu_seqlens_q, cu_seqlens_k):
        grads = _attention_grads(
            dout[a:b][None], q[a:b][None], k[c:d][None], v[c:d][None], softmax_scale
        )
        for grad, into in zip(grads, (dq[a:b], dk[c:d], dv[c:d]), strict=True):
            into.copy_(grad[0])
    return softmax_lse.clone()


def _spans(cu_q: torch.Tensor, cu_k: torch.Tensor) -> list:
    q, k = cu_q.tolist(), cu_k.tolist()
    return [((q[i], q[i + 1]), (k[i], k[i + 1])) for i in range(len(q) - 1)]


def _heads(t: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """(batch, heads, sequence, size), key and value heads repeated to the query's (GQA)."""
    return t.transpose(1, 2).repeat_interleave(q.shape[2] // t.shape[2], dim=1)


def _probs(q: torch.Tensor, k: torch.Tensor, scale: float) -> torch.Tensor:
    return torch.softmax(q.transpose(1, 2) @ _heads(k, q).transpose(-1, -2) * scale, -1)


def _attend(q, k, v, scale: float) -> torch.Tensor:
    return (_probs(q, k, scale) @ _heads(v, q)).transpose(1, 2).contiguous()


def _attention_grads(dout, q, k, v, scale: float) -> tuple[torch.Tensor, ...]:
    """The gradients of q, k and v (each in its own layout; k's and v's summed over the query
    heads that share them)."""
    probs, grad = _probs(q, k, scale), dout.transpose(1, 2)
    grad_probs = grad @ _heads(v, q).transpose(-1, -2)
    grad_scores = probs * (grad_probs - (grad_probs * probs).sum(-1, keepdim=True))
    groups = q.shape[2] // k.shape[2]
    dq = (grad_scores @ _heads(k, q) * scale).transpose(1, 2)
    dk_all = (grad_scores.transpose(-1, -2) @ q.transpose(1, 2) * scale).transpose(1, 2)
    dv_all = (probs.transpose(-1, -2) @ grad).transpose(1, 2)
    return dq, dk_all.unflatten(2, (-1, groups)).sum(3), dv_all.unflatten(2, (-1, groups)).sum(3)


class _FlashAttn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v):
        out, lse, _, _ = _flash_forward(q, k, v, 0.0, 0.25, False, -1, -1, 0.0, None, False)
        ctx.save_for_backward(q, k, v, out, lse)
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse = ctx.saved_tensors
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        _flash_backward(
            dout, q, k, v, out, lse, dq, dk, dv, 0.0, 0.25, False, -1, -1, 0.0, None, False
        )
        return dq, dk, dv


class _FlashAttnVarlen(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, cu_seqlens):
        out, lse, _, _ = _varlen_forward(
            q, k, v, cu_seqlens, cu_seqlens, 32, 32, 0.0, 0.25, False, -1, -1, 0.0, None, False
        )
        ctx.save_for_backward(q, k, v, out, lse, cu_seqlens)
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse, cu = ctx.saved_tensors
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        _varlen_backward(
            dout, q, k, v, out, lse, dq, dk, dv, cu, cu, 32, 32, 0.0, 0.25, False, -1, -1, 0.0,
            None, False,
        )  # fmt: skip
        return dq, dk, dv, None


@pytest.mark.parametrize("kv_heads", [4, 2])
def test_flash_attn_counts_as_torch_counts_its_own_flash_attention(kv_heads) -> None:
    """flash-attn's (batch, sequence, heads, size) layout, grouped-query heads too: its forward
    and backward count what torch counts for the same attention, and are not named."""
    q = torch.randn(2, 32, 4, 16, requires_grad=True)
    k, v = (torch.randn(2, 32, kv_heads, 16, requires_grad=True) for _ in "kv")
    reference = nn.functional.scaled_dot_product_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), scale=0.25, enable_gqa=True
    )
    assert torch.allclose(_FlashAttn.apply(q, k, v).transpose(1, 2), reference, atol=1e-5)
    expected = sdpa_flop_count((2, 4, 32, 16), (2, kv_heads, 32, 16), (2, kv_heads, 32, 16))
    expected += sdpa_backward_flop_count(
        (2, 4, 32, 16), (2, 4, 32, 16), (2, kv_heads, 32, 16), (2, kv_heads, 32, 16)
    )
    with _counter() as mode:
        _FlashAttn.apply(q, k, v).sum().backward()
    assert mode.get_total_flops() == expected > 0
    assert not mode.uncounted and not mode.failed_formulas
    assert _torch_count(lambda: _FlashAttn.apply(q, k, v).sum().backward()) == 0


@pytest.mark.parametrize("kv_heads", [4, 2])
def test_flash_attn_varlen_counts_each_sequence_as_its_own_attention(kv_heads) -> None:
    """Two sequences of 20 and 12 tokens packed in one batch (a padded batch through
    transformers' flash_attention_2): each counts as its own attention, forward and backward,
    not as a batch padded to the longest."""
    lengths, cu_seqlens = (20, 12), torch.tensor([0, 20, 32], dtype=torch.int32)
    q = torch.randn(32, 4, 16, requires_grad=True)
    k, v = (torch.randn(32, kv_heads, 16, requires_grad=True) for _ in "kv")
    out = _FlashAttnVarlen.apply(q, k, v, cu_seqlens)
    first = _FlashAttn.apply(q[:20][None], k[:20][None], v[:20][None])[0]
    assert torch.allclose(out[:20], first, atol=1e-5)
    expected = 0
    for n in lengths:
        q_shape, kv_shape = (1, 4, n, 16), (1, kv_heads, n, 16)
        expected += sdpa_flop_count(q_shape, kv_shape, kv_shape)
        expected += sdpa_backward_flop_count(q_shape, q_shape, kv_shape, kv_shape)
    with _counter() as mode:
        _FlashAttnVarlen.apply(q, k, v, cu_seqlens).sum().backward()
    assert mode.get_total_flops() == expected > 0
    assert not mode.uncounted and not mode.failed_formulas
    q_pad, kv_pad = (2, 4, 20, 16), (2, kv_heads, 20, 16)  # both as long as the longest
    padded = sdpa_flop_count(q_pad, kv_pad, kv_pad)
    assert expected < padded + sdpa_backward_flop_count(q_pad, q_pad, kv_pad, kv_pad)


class _LstmModel:
    """An embedding, an LSTM and a linear head, trained with Adam on token sequences."""

    def __init__(self) -> None:
        torch.manual_seed(0)
        self.embed, self.lstm = nn.Embedding(100, INPUT), nn.LSTM(INPUT, HIDDEN)
        self.head = nn.Linear(HIDDEN, 2)
        params = [*self.embed.parameters(), *self.lstm.parameters(), *self.head.parameters()]
        self.opt = torch.optim.Adam(params)
        tokens = torch.randint(0, 100, (96, SEQ), generator=torch.Generator().manual_seed(1))
        self.data = TensorDataset(tokens, torch.arange(96) % 2)

    def step(self, x, y) -> float:
        out = self.lstm(self.embed(x).transpose(0, 1))[0][-1]
        loss = nn.functional.cross_entropy(self.head(out), y)
        loss.backward()
        self.opt.step()
        self.opt.zero_grad()
        return loss.item()

    def train(self) -> list[float]:
        return [self.step(x, y) for x, y in DataLoader(self.data, batch_size=BATCH)]


def test_a_run_of_an_lstm_model_counts_its_recurrent_layers(monkeypatch) -> None:
    """The run's count is the step's with the LSTM's work in it, not the head's alone."""
    monkeypatch.setattr(flop_count, "compiled_anything", lambda: False)
    model = _LstmModel()
    with traceml_nb.Run("lstm", sample=False) as run:
        model.train()
    x, y = next(iter(DataLoader(model.data, batch_size=BATCH)))
    by_hand = _flops(lambda: model.step(x, y), _counter())
    head_alone = 3 * 2 * BATCH * HIDDEN * 2  # forward, and the backward's two products
    count = run.record.flops
    assert count is not None and count.why == ""
    assert count.flops == by_hand
    assert count.flops > 100 * head_alone


def test_a_formula_that_fails_leaves_the_step_alone_and_the_count_unavailable(
    monkeypatch,
) -> None:
    """A formula runs inside the user's step: one that raises counts nothing there, the step
    goes on as without the run, and the FLOPs are unavailable with why (not a count short of
    the LSTM's work)."""
    monkeypatch.setattr(flop_count, "compiled_anything", lambda: False)

    def broken(*args, **kwargs) -> int:
        raise ValueError("a shape it did not expect")

    monkeypatch.setitem(flop_formulas.FORMULAS, "mkldnn_rnn_layer", broken)
    plain = _LstmModel().train()
    with traceml_nb.Run("lstm", sample=False) as run:
        traced = _LstmModel().train()
    assert traced == plain
    count = run.record.flops
    assert count is not None and count.flops is None
    assert count.why == (
        "the FLOP formula for aten.mkldnn_rnn_layer "
        "(ValueError('a shape it did not expect')) failed"
    )
