"""Lesson 03's checkers: the AMP training step, and stepping a scheduler only after real updates.

``check_train_step`` is behavioural *and* diagnostic. It runs the learner's step and the reference step
(``amp_lessons.l03_autocast_and_gradscaler.train_step``) from identical states in six scenarios, on the CPU with a tiny model:

1. a normal FP16 step, ``max_norm=None``, with stale gradients left in ``.grad`` by a previous iteration;
2. an FP16 step whose unscaled gradient norm is well above ``max_norm``;
3. an FP16 step whose scaled gradients overflow (``init_scale=2**40``): it must be skipped, the scale backed
   off and the parameters left untouched;
4. two consecutive FP16 steps with ``growth_interval=1`` (the scale must grow in between);
5. a BF16 step with a *disabled* GradScaler (BF16 needs no loss scaling; the same code runs);
6. a step on data that reports a CUDA device: the device type the step chooses for autocast is observed.

Everything is judged by what the step does, never by its source text: a correct step written differently
from the reference passes.

While the learner's code runs, everything it touches records what happens (``amp_lessons.l03_autocast_and_gradscaler.probes``):
autocast on or off in forward, loss and backward, the dtypes, the calls to the scaler and the optimizer in
order, the gradient norm the optimizer used. ``Seen`` holds those facts next to the reference call's, and
three tables of small named rules (``CALL_RULES``, ``CLIP_RULES``, ``RESULT_RULES``; the first that
recognises the call names the mistake) turn them into a message: observed, not guessed from final numbers.
The rules a step of micro-batches (08.1) shares with this one, and the loop over the scenarios, are in
``amp_lessons.l03_autocast_and_gradscaler.step_rules``; here they get this exercise's words.
"""

from __future__ import annotations

import warnings

import torch
from torch import nn

from amp_lessons.checks.harness import LearnerProblem, call_learner, checker, failed, passed
from amp_lessons.checks.mistakes import rule
from amp_lessons.core.display import scale_text
from amp_lessons.core.environment import dtype_name, one_cpu_thread
from amp_lessons.l03_autocast_and_gradscaler import step_rules
from amp_lessons.l03_autocast_and_gradscaler.probes import (
    DEVICE_TYPE,
    SCENARIOS,
    CountingStepLR,
    ProbedRun,
    Seen,
    UpdateCountingScaler,
    close,
)
from amp_lessons.l03_autocast_and_gradscaler.step_rules import error_or, worded
from amp_lessons.l03_autocast_and_gradscaler.training import train_step as reference_train_step

# ------------------------------------------------------------------------------------- the calls, in order
# What the learner's step did, in the order a mistake would first show. Every rule reads ``Seen``.


@worded(step_rules.autocast_left_on)
def autocast_left_on(s: Seen) -> str:
    return (
        f"{s.where}: autocast was still switched on after train_step returned. Use it as a context manager, "
        "`with torch.autocast(device_type=..., dtype=dtype):`, so it ends after the loss."
    )


@worded(step_rules.new_grad_scaler)
def new_grad_scaler(s: Seen) -> str:
    deprecated = (
        " (and torch.cuda.amp.GradScaler is deprecated: use torch.amp.GradScaler)"
        if "torch.cuda.amp.gradscaler" in s.lower
        else ""
    )
    return (
        f"{s.where}: your train_step created a new GradScaler{deprecated}. Create the scaler once per "
        "training run and use the one passed in: a fresh scaler starts from init_scale every step, so it "
        "never learns a safe scale, and the skip/backoff history that protects training is thrown away."
    )


@worded(step_rules.low_precision_parameters)
def low_precision_parameters(s: Seen) -> str:
    return (
        f"{s.where}: the model's parameters became "
        f"{', '.join(sorted(dtype_name(d) for d in s.low_param_dtypes))} — did you call .half() / .to(dtype) "
        "on the model? Keep the parameters in FP32: autocast casts a low-precision copy for each op that "
        "wants one, the optimizer updates the FP32 parameters (small updates survive), and GradScaler "
        "refuses FP16 gradients ('Attempting to unscale FP16 gradients.')."
    )


@worded(step_rules.model_never_called)
def model_never_called(s: Seen) -> str:
    return error_or(s, "the model was never called. Compute `outputs = model(inputs)` inside autocast.")


