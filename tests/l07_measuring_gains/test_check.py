"""Lesson 07's checker: time_step's solution passes, the stub is "not done", each known mistake is named."""

import time

import pytest
import torch
from notebook_code import exercise, solution

from amp_lessons.checks import check_time_step
from amp_lessons.checks.mistakes import first_mistake
from amp_lessons.l07_measuring_gains import check as l07
from amp_lessons.l07_measuring_gains.check import SCENARIOS, FakeDevice

LESSON = "07_measuring_gains.ipynb"


# ----------------------------------------------------------------------------- checker: solution and exercise


def test_solution_passes():
    result = check_time_step(solution(LESSON, "time_step"))
    assert result.passed, result.message


def test_solution_passes_in_strict_mode(strict):
    assert check_time_step(solution(LESSON, "time_step")).passed


def test_untouched_exercise_is_not_done():
    result = check_time_step(exercise(LESSON, "time_step"))
    assert result.status == "not done", result.message


def test_checker_is_fast():
    fn = solution(LESSON, "time_step")
    began = time.perf_counter()
    check_time_step(fn)
    # about 0.1 s alone; the budget for a check is 2 s, and a loaded 2-core machine (xdist, the notebook
    # kernels) has taken 0.59 s, so the bound leaves room for that
    assert time.perf_counter() - began < 1.0


# ----------------------------------------------------------------------------- checker: each known mistake


def _step_then_sync(step_fn, sync, i):
    step_fn()
    sync()


def _right(
    step_fn, *, warmup, repeats, sync, clock=time.perf_counter, sync_after_warmup=True, timed=_step_then_sync
):
    """The right answer; ``sync_after_warmup=False`` or another ``timed`` (what runs between the clock
    readings) plants one mistake in it."""
    for _ in range(warmup):
        step_fn()
    if sync_after_warmup:
        sync()
    times = []
    for i in range(repeats):
        start = clock()
        timed(step_fn, sync, i)
        times.append(clock() - start)
    return times


def no_warmup(step_fn, *, warmup, repeats, sync, clock=time.perf_counter):
    return _right(step_fn, warmup=0, repeats=repeats, sync=sync, clock=clock, sync_after_warmup=False)


def no_sync(step_fn, *, warmup, repeats, sync, clock=time.perf_counter):
    return _right(
        step_fn,
        warmup=warmup,
        repeats=repeats,
        sync=sync,
        clock=clock,
        sync_after_warmup=False,
        timed=lambda step_fn, sync, i: step_fn(),
    )


def sync_only_before_start(step_fn, *, warmup, repeats, sync, clock=time.perf_counter):
    for _ in range(warmup):
        step_fn()
    times = []
    for _ in range(repeats):
        sync()
        start = clock()
        step_fn()
        times.append(clock() - start)
    return times


def no_sync_after_warmup(step_fn, *, warmup, repeats, sync, clock=time.perf_counter):
    return _right(step_fn, warmup=warmup, repeats=repeats, sync=sync, clock=clock, sync_after_warmup=False)


def item_inside(step_fn, *, warmup, repeats, sync, clock=time.perf_counter):
    def timed(step_fn, sync, i):
        loss = step_fn()
        loss.item()
        sync()

    return _right(step_fn, warmup=warmup, repeats=repeats, sync=sync, clock=clock, timed=timed)


def isfinite_inside(step_fn, *, warmup, repeats, sync, clock=time.perf_counter):
    def timed(step_fn, sync, i):
        loss = step_fn()
        sync()
        assert torch.isfinite(loss)

    return _right(step_fn, warmup=warmup, repeats=repeats, sync=sync, clock=clock, timed=timed)


def print_inside(step_fn, *, warmup, repeats, sync, clock=time.perf_counter):
    def timed(step_fn, sync, i):
        step_fn()
        sync()
        print("step", i)

    return _right(step_fn, warmup=warmup, repeats=repeats, sync=sync, clock=clock, timed=timed)


def total_number(step_fn, *, warmup, repeats, sync, clock=time.perf_counter):
    for _ in range(warmup):
        step_fn()
    sync()
    start = clock()
    for _ in range(repeats):
        step_fn()
    sync()
    return clock() - start


def total_in_a_list(step_fn, *, warmup, repeats, sync, clock=time.perf_counter):
    return [total_number(step_fn, warmup=warmup, repeats=repeats, sync=sync, clock=clock)]


