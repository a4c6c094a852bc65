"""Lesson 10 — where the FP32 lives: weights, optimizer states, losses, and the flags your framework sets.

The lesson's files (notebook ``notebooks/10_where_fp32_lives.ipynb``, exercise ``solutions/10_where_fp32_lives.ipynb`` -> ``exercises/10_where_fp32_lives.ipynb``, tests ``tests/l10_where_fp32_lives/``):

- ``check.py``: the exercise checker (loaded by ``amp_lessons.checks``; notebooks never import it)
- ``designs.py``: where the FP32 copy of the weights lives, ``LowPrecisionAdam`` for every design, bytes per parameter.
- ``framework_flags.py``: what Hugging Face's and Lightning's precision flags switch on, found by instrumenting a run.
- ``loss_precision.py``: a distillation KL loss computed in BF16 loses its gradient to cancellation.
- ``mask_constants.py``: attention masks with ``-1e9`` / ``finfo(float32).min`` become -inf, then NaN, in FP16.
- ``optimizer_states.py``: Adam's states in 8 or 4 bits (torchao.optim) and their quantisation error.
- ``rounding.py``: rounding an update into BF16 — to nearest, stochastically, or with a Kahan compensation.
- ``training.py``: one small training task run with every design, the loss and lost-update figures.
- ``hints.json``: three hints per exercise, as data (``amp_lessons.core.hints.hint``)
- ``quiz.json``: the end-of-lesson quiz, as data (``amp_lessons.core.quiz.lesson_quiz``)

``__all__`` is what the lesson's notebooks import from here.
"""

from amp_lessons.l10_where_fp32_lives.designs import DESIGNS, LowPrecisionAdam, bytes_per_parameter
from amp_lessons.l10_where_fp32_lives.framework_flags import flag_table, run_flag
from amp_lessons.l10_where_fp32_lives.loss_precision import kl_gradient_errors, kl_loss
from amp_lessons.l10_where_fp32_lives.mask_constants import (
    FILLS,
    PaddedAttentionClassifier,
    mask_values,
    padded_batch,
    sdpa_masked_rows,
)
from amp_lessons.l10_where_fp32_lives.optimizer_states import (
    quantisation_errors,
    quiet_compile,
    state_bytes,
    torchao_optimizers,
    torchao_step,
)
from amp_lessons.l10_where_fp32_lives.rounding import (
    accumulate,
    bf16_neighbours,
    rounding_means,
    stochastic_round,
)
from amp_lessons.l10_where_fp32_lives.training import loss_plot, lost_plot, task, train, train_design

__all__ = [
    "DESIGNS",
    "FILLS",
    "LowPrecisionAdam",
    "PaddedAttentionClassifier",
    "accumulate",
    "bf16_neighbours",
    "bytes_per_parameter",
    "flag_table",
    "kl_gradient_errors",
    "kl_loss",
    "loss_plot",
    "lost_plot",
    "mask_values",
    "padded_batch",
    "quantisation_errors",
    "quiet_compile",
    "rounding_means",
    "run_flag",
    "sdpa_masked_rows",
    "state_bytes",
    "stochastic_round",
    "task",
    "torchao_optimizers",
    "torchao_step",
    "train",
    "train_design",
]
