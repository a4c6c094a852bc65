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
"""

from __future__ import annotations

import warnings

import torch
from torch import nn

from amp_lessons.checks.harness import NOT_DONE, LearnerProblem, call_learner, checker, failed, passed
from amp_lessons.checks.mistakes import Mistake, name_mistake
from amp_lessons.core.display import scale_text
from amp_lessons.core.environment import dtype_name, one_cpu_thread
from amp_lessons.l03_autocast_and_gradscaler.probes import (
    DEVICE_TYPE,
    SCENARIOS,
    CallRecord,
    CountingStepLR,
    ProbedRun,
    Seen,
    UpdateCountingScaler,
    close,
    recorded_call,
)
from amp_lessons.l03_autocast_and_gradscaler.training import train_step as reference_train_step

# ------------------------------------------------------------------------------------- one recorded call


def _call(run: ProbedRun, fn, index: int, learner: bool) -> CallRecord:
    """Call ``fn`` on the run's next batch and record everything the probes saw."""
    inputs, targets = run.batches[index]
    kwargs = {"dtype": run.scenario.dtype, "max_norm": run.scenario.max_norm}
    with recorded_call(run) as record:
        try:
            if learner:
                record.returned = call_learner(
                    fn,
                    run.model,
                    run.optimizer,
                    run.scaler,
                    run.loss_fn,
                    inputs.clone(),
                    targets.clone(),
                    what="`train_step`",
                    **kwargs,
                )
            else:
                record.returned = fn(
                    run.model, run.optimizer, run.scaler, run.loss_fn, inputs, targets, **kwargs
                )
        except LearnerProblem as problem:
            record.problem = problem
    return record


# ------------------------------------------------------------------------------------------- diagnosis


def _error_or(text: str):
    """The learner's error when there was one (it explains the missing call), else ``text``."""
    return lambda s: f"{s.where}: {s.error}" if s.error else f"{s.where}: {text}"


def _torch_said(error: str) -> str:
    """The exception in a learner-error message, without the checker's prefix and the code location."""
    return error.split(" raised an error: ", 1)[-1].split(" (at line ", 1)[0]


def _is_cuda_autocast(s: Seen) -> bool:
    lower = s.lower
    return bool(
        s.event("forward")["autocast_cuda"]
        or ("cuda" in lower and ("not available" in lower or "deprecated" in lower))
    )


def _cuda_autocast_message(s: Seen) -> str:
    how = (
        "torch.cuda.amp.autocast (deprecated, and CUDA-only)"
        if "torch.cuda.amp.autocast" in s.lower
        else "device_type='cuda'"
    )
    return (
        f"{s.where}: autocast was on for CUDA but the tensors are on the CPU, so the forward pass ran in "
        f"FP32: you used {how}. Take the device from the data: "
        "`torch.autocast(device_type=inputs.device.type, dtype=dtype)`."
    )


def _stale_message(s: Seen) -> str:
    end = (
        " You clear them at the end of the step: the first step of a run (or one after any other "
        "backward) still adds up old gradients, so clear at the start."
        if s.log.after_last("zero_grad", "update")
        else ""
    )
    return (
        f"{s.where}: gradients from an earlier backward pass were still in .grad when backward ran, so "
        "they were added to this step's gradients. Start the step with `optimizer.zero_grad()`." + end
    )


def _order(s: Seen, first: str, then: str) -> bool:
    """Both events happened, and the first ``first`` came after the first ``then``."""
    names = s.names
    return first in names and then in names and names.index(first) > names.index(then)


