"""Lesson 07 checkers: a timing function that warms up, synchronises and times only the step (07.1), and the
bytes autograd saves for backward in one forward pass (07.2).

07.1: the learner writes ``time_step(step_fn, *, warmup, repeats, sync, clock) -> list[float]``: seconds per
timed call, one entry per repeat. The checker hands it an *instrumented, simulated GPU* so that every
mistake is observable on any machine, deterministically:

- ``clock()`` is a fake host clock that only moves when the simulation says so (no real time is measured,
  so a busy laptop cannot make the check flaky);
- ``step_fn()`` *queues* work on the fake device and returns after a tiny launch time, exactly like a CUDA
  call: the work finishes later. The first calls are slow (as real first calls are: allocation, autotuning);
- ``sync()`` waits (moves the fake clock) until the queued work is done;
- anything done with the step's result (``.item()``, ``torch.isfinite``, ``float``, ``print``) is recorded
  with its place relative to the clock reads, and — as on a real GPU — waits for the device and costs time.

Each scenario's true cost of every call is known, so the learner's numbers are compared with the truth and
the events tell *which* rule was broken. The rules are tables of small named ``Mistake`` rules over a
``TimingRun``, first match wins: ``RESULT_MISTAKES`` (what came back), ``USAGE_MISTAKES`` (how the tools were
used, what ran inside the timed regions), then — when the times are not right — ``VALUE_MISTAKES`` (what
the numbers are instead: milliseconds, a running total, ...).

07.2: the learner writes ``saved_activation_bytes(model, loss_fn, inputs, targets, *, dtype) -> int`` with
``torch.autograd.graph.saved_tensors_hooks``. The checker builds three small CPU models itself, measures each in
FP32 and in every dtype CPU autocast supports here, and computes what each known mistake would return
(``SavedFigures``); the tables ``SAVED_RESULT_MISTAKES``, ``SAVED_USAGE_MISTAKES`` (hooks left installed, the
model changed) and ``SAVED_VALUE_MISTAKES`` name the first one that fits a ``SavedBytesRun``.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import math
import numbers
import statistics
import warnings
from dataclasses import dataclass

import numpy as np
import torch

from amp_lessons.checks.harness import call_learner, checker, passed, stop
from amp_lessons.checks.mistakes import first_mistake, rule
from amp_lessons.core.environment import dtype_name
from amp_lessons.l07_measuring_gains.spies import TimingSpy

LAUNCH_S = 2e-5  # host time to queue one step on the fake device
SYNC_S = 1e-6  # host time of one sync() call
DIAGNOSTIC_S = 3e-4  # host time of one diagnostic on the result (.item(), isfinite, print)
MAX_CALLS = 1000


class _TooManyCalls(RuntimeError):
    pass


class FakeDevice:
    """A simulated asynchronous device with a host clock; records every event in order."""

    def __init__(self, costs):
        self.costs = list(costs)  # seconds of device work for call 0, 1, 2, ... (last value repeats)
        self.now = 0.0
        self.busy_until = 0.0
        self.calls = 0
        self.events = []  # ("clock",) ("step", n) ("sync",) ("diag", name) ("cuda-sync",)
        self.readings = []  # what clock() returned, in order
        self.step_args = False
        self.sync_args = False
        self.loss = torch.tensor(2.5)

    def cost(self, index: int) -> float:
        return self.costs[min(index, len(self.costs) - 1)]

    # the three callables the learner receives
    def step(self, *args, **kwargs):
        if self.calls >= MAX_CALLS:
            raise _TooManyCalls(f"step_fn was called more than {MAX_CALLS} times: does your loop end?")
        if args or kwargs:
            self.step_args = True
        start = max(self.now, self.busy_until)
        self.busy_until = start + self.cost(self.calls)
        self.now += LAUNCH_S
        self.calls += 1
        self.events.append(("step", self.calls))
        return self.loss

    def sync(self, *args, **kwargs):
        if args or kwargs:
            self.sync_args = True
        self.now = max(self.now, self.busy_until) + SYNC_S
        self.events.append(("sync",))

    def clock(self):
        self.events.append(("clock",))
        self.readings.append(self.now)
        return self.now

    # what the harness records
    def diagnostic(self, name: str) -> None:
        self.now = max(self.now, self.busy_until) + DIAGNOSTIC_S  # .item() on a GPU result waits for the GPU
        self.events.append(("diag", name))

    def cuda_synchronize(self, *args, **kwargs):
        self.now = max(self.now, self.busy_until) + SYNC_S
        self.events.append(("cuda-sync",))


# Scenarios: (warmup, repeats, costs of every call in order). The first calls are slow like real first calls.
SCENARIOS = (
    (3, 6, [0.05, 0.04, 0.010, 0.010, 0.012, 0.009, 0.011, 0.014, 0.010]),
    (1, 3, [0.06, 0.020, 0.025, 0.021]),
    (0, 2, [0.0074, 0.0063]),  # not whole milliseconds: times rounded to 3 decimals are seen
)


def _close(a: float, b: float, rel: float = 2e-3, abs_tol: float = 5e-6) -> bool:
    return math.isfinite(a) and abs(a - b) <= abs_tol + rel * abs(b)


def _all_close(got, want, **kw) -> bool:
    return len(got) == len(want) and all(_close(g, w, **kw) for g, w in zip(got, want))


def _plain_number(value):
    """``value`` as a float when it is a plain real number (not a bool, not a tensor), else None.

    A predicate, not ``harness.as_number``: a tensor or a single number is a mistake of its own here, named
    by its own rule, so the check must not stop (or accept a one-element tensor) while it looks.
    """
    if isinstance(value, numbers.Real) and not isinstance(value, (bool, torch.Tensor)):
        return float(value)
    return None


@rule(
    "the total",
    "You returned one number, the TOTAL time of all timed calls. Return a list with one time per "
    "call (seconds), e.g. `times.append(end - start)` inside the loop.",
)
def returned_the_total(value, expected) -> bool:
    return _close(value, sum(expected), rel=0.02)


@rule(
    "the average",
    "You returned one number, the AVERAGE time per call. Return the list of per-call times instead: "
    "the median and the spread are computed from it afterwards.",
)
def returned_the_average(value, expected) -> bool:
    return _close(value, sum(expected) / len(expected), rel=0.02)


@rule(
    "the median",
    "You returned one number, the MEDIAN. Return the list of per-call times; the median is taken later.",
)
def returned_the_median(value, expected) -> bool:
    return _close(value, statistics.median(expected), rel=0.02)


@rule(
    "a single number",
    "You returned a single number; return a list with one time (in seconds) per timed call.",
)
def returned_an_unexplained_number(value, expected) -> bool:
    return True


# What one number stands for, when the learner returned one instead of a list (facts: value, expected times).
SINGLE_NUMBER_MISTAKES = (
    returned_the_total,
    returned_the_average,
    returned_the_median,
    returned_an_unexplained_number,
)


def _describe_single(value: float, expected: list) -> str:
    return first_mistake(SINGLE_NUMBER_MISTAKES, value, expected).text(value, expected)


def _timed_windows(events):
    """Events between consecutive clock reads; a window that contains a step is a timed region."""
    windows, current, seen_clock = [], [], False
    for event in events:
        if event[0] == "clock":
            if seen_clock:
                windows.append(current)
            current, seen_clock = [], True
        elif seen_clock:
            current.append(event)
    return [w for w in windows if any(e[0] == "step" for e in w)]


def _run_scenario(time_step, warmup: int, repeats: int, costs: list):
    device = FakeDevice(costs)
    with TimingSpy(device.diagnostic, device.cuda_synchronize):
        result = call_learner(
            time_step,
            device.step,
            warmup=warmup,
            repeats=repeats,
            sync=device.sync,
            clock=device.clock,
            what="`time_step`",
        )
    return device, result


@dataclass
class TimingRun:
    """One scenario as the rules see it: what time_step returned, the simulated device's record, the truth."""

    device: FakeDevice
    result: object
    warmup: int
    repeats: int

    @property
    def expected(self) -> list:
        """What each timed call really took: the device work plus one sync()."""
        return [self.device.cost(self.warmup + i) + SYNC_S for i in range(self.repeats)]

    @property
    def where(self) -> str:
        return f"(warmup={self.warmup}, repeats={self.repeats})"

    @property
    def kinds(self) -> list:
        return [e[0] for e in self.device.events]

    @property
    def listed(self):
        """The result, a NumPy array read as a list (anything else as it is)."""
        return self.result.reshape(-1).tolist() if isinstance(self.result, np.ndarray) else self.result

    @property
    def values(self) -> list:
        """The returned times as floats (only once the result rules found a list of plain numbers)."""
        return [_plain_number(v) for v in self.listed]

    def first_non_number(self) -> int:
        return next(i for i, v in enumerate(self.listed) if _plain_number(v) is None)

    def diagnostics_timed(self) -> list:
        """Sorted names of the diagnostics in the first timed region that has any ([] when none)."""
        for window in _timed_windows(self.device.events):
            names = sorted({e[1] for e in window if e[0] == "diag"})
            if names:
                return names
        return []


