"""Lesson 03: the mixed-precision training step, written once, in the order the lessons teach.

Lessons 05-09 and the checkers reuse ``train_step``; lesson 03 teaches it line by line. One function does the
step; ``guards=True`` switches on diagnostic guards that stop on inf/NaN, and ``guarded_train_step`` is the
same call with the guards always on (the name lesson 03 uses when it introduces them).
"""

from __future__ import annotations

import torch

from amp_lessons.core.display import scale_text


def train_step(
    model,
    optimizer,
    scaler,
    loss_fn,
    inputs,
    targets,
    *,
    dtype=torch.float16,
    max_norm=None,
    guards=False,
    allow_overflow_skips=True,
):
    """One AMP step; returns the unscaled loss (a detached tensor).

    Why this order:
    - autocast covers the forward pass *and* the loss, so the loss sees the same policy as the model;
    - backward runs outside autocast (it reuses the dtypes the forward chose);
    - ``scaler.scale`` multiplies the loss so small FP16 gradients do not flush to zero;
    - ``unscale_`` divides the gradients back *before* clipping, or ``max_norm`` would be compared with
      gradients that are ``scale`` times too large;
    - ``scaler.step`` skips the optimizer when any gradient is inf/NaN, and ``update`` adapts the scale.

    ``guards=True`` adds the diagnostic guards of lesson 03; they raise ``NonFiniteError`` when
    - the **loss** is not finite: loss scaling cannot fix a forward pass that already produced inf/NaN;
    - the **unscaled gradients** or their **total norm** are not finite. With an enabled GradScaler this is
      often just the scaler calibrating (a scaled FP16 gradient overflowed; ``scaler.step`` will skip and
      ``update`` will back off), so ``allow_overflow_skips=True`` lets those through and only a non-finite
      loss stops the run. Set it to False to stop at the first overflow and look at it.

    Why guards are off by default: each guard turns a device tensor into a Python bool
    (``bool(torch.isfinite(x))``), which makes the CPU wait for the GPU to finish everything queued so far (a
    synchronisation). That is cheap on a CPU and costly on a GPU; keep guards off whenever you time a
    training step (lesson 07).
    """
    device_type = inputs.device.type
    optimizer.zero_grad(set_to_none=True)
    with torch.autocast(device_type=device_type, dtype=dtype):
        outputs = model(inputs)
        loss = loss_fn(outputs, targets)
    if guards:
        _guard_loss(loss)
    scaler.scale(loss).backward()
    if max_norm is not None or guards:
        scaler.unscale_(optimizer)  # the guards must read true gradient values too
    if guards:
        _guard_gradients(model, optimizer, scaler, allow_overflow_skips)
    if max_norm is not None:
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    scaler.step(optimizer)
    scaler.update()
    return loss.detach()


# --------------------------------------------------------------------------- diagnostic guards (lesson 03)


class NonFiniteError(FloatingPointError):
    """Raised by a guarded step when a guard sees inf/NaN; the message says where and at what scale."""


def guarded_train_step(
    model,
    optimizer,
    scaler,
    loss_fn,
    inputs,
    targets,
    *,
    dtype=torch.float16,
    max_norm=None,
    allow_overflow_skips=True,
):
    """``train_step(..., guards=True)``: the step with its diagnostic guards on; returns the unscaled loss.

    Raises ``NonFiniteError`` on a non-finite loss, and on non-finite gradients unless they are an overflow
    the scaler will skip (``allow_overflow_skips``). For a step without guards call ``train_step``.
    """
    return train_step(
        model,
        optimizer,
        scaler,
        loss_fn,
        inputs,
        targets,
        dtype=dtype,
        max_norm=max_norm,
        guards=True,
        allow_overflow_skips=allow_overflow_skips,
    )


def _guard_loss(loss) -> None:
    if not bool(torch.isfinite(loss.detach()).all()):  # synchronises on a GPU
        raise NonFiniteError(
            f"non-finite loss ({loss.item()}) before scaling: the forward pass itself produced inf/NaN, "
            "so look at the inputs and activations (lesson 05), not at the loss scale."
        )


def _guard_gradients(model, optimizer, scaler, allow_overflow_skips: bool) -> None:
    parameters = [p for group in optimizer.param_groups for p in group["params"]]
    total = total_grad_norm(parameters)
    if bool(torch.isfinite(total)):  # synchronises on a GPU
        return
    overflow = scaler.is_enabled()
    if overflow and allow_overflow_skips:
        return
    bad = [
        name
        for name, p in model.named_parameters()
        if p.grad is not None and not bool(torch.isfinite(p.grad).all())
    ]
    raise NonFiniteError(
        f"non-finite gradients (total norm {total.item()}) in {', '.join(bad) or 'some parameters'} "
        f"at loss scale {scale_text(scaler.get_scale())}"
        + (
            ": with a GradScaler this is an overflow that scaler.step() would skip and update() would "
            "back off; it is expected while the scale calibrates, alarming if it keeps happening."
            if overflow
            else ": without loss scaling this step would write inf/NaN into the weights."
        )
    )


def total_grad_norm(parameters) -> torch.Tensor:
    """The 2-norm of all gradients together, as a tensor (missing gradients count as zero).

    It is computed in float32 and inf/NaN stay visible, so it is what the guards test, and what lesson 03's
    checker compares with ``max_norm`` to see whether (and how) a step clipped.
    """
    norms = [p.grad.detach().float().norm() for p in parameters if p.grad is not None]
    if not norms:
        return torch.zeros(())
    return torch.linalg.vector_norm(torch.stack(norms))


def step_was_skipped(scale_before, scale_after) -> bool:
    """Did GradScaler skip this optimizer step? It did when the scale went down.

    GradScaler only lowers the scale (by ``backoff_factor``) after it found inf/NaN gradients, and it never
    lowers it otherwise; a scale that reached 0 skips every step from then on (0 * inf is NaN).
    """
    before, after = float(scale_before), float(scale_after)
    return after < before or after <= 0