def _cpu_autocast_message(s: Seen) -> str:
    return (
        f"{s.where}: the data is on a CUDA device, but your step switched on autocast for the CPU. On a GPU "
        "that autocast does nothing for the model's ops, so the whole step would run in FP32. Take the "
        "device type from the data: `torch.autocast(device_type=inputs.device.type, dtype=dtype)`."
    )


@rule("CPU autocast on CUDA data", _cpu_autocast_message)
def cpu_autocast_on_cuda_data(s: Seen) -> bool:
    return s.event("forward")["autocast"] and not s.autocast_expected


def _forward_outside_autocast(s: Seen) -> bool:
    return s.autocast_expected and not s.event("forward")["autocast"]


def _cuda_autocast_message(s: Seen) -> str:
    return (
        f"{s.where}: autocast was on for CUDA but the tensors are on the CPU, so the forward pass ran in "
        f"FP32: you used {step_rules.cuda_autocast_spelling(s)}. Take the device from the data: "
        "`torch.autocast(device_type=inputs.device.type, dtype=dtype)`."
    )


@rule("autocast for CUDA on CPU tensors", _cuda_autocast_message)
def cuda_autocast_on_cpu_tensors(s: Seen) -> bool:
    asked_for_cuda = s.event("forward")["autocast_cuda"] or step_rules.torch_said_cuda(s)
    return _forward_outside_autocast(s) and bool(asked_for_cuda)


def _outside_autocast_message(s: Seen) -> str:
    return (
        f"{s.where}: the forward pass did not run under autocast (the model ran in FP32). Wrap the forward "
        "pass and the loss in `with torch.autocast(device_type=inputs.device.type, dtype=dtype):`."
    )


@rule("forward outside autocast", _outside_autocast_message)
def forward_outside_autocast(s: Seen) -> bool:
    return _forward_outside_autocast(s)


def _dtype_ignored_message(s: Seen) -> str:
    return (
        f"{s.where}: autocast ran in {dtype_name(s.event('forward')['dtype'])}, but train_step was called "
        f"with dtype={dtype_name(s.scenario.dtype)}. Pass it on: `torch.autocast(..., dtype=dtype)`."
    )


@rule("autocast dtype ignored", _dtype_ignored_message)
def autocast_dtype_ignored(s: Seen) -> bool:
    return s.event("forward")["autocast"] and s.event("forward")["dtype"] != s.scenario.dtype


@worded(step_rules.loss_never_computed)
def loss_never_computed(s: Seen) -> str:
    return error_or(
        s, "loss_fn was never called. Compute `loss = loss_fn(outputs, targets)` inside autocast."
    )


def _loss_outside_message(s: Seen) -> str:
    return (
        f"{s.where}: the loss was computed outside autocast. Put `loss = loss_fn(outputs, targets)` inside "
        "the same `with torch.autocast(...)` block as the forward pass: the policy decides the loss's "
        "precision too (on CUDA, cross_entropy and mse_loss are on its float32 list); outside it the loss "
        "runs in whatever low precision the outputs happen to have."
    )


@rule("loss outside autocast", _loss_outside_message)
def loss_outside_autocast(s: Seen) -> bool:
    """A loss on low-precision outputs outside autocast (one on outputs cast to FP32 is as precise)."""
    loss = s.event("loss")
    return s.autocast_expected and not loss["autocast"] and loss["input_dtype"] != torch.float32


@worded(step_rules.no_backward)
def no_backward(s: Seen) -> str:
    return error_or(
        s, "there was no backward pass. Call `scaler.scale(loss).backward()` after the autocast block."
    )


def _backward_inside_message(s: Seen) -> str:
    return (
        f"{s.where}: backward ran inside the autocast block. Autocast should cover only the forward pass and "
        "the loss (the PyTorch docs advise against backward under autocast), and it is not harmless: "
        "backward ops are dispatched through autocast again, so a region you kept in FP32 with "
        "`torch.autocast(..., enabled=False)` gets low-precision gradients. Move "
        "`scaler.scale(loss).backward()` below the `with` block."
    )


@rule("backward inside autocast", _backward_inside_message)
def backward_inside_autocast(s: Seen) -> bool:
    return s.event("backward")["autocast"]