def _one_number_message(run: TimingRun) -> str:
    return _describe_single(_plain_number(run.result), run.expected) + f" {run.where}"


@rule("one number", _one_number_message)
def returned_one_number(run: TimingRun) -> bool:
    return _plain_number(run.result) is not None


def _tensor_message(run: TimingRun) -> str:
    return (
        "You returned a tensor; return a plain Python list of floats (seconds per call), "
        f"e.g. `times.append(end - start)` with numbers from clock(). {run.where}"
    )


@rule("a tensor", _tensor_message)
def returned_a_tensor(run: TimingRun) -> bool:
    return isinstance(run.result, torch.Tensor)


def _not_a_list_message(run: TimingRun) -> str:
    if inspect.isgenerator(run.listed):
        return (
            "time_step returned a generator: a function with `yield` in it gives back a generator, not "
            "the times. Append each time to a list and `return times` (or `return list(...)`)."
        )
    return (
        f"time_step returned {type(run.listed).__name__} ({str(run.listed)[:60]!r}); return a list with "
        "one time in seconds per timed call. Did you forget `return times`?"
    )


@rule("not a list", _not_a_list_message)
def returned_not_a_list(run: TimingRun) -> bool:
    return not isinstance(run.listed, (list, tuple))


def _non_number_message(run: TimingRun) -> str:
    i = run.first_non_number()
    return (
        f"Entry {i} of your list is a {type(run.listed[i]).__name__}; every entry must be a plain number "
        "of seconds, e.g. `end - start` with both values from clock()."
    )


@rule("an entry that is not a number", _non_number_message)
def returned_an_entry_that_is_not_a_number(run: TimingRun) -> bool:
    return any(_plain_number(v) is None for v in run.listed)


# What came back (checked in this order before anything else).
RESULT_MISTAKES = (
    returned_one_number,
    returned_a_tensor,
    returned_not_a_list,
    returned_an_entry_that_is_not_a_number,
)


@rule(
    "called torch.cuda.synchronize",
    "You called torch.cuda.synchronize() directly. Use the `sync` argument you were given: it is "
    "torch.cuda.synchronize on a GPU, a no-op on a CPU, and the checker can watch it.",
)
def called_cuda_synchronize(run: TimingRun) -> bool:
    return "cuda-sync" in run.kinds


