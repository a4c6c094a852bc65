"""Lesson 03 — autocast as a per-op policy, and the GradScaler step in order.

The lesson's files (notebook ``notebooks/03_autocast_and_gradscaler.ipynb``, exercise ``solutions/03_autocast_and_gradscaler.ipynb`` -> ``exercises/03_autocast_and_gradscaler.ipynb``, tests ``tests/l03_autocast_and_gradscaler/``):

- ``autocast_policy.py``: autocast is a per-op *policy*, not a conversion: measured here, next to the documented lists.
- ``check.py``: the exercise checkers (loaded by ``amp_lessons.checks``; notebooks never import it)
- ``probes.py``: probes that record what a training step does, call by call, so a mistake can be *seen*.
- ``hints.json``: three hints per exercise, as data (``amp_lessons.core.hints.hint``)
- ``quiz.json``: the end-of-lesson quiz, as data (``amp_lessons.core.quiz.lesson_quiz``)
- ``scaler_sim.py``: a GradScaler simulator: the loss-scale arithmetic of ``torch.amp.GradScaler`` as a function.
- ``step_rules.py``: the training-step rules 03.1 and 08.1 share, and the loop that runs a step over its scenarios.
- ``training.py``: the mixed-precision training step, written once, in the order the lessons teach.

``__all__`` is what the lesson's notebooks import from here.
"""

from amp_lessons.l03_autocast_and_gradscaler.autocast_policy import (
    parameter_dtypes,
    policy_table,
    policy_view,
)
from amp_lessons.l03_autocast_and_gradscaler.scaler_sim import (
    scaler_figure,
    scaler_widget,
    simulate_scaler,
    threshold_pattern,
)
from amp_lessons.l03_autocast_and_gradscaler.training import (
    NonFiniteError,
    guarded_train_step,
    step_was_skipped,
    train_step,
)

__all__ = [
    "NonFiniteError",
    "guarded_train_step",
    "parameter_dtypes",
    "policy_table",
    "policy_view",
    "scaler_figure",
    "scaler_widget",
    "simulate_scaler",
    "step_was_skipped",
    "threshold_pattern",
    "train_step",
]
