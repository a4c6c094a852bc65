"""Lesson 03: autocast is a per-op *policy*, not a conversion: measured here, next to the documented lists.

Inside ``torch.autocast`` nothing is converted up front. Each op, when it runs, looks itself up in the
device's policy and either

- casts its floating-point inputs to the low-precision dtype (matmul-like ops: fast and safe enough),
- casts them to float32 (ops whose range or accumulation suffers in low precision),
- promotes them to the widest input type (CUDA only), or
- is not listed at all and simply runs in whatever dtype its inputs have (ordinary type promotion).

The lists are *per device*, and CPU's are **different** from CUDA's, not shorter. CUDA sends softmax,
log_softmax, layer_norm, group_norm, sum, cumsum, exp, log and pow to float32; CPU does not list them, so on a
CPU a softmax of an FP16 activation stays FP16. CPU sends ops to float32 that CUDA does not list (max_pool3d,
quantile, stft, the fft and linalg ops, binary_cross_entropy, which CUDA autocast refuses to run at all).
Both lists send most losses, prod and cdist to float32.

``policy_table`` runs ops from *both* lists under autocast on this machine, records the dtype each really
returns, and puts it next to what CUDA's lists predict. The lists are transcribed (abbreviated to the ops
this course uses) from the op reference in the PyTorch docs (https://pytorch.org/docs/stable/amp.html
#autocast-op-reference: "CUDA Ops that can autocast to float16", "... to float32", "... that promote to the
widest input type", "CPU Ops that can autocast to bfloat16", "... to float32"; the same lists apply to
float16 and bfloat16). The tests check the CPU transcription against what CPU autocast really does; on a GPU
the measured column checks the CUDA one (``make gpu-report``).

The model's parameters are never converted: autocast casts a *copy* of each FP32 weight for the op that needs
it and caches the copy until the ``with`` block ends. torch.amp keeps no separate "master" copy: the FP32
parameters are the only weights, and the optimizer updates them.
"""

from __future__ import annotations

import html
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F

from amp_lessons.core.environment import dtype_name

DOCS_URL = "https://pytorch.org/docs/stable/amp.html#autocast-op-reference"

# From the PyTorch docs' autocast op reference (CUDA). Abbreviated to the ops this course uses; see DOCS_URL.
CUDA_LOWER_PRECISION = frozenset(
    {
        "__matmul__",
        "addbmm",
        "addmm",
        "addmv",
        "addr",
        "baddbmm",
        "bmm",
        "chain_matmul",
        "multi_dot",
        "conv1d",
        "conv2d",
        "conv3d",
        "conv_transpose1d",
        "conv_transpose2d",
        "conv_transpose3d",
        "GRUCell",
        "linear",
        "LSTMCell",
        "matmul",
        "mm",
        "mv",
        "prelu",
        "RNNCell",
    }
)
CUDA_FLOAT32 = frozenset(
    {
        "__pow__",
        "__rdiv__",
        "__rpow__",
        "__rtruediv__",
        "acos",
        "asin",
        "binary_cross_entropy_with_logits",
        "cosh",
        "cosine_embedding_loss",
        "cdist",
        "cosine_similarity",
        "cross_entropy",
        "cumprod",
        "cumsum",
        "dist",
        "erfinv",
        "exp",
        "expm1",
        "group_norm",
        "hinge_embedding_loss",
        "kl_div",
        "l1_loss",
        "layer_norm",
        "log",
        "log_softmax",
        "log10",
        "log1p",
        "log2",
        "margin_ranking_loss",
        "mse_loss",
        "multilabel_margin_loss",
        "multi_margin_loss",
        "nll_loss",
        "norm",
        "normalize",
        "pdist",
        "poisson_nll_loss",
        "pow",
        "prod",
        "reciprocal",
        "rsqrt",
        "sinh",
        "smooth_l1_loss",
        "soft_margin_loss",
        "softmax",
        "softmin",
        "softplus",
        "sum",
        "renorm",
        "tan",
        "triplet_margin_loss",
    }
)
CUDA_PROMOTE = frozenset(
    {
        "addcdiv",
        "addcmul",
        "atan2",
        "bilinear",
        "cross",
        "dot",
        "grid_sample",
        "index_put",
        "scatter_add",
        "tensordot",
    }
)
# "unsafe to autocast": CUDA autocast raises instead of running these (use binary_cross_entropy_with_logits).
CUDA_ERRORS = frozenset({"binary_cross_entropy"})

