"""Lesson 03 checkers: the solution and other correct steps pass, the untouched exercise is "not done",
every known wrong step is rejected with a message that names its mistake, and junk never raises."""

import time

import pytest
import torch
from notebook_code import exercise, solution

import amp_lessons.l03_autocast_and_gradscaler.check as l03
from amp_lessons.checks.harness import NOT_DONE, PASSED
from amp_lessons.checks.mistakes import first_mistake
from amp_lessons.core.autocast_state import switch_autocast_off
from amp_lessons.core.environment import one_cpu_thread
from amp_lessons.l03_autocast_and_gradscaler import step_rules
from amp_lessons.l03_autocast_and_gradscaler.check import check_scheduler_step, check_train_step
from amp_lessons.l03_autocast_and_gradscaler.training import train_step as reference_train_step

LESSON = "03_autocast_and_gradscaler.ipynb"


# --------------------------------------------------------------------------------------- correct steps


def step_set_to_none_false(model, optimizer, scaler, loss_fn, inputs, targets, *, dtype, max_norm):
    optimizer.zero_grad(set_to_none=False)
    with torch.amp.autocast(inputs.device.type, dtype=dtype):
        loss = loss_fn(model(inputs), targets)
    scaler.scale(loss).backward()
    if max_norm is not None:
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=max_norm)
    scaler.step(optimizer)
    scaler.update()
    return loss.detach()


def step_always_unscale(model, optimizer, scaler, loss_fn, inputs, targets, *, dtype, max_norm):
    from torch.nn.utils import clip_grad_norm_

    model.zero_grad()
    device_type = inputs.device.type
    with torch.autocast(device_type=device_type, dtype=dtype):
        outputs = model(inputs)
        loss = loss_fn(outputs, targets)
    scaled = scaler.scale(loss)
    scaled.backward()
    scaler.unscale_(optimizer)  # optional without clipping, harmless
    if max_norm is not None:
        params = [p for group in optimizer.param_groups for p in group["params"]]
        clip_grad_norm_(params, max_norm)
    scaler.step(optimizer)
    scaler.update()
    return loss.item()


def step_positional_dtype(
    model, optimizer, scaler, loss_fn, inputs, targets, dtype=torch.float16, max_norm=None
):
    for p in model.parameters():
        p.grad = None
    with torch.autocast(inputs.device.type, dtype):
        loss = loss_fn(model(inputs), targets)
    scaler.scale(loss).backward()
    if max_norm:
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    scaler.step(optimizer)
    scaler.update()
    return loss


CORRECT = [reference_train_step, step_set_to_none_false, step_always_unscale, step_positional_dtype]


# ------------------------------------------------------------------------------------ wrong steps


def clip_before_unscale(model, optimizer, scaler, loss_fn, inputs, targets, *, dtype, max_norm):
    optimizer.zero_grad()
    with torch.autocast(inputs.device.type, dtype=dtype):
        loss = loss_fn(model(inputs), targets)
    scaler.scale(loss).backward()
    if max_norm is not None:
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
        scaler.unscale_(optimizer)
    scaler.step(optimizer)
    scaler.update()
    return loss.detach()


def no_unscale(model, optimizer, scaler, loss_fn, inputs, targets, *, dtype, max_norm):
    optimizer.zero_grad()
    with torch.autocast(inputs.device.type, dtype=dtype):
        loss = loss_fn(model(inputs), targets)
    scaler.scale(loss).backward()
    if max_norm is not None:
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    scaler.step(optimizer)
    scaler.update()
    return loss.detach()


def scaled_max_norm(model, optimizer, scaler, loss_fn, inputs, targets, *, dtype, max_norm):
    optimizer.zero_grad()
    with torch.autocast(inputs.device.type, dtype=dtype):
        loss = loss_fn(model(inputs), targets)
    scaler.scale(loss).backward()
    if max_norm is not None:
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm * scaler.get_scale())
    scaler.step(optimizer)
    scaler.update()
    return loss.detach()


def optimizer_step_directly(model, optimizer, scaler, loss_fn, inputs, targets, *, dtype, max_norm):
    optimizer.zero_grad()
    with torch.autocast(inputs.device.type, dtype=dtype):
        loss = loss_fn(model(inputs), targets)
    scaler.scale(loss).backward()
    scaler.unscale_(optimizer)
    if max_norm is not None:
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    optimizer.step()
    scaler.update()
    return loss.detach()


def both_steps(model, optimizer, scaler, loss_fn, inputs, targets, *, dtype, max_norm):
    optimizer.zero_grad()
    with torch.autocast(inputs.device.type, dtype=dtype):
        loss = loss_fn(model(inputs), targets)
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    optimizer.step()
    scaler.update()
    return loss.detach()


def no_update(model, optimizer, scaler, loss_fn, inputs, targets, *, dtype, max_norm):
    optimizer.zero_grad()
    with torch.autocast(inputs.device.type, dtype=dtype):
        loss = loss_fn(model(inputs), targets)
    scaler.scale(loss).backward()
    if max_norm is not None:
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    scaler.step(optimizer)
    return loss.detach()


def update_twice(model, optimizer, scaler, loss_fn, inputs, targets, *, dtype, max_norm):
    reference_train_step(model, optimizer, scaler, loss_fn, inputs, targets, dtype=dtype, max_norm=max_norm)
    scaler.update()


def no_zero_grad(model, optimizer, scaler, loss_fn, inputs, targets, *, dtype, max_norm):
    with torch.autocast(inputs.device.type, dtype=dtype):
        loss = loss_fn(model(inputs), targets)
    scaler.scale(loss).backward()
    if max_norm is not None:
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    scaler.step(optimizer)
    scaler.update()
    return loss.detach()


def zero_grad_after_backward(model, optimizer, scaler, loss_fn, inputs, targets, *, dtype, max_norm):
    with torch.autocast(inputs.device.type, dtype=dtype):
        loss = loss_fn(model(inputs), targets)
    scaler.scale(loss).backward()
    optimizer.zero_grad()
    scaler.step(optimizer)
    scaler.update()
    return loss.detach()


