"""Lesson 02 — real gradients on the FP16 number line, and loss scaling.

The lesson's files (notebook ``notebooks/02_fp16_underflow_and_loss_scaling.ipynb``, exercise ``solutions/02_fp16_underflow_and_loss_scaling.ipynb`` -> ``exercises/02_fp16_underflow_and_loss_scaling.ipynb``, tests ``tests/l02_fp16_underflow_and_loss_scaling/``):

- ``check.py``: the exercise checkers (loaded by ``amp_lessons.checks``; notebooks never import it)
- ``hints.json``: three hints per exercise, as data (``amp_lessons.core.hints.hint``)
- ``quiz.json``: the end-of-lesson quiz, as data (``amp_lessons.core.quiz.lesson_quiz``)
- ``scaling.py``: where real gradients land on the FP16/BF16 number lines, and what loss scaling does to that.

``__all__`` is what the lesson's notebooks import from here.
"""

from amp_lessons.l02_fp16_underflow_and_loss_scaling.scaling import (
    ActivationGradients,
    capture_gradients,
    flat_values,
    limits,
    parameter_gradients,
    per_layer_medians,
    plot_magnitudes,
    plot_sweep,
    scale_explorer,
    scale_sweep,
    scale_table,
    style_table,
)

__all__ = [
    "ActivationGradients",
    "capture_gradients",
    "flat_values",
    "limits",
    "parameter_gradients",
    "per_layer_medians",
    "plot_magnitudes",
    "plot_sweep",
    "scale_explorer",
    "scale_sweep",
    "scale_table",
    "style_table",
]
