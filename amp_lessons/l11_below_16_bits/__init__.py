"""Lesson 11 — below 16 bits: FP8 and MX block scaling, validated on a laptop with the real torchao API.

The lesson's files (notebook ``notebooks/11_below_16_bits.ipynb``, exercise ``solutions/11_below_16_bits.ipynb`` -> ``exercises/11_below_16_bits.ipynb``, tests ``tests/l11_below_16_bits/``):

- ``accumulate.py``: a simulated narrow accumulator inside an FP8 matmul, with and without promotion to FP32.
- ``check.py``: the exercise checker (loaded by ``amp_lessons.checks``; notebooks never import it)
- ``delayed.py``: delayed vs current scaling: an amax history, a spike, and the amax shared across ranks.
- ``eight_bit.py``: the FP8 and E8M0 formats next to FP16/BF16, and what each cast path does on overflow here.
- ``hints.json``: three hints per exercise, as data (``amp_lessons.core.hints.hint``)
- ``quiz.json``: the end-of-lesson quiz, as data (``amp_lessons.core.quiz.lesson_quiz``)
- ``scaling.py``: scaled FP8 per tensor, row, 1x128 block and MX block; lost values per scale choice.
- ``training.py``: FP8 training with torchao's recipes and a module filter, validated against FP32 and BF16.

``__all__`` is what the lesson's notebooks import from here.
"""

from amp_lessons.l11_below_16_bits.accumulate import accumulation_errors, narrow_dot, swamping_limit
from amp_lessons.l11_below_16_bits.delayed import (
    activation_stream,
    delayed_vs_current,
    rank_amaxes,
    spike_figure,
)
from amp_lessons.l11_below_16_bits.eight_bit import format_facts, overflow_casts
from amp_lessons.l11_below_16_bits.scaling import (
    dequantize_blockwise,
    granularity_figure,
    granularity_table,
    lost_shares,
    outlier_activations,
    quantize_blockwise,
)
from amp_lessons.l11_below_16_bits.training import (
    RECIPES,
    fp8_module_filter,
    fp8_step_times,
    loss_curves_figure,
    task_data,
    train_run,
    verdict_table,
)

__all__ = [
    "RECIPES",
    "accumulation_errors",
    "activation_stream",
    "delayed_vs_current",
    "dequantize_blockwise",
    "format_facts",
    "fp8_module_filter",
    "fp8_step_times",
    "granularity_figure",
    "granularity_table",
    "loss_curves_figure",
    "lost_shares",
    "narrow_dot",
    "outlier_activations",
    "overflow_casts",
    "quantize_blockwise",
    "rank_amaxes",
    "spike_figure",
    "swamping_limit",
    "task_data",
    "train_run",
    "verdict_table",
]