def _torch_said(error: str) -> str:
    """The exception in a learner-error message, without the checker's prefix and the code location."""
    return error.split(" raised an error: ", 1)[-1].split(" (at line ", 1)[0]


def _output_grad_is(s: Seen, divided_by: float = 1.0) -> bool:
    """The gradient reaching the model output is the reference's divided by ``divided_by``."""
    if not s.output_grads_finite:
        return False
    expected = s.ref_event("backward")["grad_absmax"] / divided_by
    return close(s.event("backward")["grad_absmax"], expected, 0.05)


def _scaled_by_hand_message(s: Seen) -> str:
    stopped = f" (here torch stopped it: {_torch_said(s.error)})" if s.error else ""
    return (
        f"{s.where}: you scaled the loss by hand (e.g. `(loss * scaler.get_scale()).backward()`) instead of "
        "calling `scaler.scale(loss)`. The gradients come out scaled by the same factor, but scaler.scale() "
        "also sets up the scaler's state for this step (its scale tensor, on the loss's device), which "
        f"unscale_, step and update rely on{stopped}, and get_scale() makes the CPU wait for the GPU at "
        "every step. Use `scaler.scale(loss).backward()`."
    )


@rule("loss scaled by hand", _scaled_by_hand_message)
def loss_scaled_by_hand(s: Seen) -> bool:
    return s.scaling and s.event("scale") is None and _output_grad_is(s)


def _unscaled_backward_message(s: Seen) -> str:
    return (
        f"{s.where}: backward ran on the unscaled loss (`loss.backward()`). Scale it first: "
        "`scaler.scale(loss).backward()`. Otherwise small FP16 gradients still underflow, and "
        "scaler.step() divides the gradients by the scale anyway, so every update is "
        f"{scale_text(s.got.scale_before)} times too small."
    )


@rule("backward on the unscaled loss", _unscaled_backward_message)
def backward_on_the_unscaled_loss(s: Seen) -> bool:
    return s.scaling and (s.event("scale") is None or _output_grad_is(s, s.got.scale_before))


def _scaled_otherwise_message(s: Seen) -> str:
    return (
        f"{s.where}: the gradient reaching the model output was {s.output_grad_ratio:.4g} times the "
        "unscaled one; with `scaler.scale(loss).backward()` it is exactly the scale, "
        f"{scale_text(s.got.scale_before)}. Scale the loss once, with scaler.scale, and call backward "
        "on that."
    )


@rule("loss scaled by something else", _scaled_otherwise_message)
def loss_scaled_by_something_else(s: Seen) -> bool:
    return s.output_grads_finite and not _output_grad_is(s)


def _zero_grad_after_backward_message(s: Seen) -> str:
    return (
        f"{s.where}: you called zero_grad() after backward: it erased this step's gradients before the "
        "optimizer used them. Zero the gradients at the start of the step, before the forward pass."
    )


@rule("zero_grad after backward", _zero_grad_after_backward_message)
def zero_grad_after_backward(s: Seen) -> bool:
    return s.log.between("zero_grad", "backward", "scaler.step")


@worded(step_rules.stale_gradients)
def stale_gradients(s: Seen) -> str:
    end = (
        " You clear them at the end of the step: the first step of a run (or one after any other "
        "backward) still adds up old gradients, so clear at the start."
        if step_rules.zeroes_at_end(s)
        else ""
    )
    return (
        f"{s.where}: gradients from an earlier backward pass were still in .grad when backward ran, so "
        "they were added to this step's gradients. Start the step with `optimizer.zero_grad()`." + end
    )


@worded(step_rules.optimizer_step_called_directly)
def optimizer_step_called_directly(s: Seen) -> str:
    twice = " as well as scaler.step(optimizer) (so it stepped twice)" if "scaler.step" in s.names else ""
    return (
        f"{s.where}: you called optimizer.step() directly{twice}. Use `scaler.step(optimizer)` only: it "
        "unscales the gradients if you have not, and skips the update when they contain inf/NaN; "
        "optimizer.step() applies scaled or non-finite gradients to the weights."
    )


@worded(step_rules.unscale_twice)
def unscale_twice(s: Seen) -> str:
    return (
        f"{s.where}: scaler.unscale_(optimizer) was called twice in one step (torch raises 'unscale_() has "
        "already been called on this optimizer since the last update()'). Call it once, after backward "
        "and before clipping."
    )