def zero_grad_at_end(model, optimizer, scaler, loss_fn, inputs, targets, *, dtype, max_norm):
    with torch.autocast(inputs.device.type, dtype=dtype):
        loss = loss_fn(model(inputs), targets)
    scaler.scale(loss).backward()
    if max_norm is not None:
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad()
    return loss.detach()


def half_model(model, optimizer, scaler, loss_fn, inputs, targets, *, dtype, max_norm):
    model.half()
    optimizer.zero_grad()
    loss = loss_fn(model(inputs.half()), targets)
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
    return loss.detach()


def no_autocast(model, optimizer, scaler, loss_fn, inputs, targets, *, dtype, max_norm):
    optimizer.zero_grad()
    loss = loss_fn(model(inputs), targets)
    scaler.scale(loss).backward()
    if max_norm is not None:
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    scaler.step(optimizer)
    scaler.update()
    return loss.detach()


def backward_inside_autocast(model, optimizer, scaler, loss_fn, inputs, targets, *, dtype, max_norm):
    optimizer.zero_grad()
    with torch.autocast(inputs.device.type, dtype=dtype):
        loss = loss_fn(model(inputs), targets)
        scaler.scale(loss).backward()
    if max_norm is not None:
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    scaler.step(optimizer)
    scaler.update()
    return loss.detach()


def loss_outside_autocast(model, optimizer, scaler, loss_fn, inputs, targets, *, dtype, max_norm):
    optimizer.zero_grad()
    with torch.autocast(inputs.device.type, dtype=dtype):
        outputs = model(inputs)
    loss = loss_fn(outputs, targets)
    scaler.scale(loss).backward()
    if max_norm is not None:
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    scaler.step(optimizer)
    scaler.update()
    return loss.detach()


def new_scaler_inside(model, optimizer, scaler, loss_fn, inputs, targets, *, dtype, max_norm):
    scaler = torch.amp.GradScaler(inputs.device.type)
    return reference_train_step(
        model, optimizer, scaler, loss_fn, inputs, targets, dtype=dtype, max_norm=max_norm
    )


def update_before_step(model, optimizer, scaler, loss_fn, inputs, targets, *, dtype, max_norm):
    optimizer.zero_grad()
    with torch.autocast(inputs.device.type, dtype=dtype):
        loss = loss_fn(model(inputs), targets)
    scaler.scale(loss).backward()
    scaler.unscale_(optimizer)
    if max_norm is not None:
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    scaler.update()
    scaler.step(optimizer)
    return loss.detach()


def unscale_twice(model, optimizer, scaler, loss_fn, inputs, targets, *, dtype, max_norm):
    optimizer.zero_grad()
    with torch.autocast(inputs.device.type, dtype=dtype):
        loss = loss_fn(model(inputs), targets)
    scaler.scale(loss).backward()
    scaler.unscale_(optimizer)
    if max_norm is not None:
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    scaler.step(optimizer)
    scaler.update()
    return loss.detach()


def unscale_after_step(model, optimizer, scaler, loss_fn, inputs, targets, *, dtype, max_norm):
    optimizer.zero_grad()
    with torch.autocast(inputs.device.type, dtype=dtype):
        loss = loss_fn(model(inputs), targets)
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.unscale_(optimizer)
    scaler.update()
    return loss.detach()


def returns_scaled_loss(model, optimizer, scaler, loss_fn, inputs, targets, *, dtype, max_norm):
    optimizer.zero_grad()
    with torch.autocast(inputs.device.type, dtype=dtype):
        loss = loss_fn(model(inputs), targets)
    scaled = scaler.scale(loss)
    scaled.backward()
    if max_norm is not None:
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    scaler.step(optimizer)
    scaler.update()
    return scaled.detach()


def returns_nothing(model, optimizer, scaler, loss_fn, inputs, targets, *, dtype, max_norm):
    reference_train_step(model, optimizer, scaler, loss_fn, inputs, targets, dtype=dtype, max_norm=max_norm)


def hardcoded_cuda(model, optimizer, scaler, loss_fn, inputs, targets, *, dtype, max_norm):
    optimizer.zero_grad()
    with torch.autocast(device_type="cuda", dtype=dtype):
        loss = loss_fn(model(inputs), targets)
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
    return loss.detach()


def deprecated_cuda_amp_autocast(model, optimizer, scaler, loss_fn, inputs, targets, *, dtype, max_norm):
    optimizer.zero_grad()
    with torch.cuda.amp.autocast(dtype=dtype):  # deprecated spelling, on purpose
        loss = loss_fn(model(inputs), targets)
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
    return loss.detach()


def hardcoded_cpu(model, optimizer, scaler, loss_fn, inputs, targets, *, dtype, max_norm):
    optimizer.zero_grad()
    with torch.autocast(device_type="cpu", dtype=dtype):
        loss = loss_fn(model(inputs), targets)
    scaler.scale(loss).backward()
    if max_norm is not None:
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    scaler.step(optimizer)
    scaler.update()
    return loss.detach()


def ignores_dtype(model, optimizer, scaler, loss_fn, inputs, targets, *, dtype, max_norm):
    return reference_train_step(
        model, optimizer, scaler, loss_fn, inputs, targets, dtype=torch.float16, max_norm=max_norm
    )


def backward_unscaled(model, optimizer, scaler, loss_fn, inputs, targets, *, dtype, max_norm):
    optimizer.zero_grad()
    with torch.autocast(inputs.device.type, dtype=dtype):
        loss = loss_fn(model(inputs), targets)
    scaler.scale(loss)
    loss.backward()
    if max_norm is not None:
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    scaler.step(optimizer)
    scaler.update()
    return loss.detach()


def no_scaler_at_all(model, optimizer, scaler, loss_fn, inputs, targets, *, dtype, max_norm):
    optimizer.zero_grad()
    with torch.autocast(inputs.device.type, dtype=dtype):
        loss = loss_fn(model(inputs), targets)
    loss.backward()
    if max_norm is not None:
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    optimizer.step()
    return loss.detach()


