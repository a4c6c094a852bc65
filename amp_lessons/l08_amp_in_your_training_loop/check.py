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
below are read from that record, most specific first, in three tables: setting up each micro-batch
(autocast, dtype, loss, a scaled and divided backward), the loop (what must *not* happen between
micro-batches), and the step after the loop. Any correct style passes: a backward per micro-batch, or the
losses summed and one backward; any spelling of zero_grad, autocast or clipping.
"""

from __future__ import annotations

import math

import torch

from amp_lessons.checks.harness import NOT_DONE, LearnerProblem, call_learner, checker, failed, passed
from amp_lessons.checks.mistakes import Mistake, first_mistake
from amp_lessons.core.display import scale_text
from amp_lessons.core.environment import dtype_name, one_cpu_thread
from amp_lessons.l03_autocast_and_gradscaler.probes import CallRecord, close, recorded_call
from amp_lessons.l08_amp_in_your_training_loop.probes import ROWS, SCENARIOS, ProbedRun, Seen, events
from amp_lessons.l08_amp_in_your_training_loop.training_loop import (
    accumulate_step as reference_accumulate_step,
)

ORDER = (
    "backward (per micro-batch, or once) -> after the loop: unscale_ -> clip -> scaler.step -> scaler.update"
)


def _call(run: ProbedRun, fn, index: int, learner: bool) -> CallRecord:
    """Call ``fn`` on the run's objects and micro-batches number ``index`` (the learner's via the harness)."""
    args = (run.model, run.optimizer, run.scaler, run.loss_fn, run.micro_batches(index))
    kwargs = {"dtype": run.scenario.dtype, "max_norm": run.scenario.max_norm}
    with recorded_call(run) as record:
        try:
            if learner:
                record.returned = call_learner(fn, *args, what="`accumulate_step`", **kwargs)
            else:
                record.returned = fn(*args, **kwargs)
        except LearnerProblem as problem:
            record.problem = problem
    return record


# ------------------------------------------------------------------------------------------- what was seen


def _forward_message(seen: Seen) -> str:
    cuda = any(e["autocast_cuda"] for e in seen.forwards())
    said = seen.lower
    if cuda or ("cuda" in said and ("not available" in said or "deprecated" in said)):
        how = (
            "torch.cuda.amp.autocast (deprecated, and CUDA-only)"
            if "torch.cuda.amp.autocast" in said
            else "device_type='cuda'"
        )
        return (
            f"{seen.where}: autocast was on for CUDA but the micro-batches are on the CPU, so the "
            f"forward passes ran in FP32: you used {how}. Take the device from the data: "
            "`torch.autocast(device_type=inputs.device.type, dtype=dtype)`."
        )
    return (
        f"{seen.where}: a forward pass did not run under autocast (the model ran in FP32). Wrap each "
        "micro-batch's forward pass and loss in `with torch.autocast(device_type=inputs.device.type, "
        "dtype=dtype):`."
    )


def _wrong_dtype(seen: Seen):
    return next(
        (e["dtype"] for e in seen.forwards() if e["autocast"] and e["dtype"] != seen.scenario.dtype), None
    )


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


def _stepper(seen: Seen) -> str:
    """The step the learner called: scaler.step, or optimizer.step (BF16 bypassing its disabled scaler)."""
    return "scaler.step" if "scaler.step" in seen.names else "optimizer.step"


def _zeroes_at_end(seen: Seen) -> bool:
    return seen.position("zero_grad", last=True) > seen.position("update", last=True) >= 0


def _or_error(seen: Seen, text: str) -> str:
    """The learner's own error when there was one (it says more), else ``text``."""
    return f"{seen.where}: {seen.error}" if seen.error else f"{seen.where}: {text}"


# ------------------------------------------------------------------------------------------- the mistakes