# The calls: what the learner's step did, in the order a mistake would first show. Every rule reads ``Seen``.
CALL_RULES = (
    Mistake(
        "autocast left on",
        lambda s: s.got.autocast_left_on,
        lambda s: (
            f"{s.where}: autocast was still switched on after train_step returned. Use it as a context manager, "
            "`with torch.autocast(device_type=..., dtype=dtype):`, so it ends after the loss."
        ),
    ),
    Mistake(
        "model left in eval mode",
        lambda s: s.got.left_in_eval and not s.ref.left_in_eval,
        lambda s: (
            f"{s.where}: the model was in eval mode after train_step returned. A training step trains: leave "
            "the model in train mode (model.train()), or dropout and batch norm behave as at inference."
        ),
    ),
    Mistake(
        "new GradScaler",
        lambda s: s.got.new_scalers > 0,
        lambda s: (
            f"{s.where}: your train_step created a new GradScaler"
            + (
                " (and torch.cuda.amp.GradScaler is deprecated: use torch.amp.GradScaler)"
                if "torch.cuda.amp.gradscaler" in s.lower
                else ""
            )
            + ". Create the scaler once per training run and use the one passed in: a fresh scaler starts from "
            "init_scale every step, so it never learns a safe scale, and the skip/backoff history that protects "
            "training is thrown away."
        ),
    ),
    Mistake(
        "low-precision parameters",
        lambda s: bool(s.low_param_dtypes),
        lambda s: (
            f"{s.where}: the model's parameters became "
            f"{', '.join(sorted(dtype_name(d) for d in s.low_param_dtypes))} — did you call .half() / .to(dtype) "
            "on the model? Keep the parameters in FP32: autocast casts a low-precision copy for each op that "
            "wants one, the optimizer updates the FP32 parameters (small updates survive), and GradScaler "
            "refuses FP16 gradients ('Attempting to unscale FP16 gradients.')."
        ),
    ),
    Mistake(
        "model never called",
        lambda s: s.event("forward") is None,
        _error_or("the model was never called. Compute `outputs = model(inputs)` inside autocast."),
    ),
    Mistake(
        "CPU autocast on CUDA data",
        lambda s: s.event("forward")["autocast"] and not s.autocast_expected,
        lambda s: (
            f"{s.where}: the data is on a CUDA device, but your step switched on autocast for the CPU. On a GPU "
            "that autocast does nothing for the model's ops, so the whole step would run in FP32. Take the "
            "device type from the data: `torch.autocast(device_type=inputs.device.type, dtype=dtype)`."
        ),
    ),
    Mistake(
        "autocast for CUDA on CPU tensors",
        lambda s: s.autocast_expected and not s.event("forward")["autocast"] and _is_cuda_autocast(s),
        _cuda_autocast_message,
    ),
    Mistake(
        "forward outside autocast",
        lambda s: s.autocast_expected and not s.event("forward")["autocast"],
        lambda s: (
            f"{s.where}: the forward pass did not run under autocast (the model ran in FP32). Wrap the forward "
            "pass and the loss in `with torch.autocast(device_type=inputs.device.type, dtype=dtype):`."
        ),
    ),
    Mistake(
        "autocast dtype ignored",
        lambda s: s.event("forward")["autocast"] and s.event("forward")["dtype"] != s.scenario.dtype,
        lambda s: (
            f"{s.where}: autocast ran in {dtype_name(s.event('forward')['dtype'])}, but train_step was called "
            f"with dtype={dtype_name(s.scenario.dtype)}. Pass it on: `torch.autocast(..., dtype=dtype)`."
        ),
    ),
    Mistake(
        "loss never computed",
        lambda s: s.event("loss") is None,
        _error_or("loss_fn was never called. Compute `loss = loss_fn(outputs, targets)` inside autocast."),
    ),
    Mistake(
        "loss outside autocast",
        lambda s: (
            s.autocast_expected
            and not s.event("loss")["autocast"]
            and s.event("loss")["input_dtype"] != torch.float32
        ),
        lambda s: (
            f"{s.where}: the loss was computed outside autocast. Put `loss = loss_fn(outputs, targets)` inside "
            "the same `with torch.autocast(...)` block as the forward pass: the policy decides the loss's "
            "precision too (on CUDA, cross_entropy and mse_loss are on its float32 list); outside it the loss "
            "runs in whatever low precision the outputs happen to have."
        ),
    ),
    Mistake(
        "no backward",
        lambda s: s.event("backward") is None,
        _error_or(
            "there was no backward pass. Call `scaler.scale(loss).backward()` after the autocast block."
        ),
    ),
    Mistake(
        "backward inside autocast",
        lambda s: s.event("backward")["autocast"],
        lambda s: (
            f"{s.where}: backward ran inside the autocast block. Autocast should cover only the forward pass and "
            "the loss (the PyTorch docs advise against backward under autocast), and it is not harmless: "
            "backward ops are dispatched through autocast again, so a region you kept in FP32 with "
            "`torch.autocast(..., enabled=False)` gets low-precision gradients. Move "
            "`scaler.scale(loss).backward()` below the `with` block."
        ),
    ),
    Mistake(
        "loss scaled by hand",
        lambda s: (
            s.scaling
            and s.event("scale") is None
            and s.output_grads_finite
            and close(s.event("backward")["grad_absmax"], s.ref_event("backward")["grad_absmax"], 0.05)
        ),
        lambda s: (
            f"{s.where}: you scaled the loss by hand (e.g. `(loss * scaler.get_scale()).backward()`) instead of "
            "calling `scaler.scale(loss)`. The gradients come out scaled by the same factor, but scaler.scale() "
            "also sets up the scaler's state for this step (its scale tensor, on the loss's device), which "
            "unscale_, step and update rely on"
            + (f" (here torch stopped it: {_torch_said(s.error)})" if s.error else "")
            + ", and get_scale() makes the CPU wait for the GPU at every step. Use "
            "`scaler.scale(loss).backward()`."
        ),
    ),
    Mistake(
        "backward on the unscaled loss",
        lambda s: (
            s.scaling
            and (
                s.event("scale") is None
                or (
                    s.output_grads_finite
                    and close(
                        s.event("backward")["grad_absmax"],
                        s.ref_event("backward")["grad_absmax"] / s.got.scale_before,
                        0.05,
                    )
                )
            )
        ),
        lambda s: (
            f"{s.where}: backward ran on the unscaled loss (`loss.backward()`). Scale it first: "
            "`scaler.scale(loss).backward()`. Otherwise small FP16 gradients still underflow, and "
            "scaler.step() divides the gradients by the scale anyway, so every update is "
            f"{scale_text(s.got.scale_before)} times too small."
        ),
    ),
    Mistake(
        "loss scaled by something else",
        lambda s: (
            s.output_grads_finite
            and not close(s.event("backward")["grad_absmax"], s.ref_event("backward")["grad_absmax"], 0.05)
        ),
        lambda s: (
            f"{s.where}: the gradient reaching the model output was {s.output_grad_ratio:.4g} times the "
            "unscaled one; with `scaler.scale(loss).backward()` it is exactly the scale, "
            f"{scale_text(s.got.scale_before)}. Scale the loss once, with scaler.scale, and call backward on "
            "that."
        ),
    ),
    Mistake(
        "zero_grad after backward",
        lambda s: s.log.between("zero_grad", "backward", "scaler.step"),
        lambda s: (
            f"{s.where}: you called zero_grad() after backward: it erased this step's gradients before the "
            "optimizer used them. Zero the gradients at the start of the step, before the forward pass."
        ),
    ),
    Mistake("stale gradients", lambda s: s.event("backward")["stale"], _stale_message),
    Mistake(
        "optimizer.step() called directly",
        lambda s: (
            any(e["name"] == "optimizer.step" and not e["via_scaler"] for e in s.log.events)
            and (s.scaling or s.log.count("optimizer.step") > 1)
        ),
        lambda s: (
            f"{s.where}: you called optimizer.step() directly"
            + (" as well as scaler.step(optimizer) (so it stepped twice)" if "scaler.step" in s.names else "")
            + ". Use `scaler.step(optimizer)` only: it unscales the gradients if you have not, and skips the "
            "update when they contain inf/NaN; optimizer.step() applies scaled or non-finite gradients to the "
            "weights."
        ),
    ),
    Mistake(
        "unscale_ twice",
        lambda s: s.scaling and s.log.count("unscale_") > 1,
        lambda s: (
            f"{s.where}: scaler.unscale_(optimizer) was called twice in one step (torch raises 'unscale_() has "
            "already been called on this optimizer since the last update()'). Call it once, after backward "
            "and before clipping."
        ),
    ),
    Mistake(
        "unscale_ after step",
        lambda s: s.scaling and _order(s, "unscale_", "scaler.step"),
        lambda s: (
            f"{s.where}: scaler.unscale_() came after scaler.step(). step() has already unscaled and applied the "
            "gradients; unscale_ belongs between backward and clipping."
        ),
    ),
    Mistake(
        "update before step",
        lambda s: (
            s.scaling
            and "update" in s.names
            and ("scaler.step" not in s.names or _order(s, "scaler.step", "update"))
        ),
        lambda s: (
            f"{s.where}: scaler.update() ran before scaler.step(optimizer). update() reads the inf checks of "
            "this step's step() and then resets them, so it must come last: "
            "backward -> unscale_ -> clip -> step -> update."
        ),
    ),
    Mistake(
        "clipping raised on an overflow",
        lambda s: (
            "scaler.step" not in s.names and bool(s.error) and "non-finite" in s.lower and "clip" in s.lower
        ),
        lambda s: (
            f"{s.where}: {s.error}. With a GradScaler, inf/NaN gradients are expected now and then (an "
            "overflow that scaler.step skips): do not make clipping raise on them (error_if_nonfinite=False)."
        ),
    ),
    Mistake(
        "no scaler.step",
        lambda s: "scaler.step" not in s.names and (s.scaling or "optimizer.step" not in s.names),
        _error_or("the optimizer never stepped. Call `scaler.step(optimizer)` after clipping."),
    ),
    Mistake(
        "gradients zeroed before the step",
        lambda s: s.scaler_step["all_zero"] and not s.ref_event("scaler.step")["all_zero"],
        lambda s: (
            f"{s.where}: all gradients were zero when scaler.step() ran: did you call zero_grad() after "
            "backward? It erases the gradients before the optimizer uses them; zero them at the start of the "
            "step."
        ),
    ),
    Mistake(
        "scaler.step twice",
        lambda s: s.scaling and s.log.count("scaler.step") > 1,
        lambda s: (
            f"{s.where}: you called scaler.step(optimizer) twice in one step. A step is one "
            "scaler.step(optimizer) and then one scaler.update(); torch refuses a second step() before update() "
            "('step() has already been called since the last update()'), and without update() the scale never "
            "adapts."
        ),
    ),
    Mistake(
        "no update",
        lambda s: s.scaling and "update" not in s.names,
        lambda s: (
            f"{s.where}: scaler.update() was never called. Without it the scale never adapts (no backoff after "
            "an overflow, no growth), and the next scaler.step() fails with 'step() has already been called "
            "since the last update()'. End the step with `scaler.update()`."
        ),
    ),
    Mistake(
        "update more than once",
        lambda s: s.scaling and s.log.count("update") > 1,
        lambda s: (
            f"{s.where}: scaler.update() was called {s.log.count('update')} times; once per step, after "
            "scaler.step()."
        ),
    ),
    Mistake("learner error", lambda s: bool(s.error), lambda s: f"{s.where}: {s.error}"),
)

