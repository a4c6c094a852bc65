"""Lesson 09 checker: the solution and other correct hand-synced steps pass on 2 real gloo processes, the
untouched exercise is "not done yet", every known wrong step is rejected with the message that names its
mistake, collectives that not every rank calls end in a named failure (never a hang), and junk never
raises."""

import time

import pytest
import torch
import torch.distributed as dist
from notebook_code import exercise, solution

from amp_lessons.checks.harness import NOT_DONE, PASSED
from amp_lessons.checks.mistakes import first_mistake
from amp_lessons.l09_amp_across_processes import check as l09
from amp_lessons.l09_amp_across_processes.check import check_synced_train_step

LESSON = "09_amp_across_processes.ipynb"


# ------------------------------------------------------------------------------------ correct variants


def flat_buffer(model, optimizer, scaler, loss_fn, inputs, targets, *, dtype, max_norm):
    from torch.nn.utils import clip_grad_norm_

    for p in model.parameters():
        p.grad = None
    with torch.autocast("cpu", dtype=dtype):
        loss = loss_fn(model(inputs), targets)
    scaler.scale(loss).backward()
    params = [p for p in model.parameters() if p.grad is not None]
    flat = torch.cat([p.grad.reshape(-1) for p in params])
    dist.all_reduce(flat)  # one collective for all gradients, as DDP's buckets do
    flat.div_(dist.get_world_size())
    offset = 0
    for p in params:
        p.grad.copy_(flat[offset : offset + p.numel()].view_as(p.grad))
        offset += p.numel()
    scaler.unscale_(optimizer)  # unconditionally: harmless without clipping
    if max_norm:
        clip_grad_norm_(params, max_norm)
    scaler.step(optimizer)
    scaler.update()
    losses = [torch.zeros(1) for _ in range(dist.get_world_size())]
    dist.all_gather(losses, loss.detach().float().reshape(1))
    return torch.cat(losses).mean().item()


def loss_divided_async(model, optimizer, scaler, loss_fn, inputs, targets, *, dtype, max_norm):
    world = dist.get_world_size()
    optimizer.zero_grad()
    with torch.autocast(inputs.device.type, dtype=dtype):
        loss = loss_fn(model(inputs), targets)
    scaler.scale(loss / world).backward()  # divide the loss instead of the gradients
    handles = [dist.all_reduce(p.grad, async_op=True) for p in model.parameters()]
    for handle in handles:
        handle.wait()
    if max_norm is not None:
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    scaler.step(optimizer)
    scaler.update()
    total = loss.detach() / world
    dist.all_reduce(total)
    return total


def avg_op(model, optimizer, scaler, loss_fn, inputs, targets, *, dtype, max_norm):
    optimizer.zero_grad()
    with torch.autocast(inputs.device.type, dtype=dtype):
        loss = loss_fn(model(inputs), targets)
    scaler.scale(loss).backward()
    for p in model.parameters():
        dist.all_reduce(p.grad, op=dist.ReduceOp.AVG)
    if max_norm is not None:
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    scaler.step(optimizer)
    scaler.update()
    value = loss.detach().clone()
    dist.all_reduce(value, op=dist.ReduceOp.AVG)
    return float(value)


def gloo_supports_avg() -> bool:
    from amp_lessons.l09_amp_across_processes.distributed import run_ranks

    def task(rank, world):
        value = torch.ones(1)
        dist.all_reduce(value, op=dist.ReduceOp.AVG)
        return float(value)

    return run_ranks(task).ok


# -------------------------------------------------------------------------------------- wrong variants


def _step(
    model,
    optimizer,
    scaler,
    loss_fn,
    inputs,
    targets,
    dtype,
    max_norm,
    *,
    combine,
    order="reduce_first",
    loss_mode="mean",
):
    world = dist.get_world_size()
    optimizer.zero_grad(set_to_none=True)
    with torch.autocast(inputs.device.type, dtype=dtype):
        loss = loss_fn(model(inputs), targets)
    scaler.scale(loss).backward()
    if order == "unscale_first":
        scaler.unscale_(optimizer)
        combine(model)
        if max_norm is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    elif order == "clip_first":
        if max_norm is not None:
            scaler.unscale_(optimizer)
            torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
        combine(model)
    else:
        combine(model)
        if max_norm is not None:
            scaler.unscale_(optimizer)
            torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    scaler.step(optimizer)
    scaler.update()
    value = loss.detach().clone()
    if loss_mode == "local":
        return value
    dist.all_reduce(value)
    return value if loss_mode == "sum" else value / world


