"""Lesson 00's warm-up check: a matmul under autocast, written by the learner.

It is small on purpose (the lesson is about how checks behave), but it is honest: it runs the
learner's function on real tensors in both autocast dtypes and names the usual first mistakes.
"""

from __future__ import annotations

import torch

from amp_lessons.checks.harness import call_learner, checker, failed, passed
from amp_lessons.core.autocast_state import OpDtypeRecorder, autocast_enabled, dtype_name, switch_autocast_off

# Tensor methods that cast by hand, bypassing autocast's per-op policy.
HAND_CASTS = {"half", "bfloat16", "float", "to", "type"}


@checker("00 warm-up: autocast_matmul")
def check_autocast_matmul(autocast_matmul):
    """``autocast_matmul(a, b, dtype)`` must return ``a @ b`` computed under ``torch.autocast`` in dtype."""
    generator = torch.Generator().manual_seed(0)
    a = torch.randn(4, 3, generator=generator)
    b = torch.randn(3, 5, generator=generator)
    for dtype in (torch.bfloat16, torch.float16):
        with OpDtypeRecorder() as ops:
            got = call_learner(autocast_matmul, a.clone(), b.clone(), dtype)
        casts = sorted({call.name for call in ops.calls} & HAND_CASTS)
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
    return passed("Both float16 and bfloat16 come out of the matmul, chosen by autocast, not by hand.")