@rule("arguments to step_fn", "You passed arguments to step_fn; call it as `step_fn()` with no arguments.")
def passed_arguments_to_step_fn(run: TimingRun) -> bool:
    return run.device.step_args


@rule(
    "arguments to sync",
    "You passed arguments to sync; call it as `sync()`: it already knows its device "
    "(the lesson builds it with make_synchronizer(device)).",
)
def passed_arguments_to_sync(run: TimingRun) -> bool:
    return run.device.sync_args


@rule(
    "never read the clock",
    "You never called `clock()`: use the clock you were given (time.perf_counter by default) for "
    "both readings, so the checker's simulated device can judge your timing.",
)
def never_read_the_clock(run: TimingRun) -> bool:
    return "clock" not in run.kinds


def _nan_message(run: TimingRun) -> str:
    return f"Your list contains NaN or infinity: {run.values}. Each entry is `end - start` for one call."


@rule("NaN or infinity", _nan_message)
def returned_nan_or_infinity(run: TimingRun) -> bool:
    return any(not math.isfinite(v) for v in run.values)


@rule(
    "negative times",
    "Your times are negative: you subtracted the wrong way round. A duration is "
    "`end - start` (the later reading minus the earlier one).",
)
def returned_negative_times(run: TimingRun) -> bool:
    return any(v < 0 for v in run.values)


@rule(
    "never called step_fn",
    "You never call `step_fn()`: it was not called once, so you timed nothing. Did you write "
    "`step_fn` without parentheses? Call it: `step_fn()`.",
)
def never_called_step_fn(run: TimingRun) -> bool:
    return run.device.calls == 0


def _no_warmup_message(run: TimingRun) -> str:
    return (
        f"No warm-up: step_fn was called only {run.device.calls} times, all of them timed. Call it `warmup` "
        "times first, untimed, then sync(): the first calls are slow (allocation, autotuning). "
        f"{run.where}"
    )


@rule("no warm-up", _no_warmup_message)
def skipped_the_warmup(run: TimingRun) -> bool:
    return run.device.calls == run.repeats and run.warmup > 0


def _call_count_message(run: TimingRun) -> str:
    return (
        f"step_fn was called {run.device.calls} times, but warm-up + repeats = {run.warmup} + {run.repeats} "
        f"= {run.warmup + run.repeats}. Check your loop counts (`range(warmup)`, `range(repeats)`). "
        f"{run.where}"
    )


@rule("a wrong number of calls", _call_count_message)
def called_step_fn_a_wrong_number_of_times(run: TimingRun) -> bool:
    return run.device.calls != run.warmup + run.repeats


def _warmup_in_list_message(run: TimingRun) -> str:
    return (
        f"You returned {len(run.values)} times: the warm-up calls are in your list. Time and return "
        f"only the {run.repeats} calls after the warm-up. {run.where}"
    )


@rule("warm-up calls in the list", _warmup_in_list_message)
def returned_the_warmup_times(run: TimingRun) -> bool:
    return len(run.values) == run.warmup + run.repeats and run.warmup > 0


def _one_number_in_a_list_message(run: TimingRun) -> str:
    return _describe_single(run.values[0], run.expected) + f" {run.where}"


@rule("one number in a list", _one_number_in_a_list_message)
def returned_one_number_in_a_list(run: TimingRun) -> bool:
    return len(run.values) != run.repeats and len(run.values) == 1


def _time_count_message(run: TimingRun) -> str:
    return (
        f"You returned {len(run.values)} times, but repeats={run.repeats}: return one time per timed call. "
        f"{run.where}"
    )


@rule("a wrong number of times", _time_count_message)
def returned_a_wrong_number_of_times(run: TimingRun) -> bool:
    return len(run.values) != run.repeats


def _diagnostics_message(run: TimingRun) -> str:
    return (
        "You run diagnostics inside the timed region ("
        + ", ".join(f"`{n}`" for n in run.diagnostics_timed())
        + " between the clock readings around a step). On a GPU each `.item()`/`isfinite`/print waits for "
        "the device and adds host work, so you time your checks too. Keep the results and check them "
        "after timing."
    )


@rule("diagnostics in the timed region", _diagnostics_message)
def timed_diagnostics(run: TimingRun) -> bool:
    return bool(run.diagnostics_timed())


def _never_synced_message(run: TimingRun) -> str:
    return (
        "You never call `sync()`. On a GPU step_fn() returns as soon as the work is queued, so your clock "
        "measured the launch, not the work: times like "
        f"{run.values[0]:.6f} s where the step really takes {run.expected[0]:.6f} s. Call sync() after the "
        "warm-up and after each step, before reading the clock."
    )


@rule("never synced", _never_synced_message)
def never_synced(run: TimingRun) -> bool:
    return "sync" not in run.kinds


# How the learner used the tools, and what happened around each step (a list of numbers came back).
USAGE_MISTAKES = (
    called_cuda_synchronize,
    passed_arguments_to_step_fn,
    passed_arguments_to_sync,
    never_read_the_clock,
    returned_nan_or_infinity,
    returned_negative_times,
    never_called_step_fn,
    skipped_the_warmup,
    called_step_fn_a_wrong_number_of_times,
    returned_the_warmup_times,
    returned_one_number_in_a_list,
    returned_a_wrong_number_of_times,
    timed_diagnostics,
    never_synced,
)


@rule(
    "milliseconds",
    "Your numbers are milliseconds (1000x too large); return seconds, as clock() gives them.",
)
def times_in_milliseconds(run: TimingRun) -> bool:
    return _all_close(run.values, [e * 1e3 for e in run.expected])


