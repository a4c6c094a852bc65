"""Lesson 05 — the first non-finite value, and keeping one op in FP32.

The lesson's files (notebook ``notebooks/05_nan_debugging.ipynb``, exercise ``solutions/05_nan_debugging.ipynb`` -> ``exercises/05_nan_debugging.ipynb``, tests ``tests/l05_nan_debugging/``):

- ``cases.py``: what the exercise checks run a learner's code on — small broken models, and a pretend GPU.
- ``check.py``: the exercise checkers (loaded by ``amp_lessons.checks``; notebooks never import it)
- ``debugging.py``: find the *first* place a training step stops being finite.
- ``nonfinite_report.py``: what ``find_first_nonfinite`` saw — one ``Probe`` per tensor, read by a ``NonFiniteReport``.
- ``hints.json``: three hints per exercise, as data (``amp_lessons.core.hints.hint``)
- ``quiz.json``: the end-of-lesson quiz, as data (``amp_lessons.core.quiz.lesson_quiz``)
- ``skipped_updates.py``: read skipped updates from GradScaler's scale history — how often, and the trend.
- ``spies.py``: what runs beside the learner's ``texture_forward`` when 05.2 is checked (the op trace it records).
- ``trace.py``: the op recorder and its replay: 05.2's checker judges only what it recomputed itself.

``__all__`` is what the lesson's notebooks import from here.
"""

from amp_lessons.l05_nan_debugging.debugging import find_first_nonfinite, hook_count
from amp_lessons.l05_nan_debugging.nonfinite_report import plot_probes
from amp_lessons.l05_nan_debugging.skipped_updates import (
    plot_scale_history,
    scale_history_table,
    skip_verdict,
)

__all__ = [
    "find_first_nonfinite",
    "hook_count",
    "plot_probes",
    "plot_scale_history",
    "scale_history_table",
    "skip_verdict",
]
