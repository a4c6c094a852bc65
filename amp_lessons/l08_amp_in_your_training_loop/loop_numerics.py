"""Lesson 08: the numerics around a real training loop: an "FP32" reference that may be TF32, losses and
ops that autocast must not touch, ``torch.compile`` under autocast, and normalisation ``eps`` in FP16.

- **TF32.** On NVIDIA GPUs since Ampere a float32 matmul may run on Tensor Cores in TF32: FP32's 8 exponent
  bits, but only 10 mantissa bits for the multiplied values (the products are summed in FP32). Whether it does
  is a switch (torch 2.9 and later: ``torch.backends.cuda.matmul.fp32_precision`` and its siblings for
  cuDNN and oneDNN; before: the legacy ``torch.set_float32_matmul_precision`` and ``allow_tf32``), so a
  reference can silently lose three decimal digits.
  :class:`EmulatedTF32` rounds the inputs of every float32 matmul to TF32 on any device, so the effect on
  scores and decisions can be seen on a laptop; :func:`fp32_reference_settings` pins the real switches.
- **BCE.** ``sigmoid`` then ``binary_cross_entropy`` rounds the probability first: in FP16 ``sigmoid(9)`` is
  exactly 1.0, and ``log(1 - 1.0)`` is clamped to -100. ``binary_cross_entropy_with_logits`` never forms
  the probability, which is why CUDA autocast refuses ``BCELoss`` outright.
- **eps.** 1e-12 is below half of FP16's smallest subnormal (2^-25 ~ 3e-8): stored in FP16 it is 0, and a
  normalisation of an all-zero row computed in FP16 divides 0 by 0 (a ``.half()`` model, CPU autocast, or a
  norm built from ops on no autocast FP32 list; CUDA autocast runs ``pow``/``rsqrt`` in FP32).
- **torch.compile** needs a C/C++ compiler on a CPU (and Triton on a GPU); :func:`first_call` times the
  first call (where compilation happens) and reports *why* when it fails, so a lesson can move on. Tracing
  and compiling log warnings that are expected here (a graph break where the lesson puts one, "no CUDA
  runtime" on a CPU-only machine); :func:`expected_compile_messages` catches them and says in one line what
  they mean, instead of a 20-line log block.
"""

from __future__ import annotations

import contextlib
import io
import logging
import shutil
import time
import warnings

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from amp_lessons.core.environment import (
    FP32_PRECISION_OPS,
    float32_matmul_settings,
    fp32_precision_backend,
    has_fp32_precision_api,
)

# ------------------------------------------------------------------------------------------------ TF32

TF32_MANTISSA_BITS = 10
_DROPPED_BITS = 23 - TF32_MANTISSA_BITS  # float32 has 23 stored mantissa bits
# which positional arguments of each matmul-like function are multiplied together
_MULTIPLIED = {
    "linear": (0, 1),
    "matmul": (0, 1),
    "__matmul__": (0, 1),
    "__rmatmul__": (0, 1),
    "mm": (0, 1),
    "bmm": (0, 1),
    "addmm": (1, 2),
    "baddbmm": (1, 2),
    "addbmm": (1, 2),
    "conv1d": (0, 1),
    "conv2d": (0, 1),
    "conv3d": (0, 1),
}


def round_to_tf32(x: torch.Tensor) -> torch.Tensor:
    """``x`` (float32) rounded to TF32's 10 mantissa bits, kept in a float32 tensor.

    Round to nearest, ties away from zero (what NVIDIA's ``cvt.rna.tf32.f32`` does); inf and NaN pass
    through. Works on the bit pattern: add half of the dropped part, then clear the 13 dropped bits.
    """
    if x.dtype != torch.float32:
        raise TypeError(f"round_to_tf32 expects a float32 tensor, got {x.dtype}")
    bits = x.contiguous().view(torch.int32)
    rounded = ((bits + (1 << (_DROPPED_BITS - 1))) & ~((1 << _DROPPED_BITS) - 1)).view(torch.float32)
    return torch.where(torch.isfinite(x), rounded, x)


