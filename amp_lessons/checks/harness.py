"""The harness every exercise checker is built on (learners import the checks from ``amp_lessons.checks``).

A checker exists to tell a learner *which* mistake they made, so the harness guarantees three things:
- a checker never raises for a learner mistake (a missing body, an exception inside learner code, a
  wrong signature, junk return values): it returns a failed ``CheckResult`` that says what happened;
- every result is recorded in the learner's local progress file (see ``amp_lessons.core.record``);
- ``AMP_LESSONS_STRICT`` turns results into assertions so that a notebook run in CI fails loudly:
  ``1`` raises on any result that did not pass (used on lessons and solutions), ``not-done`` raises
  on any result that is not "not done yet" (used on the generated exercises, which must still be
  untouched stubs).

Writing a checker::

    @checker("01.1 stored value")
    def check_stored_value(fn):
        got = call_learner(fn, 1.0, torch.float16)   # returns fn's value, or stops the check with a message
        if got != 1.0:
            return failed("...names the mistake...")
        return passed("...")
"""

from __future__ import annotations

import contextlib
import functools
import html
import inspect
import math
import numbers
import os
import signal
import sys
import threading
import traceback
from dataclasses import dataclass, field

import torch

from amp_lessons.checks import registry
from amp_lessons.core import record
from amp_lessons.core.autocast_state import (
    autocast_dtype,
    autocast_enabled,
    set_autocast_dtype,
    switch_autocast_off,
)

PASSED = "passed"
FAILED = "failed"
NOT_DONE = "not done"
CHECKER_BUG = "checker error"

_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_demonstrating = False
# A reasonable answer is checked in well under 2 s; a check that runs longer than this is stopped with a
# message (element-by-element Python loops over tensors are the usual cause). AMP_LESSONS_CHECK_BUDGET
# overrides it.
CHECK_BUDGET_S = 20.0


@dataclass
class CheckResult:
    """The verdict of one check: ``passed``, a ``message`` that names the mistake, and details."""

    passed: bool
    message: str
    status: str = ""
    exercise: str = ""
    details: list = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.status:
            self.status = PASSED if self.passed else FAILED

    def __bool__(self) -> bool:
        return bool(self.passed)

    @property
    def title(self) -> str:
        label = {
            PASSED: "Passed",
            FAILED: "Not yet right",
            NOT_DONE: "Not done yet",
            CHECKER_BUG: "Checker error",
        }
        head = label.get(self.status, self.status)
        return f"{head} — {self.exercise}" if self.exercise else head

    def __str__(self) -> str:
        mark = {PASSED: "[PASS]", NOT_DONE: "[TODO]"}.get(self.status, "[FAIL]")
        lines = [f"{mark} {self.title}", self.message]
        lines += [f"  - {d}" for d in self.details]
        return "\n".join(lines)

    def __repr__(self) -> str:
        return str(self)

    def _repr_html_(self) -> str:
        colours = {PASSED: ("#e8f5e9", "#2e7d32"), NOT_DONE: ("#fff8e1", "#f9a825")}
        background, border = colours.get(self.status, ("#ffebee", "#c62828"))
        icon = {PASSED: "✅", NOT_DONE: "✏️"}.get(self.status, "❌")
        details = "".join(f"<li><code>{html.escape(str(d))}</code></li>" for d in self.details)
        details = f"<ul style='margin:4px 0'>{details}</ul>" if details else ""
        message = html.escape(self.message).replace("\n", "<br>")
        return (
            f"<div style='background:{background};border-left:6px solid {border};padding:8px 12px;"
            f"margin:4px 0;border-radius:4px'><b>{icon} {html.escape(self.title)}</b>"
            f"<div style='margin-top:4px'>{message}</div>{details}</div>"
        )


def passed(message: str, details: list | None = None) -> CheckResult:
    return CheckResult(True, message, PASSED, details=list(details or []))


def failed(message: str, details: list | None = None) -> CheckResult:
    return CheckResult(False, message, FAILED, details=list(details or []))


