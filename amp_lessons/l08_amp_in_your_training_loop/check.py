"""Lesson 08's checker: one optimizer step accumulated over several micro-batches with a GradScaler.

``check_accumulate_step`` runs the learner's ``accumulate_step`` and the reference
(``amp_lessons.l08_amp_in_your_training_loop.training_loop.accumulate_step``) from identical states in lesson 03's six scenarios, with
micro-batches (see ``amp_lessons.l08_amp_in_your_training_loop.probes``): four FP16 micro-batches with stale gradients in
``.grad``; four FP16 micro-batches whose gradient norm is above ``max_norm``; two FP16 micro-batches that
overflow (the step must be skipped and the scale backed off); two consecutive calls (the scale must grow in
between); four BF16 micro-batches with a *disabled* GradScaler (BF16 needs no loss scaling; the same code
runs); two micro-batches that report a CUDA device (the device type the step chooses for autocast is
observed). Everything is judged by what the step does, never by its source text.

Everything the learner's code touches records what happens (see the probes module), and the named mistakes
below are read from that record, most specific first, in six tables: setting up each micro-batch
(autocast, dtype, loss, a scaled and divided backward), the loop (what must *not* happen between
micro-batches), the step after the loop, the clipping, what the step left behind, and what it returned. The
rules this step shares with lesson 03's single step, and the loop over the scenarios, are lesson 03's
(``amp_lessons.l03_autocast_and_gradscaler.step_rules``); here they get this exercise's words. Any correct
style passes: a backward per micro-batch, or the losses summed and one backward; any spelling of zero_grad,
autocast or clipping.
"""

from __future__ import annotations

import math

import torch

from amp_lessons.checks.harness import call_learner, checker, passed
from amp_lessons.checks.mistakes import rule
from amp_lessons.core.display import scale_text
from amp_lessons.core.environment import dtype_name
from amp_lessons.l03_autocast_and_gradscaler import step_rules
from amp_lessons.l03_autocast_and_gradscaler.probes import close
from amp_lessons.l03_autocast_and_gradscaler.step_rules import error_or, worded
from amp_lessons.l08_amp_in_your_training_loop.probes import ROWS, SCENARIOS, ProbedRun, Seen, events
from amp_lessons.l08_amp_in_your_training_loop.training_loop import (
    accumulate_step as reference_accumulate_step,
)

ORDER = (
    "backward (per micro-batch, or once) -> after the loop: unscale_ -> clip -> scaler.step -> scaler.update"
)

# ------------------------------------------------------------------------------------ each micro-batch


@worded(step_rules.autocast_left_on)
def autocast_left_on(s: Seen) -> str:
    return (
        f"{s.where}: autocast was still switched on after accumulate_step returned. Use it as a context "
        "manager, `with torch.autocast(device_type=..., dtype=dtype):`, around each micro-batch's forward "
        "pass and loss."
    )


@worded(step_rules.new_grad_scaler)
def new_grad_scaler(s: Seen) -> str:
    deprecated = (
        " (and torch.cuda.amp.GradScaler is deprecated: use torch.amp.GradScaler)"
        if "torch.cuda.amp.gradscaler" in s.lower
        else ""
    )
    return (
        f"{s.where}: your accumulate_step created a new GradScaler{deprecated}. Use the scaler you are "
        "given: it belongs to the training run, and a fresh one starts from init_scale every step and "
        "forgets its overflow history."
    )


@worded(step_rules.low_precision_parameters)
def low_precision_parameters(s: Seen) -> str:
    return (
        f"{s.where}: the model's parameters became "
        f"{', '.join(sorted(dtype_name(d) for d in s.low_param_dtypes))}: did you call .half() / .to(dtype) "
        "on the model? Keep the parameters FP32; autocast casts per op."
    )


@worded(step_rules.model_never_called)
def model_never_called(s: Seen) -> str:
    return error_or(
        s, "the model was never called. Run `model(inputs)` for each micro-batch inside autocast."
    )