@worded(step_rules.unscale_after_step)
def unscale_after_step(s: Seen) -> str:
    return (
        f"{s.where}: scaler.unscale_() came after scaler.step(). step() has already unscaled and applied the "
        "gradients; unscale_ belongs between backward and clipping."
    )


def _update_before_step_message(s: Seen) -> str:
    return (
        f"{s.where}: scaler.update() ran before scaler.step(optimizer). update() reads the inf checks of "
        "this step's step() and then resets them, so it must come last: "
        "backward -> unscale_ -> clip -> step -> update."
    )


@rule("update before step", _update_before_step_message)
def update_before_step(s: Seen) -> bool:
    names = s.names
    if not s.scaling or "update" not in names:
        return False
    return "scaler.step" not in names or names.index("scaler.step") > names.index("update")


def _clipping_raised_message(s: Seen) -> str:
    return (
        f"{s.where}: {s.error}. With a GradScaler, inf/NaN gradients are expected now and then (an "
        "overflow that scaler.step skips): do not make clipping raise on them (error_if_nonfinite=False)."
    )


@rule("clipping raised on an overflow", _clipping_raised_message)
def clipping_raised_on_an_overflow(s: Seen) -> bool:
    return "scaler.step" not in s.names and bool(s.error) and "non-finite" in s.lower and "clip" in s.lower


@worded(step_rules.no_scaler_step)
def no_scaler_step(s: Seen) -> str:
    return error_or(s, "the optimizer never stepped. Call `scaler.step(optimizer)` after clipping.")


def _zeroed_before_step_message(s: Seen) -> str:
    return (
        f"{s.where}: all gradients were zero when scaler.step() ran: did you call zero_grad() after "
        "backward? It erases the gradients before the optimizer uses them; zero them at the start of "
        "the step."
    )


@rule("gradients zeroed before the step", _zeroed_before_step_message)
def gradients_zeroed_before_the_step(s: Seen) -> bool:
    return s.scaler_step["all_zero"] and not s.ref_event("scaler.step")["all_zero"]


def _step_twice_message(s: Seen) -> str:
    return (
        f"{s.where}: you called scaler.step(optimizer) twice in one step. A step is one "
        "scaler.step(optimizer) and then one scaler.update(); torch refuses a second step() before update() "
        "('step() has already been called since the last update()'), and without update() the scale "
        "never adapts."
    )


@rule("scaler.step twice", _step_twice_message)
def scaler_step_twice(s: Seen) -> bool:
    return s.scaling and s.log.count("scaler.step") > 1


@worded(step_rules.no_update)
def no_update(s: Seen) -> str:
    return (
        f"{s.where}: scaler.update() was never called. Without it the scale never adapts (no backoff after "
        "an overflow, no growth), and the next scaler.step() fails with 'step() has already been called "
        "since the last update()'. End the step with `scaler.update()`."
    )


@worded(step_rules.update_more_than_once)
def update_more_than_once(s: Seen) -> str:
    count = s.log.count("update")
    return f"{s.where}: scaler.update() was called {count} times; once per step, after scaler.step()."


CALL_RULES = (
    autocast_left_on,
    step_rules.model_left_in_eval,
    new_grad_scaler,
    low_precision_parameters,
    model_never_called,
    cpu_autocast_on_cuda_data,
    cuda_autocast_on_cpu_tensors,
    forward_outside_autocast,
    autocast_dtype_ignored,
    loss_never_computed,
    loss_outside_autocast,
    no_backward,
    backward_inside_autocast,
    loss_scaled_by_hand,
    backward_on_the_unscaled_loss,
    loss_scaled_by_something_else,
    zero_grad_after_backward,
    stale_gradients,
    optimizer_step_called_directly,
    unscale_twice,
    unscale_after_step,
    update_before_step,
    clipping_raised_on_an_overflow,
    no_scaler_step,
    gradients_zeroed_before_the_step,
    scaler_step_twice,
    no_update,
    update_more_than_once,
    step_rules.learner_error,
)


# --------------------------------------------------------------------------------------------- clipping
# Judged by the gradient norm the optimizer used (the calls all looked right).