# The CPU lists of the same page. The docs spell the cross-entropy entry "cross_entropy_loss".
CPU_LOWER_PRECISION = frozenset(
    {
        "conv1d",
        "conv2d",
        "conv3d",
        "bmm",
        "mm",
        "linalg_vecdot",
        "baddbmm",
        "addmm",
        "addbmm",
        "linear",
        "matmul",
        "conv_tbc",
        "conv_transpose1d",
        "conv_transpose2d",
        "conv_transpose3d",
        "prelu",
        "scaled_dot_product_attention",
    }
)
CPU_FLOAT32 = frozenset(
    {
        "avg_pool3d",
        "binary_cross_entropy",
        "grid_sampler",
        "polar",
        "prod",
        "quantile",
        "nanquantile",
        "stft",
        "cdist",
        "trace",
        "view_as_complex",
        "cholesky",
        "cholesky_inverse",
        "cholesky_solve",
        "inverse",
        "lu_solve",
        "orgqr",
        "ormqr",
        "pinverse",
        "max_pool3d",
        "max_unpool2d",
        "max_unpool3d",
        "adaptive_avg_pool3d",
        "reflection_pad1d",
        "reflection_pad2d",
        "replication_pad1d",
        "replication_pad2d",
        "replication_pad3d",
        "mse_loss",
        "cosine_embedding_loss",
        "nll_loss",
        "nll_loss2d",
        "hinge_embedding_loss",
        "poisson_nll_loss",
        "cross_entropy_loss",
        "smooth_l1_loss",
        "l1_loss",
        "huber_loss",
        "margin_ranking_loss",
        "soft_margin_loss",
        "triplet_margin_loss",
        "multi_margin_loss",
        "ctc_loss",
        "kl_div",
        "multilabel_margin_loss",
        "binary_cross_entropy_with_logits",
        "fft_fft",
        "fft_ifft",
        "fft_fft2",
        "fft_ifft2",
        "fft_fftn",
        "fft_ifftn",
        "fft_rfft",
        "fft_irfft",
        "fft_rfft2",
        "fft_irfft2",
        "fft_rfftn",
        "fft_irfftn",
        "fft_hfft",
        "fft_ihfft",
        "linalg_cond",
        "linalg_matrix_rank",
        "linalg_solve",
        "linalg_cholesky",
        "linalg_svdvals",
        "linalg_eigvals",
        "linalg_eigvalsh",
        "linalg_inv",
        "linalg_householder_product",
        "linalg_tensorinv",
        "linalg_tensorsolve",
        "fake_quantize_per_tensor_affine",
        "geqrf",
        "qr",
        "svd",
        "triangular_solve",
        "fractional_max_pool2d",
        "fractional_max_pool3d",
        "adaptive_max_pool3d",
        "linalg_qr",
        "linalg_svd",
        "linalg_eig",
        "linalg_eigh",
        "linalg_lstsq",
    }
)
_CPU_SPELLING = {"cross_entropy": "cross_entropy_loss"}

MEASURED = "measured here"
CUDA_DOCS = "CUDA policy (from the docs)"
LOWER, FLOAT32, PROMOTE, ERROR, NOT_LISTED = "lower precision", "float32", "promote", "error", "not listed"


def cuda_list(op: str) -> str:
    """Which of CUDA's documented autocast lists ``op`` is on.

    One of 'lower precision', 'float32', 'promote', 'error' (CUDA autocast refuses it) or 'not listed'.
    """
    if op in CUDA_LOWER_PRECISION:
        return LOWER
    if op in CUDA_FLOAT32:
        return FLOAT32
    if op in CUDA_PROMOTE:
        return PROMOTE
    if op in CUDA_ERRORS:
        return ERROR
    return NOT_LISTED


def cpu_list(op: str) -> str:
    """Which of CPU's documented autocast lists ``op`` is on: 'lower precision', 'float32' or 'not listed'."""
    op = _CPU_SPELLING.get(op, op)
    if op in CPU_LOWER_PRECISION:
        return LOWER
    if op in CPU_FLOAT32:
        return FLOAT32
    return NOT_LISTED


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
        "probabilities": torch.rand(8, 16, generator=g),
        "labels": torch.randint(0, 16, (8,), generator=g),
        "ln_weight": torch.ones(16),
        "ln_bias": torch.zeros(16),
    }
    return {k: v.to(device) for k, v in t.items()}


