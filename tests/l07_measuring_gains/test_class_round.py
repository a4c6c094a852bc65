"""Lesson 07, a class round (issue 19): right answers written unlike the solution, and natural wrong answers
the other tests do not cover, each named by its own mistake.

What the round found (fixed in check.py). 07.1: times divided by repeats were told "Your clock stopped before
the device finished"; ``round(t, 3)`` passed (every scenario cost whole milliseconds); clock readings instead
of durations, sync() before the step (each time is the previous call's) and sorted times got only "match
nothing known"; a generator (``yield``) was asked "Did you forget `return times`?". 07.2: an answer that
creates ``saved_tensors_hooks(...)`` without ``with``, one that counts in unpack, and one that reads
``torch.cuda.memory_allocated`` were all told they ran under no_grad; autocast hard-coded to float16 (or
bfloat16) passed, since both take 2 bytes.
"""

import collections
import contextlib
import itertools
import sys
import time

import numpy as np
import pytest
import torch

from amp_lessons.l07_measuring_gains.check import check_saved_activation_bytes, check_time_step

# ------------------------------------------------------------------------------------------------ 07.1 right


def with_a_comprehension(step_fn, *, warmup, repeats, sync, clock=time.perf_counter):
    def once():
        start = clock()
        step_fn()
        sync()
        return clock() - start

    collections.deque((step_fn() for _ in range(warmup)), maxlen=0)
    sync()
    return [once() for _ in range(repeats)]


def with_shared_clock_stamps(step_fn, *, warmup, repeats, sync, clock=time.perf_counter):
    """One clock reading per boundary; the durations are the differences (a NumPy array)."""
    for _ in itertools.repeat(None, warmup):
        step_fn()
    sync()
    stamps = [clock()]
    for _ in range(repeats):
        step_fn()
        sync()
        stamps.append(clock())
    return np.diff(stamps)


def with_starts_and_ends_as_a_tuple(step_fn, *, warmup, repeats, sync, clock=time.perf_counter):
    """A while loop for the warm-up, sync() only when there was one; a tuple comes back."""
    i = 0
    while i < warmup:
        step_fn()
        i += 1
    if warmup:
        sync()
    starts, ends = [], []
    for _ in range(repeats):
        starts.append(clock())
        step_fn()
        sync()
        ends.append(clock())
    return tuple(e - s for s, e in zip(starts, ends))


def timing_everything_then_slicing(step_fn, *, warmup, repeats, sync, clock=time.perf_counter):
    times = []
    for _ in range(warmup + repeats):
        start = clock()
        step_fn()
        sync()
        times.append(clock() - start)
    return times[warmup:]


def with_try_finally(step_fn, *, warmup, repeats, sync, clock=time.perf_counter):
    for _ in range(warmup):
        step_fn()
    sync()
    times = []
    for _ in range(repeats):
        start = clock()
        try:
            step_fn()
        finally:
            sync()
            times.append(clock() - start)
    return times


@pytest.mark.parametrize(
    "answer",
    [
        with_a_comprehension,
        with_shared_clock_stamps,
        with_starts_and_ends_as_a_tuple,
        timing_everything_then_slicing,
        with_try_finally,
    ],
    ids=lambda f: f.__name__,
)
def test_class_round_time_step_right_answers_pass(answer):
    result = check_time_step(answer)
    assert result.passed, result.message


# ------------------------------------------------------------------------------------------------ 07.1 wrong


def _timed(step_fn, warmup, repeats, sync, each):
    for _ in range(warmup):
        step_fn()
    sync()
    return [each() for _ in range(repeats)]


def divided_by_repeats(step_fn, *, warmup, repeats, sync, clock=time.perf_counter):
    def each():
        start = clock()
        step_fn()
        sync()
        return (clock() - start) / repeats

    return _timed(step_fn, warmup, repeats, sync, each)


def appends_the_clock(step_fn, *, warmup, repeats, sync, clock=time.perf_counter):
    def each():
        step_fn()
        sync()
        return clock()

    return _timed(step_fn, warmup, repeats, sync, each)


def yields_the_times(step_fn, *, warmup, repeats, sync, clock=time.perf_counter):
    for _ in range(warmup):
        step_fn()
    sync()
    for _ in range(repeats):
        start = clock()
        step_fn()
        sync()
        yield clock() - start


def _right_times(step_fn, warmup, repeats, sync, clock):
    def each():
        start = clock()
        step_fn()
        sync()
        return clock() - start

    return _timed(step_fn, warmup, repeats, sync, each)


def sorted_times(step_fn, *, warmup, repeats, sync, clock=time.perf_counter):
    return sorted(_right_times(step_fn, warmup, repeats, sync, clock))


