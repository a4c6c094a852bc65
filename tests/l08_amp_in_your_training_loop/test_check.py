"""Lesson 08 checker: the solution and correct accumulation steps in other styles pass, the untouched exercise
is "not done", every known wrong placement is rejected with a message that names it, and junk never raises."""

import time

import pytest
import torch
from notebook_code import exercise, solution

from amp_lessons.checks.harness import NOT_DONE, PASSED
from amp_lessons.checks.mistakes import first_mistake
from amp_lessons.core.autocast_state import switch_autocast_off
from amp_lessons.core.environment import one_cpu_thread
from amp_lessons.l03_autocast_and_gradscaler import step_rules
from amp_lessons.l08_amp_in_your_training_loop import check as l08
from amp_lessons.l08_amp_in_your_training_loop.check import check_accumulate_step
from amp_lessons.l08_amp_in_your_training_loop.probes import SCENARIOS
from amp_lessons.l08_amp_in_your_training_loop.training_loop import WRONG_PLACEMENTS
from amp_lessons.l08_amp_in_your_training_loop.training_loop import (
    accumulate_step as reference_accumulate_step,
)

LESSON = "08_amp_in_your_training_loop.ipynb"


# --------------------------------------------------------------------------------------- correct styles


def summed_then_one_backward(model, optimizer, scaler, loss_fn, micro_batches, *, dtype, max_norm):
    optimizer.zero_grad()
    losses = []
    for inputs, targets in micro_batches:
        with torch.autocast(device_type=inputs.device.type, dtype=dtype):
            losses.append(loss_fn(model(inputs), targets))
    total = torch.stack(losses).mean()
    scaler.scale(total).backward()
    if max_norm is not None:
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    scaler.step(optimizer)
    scaler.update()
    return total.detach()


def other_spellings(model, optimizer, scaler, loss_fn, micro_batches, *, dtype, max_norm):
    from torch.nn.utils import clip_grad_norm_

    model.zero_grad(set_to_none=False)
    device_type = micro_batches[0][0].device.type
    running = 0.0
    for x, y in micro_batches:
        with torch.amp.autocast(device_type, dtype=dtype):
            out = model(x)
            loss = loss_fn(out, y) / len(micro_batches)
        scaled = scaler.scale(loss)
        scaled.backward()
        running += loss.item()
    scaler.unscale_(optimizer)  # also without clipping: harmless
    if max_norm is not None:
        clip_grad_norm_([p for group in optimizer.param_groups for p in group["params"]], max_norm=max_norm)
    scaler.step(optimizer)
    scaler.update()
    return running


def divide_after_scaling(model, optimizer, scaler, loss_fn, micro_batches, *, dtype, max_norm):
    for p in model.parameters():
        p.grad = None
    n = len(micro_batches)
    total = 0
    for inputs, targets in micro_batches:
        with torch.autocast(inputs.device.type, dtype):
            loss = loss_fn(model(inputs), targets)
        (scaler.scale(loss) / n).backward()
        total = total + loss.detach() / n
    if max_norm:
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad()  # also at the end: harmless when done at the start too
    return total


def zero_grad_on_first_micro_batch(model, optimizer, scaler, loss_fn, micro_batches, *, dtype, max_norm):
    losses = []
    for i, (inputs, targets) in enumerate(micro_batches):
        if i == 0:
            optimizer.zero_grad()
        with torch.autocast(device_type=inputs.device.type, dtype=dtype):
            loss = loss_fn(model(inputs), targets)
        scaler.scale(loss / len(micro_batches)).backward()
        losses.append(loss.detach())
        if i == len(micro_batches) - 1:
            if max_norm is not None:
                scaler.unscale_(optimizer)
                torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
            scaler.step(optimizer)
            scaler.update()
    return sum(losses) / len(losses)


def loss_on_fp32_outputs_after_autocast(model, optimizer, scaler, loss_fn, micro_batches, *, dtype, max_norm):
    """Forward under autocast, loss afterwards on outputs cast to FP32: as precise as the FP32 policy."""
    optimizer.zero_grad()
    losses = []
    for x, y in micro_batches:
        with torch.autocast(device_type=x.device.type, dtype=dtype):
            out = model(x)
        loss = loss_fn(out.float(), y) / len(micro_batches)
        scaler.scale(loss).backward()
        losses.append(loss.detach())
    if max_norm is not None:
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    scaler.step(optimizer)
    scaler.update()
    return torch.stack(losses).sum()


CORRECT = [
    reference_accumulate_step,
    summed_then_one_backward,
    other_spellings,
    divide_after_scaling,
    zero_grad_on_first_micro_batch,
    loss_on_fp32_outputs_after_autocast,
]


