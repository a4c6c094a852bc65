"""Lesson 08: the numerics around a real training loop: an "FP32" reference that may be TF32, losses and
ops that autocast must not touch, ``torch.compile`` under autocast, and normalisation ``eps`` in FP16.

- **TF32.** On NVIDIA GPUs since Ampere a float32 matmul may run on Tensor Cores in TF32: FP32's 8 exponent
  bits, but only 10 mantissa bits for the multiplied values (the products are summed in FP32). Whether it does
  is a switch (``torch.set_float32_matmul_precision``, ``torch.backends.cuda.matmul.allow_tf32``,
  ``torch.backends.cudnn.allow_tf32``), so a reference can silently lose three decimal digits.
  :class:`EmulatedTF32` rounds the inputs of every float32 matmul to TF32 on any device, so the effect on
  scores and decisions can be seen on a laptop; :func:`fp32_reference_settings` pins the real switches.
- **BCE.** ``sigmoid`` then ``binary_cross_entropy`` rounds the probability first: in FP16 ``sigmoid(9)`` is
  exactly 1.0, and ``log(1 - 1.0)`` is clamped to -100. ``binary_cross_entropy_with_logits`` never forms
  the probability, which is why CUDA autocast refuses ``BCELoss`` outright.
- **eps.** 1e-12 is below half of FP16's smallest subnormal (2^-25 ~ 3e-8): stored in FP16 it is 0, and a
  normalisation of an all-zero row divides 0 by 0.
- **torch.compile** needs a C/C++ compiler on a CPU (and Triton on a GPU); :func:`first_call` times the
  first call (where compilation happens) and reports *why* when it fails, so a lesson can move on.
"""

from __future__ import annotations

import contextlib
import shutil
import time

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from amp_lessons.core.environment import float32_matmul_settings

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


@contextlib.contextmanager
def _float32_matmuls(precision: str, cudnn_tf32: bool):
    """Set the float32 matmul precision and cuDNN's TF32 switch; yields the settings, restores them after."""
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
    """Pin true FP32 matmuls and convolutions for a reference run; yields the settings, restores them after.

    Sets ``torch.set_float32_matmul_precision("highest")`` (no TF32 for matmuls; the one switch that works on
    every torch 2.x without mixing old and new APIs) and ``torch.backends.cudnn.allow_tf32 = False`` (its
    default is True). Record the yielded dict with the baseline, so a later run can prove it used the same.
    """
    return _float32_matmuls("highest", cudnn_tf32=False)


def real_tf32():
    """Let CUDA float32 matmuls and convolutions use TF32 (``'high'``); restores the settings after."""
    return _float32_matmuls("high", cudnn_tf32=True)


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

    Hand-written ops are not on any autocast list: they run in whatever dtype their input has, so an
    FP16 activation is normalised in FP16, and ``eps`` is rounded to FP16 before it is added.
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


def first_call(fn, *args, **kwargs):
    """Call ``fn`` once and time it: ``(result, seconds, error)``; ``error`` is '' or why it failed.

    For a ``torch.compile``d function the first call is where tracing and code generation happen.
    """
    began = time.perf_counter()
    try:
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

        explained = dynamo.explain(fn)(*args)
    except Exception as exc:
        return None, None, [f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"]
    reasons = []
    for item in getattr(explained, "break_reasons", []):
        text = str(getattr(item, "reason", item)).strip().splitlines()
        reasons.append(text[0] if text else "")
    return explained.graph_count, explained.graph_break_count, reasons