SETUP_RULES = (
    Mistake(
        "autocast left on",
        lambda s: s.got.autocast_left_on,
        lambda s: (
            f"{s.where}: autocast was still switched on after accumulate_step returned. Use it as a context "
            "manager, `with torch.autocast(device_type=..., dtype=dtype):`, around each micro-batch's forward "
            "pass and loss."
        ),
    ),
    Mistake(
        "model left in eval mode",
        lambda s: s.got.left_in_eval and not s.ref.left_in_eval,
        lambda s: (
            f"{s.where}: the model was in eval mode after accumulate_step returned. A training step trains: "
            "leave the model in train mode (model.train()), or dropout and batch norm behave as at inference."
        ),
    ),
    Mistake(
        "new GradScaler",
        lambda s: s.got.new_scalers,
        lambda s: (
            f"{s.where}: your accumulate_step created a new GradScaler"
            + (
                " (and torch.cuda.amp.GradScaler is deprecated: use torch.amp.GradScaler)"
                if "torch.cuda.amp.gradscaler" in s.lower
                else ""
            )
            + ". Use the scaler you are given: it belongs to the training run, and a fresh one starts from "
            "init_scale every step and forgets its overflow history."
        ),
    ),
    Mistake(
        "low-precision parameters",
        lambda s: s.low_param_dtypes,
        lambda s: (
            f"{s.where}: the model's parameters became "
            f"{', '.join(sorted(dtype_name(d) for d in s.low_param_dtypes))}: did you call .half() / .to(dtype) "
            "on the model? Keep the parameters FP32; autocast casts per op."
        ),
    ),
    Mistake(
        "model never called",
        lambda s: not s.forwards(),
        lambda s: _or_error(
            s, "the model was never called. Run `model(inputs)` for each micro-batch inside autocast."
        ),
    ),
    Mistake(
        "CPU autocast on CUDA data",
        lambda s: not s.autocast_expected and any(e["autocast"] for e in s.forwards()),
        lambda s: (
            f"{s.where}: the micro-batches are on a CUDA device, but your step switched on autocast for the CPU. "
            "On a GPU that autocast does nothing for the model's ops, so the whole step would run in FP32. Take "
            "the device type from the data: `torch.autocast(device_type=inputs.device.type, dtype=dtype)`."
        ),
    ),
    Mistake(
        "forward without autocast",
        lambda s: s.autocast_expected and any(not e["autocast"] for e in s.forwards()),
        _forward_message,
    ),
    Mistake(
        "wrong autocast dtype",
        lambda s: _wrong_dtype(s) is not None,
        lambda s: (
            f"{s.where}: autocast ran in {dtype_name(_wrong_dtype(s))}, but accumulate_step was called with "
            f"dtype={dtype_name(s.scenario.dtype)}. Pass it on: `torch.autocast(..., dtype=dtype)`."
        ),
    ),
    Mistake(
        "micro-batches concatenated",
        lambda s: len(s.forwards()) == 1 < s.parts and s.forwards()[0]["rows"] == s.parts * ROWS,
        lambda s: (
            f"{s.where}: you joined the {s.parts} micro-batches into one batch and ran the model once. The point "
            "of accumulation is that only one micro-batch's activations need to fit in memory: run the forward "
            "pass (and, to free its activations, the backward pass) per micro-batch."
        ),
    ),
    Mistake(
        "model called the wrong number of times",
        lambda s: len(s.forwards()) != s.parts and not s.error,
        lambda s: (
            f"{s.where}: the model was called {len(s.forwards())} time{'s' if len(s.forwards()) != 1 else ''} "
            f"for {s.parts} micro-batches; call it once per micro-batch."
        ),
    ),
    Mistake(
        "loss never computed",
        lambda s: not events(s.log, "loss"),
        lambda s: _or_error(s, "loss_fn was never called. Compute each micro-batch's loss inside autocast."),
    ),
    Mistake(
        "loss outside autocast",
        lambda s: (
            s.autocast_expected
            and any(not e["autocast"] and e["input_dtype"] != torch.float32 for e in events(s.log, "loss"))
        ),
        lambda s: (
            f"{s.where}: a loss was computed outside autocast. Put `loss = loss_fn(model(inputs), targets)` "
            "inside the `with torch.autocast(...)` block: the policy decides the loss's precision too."
        ),
    ),
    Mistake(
        "no backward",
        lambda s: not events(s.log, "backward"),
        lambda s: _or_error(
            s, "there was no backward pass. Call `scaler.scale(loss / len(micro_batches)).backward()`."
        ),
    ),
    Mistake(
        "backward inside autocast",
        lambda s: any(e["autocast"] for e in events(s.log, "backward")),
        lambda s: (
            f"{s.where}: backward ran inside the autocast block. Autocast covers only forward passes and losses: "
            "backward reuses the dtypes the forward chose, and under autocast its ops are dispatched through the "
            "policy again. Move the backward call below the `with` block."
        ),
    ),
    Mistake(
        "loss scaled by hand",
        lambda s: s.scaling and not events(s.log, "scale") and s.ratio_is(1.0),
        lambda s: (
            f"{s.where}: you scaled the loss by hand (e.g. `(loss * scaler.get_scale() / N).backward()`) "
            "instead of calling `scaler.scale(...)`. The gradients come out scaled by the same factor, but "
            "scaler.scale() also sets up the scaler's state for this step (its scale tensor, on the loss's "
            "device), which unscale_, step and update rely on, and get_scale() makes the CPU wait for the GPU. "
            "Use "
            "`scaler.scale(loss / len(micro_batches)).backward()`."
        ),
    ),
    Mistake(
        "backward on the unscaled loss",
        lambda s: (
            s.scaling
            and (not events(s.log, "scale") or s.ratio_is(1 / s.scale) or s.ratio_is(s.parts / s.scale))
        ),
        lambda s: (
            f"{s.where}: backward ran on the unscaled loss. Scale it first, "
            "`scaler.scale(loss / len(micro_batches)).backward()`: otherwise small FP16 gradients underflow, and "
            f"scaler.step() divides the gradients by the scale anyway, so the update is {scale_text(s.scale)} "
            "times too small."
        ),
    ),
    Mistake(
        "gradient size",
        lambda s: math.isfinite(s.output_gradient_ratio()) and not s.ratio_is(1.0),
        _ratio_message,
    ),
)

