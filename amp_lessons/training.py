"""The mixed-precision training step, written once, in the order the lessons teach.

Lessons 05-07 and the checkers reuse ``train_step``; lesson 03 teaches it line by line.
"""

from __future__ import annotations

import torch


def train_step(model, optimizer, scaler, loss_fn, inputs, targets, *, dtype=torch.float16, max_norm=None):
    """One AMP step; returns the unscaled loss (a detached tensor).

    Why this order:
    - autocast covers the forward pass *and* the loss, so the loss sees the same policy as the model;
    - backward runs outside autocast (it reuses the dtypes the forward chose);
    - ``scaler.scale`` multiplies the loss so small FP16 gradients do not flush to zero;
    - ``unscale_`` divides the gradients back *before* clipping, or ``max_norm`` would be compared with
      gradients that are ``scale`` times too large;
    - ``scaler.step`` skips the optimizer when any gradient is inf/NaN, and ``update`` adapts the scale.
    """
    device_type = inputs.device.type
    optimizer.zero_grad(set_to_none=True)
    with torch.autocast(device_type=device_type, dtype=dtype):
        outputs = model(inputs)
        loss = loss_fn(outputs, targets)
    scaler.scale(loss).backward()
    if max_norm is not None:
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    scaler.step(optimizer)
    scaler.update()
    return loss.detach()