_LOW, _FP32, _BOTH, _TWO_LOW = ("low",), ("fp32",), ("low", "fp32"), ("low", "low")

OP_CASES = (
    # on both lower-precision lists
    OpCase("linear (nn.Linear)", "linear", _FP32, lambda t, h: F.linear(t["x"], t["w"], t["b"])),
    OpCase("matmul  x @ w", "matmul", _FP32, lambda t, h: t["x"] @ t["w"]),
    OpCase("conv2d", "conv2d", _FP32, lambda t, h: F.conv2d(t["img"], t["kernel"])),
    OpCase("bmm", "bmm", _FP32, lambda t, h: torch.bmm(t["batch"], t["w"].expand(2, 16, 16))),
    # float32 on CUDA, not listed on CPU
    OpCase("softmax(h)", "softmax", _LOW, lambda t, h: torch.softmax(h, dim=-1)),
    OpCase("log_softmax(h)", "log_softmax", _LOW, lambda t, h: torch.log_softmax(h, dim=-1)),
    OpCase(
        "layer_norm(h)", "layer_norm", _LOW, lambda t, h: F.layer_norm(h, (16,), t["ln_weight"], t["ln_bias"])
    ),
    OpCase("group_norm(h)", "group_norm", _LOW, lambda t, h: F.group_norm(h, 4)),
    OpCase("h.sum()", "sum", _LOW, lambda t, h: h.sum()),
    OpCase("h.cumsum(0)", "cumsum", _LOW, lambda t, h: h.cumsum(0)),
    OpCase("exp(h)", "exp", _LOW, lambda t, h: torch.exp(h)),
    OpCase("log(h)", "log", _LOW, lambda t, h: torch.log(h)),
    OpCase("h.pow(2)", "pow", _LOW, lambda t, h: h.pow(2)),
    # float32 on both
    OpCase("cross_entropy(h, labels)", "cross_entropy", _LOW, lambda t, h: F.cross_entropy(h, t["labels"])),
    OpCase("mse_loss(h, target)", "mse_loss", _BOTH, lambda t, h: F.mse_loss(h, t["target"])),
    OpCase("l1_loss(h, h)", "l1_loss", _TWO_LOW, lambda t, h: F.l1_loss(h, h.flip(0))),
    OpCase("nll_loss(h, labels)", "nll_loss", _LOW, lambda t, h: F.nll_loss(h, t["labels"])),
    OpCase(
        "kl_div(h, h)",
        "kl_div",
        _TWO_LOW,
        lambda t, h: F.kl_div(h, h.flip(0), reduction="batchmean", log_target=True),
    ),
    OpCase("h.prod()", "prod", _LOW, lambda t, h: h.prod()),
    OpCase("cdist(h, h)", "cdist", _TWO_LOW, lambda t, h: torch.cdist(h, h)),
    # float32 on CPU, not listed (or refused) on CUDA
    OpCase(
        "binary_cross_entropy(sigmoid(h), p)",
        "binary_cross_entropy",
        _BOTH,
        lambda t, h: F.binary_cross_entropy(torch.sigmoid(h), t["probabilities"]),
    ),
    OpCase("max_pool3d(h)", "max_pool3d", _LOW, lambda t, h: F.max_pool3d(h.reshape(1, 1, 2, 8, 8), 2)),
    # on no list: ordinary type promotion
    OpCase("relu(h)", "relu", _LOW, lambda t, h: torch.relu(h)),
    OpCase("h.mean()", "mean", _LOW, lambda t, h: h.mean()),
    OpCase("add  h + h", "add", _TWO_LOW, lambda t, h: h + h),
    OpCase("add  h + x (residual)", "add", _BOTH, lambda t, h: h + t["x"]),
    OpCase("cat([h, x])", "cat", _BOTH, lambda t, h: torch.cat([h, t["x"]])),
)


def predicted(case: OpCase, dtype: torch.dtype, kind: str) -> str:
    """The output dtype a list of kind ``kind`` predicts for ``case`` under ``dtype`` (or 'error: ...').

    A 'low' activation really is ``dtype`` (it came out of a lower-precision op), so an op on no list follows
    ordinary type promotion between ``dtype`` and float32, and so does 'promote' (the widest input type).
    """
    if kind == LOWER:
        return dtype_name(dtype)
    if kind == FLOAT32:
        return "float32"
    if kind == ERROR:
        return "error: RuntimeError"
    return "float32" if "fp32" in case.inputs else dtype_name(dtype)