def average(model):
    for p in model.parameters():
        dist.all_reduce(p.grad)
        p.grad /= dist.get_world_size()


def no_combine(model, optimizer, scaler, loss_fn, inputs, targets, *, dtype, max_norm):
    return _step(model, optimizer, scaler, loss_fn, inputs, targets, dtype, max_norm, combine=lambda m: None)


def summed(model, optimizer, scaler, loss_fn, inputs, targets, *, dtype, max_norm):
    def combine(m):
        for p in m.parameters():
            dist.all_reduce(p.grad)

    return _step(model, optimizer, scaler, loss_fn, inputs, targets, dtype, max_norm, combine=combine)


def averaged_twice(model, optimizer, scaler, loss_fn, inputs, targets, *, dtype, max_norm):
    def combine(m):
        for p in m.parameters():
            dist.all_reduce(p.grad)
            p.grad /= dist.get_world_size() ** 2

    return _step(model, optimizer, scaler, loss_fn, inputs, targets, dtype, max_norm, combine=combine)


def broadcast_from_rank0(model, optimizer, scaler, loss_fn, inputs, targets, *, dtype, max_norm):
    def combine(m):
        for p in m.parameters():
            dist.broadcast(p.grad, src=0)

    return _step(model, optimizer, scaler, loss_fn, inputs, targets, dtype, max_norm, combine=combine)


def unscale_before_all_reduce(model, optimizer, scaler, loss_fn, inputs, targets, *, dtype, max_norm):
    return _step(
        model,
        optimizer,
        scaler,
        loss_fn,
        inputs,
        targets,
        dtype,
        max_norm,
        combine=average,
        order="unscale_first",
    )


def clip_before_all_reduce(model, optimizer, scaler, loss_fn, inputs, targets, *, dtype, max_norm):
    return _step(
        model,
        optimizer,
        scaler,
        loss_fn,
        inputs,
        targets,
        dtype,
        max_norm,
        combine=average,
        order="clip_first",
    )


def returns_own_loss(model, optimizer, scaler, loss_fn, inputs, targets, *, dtype, max_norm):
    return _step(
        model,
        optimizer,
        scaler,
        loss_fn,
        inputs,
        targets,
        dtype,
        max_norm,
        combine=average,
        loss_mode="local",
    )


def returns_summed_loss(model, optimizer, scaler, loss_fn, inputs, targets, *, dtype, max_norm):
    return _step(
        model, optimizer, scaler, loss_fn, inputs, targets, dtype, max_norm, combine=average, loss_mode="sum"
    )


def replaces_inf(model, optimizer, scaler, loss_fn, inputs, targets, *, dtype, max_norm):
    def combine(m):
        for p in m.parameters():
            p.grad = torch.nan_to_num(p.grad, nan=0.0, posinf=0.0, neginf=0.0)
        average(m)

    return _step(model, optimizer, scaler, loss_fn, inputs, targets, dtype, max_norm, combine=combine)


def no_zero_grad(model, optimizer, scaler, loss_fn, inputs, targets, *, dtype, max_norm):
    with torch.autocast(inputs.device.type, dtype=dtype):
        loss = loss_fn(model(inputs), targets)
    scaler.scale(loss).backward()
    average(model)
    scaler.step(optimizer)
    scaler.update()
    value = loss.detach().clone()
    dist.all_reduce(value)
    return value / dist.get_world_size()


def collective_on_rank0_only(model, optimizer, scaler, loss_fn, inputs, targets, *, dtype, max_norm):
    def combine(m):
        if dist.get_rank() == 0:
            average(m)

    return _step(model, optimizer, scaler, loss_fn, inputs, targets, dtype, max_norm, combine=combine)


def only_rank0_steps(model, optimizer, scaler, loss_fn, inputs, targets, *, dtype, max_norm):
    world = dist.get_world_size()
    optimizer.zero_grad()
    with torch.autocast(inputs.device.type, dtype=dtype):
        loss = loss_fn(model(inputs), targets)
    scaler.scale(loss).backward()
    average(model)
    if dist.get_rank() == 0:  # "rank 0 owns the optimizer"
        scaler.step(optimizer)
        scaler.update()
    value = loss.detach().clone()
    dist.all_reduce(value)
    return value / world


