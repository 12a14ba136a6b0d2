"""FLOP formulas for operators that torch's FLOP counter has none for, and that a training step
of a common model runs: the recurrent layers, which ``nn.LSTM``, ``nn.GRU`` and ``nn.RNN`` run
as one operator per layer on a CPU with oneDNN (LSTM) and per stack on CUDA with cuDNN (all
three) or MIOpen, attention on a CPU (``F.scaled_dot_product_attention``'s CPU kernel) and in
flash-attn, the matrix-vector products; and the names of torch's operators that compute and
have none (:data:`WITHOUT_FORMULA`).
Without them the counter counts nothing for these operators: an LSTM model's step counted its
output layer alone (12 kFLOP of a step that does 57 MFLOP), and MFU and the advice read from it
would be those of a model that hardly computes.

Counted as the counter counts its own operators: a multiply-add is 2 FLOPs; a backward is
twice its forward (the gradients of the input and of the weights, which a fused kernel computes
whether or not the input needs one), attention's as torch counts its flash kernels (the scores
recomputed); elementwise work (gates, activations, softmax) counts nothing. A recurrent layer
over ``rows`` input rows (time steps x batch, or a packed sequence's rows) multiplies each row
by its input weights and its recurrent weights (and a projection's, ``proj_size``):
``2 * rows * (the weights' elements)`` for each layer and direction, whatever its gates.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from math import prod
from typing import Any

Shape = Sequence[int]


def _rows(input_shape: Shape) -> int:
    """Rows of a recurrent layer's input: every time step of every sequence, packed or not."""
    return prod(input_shape[:-1])


def _matrix_elements(weights: Sequence[Shape | None]) -> int:
    """Elements of the weight matrices among ``weights`` (the biases are vectors)."""
    return sum(prod(shape) for shape in weights if shape is not None and len(shape) == 2)


def recurrent_flops(input_shape: Shape, weights: Sequence[Shape | None]) -> int:
    """FLOPs of a recurrent stack's forward over ``input_shape`` with these weight shapes (all
    its layers and directions, as cuDNN and MIOpen take them; one layer's, as oneDNN does)."""
    return 2 * _rows(input_shape) * _matrix_elements(weights)


def _onednn_layer(input_shape: Shape, w_ih: Shape, w_hh: Shape, *_: Any, **__: Any) -> int:
    return recurrent_flops(input_shape, (w_ih, w_hh))


def _onednn_layer_backward(input_shape: Shape, w_ih: Shape, w_hh: Shape, *_: Any, **__: Any) -> int:
    return 2 * recurrent_flops(input_shape, (w_ih, w_hh))


def _stack(input_shape: Shape, weights: Sequence[Shape], *_: Any, **__: Any) -> int:
    return recurrent_flops(input_shape, weights)


def _stack_backward(input_shape: Shape, weights: Sequence[Shape], *args: Any, **__: Any) -> int:
    mask = args[-1] if args else ()  # output_mask: input, hx, cx, weights given gradients
    weights_too = not (isinstance(mask, (list, tuple)) and len(mask) == 4 and not mask[3])
    return (2 if weights_too else 1) * recurrent_flops(input_shape, weights)


def _attention(query: Shape, key: Shape, value: Shape, *_: Any, **__: Any) -> int:
    from torch.utils.flop_counter import sdpa_flop_count

    return int(sdpa_flop_count(query, key, value))


def _attention_backward(
    grad_out: Shape, query: Shape, key: Shape, value: Shape, *_: Any, **__: Any
) -> int:
    from torch.utils.flop_counter import sdpa_backward_flop_count

    return int(sdpa_backward_flop_count(grad_out, query, key, value))


def _matmul(mat1: Shape, mat2: Shape, *_: Any, **__: Any) -> int:
    return 2 * mat1[0] * mat1[1] * mat2[1]


def _matmul_added(_bias: Shape, mat1: Shape, mat2: Shape, *_: Any, **__: Any) -> int:
    return _matmul(mat1, mat2)


def _batches_summed(_bias: Shape, batch1: Shape, batch2: Shape, *_: Any, **__: Any) -> int:
    return batch1[0] * _matmul(batch1[1:], batch2[1:])


def _matrix_vector(matrix: Shape, _vector: Shape, *_: Any, **__: Any) -> int:
    return 2 * matrix[0] * matrix[1]