# Clipping, judged by the gradient norm the optimizer used (the calls all looked right).
CLIP_RULES = (
    Mistake(
        "clipped scaled gradients against max_norm * scale",
        lambda s: (
            s.norm_finite
            and not s.clipped_wrong
            and s.max_norm is not None
            and not s.scaler_step["unscaled"]
            and close(s.scaler_step["norm"], s.max_norm * s.scaler_step["scale"], 0.02)
        ),
        lambda s: (
            f"{s.where}: you clipped the still-scaled gradients against max_norm * scale. The update comes out "
            "right here, but clip_grad_norm_ returns a norm that is `scale` times too large (the number you "
            "would log or guard on), and get_scale() synchronises with the GPU every step. Call "
            "`scaler.unscale_(optimizer)` and clip the true gradients with the plain `max_norm`."
        ),
    ),
    Mistake(
        "clipped although max_norm is None",
        lambda s: s.clipped_wrong and s.max_norm is None,
        lambda s: (
            f"{s.where}: max_norm is None, which means no clipping, but the gradient norm the optimizer used was "
            f"{s.norm_used:.4g} instead of {s.norm_expected:.4g}. Clip only `if max_norm is not None:`."
        ),
    ),
    Mistake(
        "clipped scaled gradients against max_norm / scale",
        lambda s: (
            s.clipped_wrong
            and s.max_norm is not None
            and s.scaler_step is not None
            and not s.scaler_step["unscaled"]
            and close(s.norm_used, s.max_norm / s.scale_used**2, 0.05)
        ),
        lambda s: (
            f"{s.where}: you clipped the still-scaled gradients to max_norm / scale instead of unscaling them. "
            f"clip_grad_norm_ cut gradients {scale_text(s.scale_used)} times too large to norm max_norm / scale; "
            f"scaler.step() then divided them by the scale once more, so the update had norm {s.norm_used:.3g} "
            f"(max_norm / scale^2), not {s.max_norm}. Call `scaler.unscale_(optimizer)`, then clip with the "
            "plain max_norm."
        ),
    ),
    Mistake(
        "clipped before unscale_",
        lambda s: s.clipped_wrong and s.clipped_scaled and s.event("unscale_") is not None,
        lambda s: (
            f"{s.where}: you clipped before scaler.unscale_(). clip_grad_norm_ saw gradients "
            f"{scale_text(s.scale_used)} times too large and cut them to norm {s.max_norm}; after "
            f"unscaling the update had norm {s.norm_used:.3g}, {scale_text(s.scale_used)} times "
            "smaller than intended. Call unscale_ first, then clip."
        ),
    ),
    Mistake(
        "clipped without unscale_",
        lambda s: s.clipped_wrong and s.clipped_scaled,
        lambda s: (
            f"{s.where}: you clipped without calling scaler.unscale_(optimizer) first. clip_grad_norm_ saw the "
            f"scaled gradients ({scale_text(s.scale_used)} times too large) and cut them to norm "
            f"{s.max_norm}; scaler.step() then unscaled them to norm {s.norm_used:.3g}. Call "
            "`scaler.unscale_(optimizer)` before clipping."
        ),
    ),
    Mistake(
        "changed, but not clipped by total norm",
        lambda s: (
            s.clipped_wrong
            and s.max_norm is not None
            and s.norm_used > s.max_norm * 1.02
            and not close(s.norm_used, s.unclipped_norm, 0.02)
        ),
        lambda s: (
            f"{s.where}: the gradient norm the optimizer used was {s.norm_used:.4g}: the gradients were changed, "
            f"but not clipped to total norm max_norm={s.max_norm} (unclipped it is {s.unclipped_norm:.4g}). Use "
            "`torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)`, not clip_grad_value_, after "
            "unscale_."
        ),
    ),
    Mistake(
        "clipped after step",
        lambda s: (
            s.clipped_wrong
            and s.max_norm is not None
            and s.norm_used > s.max_norm * 1.02
            and (close(s.got.norm_after, s.max_norm, 0.02) or s.got.norm_after < s.norm_used * 0.98)
        ),
        lambda s: (
            f"{s.where}: you clipped after scaler.step(): the optimizer had already used gradients of norm "
            f"{s.norm_used:.4g} > max_norm={s.max_norm}. Clip between unscale_ and step."
        ),
    ),
    Mistake(
        "not clipped",
        lambda s: s.clipped_wrong and s.max_norm is not None and s.norm_used > s.max_norm * 1.02,
        lambda s: (
            f"{s.where}: the gradients were not clipped: the optimizer used a gradient norm of {s.norm_used:.4g} "
            f"although max_norm={s.max_norm}. After `scaler.unscale_(optimizer)`, call "
            "`torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)`."
        ),
    ),
    Mistake(
        "clipped to another norm",
        lambda s: s.clipped_wrong,
        lambda s: (
            f"{s.where}: the gradient norm the optimizer used was {s.norm_used:.4g}, but clipping the unscaled "
            f"gradients to max_norm={s.max_norm} gives {s.norm_expected:.4g}. Use clip_grad_norm_ (not "
            "clip_grad_value_) on model.parameters() with max_norm, after unscale_."
        ),
    ),
)