LOOP_RULES = (
    Mistake(
        "step inside the loop",
        lambda s: any(
            s.inside_loop(step) or s.log.count(step) > 1 for step in ("scaler.step", "optimizer.step")
        ),
        lambda s: (
            f"{s.where}: {_stepper(s)}() ran inside the micro-batch loop ({s.log.count(_stepper(s))} calls for "
            f"{s.parts} micro-batches). That is {s.parts} small optimizer steps, each from 1/{s.parts} of the "
            "batch, not one step from the whole batch (and with Adam each small step is full-sized). Accumulate "
            f"all micro-batches first, then once: {ORDER}."
        ),
    ),
    Mistake(
        "update inside the loop",
        lambda s: s.scaling and s.inside_loop("update"),
        lambda s: (
            f"{s.where}: scaler.update() ran inside the micro-batch loop. update() may change the scale, so the "
            "micro-batches' gradients would be added up in different units (torch even refuses an update() with "
            f"no step() before it: 'No inf checks were recorded'). Call it once, last: {ORDER}."
        ),
    ),
    Mistake(
        "unscale_ inside the loop",
        lambda s: s.scaling and s.inside_loop("unscale_"),
        lambda s: (
            f"{s.where}: scaler.unscale_() ran inside the micro-batch loop. The next micro-batch's scaled "
            "gradients would be added to already unscaled ones (torch refuses a second unscale_() before "
            f"update()). Unscale once, after the last micro-batch: {ORDER}."
        ),
    ),
    Mistake(
        "zero_grad inside the loop",
        lambda s: s.between_backwards("zero_grad") or any(e["erased"] for e in s.forwards()),
        lambda s: (
            f"{s.where}: the gradients were zeroed inside the micro-batch loop, so each micro-batch erased the "
            "ones before it and only the last one reached the optimizer. Zero them once, before the first "
            "micro-batch."
        ),
    ),
    Mistake(
        "gradients changed inside the loop",
        lambda s: any(e["changed"] for e in s.forwards()),
        lambda s: (
            f"{s.where}: the accumulated gradients changed between one micro-batch's backward and the next "
            "micro-batch: did you clip inside the loop? Clipping must see the whole batch's gradient, after "
            f"unscale_: {ORDER}."
        ),
    ),
    Mistake(
        "zero_grad after backward",
        lambda s: (
            0
            <= s.position("backward", last=True)
            < s.position("zero_grad", last=True)
            < max(s.position("scaler.step"), 0)
            or (
                any(e["all_zero"] for e in events(s.log, "scaler.step"))
                and not any(e["all_zero"] for e in events(s.ref.log, "scaler.step"))
            )
        ),
        lambda s: (
            f"{s.where}: you called zero_grad() after the last backward: it erased the batch's gradients before "
            "the optimizer used them. Zero the gradients at the start of the step."
        ),
    ),
    Mistake(
        "old gradients kept",
        lambda s: any(e["stale"] for e in events(s.log, "backward")),
        lambda s: (
            f"{s.where}: gradients from an earlier iteration were still in .grad when the first backward ran, "
            "so they were added to this batch's gradients. Start with `optimizer.zero_grad()`"
            + (
                " (you zero them at the end of the step: a first step, or one after any other backward, still "
                "adds up old gradients)."
                if _zeroes_at_end(s)
                else "."
            )
        ),
    ),
)