# ------------------------------------------------------------------------------------ wrong placements


def wrong(body):
    """A wrong step from ``body(model, optimizer, scaler, loss_fn, micro_batches, dtype, max_norm)``."""

    def step(model, optimizer, scaler, loss_fn, micro_batches, *, dtype, max_norm):
        return body(model, optimizer, scaler, loss_fn, micro_batches, dtype, max_norm)

    step.__name__ = body.__name__
    return step


def micro_loss(model, loss_fn, inputs, targets, dtype):
    with torch.autocast(inputs.device.type, dtype=dtype):
        return loss_fn(model(inputs), targets)


def finish(model, optimizer, scaler, max_norm):
    if max_norm is not None:
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    scaler.step(optimizer)
    scaler.update()


@wrong
def no_autocast(model, optimizer, scaler, loss_fn, micro_batches, dtype, max_norm):
    optimizer.zero_grad()
    losses = []
    for x, y in micro_batches:
        loss = loss_fn(model(x), y)
        scaler.scale(loss / len(micro_batches)).backward()
        losses.append(loss.detach())
    finish(model, optimizer, scaler, max_norm)
    return torch.stack(losses).mean()


@wrong
def hardcoded_cuda(model, optimizer, scaler, loss_fn, micro_batches, dtype, max_norm):
    optimizer.zero_grad()
    losses = []
    for x, y in micro_batches:
        with torch.autocast(device_type="cuda", dtype=dtype):
            loss = loss_fn(model(x), y)
        scaler.scale(loss / len(micro_batches)).backward()
        losses.append(loss.detach())
    finish(model, optimizer, scaler, max_norm)
    return torch.stack(losses).mean()


def hardcoded_cpu(model, optimizer, scaler, loss_fn, micro_batches, *, dtype, max_norm):
    optimizer.zero_grad()
    losses = []
    for x, y in micro_batches:
        with torch.autocast(device_type="cpu", dtype=dtype):
            loss = loss_fn(model(x), y)
        scaler.scale(loss / len(micro_batches)).backward()
        losses.append(loss.detach())
    finish(model, optimizer, scaler, max_norm)
    return torch.stack(losses).mean()


@wrong
def ignores_dtype(model, optimizer, scaler, loss_fn, micro_batches, dtype, max_norm):
    return reference_accumulate_step(
        model, optimizer, scaler, loss_fn, micro_batches, dtype=torch.float16, max_norm=max_norm
    )


@wrong
def loss_outside_autocast(model, optimizer, scaler, loss_fn, micro_batches, dtype, max_norm):
    optimizer.zero_grad()
    losses = []
    for x, y in micro_batches:
        with torch.autocast(x.device.type, dtype=dtype):
            out = model(x)
        loss = loss_fn(out, y)
        scaler.scale(loss / len(micro_batches)).backward()
        losses.append(loss.detach())
    finish(model, optimizer, scaler, max_norm)
    return torch.stack(losses).mean()


@wrong
def backward_inside_autocast(model, optimizer, scaler, loss_fn, micro_batches, dtype, max_norm):
    optimizer.zero_grad()
    losses = []
    for x, y in micro_batches:
        with torch.autocast(x.device.type, dtype=dtype):
            loss = loss_fn(model(x), y)
            scaler.scale(loss / len(micro_batches)).backward()
        losses.append(loss.detach())
    finish(model, optimizer, scaler, max_norm)
    return torch.stack(losses).mean()


@wrong
def unscaled_backward(model, optimizer, scaler, loss_fn, micro_batches, dtype, max_norm):
    optimizer.zero_grad()
    losses = []
    for x, y in micro_batches:
        loss = micro_loss(model, loss_fn, x, y, dtype)
        (loss / len(micro_batches)).backward()
        losses.append(loss.detach())
    finish(model, optimizer, scaler, max_norm)
    return torch.stack(losses).mean()


@wrong
def divided_twice(model, optimizer, scaler, loss_fn, micro_batches, dtype, max_norm):
    optimizer.zero_grad()
    losses = []
    n = len(micro_batches)
    for x, y in micro_batches:
        loss = micro_loss(model, loss_fn, x, y, dtype) / n
        scaler.scale(loss / n).backward()
        losses.append(loss.detach() * n)
    finish(model, optimizer, scaler, max_norm)
    return torch.stack(losses).mean()


@wrong
def concatenated(model, optimizer, scaler, loss_fn, micro_batches, dtype, max_norm):
    inputs = torch.cat([x for x, _ in micro_batches])
    targets = torch.cat([y for _, y in micro_batches])
    optimizer.zero_grad()
    loss = micro_loss(model, loss_fn, inputs, targets, dtype)
    scaler.scale(loss).backward()
    finish(model, optimizer, scaler, max_norm)
    return loss.detach()


