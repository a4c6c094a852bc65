"""Lesson 09 — DDP + GradScaler and FSDP2 mixed precision on two local processes.

The lesson's files (notebook ``notebooks/09_amp_across_processes.ipynb``, exercise ``solutions/09_amp_across_processes.ipynb`` -> ``exercises/09_amp_across_processes.ipynb``, tests ``tests/l09_amp_across_processes/``):

- ``across_ranks.py``: the training recipe every rank runs (and this notebook runs as one process), and the numbers the lesson reads from what the ranks report.
- ``check.py``: the exercise checkers (loaded by ``amp_lessons.checks``; notebooks never import it)
- ``distributed.py``: start ranks the way people do (torchrun), and make sure every one of them ends.
- ``hints.json``: three hints per exercise, as data (``amp_lessons.core.hints.hint``)
- ``quiz.json``: the end-of-lesson quiz, as data (``amp_lessons.core.quiz.lesson_quiz``)
- ``spies.py``: 09.1's two gloo ranks and the steps they run beside the learner's function (where that function lives: the kernel when graded); it reports, the checker judges
- ``workers/``: the scripts ``torchrun`` starts, one process per rank.

``__all__`` is what the lesson's notebooks import from here.
"""

from amp_lessons.l09_amp_across_processes import across_ranks, distributed

__all__ = ["across_ranks", "distributed"]
