"""Lesson 00's warm-up check: a matmul under autocast, written by the learner.

It is small on purpose (the lesson is about how checks behave), but it is honest: it runs the learner's
function on real tensors in both autocast dtypes and names the usual first mistakes. Everything is judged by
what the function does, never by its source text:

- a *hand cast* is a call that changed a tensor's dtype (``a.half()``, ``(a @ b).to(dtype)``); a no-op such as
  ``a.float()`` on FP32 inputs or ``a.to(a.device)`` is not one;
- a last case hands the function tensors that report a CUDA device (``CudaLabelled``, also 03.1's: CPU
  numbers, CUDA label) and records, at the matmul, which device's autocast was switched on and in which
  dtype: a function that hard-codes ``device_type="cpu"`` is seen switching on the wrong one.
"""

from __future__ import annotations

import warnings

import torch

from amp_lessons.checks.harness import call_learner, checker, failed, passed
from amp_lessons.core.autocast_state import (
    OpDtypeRecorder,
    autocast_enabled,
    dtype_name,
    switch_autocast_off,
)
from amp_lessons.core.cuda_labelled import CudaLabelled
from amp_lessons.l00_start_here.spies import AutocastAtMatmul

# Tensor methods that cast by hand, bypassing autocast's per-op policy (named in messages when they changed a
# dtype).
HAND_CASTS = {"half", "bfloat16", "float", "to", "type"}


def real_casts(ops: OpDtypeRecorder) -> list:
    """The names of the calls that changed a floating-point tensor's dtype (a no-op ``.float()`` is none)."""
    names = set()
    for call in ops.calls:
        if call.name in HAND_CASTS and any(d != call.output_dtype for d in call.input_dtypes):
            names.add(call.name)
    return sorted(names)


def _cuda_labelled_case(autocast_matmul, a, b):
    """Run the function on tensors that report a CUDA device, in BF16; a failed result, or None."""
    dtype = torch.bfloat16
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with AutocastAtMatmul(caught) as seen:
            got = call_learner(
                autocast_matmul, a.as_subclass(CudaLabelled), b.as_subclass(CudaLabelled), dtype
            )
    if autocast_enabled("cpu") or autocast_enabled("cuda"):
        switch_autocast_off()
        return failed(
            "Autocast is still switched on after your function returned: use it as `with torch.autocast(...):`."
        )
    if not isinstance(got, torch.Tensor) or tuple(got.shape) != (4, 5):
        return failed(
            "On tensors on a CUDA device your function did not return the [4, 5] tensor `a @ b` it returns on "
            "the CPU: take everything from the inputs (`a.device.type`), nothing from a fixed device."
        )
    if any(s["cpu"] for s in seen.seen):
        return failed(
            "On tensors on a CUDA device (a.device.type == 'cuda') your function switched on autocast for the "
            "CPU: on a GPU that autocast does nothing, and the matmul runs in FP32. Take the device type from "
            "the data: `torch.autocast(device_type=a.device.type, dtype=dtype)`."
        )
    if not any(s["cuda"] and s["cuda_dtype"] == dtype for s in seen.seen):
        return failed(
            "On tensors on a CUDA device (a.device.type == 'cuda') the matmul did not run under CUDA autocast "
            f"in {dtype}: take the device type from the data, "
            "`torch.autocast(device_type=a.device.type, dtype=dtype)`."
        )
    if not torch.allclose(
        torch.Tensor.float(got).cpu().as_subclass(torch.Tensor), a @ b, rtol=2e-2, atol=2e-2
    ):
        return failed("On tensors on a CUDA device the values are not `a @ b`.")
    return None


@checker("00 warm-up: autocast_matmul")
def check_autocast_matmul(autocast_matmul):
    """``autocast_matmul(a, b, dtype)`` must return ``a @ b`` computed under ``torch.autocast`` in dtype."""
    generator = torch.Generator().manual_seed(0)
    a = torch.randn(4, 3, generator=generator)
    b = torch.randn(3, 5, generator=generator)
    for dtype in (torch.bfloat16, torch.float16):
        with OpDtypeRecorder() as ops:
            got = call_learner(autocast_matmul, a.clone(), b.clone(), dtype)
        casts = real_casts(ops)
        if not isinstance(got, torch.Tensor):
            return failed(f"autocast_matmul returned a {type(got).__name__}; return the tensor `a @ b`.")
        if autocast_enabled("cpu"):
            switch_autocast_off()
            return failed(
                "Autocast is still switched on after your function returned: use it as "
                "`with torch.autocast(...):`."
            )
        if got.shape != (4, 5):
            return failed(f"The result has shape {tuple(got.shape)}; a [4, 3] @ [3, 5] product is [4, 5].")
        if casts and got.dtype != torch.float32:
            return failed(
                f"Your function casts by hand ({', '.join(casts)}). Let autocast choose: "
                "wrap the matmul in `with torch.autocast(device_type=a.device.type, dtype=dtype):`."
            )
        if got.dtype == torch.float32 and not torch.allclose(got, a @ b, rtol=2e-2, atol=2e-2):
            return failed(
                "The values are not `a @ b` (did you transpose or scale something, "
                "or compute another product?)."
            )
        ran_low = any(call.output_dtype == dtype_name(dtype) for call in ops.matmuls)
        if got.dtype == torch.float32 and casts and ran_low:
            return failed(
                f"The matmul did run in {dtype} under autocast, but you cast the result back to float32 "
                f"({', '.join(casts)}). Return the tensor autocast gives you: its dtype is the point."
            )
        if got.dtype == torch.float32:
            return failed(
                f"For dtype={dtype} the result is still float32, so autocast was not active for this op. Is "
                "the matmul inside `with torch.autocast(device_type=a.device.type, dtype=dtype):`, and does "
                "device_type match the tensors' device ('cpu' here)?"
            )
        if got.dtype != dtype:
            return failed(
                f"For dtype={dtype} the result came out as {got.dtype}: pass the `dtype` argument "
                "to autocast instead of a fixed one."
            )
        with torch.autocast(device_type="cpu", dtype=dtype):
            expected = a @ b
        if not torch.equal(got, expected):
            return failed(
                "The dtype is right but the values are not `a @ b` (did you transpose or scale something?)."
            )
    problem = _cuda_labelled_case(autocast_matmul, a, b)
    if problem is not None:
        return problem
    return passed("Both float16 and bfloat16 come out of the matmul, chosen by autocast, not by hand.")