def _max_norm_times_scale_message(s: Seen) -> str:
    return (
        f"{s.where}: you clipped the still-scaled gradients against max_norm * scale. The update comes out "
        "right here, but clip_grad_norm_ returns a norm that is `scale` times too large (the number you "
        "would log or guard on), and get_scale() synchronises with the GPU every step. Call "
        "`scaler.unscale_(optimizer)` and clip the true gradients with the plain `max_norm`."
    )


@rule("clipped scaled gradients against max_norm * scale", _max_norm_times_scale_message)
def clipped_against_max_norm_times_scale(s: Seen) -> bool:
    step = s.scaler_step
    if not s.norm_finite or s.clipped_wrong or s.max_norm is None or step["unscaled"]:
        return False
    return close(step["norm"], s.max_norm * step["scale"], 0.02)


def _max_norm_over_scale_message(s: Seen) -> str:
    return (
        f"{s.where}: you clipped the still-scaled gradients to max_norm / scale instead of unscaling them. "
        f"clip_grad_norm_ cut gradients {scale_text(s.scale_used)} times too large to norm max_norm / scale; "
        f"scaler.step() then divided them by the scale once more, so the update had norm {s.norm_used:.3g} "
        f"(max_norm / scale^2), not {s.max_norm}. Call `scaler.unscale_(optimizer)`, then clip with the "
        "plain max_norm."
    )


@rule("clipped scaled gradients against max_norm / scale", _max_norm_over_scale_message)
def clipped_against_max_norm_over_scale(s: Seen) -> bool:
    if not s.clipped_wrong or s.max_norm is None or s.scaler_step is None or s.scaler_step["unscaled"]:
        return False
    return close(s.norm_used, s.max_norm / s.scale_used**2, 0.05)


def _before_unscale_message(s: Seen) -> str:
    return (
        f"{s.where}: you clipped before scaler.unscale_(). clip_grad_norm_ saw gradients "
        f"{scale_text(s.scale_used)} times too large and cut them to norm {s.max_norm}; after "
        f"unscaling the update had norm {s.norm_used:.3g}, {scale_text(s.scale_used)} times "
        "smaller than intended. Call unscale_ first, then clip."
    )


@rule("clipped before unscale_", _before_unscale_message)
def clipped_before_unscale(s: Seen) -> bool:
    return s.clipped_wrong and s.clipped_scaled and s.event("unscale_") is not None


def _without_unscale_message(s: Seen) -> str:
    return (
        f"{s.where}: you clipped without calling scaler.unscale_(optimizer) first. clip_grad_norm_ saw the "
        f"scaled gradients ({scale_text(s.scale_used)} times too large) and cut them to norm "
        f"{s.max_norm}; scaler.step() then unscaled them to norm {s.norm_used:.3g}. Call "
        "`scaler.unscale_(optimizer)` before clipping."
    )


@rule("clipped without unscale_", _without_unscale_message)
def clipped_without_unscale(s: Seen) -> bool:
    return s.clipped_wrong and s.clipped_scaled


def _after_step_message(s: Seen) -> str:
    return (
        f"{s.where}: you clipped after scaler.step(): the optimizer had already used gradients of norm "
        f"{s.norm_used:.4g} > max_norm={s.max_norm}. Clip between unscale_ and step."
    )


@rule("clipped after step", _after_step_message)
def clipped_after_step(s: Seen) -> bool:
    """The gradients left after the step are clipped (or smaller) but the optimizer used larger ones."""
    after = s.got.norm_after
    return step_rules.norm_above_max(s) and (close(after, s.max_norm, 0.02) or after < s.norm_used * 0.98)


@worded(step_rules.not_clipped)
def not_clipped(s: Seen) -> str:
    return (
        f"{s.where}: the gradients were not clipped: the optimizer used a gradient norm of {s.norm_used:.4g} "
        f"although max_norm={s.max_norm}. After `scaler.unscale_(optimizer)`, call "
        "`torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)`."
    )


@worded(step_rules.clipped_to_another_norm)
def clipped_to_another_norm(s: Seen) -> str:
    return (
        f"{s.where}: the gradient norm the optimizer used was {s.norm_used:.4g}, but clipping the unscaled "
        f"gradients to max_norm={s.max_norm} gives {s.norm_expected:.4g}. Use clip_grad_norm_ (not "
        "clip_grad_value_) on model.parameters() with max_norm, after unscale_."
    )