STEP_RULES = (
    Mistake(
        "optimizer.step directly",
        lambda s: (
            (s.scaling or s.log.count("optimizer.step") > 1)
            and any(not e["via_scaler"] for e in events(s.log, "optimizer.step"))
        ),
        lambda s: (
            f"{s.where}: you called optimizer.step() directly"
            + (" as well as scaler.step(optimizer)" if "scaler.step" in s.names else "")
            + ". Use `scaler.step(optimizer)` only: it unscales the gradients if you have not, and skips the "
            "update when any micro-batch produced inf/NaN."
        ),
    ),
    Mistake(
        "unscale_ twice",
        lambda s: s.scaling and s.log.count("unscale_") > 1,
        lambda s: (
            f"{s.where}: scaler.unscale_(optimizer) was called {s.log.count('unscale_')} times. Call it once, "
            "after the last micro-batch and before clipping."
        ),
    ),
    Mistake(
        "unscale_ after step",
        lambda s: s.scaling and 0 <= s.position("scaler.step") < s.position("unscale_"),
        lambda s: (
            f"{s.where}: scaler.unscale_() came after scaler.step(): step() has already unscaled and applied the "
            f"gradients. {ORDER}."
        ),
    ),
    Mistake(
        "update before step",
        lambda s: (
            s.scaling
            and s.log.count("update") > 0
            and not 0 <= s.position("scaler.step") < s.position("update", last=True)
        ),
        lambda s: (
            f"{s.where}: scaler.update() ran before scaler.step(optimizer) (or without it). update() reads the "
            f"inf checks of this step's step(), so it comes last: {ORDER}."
        ),
    ),
    Mistake(
        "no step",
        lambda s: "scaler.step" not in s.names and (s.scaling or "optimizer.step" not in s.names),
        lambda s: _or_error(
            s, "the optimizer never stepped. Call `scaler.step(optimizer)` once, after the loop."
        ),
    ),
    Mistake(
        "no update",
        lambda s: s.scaling and "update" not in s.names,
        lambda s: (
            f"{s.where}: scaler.update() was never called. Without it the scale never adapts, and the next "
            "scaler.step() fails. End the step with `scaler.update()`, once."
        ),
    ),
    Mistake(
        "update twice",
        lambda s: s.scaling and s.log.count("update") > 1,
        lambda s: (
            f"{s.where}: scaler.update() was called {s.log.count('update')} times; once per optimizer step, "
            "after scaler.step()."
        ),
    ),
    Mistake("error", lambda s: bool(s.error), lambda s: f"{s.where}: {s.error}"),
)


# ------------------------------------------------------------------------------------------- after the rules


def _clipping_message(seen: Seen) -> str | None:
    """Did the optimizer use the reference's gradient norm? If not, which clipping mistake explains it."""
    if not seen.clipped_wrong:
        return None  # an overflowing step is judged by what happened to the parameters and the scale
    used, expected, max_norm, where = seen.norm_used, seen.norm_expected, seen.max_norm, seen.where
    if max_norm is None:
        return (
            f"{where}: max_norm is None, which means no clipping, but the gradient norm the optimizer "
            f"used was {used:.4g} instead of {expected:.4g}. Clip only `if max_norm is not None:`."
        )
    if seen.scaling and seen.clipped_scaled:
        how = "before scaler.unscale_()" if "unscale_" in seen.names else "without scaler.unscale_() first"
        return (
            f"{where}: you clipped {how}: clip_grad_norm_ saw gradients {scale_text(seen.scale_used)} "
            f"times too large and cut them to norm {max_norm}; unscaled, the update had norm {used:.3g}. "
            f"After the loop: {ORDER}."
        )
    raw = seen.unclipped_norm
    if used > max_norm * 1.02 and not close(used, raw, 0.02):
        return (
            f"{where}: the gradient norm the optimizer used was {used:.4g}: the gradients were changed, "
            f"but not clipped to total norm max_norm={max_norm} (unclipped it is {raw:.4g}). Use "
            "`torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)`, not clip_grad_value_, after "
            "unscale_."
        )
    if used > max_norm * 1.02:
        return (
            f"{where}: the gradients were not clipped: the optimizer used a gradient norm of {used:.4g} "
            f"although max_norm={max_norm}. After `scaler.unscale_(optimizer)`, call "
            "`torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)` (before scaler.step)."
        )
    return (
        f"{where}: the gradient norm the optimizer used was {used:.4g}, but clipping the whole batch's "
        f"unscaled gradients to max_norm={max_norm} gives {expected:.4g}. Use clip_grad_norm_ (not "
        "clip_grad_value_) on model.parameters(), once, after unscale_."
    )