def _cpu_autocast_message(s: Seen) -> str:
    return (
        f"{s.where}: the micro-batches are on a CUDA device, but your step switched on autocast for the CPU. "
        "On a GPU that autocast does nothing for the model's ops, so the whole step would run in FP32. Take "
        "the device type from the data: `torch.autocast(device_type=inputs.device.type, dtype=dtype)`."
    )


@rule("CPU autocast on CUDA data", _cpu_autocast_message)
def cpu_autocast_on_cuda_data(s: Seen) -> bool:
    return not s.autocast_expected and any(e["autocast"] for e in s.forwards())


def _forward_message(s: Seen) -> str:
    if any(e["autocast_cuda"] for e in s.forwards()) or step_rules.torch_said_cuda(s):
        return (
            f"{s.where}: autocast was on for CUDA but the micro-batches are on the CPU, so the "
            f"forward passes ran in FP32: you used {step_rules.cuda_autocast_spelling(s)}. Take the device "
            "from the data: `torch.autocast(device_type=inputs.device.type, dtype=dtype)`."
        )
    return (
        f"{s.where}: a forward pass did not run under autocast (the model ran in FP32). Wrap each "
        "micro-batch's forward pass and loss in "
        "`with torch.autocast(device_type=inputs.device.type, dtype=dtype):`."
    )


@rule("forward without autocast", _forward_message)
def forward_without_autocast(s: Seen) -> bool:
    return s.autocast_expected and any(not e["autocast"] for e in s.forwards())


def _wrong_dtype(s: Seen):
    return next((e["dtype"] for e in s.forwards() if e["autocast"] and e["dtype"] != s.scenario.dtype), None)


def _wrong_dtype_message(s: Seen) -> str:
    return (
        f"{s.where}: autocast ran in {dtype_name(_wrong_dtype(s))}, but accumulate_step was called with "
        f"dtype={dtype_name(s.scenario.dtype)}. Pass it on: `torch.autocast(..., dtype=dtype)`."
    )


@rule("wrong autocast dtype", _wrong_dtype_message)
def wrong_autocast_dtype(s: Seen) -> bool:
    return _wrong_dtype(s) is not None


def _concatenated_message(s: Seen) -> str:
    return (
        f"{s.where}: you joined the {s.parts} micro-batches into one batch and ran the model once. The point "
        "of accumulation is that only one micro-batch's activations need to fit in memory: run the forward "
        "pass (and, to free its activations, the backward pass) per micro-batch."
    )


@rule("micro-batches concatenated", _concatenated_message)
def micro_batches_concatenated(s: Seen) -> bool:
    return len(s.forwards()) == 1 < s.parts and s.forwards()[0]["rows"] == s.parts * ROWS


def _forward_count_message(s: Seen) -> str:
    count = len(s.forwards())
    return (
        f"{s.where}: the model was called {count} time{'s' if count != 1 else ''} for {s.parts} "
        "micro-batches; call it once per micro-batch."
    )


@rule("model called the wrong number of times", _forward_count_message)
def model_called_the_wrong_number_of_times(s: Seen) -> bool:
    return len(s.forwards()) != s.parts and not s.error


@worded(step_rules.loss_never_computed)
def loss_never_computed(s: Seen) -> str:
    return error_or(s, "loss_fn was never called. Compute each micro-batch's loss inside autocast.")


def _loss_outside_message(s: Seen) -> str:
    return (
        f"{s.where}: a loss was computed outside autocast. Put `loss = loss_fn(model(inputs), targets)` "
        "inside the `with torch.autocast(...)` block: the policy decides the loss's precision too."
    )


@rule("loss outside autocast", _loss_outside_message)
def loss_outside_autocast(s: Seen) -> bool:
    """A loss on low-precision outputs outside autocast (one on outputs cast to FP32 is as precise)."""
    losses = events(s.log, "loss")
    return s.autocast_expected and any(
        not e["autocast"] and e["input_dtype"] != torch.float32 for e in losses
    )


@worded(step_rules.no_backward)
def no_backward(s: Seen) -> str:
    return error_or(
        s, "there was no backward pass. Call `scaler.scale(loss / len(micro_batches)).backward()`."
    )