def returns_scaled_loss(model, optimizer, scaler, loss_fn, inputs, targets, *, dtype, max_norm):
    optimizer.zero_grad()
    with torch.autocast(inputs.device.type, dtype=dtype):
        loss = loss_fn(model(inputs), targets)
    scaled = scaler.scale(loss)
    scaled.backward()
    average(model)
    if max_norm is not None:
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    scaler.step(optimizer)
    scaler.update()
    value = scaled.detach().clone()
    dist.all_reduce(value)
    return value / dist.get_world_size()


# (function, rule name, words the message must contain)
WRONG = [
    (only_rank0_steps, "weights never updated", "rank 1 never changed its weights"),
    (returns_scaled_loss, "returned the scaled loss", "is the *scaled* loss"),
    (no_combine, "gradients never combined", "drift apart from the first step"),
    (
        unscale_before_all_reduce,
        "skip decision made on one rank's gradients",
        "Different skip decisions at step 2",
    ),
    (summed, "summed, not averaged", "2x too large"),
    (averaged_twice, "averaged twice", "divided by the world size twice"),
    (broadcast_from_rank0, "only rank 0's gradients", "rank 0's gradients only"),
    (clip_before_all_reduce, "clipped each rank's own gradients", "each rank clipped its *own* gradients"),
    (replaces_inf, "overflow not skipped", "no rank skipped the step"),
    (no_zero_grad, "wrong update", "Compare your order with lesson 03's train_step"),
    (returns_own_loss, "returned its own rank's loss", "each rank returned the loss of its own slice"),
    (returns_summed_loss, "returned the summed loss", "is the sum over ranks"),
]


# ----------------------------------------------------------------------------------------------- tests


def test_solution_passes():
    result = check_synced_train_step(solution(LESSON, "synced_train_step"))
    assert result.passed, result.message
    assert "both ranks skipped" in result.message
    assert any("step 2 (spike on rank 1)" in line for line in result.details)


def test_solution_passes_in_strict_mode(strict):
    assert check_synced_train_step(solution(LESSON, "synced_train_step")).passed


def test_untouched_exercise_is_not_done():
    result = check_synced_train_step(exercise(LESSON, "synced_train_step"))
    assert result.status == NOT_DONE
    assert "NotImplementedError" in result.message


@pytest.mark.parametrize("fn", [flat_buffer, loss_divided_async], ids=lambda f: f.__name__)
def test_correct_variants_written_differently_pass(fn):
    result = check_synced_train_step(fn)
    assert result.status == PASSED, result.message


def test_reduce_op_avg_passes_where_gloo_has_it():
    if not gloo_supports_avg():
        pytest.skip("this torch's gloo has no ReduceOp.AVG")
    result = check_synced_train_step(avg_op)
    assert result.passed, result.message


@pytest.mark.parametrize("fn,rule,words", WRONG, ids=[w[0].__name__ for w in WRONG])
def test_wrong_steps_are_named(fn, rule, words):
    result = check_synced_train_step(fn)
    assert not result.passed
    assert words in result.message, result.message
    assert result.details  # the per-step table of what each rank did


@pytest.mark.parametrize("fn,rule,words", WRONG, ids=[w[0].__name__ for w in WRONG])
def test_each_rule_recognises_its_mistake(fn, rule, words):
    """The diagnosis comes from the named rule in the tables (observations first, then replays)."""
    dtype = l09._dtype()
    result = l09.run_the_ranks(fn, dtype)
    seen = l09._seen(result, dtype)
    found = [first_mistake(rules, seen) for rules in (l09.RANK_RULES, l09.TRAJECTORY_RULES, l09.LOSS_RULES)]
    assert next(m.name for m in found if m is not None) == rule


def test_every_rule_has_a_wrong_answer_that_triggers_it():
    names = {rule.name for rules in (l09.RANK_RULES, l09.TRAJECTORY_RULES, l09.LOSS_RULES) for rule in rules}
    assert names - {rule for _, rule, _ in WRONG} == {"ranks disagree"}  # the generic fallback
    assert len({rule for _, rule, _ in WRONG}) >= 5


def test_right_replay_is_what_the_solution_does():
    """The replay the check trusts matches the real 2-process run of the solution exactly."""
    dtype = l09._dtype()
    result = l09.run_the_ranks(solution(LESSON, "synced_train_step"), dtype)
    seen = l09._seen(result, dtype)
    assert seen.like("mean") and not seen.like("sum") and not seen.like("local_clip")
    assert seen.skipped(0, l09.SPIKE_STEP) and seen.skipped(1, l09.SPIKE_STEP)


