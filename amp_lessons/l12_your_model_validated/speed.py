"""Lesson 12: speed and memory, measured last and only for the dtypes whose numbers held (lesson 07).

Why only then: a faster step that changes the decisions is not a gain. The step timed is the trial's own
training step (or the forward pass when the recipe has no training data), on one fixed batch, with lesson 07's
``measure`` (warm-up, synchronisation, repeats, median and spread) and its ``conclusions`` (a speed-up is claimed
only when it beats the spread). Memory is what autograd saves for backward (lesson 07's ``saved_tensor_report``,
on every device) and, on a GPU, the allocator's peak during the timed repeats; a CPU has no per-variant peak
counter, and the report says so instead of printing a number that means nothing.
"""

from __future__ import annotations

import copy

import torch
from torch import nn

from amp_lessons.core.environment import cpu_has_native_bf16, dtype_name
from amp_lessons.l07_measuring_gains.benchmark import conclusions, measure
from amp_lessons.l07_measuring_gains.memory import saved_tensor_report
from amp_lessons.l12_your_model_validated.runs import make_scaler, to_device

WARMUP, REPEATS, SECONDS_PER_VARIANT = 2, 8, 3.0

__all__ = ["measure_variants"]


class _Outputs(nn.Module):
    """The recipe's ``outputs_of`` as a module, so lesson 07's helpers can call ``model(inputs)``."""

    def __init__(self, model, recipe):
        super().__init__()
        self.model, self.recipe = model, recipe

    def forward(self, inputs):
        return self.recipe.outputs(self.model, inputs)


def _step_fn(run, model, dtype, inputs, targets, training: bool):
    device, recipe = run.device, run.recipe
    enabled = dtype is not None
    if not training:

        def forward():
            with torch.no_grad(), torch.autocast(device.type, dtype=dtype or torch.bfloat16, enabled=enabled):
                return recipe.outputs(model, inputs)

        model.eval()
        return forward
    model.train()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)  # time the step; the weights stay as they are
    scaler, _ = make_scaler(device, dtype)

    def step():
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast(device.type, dtype=dtype or torch.bfloat16, enabled=enabled):
            loss = recipe.call("loss_fn", recipe.outputs(model, inputs), targets)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        return loss.detach()

    return step


def _saved_bytes(run, model, dtype, inputs, targets):
    if not isinstance(inputs, torch.Tensor):
        return None
    try:
        frame = saved_tensor_report(
            _Outputs(model, run.recipe),
            lambda o, t: run.recipe.call("loss_fn", o, t),
            inputs,
            targets,
            dtype=dtype,
        )
    except Exception:  # memory is reported as unknown rather than stopping a finished validation
        return None
    return int(frame["bytes"].sum())


def measure_variants(run, model, accepted, batches, training: bool) -> dict:
    """FP32 and each accepted dtype: median step time, spread, speed-up, saved-activation bytes, GPU peak."""
    if not accepted:
        return {
            "measured": False,
            "note": "no dtype was accepted, so speed was not measured (numbers first).",
        }
    inputs, targets = to_device(batches[0][0], run.device), to_device(batches[0][1], run.device)
    measurements, rows = [], {}
    bar = run.bars.bar("speed and memory", 1 + len(accepted))
    for dtype in [None, *accepted]:
        label = dtype_name(dtype or torch.float32)
        twin = copy.deepcopy(model)
        with run.clock.run(run.device):
            result = measure(
                _step_fn(run, twin, dtype, inputs, targets, training),
                device=run.device,
                warmup=WARMUP,
                repeats=REPEATS,
                label=label,
                max_seconds=SECONDS_PER_VARIANT,
                min_repeats=3,
            )
        measurements.append(result)
        rows[label] = {
            "median_s": result.median,
            "q25_s": result.q25,
            "q75_s": result.q75,
            "repeats": len(result.times),
            "peak_memory_bytes": result.peak_memory_bytes,
            "saved_activation_bytes": _saved_bytes(run, twin, dtype, inputs, targets) if training else None,
        }
        bar.update()
    bar.close()
    base = measurements[0]
    for result in measurements[1:]:
        rows[result.label]["speedup_vs_float32"] = base.median / result.median if result.median > 0 else None
    native = cpu_has_native_bf16() if run.device.type == "cpu" else None
    text = conclusions(measurements, baseline="float32", device_type=run.device.type, native_bf16=native)
    return {
        "measured": True,
        "what": "one training step" if training else "one forward pass (no training data)",
        "variants": rows,
        "conclusion": text,
        "memory_note": None
        if run.device.type == "cuda"
        else "CPU: no per-variant peak counter; saved_activation_bytes is what autograd keeps for backward.",
        "measurements": measurements,
    }