def _backward_inside_message(s: Seen) -> str:
    return (
        f"{s.where}: backward ran inside the autocast block. Autocast covers only forward passes and losses: "
        "backward reuses the dtypes the forward chose, and under autocast its ops are dispatched through the "
        "policy again. Move the backward call below the `with` block."
    )


@rule("backward inside autocast", _backward_inside_message)
def backward_inside_autocast(s: Seen) -> bool:
    return any(e["autocast"] for e in events(s.log, "backward"))


def _scaled_by_hand_message(s: Seen) -> str:
    return (
        f"{s.where}: you scaled the loss by hand (e.g. `(loss * scaler.get_scale() / N).backward()`) "
        "instead of calling `scaler.scale(...)`. The gradients come out scaled by the same factor, but "
        "scaler.scale() also sets up the scaler's state for this step (its scale tensor, on the loss's "
        "device), which unscale_, step and update rely on, and get_scale() makes the CPU wait for the GPU. "
        "Use `scaler.scale(loss / len(micro_batches)).backward()`."
    )


@rule("loss scaled by hand", _scaled_by_hand_message)
def loss_scaled_by_hand(s: Seen) -> bool:
    return s.scaling and not events(s.log, "scale") and s.ratio_is(1.0)


def _unscaled_backward_message(s: Seen) -> str:
    return (
        f"{s.where}: backward ran on the unscaled loss. Scale it first, "
        "`scaler.scale(loss / len(micro_batches)).backward()`: otherwise small FP16 gradients underflow, and "
        f"scaler.step() divides the gradients by the scale anyway, so the update is {scale_text(s.scale)} "
        "times too small."
    )


@rule("backward on the unscaled loss", _unscaled_backward_message)
def backward_on_the_unscaled_loss(s: Seen) -> bool:
    if not s.scaling:
        return False
    return not events(s.log, "scale") or s.ratio_is(1 / s.scale) or s.ratio_is(s.parts / s.scale)


def _ratio_message(seen: Seen) -> str:
    ratio, n, where = seen.output_gradient_ratio(), seen.parts, seen.where
    if close(ratio, n, 0.05):
        return (
            f"{where}: the gradients are {n} times too large: each micro-batch's loss went into backward "
            f"without being divided by the number of micro-batches ({n}). Their gradients add up in "
            f".grad, so the batch gradient is the sum of `grad(loss_k) / {n}`: use "
            "`scaler.scale(loss / len(micro_batches)).backward()`. (Clipping hides this while the norm "
            "is above max_norm, never otherwise.)"
        )
    if close(ratio, 1 / n, 0.05):
        return (
            f"{where}: the gradients are {n} times too small: the loss was divided by {n} twice (e.g. "
            "once per micro-batch and once more for the sum). Divide each micro-batch's loss by the "
            "number of micro-batches exactly once."
        )
    if close(ratio, seen.scale, 0.05) or close(ratio, seen.scale * n, 0.05):
        return (
            f"{where}: the loss was scaled twice (gradients {scale_text(seen.scale)} times too large). "
            "Call scaler.scale() once per loss, or once on the sum of the divided losses."
        )
    return (
        f"{where}: the gradient reaching each micro-batch's output was {ratio:.4g} times the expected "
        f"one (`scaler.scale(loss / {n}).backward()` per micro-batch, or one backward of "
        f"`scaler.scale(sum_of_losses / {n})`)."
    )


def _step_as_the_reference(s: Seen) -> bool:
    """The step's outcome is the reference's: the same parameters, and the optimizer used the same norm (a
    step that divides the accumulated .grad by the number of micro-batches afterwards is right too)."""
    same_norm = not s.norm_finite or close(s.norm_used, s.norm_expected, 0.02)
    return s.first_param_difference is None and same_norm


@rule("gradient size", _ratio_message)
def gradient_size(s: Seen) -> bool:
    return math.isfinite(s.output_gradient_ratio()) and not s.ratio_is(1.0) and not _step_as_the_reference(s)