@wrong
def only_first_micro_batch(model, optimizer, scaler, loss_fn, micro_batches, dtype, max_norm):
    optimizer.zero_grad()
    x, y = micro_batches[0]
    loss = micro_loss(model, loss_fn, x, y, dtype)
    scaler.scale(loss).backward()
    finish(model, optimizer, scaler, max_norm)
    return loss.detach()


@wrong
def no_zero_grad(model, optimizer, scaler, loss_fn, micro_batches, dtype, max_norm):
    losses = []
    for x, y in micro_batches:
        loss = micro_loss(model, loss_fn, x, y, dtype)
        scaler.scale(loss / len(micro_batches)).backward()
        losses.append(loss.detach())
    finish(model, optimizer, scaler, max_norm)
    return torch.stack(losses).mean()


@wrong
def zero_grad_at_end(model, optimizer, scaler, loss_fn, micro_batches, dtype, max_norm):
    losses = []
    for x, y in micro_batches:
        loss = micro_loss(model, loss_fn, x, y, dtype)
        scaler.scale(loss / len(micro_batches)).backward()
        losses.append(loss.detach())
    finish(model, optimizer, scaler, max_norm)
    optimizer.zero_grad()
    return torch.stack(losses).mean()


@wrong
def manual_zero_inside_loop(model, optimizer, scaler, loss_fn, micro_batches, dtype, max_norm):
    losses = []
    for x, y in micro_batches:
        for p in model.parameters():
            p.grad = None
        loss = micro_loss(model, loss_fn, x, y, dtype)
        scaler.scale(loss / len(micro_batches)).backward()
        losses.append(loss.detach())
    finish(model, optimizer, scaler, max_norm)
    return torch.stack(losses).mean()


@wrong
def zero_grad_after_loop(model, optimizer, scaler, loss_fn, micro_batches, dtype, max_norm):
    losses = []
    for x, y in micro_batches:
        loss = micro_loss(model, loss_fn, x, y, dtype)
        scaler.scale(loss / len(micro_batches)).backward()
        losses.append(loss.detach())
    optimizer.zero_grad()
    finish(model, optimizer, scaler, max_norm)
    return torch.stack(losses).mean()


@wrong
def clip_value_instead(model, optimizer, scaler, loss_fn, micro_batches, dtype, max_norm):
    optimizer.zero_grad()
    losses = []
    for x, y in micro_batches:
        loss = micro_loss(model, loss_fn, x, y, dtype)
        scaler.scale(loss / len(micro_batches)).backward()
        losses.append(loss.detach())
    scaler.unscale_(optimizer)
    if max_norm is not None:
        torch.nn.utils.clip_grad_value_(model.parameters(), max_norm)
    scaler.step(optimizer)
    scaler.update()
    return torch.stack(losses).mean()


@wrong
def clips_when_none(model, optimizer, scaler, loss_fn, micro_batches, dtype, max_norm):
    optimizer.zero_grad()
    losses = []
    for x, y in micro_batches:
        loss = micro_loss(model, loss_fn, x, y, dtype)
        scaler.scale(loss / len(micro_batches)).backward()
        losses.append(loss.detach())
    scaler.unscale_(optimizer)
    torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm or 0.01)
    scaler.step(optimizer)
    scaler.update()
    return torch.stack(losses).mean()


@wrong
def never_clips(model, optimizer, scaler, loss_fn, micro_batches, dtype, max_norm):
    return reference_accumulate_step(
        model, optimizer, scaler, loss_fn, micro_batches, dtype=dtype, max_norm=None
    )


@wrong
def optimizer_step_directly(model, optimizer, scaler, loss_fn, micro_batches, dtype, max_norm):
    optimizer.zero_grad()
    losses = []
    for x, y in micro_batches:
        loss = micro_loss(model, loss_fn, x, y, dtype)
        scaler.scale(loss / len(micro_batches)).backward()
        losses.append(loss.detach())
    scaler.unscale_(optimizer)
    if max_norm is not None:
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    optimizer.step()
    scaler.update()
    return torch.stack(losses).mean()


@wrong
def update_twice(model, optimizer, scaler, loss_fn, micro_batches, dtype, max_norm):
    loss = reference_accumulate_step(
        model, optimizer, scaler, loss_fn, micro_batches, dtype=dtype, max_norm=max_norm
    )
    scaler.update()
    return loss