def not_done(what: str = "your function") -> CheckResult:
    return CheckResult(
        False,
        f"Not done yet: {what} still raises NotImplementedError. Replace the `raise NotImplementedError` "
        "line with your code, run that cell, then run this check again.",
        NOT_DONE,
    )


class LearnerProblem(Exception):
    """Stops a check early with a ready-made result (raised by ``call_learner`` and ``stop``)."""

    def __init__(self, result: CheckResult):
        super().__init__(result.message)
        self.result = result


class GradingProblem(BaseException):
    """Raised by the grader's stand-in for a learner function when grading itself broke (never by learner
    code): ``call_learner`` lets it through, so the check reports a checker error, not a learner mistake."""


class CheckTimeout(BaseException):
    """Raised inside learner code when a check runs past its time budget.

    A BaseException, so a learner's ``except Exception`` cannot swallow it.
    """


def stop(message: str, details: list | None = None) -> None:
    """End the check now with a failed result (for use deep inside a checker)."""
    raise LearnerProblem(failed(message, details))


def _learner_location(tb) -> str:
    """Point at the last line of *learner* code in a traceback (not torch's, not ours)."""
    best = ""
    for frame in traceback.extract_tb(tb):
        filename = os.path.abspath(frame.filename)
        if filename.startswith(_PACKAGE_DIR) or "site-packages" in filename or "/lib/python" in filename:
            continue
        code = (frame.line or "").strip()
        where = f"line {frame.lineno} of {frame.name}()"
        best = f"{where}: `{code}`" if code else where
    return best


def describe_exception(exc: BaseException) -> str:
    remote = getattr(exc, "remote_description", "")
    if remote:  # raised in the learner's sandboxed kernel while grading: described there, the same way
        return str(remote)
    text = str(exc).strip().splitlines()
    first = text[0] if text else ""
    location = _learner_location(exc.__traceback__)
    message = f"{type(exc).__name__}: {first}" if first else type(exc).__name__
    return f"{message} (at {location})" if location else message


def call_learner(fn, *args, what: str | None = None, **kwargs):
    """Call learner code; on any learner-side problem stop the check with a message saying what happened."""
    name = what or f"`{getattr(fn, '__name__', 'your function')}`"
    if fn is None:
        raise LearnerProblem(
            failed("Expected a function but got None. Pass the function itself, e.g. check(my_function).")
        )
    if not callable(fn):
        raise LearnerProblem(
            failed(
                f"Expected a function but got a {type(fn).__name__}. "
                "Pass the function itself, without calling it."
            )
        )
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):
        signature = None
    if signature is not None:
        try:
            signature.bind(*args, **kwargs)
        except TypeError as exc:
            raise LearnerProblem(
                failed(
                    f"{name} has the signature {name.strip('`')}{signature}, which cannot be called "
                    f"the way the exercise describes ({exc}). Keep the parameter names and order given "
                    "in the exercise."
                )
            ) from None
    try:
        return fn(*args, **kwargs)
    except NotImplementedError:
        raise LearnerProblem(not_done(name)) from None
    except (LearnerProblem, CheckTimeout, GradingProblem, KeyboardInterrupt, SystemExit):
        raise
    except BaseException as exc:
        raise LearnerProblem(failed(f"{name} raised an error: {describe_exception(exc)}")) from None


def run_beside_learner(fn, helper, *args, **kwargs):
    """``helper(fn, *args, **kwargs)`` run in the process where the learner's function ``fn`` lives.

    In a notebook that is this process. When a class is graded, ``fn`` lives in the sandboxed kernel and the
    checker in the judge (``amp_lessons.tools.grade``): the helper then runs in the kernel, so it must be a
    function of a lesson's ``spies.py`` (the kernel cannot import a checker), must hold no reference value,
    and must return plain data (numbers, strings, tensors, lists and dicts of them) that the checker judges.
    What it returns is the learner process's report: judge it as a claim that must equal a correct
    computation, never as a verdict.
    """
    beside = getattr(fn, "run_beside", None)  # the judge's stand-in for a function living in the kernel
    if callable(beside):
        return beside(helper, *args, **kwargs)
    return helper(fn, *args, **kwargs)


