"""Lesson 03: autocast is a per-op *policy*, not a conversion: measured here, next to CUDA's documented lists.

Inside ``torch.autocast`` nothing is converted up front. Each op, when it runs, looks itself up in the
device's policy and either

- casts its floating-point inputs to the low-precision dtype (matmul-like ops: fast and safe enough),
- casts them to float32 (ops whose range or accumulation suffers in FP16: exp, softmax, sums, losses on CUDA),
- promotes them to the widest input type, or
- is not listed at all and simply runs in whatever dtype its inputs have (ordinary type promotion).

The lists are *per device*. CPU autocast lists far fewer float32 ops than CUDA, so on a CPU a softmax of an
FP16 activation stays FP16, while on CUDA the same line returns float32. ``policy_table`` measures the dtype
each op really returns on this machine and puts it next to what CUDA's lists predict, taken from the op
reference in the PyTorch docs (https://pytorch.org/docs/stable/amp.html#autocast-op-reference, sections "CUDA
Ops that can autocast to float16", "... to float32" and "... that promote to the widest input type"; for BF16
the same lists apply with bfloat16 in place of float16). On a GPU both columns come from CUDA and should
agree.

The model's parameters are never converted: autocast casts a *copy* of each FP32 weight for the op that needs
it (and caches the copy until the ``with`` block ends). The FP32 master weights are what the optimizer
updates.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F

from amp_lessons.environment import dtype_name

DOCS_URL = "https://pytorch.org/docs/stable/amp.html#autocast-op-reference"

# From the PyTorch docs' autocast op reference (CUDA). Abbreviated to the ops this course uses; see DOCS_URL.
CUDA_LOWER_PRECISION = frozenset({
    "__matmul__", "addbmm", "addmm", "addmv", "addr", "baddbmm", "bmm", "chain_matmul", "multi_dot", "conv1d",
    "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d", "conv_transpose3d", "GRUCell", "linear",
    "LSTMCell", "matmul", "mm", "mv", "prelu", "RNNCell",
})
CUDA_FLOAT32 = frozenset({
    "__pow__", "__rdiv__", "__rpow__", "__rtruediv__", "acos", "asin", "binary_cross_entropy_with_logits",
    "cosh", "cosine_embedding_loss", "cdist", "cosine_similarity", "cross_entropy", "cumprod", "cumsum",
    "dist", "erfinv", "exp", "expm1", "group_norm", "hinge_embedding_loss", "kl_div", "l1_loss", "layer_norm",
    "log", "log_softmax", "log10", "log1p", "log2", "margin_ranking_loss", "mse_loss",
    "multilabel_margin_loss", "multi_margin_loss", "nll_loss", "norm", "normalize", "pdist",
    "poisson_nll_loss", "pow", "prod", "reciprocal", "rsqrt", "sinh", "smooth_l1_loss", "soft_margin_loss",
    "softmax", "softmin", "softplus", "sum", "renorm", "tan", "triplet_margin_loss",
})
CUDA_PROMOTE = frozenset({
    "addcdiv", "addcmul", "atan2", "bilinear", "cross", "dot", "grid_sample", "index_put", "scatter_add",
    "tensordot",
})

MEASURED = "measured here"
CUDA_DOCS = "CUDA policy (from the docs)"


def cuda_list(op: str) -> str:
    """Which of CUDA's documented autocast lists ``op`` is on.

    One of 'lower precision', 'float32', 'promote' or 'not listed'.
    """
    if op in CUDA_LOWER_PRECISION:
        return "lower precision"
    if op in CUDA_FLOAT32:
        return "float32"
    if op in CUDA_PROMOTE:
        return "promote"
    return "not listed"


@dataclass(frozen=True)
class OpCase:
    """One row of the table: an op, the name it has in the docs' lists, and what it is fed.

    ``inputs`` names the floating-point tensors the op receives: 'fp32' (a model input, a target, an FP32
    parameter) or 'low' (an activation that came out of a low-precision op, as it does inside a network).
    """

    label: str
    docs_name: str
    inputs: tuple
    run: Callable


def _tensors(device: torch.device) -> dict:
    g = torch.Generator().manual_seed(0)
    t = {
        "x": torch.randn(8, 16, generator=g),
        "w": torch.randn(16, 16, generator=g) / 4,
        "b": torch.randn(16, generator=g),
        "img": torch.randn(2, 3, 6, 6, generator=g),
        "kernel": torch.randn(4, 3, 3, 3, generator=g) / 3,
        "batch": torch.randn(2, 8, 16, generator=g),
        "target": torch.randn(8, 16, generator=g),
        "labels": torch.randint(0, 16, (8,), generator=g),
        "ln_weight": torch.ones(16),
        "ln_bias": torch.zeros(16),
    }
    return {k: v.to(device) for k, v in t.items()}


OP_CASES = (
    OpCase("linear (nn.Linear)", "linear", ("fp32",), lambda t, h: F.linear(t["x"], t["w"], t["b"])),
    OpCase("matmul  x @ w", "matmul", ("fp32",), lambda t, h: t["x"] @ t["w"]),
    OpCase("conv2d", "conv2d", ("fp32",), lambda t, h: F.conv2d(t["img"], t["kernel"])),
    OpCase("bmm", "bmm", ("fp32",), lambda t, h: torch.bmm(t["batch"], t["w"].expand(2, 16, 16))),
    OpCase("relu(h)", "relu", ("low",), lambda t, h: torch.relu(h)),
    OpCase("softmax(h)", "softmax", ("low",), lambda t, h: torch.softmax(h, dim=-1)),
    OpCase("log_softmax(h)", "log_softmax", ("low",), lambda t, h: torch.log_softmax(h, dim=-1)),
    OpCase("layer_norm(h)", "layer_norm", ("low",),
           lambda t, h: F.layer_norm(h, (16,), t["ln_weight"], t["ln_bias"])),
    OpCase("h.sum()", "sum", ("low",), lambda t, h: h.sum()),
    OpCase("h.mean()", "mean", ("low",), lambda t, h: h.mean()),
    OpCase("exp(h)", "exp", ("low",), lambda t, h: torch.exp(h)),
    OpCase("h.pow(2)", "pow", ("low",), lambda t, h: h.pow(2)),
    OpCase("cross_entropy(h, labels)", "cross_entropy", ("low",),
           lambda t, h: F.cross_entropy(h, t["labels"])),
    OpCase("mse_loss(h, target)", "mse_loss", ("low", "fp32"), lambda t, h: F.mse_loss(h, t["target"])),
    OpCase("add  h + h", "add", ("low", "low"), lambda t, h: h + h),
    OpCase("add  h + x (residual)", "add", ("low", "fp32"), lambda t, h: h + t["x"]),
    OpCase("cat([h, x])", "cat", ("low", "fp32"), lambda t, h: torch.cat([h, t["x"]])),
)




def cuda_expected_dtype(case: OpCase, dtype: torch.dtype) -> torch.dtype:
    """The output dtype CUDA autocast gives ``case`` under ``dtype``, derived from the documented lists.

    On CUDA a 'low' activation really is ``dtype`` (it came out of a lower-precision op), so an op that is
    not listed follows ordinary type promotion between ``dtype`` and float32.
    """
    kind = cuda_list(case.docs_name)
    if kind == "lower precision":
        return dtype
    if kind == "float32":
        return torch.float32
    return torch.float32 if "fp32" in case.inputs else dtype


def measure_op(case: OpCase, device: torch.device, dtype: torch.dtype, tensors: dict | None = None) -> str:
    """Run ``case`` under ``torch.autocast(device.type, dtype)``; the output dtype (or what went wrong)."""
    tensors = tensors if tensors is not None else _tensors(device)
    try:
        with torch.autocast(device_type=device.type, dtype=dtype):
            h = F.linear(tensors["x"], tensors["w"], tensors["b"])  # an activation, as autocast makes it here
            out = case.run(tensors, h)
        return dtype_name(out.dtype)
    except Exception as exc:  # an op this build cannot run in this dtype: a result worth showing, not a crash
        return f"error: {type(exc).__name__}"


def policy_table(device: torch.device | str = "cpu", dtypes=(torch.float16, torch.bfloat16)):
    """One row per op: output dtype measured under autocast on ``device`` next to CUDA's documented policy.

    Columns: ``op``, ``inputs`` (fp32 / low: what the op was fed), ``CUDA list (docs)``, and for each dtype
    ``'<dtype>: measured here (<device>)'`` and ``'<dtype>: CUDA policy (from the docs)'``, plus ``differs``
    (the ops whose measured dtype is not what CUDA's lists predict).
    """
    import pandas as pd

    device = _as_device(device)
    dtypes = tuple(dtypes)
    for dtype in dtypes:
        if dtype not in (torch.float16, torch.bfloat16):
            raise ValueError(f"dtypes must be torch.float16 and/or torch.bfloat16, not {dtype!r}.")
    tensors = _tensors(device)
    rows = []
    for case in OP_CASES:
        row = {"op": case.label, "inputs": ", ".join(case.inputs),
               "CUDA list (docs)": cuda_list(case.docs_name)}
        differs = []
        for dtype in dtypes:
            measured = measure_op(case, device, dtype, tensors)
            expected = dtype_name(cuda_expected_dtype(case, dtype))
            row[f"{dtype_name(dtype)}: {MEASURED} ({device.type})"] = measured
            row[f"{dtype_name(dtype)}: {CUDA_DOCS}"] = expected
            if measured != expected:
                differs.append(dtype_name(dtype))
        row["differs"] = ", ".join(differs) if differs else ""
        rows.append(row)
    return pd.DataFrame(rows)


def styled(table):
    """Highlight the rows where the measured dtype differs from CUDA's lists (else the plain table)."""
    try:
        return table.style.apply(
            lambda row: ["background-color: #fff3cd" if row["differs"] else "" for _ in row], axis=1
        ).hide(axis="index")
    except Exception:  # pandas Styler needs jinja2; the plain DataFrame shows the same facts
        return table


def _as_device(device) -> torch.device:
    try:
        return torch.device(device)
    except (RuntimeError, TypeError):
        raise ValueError(f"device={device!r} is not a torch device; pass env.device, 'cpu' or "
                         "'cuda'.") from None


def parameter_dtypes(model: torch.nn.Module) -> dict:
    """``{parameter name: dtype}``, to show that autocast leaves the FP32 master weights alone."""
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"parameter_dtypes expects an nn.Module, not a {type(model).__name__}.")
    return {name: dtype_name(p.dtype) for name, p in model.named_parameters()}


