"""Everything a notebook needs to check an exercise: ``from amp_lessons.checks import check_...``.

The result type and the harness live in ``amp_lessons.harness``; each lesson's checkers live in
``amp_lessons.checks_<topic>``. This module gathers them so that learners have one place to import from.
"""

from amp_lessons.checks_benchmark import check_time_step
from amp_lessons.checks_checkpoint import check_resume, check_save_checkpoint
from amp_lessons.checks_debugging import check_first_nonfinite_module, check_texture_forward
from amp_lessons.checks_formats import check_classify, check_stored_value
from amp_lessons.checks_scaling import check_largest_safe_scale, check_lost_fractions
from amp_lessons.checks_start import check_autocast_matmul
from amp_lessons.checks_training import check_scheduler_step, check_train_step
from amp_lessons.checks_validation import check_criteria, check_decide, check_judge_trial
from amp_lessons.harness import (
    CHECKER_BUG,
    FAILED,
    NOT_DONE,
    PASSED,
    CheckResult,
    LearnerProblem,
    call_learner,
    checker,
    demonstration,
    describe_exception,
    failed,
    not_done,
    passed,
    stop,
    strict_mode,
)

__all__ = [
    "CHECKER_BUG", "FAILED", "NOT_DONE", "PASSED", "CheckResult", "LearnerProblem", "call_learner", "checker",
    "demonstration", "describe_exception", "failed", "not_done", "passed", "stop", "strict_mode",
    "check_autocast_matmul", "check_classify", "check_criteria", "check_decide", "check_first_nonfinite_module",
    "check_judge_trial", "check_largest_safe_scale", "check_lost_fractions", "check_resume",
    "check_save_checkpoint", "check_scheduler_step", "check_stored_value", "check_texture_forward",
    "check_time_step", "check_train_step",
]