def test_collective_on_one_rank_only_fails_fast_with_a_named_message():
    started = time.perf_counter()
    result = check_synced_train_step(collective_on_rank0_only)
    assert not result.passed
    assert "did not run the same collectives" in result.message
    assert time.perf_counter() - started < 15


def test_a_rank_that_never_joins_is_stopped(monkeypatch):
    monkeypatch.setattr(l09, "TASK_TIMEOUT_S", 2.0)
    monkeypatch.setattr(l09, "COLLECTIVE_TIMEOUT_S", 1.0)

    def one_rank_sleeps(model, optimizer, scaler, loss_fn, inputs, targets, *, dtype, max_norm):
        import time as clock

        if dist.get_rank() == 1:
            clock.sleep(60)
        return returns_summed_loss(
            model, optimizer, scaler, loss_fn, inputs, targets, dtype=dtype, max_norm=max_norm
        )

    started = time.perf_counter()
    result = check_synced_train_step(one_rank_sleeps)
    assert not result.passed
    assert "rank 1 was still running when the check stopped it" in result.message
    assert time.perf_counter() - started < 10


def wrong_signature(model, optimizer, scaler):
    return 0.0


def raises(model, optimizer, scaler, loss_fn, inputs, targets, *, dtype, max_norm):
    return 1 / 0


def returns_none(model, optimizer, scaler, loss_fn, inputs, targets, *, dtype, max_norm):
    flat_buffer(model, optimizer, scaler, loss_fn, inputs, targets, dtype=dtype, max_norm=max_norm)


def returns_vector(model, optimizer, scaler, loss_fn, inputs, targets, *, dtype, max_norm):
    flat_buffer(model, optimizer, scaler, loss_fn, inputs, targets, dtype=dtype, max_norm=max_norm)
    return torch.ones(3)


@pytest.mark.parametrize(
    "junk,words",
    [
        (None, "got None"),
        (42, "got a int"),
        ("synced_train_step", "got a str"),
        (wrong_signature, "cannot be called the way the exercise describes"),
        (raises, "ZeroDivisionError"),
        (returns_none, "returned a NoneType"),
        (returns_vector, "a tensor with 3 elements"),
    ],
    ids=["none", "int", "str", "signature", "raises", "returns_none", "returns_vector"],
)
def test_junk_never_raises(junk, words):
    result = check_synced_train_step(junk)
    assert not result.passed
    assert words in result.message, result.message


def test_the_check_is_quick():
    fn = solution(LESSON, "synced_train_step")
    check_synced_train_step(fn)  # warm: the first check in a process builds its replay
    started = time.perf_counter()
    assert check_synced_train_step(fn).passed
    assert time.perf_counter() - started < 3.0


# ------------------------------------------------ a class's answers: right in other styles, natural mistakes


def full_names_and_item(model, optimizer, scaler, loss_fn, inputs, targets, *, dtype, max_norm):
    import torch.distributed

    optimizer.zero_grad()
    with torch.autocast(device_type=inputs.device.type, dtype=dtype):
        loss = loss_fn(model(inputs), targets)
    scaler.scale(loss).backward()
    world = torch.distributed.get_world_size()
    with torch.no_grad():
        for _name, p in model.named_parameters():
            torch.distributed.all_reduce(p.grad, op=torch.distributed.ReduceOp.SUM)
            p.grad.div_(world)
    if max_norm is not None:
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    scaler.step(optimizer)
    scaler.update()
    total = torch.tensor([loss.item()])
    torch.distributed.all_reduce(total)
    print(f"[rank {torch.distributed.get_rank()}] loss {total.item() / world:.4f}")
    return total.item() / world


def flatten_dense_tensors(model, optimizer, scaler, loss_fn, inputs, targets, *, dtype, max_norm):
    from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

    optimizer.zero_grad()
    with torch.autocast(device_type=inputs.device.type, dtype=dtype):
        loss = loss_fn(model(inputs), targets)
    scaler.scale(loss).backward()
    grads = [p.grad for p in model.parameters()]
    flat = _flatten_dense_tensors(grads)
    dist.all_reduce(flat)
    flat /= dist.get_world_size()
    for grad, synced in zip(grads, _unflatten_dense_tensors(flat, grads)):
        grad.copy_(synced)
    scaler.unscale_(optimizer)
    if max_norm:
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=max_norm)
    scaler.step(optimizer)
    scaler.update()
    out = loss.detach().float()
    dist.all_reduce(out)
    return out / dist.get_world_size()


