"""Lesson 07 — time and memory, measured honestly, after validation.

The lesson's files (notebook ``notebooks/07_measuring_gains.ipynb``, exercise ``solutions/07_measuring_gains.ipynb`` -> ``exercises/07_measuring_gains.ipynb``, tests ``tests/l07_measuring_gains/``):

- ``benchmark.py``: measure time and memory of training-step variants honestly.
- ``check.py``: the exercise checkers (loaded by ``amp_lessons.checks``; notebooks never import it)
- ``memory.py``: the memory of a training step, measured by kind — what AMP shrinks and what it does not.
- ``spies.py``: 07.1's recorder of what the learner's code does around a step (runs where that code runs)
- ``hints.json``: three hints per exercise, as data (``amp_lessons.core.hints.hint``)
- ``quiz.json``: the end-of-lesson quiz, as data (``amp_lessons.core.quiz.lesson_quiz``)

``__all__`` is what the lesson's notebooks import from here.
"""

from amp_lessons.l07_measuring_gains import benchmark, memory
from amp_lessons.l07_measuring_gains.benchmark import make_synchronizer, measure, results_table, speed_verdict

__all__ = ["benchmark", "make_synchronizer", "measure", "memory", "results_table", "speed_verdict"]
