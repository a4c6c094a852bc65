"""Lesson 07's checker tried the way a class would: right timing functions written differently from the
reference pass, natural wrong ones fail with a message that names the actual mistake."""

import statistics
import time

import numpy as np
import pytest
import torch

from amp_lessons.checks import check_time_step

# ----------------------------------------------------------------------------------------------- right


def starts_and_ends(step_fn, *, warmup, repeats, sync, clock=time.perf_counter):
    """Two lists of clock readings, subtracted at the end; a while loop for the warm-up."""
    done = 0
    while done < warmup:
        step_fn()
        done += 1
    sync()
    starts, ends = [], []
    for _ in range(repeats):
        starts.append(clock())
        step_fn()
        sync()
        ends.append(clock())
    return [end - start for start, end in zip(starts, ends)]


def one_loop_skipping_warmup(step_fn, *, warmup, repeats, sync, clock=time.perf_counter):
    """Every call timed the same way, the warm-up's times thrown away."""
    times = []
    for i in range(warmup + repeats):
        start = clock()
        step_fn()
        sync()
        elapsed = clock() - start
        if i >= warmup:
            times.append(elapsed)
    return times


def sync_on_both_sides(step_fn, *, warmup, repeats, sync, clock=time.perf_counter):
    """A sync before each start as well (harmless), a preallocated list, a tuple returned."""
    for _ in range(warmup):
        step_fn()
    times = [0.0] * repeats
    for i in range(repeats):
        sync()
        start = clock()
        step_fn()
        sync()
        times[i] = clock() - start
    return tuple(times)


def checks_after_timing(step_fn, *, warmup, repeats, sync, clock=time.perf_counter):
    """Keeps the losses, checks them after the timed loop, prints a summary, returns a NumPy array."""
    for _ in range(warmup):
        step_fn()
    sync()
    times, losses = [], []
    for _ in range(repeats):
        start = clock()
        losses.append(step_fn())
        sync()
        times.append(clock() - start)
    assert all(bool(torch.isfinite(loss)) for loss in losses)
    print(f"median {statistics.median(times) * 1e3:.2f} ms")
    return np.array(times)


def item_after_the_clock(step_fn, *, warmup, repeats, sync, clock=time.perf_counter):
    """Reads the loss with .item() after the clock stopped: outside the timed region."""
    for _ in range(warmup):
        step_fn()
    sync()
    times, losses = [], []
    for _ in range(repeats):
        start = clock()
        loss = step_fn()
        sync()
        times.append(clock() - start)
        losses.append(loss.item())
    return times


def rounded_to_microseconds(step_fn, *, warmup, repeats, sync, clock=time.perf_counter):
    for _ in range(warmup):
        step_fn()
    sync()
    times = []
    for _ in range(repeats):
        start = clock()
        step_fn()
        sync()
        times.append(round(float(clock() - start), 6))
    return times


RIGHT = [
    starts_and_ends,
    one_loop_skipping_warmup,
    sync_on_both_sides,
    checks_after_timing,
    item_after_the_clock,
    rounded_to_microseconds,
]


@pytest.mark.parametrize("time_step", RIGHT, ids=[f.__name__ for f in RIGHT])
def test_right_timing_functions_written_differently_pass(time_step):
    result = check_time_step(time_step)
    assert result.passed, result.message


# ----------------------------------------------------------------------------------------------- wrong


def step_fn_without_parentheses(step_fn, *, warmup, repeats, sync, clock=time.perf_counter):
    for _ in range(warmup):
        step_fn  # noqa: B018 - the mistake under test: the step is never called
    sync()
    times = []
    for _ in range(repeats):
        start = clock()
        step_fn  # noqa: B018
        sync()
        times.append(clock() - start)
    return times


def sync_without_parentheses(step_fn, *, warmup, repeats, sync, clock=time.perf_counter):
    for _ in range(warmup):
        step_fn()
    sync  # noqa: B018 - never called
    times = []
    for _ in range(repeats):
        start = clock()
        step_fn()
        sync  # noqa: B018
        times.append(clock() - start)
    return times


def sync_after_the_clock(step_fn, *, warmup, repeats, sync, clock=time.perf_counter):
    for _ in range(warmup):
        step_fn()
    sync()
    times = []
    for _ in range(repeats):
        start = clock()
        step_fn()
        end = clock()
        sync()
        times.append(end - start)
    return times


def one_sync_after_the_loop(step_fn, *, warmup, repeats, sync, clock=time.perf_counter):
    for _ in range(warmup):
        step_fn()
    sync()
    times = []
    for _ in range(repeats):
        start = clock()
        step_fn()
        times.append(clock() - start)
    sync()
    return times


def wall_clock(step_fn, *, warmup, repeats, sync, clock=time.perf_counter):
    for _ in range(warmup):
        step_fn()
    sync()
    times = []
    for _ in range(repeats):
        start = time.time()
        step_fn()
        sync()
        times.append(time.time() - start)
    return times


def isfinite_check_inside(step_fn, *, warmup, repeats, sync, clock=time.perf_counter):
    for _ in range(warmup):
        step_fn()
    sync()
    times = []
    for _ in range(repeats):
        start = clock()
        loss = step_fn()
        if not torch.isfinite(loss):
            raise RuntimeError("non-finite loss")
        sync()
        times.append(clock() - start)
    return times


def nanoseconds(step_fn, *, warmup, repeats, sync, clock=time.perf_counter):
    for _ in range(warmup):
        step_fn()
    sync()
    times = []
    for _ in range(repeats):
        start = clock()
        step_fn()
        sync()
        times.append((clock() - start) * 1e9)
    return times


def median_in_a_list(step_fn, *, warmup, repeats, sync, clock=time.perf_counter):
    times = starts_and_ends(step_fn, warmup=warmup, repeats=repeats, sync=sync, clock=clock)
    return [statistics.median(times)]


WRONG = {
    "step_fn without ()": (step_fn_without_parentheses, "You never call `step_fn()`"),
    "sync without ()": (sync_without_parentheses, "never call `sync()`"),
    "sync after the end reading": (sync_after_the_clock, "BEFORE reading the clock at the end"),
    "one sync after the whole loop": (one_sync_after_the_loop, "BEFORE reading the clock at the end"),
    "time.time() instead of clock": (wall_clock, "never called `clock()`"),
    "isfinite check inside": (isfinite_check_inside, "`isfinite`"),
    "nanoseconds": (nanoseconds, "nanoseconds"),
    "median in a list": (median_in_a_list, "MEDIAN"),
}


@pytest.mark.parametrize("name", WRONG)
def test_natural_wrong_timing_functions_are_named(name):
    time_step, expected = WRONG[name]
    result = check_time_step(time_step)
    assert not result.passed and result.status == "failed"
    assert expected in result.message, result.message


def average_for_every_call(step_fn, *, warmup, repeats, sync, clock=time.perf_counter):
    """Times the whole loop once and reports its average for every call: the spread is gone."""
    for _ in range(warmup):
        step_fn()
    sync()
    start = clock()
    for _ in range(repeats):
        step_fn()
    sync()
    return [(clock() - start) / repeats] * repeats


def test_the_average_repeated_for_every_call_is_rejected():
    result = check_time_step(average_for_every_call)
    assert not result.passed and result.status == "failed"
    assert "Every entry is the same average (total / repeats)" in result.message, result.message