def cuda_prediction(case: OpCase, dtype: torch.dtype) -> str:
    """The output dtype CUDA autocast gives ``case`` under ``dtype``, derived from CUDA's documented lists."""
    return predicted(case, dtype, cuda_list(case.docs_name))


def cpu_prediction(case: OpCase, dtype: torch.dtype) -> str:
    """The output dtype CPU autocast gives ``case`` under ``dtype``, derived from CPU's documented lists."""
    return predicted(case, dtype, cpu_list(case.docs_name))


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

    Columns: ``op``, ``inputs`` (fp32 / low: what the op was fed), ``CUDA list (docs)``, ``CPU list (docs)``,
    and for each dtype ``'<dtype>: measured here (<device>)'`` and ``'<dtype>: CUDA policy (from the docs)'``,
    plus ``differs`` (the dtypes for which the measured dtype is not what CUDA's lists predict). The rows
    that differ come first; the others keep the order of ``OP_CASES``.
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
        row = {
            "op": case.label,
            "inputs": ", ".join(case.inputs),
            "CUDA list (docs)": cuda_list(case.docs_name),
            "CPU list (docs)": cpu_list(case.docs_name),
        }
        differs = []
        for dtype in dtypes:
            measured = measure_op(case, device, dtype, tensors)
            expected = cuda_prediction(case, dtype)
            row[f"{dtype_name(dtype)}: {MEASURED} ({device.type})"] = measured
            row[f"{dtype_name(dtype)}: {CUDA_DOCS}"] = expected
            if measured != expected:
                differs.append(dtype_name(dtype))
        row["differs"] = ", ".join(differs)
        rows.append(row)
    table = pd.DataFrame(rows)
    order = sorted(range(len(table)), key=lambda i: table["differs"].iloc[i] == "")  # stable: differing first
    return table.iloc[order].reset_index(drop=True)


def _highlighted_html(table) -> str:
    """The table as HTML with the rows that differ from CUDA's lists highlighted."""
    try:
        return (
            table.style.apply(
                lambda row: ["background-color: #fff3cd" if row["differs"] else "" for _ in row], axis=1
            )
            .hide(axis="index")
            .to_html()
        )
    except Exception:  # pandas Styler needs jinja2; the plain table shows the same facts
        return table.to_html(index=False)


class ShortTable:
    """A long table shown as its first ``rows`` rows, the complete table one click away.

    In Jupyter the HTML shows the first rows and puts every row behind a "show all" toggle; as text (a
    terminal, ``print``, the GPU report) it is the whole table, so nothing is lost.
    """

    def __init__(self, table, rows: int = 10, what: str = "rows"):
        self.table, self.rows, self.what = table, rows, what

    def _repr_html_(self) -> str:
        head = _highlighted_html(self.table.head(self.rows))
        if len(self.table) <= self.rows:
            return head
        return (
            f"{head}<details><summary>show all {len(self.table)} {html.escape(self.what)}</summary>"
            f"{_highlighted_html(self.table)}</details>"
        )

    def __repr__(self) -> str:
        return self.table.to_string(index=False)


def policy_view(table, rows: int = 10) -> ShortTable:
    """The policy table for a lesson: the first ``rows`` ops (those that differ from CUDA's lists come first)
    with the rows that differ highlighted, and every op behind a toggle. The ``inputs`` column is left out:
    the op's label says what it was fed (``h`` a low-precision activation, ``x`` an FP32 input)."""
    return ShortTable(table.drop(columns=["inputs"]), rows=rows, what="ops")


def _as_device(device) -> torch.device:
    try:
        return torch.device(device)
    except (RuntimeError, TypeError):
        raise ValueError(
            f"device={device!r} is not a torch device; pass env.device, 'cpu' or 'cuda'."
        ) from None


def parameter_dtypes(model: torch.nn.Module) -> dict:
    """``{parameter name: dtype}``, to show that autocast leaves the FP32 parameters alone."""
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"parameter_dtypes expects an nn.Module, not {type(model).__name__}.")
    return {name: dtype_name(p.dtype) for name, p in model.named_parameters()}