def same_average(step_fn, *, warmup, repeats, sync, clock=time.perf_counter):
    total = total_number(step_fn, warmup=warmup, repeats=repeats, sync=sync, clock=clock)
    return [total / repeats] * repeats


def median_only(step_fn, *, warmup, repeats, sync, clock=time.perf_counter):
    import statistics

    return statistics.median(_right(step_fn, warmup=warmup, repeats=repeats, sync=sync, clock=clock))


def running_total(step_fn, *, warmup, repeats, sync, clock=time.perf_counter):
    for _ in range(warmup):
        step_fn()
    sync()
    times = []
    start = clock()
    for _ in range(repeats):
        step_fn()
        sync()
        times.append(clock() - start)
    return times


def milliseconds(step_fn, *, warmup, repeats, sync, clock=time.perf_counter):
    return [t * 1000 for t in _right(step_fn, warmup=warmup, repeats=repeats, sync=sync, clock=clock)]


def one_repeat_short(step_fn, *, warmup, repeats, sync, clock=time.perf_counter):
    return _right(step_fn, warmup=warmup, repeats=repeats - 1, sync=sync, clock=clock)


def warmup_in_result(step_fn, *, warmup, repeats, sync, clock=time.perf_counter):
    return _right(step_fn, warmup=0, repeats=warmup + repeats, sync=sync, clock=clock)


def reversed_subtraction(step_fn, *, warmup, repeats, sync, clock=time.perf_counter):
    return [-t for t in _right(step_fn, warmup=warmup, repeats=repeats, sync=sync, clock=clock)]


def ignores_clock(step_fn, *, warmup, repeats, sync, clock=time.perf_counter):
    return _right(step_fn, warmup=warmup, repeats=repeats, sync=sync, clock=time.perf_counter)


def uses_cuda_synchronize(step_fn, *, warmup, repeats, sync, clock=time.perf_counter):
    return _right(step_fn, warmup=warmup, repeats=repeats, sync=torch.cuda.synchronize, clock=clock)


def hard_coded_counts(step_fn, *, warmup, repeats, sync, clock=time.perf_counter):
    return _right(step_fn, warmup=3, repeats=6, sync=sync, clock=clock)


def returns_tensor(step_fn, *, warmup, repeats, sync, clock=time.perf_counter):
    return torch.tensor(_right(step_fn, warmup=warmup, repeats=repeats, sync=sync, clock=clock))


def forgets_return(step_fn, *, warmup, repeats, sync, clock=time.perf_counter):
    _right(step_fn, warmup=warmup, repeats=repeats, sync=sync, clock=clock)


def passes_device_to_sync(step_fn, *, warmup, repeats, sync, clock=time.perf_counter):
    return _right(step_fn, warmup=warmup, repeats=repeats, sync=lambda: sync("cuda"), clock=clock)


WRONG = [
    (no_warmup, "No warm-up"),
    (no_sync, "never call `sync()`"),
    (sync_only_before_start, "BEFORE reading the clock at the end"),
    (no_sync_after_warmup, "leftover warm-up work"),
    (item_inside, "`item`"),
    (isfinite_inside, "`isfinite`"),
    (print_inside, "`print`"),
    (total_number, "TOTAL time"),
    (total_in_a_list, "TOTAL time"),
    (same_average, "same average"),
    (median_only, "MEDIAN"),
    (running_total, "running total"),
    (milliseconds, "milliseconds"),
    (one_repeat_short, "warm-up + repeats"),
    (warmup_in_result, "the warm-up calls are in your list"),
    (reversed_subtraction, "wrong way round"),
    (ignores_clock, "never called `clock()`"),
    (uses_cuda_synchronize, "torch.cuda.synchronize() directly"),
    (hard_coded_counts, "warm-up + repeats"),
    (returns_tensor, "returned a tensor"),
    (forgets_return, "forget `return times`"),
    (passes_device_to_sync, "passed arguments to sync"),
]


@pytest.mark.parametrize("wrong, named", WRONG, ids=[w.__name__ for w, _ in WRONG])
def test_wrong_answer_is_named(wrong, named):
    result = check_time_step(wrong)
    assert not result.passed
    assert result.status == "failed"
    assert named in result.message, result.message


def _raises(step_fn, *, warmup, repeats, sync, clock=time.perf_counter):
    return 1 / 0