def _params_differ_message(s: Seen) -> str:
    p_ref, p_got = s.first_param_difference
    diff = (p_ref - p_got).abs().max().item() if p_ref.shape == p_got.shape else float("nan")
    return (
        f"{s.where}: after your step the parameters differ from the reference step's by up to "
        f"{diff:.3g}, although every call looked right. Follow the order zero_grad -> autocast(forward, "
        "loss) -> scaler.scale(loss).backward() -> unscale_ -> clip -> scaler.step -> scaler.update."
    )


# What the step left behind and returned: the scale, the parameters, the loss.
RESULT_RULES = (
    Mistake(
        "loss scale differs",
        lambda s: not close(s.got.scale_after, s.ref.scale_after, 1e-6),
        lambda s: (
            f"{s.where}: the loss scale after the step is {scale_text(s.got.scale_after)}; the reference step "
            f"leaves {scale_text(s.ref.scale_after)}. Call scaler.update() exactly once, after "
            "scaler.step(optimizer)."
        ),
    ),
    Mistake(
        "overflowing step not skipped",
        lambda s: s.ref.log.count("optimizer.step") == 0 and s.first_param_difference is not None,
        lambda s: (
            f"{s.where}: this step overflowed and must be skipped, but the parameters changed. "
            "scaler.step(optimizer) skips optimizer.step() when the gradients contain inf/NaN."
        ),
    ),
    Mistake("parameters differ", lambda s: s.first_param_difference is not None, _params_differ_message),
    Mistake(
        "returned None",
        lambda s: s.got.returned is None,
        lambda s: (
            f"{s.where}: train_step returned None. Return the unscaled loss (e.g. `return loss.detach()`)."
        ),
    ),
    Mistake(
        "returned several values",
        lambda s: isinstance(s.got.returned, torch.Tensor) and s.got.returned.numel() != 1,
        lambda s: (
            f"{s.where}: train_step returned a tensor of shape {tuple(s.got.returned.shape)}; return the scalar "
            "loss."
        ),
    ),
    Mistake(
        "returned something else",
        lambda s: s.returned_number is None,
        lambda s: (
            f"{s.where}: train_step returned a {type(s.got.returned).__name__}; return the unscaled loss "
            "tensor."
        ),
    ),
    Mistake(
        "returned the scaled loss",
        lambda s: (
            not close(s.returned_number, float(s.ref.returned), 1e-3)
            and close(s.returned_number, float(s.ref.returned) * s.got.scale_before, 1e-3)
        ),
        lambda s: (
            f"{s.where}: train_step returned the scaled loss ({s.returned_number:.6g} = loss x "
            f"{scale_text(s.got.scale_before)}). Return the loss as loss_fn computed it; scaler.scale(loss) is "
            "only for backward."
        ),
    ),
    Mistake(
        "returned another value",
        lambda s: not close(s.returned_number, float(s.ref.returned), 1e-3),
        lambda s: (
            f"{s.where}: train_step returned {s.returned_number:.6g}, but the loss of this batch is "
            f"{float(s.ref.returned):.6g}."
        ),
    ),
)

