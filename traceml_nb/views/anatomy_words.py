"""The advice from the anatomy of a step in words
(:mod:`traceml_nb.analysis.anatomy_advice` states it): one sentence for each of its codes."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..analysis.advice import KERAS_DRIVERS, SKORCH_DRIVERS
from ..analysis.formatting import fmt_ms, fmt_share

Facts = dict[str, Any]

#: How the batch's copy is made non-blocking where a framework copies it, by driver
#: (``LoaderInfo.driver``); the user's own loop copies with ``.to(device, non_blocking=True)``.
NON_BLOCKING = {
    "transformers": "accelerator_config={'non_blocking': True} in the TrainingArguments",
    "accelerate": "Accelerator(dataloader_config=DataLoaderConfiguration(non_blocking=True))",
}
#: ...and what pinned memory does where the copy cannot be made non-blocking
#: (``anatomy_advice.COPIES_AS_THEY_ARE``).
PINNED_ONLY = {
    "lightning": "lets it overlap the compute (Lightning copies with non_blocking=True)",
    "fastai": (
        "makes it faster (fastai copies without non_blocking; the phase also holds its batch "
        "transforms, after_batch, which pinning does not speed up)"
    ),
    **dict.fromkeys(
        KERAS_DRIVERS,
        "in a torch DataLoader given to model.fit makes it faster (Keras copies without "
        "non_blocking)",
    ),
    **dict.fromkeys(SKORCH_DRIVERS, "makes it faster (skorch copies without non_blocking)"),
}


def _pin_memory(f: Facts) -> str:
    driver = f.get("driver")
    head = (
        f"The input copy takes {fmt_share(f['copy_share'])} of each step "
        f"({fmt_ms(f['copy_ms'])}) from pageable memory: {f['setting']}=True"
    )
    if driver in NON_BLOCKING:
        return f"{head} and {NON_BLOCKING[driver]} let it overlap the compute."
    if driver in PINNED_ONLY:
        return f"{head} {PINNED_ONLY[driver]}."
    return f"{head} and copies with .to(device, non_blocking=True) let it overlap the compute."


def _non_blocking(f: Facts) -> str:
    how = NON_BLOCKING.get(
        f.get("driver") or "", "copy the batch with .to(device, non_blocking=True)"
    )
    return (
        f"The input copy takes {fmt_share(f['copy_share'])} of each step "
        f"({fmt_ms(f['copy_ms'])}): {how} from pinned memory, so that it overlaps the compute "
        "instead of waiting for it."
    )


#: Mixed precision where a trainer runs the forward, by driver (``LoaderInfo.driver``) and the
#: half precision advised: its own setting, which also scales the loss for fp16.
MIXED_PRECISION = {
    "transformers": {
        "bf16": "bf16=True in the TrainingArguments",
        "fp16": "fp16=True in the TrainingArguments (the Trainer scales the loss)",
    },
    "lightning": {
        "bf16": 'Trainer(precision="bf16-mixed")',
        "fp16": 'Trainer(precision="16-mixed") (Lightning scales the loss)',
    },
    "accelerate": {
        "bf16": 'Accelerator(mixed_precision="bf16")',
        "fp16": 'Accelerator(mixed_precision="fp16") (accelerator.backward scales the loss)',
    },
    "fastai": {"bf16": "learn.to_bf16()", "fp16": "learn.to_fp16() (it scales the loss)"},
    **dict.fromkeys(
        KERAS_DRIVERS,
        {
            "bf16": 'keras.mixed_precision.set_global_policy("mixed_bfloat16") before the model '
            "is made",
            "fp16": 'keras.mixed_precision.set_global_policy("mixed_float16") before the model '
            "is made",
        },
    ),
    **dict.fromkeys(
        SKORCH_DRIVERS,
        {
            dtype: f'accelerator=Accelerator(mixed_precision="{dtype}") on a net class made '
            "with skorch.hf.AccelerateMixin (accelerate scales the loss)"
            for dtype in ("bf16", "fp16")
        },
    ),
}


def _mixed_how(f: Facts) -> str:
    """Where mixed precision is asked for: the trainer's setting, or autocast in the user's
    own loop (fp16 with a GradScaler)."""
    driver, dtype = f.get("driver") or "", f["dtype"]
    if driver in MIXED_PRECISION:
        return f"set {MIXED_PRECISION[driver][dtype]}"
    name = "bfloat16" if dtype == "bf16" else "float16"
    scaler = "" if dtype == "bf16" else " with a torch.amp.GradScaler for the loss"
    return f'run the forward under torch.autocast("cuda", dtype=torch.{name}){scaler}'


def _fused_how(f: Facts) -> str:
    """Where a fused update is asked for: the optimizer's own ``fused=True``, or what the
    trainer that makes the optimizer takes (the Trainer's ``optim``, skorch's prefix)."""
    kinds = list(dict.fromkeys(f["optimizers"]))
    driver = f.get("driver")
    if driver == "transformers" and kinds == ["AdamW"]:
        return 'optim="adamw_torch_fused" in the TrainingArguments (the Trainer makes the AdamW)'
    if driver in SKORCH_DRIVERS:
        return "pass optimizer__fused=True to your skorch NeuralNet"
    return (
        f"create the {' and '.join(kinds)} optimizer{'s' if len(kinds) > 1 else ''} with fused=True"
    )


ANATOMY_SENTENCES: dict[str, Callable[[Facts], str]] = {
    "pin-memory-for-copies": _pin_memory,
    "non-blocking-copies": _non_blocking,
    "mixed-precision": lambda f: (
        f"{fmt_share(f['single_share'])} of the model's FLOPs run in {f['ran_in']} on a "
        f"{f['device']}, whose {f['dtype']} peak is {f['gain']:.3g}\u00d7 that: {_mixed_how(f)}."
    ),
    "channels-last": lambda f: (
        f"{fmt_share(f['conv_share'])} of the model's FLOPs are convolutions on NCHW inputs, "
        "which cuDNN's tensor-core kernels transpose first: model.to(memory_format="
        "torch.channels_last) and each batch .to(device, memory_format=torch.channels_last) "
        "give them NHWC as it is."
    ),
    "fused-optimizer": lambda f: (
        f"The optimizer step takes {fmt_share(f['optimizer_share'])} of each step: "
        f"{_fused_how(f)}, which updates all parameters in one operation instead of one per "
        "tensor."
    ),
    "fastai-optimizer": lambda f: (
        f"The optimizer step takes {fmt_share(f['optimizer_share'])} of each step: fastai's "
        f"own {f['kind']} updates its {f['tensors']} parameter tensors one at a time, in "
        "Python. "
        + (
            f"torch's {f['twin']} makes the same update in one operation with fused=True; "
            "fastai takes it through OptimWrapper: Learner(..., opt_func=partial(OptimWrapper, "
            f"opt=partial(torch.optim.{f['twin']}, fused=True"
            + "".join(f", {k}={_argument(v)}" for k, v in f.get("twin_arguments", ()))
            + ")))."
            if f["twin"]
            else "A torch.optim optimizer updates them together (foreach, its default, or "
            "fused=True where it has one); fastai takes one through OptimWrapper: "
            "Learner(..., opt_func=partial(OptimWrapper, opt=torch.optim.…))."
        )
    ),
}


def _argument(value: Any) -> str:
    """A keyword argument's value as Python writes it (a pair stored as a list: a tuple)."""
    if isinstance(value, (list, tuple)):
        return "(" + ", ".join(_argument(v) for v in value) + ")"
    return repr(value)