def _loops_forever(step_fn, *, warmup, repeats, sync, clock=time.perf_counter):
    while True:
        step_fn()


def _nan(step_fn, *, warmup, repeats, sync, clock=time.perf_counter):
    clock()
    return [float("nan")] * repeats


def _strings(step_fn, *, warmup, repeats, sync, clock=time.perf_counter):
    return ["0.01"] * repeats


def _dict(step_fn, *, warmup, repeats, sync, clock=time.perf_counter):
    return {"median": 0.01}


def _bools(step_fn, *, warmup, repeats, sync, clock=time.perf_counter):
    return [True] * repeats


def _nested(step_fn, *, warmup, repeats, sync, clock=time.perf_counter):
    return [[0.01]] * repeats


JUNK = [
    None,
    "time_step",
    42,
    lambda: None,
    lambda a: a,
    _raises,
    _loops_forever,
    _nan,
    _strings,
    _dict,
    _bools,
    _nested,
    print,
]


@pytest.mark.parametrize("junk", JUNK, ids=range(len(JUNK)))
def test_junk_never_raises(junk):
    result = check_time_step(junk)
    assert not result.passed
    assert result.status in ("failed", "not done")
    assert result.message


def test_junk_messages_are_specific():
    assert "None" in check_time_step(None).message
    assert "ZeroDivisionError" in check_time_step(_raises).message
    assert "more than" in check_time_step(_loops_forever).message
    assert "NaN" in check_time_step(_nan).message
    assert "str" in check_time_step(_strings).message


def test_checker_restores_torch_cuda_synchronize():
    original = torch.cuda.synchronize
    check_time_step(uses_cuda_synchronize)
    check_time_step(_raises)
    assert torch.cuda.synchronize is original


# ----------------------------------------------------------------------------- the simulated device


def test_fake_device_is_asynchronous():
    device = FakeDevice([0.5, 0.1])
    device.step()
    assert device.clock() < 0.01  # the call returned before the work finished
    device.sync()
    assert device.clock() == pytest.approx(0.5, abs=1e-5)
    start = device.clock()
    device.step()
    device.sync()
    assert device.clock() - start == pytest.approx(0.1, abs=1e-5)


def test_the_timing_spy_reports_ops_prints_and_syncs_and_restores_everything():
    """07.1's recorder (``spies.TimingSpy``, importable in a grading kernel) reports to the device and judges
    nothing; on exit print and torch.cuda.synchronize are the caller's again."""
    import sys

    from amp_lessons.l07_measuring_gains.spies import TimingSpy

    device, stdout, synchronize = FakeDevice([0.01]), sys.stdout, torch.cuda.synchronize
    with TimingSpy(device.diagnostic, device.cuda_synchronize):
        loss = device.step()
        loss.item()
        print("loss")
        torch.cuda.synchronize()
    assert [e for e in device.events if e[0] != "step"] == [
        ("diag", "item"),
        ("diag", "print"),
        ("cuda-sync",),
    ]
    assert sys.stdout is stdout and torch.cuda.synchronize is synchronize


def test_scenarios_have_slow_first_calls():
    for warmup, _repeats, costs in SCENARIOS:
        if warmup:
            assert costs[0] > 2 * costs[warmup]


# ------------------------------------------------------------------------------- the rule tables, one by one


def step_with_argument(step_fn, *, warmup, repeats, sync, clock=time.perf_counter):
    return _right(lambda: step_fn(0), warmup=warmup, repeats=repeats, sync=sync, clock=clock)


def drops_last_time(step_fn, *, warmup, repeats, sync, clock=time.perf_counter):
    return _right(step_fn, warmup=warmup, repeats=repeats, sync=sync, clock=clock)[:-1]


def doubled(step_fn, *, warmup, repeats, sync, clock=time.perf_counter):
    return [2 * t for t in _right(step_fn, warmup=warmup, repeats=repeats, sync=sync, clock=clock)]


def step_fn_never_called(step_fn, *, warmup, repeats, sync, clock=time.perf_counter):
    return _right(lambda: None, warmup=warmup, repeats=repeats, sync=sync, clock=clock)


def microseconds(step_fn, *, warmup, repeats, sync, clock=time.perf_counter):
    return [t * 1e6 for t in _right(step_fn, warmup=warmup, repeats=repeats, sync=sync, clock=clock)]


