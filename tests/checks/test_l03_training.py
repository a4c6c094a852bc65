"""Lesson 03 checkers: the solution and other correct steps pass, the untouched exercise is "not done",
every known wrong step is rejected with a message that names its mistake, and junk never raises."""

import time

import pytest
import torch
from notebook_code import exercise, solution

from amp_lessons.checks.harness import NOT_DONE, PASSED
from amp_lessons.checks.l03_training import check_scheduler_step, check_train_step
from amp_lessons.training import train_step as reference_train_step

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


def step_positional_dtype(model, optimizer, scaler, loss_fn, inputs, targets, dtype=torch.float16, max_norm=None):
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
    return reference_train_step(model, optimizer, scaler, loss_fn, inputs, targets, dtype=dtype, max_norm=max_norm)


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
    return reference_train_step(model, optimizer, scaler, loss_fn, inputs, targets, dtype=torch.float16,
                                max_norm=max_norm)


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
    return reference_train_step(model, optimizer, scaler, loss_fn, inputs, targets, dtype=dtype, max_norm=None)


def clips_when_max_norm_none(model, optimizer, scaler, loss_fn, inputs, targets, *, dtype, max_norm):
    return reference_train_step(model, optimizer, scaler, loss_fn, inputs, targets, dtype=dtype,
                                max_norm=max_norm or 0.01)


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
    hardcoded_cpu: "hard-codes the device type 'cpu'",
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


def sched_returns_none(scaler, scheduler, scale_before):
    if scaler.get_scale() >= scale_before:
        scheduler.step()


SCHED_WRONG = {
    sched_always: "must not advance the schedule",
    sched_equal: "the scale grew",
    sched_greater: "an unchanged scale means there was no overflow",
    sched_forgets_step: "scheduler.step() was called 0 times",
    sched_twice: "scheduler.step() was called 2 times",
    sched_updates_scaler: "changed the loss scale",
    sched_returns_none: "returned None",
}


def test_scheduler_solution_passes(strict):
    assert check_scheduler_step(solution(LESSON, "step_scheduler_if_updated")).status == PASSED


@pytest.mark.parametrize("fn", [sched_correct, sched_correct_not], ids=lambda f: f.__name__)
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


@pytest.mark.parametrize("junk", [None, "f", 1, lambda s: True, lambda *a: 1 / 0, lambda *a: torch.tensor([True, False])],
                         ids=range(6))
def test_scheduler_junk_never_raises(junk):
    result = check_scheduler_step(junk)
    assert result.status == "failed" and result.message
