"""Lesson 05's helper that runs *beside the learner's code*: it must be importable where that code runs.

05.2 judges which op of the learner's ``texture_forward`` ran in which precision. When a class is graded, the
learner's function lives in a sandboxed kernel that cannot import checkers (``check.py`` holds the reference
computations), and what comes back from there is a claim of the learner's code. So the checker asks the kernel
for a TRACE (``amp_lessons.l05_nan_debugging.trace``): :func:`trace_texture_forward` runs the forward once
under an :class:`~amp_lessons.l05_nan_debugging.trace.OpTrace`, with the autocast watcher (and, when asked,
the pretend GPU) of ``cases``, and returns every op, its inputs, states and results as plain data. The checker
then replays the trace on its own ``x`` and parameters and judges only what it computed itself. This module
judges nothing and holds no reference value. In self-study it runs in the notebook's own process, the same way.
"""

from __future__ import annotations

import torch

from amp_lessons.checks.harness import LearnerProblem, call_learner
from amp_lessons.core.autocast_state import MATMUL_LIKE, autocast_enabled
from amp_lessons.core.environment import dtype_name
from amp_lessons.l05_nan_debugging import cases
from amp_lessons.l05_nan_debugging.trace import OpTrace

# A value the learner's function may return as it is (anything else comes back as its type's name).
_PLAIN = (type(None), bool, int, float, str)


def _returned(tracer: OpTrace, got) -> dict:
    """What the learner's function returned: a tensor by its reference in the trace (and its value), a plain
    value as it is, anything else by its type's name."""
    if isinstance(got, torch.Tensor):
        return {
            "ref": tracer.reference(got),
            "value": got.detach().clone().as_subclass(torch.Tensor),
            "type": type(got).__name__,
        }
    if type(got) in _PLAIN:
        return {"plain": got, "type": type(got).__name__}
    return {"type": type(got).__name__}


def _autocasts(entered) -> list:
    return [
        [str(a.device_type), bool(a.enabled), dtype_name(a.dtype) if a.dtype else None, bool(a.dtype_given)]
        for a in entered
    ]


def trace_texture_forward(texture_forward, model, x, *, autocast: bool, gpu: bool = False) -> dict:
    """Run ``texture_forward(model, x)`` once under CPU float16 autocast (``autocast``; on a pretend GPU with
    ``gpu``, the autocast then playing CUDA's), tracing every op. Returns plain data:

    ``trace`` (``OpTrace.as_data()``), ``result`` (what the function returned), ``entered`` (each autocast
    it entered: device type, enabled, dtype, dtype given), ``autocast_after`` (was CPU autocast on when it
    returned), ``problem`` (``{"status", "message"}`` when the call stopped the check: an error, a stub) with
    ``matmul_dtypes`` (the dtypes its matrix products produced until then), and ``raised`` (on the pretend
    GPU, where an error is not the learner's mistake but means "nothing to say").
    """
    x = x.clone()
    roles = {id(x): "x"}
    roles.update({id(parameter): f"param:{name}" for name, parameter in model.named_parameters()})
    tracer = OpTrace(roles)
    report = {"problem": None, "raised": False, "entered": [], "autocast_after": None, "result": None}
    try:
        with torch.autocast(device_type="cpu", dtype=torch.float16, enabled=autocast or gpu):
            if gpu:
                with cases.pretend_gpu() as entered, tracer:
                    got = texture_forward(model, x)
            else:
                with tracer, cases.watch_autocast() as entered:
                    got = call_learner(texture_forward, model, x, what="`texture_forward`")
            report["autocast_after"] = autocast_enabled("cpu")
    except LearnerProblem as problem:
        report["problem"] = {"status": problem.result.status, "message": problem.result.message}
        report["matmul_dtypes"] = [
            dtype_name(value.dtype)
            for op in tracer.ops
            if op["fn"][1] in MATMUL_LIKE
            for _, value in op["outputs"][:1]
        ]
        return report
    except Exception:  # noqa: BLE001  (only on the pretend GPU: call_learner turns errors into problems)
        report["raised"] = True
        return report
    report["entered"] = _autocasts(entered)
    report["result"] = _returned(tracer, got)
    report["trace"] = tracer.as_data()
    return report