def clip_after_step(model, optimizer, scaler, loss_fn, inputs, targets, *, dtype, max_norm):
    optimizer.zero_grad()
    with torch.autocast(inputs.device.type, dtype=dtype):
        loss = loss_fn(model(inputs), targets)
    scaler.scale(loss).backward()
    scaler.unscale_(optimizer)
    scaler.step(optimizer)
    if max_norm is not None:
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    scaler.update()
    return loss.detach()


def no_clipping(model, optimizer, scaler, loss_fn, inputs, targets, *, dtype, max_norm):
    return reference_train_step(
        model, optimizer, scaler, loss_fn, inputs, targets, dtype=dtype, max_norm=None
    )


def clips_when_max_norm_none(model, optimizer, scaler, loss_fn, inputs, targets, *, dtype, max_norm):
    return reference_train_step(
        model, optimizer, scaler, loss_fn, inputs, targets, dtype=dtype, max_norm=max_norm or 0.01
    )


def clip_by_value(model, optimizer, scaler, loss_fn, inputs, targets, *, dtype, max_norm):
    optimizer.zero_grad()
    with torch.autocast(inputs.device.type, dtype=dtype):
        loss = loss_fn(model(inputs), targets)
    scaler.scale(loss).backward()
    if max_norm is not None:
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_value_(model.parameters(), max_norm)
    scaler.step(optimizer)
    scaler.update()
    return loss.detach()


def clip_raises_on_overflow(model, optimizer, scaler, loss_fn, inputs, targets, *, dtype, max_norm):
    optimizer.zero_grad()
    with torch.autocast(inputs.device.type, dtype=dtype):
        loss = loss_fn(model(inputs), targets)
    scaler.scale(loss).backward()
    if max_norm is not None:
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm, error_if_nonfinite=True)
    scaler.step(optimizer)
    scaler.update()
    return loss.detach()


def autocast_left_on(model, optimizer, scaler, loss_fn, inputs, targets, *, dtype, max_norm):
    optimizer.zero_grad()
    torch.autocast(inputs.device.type, dtype=dtype).__enter__()
    loss = loss_fn(model(inputs), targets)
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
    return loss.detach()


WRONG = {
    clip_before_unscale: "clipped before scaler.unscale_()",
    no_unscale: "without calling scaler.unscale_(optimizer) first",
    scaled_max_norm: "max_norm * scale",
    optimizer_step_directly: "you called optimizer.step() directly",
    both_steps: "stepped twice",
    no_update: "scaler.update() was never called",
    update_twice: "scaler.update() was called 2 times",
    no_zero_grad: "Start the step with `optimizer.zero_grad()`",
    zero_grad_after_backward: "zero_grad() after backward",
    zero_grad_at_end: "You clear them at the end of the step",
    half_model: "did you call .half()",
    no_autocast: "did not run under autocast",
    backward_inside_autocast: "backward ran inside the autocast block",
    loss_outside_autocast: "the loss was computed outside autocast",
    new_scaler_inside: "created a new GradScaler",
    update_before_step: "scaler.update() ran before scaler.step(optimizer)",
    unscale_twice: "unscale_(optimizer) was called twice",
    unscale_after_step: "unscale_() came after scaler.step()",
    returns_scaled_loss: "returned the scaled loss",
    returns_nothing: "returned None",
    hardcoded_cuda: "device_type='cuda'",
    deprecated_cuda_amp_autocast: "torch.cuda.amp.autocast (deprecated",
    hardcoded_cpu: "your step switched on autocast for the CPU",
    ignores_dtype: "autocast ran in float16, but train_step was called with dtype=bfloat16",
    backward_unscaled: "backward ran on the unscaled loss",
    no_scaler_at_all: "backward ran on the unscaled loss",
    clip_after_step: "clipped after scaler.step()",
    no_clipping: "the gradients were not clipped",
    clips_when_max_norm_none: "max_norm is None, which means no clipping",
    clip_by_value: "not clip_grad_value_",
    clip_raises_on_overflow: "do not make clipping raise",
    autocast_left_on: "autocast was still switched on",
}


# ----------------------------------------------------------------------------------------- the tests


def test_solution_passes(strict):
    assert check_train_step(solution(LESSON, "train_step")).status == PASSED


@pytest.mark.parametrize("step", CORRECT, ids=lambda f: f.__name__)
def test_correct_variants_pass(step):
    result = check_train_step(step)
    assert result.status == PASSED, result.message


def test_untouched_exercise_is_not_done():
    assert check_train_step(exercise(LESSON, "train_step")).status == NOT_DONE


@pytest.mark.parametrize("step", list(WRONG), ids=lambda f: f.__name__)
def test_wrong_step_is_named(step):
    result = check_train_step(step)
    assert not result.passed and result.status == "failed", result.message
    assert WRONG[step] in result.message, result.message


JUNK = [
    None,
    "train_step",
    42,
    lambda model: None,
    lambda *a, **k: (_ for _ in ()).throw(ValueError("boom")),
    lambda *a, **k: float("nan"),
    lambda *a, **k: torch.ones(3),
    lambda *a, **k: "loss",
    lambda *a, **k: reference_train_step(*a, **k) * float("nan"),
]


@pytest.mark.parametrize("junk", JUNK, ids=range(len(JUNK)))
def test_junk_never_raises(junk):
    result = check_train_step(junk)
    assert not result.passed and result.status in ("failed",), result.message
    assert result.message


def test_checker_is_fast_and_leaves_no_state():
    check_train_step(reference_train_step)  # warm-up (first optimizer use imports torch internals)
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    start = time.perf_counter()
    check_train_step(reference_train_step)
    assert time.perf_counter() - start < 2.0
    assert torch.equal(torch.rand(3), expected), "the checker must not disturb the learner's random stream"
    assert not torch.is_autocast_enabled("cpu")
    check_train_step(autocast_left_on)
    assert not torch.is_autocast_enabled("cpu")
    assert check_train_step(reference_train_step).passed


# ------------------------------------------------------------------------- exercise 2: the scheduler


def sched_correct(scaler, scheduler, scale_before):
    stepped = scaler.get_scale() >= scale_before
    if stepped:
        scheduler.step()
    return stepped


