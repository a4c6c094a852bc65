"""Lesson 12's exercise checker: 12.1, criteria written from the FP32 reference alone, before any trial.

The learner writes ``criteria_from_reference(reference)``: ``reference`` is the ``"reference"`` section of a
report.json (``samples``, ``quality``, ``noise_floor``, ``max_abs_score``) and the result is the
:class:`~amp_lessons.l04_baseline_and_decision_boundary.Criteria` for the digits form reader. The check calls it on
several references (so a number copied from one report shows), and reads each returned ``Criteria``: the
minimum quality at most one point below the reference's (never above it), 1 % of the samples allowed to change
decision (rounded down: the review team's capacity), non-finite outputs failing, a tolerance at the largest score
above FP32's own noise and at most 5 % of that score, and an application in words.
"""

from __future__ import annotations

import math

from amp_lessons.checks.harness import call_learner, checker, failed, passed
from amp_lessons.checks.mistakes import first_mistake, rule
from amp_lessons.l04_baseline_and_decision_boundary.criteria import Criteria

REFERENCES = (
    {"samples": 360, "quality": 0.9889, "noise_floor": 0.0, "max_abs_score": 21.6},
    {"samples": 1000, "quality": 0.93, "noise_floor": 1e-3, "max_abs_score": 8.0},
    {"samples": 250, "quality": 0.97, "noise_floor": 1e-5, "max_abs_score": 40.0},
)
NOISE_MARGIN = 10  # the tolerance must exceed FP32's own noise this many times over
LOOSEST = 0.05  # ... and be at most this fraction of the largest score

__all__ = ["REFERENCES", "RULES", "check_criteria_from_reference"]


def tolerance_at_top(criteria: Criteria, reference: dict) -> float:
    """How far the largest score may move under ``criteria``: ``atol + rtol * max_abs_score``."""
    return criteria.atol + criteria.rtol * reference["max_abs_score"]