SETUP_RULES = (
    autocast_left_on,
    step_rules.model_left_in_eval,
    new_grad_scaler,
    low_precision_parameters,
    model_never_called,
    cpu_autocast_on_cuda_data,
    forward_without_autocast,
    wrong_autocast_dtype,
    micro_batches_concatenated,
    model_called_the_wrong_number_of_times,
    loss_never_computed,
    loss_outside_autocast,
    no_backward,
    backward_inside_autocast,
    loss_scaled_by_hand,
    backward_on_the_unscaled_loss,
    gradient_size,
)

# ------------------------------------------------------------------------------------ the micro-batch loop


def _stepper(seen: Seen) -> str:
    """The step the learner called: scaler.step, or optimizer.step (BF16 bypassing its disabled scaler)."""
    return "scaler.step" if "scaler.step" in seen.names else "optimizer.step"


def _step_inside_message(s: Seen) -> str:
    stepper, calls = _stepper(s), s.log.count(_stepper(s))
    if calls == s.parts:
        return (
            f"{s.where}: {stepper}() ran inside the micro-batch loop ({calls} calls for "
            f"{s.parts} micro-batches). That is {s.parts} small optimizer steps, each from 1/{s.parts} of the "
            "batch, not one step from the whole batch (and with Adam each small step is full-sized). "
            f"Accumulate all micro-batches first, then once: {ORDER}."
        )
    names = s.names
    after = names[: names.index(stepper)].count("backward") if stepper in names else 0
    when = "once" if calls == 1 else f"{calls} times, first"
    return (
        f"{s.where}: {stepper}() ran inside the micro-batch loop, {when} right after micro-batch {after} of "
        f"{s.parts} (a test such as `i % k == 0` is already true at i = 0). A step there uses the gradients of only the micro-batches before it, not "
        f"the whole batch. Accumulate all micro-batches first, then step once, after the loop: {ORDER}."
    )


@rule("step inside the loop", _step_inside_message)
def step_inside_the_loop(s: Seen) -> bool:
    return any(s.inside_loop(step) or s.log.count(step) > 1 for step in ("scaler.step", "optimizer.step"))


def _update_inside_message(s: Seen) -> str:
    return (
        f"{s.where}: scaler.update() ran inside the micro-batch loop. update() may change the scale, so the "
        "micro-batches' gradients would be added up in different units (torch even refuses an update() with "
        f"no step() before it: 'No inf checks were recorded'). Call it once, last: {ORDER}."
    )


@rule("update inside the loop", _update_inside_message)
def update_inside_the_loop(s: Seen) -> bool:
    return s.scaling and s.inside_loop("update")


def _unscale_inside_message(s: Seen) -> str:
    return (
        f"{s.where}: scaler.unscale_() ran inside the micro-batch loop. The next micro-batch's scaled "
        "gradients would be added to already unscaled ones (torch refuses a second unscale_() before "
        f"update()). Unscale once, after the last micro-batch: {ORDER}."
    )


@rule("unscale_ inside the loop", _unscale_inside_message)
def unscale_inside_the_loop(s: Seen) -> bool:
    return s.scaling and s.inside_loop("unscale_")


def _zero_grad_inside_message(s: Seen) -> str:
    return (
        f"{s.where}: the gradients were zeroed inside the micro-batch loop, so each micro-batch erased the "
        "ones before it and only the last one reached the optimizer. Zero them once, before the "
        "first micro-batch."
    )


@rule("zero_grad inside the loop", _zero_grad_inside_message)
def zero_grad_inside_the_loop(s: Seen) -> bool:
    return s.between_backwards("zero_grad") or any(e["erased"] for e in s.forwards())


def _changed_inside_message(s: Seen) -> str:
    return (
        f"{s.where}: the accumulated gradients changed between one micro-batch's backward and the next "
        "micro-batch: did you clip inside the loop? Clipping must see the whole batch's gradient, after "
        f"unscale_: {ORDER}."
    )


@rule("gradients changed inside the loop", _changed_inside_message)
def gradients_changed_inside_the_loop(s: Seen) -> bool:
    return any(e["changed"] for e in s.forwards())