class EmulatedTF32(TorchFunctionMode):
    """Inside ``with EmulatedTF32():`` every float32 matmul/linear/conv multiplies TF32-rounded inputs.

    The products are then summed in float32, as Tensor Cores do, so this reproduces TF32's input rounding
    (the part that costs precision) on any device. ``calls`` counts the matmuls it rounded.
    """

    def __init__(self):
        super().__init__()
        self.calls = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        positions = _MULTIPLIED.get(getattr(func, "__name__", ""))
        if positions and len(args) > max(positions):
            args = list(args)
            for i in positions:
                if isinstance(args[i], torch.Tensor) and args[i].dtype == torch.float32:
                    args[i] = round_to_tf32(args[i])
                    self.calls += 1
            args = tuple(args)
        return func(*args, **kwargs)


# the new-API precision real_tf32 sets: TF32 for CUDA matmuls and cuDNN; oneDNN (CPU) left as it is
_TF32_PRECISIONS = {"cuda.matmul": "tf32", "cudnn.conv": "tf32", "cudnn.rnn": "tf32"}


@contextlib.contextmanager
def _new_api_precision(precisions: dict):
    """Set ``fp32_precision`` of each backend/op in ``precisions`` (torch >= 2.9) and restore every one after.

    Only the new API is touched: reading or setting a legacy switch here would mix the two, which torch refuses.
    """
    backends = {path: fp32_precision_backend(path) for path in precisions}
    backends = {path: backend for path, backend in backends.items() if backend is not None}
    previous = {path: backend.fp32_precision for path, backend in backends.items()}
    try:
        for path, backend in backends.items():
            backend.fp32_precision = precisions[path]
        yield float32_matmul_settings()
    finally:
        for path, backend in backends.items():
            backend.fp32_precision = previous[path]


@contextlib.contextmanager
def _legacy_precision(precision: str, cudnn_tf32: bool):
    """torch < 2.9: set the float32 matmul precision and cuDNN's TF32 switch; restore them after."""
    previous_precision = torch.get_float32_matmul_precision()
    previous_cudnn = torch.backends.cudnn.allow_tf32
    torch.set_float32_matmul_precision(precision)
    torch.backends.cudnn.allow_tf32 = cudnn_tf32
    try:
        yield float32_matmul_settings()
    finally:
        torch.set_float32_matmul_precision(previous_precision)
        torch.backends.cudnn.allow_tf32 = previous_cudnn


def fp32_reference_settings():
    """Pin true FP32 matmuls, convolutions and RNNs for a reference run; yields the settings, restores them after.

    torch 2.9 and later: ``torch.backends.<backend>.<op>.fp32_precision = "ieee"`` for CUDA matmuls, cuDNN
    convolutions and RNNs (their default is ``"tf32"``) and oneDNN's matmuls, convolutions and RNNs on the CPU
    (``set_float32_matmul_precision("medium")`` makes oneDNN matmuls BF16 on CPUs with BF16 instructions).
    Older torch: the legacy ``torch.set_float32_matmul_precision("highest")`` and
    ``torch.backends.cudnn.allow_tf32 = False``. It uses the API the installed torch has and never both.
    Record the yielded dict with the baseline, so a later run can prove it used the same.
    """
    if has_fp32_precision_api():
        return _new_api_precision({path: "ieee" for path, _ in FP32_PRECISION_OPS})
    return _legacy_precision("highest", cudnn_tf32=False)


def real_tf32():
    """Let CUDA float32 matmuls, cuDNN convolutions and RNNs use TF32; restores the settings after.

    torch 2.9 and later: ``fp32_precision = "tf32"`` for ``cuda.matmul``, ``cudnn.conv`` and ``cudnn.rnn``;
    older torch: the legacy ``set_float32_matmul_precision("high")`` and ``cudnn.allow_tf32 = True``.
    """
    if has_fp32_precision_api():
        return _new_api_precision(_TF32_PRECISIONS)
    return _legacy_precision("high", cudnn_tf32=True)


def spacing_table(values=(1.0, 1.0003, 3.14159265, 1000.1)):
    """How FP32, TF32 (emulated), BF16 and FP16 store a few numbers: the cost of 10 mantissa bits."""
    import pandas as pd

    x = torch.tensor(values, dtype=torch.float32)
    return pd.DataFrame(
        {
            "value": list(values),
            "float32": x.tolist(),
            "TF32 (10 mantissa bits)": round_to_tf32(x).tolist(),
            "bfloat16 (7 bits)": x.to(torch.bfloat16).float().tolist(),
            "float16 (10 bits, 5-bit exponent)": x.to(torch.float16).float().tolist(),
        }
    )


# ------------------------------------------------------------------------------------------------ BCE


