"""Lesson 03: the training-step rules that 03.1 (``check_train_step``) and 08.1 (``check_accumulate_step``) share,
and the one loop that runs a learner's step over a checker's scenarios.

Both checkers judge an AMP training step by what the probes recorded (``probes.Seen``). Many mistakes look the
same in both (autocast left on, a new GradScaler, optimizer.step() called directly, unscale_ after step, no
update, clipping although ``max_norm`` is None, the wrong loss scale afterwards, nothing returned, ...): each
is recognised here, once, so a fix to a recogniser (a false rejection, say) lands in both checkers.

A shared rule is a :class:`~amp_lessons.checks.mistakes.Mistake` like any other. Where both checkers say the
same thing it carries its message too; where each says it in its own words (a step of micro-batches needs
other advice), the checker gives it its message with :func:`worded`::

    @worded(step_rules.no_update)
    def no_update(s: Seen) -> str:
        return f"{s.where}: scaler.update() was never called. ..."

and puts that rule in its table: the name and the recogniser stay the shared ones. Rules only one exercise
has stay in that exercise's ``check.py``; the table there decides the order, and so which message wins.

:func:`observations` runs a learner's step and the reference step from identical states, scenario by
scenario, and :func:`judge` turns the first named mistake into a failed result.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace

import torch

from amp_lessons.checks.harness import NOT_DONE, CheckResult, LearnerProblem, call_learner, failed
from amp_lessons.checks.mistakes import Mistake, name_mistake, rule
from amp_lessons.core.environment import one_cpu_thread
from amp_lessons.l03_autocast_and_gradscaler.probes import CallRecord, Seen, close, recorded_call

# ------------------------------------------------------------------------------------ one loop, two checkers


@dataclass(frozen=True)
class StepExercise:
    """What a training-step checker runs: the reference step, its scenarios and probes, and its rule table."""

    what: str  # the learner's function as messages name it, e.g. "`train_step`"
    reference: Callable
    scenarios: tuple
    # the lesson's ProbedRun: one scenario's model, optimizer, scaler and data, all recording
    probed_run: type
    seen: type  # the lesson's Seen: the facts the rules read
    rules: tuple  # most specific first: the first rule that recognises a call names its mistake


def recorded_step(run, fn, index: int, what: str | None = None) -> CallRecord:
    """Call ``fn`` on the run's objects and data number ``index``, recording everything the probes saw.

    With ``what`` the call is the learner's (through the harness, so a problem is recorded, not raised);
    without, it is the reference's, and an error is a checker bug.
    """
    args = run.step_arguments(index)
    kwargs = {"dtype": run.scenario.dtype, "max_norm": run.scenario.max_norm}
    with recorded_call(run) as record:
        try:
            if what is None:
                record.returned = fn(*args, **kwargs)
            else:
                record.returned = call_learner(fn, *args, what=what, **kwargs)
        except LearnerProblem as problem:
            record.problem = problem
    return record


def observations(exercise: StepExercise, step) -> Iterator[Seen]:
    """Each call of ``step`` next to the reference call from the same state, scenario by scenario.

    A generator: the checker stops at the first call with a named mistake, so later scenarios never run.
    """
    for scenario in exercise.scenarios:
        reference, learner = exercise.probed_run(scenario), exercise.probed_run(scenario)
        for step_no in range(scenario.steps):
            ref = recorded_step(reference, exercise.reference, step_no)
            got = recorded_step(learner, step, step_no, what=exercise.what)
            yield exercise.seen(ref, got, scenario, step_no)


def judge(exercise: StepExercise, step) -> CheckResult | None:
    """Run every scenario; the first named mistake as a failed result, a "not done" result, or None.

    The check seeds its own models (the learner's random stream is left alone) and runs them on one thread.
    """
    with torch.random.fork_rng(devices=[]), one_cpu_thread():
        for seen in observations(exercise, step):
            if seen.got.problem is not None and seen.got.problem.result.status == NOT_DONE:
                return seen.got.problem.result
            message = name_mistake(exercise.rules, seen)
            if message:
                return failed(message)
    return None


# ------------------------------------------------------------------------------------ wording a shared rule


def own_words(s: Seen) -> str:
    """The message of a shared rule that each checker words itself: using it unworded is a checker bug."""
    raise TypeError("this shared rule has no message of its own: give it one with step_rules.worded(rule)")


def worded(shared: Mistake) -> Callable[[Callable[..., str]], Mistake]:
    """Decorate an exercise's message function to make it the message of ``shared`` in that exercise."""

    def make(message: Callable[..., str]) -> Mistake:
        return replace(shared, message=message)

    return make


def error_or(s: Seen, text: str) -> str:
    """The learner's error when there was one (it explains the missing call), else ``text``."""
    return f"{s.where}: {s.error}" if s.error else f"{s.where}: {text}"


def cuda_autocast_spelling(s: Seen) -> str:
    """How a step asked for CUDA autocast, as torch's warnings and errors tell."""
    if "torch.cuda.amp.autocast" in s.lower:
        return "torch.cuda.amp.autocast (deprecated, and CUDA-only)"
    return "device_type='cuda'"


def torch_said_cuda(s: Seen) -> bool:
    """Torch warned or raised about CUDA (not available, or a deprecated torch.cuda.amp spelling)."""
    lower = s.lower
    return "cuda" in lower and ("not available" in lower or "deprecated" in lower)


def zeroes_at_end(s: Seen) -> bool:
    """The step calls zero_grad() after its last scaler.update(): at the end, not the start."""
    return s.log.after_last("zero_grad", "update")


# --------------------------------------------------------------------------------------------- the calls


@rule("autocast left on", own_words)
def autocast_left_on(s: Seen) -> bool:
    return s.got.autocast_left_on


def _left_in_eval_message(s: Seen) -> str:
    return (
        f"{s.where}: the model was in eval mode after {s.step_name} returned. A training step trains: leave "
        "the model in train mode (model.train()), or dropout and batch norm behave as at inference."
    )


@rule("model left in eval mode", _left_in_eval_message)
def model_left_in_eval(s: Seen) -> bool:
    return s.got.left_in_eval and not s.ref.left_in_eval


@rule("new GradScaler", own_words)
def new_grad_scaler(s: Seen) -> bool:
    return s.got.new_scalers > 0


@rule("low-precision parameters", own_words)
def low_precision_parameters(s: Seen) -> bool:
    return bool(s.low_param_dtypes)


@rule("model never called", own_words)
def model_never_called(s: Seen) -> bool:
    return s.event("forward") is None


@rule("loss never computed", own_words)
def loss_never_computed(s: Seen) -> bool:
    return s.event("loss") is None


@rule("no backward", own_words)
def no_backward(s: Seen) -> bool:
    return s.event("backward") is None


@rule("stale gradients", own_words)
def stale_gradients(s: Seen) -> bool:
    """Old gradients were still in ``.grad`` when the (first) backward pass began."""
    return s.event("backward")["stale"]


@rule("optimizer.step() called directly", own_words)
def optimizer_step_called_directly(s: Seen) -> bool:
    """The learner called optimizer.step() itself, with scaling on, or twice (BF16 may skip the scaler)."""
    direct = any(e["name"] == "optimizer.step" and not e["via_scaler"] for e in s.log.events)
    return direct and (s.scaling or s.log.count("optimizer.step") > 1)


@rule("unscale_ twice", own_words)
def unscale_twice(s: Seen) -> bool:
    return s.scaling and s.log.count("unscale_") > 1


@rule("unscale_ after step", own_words)
def unscale_after_step(s: Seen) -> bool:
    names = s.names
    both = "unscale_" in names and "scaler.step" in names
    return s.scaling and both and names.index("unscale_") > names.index("scaler.step")


@rule("no scaler.step", own_words)
def no_scaler_step(s: Seen) -> bool:
    return "scaler.step" not in s.names and (s.scaling or "optimizer.step" not in s.names)


@rule("no update", own_words)
def no_update(s: Seen) -> bool:
    return s.scaling and "update" not in s.names


@rule("update more than once", own_words)
def update_more_than_once(s: Seen) -> bool:
    return s.scaling and s.log.count("update") > 1


@rule("learner error", lambda s: f"{s.where}: {s.error}")
def learner_error(s: Seen) -> bool:
    """Any other error in the learner's step: torch's own message says what went wrong."""
    return bool(s.error)


# ---------------------------------------------------------------- clipping: the norm the optimizer used


def _clipped_without_max_norm_message(s: Seen) -> str:
    return (
        f"{s.where}: max_norm is None, which means no clipping, but the gradient norm the optimizer used was "
        f"{s.norm_used:.4g} instead of {s.norm_expected:.4g}. Clip only `if max_norm is not None:`."
    )


def _divided_twice_message(s: Seen) -> str:
    return (
        f"{s.where}: the gradients reached the optimizer divided by the loss scale twice (norm "
        f"{s.norm_used:.4g} instead of {s.norm_expected:.4g}, {s.scale_used:g} times too small): you unscaled "
        "them by hand, and scaler.step(optimizer) unscaled them again, because it only knows about an unscale_ it did itself. Unscale with `scaler.unscale_(optimizer)` "
        "(needed only before clipping), or leave it to scaler.step."
    )


@rule("unscaled by hand, then scaler.step", _divided_twice_message)
def unscaled_by_hand(s: Seen) -> bool:
    """scaler.step saw gradients already at their true (unscaled) norm, without an unscale_ it knew of."""
    step = s.scaler_step
    if not (s.scaling and step and not step["unscaled"] and s.norm_finite and s.scale_used >= 2):
        return False
    true_norm = s.norm_expected if s.max_norm is None else s.unclipped_norm
    return close(step["norm"], true_norm, 0.02) and close(s.norm_used * s.scale_used, true_norm, 0.02)


@rule("clipped although max_norm is None", _clipped_without_max_norm_message)
def clipped_although_max_norm_none(s: Seen) -> bool:
    return s.clipped_wrong and s.max_norm is None


def norm_above_max(s: Seen) -> bool:
    """Clipping was asked for, and the optimizer used a gradient norm above max_norm."""
    return s.clipped_wrong and s.max_norm is not None and s.norm_used > s.max_norm * 1.02


def _not_by_total_norm_message(s: Seen) -> str:
    return (
        f"{s.where}: the gradient norm the optimizer used was {s.norm_used:.4g}: the gradients were changed, "
        f"but not clipped to total norm max_norm={s.max_norm} (unclipped it is {s.unclipped_norm:.4g}). Use "
        "`torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)`, not clip_grad_value_, "
        "after unscale_."
    )


@rule("changed, but not clipped by total norm", _not_by_total_norm_message)
def changed_not_clipped_by_total_norm(s: Seen) -> bool:
    return norm_above_max(s) and not close(s.norm_used, s.unclipped_norm, 0.02)


@rule("not clipped", own_words)
def not_clipped(s: Seen) -> bool:
    return norm_above_max(s)


@rule("clipped to another norm", own_words)
def clipped_to_another_norm(s: Seen) -> bool:
    return s.clipped_wrong


# ----------------------------------------------------------------------- what the step left and returned


@rule("loss scale differs", own_words)
def loss_scale_differs(s: Seen) -> bool:
    return not close(s.got.scale_after, s.ref.scale_after, 1e-6)


@rule("overflowing step not skipped", own_words)
def overflowing_step_not_skipped(s: Seen) -> bool:
    return s.ref.log.count("optimizer.step") == 0 and s.first_param_difference is not None


@rule("parameters differ", own_words)
def parameters_differ(s: Seen) -> bool:
    return s.first_param_difference is not None


@rule("returned None", own_words)
def returned_none(s: Seen) -> bool:
    return s.got.returned is None


@rule("returned something else", own_words)
def returned_something_else(s: Seen) -> bool:
    """The step returned something that is not one number."""
    return s.returned_number is None


SHARED_RULES = (
    autocast_left_on,
    model_left_in_eval,
    new_grad_scaler,
    low_precision_parameters,
    model_never_called,
    loss_never_computed,
    no_backward,
    stale_gradients,
    optimizer_step_called_directly,
    unscale_twice,
    unscale_after_step,
    no_scaler_step,
    no_update,
    update_more_than_once,
    learner_error,
    unscaled_by_hand,
    clipped_although_max_norm_none,
    changed_not_clipped_by_total_norm,
    not_clipped,
    clipped_to_another_norm,
    loss_scale_differs,
    overflowing_step_not_skipped,
    parameters_differ,
    returned_none,
    returned_something_else,
)