def _zero_grad_after_backward_message(s: Seen) -> str:
    return (
        f"{s.where}: you called zero_grad() after the last backward: it erased the batch's gradients before "
        "the optimizer used them. Zero the gradients at the start of the step."
    )


@rule("zero_grad after backward", _zero_grad_after_backward_message)
def zero_grad_after_backward(s: Seen) -> bool:
    """zero_grad() between the last backward and scaler.step, or only zeros reached the step (not so in the
    reference)."""
    between = (
        0
        <= s.position("backward", last=True)
        < s.position("zero_grad", last=True)
        < max(s.position("scaler.step"), 0)
    )
    zeros = any(e["all_zero"] for e in events(s.log, "scaler.step"))
    return between or (zeros and not any(e["all_zero"] for e in events(s.ref.log, "scaler.step")))


@worded(step_rules.stale_gradients)
def stale_gradients(s: Seen) -> str:
    end = (
        " (you zero them at the end of the step: a first step, or one after any other backward, still "
        "adds up old gradients)."
        if step_rules.zeroes_at_end(s)
        else "."
    )
    return (
        f"{s.where}: gradients from an earlier iteration were still in .grad when the first backward ran, "
        "so they were added to this batch's gradients. Start with `optimizer.zero_grad()`" + end
    )


LOOP_RULES = (
    step_inside_the_loop,
    update_inside_the_loop,
    unscale_inside_the_loop,
    zero_grad_inside_the_loop,
    gradients_changed_inside_the_loop,
    zero_grad_after_backward,
    stale_gradients,
)

# ------------------------------------------------------------------------------------ the step after the loop


@worded(step_rules.optimizer_step_called_directly)
def optimizer_step_called_directly(s: Seen) -> str:
    also = " as well as scaler.step(optimizer)" if "scaler.step" in s.names else ""
    return (
        f"{s.where}: you called optimizer.step() directly{also}. Use `scaler.step(optimizer)` only: it "
        "unscales the gradients if you have not, and skips the update when any micro-batch produced inf/NaN."
    )


@worded(step_rules.unscale_twice)
def unscale_twice(s: Seen) -> str:
    return (
        f"{s.where}: scaler.unscale_(optimizer) was called {s.log.count('unscale_')} times. Call it once, "
        "after the last micro-batch and before clipping."
    )


@worded(step_rules.unscale_after_step)
def unscale_after_step(s: Seen) -> str:
    return (
        f"{s.where}: scaler.unscale_() came after scaler.step(): step() has already unscaled and applied the "
        f"gradients. {ORDER}."
    )


def _update_before_step_message(s: Seen) -> str:
    return (
        f"{s.where}: scaler.update() ran before scaler.step(optimizer) (or without it). update() reads the "
        f"inf checks of this step's step(), so it comes last: {ORDER}."
    )


@rule("update before step", _update_before_step_message)
def update_before_step(s: Seen) -> bool:
    """An update() with no scaler.step() before the last one."""
    step_then_update = 0 <= s.position("scaler.step") < s.position("update", last=True)
    return s.scaling and s.log.count("update") > 0 and not step_then_update


@worded(step_rules.no_scaler_step)
def no_scaler_step(s: Seen) -> str:
    return error_or(s, "the optimizer never stepped. Call `scaler.step(optimizer)` once, after the loop.")


@worded(step_rules.no_update)
def no_update(s: Seen) -> str:
    return (
        f"{s.where}: scaler.update() was never called. Without it the scale never adapts, and the next "
        "scaler.step() fails. End the step with `scaler.update()`, once."
    )


@worded(step_rules.update_more_than_once)
def update_more_than_once(s: Seen) -> str:
    return (
        f"{s.where}: scaler.update() was called {s.log.count('update')} times; once per optimizer step, "
        "after scaler.step()."
    )


STEP_RULES = (
    optimizer_step_called_directly,
    unscale_twice,
    unscale_after_step,
    update_before_step,
    no_scaler_step,
    no_update,
    update_more_than_once,
    step_rules.learner_error,
)

# ------------------------------------------------------------------------------------ clipping
# Judged by the gradient norm the optimizer used; an overflowing step is judged by what happened to the
# parameters and the scale.


