"""Lesson 08 — accumulation, several losses, inference, custom ops, compile, TF32.

The lesson's files (notebook ``notebooks/08_amp_in_your_training_loop.ipynb``, exercise ``solutions/08_amp_in_your_training_loop.ipynb`` -> ``exercises/08_amp_in_your_training_loop.ipynb``, tests ``tests/l08_amp_in_your_training_loop/``):

- ``check.py``: the exercise checkers (loaded by ``amp_lessons.checks``; notebooks never import it)
- ``loop_numerics.py``: the numerics around a real training loop: an "FP32" reference that may be TF32, losses and ops that autocast must not touch, ``torch.compile`` under autocast, and normalisation ``eps`` in FP16.
- ``probes.py``: probes that record what a gradient-accumulation step does, micro-batch by micro-batch.
- ``hints.json``: three hints per exercise, as data (``amp_lessons.core.hints.hint``)
- ``quiz.json``: the end-of-lesson quiz, as data (``amp_lessons.core.quiz.lesson_quiz``)
- ``training_loop.py``: AMP in a real training loop: gradient accumulation, several losses or optimizers with one GradScaler, and a switchboard that tells autocast problems from scaling problems.

``__all__`` is what the lesson's notebooks import from here.
"""

from amp_lessons.l08_amp_in_your_training_loop.loop_numerics import (
    EmulatedTF32,
    bce_table,
    compiler_status,
    first_call,
    fp32_reference_settings,
    graph_breaks,
    plot_bce,
    real_tf32,
    rms_norm,
    spacing_table,
    stored_eps,
)
from amp_lessons.l08_amp_in_your_training_loop.training_loop import (
    WRONG_PLACEMENTS,
    TwoHeadNet,
    accumulation_problem,
    multi_loss_errors,
    placement_errors,
    plot_placement_errors,
    split_batch,
    toggle_runs,
    true_gradient_norm,
    two_losses,
    two_optimizers,
)

__all__ = [
    "EmulatedTF32",
    "TwoHeadNet",
    "WRONG_PLACEMENTS",
    "accumulation_problem",
    "bce_table",
    "compiler_status",
    "first_call",
    "fp32_reference_settings",
    "graph_breaks",
    "multi_loss_errors",
    "placement_errors",
    "plot_bce",
    "plot_placement_errors",
    "real_tf32",
    "rms_norm",
    "spacing_table",
    "split_batch",
    "stored_eps",
    "toggle_runs",
    "true_gradient_norm",
    "two_losses",
    "two_optimizers",
]