def as_number(value, what: str, hint: str = "return a number") -> float:
    """The learner's value as a Python float, or stop the check with a message naming what came back instead.

    A one-element tensor, a NumPy scalar, an int or a float all count; a bool, a string, ``None`` or a tensor
    with several elements do not (``True`` would silently read as 1.0). ``what`` names the value in the
    message (e.g. "`stored_value(0.1, FLOAT16)` returned"), ``hint`` says what to return instead.
    """
    if hasattr(value, "item") and callable(value.item) and not isinstance(value, (bool, int, float)):
        count = value.numel() if hasattr(value, "numel") else getattr(value, "size", 1)
        if count != 1:
            stop(f"{what} a tensor with {count} elements; {hint} (one value: use .item()).")
        value = value.item()
    shown = repr(value) if len(repr(value)) < 60 else repr(value)[:57] + "..."
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        stop(f"{what} a {type(value).__name__} ({shown}); {hint}.")
    try:
        return float(value)
    except (OverflowError, ValueError, TypeError):
        stop(f"{what} {shown}, which is not a float (too large?); {hint}.")
    return math.nan  # unreachable: stop() raises


def strict_mode() -> str:
    """'' (off), '1' (raise unless passed) or 'not-done' (raise unless not done yet).

    While nbgrader runs a notebook (it sets ``NBGRADER_EXECUTION``) the default is '1': nbgrader scores a
    graded check cell by whether it raised, so a check that did not pass must raise to lose its points.
    """
    configured = os.environ.get("AMP_LESSONS_STRICT")
    if configured is None and os.environ.get("NBGRADER_EXECUTION") in ("autograde", "validate"):
        return "1"
    return (configured or "").strip().lower()


@contextlib.contextmanager
def demonstration():
    """Run checks on purpose-made wrong answers in a lesson: results are shown, not recorded or enforced."""
    global _demonstrating
    previous, _demonstrating = _demonstrating, True
    try:
        yield
    finally:
        _demonstrating = previous


def _apply_strict(result: CheckResult) -> None:
    if _demonstrating:
        return
    mode = strict_mode()
    if mode in ("1", "true", "yes") and not result.passed:
        if os.environ.get("NBGRADER_EXECUTION"):  # the learner reads this in nbgrader's feedback
            raise AssertionError(f"This check did not pass, so it scores 0 points:\n{result}")
        raise AssertionError(f"AMP_LESSONS_STRICT=1 and a check did not pass:\n{result}")
    if mode == "not-done" and result.status != NOT_DONE:
        raise AssertionError(
            f"AMP_LESSONS_STRICT=not-done expects an untouched exercise, but the check said:\n{result}"
        )


def check_budget() -> float:
    try:
        return float(os.environ.get("AMP_LESSONS_CHECK_BUDGET", CHECK_BUDGET_S))
    except ValueError:
        return CHECK_BUDGET_S


@contextlib.contextmanager
def time_budget(seconds: float):
    """Raise ``CheckTimeout`` in this thread after ``seconds`` (Unix main thread only; elsewhere no limit)."""
    usable = (
        seconds > 0
        and hasattr(signal, "setitimer")
        and threading.current_thread() is threading.main_thread()
        and signal.getitimer(signal.ITIMER_REAL)[0] == 0
    )
    if not usable:
        yield
        return

    def out_of_time(signum, frame):
        raise CheckTimeout()

    previous = signal.signal(signal.SIGALRM, out_of_time)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