TRAIN_STEP_RULES = CALL_RULES + CLIP_RULES + RESULT_RULES


# ------------------------------------------------------------------------------------------- the checkers


def observations(train_step):
    """Each call of ``train_step`` next to the reference call from the same state, scenario by scenario.

    A generator: the checker stops at the first call with a named mistake, so later scenarios never run.
    """
    for scenario in SCENARIOS:
        reference, learner = ProbedRun(scenario), ProbedRun(scenario)
        for step_no in range(scenario.steps):
            ref = _call(reference, reference_train_step, step_no, learner=False)  # errors: checker bugs
            got = _call(learner, train_step, step_no, learner=True)
            yield Seen(ref, got, scenario, step_no)


def _judge_train_step(train_step):
    """Run every scenario; the first named mistake as a failed result, a "not done" result, or None."""
    for seen in observations(train_step):
        if seen.got.problem is not None and seen.got.problem.result.status == NOT_DONE:
            return seen.got.problem.result
        message = name_mistake(TRAIN_STEP_RULES, seen)
        if message:
            return failed(message)
    return None


@checker("03.1 the AMP training step")
def check_train_step(train_step):
    """``train_step(model, optimizer, scaler, loss_fn, inputs, targets, *, dtype, max_norm) -> loss``."""
    if not callable(train_step):
        call_learner(train_step)  # turns None / a string / a number into a clear message
    # the check seeds its models (the learner's random stream is left alone) and runs them on one thread
    with torch.random.fork_rng(devices=[]), one_cpu_thread():
        result = _judge_train_step(train_step)
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