def bce_table(logits, target: float = 0.0, dtype=torch.float16):
    """Per logit: the exact BCE, BCE on a ``dtype`` probability, and BCE-with-logits on ``dtype`` logits.

    The exact value is ``softplus(z)`` for target 0 (``softplus(-z)`` for target 1), in float64. The second
    column is what ``sigmoid`` then ``BCELoss`` gives when the logits come out of an autocast region in
    ``dtype`` (the probability is rounded before the log); the third keeps the log inside the loss.
    """
    import pandas as pd

    z = torch.as_tensor(logits, dtype=torch.float64)
    t = torch.full_like(z, float(target))
    exact = F.binary_cross_entropy_with_logits(z, t, reduction="none")
    low = z.to(dtype)
    probability = torch.sigmoid(low)
    via_probability = F.binary_cross_entropy(probability.float(), t.float(), reduction="none")
    with_logits = F.binary_cross_entropy_with_logits(low.float(), t.float(), reduction="none")
    return pd.DataFrame(
        {
            "logit": z.tolist(),
            f"sigmoid in {str(dtype).replace('torch.', '')}": probability.float().tolist(),
            "exact loss": exact.tolist(),
            "BCELoss(sigmoid(z))": via_probability.tolist(),
            "BCEWithLogitsLoss(z)": with_logits.tolist(),
        }
    )


def plot_bce(tables: dict, ax=None):
    """Loss against logit (target 0) for each dtype's table from :func:`bce_table`."""
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(7, 3.6))
    first = next(iter(tables.values()))
    ax.plot(first["logit"], first["exact loss"], color="black", linewidth=2.5, alpha=0.35, label="exact")
    for (name, table), colour in zip(tables.items(), ("#ef6c00", "#2e7d32", "#1565c0")):
        ax.plot(table["logit"], table["BCELoss(sigmoid(z))"], color=colour, label=f"BCELoss(sigmoid), {name}")
        ax.plot(
            table["logit"], table["BCEWithLogitsLoss(z)"], "--", color=colour, label=f"with logits, {name}"
        )
    ax.set_yscale("log")
    ax.set_xlabel("logit z (target 0)")
    ax.set_ylabel("loss (log scale)")
    ax.set_title("sigmoid rounds to 1.0, then log(1 - p) is clamped at -100")
    ax.legend(fontsize=8)
    return ax


# ------------------------------------------------------------------------------------------------ eps


def stored_eps(values=(1e-12, 1e-8, 1e-6, 1e-5)):
    """How common normalisation eps values are stored in FP16 and BF16 (0 means: no protection at all)."""
    import pandas as pd

    rows = []
    for value in values:
        rows.append(
            {
                "eps": value,
                "in float16": torch.tensor(value, dtype=torch.float16).item(),
                "in bfloat16": torch.tensor(value, dtype=torch.bfloat16).item(),
            }
        )
    return pd.DataFrame(rows)


def rms_norm(x: torch.Tensor, eps: float) -> torch.Tensor:
    """A hand-written RMS normalisation, ``x / sqrt(mean(x**2) + eps)``, computed in ``x``'s dtype.

    Its ops (``*``, ``mean``, ``sqrt``, ``/``) are on no autocast FP32 list, so an FP16 activation is normalised
    in FP16 under any autocast (and in a ``.half()`` model), and ``eps`` is rounded to FP16 before it is added.
    A norm built from ``pow``/``rsqrt`` differs: CUDA autocast runs those in FP32, CPU autocast does not.
    """
    eps_tensor = torch.tensor(eps, dtype=x.dtype, device=x.device)
    return x / torch.sqrt((x * x).mean(dim=-1, keepdim=True) + eps_tensor)


# ------------------------------------------------------------------------------------------ torch.compile


def compiler_status() -> tuple[bool, str]:
    """Can inductor (torch.compile's default backend) build code here? ``(likely, reason)``, no compiling.

    On a CPU it writes C++ and needs a compiler (``g++``/``clang++``/``cl``); on a GPU it needs Triton.
    The real test is still the first compiled call (see :func:`first_call`).
    """
    compilers = [name for name in ("g++", "c++", "clang++", "cl") if shutil.which(name)]
    if torch.cuda.is_available():
        try:
            import triton  # noqa: F401
        except ImportError:
            return False, "no Triton (inductor generates Triton kernels for CUDA)"
    if not compilers:
        return False, "no C++ compiler on PATH (inductor compiles generated C++ for the CPU parts)"
    return True, f"C++ compiler found: {compilers[0]}"