def sched_correct_not(scaler, scheduler, scale_before):
    skipped = scaler.get_scale() < scale_before
    if not skipped:
        scheduler.step()
    return not skipped


def sched_always(scaler, scheduler, scale_before):
    scheduler.step()
    return True


def sched_equal(scaler, scheduler, scale_before):
    stepped = scaler.get_scale() == scale_before
    if stepped:
        scheduler.step()
    return stepped


def sched_greater(scaler, scheduler, scale_before):
    stepped = scaler.get_scale() > scale_before
    if stepped:
        scheduler.step()
    return stepped


def sched_forgets_step(scaler, scheduler, scale_before):
    return scaler.get_scale() >= scale_before


def sched_twice(scaler, scheduler, scale_before):
    if scaler.get_scale() >= scale_before:
        scheduler.step()
        scheduler.step()
        return True
    return False


def sched_updates_scaler(scaler, scheduler, scale_before):
    scaler.update(scale_before)
    return sched_correct(scaler, scheduler, scale_before)


def sched_updates_again(scaler, scheduler, scale_before):
    scaler.update()  # "to be sure the scale is current"
    return sched_correct(scaler, scheduler, scale_before)


def sched_reversed(scaler, scheduler, scale_before):
    stepped = scale_before >= scaler.get_scale()  # the comparison the wrong way round
    if stepped:
        scheduler.step()
    return stepped


def sched_growth_only(scaler, scheduler, scale_before):
    stepped = scaler.get_scale() == scale_before * scaler.get_growth_factor()
    if stepped:
        scheduler.step()
    return stepped


def sched_early_return(scaler, scheduler, scale_before):
    if scaler.get_scale() < scale_before:
        return False
    scheduler.step()
    return True


def sched_not_backed_off(scaler, scheduler, scale_before):
    skipped = scaler.get_scale() == scale_before * scaler.get_backoff_factor()
    if not skipped:
        scheduler.step()
    return not skipped


def sched_package_detector(scaler, scheduler, scale_before):
    from amp_lessons.l03_autocast_and_gradscaler.training import step_was_skipped

    if step_was_skipped(scale_before, scaler.get_scale()):
        return False
    scheduler.step()
    return True


def sched_numpy_bool(scaler, scheduler, scale_before):
    import numpy as np

    stepped = np.float32(scaler.get_scale()) >= np.float32(scale_before)
    if stepped:
        scheduler.step()
    return stepped


def sched_tensor_compare(scaler, scheduler, scale_before):
    stepped = scaler._scale >= scale_before  # a one-element bool tensor
    if stepped:
        scheduler.step()
    return stepped


def sched_returns_none(scaler, scheduler, scale_before):
    if scaler.get_scale() >= scale_before:
        scheduler.step()


SCHED_WRONG = {
    sched_always: "must not advance the schedule",
    sched_equal: "the scale grew",
    sched_greater: "an unchanged scale means there was no overflow",
    sched_forgets_step: "scheduler.step() was called 0 times",
    sched_twice: "scheduler.step() was called 2 times",
    sched_updates_scaler: "Your function called scaler.update()",
    sched_updates_again: "Your function called scaler.update()",
    sched_reversed: "but you stepped the scheduler",
    sched_growth_only: "returned False",
    sched_returns_none: "returned None",
}


def test_scheduler_solution_passes(strict):
    assert check_scheduler_step(solution(LESSON, "step_scheduler_if_updated")).status == PASSED


@pytest.mark.parametrize(
    "fn",
    [
        sched_correct,
        sched_correct_not,
        sched_early_return,
        sched_not_backed_off,
        sched_package_detector,
        sched_numpy_bool,
        sched_tensor_compare,
    ],
    ids=lambda f: f.__name__,
)
def test_scheduler_correct_variants_pass(fn):
    result = check_scheduler_step(fn)
    assert result.status == PASSED, result.message


def test_scheduler_untouched_exercise_is_not_done():
    assert check_scheduler_step(exercise(LESSON, "step_scheduler_if_updated")).status == NOT_DONE


@pytest.mark.parametrize("fn", list(SCHED_WRONG), ids=lambda f: f.__name__)
def test_scheduler_wrong_answer_is_named(fn):
    result = check_scheduler_step(fn)
    assert result.status == "failed", result.message
    assert SCHED_WRONG[fn] in result.message, result.message


@pytest.mark.parametrize(
    "junk",
    [None, "f", 1, lambda s: True, lambda *a: 1 / 0, lambda *a: torch.tensor([True, False])],
    ids=range(6),
)
def test_scheduler_junk_never_raises(junk):
    result = check_scheduler_step(junk)
    assert result.status == "failed" and result.message


# ------------------------------------------------------------------- the rule tables of 03.1, rule by rule


def no_loss_fn(model, optimizer, scaler, loss_fn, inputs, targets, *, dtype, max_norm):
    optimizer.zero_grad()
    with torch.autocast(inputs.device.type, dtype=dtype):
        loss = torch.nn.functional.cross_entropy(model(inputs), targets)  # not the loss_fn passed in
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
    return loss.detach()


def no_backward(model, optimizer, scaler, loss_fn, inputs, targets, *, dtype, max_norm):
    optimizer.zero_grad()
    with torch.autocast(inputs.device.type, dtype=dtype):
        loss = loss_fn(model(inputs), targets)
    scaler.step(optimizer)
    scaler.update()
    return loss.detach()


def scales_twice(model, optimizer, scaler, loss_fn, inputs, targets, *, dtype, max_norm):
    optimizer.zero_grad()
    with torch.autocast(inputs.device.type, dtype=dtype):
        loss = loss_fn(model(inputs), targets)
    scaler.scale(2 * loss).backward()
    scaler.step(optimizer)
    scaler.update()
    return loss.detach()


def never_steps(model, optimizer, scaler, loss_fn, inputs, targets, *, dtype, max_norm):
    optimizer.zero_grad()
    with torch.autocast(inputs.device.type, dtype=dtype):
        loss = loss_fn(model(inputs), targets)
    scaler.scale(loss).backward()
    return loss.detach()