def _unit(run: TimingRun):
    """("microseconds", 1e6) or ("nanoseconds", 1e9) when the times are right in that unit, else None."""
    units = (("microseconds", 1e6), ("nanoseconds", 1e9))
    return next(
        (
            (name, factor)
            for name, factor in units
            if _all_close(run.values, [e * factor for e in run.expected])
        ),
        None,
    )


def _unit_message(run: TimingRun) -> str:
    return (
        f"Your numbers are {_unit(run)[0]} ({_unit(run)[1]:.0e} times too large); return seconds, as "
        "clock() gives them."
    )


@rule("another unit", _unit_message)
def times_in_another_unit(run: TimingRun) -> bool:
    return _unit(run) is not None


@rule(
    "a running total",
    "Your times grow call after call: each is the time since the FIRST call started (a running "
    "total). Reset the start for every call: `start = clock()` inside the loop.",
)
def times_are_a_running_total(run: TimingRun) -> bool:
    cumulative = [sum(run.expected[: i + 1]) for i in range(run.repeats)]
    return run.repeats > 1 and _all_close(run.values, cumulative, rel=0.02)


@rule(
    "the same average",
    "Every entry is the same average (total / repeats). Time each call on its own so the median and "
    "the spread mean something.",
)
def times_are_the_same_average(run: TimingRun) -> bool:
    mean = sum(run.expected) / run.repeats
    return run.repeats > 1 and all(_close(v, mean, rel=0.02) for v in run.values)


def _rounded_decimals(run: TimingRun):
    """The number of decimals (1-5) the times were rounded to, when rounding the truth gives them; else None."""
    if not any(run.values):
        return None
    return next(
        (
            d
            for d in range(1, 6)
            if _all_close(run.values, [round(e, d) for e in run.expected], rel=1e-9, abs_tol=1e-12)
        ),
        None,
    )


def _rounded_message(run: TimingRun) -> str:
    d = _rounded_decimals(run)
    return (
        f"You rounded the times to {d} decimals ({10.0**-d:g} s): {run.values} where the calls took "
        f"{[round(e, 6) for e in run.expected]} s. Return them as clock() gives them; a step faster than "
        "the rounding becomes 0. Round only when you print."
    )


@rule("rounded", _rounded_message)
def times_are_rounded(run: TimingRun) -> bool:
    return _rounded_decimals(run) is not None


def _divided_by_repeats_message(run: TimingRun) -> str:
    return (
        f"Your times are {run.repeats}x too small: you divided each call's time by repeats={run.repeats}. "
        "Each entry is already the time of ONE call (`clock() - start` around one step_fn() and sync()); "
        "nothing to average."
    )


@rule("divided by repeats", _divided_by_repeats_message)
def times_divided_by_repeats(run: TimingRun) -> bool:
    return run.repeats > 1 and _all_close(run.values, [e / run.repeats for e in run.expected])


@rule(
    "clock readings",
    "Your entries are clock READINGS (the time of day on the clock), not durations: they only grow. "
    "Subtract the reading taken before the call: `start = clock()` ... `times.append(clock() - start)`.",
)
def times_are_clock_readings(run: TimingRun) -> bool:
    readings = run.device.readings
    return run.repeats > 1 and all(any(_close(v, r, rel=1e-9) for r in readings) for v in run.values)


def _shifted_message(run: TimingRun) -> str:
    return (
        "Each of your times is the PREVIOUS call's (the first is only a launch): you call sync() before "
        "step_fn(), so the clock waits for the call before and stops while this one still runs. Call sync() "
        "after step_fn(), before reading the clock."
    )


@rule("shifted by one call", _shifted_message)
def times_shifted_by_one_call(run: TimingRun) -> bool:
    return run.repeats > 1 and _all_close(run.values[1:], run.expected[:-1])


@rule(
    "in another order",
    "Your times are right but not in call order (sorted?): return one time per call in the order of the "
    "calls; the first calls after the warm-up can differ from the later ones, and that is worth seeing.",
)
def times_in_another_order(run: TimingRun) -> bool:
    return _all_close(sorted(run.values), sorted(run.expected))


def _clock_stopped_message(run: TimingRun) -> str:
    return (
        "Your clock stopped before the device finished: the times are about the launch time "
        f"({run.values[0]:.6f} s) while the step takes {run.expected[0]:.6f} s. Call sync() after "
        "step_fn() and BEFORE reading the clock at the end."
    )


@rule("the clock stopped before the device finished", _clock_stopped_message)
def clock_stopped_before_the_device_finished(run: TimingRun) -> bool:
    return all(v < 0.2 * e for v, e in zip(run.values, run.expected))


def _leftover_warmup_message(run: TimingRun) -> str:
    return (
        "Your first timed call also includes leftover warm-up work still queued on the device "
        f"({run.values[0]:.4f} s instead of {run.expected[0]:.4f} s). Call sync() after the warm-up, before "
        "the first clock reading."
    )


@rule("leftover warm-up work", _leftover_warmup_message)
def first_time_has_leftover_warmup(run: TimingRun) -> bool:
    values, expected = run.values, run.expected
    return values[0] > 1.5 * expected[0] and _all_close(values[1:], expected[1:], rel=0.02)


def _times_match_nothing_message(run: TimingRun) -> str:
    return (
        "Your times do not match what each call really took on the simulated device: "
        f"got {[round(v, 6) for v in run.values]}, expected {[round(e, 6) for e in run.expected]} seconds. "
        "Time each call as: start = clock(); step_fn(); sync(); times.append(clock() - start)."
    )


