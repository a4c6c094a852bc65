"""Lesson 06 — checkpoints a mixed-precision run resumes from bit for bit, and rollback.

The lesson's files (notebook ``notebooks/06_checkpoint_and_rollback.ipynb``, exercise ``solutions/06_checkpoint_and_rollback.ipynb`` -> ``exercises/06_checkpoint_and_rollback.ipynb``, tests ``tests/l06_checkpoint_and_rollback/``):

- ``check.py``: the exercise checkers (loaded by ``amp_lessons.checks``; notebooks never import it)
- ``checkpoint.py``: checkpoints that a mixed-precision run can resume from bit for bit (and roll back to).
- ``hints.json``: three hints per exercise, as data (``amp_lessons.core.hints.hint``)
- ``quiz.json``: the end-of-lesson quiz, as data (``amp_lessons.core.quiz.lesson_quiz``)
- ``resume.py``: put a checkpoint back into a live run, safely, and prove the resume is bit for bit.
- ``rollback.py``: decide when a run must roll back to its last good checkpoint, and keep the case that caused it.
- ``spies.py``: 06.1's saves under the file-call recorder and the injected faults, reported as plain data (runs
  where the learner's code runs)

``__all__`` is what the lesson's notebooks import from here.
"""

from amp_lessons.l06_checkpoint_and_rollback.checkpoint import (
    CheckpointError,
    describe_checkpoint,
    read_checkpoint,
    save_checkpoint,
    simulated_failed_write,
    state_fingerprint,
)
from amp_lessons.l06_checkpoint_and_rollback.resume import bitwise_report, bitwise_summary, load_checkpoint
from amp_lessons.l06_checkpoint_and_rollback.rollback import Watchdog, load_incident, save_incident

__all__ = [
    "CheckpointError",
    "Watchdog",
    "bitwise_report",
    "bitwise_summary",
    "describe_checkpoint",
    "load_checkpoint",
    "load_incident",
    "read_checkpoint",
    "save_checkpoint",
    "save_incident",
    "simulated_failed_write",
    "state_fingerprint",
]