CLIP_RULES = (
    step_rules.unscaled_by_hand,
    clipped_against_max_norm_times_scale,
    step_rules.clipped_although_max_norm_none,
    clipped_against_max_norm_over_scale,
    clipped_before_unscale,
    clipped_without_unscale,
    step_rules.changed_not_clipped_by_total_norm,
    clipped_after_step,
    not_clipped,
    clipped_to_another_norm,
)

# ---------------------------------------------------------------- what the step left behind and returned


@worded(step_rules.loss_scale_differs)
def loss_scale_differs(s: Seen) -> str:
    return (
        f"{s.where}: the loss scale after the step is {scale_text(s.got.scale_after)}; the reference step "
        f"leaves {scale_text(s.ref.scale_after)}. Call scaler.update() exactly once, "
        "after scaler.step(optimizer)."
    )


@worded(step_rules.overflowing_step_not_skipped)
def overflowing_step_not_skipped(s: Seen) -> str:
    return (
        f"{s.where}: this step overflowed and must be skipped, but the parameters changed. "
        "scaler.step(optimizer) skips optimizer.step() when the gradients contain inf/NaN."
    )


@worded(step_rules.parameters_differ)
def parameters_differ(s: Seen) -> str:
    p_ref, p_got = s.first_param_difference
    diff = (p_ref - p_got).abs().max().item() if p_ref.shape == p_got.shape else float("nan")
    return (
        f"{s.where}: after your step the parameters differ from the reference step's by up to "
        f"{diff:.3g}, although every call looked right. Follow the order zero_grad -> autocast(forward, "
        "loss) -> scaler.scale(loss).backward() -> unscale_ -> clip -> scaler.step -> scaler.update."
    )


@worded(step_rules.returned_none)
def returned_none(s: Seen) -> str:
    return f"{s.where}: train_step returned None. Return the unscaled loss (e.g. `return loss.detach()`)."


def _several_values_message(s: Seen) -> str:
    shape = tuple(s.got.returned.shape)
    return f"{s.where}: train_step returned a tensor of shape {shape}; return the scalar loss."


@rule("returned several values", _several_values_message)
def returned_several_values(s: Seen) -> bool:
    return isinstance(s.got.returned, torch.Tensor) and s.got.returned.numel() != 1


@worded(step_rules.returned_something_else)
def returned_something_else(s: Seen) -> str:
    return (
        f"{s.where}: train_step returned a {type(s.got.returned).__name__}; return the unscaled loss tensor."
    )


def _scaled_loss_message(s: Seen) -> str:
    return (
        f"{s.where}: train_step returned the scaled loss ({s.returned_number:.6g} = loss x "
        f"{scale_text(s.got.scale_before)}). Return the loss as loss_fn computed it; scaler.scale(loss) is "
        "only for backward."
    )


@rule("returned the scaled loss", _scaled_loss_message)
def returned_the_scaled_loss(s: Seen) -> bool:
    loss = float(s.ref.returned)
    return not close(s.returned_number, loss, 1e-3) and close(
        s.returned_number, loss * s.got.scale_before, 1e-3
    )


def _another_value_message(s: Seen) -> str:
    return (
        f"{s.where}: train_step returned {s.returned_number:.6g}, but the loss of this batch "
        f"is {float(s.ref.returned):.6g}."
    )


@rule("returned another value", _another_value_message)
def returned_another_value(s: Seen) -> bool:
    return not close(s.returned_number, float(s.ref.returned), 1e-3)


RESULT_RULES = (
    loss_scale_differs,
    overflowing_step_not_skipped,
    parameters_differ,
    returned_none,
    returned_several_values,
    returned_something_else,
    returned_the_scaled_loss,
    returned_another_value,
)

TRAIN_STEP_RULES = CALL_RULES + CLIP_RULES + RESULT_RULES

TRAIN_STEP = step_rules.StepExercise(
    what="`train_step`",
    reference=reference_train_step,
    scenarios=SCENARIOS,
    probed_run=ProbedRun,
    seen=Seen,
    rules=TRAIN_STEP_RULES,
)


# ------------------------------------------------------------------------------------------- the checkers