def _matrix_vector_added(_bias: Shape, matrix: Shape, vector: Shape, *_: Any, **__: Any) -> int:
    return _matrix_vector(matrix, vector)


def _dot(a: Shape, _b: Shape, *_: Any, **__: Any) -> int:
    return 2 * a[0]


def _heads_second(shape: Shape) -> Shape:
    """flash-attn's ``(batch, sequence, heads, head size)`` as torch's attention has it."""
    return (shape[0], shape[2], shape[1], shape[3])


def _flash_attn(query: Shape, key: Shape, value: Shape, *_: Any, **__: Any) -> int:
    return _attention(*map(_heads_second, (query, key, value)))


def _flash_attn_backward(
    grad_out: Shape, query: Shape, key: Shape, value: Shape, *_: Any, **__: Any
) -> int:
    return _attention_backward(*map(_heads_second, (grad_out, query, key, value)))


def _sequences(
    query: Any, key: Any, value: Any, cu_seqlens_q: Any, cu_seqlens_k: Any
) -> list[tuple[Shape, Shape, Shape]]:
    """The query, key and value shapes of each sequence flash-attn's variable-length kernels
    pack as ``(tokens, heads, head size)``, as torch's attention has them, from the cumulative
    offsets (a tensor's values: on a GPU, read once, in the counted step)."""
    q, k = cu_seqlens_q.tolist(), cu_seqlens_k.tolist()
    heads, size, kv_heads, v_size = query.shape[1], query.shape[2], key.shape[1], value.shape[2]
    return [
        ((1, heads, q[i + 1] - q[i], size), (1, kv_heads, k[i + 1] - k[i], size),
         (1, kv_heads, k[i + 1] - k[i], v_size))
        for i in range(len(q) - 1)
    ]  # fmt: skip


def _flash_attn_varlen(
    query: Any, key: Any, value: Any, cu_seqlens_q: Any, cu_seqlens_k: Any, *_: Any, **__: Any
) -> int:
    """flash-attn's variable-length kernel, over the tensors themselves: each sequence attends
    within itself."""
    return sum(
        _attention(*shapes) for shapes in _sequences(query, key, value, cu_seqlens_q, cu_seqlens_k)
    )


def _flash_attn_varlen_backward(
    grad_out: Any, query: Any, key: Any, value: Any, *args: Any, **__: Any
) -> int:
    """...its backward: ``cu_seqlens_q``, ``cu_seqlens_k`` after the output, the softmax's
    log-sum-exp and the three gradients; each sequence's output gradient has the query's rows
    and the value's head size."""
    return sum(
        _attention_backward((*q[:3], v[3]), q, k, v)
        for q, k, v in _sequences(query, key, value, args[5], args[6])
    )


#: Formulas that take the operator's tensors, not their shapes (``FlopCounterMode``'s
#: ``_get_raw``): those that need a tensor's values.
TAKE_TENSORS = frozenset({_flash_attn_varlen, _flash_attn_varlen_backward})


def _euclidean_distances(x1: Shape, x2: Shape, *_: Any, **__: Any) -> int:
    """``torch.cdist``'s matrix-product path: each point's coordinates, its squared norm and a
    1 (``M + 2`` columns) against the other set's, as one matrix product a batch."""
    *batch, rows, columns = x1
    return prod(batch) * 2 * rows * x2[-2] * (columns + 2)


#: Operator name -> its formula over the shapes of its arguments (tensors given as shapes).
FORMULAS: dict[str, Callable[..., int]] = {
    "mkldnn_rnn_layer": _onednn_layer,
    "mkldnn_rnn_layer_backward": _onednn_layer_backward,
    "_cudnn_rnn": _stack,
    "_cudnn_rnn_backward": _stack_backward,
    "miopen_rnn": _stack,
    "miopen_rnn_backward": _stack_backward,
    "_scaled_dot_product_flash_attention_for_cpu": _attention,
    "_scaled_dot_product_flash_attention_for_cpu_backward": _attention_backward,
    "_scaled_dot_product_fused_attention_overrideable": _attention,
    "_scaled_dot_product_fused_attention_overrideable_backward": _attention_backward,
    "_addmm_activation": _matmul_added,
    "_int_mm": _matmul,
    "addbmm": _batches_summed,
    "mv": _matrix_vector,
    "addmv": _matrix_vector_added,
    "dot": _dot,
    "vdot": _dot,
    "_euclidean_dist": _euclidean_distances,
}