def divide_first_then_gather_objects(model, optimizer, scaler, loss_fn, inputs, targets, *, dtype, max_norm):
    world = dist.get_world_size()
    optimizer.zero_grad(set_to_none=False)
    with torch.autocast(device_type="cpu", dtype=dtype):
        outputs = model(inputs)
    loss = loss_fn(outputs.float(), targets)  # the loss in FP32, outside autocast
    scaler.scale(loss).backward()
    for p in model.parameters():
        p.grad.data.div_(world)  # divide first, then sum
        dist.all_reduce(p.grad.data, op=dist.ReduceOp.SUM)
    dist.barrier()
    if max_norm is not None:
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    scaler.step(optimizer)
    scaler.update()
    losses = [None] * world
    dist.all_gather_object(losses, loss.item())
    return sum(losses) / len(losses)


@pytest.mark.parametrize(
    "fn",
    [full_names_and_item, flatten_dense_tensors, divide_first_then_gather_objects],
    ids=lambda f: f.__name__,
)
def test_class_answers_written_differently_pass(fn):
    result = check_synced_train_step(fn)
    assert result.status == PASSED, result.message


def _class_step(model, optimizer, scaler, loss_fn, inputs, targets, dtype, max_norm, combine):
    optimizer.zero_grad()
    with torch.autocast(device_type="cpu", dtype=dtype):
        loss = loss_fn(model(inputs), targets)
    scaler.scale(loss).backward()
    combine(model)
    if max_norm is not None:
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    scaler.step(optimizer)
    scaler.update()
    value = loss.detach().clone()
    dist.all_reduce(value)
    return value / dist.get_world_size()


def division_discarded(model, optimizer, scaler, loss_fn, inputs, targets, *, dtype, max_norm):
    def combine(m):
        for p in m.parameters():
            dist.all_reduce(p.grad)
            p.grad / dist.get_world_size()  # the result is thrown away

    return _class_step(model, optimizer, scaler, loss_fn, inputs, targets, dtype, max_norm, combine)


def reduces_a_copy(model, optimizer, scaler, loss_fn, inputs, targets, *, dtype, max_norm):
    def combine(m):
        for p in m.parameters():
            grad = p.grad.clone()
            dist.all_reduce(grad)  # p.grad itself never changes
            grad /= dist.get_world_size()

    return _class_step(model, optimizer, scaler, loss_fn, inputs, targets, dtype, max_norm, combine)


def averages_weights_after_the_step(model, optimizer, scaler, loss_fn, inputs, targets, *, dtype, max_norm):
    value = _class_step(model, optimizer, scaler, loss_fn, inputs, targets, dtype, max_norm, lambda m: None)
    with torch.no_grad():
        for p in model.parameters():
            dist.all_reduce(p.data)
            p.data /= dist.get_world_size()
    return value


@pytest.mark.parametrize(
    "fn, words",
    [
        (division_discarded, "2x too large"),
        (reduces_a_copy, "drift apart from the first step"),
        (averages_weights_after_the_step, "Different skip decisions at step 2"),
    ],
    ids=["division_discarded", "reduces_a_copy", "averages_weights_after_the_step"],
)
def test_class_mistakes_are_named(fn, words):
    result = check_synced_train_step(fn)
    assert not result.passed and words in result.message, result.message


# ----------------------------------- issue 19: gloo's words in whole sentences, and where a rank only noticed


def test_gloo_words_are_whole_sentences():
    from types import SimpleNamespace

    output = (
        "terminate called after throwing an instance of 'gloo::EnforceNotMet'\n  what():  [enforce fail at "
        "/x/gloo/transport/tcp/pair.cc:464] op.preamble.length <= op.nbytes. 96 vs 4. Received data size "
        "doesn't match expected size. Is there a distributed collective mismatch in your code?"
    )
    outcome = SimpleNamespace(
        output=output, error="the process ended without an answer (killed by signal SIGABRT)"
    )
    words = l09._gloo_words(outcome)
    assert words.startswith("gloo: 'Received data size doesn't match expected size.'")
    assert words.endswith("(killed by signal SIGABRT)")


def test_a_collective_mismatch_says_where_a_rank_noticed_not_where_it_went_wrong():
    result = check_synced_train_step(collective_on_rank0_only)
    assert "did not run the same collectives" in result.message
    assert "out an answer" not in result.message.replace("without an answer", "")
    assert "matched by their order, not their line" in result.message
