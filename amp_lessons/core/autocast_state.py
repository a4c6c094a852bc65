"""Core: what autocast is doing right now — is it on, in which dtype, and which dtype each op really ran in.

Lessons 00, 03, 05 and 08 and their checkers all need to ask these questions, so they live here, below every
lesson helper. ``OpDtypeRecorder`` watches ops through a ``TorchFunctionMode``: it sees each call *before*
autocast rewrites it and the result *after*, so the output dtype it records is the precision the op really
ran in (float16 for a matmul under float16 autocast even when its inputs were float32).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch
from torch.overrides import TorchFunctionMode

from amp_lessons.core.environment import dtype_name

MATMUL_LIKE = frozenset(
    {
        "matmul",
        "__matmul__",
        "__rmatmul__",
        "mm",
        "bmm",
        "linear",
        "addmm",
        "baddbmm",
        "addbmm",
        "einsum",
        "conv1d",
        "conv2d",
        "conv3d",
        "conv_transpose1d",
        "conv_transpose2d",
        "conv_transpose3d",
        "bilinear",
    }
)


def autocast_enabled(device_type: str) -> bool:
    """Is autocast active for ``device_type`` right now (works on torch 2.4 and newer)?"""
    try:
        return bool(torch.is_autocast_enabled(device_type))
    except TypeError:  # torch < 2.4
        return bool(torch.is_autocast_cpu_enabled() if device_type == "cpu" else torch.is_autocast_enabled())
    except RuntimeError:  # a device type this build does not know
        return False


def autocast_dtype(device_type: str):
    """The dtype autocast would use for ``device_type`` right now."""
    try:
        return torch.get_autocast_dtype(device_type)
    except (AttributeError, TypeError, RuntimeError):  # torch < 2.4
        return torch.get_autocast_cpu_dtype() if device_type == "cpu" else torch.get_autocast_gpu_dtype()


# What a bare torch.autocast(device_type) uses in a fresh process.
DEFAULT_AUTOCAST_DTYPES = {"cpu": torch.bfloat16, "cuda": torch.float16}


def set_autocast_dtype(device_type: str, dtype) -> None:
    """Make ``dtype`` the dtype a bare ``torch.autocast(device_type)`` uses (what entering autocast changes)."""
    try:
        torch.set_autocast_dtype(device_type, dtype)
    except (AttributeError, TypeError, RuntimeError):  # torch < 2.4
        if device_type == "cpu":
            torch.set_autocast_cpu_dtype(dtype)
        else:
            torch.set_autocast_gpu_dtype(dtype)


def switch_autocast_off() -> None:
    """Undo an autocast a learner entered and never left, so later runs are not contaminated.

    Leaving it on would also keep autocast's cache of low-precision weight copies alive, and later forward
    passes would reuse copies of weights the optimizer has since changed.
    """
    for device_type, default in DEFAULT_AUTOCAST_DTYPES.items():
        if (
            autocast_dtype(device_type) != default
        ):  # entering autocast set it; a fresh process has the default
            set_autocast_dtype(device_type, default)
        if autocast_enabled(device_type):
            try:
                torch.set_autocast_enabled(device_type, False)
            except TypeError:  # torch < 2.4
                if device_type == "cpu":
                    torch.set_autocast_cpu_enabled(False)
                else:
                    torch.set_autocast_enabled(False)
    with contextlib.suppress(Exception):
        depth = torch.autocast_increment_nesting() - 1  # read the nesting depth without changing it
        torch.autocast_decrement_nesting()
        for _ in range(max(depth, 0)):
            torch.autocast_decrement_nesting()
    torch.clear_autocast_cache()


def float_tensors(obj, depth: int = 0):
    """Every floating-point tensor inside a (nested) tuple/list/dict."""
    if depth > 6:
        return
    if isinstance(obj, torch.Tensor):
        if obj.is_floating_point() or obj.is_complex():
            yield obj
    elif isinstance(obj, (list, tuple)):
        for item in obj:
            yield from float_tensors(item, depth + 1)
    elif isinstance(obj, dict):
        for item in obj.values():
            yield from float_tensors(item, depth + 1)


@dataclass
class OpCall:
    """One torch function call seen by ``OpDtypeRecorder``."""

    name: str
    input_dtypes: tuple
    output_dtype: str
    autocast: bool
    finite: bool
    shape: tuple = ()

    @property
    def matmul_like(self) -> bool:
        return self.name in MATMUL_LIKE


class OpDtypeRecorder(TorchFunctionMode):
    """Records every torch function that returns a floating-point tensor: name, input/output dtypes, finite?

    A ``TorchFunctionMode`` sees each call *before* autocast rewrites it, and the result *after*: the
    output dtype is the precision the op really ran in (float16 for a matmul under float16 autocast even
    when its inputs were float32). Use as ``with OpDtypeRecorder() as ops: ...`` and read ``ops.calls``.
    """

    def __init__(self, device_type: str = "cpu"):
        super().__init__()
        self.device_type = device_type
        self.calls: list[OpCall] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        result = func(*args, **(kwargs or {}))
        if isinstance(result, torch.Tensor) and result.is_floating_point():
            name = getattr(func, "__name__", str(func))
            inputs = tuple(dtype_name(t.dtype) for t in float_tensors((args, kwargs or {})))
            with torch.no_grad():
                finite = bool(torch.isfinite(result).all())
            on = autocast_enabled(self.device_type)
            self.calls.append(OpCall(name, inputs, dtype_name(result.dtype), on, finite, tuple(result.shape)))
        return result

    @property
    def matmuls(self) -> list:
        return [c for c in self.calls if c.matmul_like]

    def table(self):
        import pandas as pd

        return pd.DataFrame([vars(c) for c in self.calls])
