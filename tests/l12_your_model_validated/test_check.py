"""Lesson 12's checker: criteria_from_reference's solution passes, the stub is "not done", each mistake is named."""

import dataclasses
import math
import time

import pytest
from notebook_code import exercise, solution

from amp_lessons.checks import check_criteria_from_reference
from amp_lessons.l04_baseline_and_decision_boundary import Criteria
from amp_lessons.l12_your_model_validated import check as l12

LESSON = "12_your_model_validated.ipynb"


def test_solution_passes():
    result = check_criteria_from_reference(solution(LESSON, "criteria_from_reference"))
    assert result.passed, result.message


def test_solution_passes_in_strict_mode(strict):
    assert check_criteria_from_reference(solution(LESSON, "criteria_from_reference")).passed


def test_untouched_exercise_is_not_done():
    result = check_criteria_from_reference(exercise(LESSON, "criteria_from_reference"))
    assert result.status == "not done", result.message


def test_checker_is_fast():
    fn = solution(LESSON, "criteria_from_reference")
    began = time.perf_counter()
    check_criteria_from_reference(fn)
    assert time.perf_counter() - began < 2


# ------------------------------------------------------------------------- correct answers unlike the solution

BASE = Criteria(atol=0.02, rtol=0.01, application="digits on forms; a changed reading goes to review")


def replaced(reference):
    return dataclasses.replace(
        BASE,
        min_quality=round(reference["quality"] - 0.005, 6),
        allowed_decision_changes=math.floor(reference["samples"] / 100),
    )


def from_noise(reference):
    atol = max(1e-3, 20 * reference["noise_floor"])
    return Criteria(
        atol,
        0.01,
        reference["quality"],
        "fail",
        "lowest_index",
        0.0,
        int(reference["samples"] * 0.01),
        "form digits",
    )


def abstaining(reference):
    top = reference["max_abs_score"]
    return Criteria(
        atol=0.0,
        rtol=0.04,
        min_quality=max(reference["quality"] - 0.01, 0.0),
        tie_rule="abstain",
        tie_tolerance=0.01 * top,
        allowed_decision_changes=reference["samples"] // 100,
        application="read digits; unsure readings and changed readings both go to a person",
    )


@pytest.mark.parametrize("answer", [replaced, from_noise, abstaining])
def test_correct_answers_written_differently_pass(answer):
    result = check_criteria_from_reference(answer)
    assert result.passed, result.message


# ------------------------------------------------------------------------------------- each known mistake


def right(reference, **changes):
    values = dict(
        atol=0.01,
        rtol=0.02,
        min_quality=reference["quality"] - 0.01,
        allowed_decision_changes=reference["samples"] // 100,
        application="read digits on forms",
    )
    values.update(changes)
    return Criteria(**values)


WRONG = {
    "returned None": (lambda r: None, "returned None"),
    "not a Criteria": (lambda r: {"atol": 0.01}, "it returned a dict"),
    "no minimum quality": (lambda r: right(r, min_quality=None), "min_quality is None"),
    "a fixed minimum quality": (lambda r: right(r, min_quality=0.9), "for every reference"),
    "minimum above the reference": (
        lambda r: right(r, min_quality=min(1.0, r["quality"] + 0.005)),
        "even the FP32 reference fails",
    ),
    "minimum too far below": (lambda r: right(r, min_quality=r["quality"] - 0.05), "more than one"),
    "non-finite outputs allowed": (lambda r: right(r, nonfinite="allow"), "nonfinite='allow'"),
    "no decision change allowed": (lambda r: right(r, allowed_decision_changes=0), "review team reads 1 %"),
    "another number of changes": (
        lambda r: right(r, allowed_decision_changes=round(r["samples"] / 100 + 0.4)),
        "rounded down",
    ),
    "tolerance within FP32's noise": (lambda r: right(r, atol=0.0, rtol=0.0), "FP32 itself could fail"),
    "tolerance too loose": (lambda r: right(r, atol=1.0, rtol=0.05), "more than 5 %"),
    "no application": (lambda r: right(r, application=" "), "application is empty"),
}


@pytest.mark.parametrize("name", list(WRONG))
def test_each_wrong_answer_is_named(name):
    answer, words = WRONG[name]
    result = check_criteria_from_reference(answer)
    assert not result.passed and words in result.message, result.message
    seen = [(r, answer(dict(r))) for r in l12.REFERENCES]
    from amp_lessons.checks.mistakes import first_mistake

    assert first_mistake(l12.RULES, seen).name == name


def test_every_rule_has_a_wrong_answer():
    assert sorted(rule.name for rule in l12.RULES) == sorted(WRONG)


@pytest.mark.parametrize(
    "junk", [None, "criteria", 3, lambda: None, lambda r: 1 / 0, lambda r: right(r, min_quality=float("nan"))]
)
def test_junk_never_raises(junk):
    result = check_criteria_from_reference(junk)
    assert not result.passed and result.message