# What the messages torch.compile logs while it traces and compiles mean, for the one-line summary.
COMPILE_MESSAGES = (
    ("Graph break", "a graph break: dynamo ended the graph at a Python decision on a tensor's value"),
    ("No CUDA runtime", "no CUDA runtime here, so inductor generates C++ for the CPU"),
    ("TensorFloat32", "TF32 is available but off, so float32 matmuls stay float32"),
    ("recompil", "a recompile: a guard (shape, dtype, autocast state) changed"),
    ("cache_size_limit", "too many recompiles of one function, so dynamo runs it eagerly from now on"),
)


def explain_compile_message(text: str) -> str:
    """What one logged message means, in a few words (its first line when it is not a known one)."""
    for start, meaning in COMPILE_MESSAGES:
        if start.lower() in text.lower():
            return meaning
    first = text.strip().splitlines()[0] if text.strip() else ""
    return first if len(first) <= 100 else first[:97] + "..."


def compile_summary(messages) -> str:
    """One line for the messages caught while compiling ('' when there were none)."""
    meanings = list(dict.fromkeys(explain_compile_message(m) for m in messages))
    if not meanings:
        return ""
    count = len(messages)
    return (
        f"(torch.compile logged {count} expected message{'s' if count != 1 else ''}, not shown: "
        + "; ".join(meanings)
        + ".)"
    )


class _Keep(logging.Handler):
    def __init__(self, into: list):
        super().__init__(level=logging.WARNING)
        self.into = into

    def emit(self, record):
        self.into.append(record.getMessage())


@contextlib.contextmanager
def expected_compile_messages(show=print):
    """Catch what torch's loggers, ``warnings`` and stderr prints emit inside the block, then ``show`` one line.

    torch attaches its own handlers to its loggers (``torch``, ``torch._dynamo``, ...); inside the block
    they hand their records to a list instead of printing them, and are put back afterwards.
    """
    caught: list = []
    keep = _Keep(caught)
    names = ["torch", *(name for name in logging.root.manager.loggerDict if name.startswith("torch."))]
    swapped = []
    for name in names:
        logger = logging.getLogger(name)
        if logger.handlers or name == "torch":
            swapped.append((logger, list(logger.handlers)))
            logger.handlers = [keep]
    printed = (
        io.StringIO()
    )  # some releases print() their notes to stderr instead (torch 2.4: "No CUDA runtime")
    try:
        with warnings.catch_warnings(record=True) as warned, contextlib.redirect_stderr(printed):
            warnings.simplefilter("always")
            yield caught
        caught.extend(str(w.message) for w in warned)
    finally:
        for logger, handlers in swapped:
            logger.handlers = handlers
        caught.extend(line for line in printed.getvalue().splitlines() if line.strip())
    line = compile_summary(caught)
    if line and show is not None:
        show(line)


def first_call(fn, *args, **kwargs):
    """Call ``fn`` once and time it: ``(result, seconds, error)``; ``error`` is '' or why it failed.

    For a ``torch.compile``d function the first call is where tracing and code generation happen; what it
    logs on the way is summarised in one line (:func:`expected_compile_messages`).
    """
    began = time.perf_counter()
    try:
        with expected_compile_messages():
            result = fn(*args, **kwargs)
    except Exception as exc:  # no compiler, an unsupported Python, a backend bug: say so and move on
        text = str(exc).strip().splitlines()
        return None, time.perf_counter() - began, f"{type(exc).__name__}: {text[0][:200] if text else ''}"
    return result, time.perf_counter() - began, ""


def graph_breaks(fn, *args):
    """``(graphs, breaks, reasons)`` dynamo finds when it traces ``fn(*args)`` (cheap: no code generation).

    Runs ``fn`` once (eagerly, under the tracer). ``(None, None, [why])`` when tracing is not possible.
    """
    try:
        import torch._dynamo as dynamo

        with expected_compile_messages():
            explained = dynamo.explain(fn)(*args)
    except Exception as exc:
        return None, None, [f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"]
    reasons = []
    for item in getattr(explained, "break_reasons", []):
        text = str(getattr(item, "reason", item)).strip().splitlines()
        reasons.append(text[0] if text else "")
    return explained.graph_count, explained.graph_break_count, reasons
