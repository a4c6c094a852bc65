"""Lesson 01 — FP32, FP16 and BF16 down to the bits.

The lesson's files (notebook ``notebooks/01_precision_formats.ipynb``, exercise ``solutions/01_precision_formats.ipynb`` -> ``exercises/01_precision_formats.ipynb``, tests ``tests/l01_precision_formats/``):

- ``check.py``: the exercise checkers (loaded by ``amp_lessons.checks``; notebooks never import it)
- ``formats.py``: FP32, FP16 and BF16 down to the bits: what a number becomes when it is stored in each format.
- ``hints.json``: three hints per exercise, as data (``amp_lessons.core.hints.hint``)
- ``quiz.json``: the end-of-lesson quiz, as data (``amp_lessons.core.quiz.lesson_quiz``)

``__all__`` is what the lesson's notebooks import from here.
"""

from amp_lessons.l01_precision_formats.formats import (
    decompose,
    explorer_html,
    explorer_table,
    finfo_table,
    format_explorer,
    next_up,
    spacing_curve,
    ulp,
)

__all__ = [
    "decompose",
    "explorer_html",
    "explorer_table",
    "finfo_table",
    "format_explorer",
    "next_up",
    "spacing_curve",
    "ulp",
]