@rule("times that match nothing known", _times_match_nothing_message)
def times_match_nothing_known(run: TimingRun) -> bool:
    return True


# The numbers themselves, when every rule above was kept but the times are not what each call took.
VALUE_MISTAKES = (
    times_in_milliseconds,
    times_in_another_unit,
    times_are_rounded,
    times_divided_by_repeats,
    times_are_a_running_total,
    times_are_clock_readings,
    times_are_the_same_average,
    times_shifted_by_one_call,
    times_in_another_order,
    clock_stopped_before_the_device_finished,
    first_time_has_leftover_warmup,
    times_match_nothing_known,
)


def _judge(device: FakeDevice, result, warmup: int, repeats: int):
    """None when right, else the failed message naming the mistake (the first rule, table by table)."""
    run = TimingRun(device, result, warmup, repeats)
    rule = first_mistake(RESULT_MISTAKES + USAGE_MISTAKES, run)
    if rule is None and _all_close(run.values, run.expected):
        return None
    rule = rule or first_mistake(VALUE_MISTAKES, run)
    return rule.text(run)


@checker("07.1 time_step")
def check_time_step(time_step):
    """``time_step(step_fn, *, warmup, repeats, sync, clock)`` returns seconds per call, honestly timed."""
    for warmup, repeats, costs in SCENARIOS:
        device, result = _run_scenario(time_step, warmup, repeats, costs)
        problem = _judge(device, result, warmup, repeats)
        if problem:
            stop(problem)
    return passed(
        "Warm-up untimed, sync() before each clock reading that ends a call, one time per call in seconds, "
        f"and nothing else inside the timed region — right on all {len(SCENARIOS)} "
        "simulated-device scenarios."
    )


# ------------------------------------------------------------------------ 07.2 saved_activation_bytes
#
# The contract: the total of the ``bytes`` column of ``memory.saved_tensor_report`` (a test keeps them equal).
# Every tensor the pack hook receives counts, parameters included (an FP32 Linear saves its weight itself,
# autocast saves its low-precision copy), each once: two saves are the same tensor when their (data_ptr,
# dtype, shape, stride) are equal. None of the checker's models saves a reshaped view of a tensor it also
# saves, so keying by ``data_ptr()`` or by the untyped storage gives the same number there. A one-element
# tensor or a float is refused (the contract is an int, `int(...)` is one call away); a NumPy integer is not.


@dataclass(frozen=True)
class SavedFigures:
    """What one forward pass + loss saved (the right answer) and what each known mistake would return."""

    expected: int  # bytes, each saved tensor once
    numel: int  # elements instead of bytes, each saved tensor once
    numel_every_save: int
    every_save: int  # bytes, a tensor saved twice counted twice
    without_parameters: int  # bytes, tensors sharing a parameter's memory left out
    parameters: int  # bytes of all the model's parameters (FP32)
    parameters_in_dtype: int  # the same, as if stored in the autocast dtype
    outputs: tuple  # bytes of the model's output, of the loss, of both


@dataclass(frozen=True)
class MemoryProbe:
    """One model the checker builds, with its batch and loss; ``build()`` makes a fresh, seeded copy."""

    name: str
    build: object  # () -> (model, loss_fn, inputs, targets)


def _mlp():
    model = torch.nn.Sequential(torch.nn.Linear(12, 20), torch.nn.ReLU(), torch.nn.Linear(20, 6))
    return model, torch.nn.CrossEntropyLoss(), torch.randn(7, 12), torch.randint(0, 6, (7,))


def _timing_mlp():
    from amp_lessons.core.models import TimingMLP

    return TimingMLP(16, 24, 5), torch.nn.CrossEntropyLoss(), torch.randn(9, 16), torch.randint(0, 5, (9,))


def _regressor_in_eval_mode():
    layers = (torch.nn.Linear(10, 8), torch.nn.Tanh(), torch.nn.Dropout(0.5), torch.nn.Linear(8, 1))
    model = torch.nn.Sequential(*layers).eval()  # Dropout is the identity in eval mode: it saves nothing
    return model, torch.nn.MSELoss(), torch.randn(11, 10), torch.randn(11, 1)


MEMORY_PROBES = (
    MemoryProbe("Linear-ReLU-Linear with cross-entropy", _mlp),
    MemoryProbe("the lesson's TimingMLP (LayerNorm, GELU)", _timing_mlp),
    MemoryProbe("a Linear-Tanh-Dropout-Linear regressor in eval mode, MSE loss", _regressor_in_eval_mode),
)


def _build(probe: MemoryProbe):
    """A fresh copy of the probe's model and batch, the same every time; the learner's RNG is left alone."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return probe.build()


@functools.cache
def cpu_autocast_dtypes() -> tuple:
    """The low-precision dtypes CPU autocast really runs a matmul in, on this torch (float16 needs 2.4+)."""
    found = []
    for dtype in (torch.bfloat16, torch.float16):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                with torch.autocast(device_type="cpu", dtype=dtype):
                    if (torch.ones(2, 2) @ torch.ones(2, 2)).dtype == dtype:
                        found.append(dtype)
            except RuntimeError:
                pass
    return tuple(found)


def _tensor_bytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def saved_figures(model, loss_fn, inputs, targets, *, dtype) -> SavedFigures:
    """The reference: one forward pass + loss under the saved-tensor hooks, and every mistake's figure."""
    saved = []

    def pack(t):
        saved.append(t)
        return t

    with torch.enable_grad(), torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        with torch.autocast(
            device_type=inputs.device.type, dtype=dtype or torch.bfloat16, enabled=bool(dtype)
        ):
            output = model(inputs)
            loss = loss_fn(output, targets)
    distinct = list({(t.data_ptr(), t.dtype, tuple(t.shape), tuple(t.stride())): t for t in saved}.values())
    parameters = list(model.parameters())
    parameter_ptrs = {p.data_ptr() for p in parameters}
    itemsize = torch.empty((), dtype=dtype).element_size() if dtype else 4
    return SavedFigures(
        expected=sum(map(_tensor_bytes, distinct)),
        numel=sum(t.numel() for t in distinct),
        numel_every_save=sum(t.numel() for t in saved),
        every_save=sum(map(_tensor_bytes, saved)),
        without_parameters=sum(_tensor_bytes(t) for t in distinct if t.data_ptr() not in parameter_ptrs),
        parameters=sum(map(_tensor_bytes, parameters)),
        parameters_in_dtype=sum(p.numel() for p in parameters) * itemsize,
        outputs=(_tensor_bytes(output), _tensor_bytes(loss), _tensor_bytes(output) + _tensor_bytes(loss)),
    )