@checker("03.1 the AMP training step")
def check_train_step(train_step):
    """``train_step(model, optimizer, scaler, loss_fn, inputs, targets, *, dtype, max_norm) -> loss``."""
    if not callable(train_step):
        call_learner(train_step)  # turns None / a string / a number into a clear message
    result = step_rules.judge(TRAIN_STEP, train_step)
    if result is not None:
        return result
    return passed(
        f"Your step matches the reference in all {len(SCENARIOS)} scenarios: autocast around forward and "
        "loss on the data's device, scaled backward outside it, unscale_ before clipping, scaler.step + "
        "update, overflowing steps skipped with the scale backed off, the scale growing between consecutive "
        "steps, and the same code running BF16 with a disabled scaler."
    )


# ------------------------------------------------------------------ exercise 2: scheduler after real updates

# overflow pattern of the scheduler check: skipped first steps (a too-large init_scale), growth, a later spike
SCHEDULER_PATTERN = (True, True, False, False, False, True, False, False, False, False)


UPDATE_AGAIN = (
    "Your function called scaler.update(), but update() already ran in this iteration, right after "
    "scaler.step(): once per iteration. A second update() finds no inf checks left to read (torch stops "
    "it with 'No inf checks were recorded prior to update.'), or, given a new scale, overwrites the one "
    "GradScaler chose. Only read the scale: compare scaler.get_scale() with scale_before."
)


def _scheduler_setup():
    """A one-weight model, its optimizer and a real GradScaler (init_scale=2**8, growth_interval=2)."""
    weight = nn.Parameter(torch.ones(4))
    optimizer = torch.optim.SGD([weight], lr=0.1)
    scaler = UpdateCountingScaler(DEVICE_TYPE, init_scale=2.0**8, growth_interval=2)
    x = torch.linspace(0.5, 2.0, 4)
    return weight, optimizer, scaler, x


def _train_iteration(weight, optimizer, scaler, x, overflow: bool) -> float:
    """One scaled step (an inf gradient when ``overflow``) through scaler.update(); returns the old scale."""
    optimizer.zero_grad()
    scale_before = scaler.get_scale()
    scaler.scale((weight * x).sum()).backward()
    if overflow:
        weight.grad[0] = float("inf")
    scaler.step(optimizer)
    scaler.update()
    return scale_before


def _as_bool(got):
    """The learner's answer as a bool (a one-element bool tensor counts), None when it is not one."""
    if isinstance(got, torch.Tensor) and got.numel() == 1 and got.dtype == torch.bool:
        got = bool(got)
    return bool(got) if type(got).__name__ in ("bool", "bool_") else None


def _judge_answer(iteration: int, overflow: bool, got, calls: int, scale_before: float, scale_after: float):
    """The verdict on one iteration's answer ``got`` and its ``calls`` to scheduler.step(); None if right."""
    answer = _as_bool(got)
    if answer is None:
        return failed(
            f"step_scheduler_if_updated returned {got!r}; return True when the optimizer "
            "really stepped (and you stepped the scheduler), False otherwise."
        )
    change = (
        f"the scale went from {scale_text(scale_before)} to {scale_text(scale_after)}"
        if scale_after != scale_before
        else f"the scale stayed at {scale_text(scale_after)}"
    )
    if overflow:
        if not (answer or calls):
            return None
        return failed(
            f"Iteration {iteration} overflowed and scaler.step() skipped the update ({change}), but "
            + ("you stepped the scheduler" if calls else "you returned True")
            + ". A skipped update must not advance the schedule: a drop in the scale means skipped."
        )
    if not answer:
        why = (
            "the scale grew, which GradScaler only does after growth_interval successful steps"
            if scale_after > scale_before
            else "an unchanged scale means there was no overflow"
        )
        return failed(
            f"Iteration {iteration} really updated the weights ({change}: {why}), but you "
            "returned False. Compare with `>=`: only a *drop* in the scale means a skipped step."
        )
    if calls != 1:
        return failed(
            f"Iteration {iteration} really updated the weights and you returned True, but "
            f"scheduler.step() was called {calls} times; call it exactly once when the "
            "step was real."
        )
    return None