@wrong
def no_update(model, optimizer, scaler, loss_fn, micro_batches, dtype, max_norm):
    optimizer.zero_grad()
    losses = []
    for x, y in micro_batches:
        loss = micro_loss(model, loss_fn, x, y, dtype)
        scaler.scale(loss / len(micro_batches)).backward()
        losses.append(loss.detach())
    if max_norm is not None:
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    scaler.step(optimizer)
    return torch.stack(losses).mean()


@wrong
def update_before_step(model, optimizer, scaler, loss_fn, micro_batches, dtype, max_norm):
    optimizer.zero_grad()
    losses = []
    for x, y in micro_batches:
        loss = micro_loss(model, loss_fn, x, y, dtype)
        scaler.scale(loss / len(micro_batches)).backward()
        losses.append(loss.detach())
    scaler.unscale_(optimizer)
    if max_norm is not None:
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    scaler.update()
    scaler.step(optimizer)
    return torch.stack(losses).mean()


@wrong
def new_scaler_inside(model, optimizer, scaler, loss_fn, micro_batches, dtype, max_norm):
    scaler = torch.amp.GradScaler(micro_batches[0][0].device.type)
    return reference_accumulate_step(
        model, optimizer, scaler, loss_fn, micro_batches, dtype=dtype, max_norm=max_norm
    )


@wrong
def half_model(model, optimizer, scaler, loss_fn, micro_batches, dtype, max_norm):
    model.half()
    optimizer.zero_grad()
    for x, y in micro_batches:
        scaler.scale(loss_fn(model(x.half()), y) / len(micro_batches)).backward()
    scaler.step(optimizer)
    scaler.update()


def returning(what):
    @wrong
    def step(model, optimizer, scaler, loss_fn, micro_batches, dtype, max_norm):
        optimizer.zero_grad()
        losses, scaled = [], None
        n = len(micro_batches)
        for x, y in micro_batches:
            loss = micro_loss(model, loss_fn, x, y, dtype)
            scaled = scaler.scale(loss / n)
            scaled.backward()
            losses.append(loss.detach())
        finish(model, optimizer, scaler, max_norm)
        return {
            "last": losses[-1],
            "last / n": losses[-1] / n,
            "sum": torch.stack(losses).sum(),
            "scaled": scaled.detach(),
            "none": None,
            "list": losses,
        }[what]

    step.__name__ = f"returns_{what.replace(' / ', '_over_')}"
    return step


PLACEMENT_MESSAGES = {
    "loss not divided by N": "4 times too large",
    "zero_grad inside the loop": "zeroed inside the micro-batch loop",
    "unscale_/clip/step/update inside the loop": "scaler.step() ran inside the micro-batch loop",
    "clip inside the loop (before unscale_)": "did you clip inside the loop?",
    "clip after the loop, before unscale_": "you clipped without scaler.unscale_() first",
    "unscale_ inside the loop": "scaler.unscale_() ran inside the micro-batch loop",
    "update inside the loop": "scaler.update() ran inside the micro-batch loop",
}
WRONG = {
    **{WRONG_PLACEMENTS[name]: message for name, message in PLACEMENT_MESSAGES.items()},
    no_autocast: "did not run under autocast",
    hardcoded_cuda: "autocast was on for CUDA",
    hardcoded_cpu: "but your step switched on autocast for the CPU",
    ignores_dtype: "autocast ran in float16, but accumulate_step was called with dtype=bfloat16",
    loss_outside_autocast: "a loss was computed outside autocast",
    backward_inside_autocast: "backward ran inside the autocast block",
    unscaled_backward: "backward ran on the unscaled loss",
    divided_twice: "divided by 4 twice",
    concatenated: "joined the 4 micro-batches into one batch",
    only_first_micro_batch: "called 1 time for 4 micro-batches",
    no_zero_grad: "gradients from an earlier iteration were still in .grad",
    zero_grad_at_end: "you zero them at the end of the step",
    manual_zero_inside_loop: "zeroed inside the micro-batch loop",
    zero_grad_after_loop: "zero_grad() after the last backward",
    clip_value_instead: "not clip_grad_value_",
    clips_when_none: "max_norm is None, which means no clipping",
    never_clips: "the gradients were not clipped",
    optimizer_step_directly: "you called optimizer.step() directly",
    update_twice: "scaler.update() was called 2 times",
    no_update: "scaler.update() was never called",
    update_before_step: "scaler.update() ran before scaler.step(optimizer)",
    new_scaler_inside: "created a new GradScaler",
    half_model: "parameters became float16",
    returning("last"): "the last micro-batch's loss;",
    returning("last / n"): "the last micro-batch's loss divided by N",
    returning("sum"): "the sum of the micro-batch losses",
    returning("scaled"): "returned a scaled loss",
    returning("none"): "returned None",
    returning("list"): "returned a list",
}