def _results_message(seen: Seen) -> str | None:
    ref, got, where = seen.ref, seen.got, seen.where
    if not close(got.scale_after, ref.scale_after, 1e-6):
        return (
            f"{where}: the loss scale after the step is {scale_text(got.scale_after)}; the reference "
            f"leaves {scale_text(ref.scale_after)}. Call scaler.update() exactly once, after "
            "scaler.step(optimizer)."
        )
    difference = seen.first_param_difference
    if difference is None:
        return None
    if ref.log.count("optimizer.step") == 0:
        return (
            f"{where}: a micro-batch overflowed, so this step must be skipped, but the parameters "
            "changed. scaler.step(optimizer) skips the update when any gradient is inf/NaN."
        )
    p_ref, p_got = difference
    diff = (p_ref - p_got).abs().max().item() if p_ref.shape == p_got.shape else math.nan
    return (
        f"{where}: after your step the parameters differ from the reference step's by up to {diff:.3g}, "
        f"although every call looked right. Accumulate `loss / N` from every micro-batch, then {ORDER}."
    )


def _return_message(seen: Seen) -> str | None:
    value, where, n = seen.got.returned, seen.where, seen.parts
    if value is None:
        return (
            f"{where}: accumulate_step returned None. Return the batch loss (the mean of the micro-batch "
            "losses)."
        )
    number = seen.returned_number
    if number is None:
        shape = f" of shape {tuple(value.shape)}" if isinstance(value, torch.Tensor) else ""
        return (
            f"{where}: accumulate_step returned a {type(value).__name__}{shape}; return one number, the "
            "mean of the micro-batch losses, e.g. `torch.stack(losses).mean()`."
        )
    losses = [e["value"] for e in events(seen.ref.log, "loss")]
    mean = sum(losses) / len(losses)
    if close(number, mean, 1e-3):
        return None
    candidates = {
        "the last micro-batch's loss": losses[-1],
        "the last micro-batch's loss divided by N": losses[-1] / n,
        "the sum of the micro-batch losses": sum(losses),
        "the mean divided by N once more": mean / n,
    }
    for label, candidate in candidates.items():
        if seen.scaling and (
            close(number / seen.scale, candidate, 1e-3) or close(number / seen.scale, candidate / n, 1e-3)
        ):
            return (
                f"{where}: accumulate_step returned a scaled loss ({number:.6g}, multiplied by the scale "
                f"{scale_text(seen.scale)}). Return the losses as loss_fn computed them (their mean); "
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


def _diagnose(seen: Seen) -> str | None:
    for rules in (SETUP_RULES, LOOP_RULES, STEP_RULES):
        mistake = first_mistake(rules, seen)
        if mistake is not None:
            return mistake.text(seen)
    return _clipping_message(seen) or _results_message(seen) or _return_message(seen)


# ------------------------------------------------------------------------------------------- the checker


def observations(accumulate_step):
    """Each call of ``accumulate_step`` next to the reference call from the same state, scenario by scenario.

    A generator: the checker stops at the first call with a named mistake, so later scenarios never run.
    """
    for scenario in SCENARIOS:
        reference, learner = ProbedRun(scenario), ProbedRun(scenario)
        for step_no in range(scenario.steps):
            ref = _call(reference, reference_accumulate_step, step_no, learner=False)  # errors: checker bugs
            got = _call(learner, accumulate_step, step_no, learner=True)
            yield Seen(ref, got, scenario, step_no)


def _judge(accumulate_step):
    """Run every scenario; the first named mistake as a failed result, a "not done" result, or None."""
    for seen in observations(accumulate_step):
        if seen.got.problem is not None and seen.got.problem.result.status == NOT_DONE:
            return seen.got.problem.result
        message = _diagnose(seen)
        if message:
            return failed(message)
    return None


@checker("08.1 gradient accumulation with a GradScaler")
def check_accumulate_step(accumulate_step):
    """``accumulate_step(model, optimizer, scaler, loss_fn, micro_batches, *, dtype, max_norm) -> loss``."""
    if not callable(accumulate_step):
        call_learner(accumulate_step)  # turns None / a string / a number into a clear message
    with torch.random.fork_rng(devices=[]), one_cpu_thread():
        result = _judge(accumulate_step)
    if result is not None:
        return result
    return passed(
        f"Your accumulation step matches the reference in all {len(SCENARIOS)} scenarios: autocast on the "
        "data's device around each micro-batch's forward pass and loss, every loss divided by the number of "
        "micro-batches and scaled, the gradients accumulated at one scale, then once: unscale_, clip, "
        "scaler.step, scaler.update; an overflowing micro-batch skips the whole step, the scale grows "
        "between steps, and the same code runs BF16 with a disabled scaler."
    )