def _hooks_active() -> bool:
    """Whether saved-tensor default hooks are installed now: a saved tensor then refuses hooks of its own."""
    with torch.enable_grad():  # a learner may have switched gradients off and left them off
        probe = torch.ones(1, requires_grad=True).exp()
    try:
        probe.grad_fn._raw_saved_result.register_hooks(lambda t: t, lambda t: t)
    except RuntimeError:
        return True
    return False


def _packing_now() -> bool:
    """Whether saved-tensor hooks would pack a tensor saved now: an EMPTY probe, so a learner's pack hook that
    receives it counts 0 bytes (and 0 elements) more."""
    with torch.enable_grad():
        probe = torch.ones(0, requires_grad=True).exp()
    try:
        probe.grad_fn._raw_saved_result.register_hooks(lambda t: t, lambda t: t)
    except RuntimeError:
        return True
    return False


@dataclass
class ForwardSeen:
    """What the checker saw when the learner's code ran the model: grad mode, hooks, the output's dtype."""

    grad: bool
    packing: bool
    output_dtype: object = None


@contextlib.contextmanager
def _watching_forward(model):
    """Records a :class:`ForwardSeen` for every call of ``model`` (hooks on the model, removed on the way out)."""
    seen = []

    def before(module, args):
        seen.append(ForwardSeen(torch.is_grad_enabled(), _packing_now()))

    def after(module, args, output):
        if seen and isinstance(output, torch.Tensor):
            seen[-1].output_dtype = output.dtype

    handles = (model.register_forward_pre_hook(before), model.register_forward_hook(after))
    try:
        yield seen
    finally:
        for handle in handles:
            handle.remove()


def _remove_leftover_hooks() -> None:
    """Pop saved-tensor hooks left installed, so a leaky pack hook stops recording the kernel's tensors."""
    pop = getattr(torch._C._autograd, "_pop_saved_tensors_default_hooks", None)
    for _ in range(100):
        if pop is None or not _hooks_active():
            return
        pop()


def _model_state(model):
    return [m.training for m in model.modules()], any(p.grad is not None for p in model.parameters())


@dataclass
class SavedBytesRun:
    """One call of the learner's function as the rules see it: the case, what came back, what it changed."""

    probe: str
    dtype: object
    result: object
    figures: SavedFigures
    fp32: int  # the right answer without autocast, for the same model
    autocast_default: int  # the right answer under autocast's default CPU dtype (bfloat16)
    hooks_left: bool
    modes_changed: bool
    gradients: bool
    forwards: tuple = ()  # a ForwardSeen for each call of the model

    @property
    def first_forward(self):
        return self.forwards[0] if self.forwards else None

    @property
    def where(self) -> str:
        precision = "None (FP32)" if self.dtype is None else f"torch.{dtype_name(self.dtype)}"
        return f"(model: {self.probe}; dtype={precision})"

    @property
    def value(self) -> int:
        return int(self.result)


def _tensor_result_message(run: SavedBytesRun) -> str:
    return (
        f"You returned a tensor ({str(run.result)[:60]}); return a plain Python int of bytes: sum "
        "`t.numel() * t.element_size()` (already an int) or wrap the total in `int(...)`. " + run.where
    )


@rule("a tensor", _tensor_result_message)
def returned_a_tensor_of_bytes(run: SavedBytesRun) -> bool:
    return isinstance(run.result, torch.Tensor)


def _float_result_message(run: SavedBytesRun) -> str:
    kib = " It is the answer in KiB: return bytes." if run.result == run.figures.expected / 1024 else ""
    return (
        f"You returned a float ({run.result!r}); bytes are a whole number: return an int (sum "
        f"`t.numel() * t.element_size()`, do not divide).{kib} {run.where}"
    )


@rule("a float", _float_result_message)
def returned_a_float(run: SavedBytesRun) -> bool:
    return isinstance(run.result, numbers.Real) and not isinstance(run.result, numbers.Integral)


def _not_an_int_message(run: SavedBytesRun) -> str:
    if run.result is None:
        return "saved_activation_bytes returned None: did you forget `return total`? " + run.where
    shown = repr(run.result) if len(repr(run.result)) < 60 else repr(run.result)[:57] + "..."
    return f"You returned a {type(run.result).__name__} ({shown}); return an int: the bytes. {run.where}"


@rule("not an int", _not_an_int_message)
def returned_not_an_int(run: SavedBytesRun) -> bool:
    return isinstance(run.result, bool) or not isinstance(run.result, numbers.Integral)


# What came back (checked first: the rules below read it as an int).
SAVED_RESULT_MISTAKES = (returned_a_tensor_of_bytes, returned_a_float, returned_not_an_int)


