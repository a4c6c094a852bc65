"""Lesson 07 checker: a timing function that warms up, synchronises and times only the step.

The learner writes ``time_step(step_fn, *, warmup, repeats, sync, clock) -> list[float]``: seconds per
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
the events tell *which* rule was broken.
"""

from __future__ import annotations

import contextlib
import io
import math
import numbers
import statistics

import numpy as np
import torch
from torch.overrides import TorchFunctionMode

from amp_lessons.checks.harness import call_learner, checker, passed, stop

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
        return self.now

    # what the harness records
    def diagnostic(self, name: str) -> None:
        self.now = max(self.now, self.busy_until) + DIAGNOSTIC_S  # .item() on a GPU result waits for the GPU
        self.events.append(("diag", name))

    def cuda_synchronize(self, *args, **kwargs):
        self.now = max(self.now, self.busy_until) + SYNC_S
        self.events.append(("cuda-sync",))


class _Watcher(TorchFunctionMode):
    """Records every torch operation the learner's code runs (the fake step itself runs none)."""

    def __init__(self, device: FakeDevice):
        super().__init__()
        self.device = device

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", str(func))
        self.device.diagnostic(name)
        return func(*args, **(kwargs or {}))


class _PrintRecorder(io.StringIO):
    def __init__(self, device: FakeDevice):
        super().__init__()
        self.device = device

    def write(self, text):
        if text.strip():
            self.device.diagnostic("print")
        return super().write(text)


@contextlib.contextmanager
def _patched_cuda_synchronize(device: FakeDevice):
    original = torch.cuda.synchronize
    torch.cuda.synchronize = device.cuda_synchronize
    try:
        yield
    finally:
        torch.cuda.synchronize = original


# Scenarios: (warmup, repeats, costs of every call in order). The first calls are slow like real first calls.
SCENARIOS = (
    (3, 6, [0.05, 0.04, 0.010, 0.010, 0.012, 0.009, 0.011, 0.014, 0.010]),
    (1, 3, [0.06, 0.020, 0.025, 0.021]),
    (0, 2, [0.007, 0.006]),
)


def _close(a: float, b: float, rel: float = 2e-3, abs_tol: float = 5e-6) -> bool:
    return math.isfinite(a) and abs(a - b) <= abs_tol + rel * abs(b)


def _all_close(got, want, **kw) -> bool:
    return len(got) == len(want) and all(_close(g, w, **kw) for g, w in zip(got, want))


def _as_number(value):
    """``value`` as a float when it is a plain real number (not a bool, not a tensor), else None."""
    if isinstance(value, numbers.Real) and not isinstance(value, (bool, torch.Tensor)):
        return float(value)
    return None


def _describe_single(value: float, expected: list) -> str:
    total = sum(expected)
    mean = total / len(expected)
    median = statistics.median(expected)
    if _close(value, total, rel=0.02):
        return ("You returned one number, the TOTAL time of all timed calls. Return a list with one time per call "
                "(seconds), e.g. `times.append(end - start)` inside the loop.")
    if _close(value, mean, rel=0.02):
        return ("You returned one number, the AVERAGE time per call. Return the list of per-call times instead: "
                "the median and the spread are computed from it afterwards.")
    if _close(value, median, rel=0.02):
        return "You returned one number, the MEDIAN. Return the list of per-call times; the median is taken later."
    return "You returned a single number; return a list with one time (in seconds) per timed call."


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
    recorder = _PrintRecorder(device)
    with _patched_cuda_synchronize(device), contextlib.redirect_stdout(recorder), _Watcher(device):
        result = call_learner(time_step, device.step, warmup=warmup, repeats=repeats, sync=device.sync,
                              clock=device.clock, what="`time_step`")
    return device, result