def rounded_to_milliseconds(step_fn, *, warmup, repeats, sync, clock=time.perf_counter):
    return [round(t, 3) for t in _right_times(step_fn, warmup, repeats, sync, clock)]


def whole_milliseconds(step_fn, *, warmup, repeats, sync, clock=time.perf_counter):
    return [int(t * 1000) for t in _right_times(step_fn, warmup, repeats, sync, clock)]


def sync_before_the_step(step_fn, *, warmup, repeats, sync, clock=time.perf_counter):
    def each():
        start = clock()
        sync()
        step_fn()
        return clock() - start

    return _timed(step_fn, warmup, repeats, sync, each)


def perf_counter_ns(step_fn, *, warmup, repeats, sync, clock=time.perf_counter):
    def each():
        start = time.perf_counter_ns()
        step_fn()
        sync()
        return (time.perf_counter_ns() - start) / 1e9

    return _timed(step_fn, warmup, repeats, sync, each)


def one_warmup_call(step_fn, *, warmup, repeats, sync, clock=time.perf_counter):
    if warmup:
        step_fn()
    sync()
    return _right_times(step_fn, 0, repeats, sync, clock)


def mixed_clocks(step_fn, *, warmup, repeats, sync, clock=time.perf_counter):
    def each():
        start = clock()
        step_fn()
        sync()
        return time.perf_counter() - start

    return _timed(step_fn, warmup, repeats, sync, each)


@pytest.mark.parametrize(
    "wrong, words",
    [
        (divided_by_repeats, "you divided each call's time by repeats=6"),
        (appends_the_clock, "Your entries are clock READINGS"),
        (yields_the_times, "a function with `yield` in it gives back a generator"),
        (sorted_times, "not in call order"),
        (rounded_to_milliseconds, "You rounded the times to 3 decimals"),
        (whole_milliseconds, "Your numbers are milliseconds"),
        (sync_before_the_step, "Each of your times is the PREVIOUS call's"),
        (perf_counter_ns, "You never called `clock()`"),
        (one_warmup_call, "warm-up + repeats = 3 + 6 = 9"),
        (mixed_clocks, "Your times do not match what each call really took"),
    ],
    ids=lambda v: getattr(v, "__name__", ""),
)
def test_class_round_time_step_wrong_answers_are_named(wrong, words):
    result = check_time_step(wrong)
    assert result.status == "failed", result.message
    assert words in result.message, result.message
    assert "Your clock stopped" not in result.message


# ------------------------------------------------------------------------------------------------ 07.2 right


def _autocast_or_nothing(inputs, dtype):
    return torch.autocast(inputs.device.type, dtype=dtype) if dtype is not None else contextlib.nullcontext()


def with_nullcontext_and_nbytes(model, loss_fn, inputs, targets, *, dtype):
    seen = {}

    def pack(t):
        seen.setdefault((t.data_ptr(), t.dtype, t.shape, t.stride()), t.nbytes)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), _autocast_or_nothing(inputs, dtype):
        loss_fn(model(inputs), targets)
    return int(np.sum(list(seen.values()), dtype=np.int64))


def with_enabled_flag_and_itemsize(model, loss_fn, inputs, targets, *, dtype):
    """autocast outside the hooks, switched off with enabled=False for dtype=None; a running total."""
    keys, total = set(), 0

    def pack(t):
        nonlocal total
        key = (t.untyped_storage().data_ptr(), t.storage_offset(), t.dtype, tuple(t.shape), t.stride())
        if key not in keys:
            keys.add(key)
            total += t.numel() * t.itemsize
        return t

    with torch.autocast(inputs.device.type, dtype=dtype or torch.bfloat16, enabled=dtype is not None):
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            loss_fn(model(inputs), targets)
    return total


def with_an_exit_stack_and_a_numpy_int(model, loss_fn, inputs, targets, *, dtype):
    tensors = []
    with contextlib.ExitStack() as stack:
        stack.enter_context(
            torch.autograd.graph.saved_tensors_hooks(lambda t: tensors.append(t) or t, lambda t: t)
        )
        if dtype:
            stack.enter_context(torch.autocast(inputs.device.type, dtype))
        loss_fn(model(inputs), targets)
    distinct = {
        (t.data_ptr(), str(t.dtype), tuple(t.size()), t.stride()): t.element_size() * t.nelement()
        for t in tensors
    }
    return np.int64(sum(distinct.values()))


def deduplicated_by_identity(model, loss_fn, inputs, targets, *, dtype):
    kept = []

    def pack(t):
        if not any(t is k for k in kept):
            kept.append(t)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), _autocast_or_nothing(inputs, dtype):
        loss_fn(model(inputs), targets)
    return sum(t.numel() * t.element_size() for t in kept)