@rule(
    "hooks left installed",
    "Your saved-tensor hooks are still installed after saved_activation_bytes returned: every later forward "
    "pass in this kernel goes through your pack hook, which keeps each tensor it records alive. Install them "
    "with `with torch.autograd.graph.saved_tensors_hooks(pack, unpack):` so they are removed on the way out "
    "(the check removed them for you).",
)
def left_hooks_installed(run: SavedBytesRun) -> bool:
    return run.hooks_left


@rule(
    "called backward",
    "After your function the model's parameters have gradients: you ran backward. Measure the forward pass "
    "and the loss only: autograd has saved everything before backward starts, and the caller's model must "
    "come back as it was (no .grad filled in, no optimizer step).",
)
def ran_backward(run: SavedBytesRun) -> bool:
    return run.gradients


@rule(
    "train/eval mode changed",
    "You switched the model between train() and eval(): the caller's model must come back in the mode it "
    "came in, and the mode changes what is saved (dropout saves its mask in train mode only; batch norm "
    "switches statistics). Measure the model as it is given.",
)
def changed_train_or_eval_mode(run: SavedBytesRun) -> bool:
    return run.modes_changed


def _other_dtype_message(run: SavedBytesRun) -> str:
    ran = dtype_name(run.first_forward.output_dtype)
    return (
        f"You asked autocast for {ran}, but dtype=torch.{dtype_name(run.dtype)} was given: your model's output "
        f"came back in {ran}. Pass the dtype you are given: `torch.autocast(device_type=inputs.device.type, "
        "dtype=dtype)`. (float16 and bfloat16 both take 2 bytes, so the total alone may not show it; what "
        "autocast casts, and the numbers, differ.) " + run.where
    )


@rule("autocast in another dtype", _other_dtype_message)
def autocast_in_another_dtype(run: SavedBytesRun) -> bool:
    seen = run.first_forward
    low = (torch.float16, torch.bfloat16)
    return (
        run.dtype is not None
        and seen is not None
        and seen.output_dtype in low
        and seen.output_dtype != run.dtype
    )


# What the learner's code did to the kernel and the model (whatever it returned).
SAVED_USAGE_MISTAKES = (
    left_hooks_installed,
    ran_backward,
    changed_train_or_eval_mode,
    autocast_in_another_dtype,
)


def _zero_message(run: SavedBytesRun) -> str:
    seen = run.first_forward
    if seen is not None and seen.grad and not seen.packing:
        return (
            "You returned 0, and no saved-tensor hooks were installed while your model ran (gradients were on, "
            "so autograd did save tensors — nobody recorded them). `torch.autograd.graph.saved_tensors_hooks("
            "pack, unpack)` only installs its hooks when entered: run the forward and the loss inside `with "
            "torch.autograd.graph.saved_tensors_hooks(pack, unpack):` and add up, in pack, the bytes of each "
            "tensor it receives. " + run.where
        )
    if seen is not None and seen.grad:
        return (
            "You returned 0 although your hooks were installed while the model ran with gradients on: count "
            "the bytes in the PACK hook. Unpack runs only when backward reads a saved tensor, and this "
            "exercise never runs backward. " + run.where
        )
    return (
        "You returned 0: autograd saved nothing, so the forward pass ran without gradients — under "
        "`torch.no_grad()` or `torch.inference_mode()`? Tensors are saved for backward only when grad mode is on: "
        "run the forward and the loss with gradients enabled (and do not call backward)."
    )


@rule("0 bytes", _zero_message)
def measured_under_no_grad(run: SavedBytesRun) -> bool:
    return run.value == 0


def _autocast_for_fp32_message(run: SavedBytesRun) -> str:
    return (
        f"With dtype=None you returned {run.value:,} bytes, what autocast's default bfloat16 saves; "
        f"FP32 saves {run.figures.expected:,}. dtype=None means no autocast at all: run the plain forward "
        "(`torch.autocast(..., dtype=None)` is not FP32, it is autocast in its default dtype)."
    )


@rule("autocast for dtype=None", _autocast_for_fp32_message)
def used_autocast_for_none(run: SavedBytesRun) -> bool:
    return run.dtype is None and run.value == run.autocast_default


def _no_autocast_message(run: SavedBytesRun) -> str:
    return (
        f"For dtype=torch.{dtype_name(run.dtype)} you returned {run.value:,} bytes, the FP32 figure: the "
        f"forward did not run under autocast (it saves {run.figures.expected:,}). Run `model(inputs)` and the "
        "loss inside `with torch.autocast(device_type=inputs.device.type, dtype=dtype):` — an autocast for "
        "another device type (e.g. 'cuda') does nothing to CPU tensors. " + run.where
    )


@rule("no autocast", _no_autocast_message)
def ignored_autocast(run: SavedBytesRun) -> bool:
    return run.dtype is not None and run.value == run.fp32


def _numel_message(run: SavedBytesRun) -> str:
    return (
        f"You returned {run.value:,}, the number of ELEMENTS of the saved tensors; the question is bytes "
        f"({run.figures.expected:,}): count `t.numel() * t.element_size()` per tensor, so a bfloat16 element "
        "counts 2 bytes and a float32 one 4. " + run.where
    )


@rule("elements, not bytes", _numel_message)
def counted_elements(run: SavedBytesRun) -> bool:
    return run.value in (run.figures.numel, run.figures.numel_every_save)


def _parameters_message(run: SavedBytesRun) -> str:
    return (
        f"You returned {run.value:,}, the bytes of ALL the model's parameters; the question is what autograd "
        f"saves for backward ({run.figures.expected:,} bytes): the tensors your pack hook receives during the "
        "forward pass and the loss — activations, and the weights (or autocast's copies of them) only where "
        "an op saved them. " + run.where
    )


