"""Lesson 00 — how the course works, the environment card and the warm-up check.

The lesson's files (notebook ``notebooks/00_start_here.ipynb``, tests ``tests/l00_start_here/``):

- ``check.py``: the exercise checkers (loaded by ``amp_lessons.checks``; notebooks never import it)
- ``hints.json``: three hints per exercise, as data (``amp_lessons.core.hints.hint``)
- ``quiz.json``: the end-of-lesson quiz, as data (``amp_lessons.core.quiz.lesson_quiz``)
- ``spies.py``: the warm-up check's recorder that runs around the learner's code (importable where a graded
  kernel runs it; ``check.py`` is not)
"""

__all__: list = []