def _clipped_scaled_message(s: Seen) -> str:
    how = "before scaler.unscale_()" if "unscale_" in s.names else "without scaler.unscale_() first"
    return (
        f"{s.where}: you clipped {how}: clip_grad_norm_ saw gradients {scale_text(s.scale_used)} "
        f"times too large and cut them to norm {s.max_norm}; unscaled, the update had norm "
        f"{s.norm_used:.3g}. After the loop: {ORDER}."
    )


@rule("clipped the scaled gradients", _clipped_scaled_message)
def clipped_the_scaled_gradients(s: Seen) -> bool:
    return s.clipped_wrong and s.scaling and s.clipped_scaled


@worded(step_rules.not_clipped)
def not_clipped(s: Seen) -> str:
    return (
        f"{s.where}: the gradients were not clipped: the optimizer used a gradient norm of {s.norm_used:.4g} "
        f"although max_norm={s.max_norm}. After `scaler.unscale_(optimizer)`, call "
        "`torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)` (before scaler.step)."
    )


@worded(step_rules.clipped_to_another_norm)
def clipped_to_another_norm(s: Seen) -> str:
    return (
        f"{s.where}: the gradient norm the optimizer used was {s.norm_used:.4g}, but clipping the whole "
        f"batch's unscaled gradients to max_norm={s.max_norm} gives {s.norm_expected:.4g}. Use "
        "clip_grad_norm_ (not clip_grad_value_) on model.parameters(), once, after unscale_."
    )


def _grad_divided_after_message(s: Seen) -> str:
    small = s.norm_used < s.norm_expected
    return (
        f"{s.where}: each micro-batch's backward was right, but the gradients the optimizer used are {s.parts} "
        f"times too {'small' if small else 'large'} (norm {s.norm_used:.4g} instead of {s.norm_expected:.4g}): "
        + (
            f"you divided by the number of micro-batches a second time, after the loop (.grad / {s.parts}). "
            "Divide once: each loss, or the accumulated .grad."
            if small
            else f"you multiplied the accumulated .grad by {s.parts} after the loop. Leave it as backward made it."
        )
    )


@rule("gradients changed after the loop", _grad_divided_after_message)
def gradients_changed_after_the_loop(s: Seen) -> bool:
    if not (s.norm_finite and s.ratio_is(1.0)):
        return False
    return close(s.norm_used * s.parts, s.norm_expected, 0.02) or close(
        s.norm_used, s.norm_expected * s.parts, 0.02
    )


CLIP_RULES = (
    gradients_changed_after_the_loop,
    step_rules.unscaled_by_hand,
    step_rules.clipped_although_max_norm_none,
    clipped_the_scaled_gradients,
    step_rules.changed_not_clipped_by_total_norm,
    not_clipped,
    clipped_to_another_norm,
)

# ---------------------------------------------------------------------------- what the step left and returned


@worded(step_rules.loss_scale_differs)
def loss_scale_differs(s: Seen) -> str:
    return (
        f"{s.where}: the loss scale after the step is {scale_text(s.got.scale_after)}; the reference "
        f"leaves {scale_text(s.ref.scale_after)}. Call scaler.update() exactly once, "
        "after scaler.step(optimizer)."
    )


@worded(step_rules.overflowing_step_not_skipped)
def overflowing_step_not_skipped(s: Seen) -> str:
    return (
        f"{s.where}: a micro-batch overflowed, so this step must be skipped, but the parameters "
        "changed. scaler.step(optimizer) skips the update when any gradient is inf/NaN."
    )


@worded(step_rules.parameters_differ)
def parameters_differ(s: Seen) -> str:
    p_ref, p_got = s.first_param_difference
    diff = (p_ref - p_got).abs().max().item() if p_ref.shape == p_got.shape else math.nan
    return (
        f"{s.where}: after your step the parameters differ from the reference step's by up to {diff:.3g}, "
        f"although every call looked right. Accumulate `loss / N` from every micro-batch, then {ORDER}."
    )