def _judge(device: FakeDevice, result, warmup: int, repeats: int):
    """None when right, else the failed message naming the mistake."""
    expected = [device.cost(warmup + i) + SYNC_S for i in range(repeats)]
    where = f"(warmup={warmup}, repeats={repeats})"
    kinds = [e[0] for e in device.events]

    # what came back
    single = _as_number(result)
    if single is not None:
        return _describe_single(single, expected) + f" {where}"
    if isinstance(result, torch.Tensor):
        return ("You returned a tensor; return a plain Python list of floats (seconds per call), "
                f"e.g. `times.append(end - start)` with numbers from clock(). {where}")
    if isinstance(result, np.ndarray):
        result = result.reshape(-1).tolist()
    if not isinstance(result, (list, tuple)):
        return (f"time_step returned {type(result).__name__} ({str(result)[:60]!r}); return a list with one time "
                "in seconds per timed call. Did you forget `return times`?")
    values = []
    for i, value in enumerate(result):
        number = _as_number(value)
        if number is None:
            return (f"Entry {i} of your list is a {type(value).__name__}; every entry must be a plain number of "
                    "seconds, e.g. `end - start` with both values from clock().")
        values.append(number)

    # how the learner used the tools
    if "cuda-sync" in kinds:
        return ("You called torch.cuda.synchronize() directly. Use the `sync` argument you were given: it is "
                "torch.cuda.synchronize on a GPU, a no-op on a CPU, and the checker can watch it.")
    if device.step_args:
        return "You passed arguments to step_fn; call it as `step_fn()` with no arguments."
    if device.sync_args:
        return ("You passed arguments to sync; call it as `sync()`: it already knows its device "
                "(the lesson builds it with make_synchronizer(device)).")
    if "clock" not in kinds:
        return ("You never called `clock()`: use the clock you were given (time.perf_counter by default) for "
                "both readings, so the checker's simulated device can judge your timing.")
    if any(not math.isfinite(v) for v in values):
        return f"Your list contains NaN or infinity: {values}. Each entry is `end - start` for one call."
    if any(v < 0 for v in values):
        return ("Your times are negative: you subtracted the wrong way round. A duration is "
                "`end - start` (the later reading minus the earlier one).")

    calls = device.calls
    if calls == repeats and warmup > 0:
        return (f"No warm-up: step_fn was called only {calls} times, all of them timed. Call it `warmup` times "
                f"first, untimed, then sync(): the first calls are slow (allocation, autotuning). {where}")
    if calls != warmup + repeats:
        return (f"step_fn was called {calls} times, but warm-up + repeats = {warmup} + {repeats} = "
                f"{warmup + repeats}. Check your loop counts (`range(warmup)`, `range(repeats)`). {where}")
    if len(values) == warmup + repeats and warmup > 0:
        return (f"You returned {len(values)} times: the warm-up calls are in your list. Time and return only the "
                f"{repeats} calls after the warm-up. {where}")
    if len(values) != repeats:
        if len(values) == 1:
            return _describe_single(values[0], expected) + f" {where}"
        return f"You returned {len(values)} times, but repeats={repeats}: return one time per timed call. {where}"

    # what happened inside the timed regions
    for window in _timed_windows(device.events):
        names = sorted({e[1] for e in window if e[0] == "diag"})
        if names:
            shown = ", ".join(f"`{n}`" for n in names)
            return ("You run diagnostics inside the timed region (" + shown + " between the clock readings "
                    "around a step). On a GPU each `.item()`/`isfinite`/print waits for the device and adds host "
                    "work, so you time your checks too. Keep the results and check them after timing.")
    if "sync" not in kinds:
        return ("You never call `sync()`. On a GPU step_fn() returns as soon as the work is queued, so your clock "
                "measured the launch, not the work: times like "
                f"{values[0]:.6f} s where the step really takes {expected[0]:.6f} s. Call sync() after the "
                "warm-up and after each step, before reading the clock.")

    if _all_close(values, expected):
        return None
    if _all_close(values, [e * 1e3 for e in expected]):
        return "Your numbers are milliseconds (1000x too large); return seconds, as clock() gives them."
    cumulative = [sum(expected[: i + 1]) for i in range(repeats)]
    if repeats > 1 and _all_close(values, cumulative, rel=0.02):
        return ("Your times grow call after call: each is the time since the FIRST call started (a running total). "
                "Reset the start for every call: `start = clock()` inside the loop.")
    mean = sum(expected) / repeats
    if repeats > 1 and all(_close(v, mean, rel=0.02) for v in values):
        return ("Every entry is the same average (total / repeats). Time each call on its own so the median and "
                "the spread mean something.")
    if all(v < 0.2 * e for v, e in zip(values, expected)):
        return ("Your clock stopped before the device finished: the times are about the launch time "
                f"({values[0]:.6f} s) while the step takes {expected[0]:.6f} s. Call sync() after step_fn() and "
                "BEFORE reading the clock at the end.")
    if values[0] > 1.5 * expected[0] and _all_close(values[1:], expected[1:], rel=0.02):
        return ("Your first timed call also includes leftover warm-up work still queued on the device "
                f"({values[0]:.4f} s instead of {expected[0]:.4f} s). Call sync() after the warm-up, before the "
                "first clock reading.")
    return ("Your times do not match what each call really took on the simulated device: "
            f"got {[round(v, 6) for v in values]}, expected {[round(e, 6) for e in expected]} seconds. Time each "
            "call as: start = clock(); step_fn(); sync(); times.append(clock() - start).")


@checker("07.1 time_step")
def check_time_step(time_step):
    """``time_step(step_fn, *, warmup, repeats, sync, clock)`` must return seconds per call, honestly timed."""
    for warmup, repeats, costs in SCENARIOS:
        device, result = _run_scenario(time_step, warmup, repeats, costs)
        problem = _judge(device, result, warmup, repeats)
        if problem:
            stop(problem)
    return passed(
        "Warm-up untimed, sync() before each clock reading that ends a call, one time per call in seconds, and "
        f"nothing else inside the timed region — right on all {len(SCENARIOS)} simulated-device scenarios."
    )