def _times_then(change):
    """The right answer's times, changed afterwards by ``change(times, repeats)``."""

    def time_step(step_fn, *, warmup, repeats, sync, clock=time.perf_counter):
        times = _right(step_fn, warmup=warmup, repeats=repeats, sync=sync, clock=clock)
        return change(times, repeats)

    return time_step


def sync_before_the_step(step_fn, *, warmup, repeats, sync, clock=time.perf_counter):
    def timed(step_fn, sync, i):
        sync()
        step_fn()

    return _right(step_fn, warmup=warmup, repeats=repeats, sync=sync, clock=clock, timed=timed)


def clock_readings(step_fn, *, warmup, repeats, sync, clock=time.perf_counter):
    for _ in range(warmup):
        step_fn()
    sync()
    readings = []
    for _ in range(repeats):
        step_fn()
        sync()
        readings.append(clock())
    return readings


def timing_run(time_step):
    warmup, repeats, costs = SCENARIOS[0]
    device, result = l07._run_scenario(time_step, warmup, repeats, costs)
    return l07.TimingRun(device, result, warmup, repeats)


RESULT_AND_USAGE_RULE_CASES = {
    "one number": total_number,
    "a tensor": returns_tensor,
    "not a list": forgets_return,
    "an entry that is not a number": _strings,
    "called torch.cuda.synchronize": uses_cuda_synchronize,
    "arguments to step_fn": step_with_argument,
    "arguments to sync": passes_device_to_sync,
    "never read the clock": ignores_clock,
    "NaN or infinity": _nan,
    "negative times": reversed_subtraction,
    "never called step_fn": step_fn_never_called,
    "no warm-up": no_warmup,
    "a wrong number of calls": one_repeat_short,
    "warm-up calls in the list": warmup_in_result,
    "one number in a list": total_in_a_list,
    "a wrong number of times": drops_last_time,
    "diagnostics in the timed region": item_inside,
    "never synced": no_sync,
}


@pytest.mark.parametrize("name", RESULT_AND_USAGE_RULE_CASES)
def test_each_result_and_usage_rule_recognises_its_case(name):
    run = timing_run(RESULT_AND_USAGE_RULE_CASES[name])
    rule = first_mistake(l07.RESULT_MISTAKES + l07.USAGE_MISTAKES, run)
    assert rule is not None and rule.name == name and rule.text(run)
    right = timing_run(solution(LESSON, "time_step"))
    assert first_mistake(l07.RESULT_MISTAKES + l07.USAGE_MISTAKES, right) is None
    assert l07._all_close(right.values, right.expected)
    names = {rule.name for rule in l07.RESULT_MISTAKES + l07.USAGE_MISTAKES}
    assert set(RESULT_AND_USAGE_RULE_CASES) == names


VALUE_RULE_CASES = {
    "milliseconds": milliseconds,
    "another unit": microseconds,
    "a running total": running_total,
    "the same average": same_average,
    "the clock stopped before the device finished": sync_only_before_start,
    "leftover warm-up work": no_sync_after_warmup,
    "rounded": _times_then(lambda times, n: [round(t, 2) for t in times]),
    "divided by repeats": _times_then(lambda times, n: [t / n for t in times]),
    "clock readings": clock_readings,
    "shifted by one call": sync_before_the_step,
    "in another order": _times_then(lambda times, n: sorted(times)),
    "times that match nothing known": doubled,
}


@pytest.mark.parametrize("name", VALUE_RULE_CASES)
def test_each_value_rule_recognises_its_case(name):
    run = timing_run(VALUE_RULE_CASES[name])
    assert first_mistake(l07.RESULT_MISTAKES + l07.USAGE_MISTAKES, run) is None
    assert not l07._all_close(run.values, run.expected)
    rule = first_mistake(l07.VALUE_MISTAKES, run)
    assert rule is not None and rule.name == name and rule.text(run)
    assert set(VALUE_RULE_CASES) == {rule.name for rule in l07.VALUE_MISTAKES}


@pytest.mark.parametrize(
    "value, name", [(9.0, "the total"), (3.0, "the average"), (2.0, "the median"), (5.0, "a single number")]
)
def test_each_single_number_rule_recognises_its_case(value, name):
    expected = [1.0, 2.0, 6.0]  # total 9, mean 3, median 2
    rule = first_mistake(l07.SINGLE_NUMBER_MISTAKES, value, expected)
    assert rule.name == name and rule.text(value, expected)