@worded(step_rules.returned_none)
def returned_none(s: Seen) -> str:
    return (
        f"{s.where}: accumulate_step returned None. Return the batch loss (the mean of the "
        "micro-batch losses)."
    )


@worded(step_rules.returned_something_else)
def returned_something_else(s: Seen) -> str:
    value = s.got.returned
    shape = f" of shape {tuple(value.shape)}" if isinstance(value, torch.Tensor) else ""
    return (
        f"{s.where}: accumulate_step returned a {type(value).__name__}{shape}; return one number, the "
        "mean of the micro-batch losses, e.g. `torch.stack(losses).mean()`."
    )


def _batch_losses(s: Seen) -> tuple[list, float]:
    """The reference's micro-batch losses, and their mean (the batch loss)."""
    losses = [e["value"] for e in events(s.ref.log, "loss")]
    return losses, sum(losses) / len(losses)


def _other_loss_message(s: Seen) -> str:
    """Which wrong loss the learner returned: a scaled one, the last, a sum, a mean divided twice, another."""
    number, where, n = s.returned_number, s.where, s.parts
    losses, mean = _batch_losses(s)
    candidates = {
        "the last micro-batch's loss": losses[-1],
        "the last micro-batch's loss divided by N": losses[-1] / n,
        "the sum of the micro-batch losses": sum(losses),
        "the mean divided by N once more": mean / n,
    }
    for label, candidate in candidates.items():
        if s.scaling and (
            close(number / s.scale, candidate, 1e-3) or close(number / s.scale, candidate / n, 1e-3)
        ):
            return (
                f"{where}: accumulate_step returned a scaled loss ({number:.6g}, multiplied by the scale "
                f"{scale_text(s.scale)}). Return the losses as loss_fn computed them (their mean); "
                "scaler.scale(...) is only for backward."
            )
        if close(number, candidate, 1e-3):
            return (
                f"{where}: accumulate_step returned {number:.6g}, {label}; the batch loss is the mean of "
                f"all {n} micro-batch losses, {mean:.6g}. Keep each loss "
                "(`losses.append(loss.detach())`) and return their mean."
            )
    return (
        f"{where}: accumulate_step returned {number:.6g}, but the batch loss (mean of the micro-batch "
        f"losses) is {mean:.6g}."
    )


@rule("returned another loss", _other_loss_message)
def returned_another_loss(s: Seen) -> bool:
    return not close(s.returned_number, _batch_losses(s)[1], 1e-3)


RESULT_RULES = (
    loss_scale_differs,
    overflowing_step_not_skipped,
    parameters_differ,
)

RETURN_RULES = (
    returned_none,
    returned_something_else,
    returned_another_loss,
)

ACCUMULATE_STEP_RULES = SETUP_RULES + LOOP_RULES + STEP_RULES + CLIP_RULES + RESULT_RULES + RETURN_RULES

ACCUMULATE_STEP = step_rules.StepExercise(
    what="`accumulate_step`",
    reference=reference_accumulate_step,
    scenarios=SCENARIOS,
    probed_run=ProbedRun,
    seen=Seen,
    rules=ACCUMULATE_STEP_RULES,
)


# ------------------------------------------------------------------------------------------- the checker


@checker("08.1 gradient accumulation with a GradScaler")
def check_accumulate_step(accumulate_step):
    """``accumulate_step(model, optimizer, scaler, loss_fn, micro_batches, *, dtype, max_norm) -> loss``."""
    if not callable(accumulate_step):
        call_learner(accumulate_step)  # turns None / a string / a number into a clear message
    result = step_rules.judge(ACCUMULATE_STEP, accumulate_step)
    if result is not None:
        return result
    return passed(
        f"Your accumulation step matches the reference in all {len(SCENARIOS)} scenarios: autocast on the "
        "data's device around each micro-batch's forward pass and loss, every loss divided by the number of "
        "micro-batches and scaled, the gradients accumulated at one scale, then once: unscale_, clip, "
        "scaler.step, scaler.update; an overflowing micro-batch skips the whole step, the scale grows "
        "between steps, and the same code runs BF16 with a disabled scaler."
    )