def allowed_changes(reference: dict) -> int:
    return int(reference["samples"] // 100)


# Each rule reads ``seen``: a list of (reference, what the learner returned for it), in REFERENCES order.


@rule("returned None", "criteria_from_reference returned None: end it with `return Criteria(...)`.")
def returned_none(seen) -> bool:
    return any(got is None for _, got in seen)


@rule(
    "not a Criteria",
    lambda seen: (
        "criteria_from_reference must return an amp_lessons.l04_baseline_and_decision_boundary.Criteria; "
        f"it returned a {type(next(g for _, g in seen if not isinstance(g, Criteria))).__name__}."
    ),
)
def not_a_criteria(seen) -> bool:
    return any(not isinstance(got, Criteria) for _, got in seen)


@rule(
    "no minimum quality",
    "min_quality is None: a trial that loses accuracy would pass. Set it from the reference's quality, at most "
    "one percentage point (0.01) below it.",
)
def no_minimum_quality(seen) -> bool:
    return any(got.min_quality is None for _, got in seen)


@rule(
    "a fixed minimum quality",
    lambda seen: (
        f"min_quality is {seen[0][1].min_quality} for every reference, whatever its quality "
        f"({', '.join(format(r['quality'], '.1%') for r, _ in seen)}): it must follow the reference, e.g. "
        "reference['quality'] - 0.01."
    ),
)
def fixed_minimum_quality(seen) -> bool:
    values = {got.min_quality for _, got in seen}
    return len(values) == 1 and len({r["quality"] for r, _ in seen}) > 1


@rule(
    "minimum above the reference",
    lambda seen: (
        "For a reference of quality {q:.2%} min_quality is {m:.2%}: even the FP32 reference fails that, "
        "so no trial can pass. The minimum is at most the reference's quality.".format(
            **_first(seen, lambda r, g: g.min_quality > r["quality"] + 1e-9)
        )
    ),
)
def minimum_above_reference(seen) -> bool:
    return any(got.min_quality > ref["quality"] + 1e-9 for ref, got in seen)


@rule(
    "minimum too far below",
    lambda seen: (
        "For a reference of quality {q:.2%} min_quality is {m:.2%}: a trial could lose more than one "
        "percentage point and pass. Keep it within 0.01 of the reference.".format(
            **_first(seen, lambda r, g: g.min_quality < r["quality"] - 0.01 - 1e-9)
        )
    ),
)
def minimum_too_low(seen) -> bool:
    return any(got.min_quality < ref["quality"] - 0.01 - 1e-9 for ref, got in seen)


@rule(
    "non-finite outputs allowed",
    "nonfinite='allow' lets a trial with NaN/inf scores pass: a reading that is NaN is no reading. Use "
    "nonfinite='fail' (the default).",
)
def nonfinite_allowed(seen) -> bool:
    return any(got.nonfinite != "fail" for _, got in seen)


@rule(
    "no decision change allowed",
    "allowed_decision_changes is 0, but the review team reads 1 % of the forms: a trial that changes fewer "
    "readings than that is fine for this application. Allow samples // 100.",
)
def no_changes_allowed(seen) -> bool:
    return all(got.allowed_decision_changes == 0 for _, got in seen)


@rule(
    "another number of changes",
    lambda seen: (
        "For {n} samples allowed_decision_changes is {a}; 1 % of {n}, rounded down (the team cannot "
        "review part of a form), is {want}.".format(
            **_first(seen, lambda r, g: g.allowed_decision_changes != allowed_changes(r))
        )
    ),
)
def another_number_of_changes(seen) -> bool:
    return any(got.allowed_decision_changes != allowed_changes(ref) for ref, got in seen)


@rule(
    "tolerance within FP32's noise",
    lambda seen: (
        "For a reference whose two FP32 passes differ by {noise:g}, the largest score may move by only "
        "{tol:g} (atol + rtol * max_abs_score): FP32 itself could fail that. Make it more than {margin} x the noise "
        "floor, and never 0.".format(**_first(seen, _too_tight))
    ),
)
def tolerance_too_tight(seen) -> bool:
    return any(_too_tight(ref, got) for ref, got in seen)


@rule(
    "tolerance too loose",
    lambda seen: (
        "With the largest score {top:g}, a tolerance of {tol:g} (atol + rtol * max_abs_score) is more "
        "than 5 % of it: scores could move that far and nothing would be flagged. Keep it at most {most:g}.".format(
            **_first(seen, _too_loose)
        )
    ),
)
def tolerance_too_loose(seen) -> bool:
    return any(_too_loose(ref, got) for ref, got in seen)


@rule(
    "no application",
    "application is empty: say in words what the decisions are used for (it is part of the fingerprint).",
)
def no_application(seen) -> bool:
    return any(not got.application.strip() for _, got in seen)


RULES = (
    returned_none,
    not_a_criteria,
    no_minimum_quality,
    fixed_minimum_quality,
    minimum_above_reference,
    minimum_too_low,
    nonfinite_allowed,
    no_changes_allowed,
    another_number_of_changes,
    tolerance_too_tight,
    tolerance_too_loose,
    no_application,
)


def _too_tight(ref, got) -> bool:
    tolerance = tolerance_at_top(got, ref)
    return tolerance <= 0 or tolerance <= NOISE_MARGIN * ref["noise_floor"]


def _too_loose(ref, got) -> bool:
    return tolerance_at_top(got, ref) > LOOSEST * ref["max_abs_score"] + 1e-12


def _first(seen, wrong) -> dict:
    """The numbers of the first reference whose answer is ``wrong``, for a message."""
    ref, got = next((r, g) for r, g in seen if wrong(r, g))
    return {
        "q": ref["quality"],
        "m": got.min_quality if got.min_quality is not None else math.nan,
        "n": ref["samples"],
        "a": got.allowed_decision_changes,
        "want": allowed_changes(ref),
        "noise": ref["noise_floor"],
        "tol": tolerance_at_top(got, ref),
        "margin": NOISE_MARGIN,
        "top": ref["max_abs_score"],
        "most": LOOSEST * ref["max_abs_score"],
    }


@checker("12.1 criteria from the reference")
def check_criteria_from_reference(criteria_from_reference):
    """``criteria_from_reference(reference)`` must return the digits reader's Criteria for each reference."""
    seen = [
        (reference, call_learner(criteria_from_reference, dict(reference), what="`criteria_from_reference`"))
        for reference in REFERENCES
    ]
    mistake = first_mistake(RULES, seen)
    if mistake:
        return failed(mistake.text(seen))
    first = seen[0][1]
    return passed(
        f"Criteria written from the reference alone, before any trial (fingerprint {first.fingerprint} for the "
        f"digits reference): min_quality {first.min_quality:.2%}, {first.allowed_decision_changes} changed "
        f"readings allowed, a tolerance of {tolerance_at_top(first, REFERENCES[0]):.3g} at the largest score."
    )
