"""What a notebook imports to check an exercise: ``from amp_lessons.checks import check_...``.

This module offers the learner-facing ``check_*`` functions and the result type, nothing else. Each check
lives in its lesson's package (``amp_lessons/lNN_<notebook stem>/check.py``); :data:`CHECKS` below says which,
and a check's module is imported the first time the check is asked for, so importing this module loads no
lesson (and no torch). Adding an exercise: write its ``@checker`` in the lesson's ``check.py`` and add one line
to :data:`CHECKS` (a test keeps the table equal to the ``@checker`` lines). Writing a checker is for course
authors: see ``harness`` and ``mistakes``.
"""

from importlib import import_module

# {check function: the lesson module that defines it}, in lesson order.
CHECKS = {
    "check_autocast_matmul": "amp_lessons.l00_start_here.check",
    "check_stored_value": "amp_lessons.l01_precision_formats.check",
    "check_classify": "amp_lessons.l01_precision_formats.check",
    "check_lost_fractions": "amp_lessons.l02_fp16_underflow_and_loss_scaling.check",
    "check_largest_safe_scale": "amp_lessons.l02_fp16_underflow_and_loss_scaling.check",
    "check_train_step": "amp_lessons.l03_autocast_and_gradscaler.check",
    "check_scheduler_step": "amp_lessons.l03_autocast_and_gradscaler.check",
    "check_decide": "amp_lessons.l04_baseline_and_decision_boundary.check",
    "check_criteria": "amp_lessons.l04_baseline_and_decision_boundary.check",
    "check_judge_trial": "amp_lessons.l04_baseline_and_decision_boundary.check",
    "check_first_nonfinite_module": "amp_lessons.l05_nan_debugging.check",
    "check_texture_forward": "amp_lessons.l05_nan_debugging.check",
    "check_save_checkpoint": "amp_lessons.l06_checkpoint_and_rollback.check",
    "check_resume": "amp_lessons.l06_checkpoint_and_rollback.check",
    "check_time_step": "amp_lessons.l07_measuring_gains.check",
    "check_saved_activation_bytes": "amp_lessons.l07_measuring_gains.check",
    "check_accumulate_step": "amp_lessons.l08_amp_in_your_training_loop.check",
    "check_synced_train_step": "amp_lessons.l09_amp_across_processes.check",
    "check_stochastic_round": "amp_lessons.l10_where_fp32_lives.check",
    "check_quantize_blocks": "amp_lessons.l11_below_16_bits.check",
    "check_criteria_from_reference": "amp_lessons.l12_your_model_validated.check",
}

__all__ = ["CheckResult", *CHECKS]


def __getattr__(name):
    if name == "CheckResult":
        return import_module(f"{__name__}.harness").CheckResult
    if name in CHECKS:
        return getattr(import_module(CHECKS[name]), name)
    raise AttributeError(f"amp_lessons.checks has no {name!r}; the checks are {', '.join(CHECKS)}.")


def __dir__():
    return list(__all__)