# ------------------------------------------------------------------------------------------------- tests


def test_accumulate_solution_passes(strict):
    result = check_accumulate_step(solution(LESSON, "accumulate_step"))
    assert result.passed, result.message


@pytest.mark.parametrize("step", CORRECT, ids=lambda f: f.__name__)
def test_accumulate_correct_styles_pass(step):
    result = check_accumulate_step(step)
    assert result.passed and result.status == PASSED, result.message


def test_accumulate_untouched_exercise_is_not_done():
    result = check_accumulate_step(exercise(LESSON, "accumulate_step"))
    assert result.status == NOT_DONE, result.message


@pytest.mark.parametrize("step", list(WRONG), ids=lambda f: f.__name__)
def test_accumulate_wrong_placement_is_named(step):
    result = check_accumulate_step(step)
    assert not result.passed, f"{step.__name__} passed"
    assert WRONG[step] in result.message, result.message


JUNK = [
    None,
    "accumulate_step",
    42,
    lambda model: None,
    lambda *a, **k: (_ for _ in ()).throw(ValueError("boom")),
    lambda *a, **k: float("nan"),
    lambda *a, **k: torch.ones(3),
    lambda *a, **k: "loss",
    lambda *a, **k: reference_accumulate_step(*a, **k) * float("nan"),
    lambda model, optimizer, scaler, loss_fn, micro_batches, **k: micro_batches.clear(),
]


@pytest.mark.parametrize("junk", JUNK, ids=range(len(JUNK)))
def test_accumulate_junk_never_raises(junk):
    result = check_accumulate_step(junk)
    assert not result.passed and result.status == "failed", result.message
    assert result.message


def test_accumulate_checker_is_fast_and_leaves_no_state():
    check_accumulate_step(reference_accumulate_step)  # warm-up
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    start = time.perf_counter()
    for step in (reference_accumulate_step, summed_then_one_backward, *WRONG_PLACEMENTS.values()):
        check_accumulate_step(step)
        assert time.perf_counter() - start < 2.0
        start = time.perf_counter()
    assert torch.equal(torch.rand(3), expected), "the check changed the learner's random stream"
    assert not torch.is_autocast_enabled("cpu")


# ---------------------------------------------- the device a step chooses, judged by what it does (issue 11)


def _accumulate_on(
    device_type, model, optimizer, scaler, loss_fn, micro_batches, dtype, max_norm, enabled=True
):
    optimizer.zero_grad()
    losses = []
    for x, y in micro_batches:
        with torch.autocast(device_type, dtype=dtype, enabled=enabled):
            loss = loss_fn(model(x), y)
        scaler.scale(loss / len(micro_batches)).backward()
        losses.append(loss.detach())
    finish(model, optimizer, scaler, max_norm)
    return torch.stack(losses).mean()


@wrong
def device_is_cuda_ternary(model, optimizer, scaler, loss_fn, micro_batches, dtype, max_norm):
    device_type = "cuda" if micro_batches[0][0].is_cuda else "cpu"
    return _accumulate_on(
        device_type,
        model,
        optimizer,
        scaler,
        loss_fn,
        micro_batches,
        dtype,
        max_norm,
        enabled=device_type in ("cpu", "cuda"),
    )


@wrong
def device_from_the_model(model, optimizer, scaler, loss_fn, micro_batches, dtype, max_norm):
    device = next(model.parameters()).device
    return _accumulate_on(device.type, model, optimizer, scaler, loss_fn, micro_batches, dtype, max_norm)


@wrong
def device_from_get_device(model, optimizer, scaler, loss_fn, micro_batches, dtype, max_norm):
    device_type = "cuda" if micro_batches[0][0].get_device() >= 0 else "cpu"
    return _accumulate_on(device_type, model, optimizer, scaler, loss_fn, micro_batches, dtype, max_norm)


@wrong
def plain_when_scaler_is_off(model, optimizer, scaler, loss_fn, micro_batches, dtype, max_norm):
    """BF16 comes with a disabled scaler: skip it altogether then (what many training scripts do)."""
    if scaler.is_enabled():
        return reference_accumulate_step(
            model, optimizer, scaler, loss_fn, micro_batches, dtype=dtype, max_norm=max_norm
        )
    optimizer.zero_grad()
    losses = [micro_loss(model, loss_fn, x, y, dtype) for x, y in micro_batches]
    torch.stack(losses).mean().backward()
    if max_norm is not None:
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    optimizer.step()
    return torch.stack(losses).mean().detach()