@contextlib.contextmanager
def kernel_left_as_found():
    """Whatever the learner's code did to global torch state, the kernel leaves the check as it came in.

    A learner function that enters autocast and never leaves, switches gradients off or changes the default
    dtype would otherwise contaminate every later cell (and autocast's cache would keep stale weight copies).
    """
    grad_enabled, default_dtype, folder = torch.is_grad_enabled(), torch.get_default_dtype(), os.getcwd()
    autocast_before = {device: autocast_enabled(device) for device in ("cpu", "cuda")}
    # An autocast entered and never left also leaves its dtype behind: a later bare torch.autocast("cpu")
    # would then run in that dtype instead of the device's default.
    dtypes_before = {device: autocast_dtype(device) for device in ("cpu", "cuda")}
    try:
        yield
    finally:
        if any(autocast_enabled(device) and not was_on for device, was_on in autocast_before.items()):
            switch_autocast_off()
        for device, dtype in dtypes_before.items():
            if autocast_dtype(device) != dtype:
                set_autocast_dtype(device, dtype)
        torch.set_grad_enabled(grad_enabled)
        torch.set_default_dtype(default_dtype)
        if os.getcwd() != folder:
            with contextlib.suppress(OSError):
                os.chdir(folder)


def _wrong_call(check, args, kwargs) -> CheckResult | None:
    """A check called with missing or extra arguments: say how to call it.

    That is a learner's slip, not a course bug, so the message must not blame the course.
    """
    try:
        inspect.signature(check).bind(*args, **kwargs)
    except TypeError as exc:
        parameters = ", ".join(inspect.signature(check).parameters)
        return failed(
            f"{check.__name__} takes ({parameters}) and was called with {len(args) + len(kwargs)} "
            f"argument(s) ({exc}). Pass your function(s) by name, e.g. "
            f"{check.__name__}({parameters})."
        )
    return None


def _run_check(check, args, kwargs) -> CheckResult:
    budget = check_budget()
    try:
        wrong_call = _wrong_call(check, args, kwargs)
        if wrong_call is not None:  # (a failed CheckResult is falsy, so no `or` here)
            return wrong_call
        with kernel_left_as_found(), time_budget(budget):
            return check(*args, **kwargs)
    except LearnerProblem as problem:
        return problem.result
    except CheckTimeout:
        return failed(
            f"The check stopped after {budget:g} s: your function is far too slow (a reasonable answer is "
            "checked in under 2 s). Look for a Python loop over every element of a tensor and use one tensor "
            "operation instead."
        )
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException as exc:
        return CheckResult(
            False,
            "The checker itself failed while judging your answer "
            f"({type(exc).__name__}: {exc}). That is a bug in the course, not in your work: "
            "please report it with this message.",
            CHECKER_BUG,
        )


def checker(exercise: str):
    """Turn a function that returns a ``CheckResult`` into a learner-facing check.

    The wrapped check never raises for learner mistakes, stops after the time budget, leaves the kernel's
    torch state as it found it, labels its result with ``exercise``, records it in the progress file and
    applies strict mode.
    """

    def wrap(check):
        @functools.wraps(check)
        def run(*args, **kwargs):
            result = _run_check(check, args, kwargs)
            if not isinstance(result, CheckResult):
                result = CheckResult(
                    False,
                    f"The checker returned {result!r} instead of a CheckResult (a course bug).",
                    CHECKER_BUG,
                )
            result.exercise = exercise
            _record(result)
            _apply_strict(result)
            return result

        run.exercise = exercise
        registry.register(exercise, run)
        return run

    return wrap


def _record(result: CheckResult) -> None:
    if _demonstrating:
        return
    try:
        record.record(result.exercise, result.passed, result.status, result.message)
    except Exception as exc:  # progress is a convenience: it must never break a check
        print(f"(progress not saved: {exc})", file=sys.stderr)
    try:  # AMP_LESSONS_RESULTS_FILE: a results file for scripts; graders judge outside the kernel (docs/grading.md)
        record.report_to_grader(result.exercise, result.passed, result.status, result.message)
    except Exception as exc:
        print(f"(grader not told: {exc})", file=sys.stderr)