#: Other libraries' operators by ``namespace::name``, as :data:`FORMULAS`: flash-attn's (2.6
#: and later register its kernels as torch operators: ``flash_attn_func``, and transformers'
#: ``attn_implementation="flash_attention_2"``, whose padded batches run the variable-length
#: kernels), counted as torch counts its own flash attention, each sequence apart in the
#: variable-length ones (their work depends on each sequence's length).
LIBRARY_FORMULAS: dict[str, Callable[..., int]] = {
    "flash_attn::_flash_attn_forward": _flash_attn,
    "flash_attn::_flash_attn_backward": _flash_attn_backward,
    "flash_attn::_flash_attn_varlen_forward": _flash_attn_varlen,
    "flash_attn::_flash_attn_varlen_backward": _flash_attn_varlen_backward,
}

#: torch's own operators that do floating-point work no formula here or in torch's counter
#: counts (FFTs, matrix factorisations, inverses and solves, ``nn.Bilinear``'s product, the
#: packed-weight matrix products, ``torch.cdist`` other than by matrix products): a count in
#: which one ran names it, as it names other libraries' operators, and its figures are lower
#: bounds. (An FFT's FLOPs have conventions, not a count: 5 N log2 N is one, for one size.)
WITHOUT_FORMULA = frozenset(
    {"_fft_c2c", "_fft_c2r", "_fft_r2c",
     "_linalg_det", "_linalg_eigh", "_linalg_eigvals", "_linalg_slogdet", "_linalg_solve_ex",
     "_linalg_svd", "linalg_cholesky_ex", "linalg_eig", "linalg_householder_product",
     "linalg_inv_ex", "linalg_ldl_factor_ex", "linalg_ldl_solve", "linalg_lu",
     "linalg_lu_factor_ex", "linalg_lu_solve", "linalg_matrix_exp", "linalg_qr",
     "linalg_solve_triangular", "cholesky", "cholesky_inverse", "_cholesky_solve_helper",
     "triangular_solve", "geqrf", "ormqr",
     "_trilinear", "_cdist_forward", "_cdist_backward",
     "_weight_int4pack_mm", "_weight_int4pack_mm_for_cpu",
     "_weight_int4pack_mm_with_scales_and_zeros", "_weight_int8pack_mm", "_dyn_quant_matmul_4bit"}
)  # fmt: skip


def extra_formulas(
    on_error: Callable[[str, Exception], None],
) -> dict[Any, Callable[..., int]]:
    """:data:`FORMULAS` and :data:`LIBRARY_FORMULAS` keyed by the operators of this process
    that have them and that its counter has no formula for (an operator it lacks is left out,
    as a library not loaded; so is attention where its counter has no attention formulas to
    follow), for ``FlopCounterMode(custom_mapping=...)``, which hands a formula its arguments'
    shapes. A formula that fails counts 0 and tells ``on_error`` the operator's name
    (``aten.mv``, ``flash_attn::_flash_attn_forward``) and the error: it runs inside the user's
    step."""
    import torch
    import torch.utils.flop_counter as counter

    attention = all(hasattr(counter, f) for f in ("sdpa_flop_count", "sdpa_backward_flop_count"))
    named = {f"aten.{name}": formula for name, formula in FORMULAS.items()}
    out: dict[Any, Callable[..., int]] = {}
    for name, formula in {**named, **LIBRARY_FORMULAS}.items():
        namespace, op_name = name.split("::") if "::" in name else name.split(".")
        try:
            op = getattr(getattr(torch.ops, namespace), op_name)
        except (AttributeError, RuntimeError):  # not in this torch, or a library not loaded
            continue
        if op in counter.flop_registry:
            continue
        attention_formula = formula in (_attention, _attention_backward, *LIBRARY_FORMULAS.values())
        if attention_formula and not attention:
            continue
        out[op] = _guarded(name, formula, on_error)
    return out


def _guarded(
    name: str, formula: Callable[..., int], on_error: Callable[[str, Exception], None]
) -> Callable[..., int]:
    def count(*args: Any, **kwargs: Any) -> int:
        try:
            return formula(*args, **kwargs)
        except Exception as exc:
            on_error(name, exc)
            return 0

    count._get_raw = formula in TAKE_TENSORS  # type: ignore[attr-defined]
    return count