MORE_CORRECT = [
    device_is_cuda_ternary,
    device_from_the_model,
    device_from_get_device,
    plain_when_scaler_is_off,
]


@pytest.mark.parametrize("step", MORE_CORRECT, ids=lambda f: f.__name__)
def test_accumulate_more_correct_variants_pass(step):
    result = check_accumulate_step(step)
    assert result.status == PASSED, result.message


@wrong
def device_from_the_machine(model, optimizer, scaler, loss_fn, micro_batches, dtype, max_norm):
    device_type = "cuda" if torch.cuda.is_available() else "cpu"  # the machine, not the data
    return _accumulate_on(device_type, model, optimizer, scaler, loss_fn, micro_batches, dtype, max_norm)


@wrong
def scales_by_hand(model, optimizer, scaler, loss_fn, micro_batches, dtype, max_norm):
    optimizer.zero_grad()
    losses = []
    for x, y in micro_batches:
        loss = micro_loss(model, loss_fn, x, y, dtype)
        (loss * scaler.get_scale() / len(micro_batches)).backward()
        losses.append(loss.detach())
    finish(model, optimizer, scaler, max_norm)
    return torch.stack(losses).mean()


@wrong
def forgets_clipping_without_scaler(model, optimizer, scaler, loss_fn, micro_batches, dtype, max_norm):
    if scaler.is_enabled():
        return reference_accumulate_step(
            model, optimizer, scaler, loss_fn, micro_batches, dtype=dtype, max_norm=max_norm
        )
    optimizer.zero_grad()
    losses = [micro_loss(model, loss_fn, x, y, dtype) for x, y in micro_batches]
    torch.stack(losses).mean().backward()
    optimizer.step()  # forgot the clipping in this branch
    return torch.stack(losses).mean().detach()


@wrong
def steps_per_micro_batch_without_scaler(model, optimizer, scaler, loss_fn, micro_batches, dtype, max_norm):
    if scaler.is_enabled():
        return reference_accumulate_step(
            model, optimizer, scaler, loss_fn, micro_batches, dtype=dtype, max_norm=max_norm
        )
    optimizer.zero_grad()
    losses = []
    for x, y in micro_batches:
        loss = micro_loss(model, loss_fn, x, y, dtype)
        (loss / len(micro_batches)).backward()
        optimizer.step()
        losses.append(loss.detach())
    return torch.stack(losses).mean()


@wrong
def cpu_autocast_on_cuda_data(model, optimizer, scaler, loss_fn, micro_batches, dtype, max_norm):
    """Takes the device from the data, but switches CPU autocast on as well 'to be safe'."""
    optimizer.zero_grad()
    losses = []
    for x, y in micro_batches:
        with torch.autocast(x.device.type, dtype=dtype), torch.autocast("cpu", dtype=dtype):
            loss = loss_fn(model(x), y)
        scaler.scale(loss / len(micro_batches)).backward()
        losses.append(loss.detach())
    finish(model, optimizer, scaler, max_norm)
    return torch.stack(losses).mean()


def leaves_model_in_eval(model, optimizer, scaler, loss_fn, micro_batches, *, dtype, max_norm):
    """Correct placements, but `model.eval()` at the start: dropout and batch norm would stop training."""
    model.eval()
    return reference_accumulate_step(
        model, optimizer, scaler, loss_fn, micro_batches, dtype=dtype, max_norm=max_norm
    )


MORE_WRONG = {
    leaves_model_in_eval: "the model was in eval mode after accumulate_step returned",
    device_from_the_machine: (
        "autocast was on for CUDA"
        if torch.cuda.is_available()
        else "but your step switched on autocast for the CPU"
    ),
    scales_by_hand: "you scaled the loss by hand",
    forgets_clipping_without_scaler: "the gradients were not clipped",
    steps_per_micro_batch_without_scaler: "optimizer.step() ran inside the micro-batch loop (4 calls",
    cpu_autocast_on_cuda_data: "but your step switched on autocast for the CPU",
}


@pytest.mark.parametrize("step", list(MORE_WRONG), ids=lambda f: f.__name__)
def test_accumulate_more_wrong_steps_are_named(step):
    result = check_accumulate_step(step)
    assert result.status == "failed", result.message
    assert MORE_WRONG[step] in result.message, result.message


def test_accumulate_device_is_judged_by_behaviour_not_source():
    """A literal "cpu"/"cuda" in a correct step is fine; the message for a hard-coded one says what it did."""
    assert check_accumulate_step(device_is_cuda_ternary).passed
    message = check_accumulate_step(hardcoded_cpu).message
    assert "on a CUDA device" in message and "switched on autocast for the CPU" in message
    assert "hard-code" not in message and not hasattr(l08, "hardcoded_device")