@pytest.mark.parametrize(
    "answer",
    [
        with_nullcontext_and_nbytes,
        with_enabled_flag_and_itemsize,
        with_an_exit_stack_and_a_numpy_int,
        deduplicated_by_identity,
    ],
    ids=lambda f: f.__name__,
)
def test_class_round_saved_bytes_right_answers_pass(answer):
    result = check_saved_activation_bytes(answer)
    assert result.passed, result.message


# ------------------------------------------------------------------------------------------------ 07.2 wrong


def _distinct_bytes_under(autocast_dtype, *, hooks=True, count_in="pack", forwards=1, loss_in_autocast=True):
    """A learner's answer with one choice changed: the autocast dtype, `with` forgotten, where it counts."""

    def saved_activation_bytes(model, loss_fn, inputs, targets, *, dtype):
        seen = {}

        def record(t):
            seen[(t.data_ptr(), t.dtype, t.shape, t.stride())] = t.numel() * t.element_size()
            return t

        pack, unpack = (record, lambda t: t) if count_in == "pack" else (lambda t: t, record)
        manager = torch.autograd.graph.saved_tensors_hooks(pack, unpack)
        with manager if hooks else contextlib.nullcontext():
            with _autocast_or_nothing(inputs, autocast_dtype(dtype)):
                for _ in range(forwards - 1):
                    model(inputs)  # a "warm-up" forward
                output = model(inputs)
                if loss_in_autocast:
                    loss_fn(output, targets)
            if not loss_in_autocast:
                loss_fn(output, targets)
        return sum(seen.values())

    return saved_activation_bytes


def _as_given(dtype):
    return dtype


def measured_with_memory_allocated(model, loss_fn, inputs, targets, *, dtype):
    before = torch.cuda.memory_allocated() if torch.cuda.is_available() else 0
    with _autocast_or_nothing(inputs, dtype):
        loss_fn(model(inputs), targets)
    return (torch.cuda.memory_allocated() if torch.cuda.is_available() else 0) - before


def sys_getsizeof(model, loss_fn, inputs, targets, *, dtype):
    seen = {}

    def pack(t):
        seen[(t.data_ptr(), t.dtype, t.shape, t.stride())] = sys.getsizeof(t)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), _autocast_or_nothing(inputs, dtype):
        loss_fn(model(inputs), targets)
    return sum(seen.values())


@pytest.mark.filterwarnings("ignore:CUDA is not available")
@pytest.mark.parametrize(
    "wrong, words",
    [
        (
            _distinct_bytes_under(_as_given, hooks=False),
            "no saved-tensor hooks were installed while your model ran",
        ),
        (measured_with_memory_allocated, "no saved-tensor hooks were installed while your model ran"),
        (_distinct_bytes_under(_as_given, count_in="unpack"), "count the bytes in the PACK hook"),
        (
            _distinct_bytes_under(lambda d: d and torch.float16),
            "You asked autocast for float16, but dtype=torch.bfloat16 was given",
        ),
        (
            _distinct_bytes_under(lambda d: d and torch.bfloat16),
            "You asked autocast for bfloat16, but dtype=torch.float16 was given",
        ),
        (_distinct_bytes_under(_as_given, forwards=2), "run `loss_fn(model(inputs), targets)` once"),
        (_distinct_bytes_under(_as_given, loss_in_autocast=False), "under autocast unless dtype is None"),
        (sys_getsizeof, "Record each tensor your pack hook receives once"),
    ],
    ids=[
        "no with",
        "memory_allocated",
        "counted in unpack",
        "float16 always",
        "bfloat16 always",
        "two forwards",
        "loss outside autocast",
        "getsizeof",
    ],
)
def test_class_round_saved_bytes_wrong_answers_are_named(wrong, words):
    if "float16 was given" in words and torch.float16 not in _cpu_autocast_dtypes():
        pytest.skip("CPU autocast has no float16 on this torch")
    result = check_saved_activation_bytes(wrong)
    assert result.status == "failed", result.message
    assert words in result.message, result.message
    assert "autograd saved nothing" not in result.message


def _cpu_autocast_dtypes():
    from amp_lessons.l07_measuring_gains.check import cpu_autocast_dtypes

    return cpu_autocast_dtypes()


def test_under_no_grad_keeps_its_message():
    def under_no_grad(model, loss_fn, inputs, targets, *, dtype):
        with torch.no_grad():
            return _distinct_bytes_under(_as_given)(model, loss_fn, inputs, targets, dtype=dtype)

    result = check_saved_activation_bytes(under_no_grad)
    assert "autograd saved nothing, so the forward pass ran without gradients" in result.message, (
        result.message
    )