@rule("the parameters", _parameters_message)
def counted_the_parameters(run: SavedBytesRun) -> bool:
    return run.value in (run.figures.parameters, run.figures.parameters_in_dtype)


def _every_save_message(run: SavedBytesRun) -> str:
    return (
        f"You returned {run.value:,}: every save counted, but autograd saves some tensors twice (a ReLU's "
        "output is also the next Linear's input; log-softmax's output is saved by the loss too), and a "
        f"tensor saved twice is in memory once: {run.figures.expected:,} bytes. Count each tensor once, e.g. "
        "keyed by `(t.data_ptr(), t.dtype, t.shape, t.stride())` as the lesson's saved_tensor_report does. "
        + run.where
    )


@rule("every save counted", _every_save_message)
def counted_every_save(run: SavedBytesRun) -> bool:
    return run.value == run.figures.every_save


def _without_parameters_message(run: SavedBytesRun) -> str:
    return (
        f"You returned {run.value:,}: you left out the saved tensors that are parameters (or views of them). "
        "They are saved tensors too — an FP32 Linear saves its weight for backward, autocast saves its "
        f"low-precision copy — and this exercise counts every tensor autograd saves ({run.figures.expected:,} "
        "bytes, the total of saved_tensor_report's bytes column). " + run.where
    )


@rule("parameters left out", _without_parameters_message)
def left_out_the_parameters(run: SavedBytesRun) -> bool:
    return run.value == run.figures.without_parameters


def _outputs_message(run: SavedBytesRun) -> str:
    return (
        f"You returned {run.value:,}, the bytes of what the forward pass returns (the output, the loss); "
        f"autograd saves much more for backward ({run.figures.expected:,} bytes): the inputs of each layer, "
        "activations, weights. Record every tensor the pack hook of "
        "`torch.autograd.graph.saved_tensors_hooks(pack, unpack)` receives. " + run.where
    )


@rule("the outputs only", _outputs_message)
def counted_the_outputs(run: SavedBytesRun) -> bool:
    return run.value in run.figures.outputs


def _wrong_bytes_message(run: SavedBytesRun) -> str:
    return (
        f"You returned {run.value:,} bytes; the tensors autograd saves in that forward pass and loss take "
        f"{run.figures.expected:,}. Record each tensor your pack hook receives once (keyed by "
        "`(t.data_ptr(), t.dtype, t.shape, t.stride())`), add `t.numel() * t.element_size()`, and run "
        "`loss_fn(model(inputs), targets)` once, under autocast unless dtype is None. " + run.where
    )


@rule("a number that matches nothing known", _wrong_bytes_message)
def returned_wrong_bytes(run: SavedBytesRun) -> bool:
    return True


# What the number is instead, when it is not the bytes autograd saved (most specific first).
SAVED_VALUE_MISTAKES = (
    measured_under_no_grad,
    used_autocast_for_none,
    ignored_autocast,
    counted_elements,
    counted_the_parameters,
    counted_every_save,
    left_out_the_parameters,
    counted_the_outputs,
    returned_wrong_bytes,
)


def saved_bytes_cases():
    """``[(probe, dtype, figures, fp32 bytes, bytes under autocast's default dtype)]``, in the checked order."""
    cases = []
    for probe in MEMORY_PROBES:
        dtypes = (None, *cpu_autocast_dtypes())
        figures = {dtype: saved_figures(*_build(probe), dtype=dtype) for dtype in {*dtypes, torch.bfloat16}}
        fp32, default = figures[None].expected, figures[torch.bfloat16].expected
        cases += [(probe, dtype, figures[dtype], fp32, default) for dtype in dtypes]
    return cases


def _call_saved_bytes(saved_activation_bytes, probe: MemoryProbe, dtype):
    model, loss_fn, inputs, targets = _build(probe)
    before = _model_state(model)
    with _watching_forward(model) as forwards:
        result = call_learner(
            saved_activation_bytes,
            model,
            loss_fn,
            inputs,
            targets,
            dtype=dtype,
            what="`saved_activation_bytes`",
        )
    hooks_left = _hooks_active()
    _remove_leftover_hooks()
    modes, gradients = _model_state(model)
    return result, hooks_left, modes != before[0], gradients, tuple(forwards)


def judge_saved_bytes(run: SavedBytesRun):
    """None when right, else the message of the first rule that names the mistake (table by table)."""
    mistake = first_mistake(SAVED_RESULT_MISTAKES + SAVED_USAGE_MISTAKES, run)
    if mistake is None and run.value == run.figures.expected:
        return None
    return (mistake or first_mistake(SAVED_VALUE_MISTAKES, run)).text(run)


@checker("07.2 saved_activation_bytes")
def check_saved_activation_bytes(saved_activation_bytes):
    """``saved_activation_bytes(model, loss_fn, inputs, targets, *, dtype)``: bytes saved for backward."""
    _remove_leftover_hooks()  # left by an earlier run of a leaky answer: this check's calls must show it
    cases = saved_bytes_cases()
    for probe, dtype, figures, fp32, default in cases:
        result, *changes = _call_saved_bytes(saved_activation_bytes, probe, dtype)
        problem = judge_saved_bytes(
            SavedBytesRun(probe.name, dtype, result, figures, fp32, default, *changes)
        )
        if problem:
            stop(problem)
    precisions = ", ".join(["FP32", *(dtype_name(d) + " autocast" for d in cpu_autocast_dtypes())])
    return passed(
        f"Each saved tensor counted once, in bytes, in {precisions}; hooks removed on the way out and the "
        f"model left as it came — right on all {len(cases)} cases ({len(MEMORY_PROBES)} models)."
    )