def test_accumulate_bf16_scenarios_use_a_disabled_scaler():
    """BF16 needs no loss scaling: BF16 steps get a disabled GradScaler, FP16 steps an enabled one."""
    assert {s.dtype for s in SCENARIOS} == {torch.float16, torch.bfloat16}
    for scenario in SCENARIOS:
        assert scenario.scaler_enabled == (scenario.dtype == torch.float16), scenario.title
    assert any(s.cuda_labelled for s in SCENARIOS)


def _first_rule(step):
    try:
        for seen in step_rules.observations(l08.ACCUMULATE_STEP, step):
            rule = first_mistake(l08.ACCUMULATE_STEP_RULES, seen)
            if rule is not None:
                return seen, rule
    finally:
        switch_autocast_off()
    raise AssertionError(f"no rule names a mistake in {step}")


@pytest.mark.parametrize(
    "step, name",
    [
        (hardcoded_cpu, "CPU autocast on CUDA data"),
        (scales_by_hand, "loss scaled by hand"),
        (steps_per_micro_batch_without_scaler, "step inside the loop"),
        (leaves_model_in_eval, "model left in eval mode"),
    ],
)
def test_accumulate_new_rules_recognise_their_case(step, name):
    with torch.random.fork_rng(devices=[]), one_cpu_thread():
        seen, rule = _first_rule(step)
    assert rule.name == name, rule.text(seen)
    assert rule.text(seen).startswith(seen.where)


# ------------------------------------------------------------- a class's answers, checked by hand first


def running_total_of_loss_over_k(model, optimizer, scaler, loss_fn, micro_batches, *, dtype, max_norm):
    k = len(micro_batches)
    optimizer.zero_grad(set_to_none=True)
    total = torch.zeros(())
    for inputs, targets in micro_batches:
        with torch.autocast(device_type=inputs.device.type, dtype=dtype):
            loss = loss_fn(model(inputs), targets) / k
        scaler.scale(loss).backward()
        total += loss.detach().float()  # a running total of loss / k is the batch mean
    if max_norm is not None:
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    scaler.step(optimizer)
    scaler.update()
    return total


def items_in_a_list_averaged(model, optimizer, scaler, loss_fn, micro_batches, *, dtype, max_norm):
    optimizer.zero_grad()
    values = []
    for inputs, targets in micro_batches:
        with torch.autocast(device_type=inputs.device.type, dtype=dtype):
            loss = loss_fn(model(inputs), targets)
        scaler.scale(loss / len(micro_batches)).backward()
        values.append(loss.item())
    if max_norm is not None:
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    scaler.step(optimizer)
    scaler.update()
    return sum(values) / len(values)


def update_inside_the_loop(model, optimizer, scaler, loss_fn, micro_batches, *, dtype, max_norm):
    optimizer.zero_grad()
    values = []
    for inputs, targets in micro_batches:
        with torch.autocast(device_type=inputs.device.type, dtype=dtype):
            loss = loss_fn(model(inputs), targets)
        scaler.scale(loss / len(micro_batches)).backward()
        scaler.update()  # "keep the scale current for every micro-batch"
        values.append(loss.item())
    if max_norm is not None:
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    scaler.step(optimizer)
    return sum(values) / len(values)


@pytest.mark.parametrize(
    "step", [running_total_of_loss_over_k, items_in_a_list_averaged], ids=lambda f: f.__name__
)
def test_accumulate_class_answers_pass(step):
    result = check_accumulate_step(step)
    assert result.passed, result.message


def test_accumulate_update_inside_the_loop_is_named():
    result = check_accumulate_step(update_inside_the_loop)
    assert not result.passed and result.status == "failed"
    assert "scaler.update() ran inside the micro-batch loop" in result.message, result.message


def test_the_shared_rules_are_worded_and_recognised_as_shared():
    """Every step rule 08.1 shares with 03.1 is in the table with the shared recogniser, in this exercise's words."""
    table = {rule.name: rule for rule in l08.ACCUMULATE_STEP_RULES}
    for shared in step_rules.SHARED_RULES:
        assert table[shared.name].recognise is shared.recognise, shared.name
    assert all(rule.message is not step_rules.own_words for rule in l08.ACCUMULATE_STEP_RULES)
    assert len(table) == len(l08.ACCUMULATE_STEP_RULES)  # one rule per name


# ----------------------------------- issue 19: a step taken at i % k == 0, and gradients unscaled twice