def zeroes_grads_by_hand(model, optimizer, scaler, loss_fn, inputs, targets, *, dtype, max_norm):
    optimizer.zero_grad()
    with torch.autocast(inputs.device.type, dtype=dtype):
        loss = loss_fn(model(inputs), targets)
    scaler.scale(loss).backward()
    for p in model.parameters():
        p.grad.zero_()
    scaler.step(optimizer)
    scaler.update()
    return loss.detach()


def raises_at_the_end(*args, **kwargs):
    reference_train_step(*args, **kwargs)
    raise RuntimeError("logging failed")


def clips_to_half(model, optimizer, scaler, loss_fn, inputs, targets, *, dtype, max_norm):
    return reference_train_step(
        model,
        optimizer,
        scaler,
        loss_fn,
        inputs,
        targets,
        dtype=dtype,
        max_norm=None if max_norm is None else max_norm / 2,
    )


def sets_the_scale(model, optimizer, scaler, loss_fn, inputs, targets, *, dtype, max_norm):
    optimizer.zero_grad()
    with torch.autocast(inputs.device.type, dtype=dtype):
        loss = loss_fn(model(inputs), targets)
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update(new_scale=2.0**5)
    return loss.detach()


def updates_after_a_skip(model, optimizer, scaler, loss_fn, inputs, targets, *, dtype, max_norm):
    scale_before = scaler.get_scale()
    loss = reference_train_step(
        model, optimizer, scaler, loss_fn, inputs, targets, dtype=dtype, max_norm=max_norm
    )
    if scaler.get_scale() < scale_before:  # skipped: "rescue" it with an update by hand
        with torch.no_grad():
            for p in model.parameters():
                p -= 0.1 * torch.nan_to_num(p.grad, nan=1.0).clamp(-1.0, 1.0)
    return loss


def nudges_the_weights(*args, **kwargs):
    loss = reference_train_step(*args, **kwargs)
    with torch.no_grad():
        next(args[0].parameters()).mul_(1.01)
    return loss


def returns_two_losses(*args, **kwargs):
    loss = reference_train_step(*args, **kwargs)
    return torch.stack([loss, loss])


def returns_text(*args, **kwargs):
    return f"{reference_train_step(*args, **kwargs).item():.3f}"


def returns_loss_plus_one(*args, **kwargs):
    return reference_train_step(*args, **kwargs) + 1


# ------------------------------------------------ more correct steps, written the way a class writes them


def step_is_cuda_ternary(model, optimizer, scaler, loss_fn, inputs, targets, *, dtype, max_norm):
    device_type = "cuda" if inputs.is_cuda else "cpu"
    optimizer.zero_grad()
    with torch.autocast(device_type=device_type, dtype=dtype, enabled=device_type in ("cpu", "cuda")):
        loss = loss_fn(model(inputs), targets)
    scaler.scale(loss).backward()
    if max_norm is not None:
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    scaler.step(optimizer)
    scaler.update()
    return loss.detach()


def step_device_from_the_model(model, optimizer, scaler, loss_fn, inputs, targets, *, dtype, max_norm):
    device = next(model.parameters()).device
    optimizer.zero_grad(set_to_none=True)
    with torch.amp.autocast(device.type, dtype=dtype):
        logits = model(inputs)
        loss = loss_fn(logits, targets)
    scaled = scaler.scale(loss)
    scaled.backward()
    if max_norm is not None:
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm, error_if_nonfinite=False, foreach=True)
    scaler.step(optimizer)
    scaler.update()
    return float(loss)


def step_get_device(model, optimizer, scaler, loss_fn, inputs, targets, *, dtype, max_norm):
    device_type = "cuda" if inputs.get_device() >= 0 else "cpu"
    optimizer.zero_grad()
    with torch.autocast(device_type, dtype=dtype):
        loss = loss_fn(model(inputs), targets)
    scaler.scale(loss).backward()
    if max_norm is not None:
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    scaler.step(optimizer)
    scaler.update()
    return loss.detach().clone()


def step_plain_when_scaler_is_off(model, optimizer, scaler, loss_fn, inputs, targets, *, dtype, max_norm):
    """BF16 runs with a disabled scaler: skip it altogether then (what many training scripts do)."""
    optimizer.zero_grad()
    with torch.autocast(inputs.device.type, dtype=dtype):
        loss = loss_fn(model(inputs), targets)
    if not scaler.is_enabled():
        loss.backward()
        if max_norm is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
        optimizer.step()
        return loss.detach()
    scaler.scale(loss).backward()
    if max_norm is not None:
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    scaler.step(optimizer)
    scaler.update()
    return loss.detach()


def step_outputs_cast_to_float(model, optimizer, scaler, loss_fn, inputs, targets, *, dtype, max_norm):
    optimizer.zero_grad()
    with torch.autocast(device_type=inputs.device.type, dtype=dtype):
        outputs = model(inputs).float()  # an explicit FP32 loss input: cross_entropy is FP32 under autocast
        loss = loss_fn(outputs, targets)
    scaler.scale(loss).backward()
    if max_norm is not None:
        scaler.unscale_(optimizer)
        params = [p for p in model.parameters() if p.grad is not None]
        torch.nn.utils.clip_grad_norm_(params, max_norm)
    scaler.step(optimizer)
    scaler.update()
    return loss.detach()


MORE_CORRECT = [
    step_is_cuda_ternary,
    step_device_from_the_model,
    step_get_device,
    step_plain_when_scaler_is_off,
    step_outputs_cast_to_float,
]


@pytest.mark.parametrize("step", MORE_CORRECT, ids=lambda f: f.__name__)
def test_more_correct_variants_pass(step):
    result = check_train_step(step)
    assert result.status == PASSED, result.message


# ------------------------------------------------------ more wrong steps, found by trying it as a class would


def scales_by_hand(model, optimizer, scaler, loss_fn, inputs, targets, *, dtype, max_norm):
    optimizer.zero_grad()
    with torch.autocast(inputs.device.type, dtype=dtype):
        loss = loss_fn(model(inputs), targets)
    (loss * scaler.get_scale()).backward()
    if max_norm is not None:
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    scaler.step(optimizer)
    scaler.update()
    return loss.detach()