@checker("03.2 step the scheduler only after real updates")
def check_scheduler_step(step_scheduler_if_updated):
    """``step_scheduler_if_updated(scaler, scheduler, scale_before) -> bool`` after ``scaler.update()``."""
    weight, optimizer, scaler, x = _scheduler_setup()
    scheduler = CountingStepLR(optimizer)
    with warnings.catch_warnings(), one_cpu_thread():
        # the 'lr_scheduler.step() before optimizer.step()' warning is the lesson's, not the check's
        warnings.simplefilter("ignore")
        for iteration, overflow in enumerate(SCHEDULER_PATTERN):
            optimizer.zero_grad()
            scale_before = scaler.get_scale()
            scaler.scale((weight * x).sum()).backward()
            if overflow:
                weight.grad[0] = float("inf")
            scaler.step(optimizer)
            scaler.update()
            scale_after = scaler.get_scale()
            calls_before, updates_before = scheduler.calls, scaler.updates
            try:
                got = call_learner(
                    step_scheduler_if_updated,
                    scaler,
                    scheduler,
                    scale_before,
                    what="`step_scheduler_if_updated`",
                )
            except LearnerProblem:
                if scaler.updates > updates_before:
                    return failed(UPDATE_AGAIN)
                raise
            if scaler.updates > updates_before:
                return failed(UPDATE_AGAIN)
            calls = scheduler.calls - calls_before
            if scaler.get_scale() != scale_after:
                return failed(
                    "Your function changed the loss scale: it must only read it "
                    "(scaler.get_scale()); scaler.update() already ran in this iteration."
                )
            if isinstance(got, torch.Tensor) and got.numel() == 1 and got.dtype == torch.bool:
                got = bool(got)
            if type(got).__name__ not in ("bool", "bool_"):
                return failed(
                    f"step_scheduler_if_updated returned {got!r}; return True when the optimizer "
                    "really stepped (and you stepped the scheduler), False otherwise."
                )
            got = bool(got)
            change = (
                f"the scale went from {scale_text(scale_before)} to {scale_text(scale_after)}"
                if scale_after != scale_before
                else f"the scale stayed at {scale_text(scale_after)}"
            )
            if overflow:
                if got or calls:
                    return failed(
                        f"Iteration {iteration} overflowed and scaler.step() skipped the update ({change}), "
                        "but "
                        + ("you stepped the scheduler" if calls else "you returned True")
                        + ". A skipped update must not advance the schedule: a drop in the scale means "
                        "skipped."
                    )
                continue
            if not got:
                why = (
                    "the scale grew, which GradScaler only does after growth_interval successful steps"
                    if scale_after > scale_before
                    else "an unchanged scale means there was no overflow"
                )
                return failed(
                    f"Iteration {iteration} really updated the weights ({change}: {why}), but you "
                    "returned False. Compare with `>=`: only a *drop* in the scale means a skipped "
                    "step."
                )
            if calls != 1:
                return failed(
                    f"Iteration {iteration} really updated the weights and you returned True, but "
                    f"scheduler.step() was called {calls} times; call it exactly once when the "
                    "step was real."
                )
    updates = SCHEDULER_PATTERN.count(False)
    return passed(
        f"Over {len(SCHEDULER_PATTERN)} iterations with {SCHEDULER_PATTERN.count(True)} skipped "
        f"updates you stepped the scheduler exactly {updates} times, once per real optimizer "
        "update."
    )