def step_at_i_mod_k(model, optimizer, scaler, loss_fn, micro_batches, *, dtype, max_norm):
    k = len(micro_batches)
    optimizer.zero_grad()
    losses = []
    for i, (inputs, targets) in enumerate(micro_batches):
        with torch.autocast(inputs.device.type, dtype=dtype):
            loss = loss_fn(model(inputs), targets)
        scaler.scale(loss / k).backward()
        losses.append(loss.detach())
        if i % k == 0:  # meant "after the k-th", true at i = 0
            if max_norm is not None:
                scaler.unscale_(optimizer)
                torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
            scaler.step(optimizer)
            scaler.update()
    return torch.stack(losses).mean()


def unscale_by_hand_after_the_loop(model, optimizer, scaler, loss_fn, micro_batches, *, dtype, max_norm):
    optimizer.zero_grad()
    losses = []
    for inputs, targets in micro_batches:
        with torch.autocast(inputs.device.type, dtype=dtype):
            loss = loss_fn(model(inputs), targets)
        scaler.scale(loss / len(micro_batches)).backward()
        losses.append(loss.detach())
    for p in model.parameters():
        p.grad.div_(scaler.get_scale())
    if max_norm is not None:
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    scaler.step(optimizer)
    scaler.update()
    return torch.stack(losses).mean()


def test_a_step_at_i_mod_k_is_told_once_not_k_times():
    result = check_accumulate_step(step_at_i_mod_k)
    assert result.status == "failed", result.message
    assert (
        "once right after micro-batch 1 of 4" in result.message
        and "4 small optimizer steps" not in result.message
    )


def test_gradients_unscaled_twice_in_an_accumulated_step_are_named():
    result = check_accumulate_step(unscale_by_hand_after_the_loop)
    assert result.status == "failed" and "divided by the loss scale twice" in result.message, result.message


# ----------------------------------- issue 19, the class round: correct steps written otherwise, more slips


def class_divides_grad_after(model, optimizer, scaler, loss_fn, micro_batches, *, dtype, max_norm):
    for p in model.parameters():
        p.grad = None
    total, k = 0.0, len(micro_batches)
    for x, y in micro_batches:
        with torch.amp.autocast(device_type=x.device.type, dtype=dtype):
            loss = loss_fn(model(x), y)
        scaler.scale(loss).backward()  # summed ...
        total += loss.item()
    for p in model.parameters():
        if p.grad is not None:
            p.grad.div_(k)  # ... then divided once: the same gradient as loss / k per micro-batch
    if max_norm is not None:
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    scaler.step(optimizer)
    scaler.update()
    return torch.tensor(total / k)


def class_one_backward_of_the_mean(model, optimizer, scaler, loss_fn, micro_batches, *, dtype, max_norm):
    optimizer.zero_grad()
    losses = []
    for x, y in micro_batches:
        with torch.autocast(x.device.type, dtype=dtype):
            losses.append(loss_fn(model(x), y))
    loss = torch.stack([value.float() for value in losses]).mean()
    scaler.scale(loss).backward()
    if max_norm:
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    scaler.step(optimizer)
    scaler.update()
    return loss.detach()


def class_step_on_the_last(model, optimizer, scaler, loss_fn, micro_batches, *, dtype, max_norm):
    optimizer.zero_grad(set_to_none=True)
    k, running = len(micro_batches), 0
    for i, (x, y) in enumerate(micro_batches):
        with torch.autocast(device_type=x.device.type, dtype=dtype):
            loss = loss_fn(model(x), y) / k
        scaler.scale(loss).backward()
        running = running + loss.detach()
        if (i + 1) % k == 0:
            if max_norm is not None:
                scaler.unscale_(optimizer)
                torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
            scaler.step(optimizer)
            scaler.update()
    return running


@pytest.mark.parametrize(
    "step",
    [class_divides_grad_after, class_one_backward_of_the_mean, class_step_on_the_last],
    ids=lambda f: f.__name__,
)
def test_class_round_correct_steps_pass(step):
    result = check_accumulate_step(step)
    assert result.status == PASSED, result.message


def class_loss_and_grad_divided(model, optimizer, scaler, loss_fn, micro_batches, *, dtype, max_norm):
    optimizer.zero_grad()
    k, losses = len(micro_batches), []
    for x, y in micro_batches:
        with torch.autocast(x.device.type, dtype=dtype):
            loss = loss_fn(model(x), y)
        scaler.scale(loss / k).backward()
        losses.append(loss.detach())
    for p in model.parameters():
        p.grad.div_(k)  # divided a second time
    scaler.step(optimizer)
    scaler.update()
    return torch.stack(losses).mean()


def test_class_round_gradients_divided_twice_are_named():
    result = check_accumulate_step(class_loss_and_grad_divided)
    assert result.status == "failed" and "a second time, after the loop" in result.message, result.message