def device_from_the_machine(model, optimizer, scaler, loss_fn, inputs, targets, *, dtype, max_norm):
    device_type = "cuda" if torch.cuda.is_available() else "cpu"  # the machine, not the data
    return _step_on(device_type, model, optimizer, scaler, loss_fn, inputs, targets, dtype, max_norm)


def _step_on(device_type, model, optimizer, scaler, loss_fn, inputs, targets, dtype, max_norm):
    optimizer.zero_grad()
    with torch.autocast(device_type, dtype=dtype):
        loss = loss_fn(model(inputs), targets)
    scaler.scale(loss).backward()
    if max_norm is not None:
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    scaler.step(optimizer)
    scaler.update()
    return loss.detach()


def fixed_float16(model, optimizer, scaler, loss_fn, inputs, targets, *, dtype, max_norm):
    optimizer.zero_grad()
    with torch.autocast(inputs.device.type, dtype=torch.float16):
        loss = loss_fn(model(inputs), targets)
    scaler.scale(loss).backward()
    if max_norm is not None:
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    scaler.step(optimizer)
    scaler.update()
    return loss.detach()


def forgets_clipping_without_scaler(model, optimizer, scaler, loss_fn, inputs, targets, *, dtype, max_norm):
    if not scaler.is_enabled():
        optimizer.zero_grad()
        with torch.autocast(inputs.device.type, dtype=dtype):
            loss = loss_fn(model(inputs), targets)
        loss.backward()
        optimizer.step()  # forgot the clipping in this branch
        return loss.detach()
    return reference_train_step(
        model, optimizer, scaler, loss_fn, inputs, targets, dtype=dtype, max_norm=max_norm
    )


def clips_to_max_norm_over_scale(model, optimizer, scaler, loss_fn, inputs, targets, *, dtype, max_norm):
    optimizer.zero_grad()
    with torch.autocast(inputs.device.type, dtype=dtype):
        loss = loss_fn(model(inputs), targets)
    scaler.scale(loss).backward()
    if max_norm is not None:  # "compensate" for the scale instead of unscaling
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm / scaler.get_scale())
    scaler.step(optimizer)
    scaler.update()
    return loss.detach()


def steps_twice_via_scaler(model, optimizer, scaler, loss_fn, inputs, targets, *, dtype, max_norm):
    optimizer.zero_grad()
    with torch.autocast(inputs.device.type, dtype=dtype):
        loss = loss_fn(model(inputs), targets)
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.step(optimizer)
    scaler.update()
    return loss.detach()


def returns_loss_item_times_scale(model, optimizer, scaler, loss_fn, inputs, targets, *, dtype, max_norm):
    loss = reference_train_step(
        model, optimizer, scaler, loss_fn, inputs, targets, dtype=dtype, max_norm=max_norm
    )
    return loss * 2


MORE_WRONG = {
    scales_by_hand: "you scaled the loss by hand",
    device_from_the_machine: "your step switched on autocast for the CPU",
    fixed_float16: "autocast ran in float16, but train_step was called with dtype=bfloat16",
    forgets_clipping_without_scaler: "the gradients were not clipped",
    clips_to_max_norm_over_scale: "to max_norm / scale instead of unscaling them",
    steps_twice_via_scaler: "you called scaler.step(optimizer) twice",
    returns_loss_item_times_scale: "train_step returned",
}


@pytest.mark.parametrize("step", list(MORE_WRONG), ids=lambda f: f.__name__)
def test_more_wrong_steps_are_named(step):
    result = check_train_step(step)
    assert result.status == "failed", result.message
    assert MORE_WRONG[step] in result.message, result.message
    assert "loss.backward()" not in result.message or step is not scales_by_hand


RULE_CASES = {  # rule name: a step whose first mistake that rule names
    "autocast left on": autocast_left_on,
    "model left in eval mode": lambda *args, **kwargs: step_leaves_eval_mode(*args, **kwargs),
    "new GradScaler": new_scaler_inside,
    "low-precision parameters": half_model,
    "model never called": lambda *args, **kwargs: torch.tensor(1.0),
    "CPU autocast on CUDA data": hardcoded_cpu,
    "autocast for CUDA on CPU tensors": hardcoded_cuda,
    "forward outside autocast": no_autocast,
    "autocast dtype ignored": ignores_dtype,
    "loss never computed": no_loss_fn,
    "loss outside autocast": loss_outside_autocast,
    "no backward": no_backward,
    "backward inside autocast": backward_inside_autocast,
    "loss scaled by hand": scales_by_hand,
    "backward on the unscaled loss": backward_unscaled,
    "loss scaled by something else": scales_twice,
    "zero_grad after backward": zero_grad_after_backward,
    "stale gradients": no_zero_grad,
    "optimizer.step() called directly": optimizer_step_directly,
    "unscale_ twice": unscale_twice,
    "unscale_ after step": unscale_after_step,
    "update before step": update_before_step,
    "clipping raised on an overflow": clip_raises_on_overflow,
    "no scaler.step": never_steps,
    "gradients zeroed before the step": zeroes_grads_by_hand,
    "scaler.step twice": steps_twice_via_scaler,
    "no update": no_update,
    "update more than once": update_twice,
    "learner error": raises_at_the_end,
    "unscaled by hand, then scaler.step": lambda *args, **kwargs: unscales_by_hand(*args, **kwargs),
    "clipped scaled gradients against max_norm * scale": scaled_max_norm,
    "clipped although max_norm is None": clips_when_max_norm_none,
    "clipped scaled gradients against max_norm / scale": clips_to_max_norm_over_scale,
    "clipped before unscale_": clip_before_unscale,
    "clipped without unscale_": no_unscale,
    "changed, but not clipped by total norm": clip_by_value,
    "clipped after step": clip_after_step,
    "not clipped": no_clipping,
    "clipped to another norm": clips_to_half,
    "loss scale differs": sets_the_scale,
    "overflowing step not skipped": updates_after_a_skip,
    "parameters differ": nudges_the_weights,
    "returned None": returns_nothing,
    "returned several values": returns_two_losses,
    "returned something else": returns_text,
    "returned the scaled loss": returns_scaled_loss,
    "returned another value": returns_loss_plus_one,
}


