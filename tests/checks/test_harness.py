"""The checker harness: results, learner-code calls that never raise, strict mode, progress recording."""

import json

import pytest

from amp_lessons.checks.harness import NOT_DONE, CheckResult, call_learner, checker, failed, passed


@checker("demo exercise")
def check_double(fn):
    got = call_learner(fn, 3)
    if got != 6:
        return failed(f"double(3) returned {got!r}, expected 6")
    return passed("double works")


def double(x):
    return 2 * x


def stub(x):
    raise NotImplementedError("Exercise: replace this line with your code")


def test_pass_and_render():
    result = check_double(double)
    assert result.passed and result.status == "passed" and result.exercise == "demo exercise"
    assert "[PASS]" in str(result) and "✅" in result._repr_html_()


def test_not_done_yet():
    result = check_double(stub)
    assert not result.passed and result.status == NOT_DONE
    assert "Not done yet" in result.message and "NotImplementedError" in result.message


def test_wrong_answer_names_it():
    result = check_double(lambda x: x + 2 if x != 3 else 7)
    assert not result.passed and "returned 7" in result.message


@pytest.mark.parametrize(
    "junk, expected",
    [
        (None, "got None"),
        ("double", "got a str"),
        (42, "got a int"),
        (lambda: 1, "signature"),
        (lambda x, y: 1, "signature"),
    ],
)
def test_junk_never_raises(junk, expected):
    result = check_double(junk)
    assert not result.passed and expected in result.message


def test_exception_in_learner_code_points_at_the_line():
    def broken(x):
        values = [1, 2]
        return values[x]

    result = check_double(broken)
    assert not result.passed
    assert "IndexError" in result.message and "values[x]" in result.message


def test_checker_bug_is_reported_not_raised():
    @checker("buggy")
    def check_buggy(fn):
        return 1 / 0

    result = check_buggy(double)
    assert not result.passed and result.status == "checker error" and "bug in the course" in result.message


def test_strict_mode_raises_on_failure(strict):
    assert check_double(double).passed
    with pytest.raises(AssertionError, match="STRICT"):
        check_double(stub)


def test_strict_not_done_mode(monkeypatch):
    monkeypatch.setenv("AMP_LESSONS_STRICT", "not-done")
    assert check_double(stub).status == NOT_DONE
    with pytest.raises(AssertionError, match="untouched exercise"):
        check_double(double)


def test_results_are_recorded(private_progress):
    check_double(stub)
    check_double(double)
    check_double(stub)
    record = json.loads(private_progress.read_text())["exercises"]["demo exercise"]
    assert record["attempts"] == 3 and record["passed"] is True and record["last_status"] == NOT_DONE


def test_check_result_bool_and_text():
    assert not CheckResult(False, "x")
    assert CheckResult(True, "fine").status == "passed"


# ------------------------------------------------------------------ budget, calling mistakes, kernel state


@checker("demo slow exercise")
def check_calls_twice(fn):
    for _ in range(2):
        call_learner(fn, 2)
    return passed("fine")


def test_a_slow_answer_is_stopped_with_a_message(monkeypatch):
    import time

    monkeypatch.setenv("AMP_LESSONS_CHECK_BUDGET", "0.5")

    def slow(x):
        try:
            time.sleep(5)
        except Exception:  # a learner's broad except must not swallow the stop
            pass
        return x

    started = time.perf_counter()
    result = check_calls_twice(slow)
    assert time.perf_counter() - started < 2
    assert not result.passed and "stopped after 0.5 s" in result.message and "too slow" in result.message


def test_calling_a_check_with_a_missing_argument_says_how_to_call_it():
    result = check_calls_twice()
    assert not result.passed and result.status == "failed"
    assert "bug in the course" not in result.message and "check_calls_twice(fn)" in result.message


def test_the_kernel_is_left_as_found():
    import torch

    def leaves_state_behind(x):
        torch.autocast("cpu", dtype=torch.bfloat16).__enter__()
        torch.set_grad_enabled(False)
        torch.set_default_dtype(torch.float64)
        return x

    check_calls_twice(leaves_state_behind)
    assert not torch.is_autocast_enabled("cpu")
    assert torch.is_grad_enabled() and torch.get_default_dtype() == torch.float32


def _bare_cpu_autocast_dtype():
    """The dtype a matmul comes out in under a bare ``torch.autocast("cpu")`` (no dtype given)."""
    import torch

    with torch.autocast("cpu"):
        return (torch.ones(2, 2) @ torch.ones(2, 2)).dtype


def test_an_autocast_entered_and_never_left_leaves_autocast_off_and_its_dtype_as_before():
    import torch

    from amp_lessons.core.autocast_state import autocast_dtype, switch_autocast_off

    before = {device: autocast_dtype(device) for device in ("cpu", "cuda")}

    def enters_autocast_and_never_leaves(x):
        torch.autocast("cpu", dtype=torch.float16).__enter__()
        return x

    try:
        result = check_calls_twice(enters_autocast_and_never_leaves)
        assert result.passed, result.message
        assert not torch.is_autocast_enabled("cpu")
        assert {device: autocast_dtype(device) for device in ("cpu", "cuda")} == before
        assert _bare_cpu_autocast_dtype() == before["cpu"] == torch.bfloat16
    finally:
        switch_autocast_off()


def test_a_dtype_the_kernel_had_chosen_before_the_check_is_kept():
    import torch

    from amp_lessons.core.autocast_state import autocast_dtype, set_autocast_dtype, switch_autocast_off

    def enters_autocast_and_never_leaves(x):
        torch.autocast("cpu", dtype=torch.bfloat16).__enter__()
        return x

    set_autocast_dtype("cpu", torch.float16)  # what the kernel had before the check, whatever set it
    try:
        check_calls_twice(enters_autocast_and_never_leaves)
        assert not torch.is_autocast_enabled("cpu")
        assert autocast_dtype("cpu") == torch.float16  # as found, not the fresh-process default
    finally:
        switch_autocast_off()
    assert autocast_dtype("cpu") == torch.bfloat16


def test_switch_autocast_off_puts_the_default_cpu_dtype_back():
    import torch

    from amp_lessons.core.autocast_state import autocast_dtype, autocast_enabled, switch_autocast_off

    try:
        torch.autocast("cpu", dtype=torch.float16).__enter__()  # never exited
        assert autocast_enabled("cpu") and autocast_dtype("cpu") == torch.float16
    finally:
        switch_autocast_off()
    assert not autocast_enabled("cpu")
    assert autocast_dtype("cpu") == torch.bfloat16
    assert _bare_cpu_autocast_dtype() == torch.bfloat16


def test_nbgrader_feedback_speaks_to_the_learner(monkeypatch):
    monkeypatch.delenv("AMP_LESSONS_STRICT", raising=False)
    monkeypatch.setenv("NBGRADER_EXECUTION", "autograde")
    with pytest.raises(AssertionError, match="scores 0 points") as raised:
        check_double(stub)
    assert "AMP_LESSONS_STRICT" not in str(raised.value)