def _judge_iteration(
    step_scheduler_if_updated, scaler, scheduler, iteration: int, overflow: bool, scale_before
):
    """Call the learner's function after this iteration's scaler.update() and judge what it did."""
    scale_after = scaler.get_scale()
    calls_before, updates_before = scheduler.calls, scaler.updates
    try:
        got = call_learner(
            step_scheduler_if_updated, scaler, scheduler, scale_before, what="`step_scheduler_if_updated`"
        )
    except LearnerProblem:
        if scaler.updates > updates_before:
            return failed(UPDATE_AGAIN)
        raise
    if scaler.updates > updates_before:
        return failed(UPDATE_AGAIN)
    if scaler.get_scale() != scale_after:
        return failed(
            "Your function changed the loss scale: it must only read it "
            "(scaler.get_scale()); scaler.update() already ran in this iteration."
        )
    calls = scheduler.calls - calls_before
    return _judge_answer(iteration, overflow, got, calls, scale_before, scale_after)


# BF16 training creates the same scaler disabled (GradScaler(enabled=False)): every scaler.step() is a real
# optimizer.step() and the scale reads 1.0 throughout, so every iteration must step the scheduler.
DISABLED_ITERATIONS = 3


def _disabled_message(iteration: int, what: str) -> str:
    return (
        f"With a disabled GradScaler (BF16 training: `GradScaler(enabled=False)`, scale 1.0 throughout), "
        f"iteration {iteration} was a real optimizer update, but {what}. A disabled scaler never skips a "
        "step: every scaler.step() is optimizer.step(), so the scheduler must step every iteration "
        "(`scaler.get_scale() >= scale_before` is True there, with no special case)."
    )


def _disabled_scaler_phase(step_scheduler_if_updated):
    """The same function with a disabled scaler, as a BF16 run has it; a failed result, or None if right."""
    weight, optimizer, _, x = _scheduler_setup()
    scaler = UpdateCountingScaler(DEVICE_TYPE, enabled=False)
    # torch's disabled scaler has no _scale / _backoff_factor / ...; the getters an answer may read work here
    # (the lesson is about when to step the scheduler, not about that quirk)
    for name, value in (("_scale", torch.tensor(1.0)), ("_growth_factor", 2.0), ("_backoff_factor", 0.5)):
        setattr(scaler, name, value)
    scaler._growth_interval, scaler._init_growth_tracker = 2000, 0
    scheduler = CountingStepLR(optimizer)
    for iteration in range(DISABLED_ITERATIONS):
        scale_before = _train_iteration(weight, optimizer, scaler, x, overflow=False)
        calls_before = scheduler.calls
        try:
            got = call_learner(
                step_scheduler_if_updated, scaler, scheduler, scale_before, what="`step_scheduler_if_updated`"
            )
        except LearnerProblem as problem:
            return failed(_disabled_message(iteration, f"then {problem.result.message}"))
        answer, calls = _as_bool(got), scheduler.calls - calls_before
        if answer is True and calls == 1:
            continue
        if answer is not True:
            what = f"you returned {got!r}" + (" and did not step the scheduler" if not calls else "")
        else:
            what = f"scheduler.step() was called {calls} times"
        return failed(_disabled_message(iteration, what))
    return None


@checker("03.2 step the scheduler only after real updates")
def check_scheduler_step(step_scheduler_if_updated):
    """``step_scheduler_if_updated(scaler, scheduler, scale_before) -> bool`` after ``scaler.update()``."""
    weight, optimizer, scaler, x = _scheduler_setup()
    scheduler = CountingStepLR(optimizer)
    with warnings.catch_warnings(), one_cpu_thread():
        # the 'lr_scheduler.step() before optimizer.step()' warning is the lesson's, not the check's
        warnings.simplefilter("ignore")
        for iteration, overflow in enumerate(SCHEDULER_PATTERN):
            scale_before = _train_iteration(weight, optimizer, scaler, x, overflow)
            verdict = _judge_iteration(
                step_scheduler_if_updated, scaler, scheduler, iteration, overflow, scale_before
            )
            if verdict is not None:
                return verdict
        verdict = _disabled_scaler_phase(step_scheduler_if_updated)
        if verdict is not None:
            return verdict
    updates = SCHEDULER_PATTERN.count(False)
    return passed(
        f"Over {len(SCHEDULER_PATTERN)} iterations with {SCHEDULER_PATTERN.count(True)} skipped "
        f"updates you stepped the scheduler exactly {updates} times, once per real optimizer update."
    )