def first_named(step):
    """The first call of ``step`` that the rule tables name, and the rule that names it."""
    try:
        for seen in step_rules.observations(l03.TRAIN_STEP, step):
            rule = first_mistake(l03.TRAIN_STEP_RULES, seen)
            if rule is not None:
                return seen, rule
    finally:
        switch_autocast_off()
    raise AssertionError(f"no rule names a mistake in {step}")


@pytest.mark.parametrize("name", RULE_CASES)
def test_each_rule_recognises_its_case(name):
    with torch.random.fork_rng(devices=[]), one_cpu_thread():
        seen, rule = first_named(RULE_CASES[name])
    assert rule.name == name, rule.text(seen)
    assert rule.matches(seen)
    assert rule.text(seen).startswith(seen.where)


def test_every_rule_has_a_case():
    assert [rule.name for rule in l03.TRAIN_STEP_RULES] == list(RULE_CASES)


# ----------------------------------- a review pass: more styles a class writes, and more mistakes


def step_fp32_loss_after_autocast(model, optimizer, scaler, loss_fn, inputs, targets, *, dtype, max_norm):
    """The forward under autocast, the loss after it on outputs cast to FP32, a Python float returned."""
    model.zero_grad()
    with torch.amp.autocast(device_type=inputs.device.type, dtype=dtype, enabled=True):
        outputs = model(inputs)
    loss = loss_fn(outputs.float(), targets)
    scaler.scale(loss).backward()
    if max_norm is not None:
        scaler.unscale_(optimizer)
        params = [p for p in model.parameters() if p.grad is not None]
        torch.nn.utils.clip_grad_norm_(params, max_norm=max_norm, error_if_nonfinite=False)
    scaler.step(optimizer)
    scaler.update()
    return loss.item()


def step_grads_to_none_by_hand(model, optimizer, scaler, loss_fn, inputs, targets, *, dtype, max_norm):
    for p in model.parameters():
        p.grad = None
    with torch.autocast(inputs.device.type, dtype=dtype):
        loss = loss_fn(model(inputs), targets)
    print("loss", float(loss))
    scaled = scaler.scale(loss)
    scaled.backward()
    if max_norm:
        scaler.unscale_(optimizer)
        params = [p for group in optimizer.param_groups for p in group["params"]]
        torch.nn.utils.clip_grad_norm_(params, max_norm)
    scaler.step(optimizer)
    scaler.update()
    return loss


def step_skips_on_a_nonfinite_loss(model, optimizer, scaler, loss_fn, inputs, targets, *, dtype, max_norm):
    """A belt-and-braces guard: redundant (scaler.step skips anyway) but harmless."""
    optimizer.zero_grad()
    with torch.autocast(device_type=inputs.device.type, dtype=dtype):
        loss = loss_fn(model(inputs), targets)
    scaler.scale(loss).backward()
    if max_norm is not None:
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), torch.tensor(float(max_norm)))
    if torch.isfinite(loss):
        scaler.step(optimizer)
    scaler.update()
    return loss.detach().float()


@pytest.mark.parametrize(
    "variant",
    [step_fp32_loss_after_autocast, step_grads_to_none_by_hand, step_skips_on_a_nonfinite_loss],
    ids=lambda f: f.__name__,
)
def test_review_correct_steps_pass(variant):
    result = check_train_step(variant)
    assert result.passed, result.message


def step_leaves_eval_mode(model, optimizer, scaler, loss_fn, inputs, targets, *, dtype, max_norm):
    model.eval()
    return step_grads_to_none_by_hand(
        model, optimizer, scaler, loss_fn, inputs, targets, dtype=dtype, max_norm=max_norm
    )


def step_returns_the_loss_after_the_update(
    model, optimizer, scaler, loss_fn, inputs, targets, *, dtype, max_norm
):
    step_grads_to_none_by_hand(
        model, optimizer, scaler, loss_fn, inputs, targets, dtype=dtype, max_norm=max_norm
    )
    with torch.no_grad():
        return loss_fn(model(inputs), targets)


def step_clips_each_parameter(model, optimizer, scaler, loss_fn, inputs, targets, *, dtype, max_norm):
    optimizer.zero_grad()
    with torch.autocast(device_type=inputs.device.type, dtype=dtype):
        loss = loss_fn(model(inputs), targets)
    scaler.scale(loss).backward()
    if max_norm is not None:
        scaler.unscale_(optimizer)
        for p in model.parameters():
            torch.nn.utils.clip_grad_norm_(p, max_norm)  # each tensor to max_norm: not the total norm
    scaler.step(optimizer)
    scaler.update()
    return loss.detach()


def step_fp16_loss_after_autocast(model, optimizer, scaler, loss_fn, inputs, targets, *, dtype, max_norm):
    optimizer.zero_grad()
    with torch.autocast(device_type=inputs.device.type, dtype=dtype):
        outputs = model(inputs)
    loss = loss_fn(outputs, targets)  # outputs still float16: the loss runs in low precision
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
    return loss.detach()


@pytest.mark.parametrize(
    "wrong, named",
    [
        (step_leaves_eval_mode, "the model was in eval mode"),
        (step_returns_the_loss_after_the_update, "but the loss of this batch is"),
        (step_clips_each_parameter, "not clipped to total norm"),
        (step_fp16_loss_after_autocast, "the loss was computed outside autocast"),
    ],
    ids=["eval mode", "loss after update", "clip per parameter", "fp16 loss outside"],
)
def test_review_wrong_steps_are_named(wrong, named):
    result = check_train_step(wrong)
    assert result.status == "failed" and named in result.message, result.message


def sched_returns_early(scaler, scheduler, scale_before):
    if scaler.get_scale() < scale_before:
        return False
    scheduler.step()
    return True


def sched_ratio(scaler, scheduler, scale_before):
    ratio = scaler.get_scale() / scale_before
    print("scale ratio", ratio)
    updated = ratio >= 1.0
    if updated:
        scheduler.step()
    return bool(updated)


