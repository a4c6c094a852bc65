"""Lesson 04 — an FP32 reference, criteria before the trial, decisions that flip.

The lesson's files (notebook ``notebooks/04_baseline_and_decision_boundary.ipynb``, exercise ``solutions/04_baseline_and_decision_boundary.ipynb`` -> ``exercises/04_baseline_and_decision_boundary.ipynb``, tests ``tests/l04_baseline_and_decision_boundary/``):

- ``check.py``: the exercise checkers (loaded by ``amp_lessons.checks``; notebooks never import it)
- ``criteria.py``: acceptance criteria for an AMP trial, written down before the trial and fingerprinted.
- ``hints.json``: three hints per exercise, as data (``amp_lessons.core.hints.hint``)
- ``quiz.json``: the end-of-lesson quiz, as data (``amp_lessons.core.quiz.lesson_quiz``)
- ``risk.py``: which samples are close enough to a flip to be *at risk*, as a table, a plot and a slider.
- ``validation.py``: judge an AMP trial against a fixed FP32 reference: criteria first, then scores, then decisions.

``__all__`` is what the lesson's notebooks import from here.
"""

from amp_lessons.l04_baseline_and_decision_boundary.criteria import Criteria
from amp_lessons.l04_baseline_and_decision_boundary.risk import margin_plot, risk_summary, tolerance_explorer
from amp_lessons.l04_baseline_and_decision_boundary.validation import (
    CriteriaChangedError,
    NonFiniteReferenceError,
    accuracy,
    compare,
    compare_regression,
    decide,
    judge,
    margins,
    record_baseline,
)

__all__ = [
    "Criteria",
    "CriteriaChangedError",
    "NonFiniteReferenceError",
    "accuracy",
    "compare",
    "compare_regression",
    "decide",
    "judge",
    "margin_plot",
    "margins",
    "record_baseline",
    "risk_summary",
    "tolerance_explorer",
]