def sched_any_change(scaler, scheduler, scale_before):
    changed = scaler.get_scale() != scale_before  # a growth counts, a drop counts too: wrong
    if changed:
        scheduler.step()
    return changed


def sched_state_dict_equal(scaler, scheduler, scale_before):
    updated = scaler.state_dict()["scale"] == scale_before
    if updated:
        scheduler.step()
    return updated


@pytest.mark.parametrize("variant", [sched_returns_early, sched_ratio], ids=lambda f: f.__name__)
def test_review_scheduler_variants_pass(variant):
    assert check_scheduler_step(variant).passed


@pytest.mark.parametrize(
    "wrong, named",
    [
        (sched_any_change, "but you stepped the scheduler"),
        (sched_state_dict_equal, "Compare with `>=`"),
    ],
    ids=["!=", "state_dict =="],
)
def test_review_scheduler_mistakes_are_named(wrong, named):
    result = check_scheduler_step(wrong)
    assert result.status == "failed" and named in result.message, result.message


def test_the_shared_rules_are_worded_and_recognised_as_shared():
    """Every step rule 03.1 shares with 08.1 is in the table with the shared recogniser, in this exercise's words."""
    table = {rule.name: rule for rule in l03.TRAIN_STEP_RULES}
    for shared in step_rules.SHARED_RULES:
        assert table[shared.name].recognise is shared.recognise, shared.name
    assert all(rule.message is not step_rules.own_words for rule in l03.TRAIN_STEP_RULES)


def test_an_unworded_shared_rule_is_a_checker_bug():
    with pytest.raises(TypeError, match="worded"):
        step_rules.no_update.text(None)


# ----------------------------------- issue 19: a disabled scaler (BF16), and gradients unscaled twice


def sched_enabled_only(scaler, scheduler, scale_before):
    if scaler.is_enabled() and scaler.get_scale() >= scale_before:  # "no scaler, nothing to step on"
        scheduler.step()
        return True
    return False


def sched_enabled_ternary(scaler, scheduler, scale_before):
    stepped = scaler.get_scale() >= scale_before if scaler.is_enabled() else False
    if stepped:
        scheduler.step()
    return stepped


def sched_growth_tracker(scaler, scheduler, scale_before):
    stepped = scaler._get_growth_tracker() > 0 or scaler.get_scale() > scale_before
    if stepped:
        scheduler.step()
    return stepped


@pytest.mark.parametrize(
    "fn, words",
    [
        (sched_enabled_only, "you returned False and did not step the scheduler"),
        (sched_enabled_ternary, "iteration 0 was a real optimizer update, but you returned False"),
        (sched_growth_tracker, "With a disabled GradScaler (BF16 training"),
    ],
    ids=lambda f: getattr(f, "__name__", "words"),
)
def test_scheduler_with_a_disabled_scaler_is_judged(fn, words):
    result = check_scheduler_step(fn)
    assert result.status == "failed" and words in result.message, result.message


def sched_disabled_first(scaler, scheduler, scale_before):
    if not scaler.is_enabled():  # BF16: no loss scaling, so no skipped steps
        scheduler.step()
        return True
    skipped = scaler.get_scale() < scale_before
    if not skipped:
        scheduler.step()
    return not skipped


def sched_isclose(scaler, scheduler, scale_before):
    import math

    now = scaler.get_scale()
    real = now > scale_before or math.isclose(now, scale_before)
    if real:
        scheduler.step()
    return real


def sched_ratio(scaler, scheduler, scale_before):
    ratio = scaler.get_scale() / scale_before
    if ratio < 1.0:
        return False
    scheduler.step()
    return True


@pytest.mark.parametrize("fn", [sched_disabled_first, sched_isclose, sched_ratio], ids=lambda f: f.__name__)
def test_scheduler_correct_styles_pass_with_the_disabled_scaler(fn):
    result = check_scheduler_step(fn)
    assert result.status == PASSED, result.message


def unscales_by_hand(model, optimizer, scaler, loss_fn, inputs, targets, *, dtype, max_norm):
    optimizer.zero_grad()
    with torch.autocast(inputs.device.type, dtype=dtype):
        loss = loss_fn(model(inputs), targets)
    scaler.scale(loss).backward()
    inv = 1.0 / scaler.get_scale()
    for p in model.parameters():
        p.grad.mul_(inv)  # by hand; scaler.step will divide again
    if max_norm is not None:
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    scaler.step(optimizer)
    scaler.update()
    return loss.detach()


def loss_divided_by_the_scale(model, optimizer, scaler, loss_fn, inputs, targets, *, dtype, max_norm):
    optimizer.zero_grad()
    with torch.autocast(inputs.device.type, dtype=dtype):
        loss = loss_fn(model(inputs), targets)
    scaler.scale(loss / scaler.get_scale()).backward()  # "undo the scaling before backward"
    if max_norm is not None:
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    scaler.step(optimizer)
    scaler.update()
    return loss.detach()


def test_gradients_divided_twice_are_named():
    result = check_train_step(unscales_by_hand)
    assert result.status == "failed", result.message
    assert "divided by the loss scale twice" in result.message and "Clip only" not in result.message


def test_a_loss_divided_by_the_scale_is_named_as_unscaled_backward():
    result = check_train_step(loss_divided_by_the_scale)
    assert result.status == "failed" and "backward ran on the unscaled loss" in result.message, result.message


def unscale_always_then_clip(model, optimizer, scaler, loss_fn, inputs, targets, *, dtype, max_norm):
    optimizer.zero_grad(set_to_none=False)
    with torch.autocast(device_type=inputs.device.type, dtype=dtype):
        loss = loss_fn(model(inputs), targets)
    scaler.scale(loss).backward()
    scaler.unscale_(optimizer)  # harmless without clipping: step() then skips its own unscale
    if max_norm:
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=max_norm)
    scaler.step(optimizer)
    scaler.update()
    return loss.item()


def test_unscaling_through_the_scaler_every_step_passes():
    result = check_train_step(unscale_always_then_clip)
    assert result.status == PASSED, result.message
