"""Lesson 05's checkers: name the first non-finite module, and keep exactly one op in FP32.

Both run on the CPU with small, deterministic models whose float16 overflow is certain (values between
65504 and float32's range, see ``amp_lessons.l05_nan_debugging.cases``), so a check answers in well under a second.

Each names the mistake with tables of small named rules (``amp_lessons.checks.mistakes``), first match wins:
- 05.1 checks every call (``CALL_MISTAKES``: hooks left, model or its train/eval mode changed, autocast left
  on, not a name), then reads all wrong answers together (``FINDER_MISTAKES``): a known wrong approach (no
  autocast, the last name, NaN only, ...) is recognised when, replayed on the same cases, it gives every one
  of them. A right finder is then run on a model whose forward raises (its hooks must go all the same) and
  on a pretend GPU (its autocast must follow the tensors' device);
- 05.2 watches the learner's forward without autocast (``PLAIN_MISTAKES``: it must be TextureNet.forward)
  and under float16 autocast (``AUTOCAST_MISTAKES``: which op ran in which dtype, finite, close to FP32),
  runs one real training step through it, then once more on a pretend GPU (``GPU_MISTAKES``): an autocast
  switched off for a hard-coded "cpu" leaves CUDA's autocast on.

05.2 never trusts a record of the learner's process. Each call of the forward is TRACED beside it
(``spies.trace_texture_forward``: every op, its inputs, grad mode and autocast state, its results) and the
trace is REPLAYED here on the checker's own ``x`` and parameters (``trace.replay``), each recorded value
compared with the checker's own; the rules read the replay, and the training step and ``autograd.grad`` run
through it. When graded, the forward runs in the sandboxed kernel and only the trace comes back: a made-up
trace passes only if it is, op by op, the right mixed-precision forward. What stays a claim of the learner's
process: the pretend-GPU run (the kernel can undo the pretence), whether autocast was left on or switched off
for the caller after the call, and which autocasts were entered (these only ever word a failure).
"""

from __future__ import annotations

import copy
import random
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from amp_lessons.checks.harness import (
    FAILED,
    NOT_DONE,
    CheckResult,
    LearnerProblem,
    call_learner,
    checker,
    failed,
    not_done,
    passed,
    run_beside_learner,
    stop,
)
from amp_lessons.checks.mistakes import Mistake, first_mistake, rule
from amp_lessons.core.autocast_state import (
    MATMUL_LIKE,
    OpCall,
    OpDtypeRecorder,
    autocast_enabled,
    float_tensors,
)
from amp_lessons.core.environment import dtype_name
from amp_lessons.l05_nan_debugging import cases as cases
from amp_lessons.l05_nan_debugging import spies, trace
from amp_lessons.l05_nan_debugging.debugging import find_first_nonfinite, global_hook_count, hook_count

DTYPE = torch.float16  # the autocast dtype every 05.1 case is run in

# --------------------------------------------------------------------------------------------------
# 05.1 first_nonfinite_module(model, inputs, dtype) -> qualified name | None
# --------------------------------------------------------------------------------------------------


@dataclass
class FinderCall:
    """What one call of the learner's finder did besides answering (facts for ``CALL_MISTAKES``)."""

    label: str
    got: object
    hooks_left: int
    changed_model: bool
    autocast_on: bool
    mode_change: str = ""  # "eval" (a module left training mode), "train" (left eval mode) or ""
    global_hooks_left: int = 0
    raised: bool = False  # the case whose forward raises


def _hooks_left_when_the_forward_raised_message(call: FinderCall) -> str:
    return (
        f"On {call.label} your function left {call.hooks_left + call.global_hooks_left} hook(s) behind: the "
        "error jumped over your handle.remove() lines. Remove the hooks in a `finally:` block (`try:` run "
        "the model, `finally:` remove every handle), so they go even when the forward raises."
    )


@rule("hooks left when the forward raised", _hooks_left_when_the_forward_raised_message)
def hooks_left_when_the_forward_raised(call: FinderCall) -> bool:
    return call.raised and (call.hooks_left or call.global_hooks_left)


def _left_hooks_on_the_model_message(call: FinderCall) -> str:
    return (
        f"On {call.label} your function left {call.hooks_left} hook(s) on the model. Keep the handles that "
        "register_forward_hook returns and call handle.remove() on each in a `finally:` block, so they are "
        "removed even when the forward raises."
    )


@rule("left hooks on the model", _left_hooks_on_the_model_message)
def left_hooks_on_the_model(call: FinderCall) -> bool:
    return call.hooks_left != 0


def _left_a_global_hook_message(call: FinderCall) -> str:
    return (
        f"On {call.label} your function left {call.global_hooks_left} global module hook(s) installed "
        "(register_module_forward_hook): they now fire for every module of every model. Keep the handle it "
        "returns and call handle.remove() in a `finally:` block."
    )


@rule("left a global hook", _left_a_global_hook_message)
def left_a_global_hook(call: FinderCall) -> bool:
    return call.global_hooks_left != 0


def _changed_the_model_message(call: FinderCall) -> str:
    return (
        f"On {call.label} your function changed the model (its weights or their dtype, e.g. with "
        "model.half()). A finder must only watch: autocast picks each op's dtype without touching the model."
    )


@rule("changed the model", _changed_the_model_message)
def changed_the_model(call: FinderCall) -> bool:
    return call.changed_model


def _left_the_model_in_eval_mode_message(call: FinderCall) -> str:
    return (
        f"On {call.label} your function switched the model to eval mode and left it there: the caller's "
        "next training step would run without dropout and with frozen batch-norm statistics. A finder needs "
        "no eval mode (hooks and autocast work in either); if you use it, remember `was_training = "
        "model.training` and call `model.train(was_training)` in your `finally:` block."
    )


@rule("left the model in eval mode", _left_the_model_in_eval_mode_message)
def left_the_model_in_eval_mode(call: FinderCall) -> bool:
    return call.mode_change == "eval"


def _left_the_model_in_training_mode_message(call: FinderCall) -> str:
    return (
        f"On {call.label} the model came in eval mode and your function left it in training mode "
        "(`model.train()` at the end switches dropout and batch-norm updates on for the caller). Restore the "
        "mode it came in: `was_training = model.training` first, "
        "`model.train(was_training)` in the `finally:` block."
    )


@rule("left the model in training mode", _left_the_model_in_training_mode_message)
def left_the_model_in_training_mode(call: FinderCall) -> bool:
    return call.mode_change == "train"


@rule(
    "left autocast on",
    "Autocast is still on after your function returned: use it as `with torch.autocast(...):`.",
)
def left_autocast_on(call: FinderCall) -> bool:
    return call.autocast_on


@rule(
    "returned a module",
    "You returned a module object; return its qualified name, the string `model.named_modules()` "
    "gives with it (e.g. 'block.fc2').",
)
def returned_a_module(call: FinderCall) -> bool:
    return isinstance(call.got, nn.Module)


def _returned_neither_a_name_nor_none_message(call: FinderCall) -> str:
    return f"Your function returned a {type(call.got).__name__}; return a module name (str) or None."


@rule("returned neither a name nor None", _returned_neither_a_name_nor_none_message)
def returned_neither_a_name_nor_none(call: FinderCall) -> bool:
    return call.got is not None and not isinstance(call.got, str)


# Checked after every call, in this order: a finder must only watch, and answer with a name or None.
CALL_MISTAKES = (
    hooks_left_when_the_forward_raised,
    left_hooks_on_the_model,
    left_a_global_hook,
    changed_the_model,
    left_the_model_in_eval_mode,
    left_the_model_in_training_mode,
    left_autocast_on,
    returned_a_module,
    returned_neither_a_name_nor_none,
)


@dataclass
class WrongAnswer:
    """One case the learner's finder got wrong, with what it takes to replay a known wrong approach on it."""

    label: str
    got: object
    expected: str | None
    model: nn.Module
    inputs: torch.Tensor
    dtype: torch.dtype = torch.float16
    autocasts: tuple = ()  # the enabled autocasts the call entered (``debugging_cases.Autocast``)


def _lines(wrong: list, words: str = "the first non-finite module is") -> list:
    return [f"{w.label}: you returned {w.got!r}, {words} {w.expected!r}" for w in wrong]


def _first_line(wrong: list) -> list:
    return _lines(wrong[:1])


def _every_line_expected(wrong: list) -> list:
    return _lines(wrong, "expected")


def _no_lines(wrong: list) -> list:
    return []


@dataclass(frozen=True)
class FinderMistake(Mistake):
    """A known wrong answer to 05.1 (facts: the list of ``WrongAnswer``) and the evidence listed under it."""

    details: Callable[[list], list] = _first_line


def _finder_rule(name: str, message, details: Callable[[list], list] = _first_line):
    """``@rule`` for 05.1: a :class:`FinderMistake` whose ``details(wrong)`` lines are listed under its message
    (by default the first case you got wrong)."""
    return lambda recognise: FinderMistake(name, recognise, message, details)


def _answered_like(approach, wrong: list) -> bool:
    """On every case you got wrong, you answered what ``approach`` (a known wrong approach) answers there."""
    return all(w.got == approach(w.model, w.inputs, w.dtype) for w in wrong)


@_finder_rule(
    "returned the model itself",
    "You returned '' — the model itself. Its forward hook fires LAST, after every submodule, and its "
    "output is non-finite as soon as anything inside is. Either you kept the last name your hooks saw "
    "(keep the first), or you scanned `model.named_modules()`, which lists the model itself first "
    "(record names in the hooks, in the order they fire).",
    details=_lines,
)
def returned_the_model_itself(wrong: list) -> bool:
    return all(w.got == "" for w in wrong if w.expected is not None) and any(w.expected for w in wrong)


@_finder_rule(
    "class name",
    "You returned the module's class name (e.g. 'Linear'); several modules share a class. Return its "
    "qualified name, the one `model.named_modules()` gives with it (e.g. '2' or 'block.fc2').",
    details=_lines,
)
def returned_the_class_name(wrong: list) -> bool:
    """Every wrong answer is the class name of the module that was expected."""
    named = [w for w in wrong if w.expected is not None]
    return bool(named) and all(w.got == type(w.model.get_submodule(w.expected)).__name__ for w in named)


def _autocast_elsewhere_message(wrong: list) -> str:
    devices = ", ".join(repr(d) for d in sorted({a.device_type for a in wrong[0].autocasts}))
    return (
        f"Your function entered autocast for {devices}, but the tensors are on "
        f"{wrong[0].inputs.device.type!r}: autocast only changes the ops of its own device type, so the "
        "model ran in float32 and nothing overflowed. Take the device type from "
        "the tensors: `torch.autocast(device_type=inputs.device.type, dtype=dtype)`."
    )


@_finder_rule("autocast for another device", _autocast_elsewhere_message)
def autocast_for_another_device(wrong: list) -> bool:
    """Every wrong call entered autocast, but only for a device type other than the tensors'."""
    return all(w.autocasts and all(a.device_type != w.inputs.device.type for a in w.autocasts) for w in wrong)


def _another_dtype_message(wrong: list) -> str:
    used = wrong[0].autocasts[0]
    how = "without dtype=, so it used this device's default, " if not used.dtype_given else "in "
    name = str(used.dtype).replace("torch.", "")
    return (
        f"Your function ran autocast {how}{name}, not in the dtype it was given "
        f"({str(wrong[0].dtype).replace('torch.', '')}): the format decides what overflows, and bfloat16 "
        "has float32's range. Pass it on: `torch.autocast(device_type=inputs.device.type, dtype=dtype)`."
    )


@_finder_rule("autocast in another dtype", _another_dtype_message)
def autocast_in_another_dtype(wrong: list) -> bool:
    """Every wrong call ran its autocast in a dtype other than the one it was given."""
    return all(w.autocasts and all(a.dtype != w.dtype for a in w.autocasts) for w in wrong)


@_finder_rule(
    "ran without autocast",
    "Your function found nothing where float16 overflows: it ran the model without autocast (or in another "
    "dtype), and in float32 these values are ordinary numbers. Run the forward "
    "inside `with torch.autocast(device_type=inputs.device.type, dtype=dtype):`.",
)
def ran_without_autocast(wrong: list) -> bool:
    return _answered_like(cases.without_autocast, wrong)


@_finder_rule(
    "kept the last",
    "You returned the LAST module whose output is non-finite. Once one value is inf/NaN every later "
    "layer (and the model itself, whose hook fires last) is non-finite too: keep the first name you see "
    "and ignore the rest (e.g. `if not found: found.append(name)`).",
)
def kept_the_last(wrong: list) -> bool:
    return _answered_like(cases.last_nonfinite, wrong)


@_finder_rule(
    "NaN only",
    "You looked for NaN only. An overflow produces +-inf first; NaN appears a layer later (inf - inf, "
    "0 * inf). Test with `torch.isfinite(output).all()`, which catches both.",
)
def nan_only(wrong: list) -> bool:
    return _answered_like(cases.nan_only, wrong)


@_finder_rule(
    "inf only",
    "You looked for inf only, so a NaN (here one that was already in the batch) went unnoticed. Test "
    "with `torch.isfinite(output).all()`, which catches inf and NaN.",
)
def inf_only(wrong: list) -> bool:
    return _answered_like(cases.inf_only, wrong)


@_finder_rule(
    "top-level children only",
    "You only watched the top-level children (model.children()), so you named the block that contains the "
    "overflowing layer. Register the hook on every module from `model.named_modules()` to see inside blocks.",
)
def top_level_children_only(wrong: list) -> bool:
    return _answered_like(cases.top_level_only, wrong)


@_finder_rule(
    "definition order",
    "You reported modules in the order they are DEFINED (named_modules()), not the order they RUN. Record "
    "the names inside the forward hooks, as the hooks fire: that is the order the values are produced.",
)
def definition_order(wrong: list) -> bool:
    return _answered_like(cases.in_definition_order, wrong)


def _containers_skipped_message(wrong: list) -> str:
    w = wrong[0]
    return (
        f"You named {w.got!r}, a module that ran after {w.expected!r}. But {w.expected!r} is a container, "
        "and its own forward code (not one of its layers) produced the first non-finite output: your hooks "
        "skipped it (hooks on leaf modules only, or on some layer types only). Register the hook on every "
        "module from `model.named_modules()`, containers included."
    )


@_finder_rule("containers skipped", _containers_skipped_message)
def containers_skipped(wrong: list) -> bool:
    """Wrong only where a container's own code overflows, naming another module there."""
    return all(
        w.expected
        and any(True for _ in w.model.get_submodule(w.expected).children())
        and w.got not in (None, "", w.expected)
        for w in wrong
    )


def _named_a_finite_case(wrong: list) -> str:
    return (
        f"On {wrong[0].label} every output is finite, so the answer is None; you returned "
        f"{wrong[0].got!r}. Return a name only when `torch.isfinite(output).all()` is False."
    )


@_finder_rule("a name where everything is finite", _named_a_finite_case, details=_no_lines)
def a_name_where_everything_is_finite(wrong: list) -> bool:
    return wrong[0].expected is None


def _named_the_model_once(wrong: list) -> str:
    return (
        f"On {wrong[0].label} you returned '' — the model itself. Its forward hook fires last, after all "
        f"submodules; the first non-finite output is {wrong[0].expected!r}."
    )


@_finder_rule("returned the model itself once", _named_the_model_once, details=_every_line_expected)
def returned_the_model_itself_once(wrong: list) -> bool:
    return wrong[0].got == ""


def _named_another_module(wrong: list) -> str:
    return (
        f"On {wrong[0].label} you returned {wrong[0].got!r}, but the first module (in the order modules "
        f"finish) whose output is non-finite is {wrong[0].expected!r}."
    )


@_finder_rule("another module", _named_another_module, details=_every_line_expected)
def another_module(wrong: list) -> bool:
    return True


# What the wrong answers, all together, say about the approach: most specific first, the last one always fits.
# A wrong approach is recognised when, on every case you got wrong, you answered what it answers.
FINDER_MISTAKES = (
    returned_the_model_itself,
    returned_the_class_name,
    autocast_for_another_device,
    autocast_in_another_dtype,
    ran_without_autocast,
    containers_skipped,
    kept_the_last,
    nan_only,
    inf_only,
    top_level_children_only,
    definition_order,
    a_name_where_everything_is_finite,
    returned_the_model_itself_once,
    another_module,
)


def _observe_call(finder, label, model, inputs, *, raised=False, dtype=DTYPE) -> tuple:
    """Call the learner's finder once: its answer and the autocasts it entered; stop at a call mistake."""
    hooks_before, global_before = hook_count(model), global_hook_count()
    state = {k: v.clone() for k, v in model.state_dict().items()}
    modes = cases.training_flags(model)
    with cases.watch_autocast() as entered:
        learner = cases.tolerating_planted_error(finder) if raised else finder
        got = call_learner(learner, model, inputs.clone(), dtype)
    changed = any(p.dtype != torch.float32 for p in model.parameters()) or any(
        not torch.equal(state[k], v) for k, v in model.state_dict().items()
    )
    call = FinderCall(
        label,
        None if raised else got,
        hook_count(model) - hooks_before,
        changed,
        autocast_enabled("cpu"),
        cases.mode_change(modes, cases.training_flags(model)),
        global_hook_count() - global_before,
        raised,
    )
    rule = first_mistake(CALL_MISTAKES, call)
    if rule:
        stop(rule.text(call))
    return got, tuple(autocast for autocast in entered if autocast.enabled)


def _wrong_answers(first_nonfinite_module) -> list:
    """Run the learner's finder on every case: the ``WrongAnswer`` list, or stop at the first call mistake."""
    wrong = []
    runs = [
        (label, model, inputs, DTYPE, expected) for label, model, inputs, expected in cases.finder_cases()
    ]
    for label, model, inputs, dtype, expected in runs + cases.dtype_cases():
        got, devices = _observe_call(first_nonfinite_module, label, model, inputs, dtype=dtype)
        if got != expected:
            wrong.append(WrongAnswer(label, got, expected, model, inputs, dtype, devices))
    return wrong


def _gpu_problem(first_nonfinite_module) -> tuple:
    """Run a right finder on a pretend GPU: ``(ran, message)``, the message None when it still finds the
    overflow. ``ran`` is False when it raised there: then nothing is claimed. A hard-coded ``"cpu"`` autocast
    is the mistake it catches."""
    label, model, inputs, expected = cases.finder_cases()[0]
    try:
        with cases.pretend_gpu() as entered:
            got = first_nonfinite_module(model, inputs.clone(), DTYPE)
    except Exception:
        return False, None
    if got == expected:
        return True, None
    elsewhere = sorted({a.device_type for a in entered if a.enabled and a.device_type != "cuda"})
    if elsewhere:
        message = (
            f"Your function enters autocast for {elsewhere[0]!r} whatever the tensors' device. Run on a "
            f"model and a batch on a GPU ('cuda'), it returned {got!r} instead of {expected!r}: "
            f"{elsewhere[0]!r} autocast does not touch CUDA tensors, so the model ran in float32. Take the "
            "device type from the tensors: `torch.autocast(device_type=inputs.device.type, dtype=dtype)`."
        )
    else:
        message = (
            f"Run on a model and a batch on a GPU ('cuda'), your function returned {got!r} instead of "
            f"{expected!r}. Take autocast's device type from the tensors: "
            "`torch.autocast(device_type=inputs.device.type, dtype=dtype)`."
        )
    return True, message


@checker("05.1 first_nonfinite_module")
def check_first_nonfinite_module(first_nonfinite_module):
    """``first_nonfinite_module(model, inputs, dtype)``: the first module (finish order) whose output is
    non-finite."""
    wrong = _wrong_answers(first_nonfinite_module)
    if wrong:
        rule = first_mistake(FINDER_MISTAKES, wrong)
        return failed(rule.text(wrong), rule.details(wrong))
    _observe_call(
        first_nonfinite_module,
        "a model whose forward raises an error",
        cases.RaisingModel(),
        cases.finder_cases()[0][2],
        raised=True,
    )
    ran, problem = _gpu_problem(first_nonfinite_module)
    if problem:
        return failed(problem)
    device = (
        "; and your autocast follows the tensors' device (tried with the model and batch on a pretend GPU)"
        if ran
        else " (on a pretend GPU your function raised, so its device handling was not checked)"
    )
    return passed(
        f"You named the first non-finite module on all {len(cases.finder_cases()) + len(cases.dtype_cases())} "
        "cases: inside blocks and in containers' own code, in the order modules run, inf as well as NaN, in "
        "the dtype you were given, None when everything is finite. Your hooks are gone afterwards, also when the "
        f"forward raises; each model keeps its train/eval mode{device}."
    )


# --------------------------------------------------------------------------------------------------
# 05.2 texture_forward(model, x): the Gram product in FP32, everything else as autocast chooses
# --------------------------------------------------------------------------------------------------
def _hiding_ops(recorder) -> list:
    """The ops that hide an overflow (clamp, nan_to_num, where, ...) the learner's forward called, sorted."""
    return sorted({c.name for c in recorder.calls if c.name in cases.HIDING_OPS})


def _hiding_message(hid) -> str:
    return (
        f"You hid the overflow instead of fixing the precision ({', '.join(hid) or 'replaced the infs'}): "
        "the output is finite but every clamped entry is wrong, so the logits no longer match the FP32 "
        "reference. Compute the product in float32 instead."
    )


_BF16_MESSAGE = (
    "Your Gram product runs in bfloat16. bfloat16 has the range (no overflow) but only 8 significant bits: "
    "products near 1e5 are rounded to steps of 512, so the pooled features and the logits move away from the "
    "FP32 reference. Use float32 for this op: `enabled=False` and .float() on the inputs."
)


_FLOAT64_MESSAGE = (
    "Your Gram product runs in float64 (.double()). float32 already holds these values with room to spare "
    "(its range reaches 3.4e38); float64 doubles the memory and, on most GPUs, costs many times the time. "
    "Use .float() on both operands."
)


def _learner_error(problem: LearnerProblem, matmul_dtypes: list) -> None:
    """Say what an error inside the learner's forward most likely means (changes the message in place).
    ``matmul_dtypes``: the dtypes the forward's matrix products produced before it stopped."""
    message = problem.result.message
    if problem.result.status != FAILED:
        return
    if "bfloat16" in matmul_dtypes:
        problem.result.message = _BF16_MESSAGE + "\n(" + message + ")"
    elif "float64" in matmul_dtypes:
        problem.result.message = _FLOAT64_MESSAGE + "\n(" + message + ")"
    elif "dtype" in message.lower():
        problem.result.message = (
            "Inside `torch.autocast(..., enabled=False)` nothing is cast for you, so a float32 and a float16 "
            "operand meet in one matmul. Cast BOTH operands with .float() inside the block.\n" + message
        )


def _could_not_follow(problem: trace.TraceProblem) -> LearnerProblem:
    return LearnerProblem(
        failed(
            f"Your forward ran something the check could not follow: {problem}. The check runs every op of "
            "your forward again on its own `x` and parameters; write it with ordinary torch operations on "
            "`x` and `model`'s layers or parameters, inside the function."
        )
    )


def _stopped(report: dict) -> LearnerProblem:
    """The learner's call stopped the check (an error, the stub): the report of it as a failure or "not done",
    never as anything better. Only a failure's own message is passed on (it describes the learner's error);
    "not done" is worded here, and any other status (a harness patched in the learner's process) gets a
    message of the checker's own."""
    problem = report.get("problem")
    status = problem.get("status") if isinstance(problem, dict) else None
    message = str(problem.get("message", ""))[:2000] if isinstance(problem, dict) else ""
    if status == NOT_DONE:
        result = not_done("`texture_forward`")
    elif status == FAILED and message:
        result = CheckResult(False, message, FAILED)
    else:
        result = failed(
            "Calling `texture_forward` stopped the check (an error, or the stub still raising "
            "NotImplementedError), and what came back about it cannot be read."
        )
    stopped = LearnerProblem(result)
    dtypes = report.get("matmul_dtypes")
    _learner_error(stopped, [str(d) for d in dtypes] if isinstance(dtypes, list) else [])
    return stopped


def _leaves(model, x) -> dict:
    """What a trace may start from: the checker's own ``x`` and the model's parameters, by the names the
    trace gives them."""
    leaves = {"x": x.detach().clone()}
    leaves.update({f"param:{name}": parameter for name, parameter in model.named_parameters()})
    return leaves


def _replayed(data: dict, model, x, *, verify: bool) -> tuple:
    """Replay a trace on ``model``'s parameters and ``x``: (the replay, the tensor of the returned reference).
    With ``verify`` every recorded value is compared and the parameters must come out unchanged."""
    before = [(p.detach().clone(), p.requires_grad) for p in model.parameters()]
    try:
        done = trace.replay(data.get("trace"), _leaves(model, x), verify=verify)
    finally:
        changed = any(
            not torch.equal(value, p) or grad != p.requires_grad
            for (value, grad), p in zip(before, model.parameters())
        )
        if changed:
            for (value, grad), p in zip(before, model.parameters()):
                p.data = value
                p.requires_grad_(grad)
    if changed:
        raise trace.TraceProblem("it changed the model's parameters in place")
    result = data.get("result") if isinstance(data.get("result"), dict) else {}
    ref = result.get("ref")
    if "value" in result and (type(ref) is not int or ref not in done.tensors):
        raise trace.TraceProblem("it returned a tensor that no op of your forward produced")
    return done, done.tensors.get(ref) if "value" in result else None


class _Returned:
    """What the learner's forward returned when it was no plain value and no tensor (only its type's name
    came back)."""

    def __init__(self, type_name: str):
        self.type_name = type_name


def _returned_value(result: dict, tensor):
    if tensor is not None:
        return tensor
    if "plain" in result and (
        result["plain"] is None or isinstance(result["plain"], (bool, int, float, str))
    ):
        return result["plain"]
    return _Returned(str(result.get("type", "object"))[:100])


def _calls(done) -> list:
    """The replay's ops as ``OpDtypeRecorder`` records them (every op that produced a floating tensor)."""
    calls = []
    for op in done.calls:
        if isinstance(op.result, torch.Tensor) and op.result.is_floating_point():
            inputs = tuple(dtype_name(t.dtype) for t in float_tensors((op.args, op.kwargs)))
            name = getattr(op.func, "__name__", str(op.func))
            calls.append(
                OpCall(
                    name,
                    inputs,
                    dtype_name(op.result.dtype),
                    bool(op.autocast[0]),
                    trace.finite(op.result),
                    tuple(op.result.shape),
                )
            )
    return calls


def _module_dtypes(done, model) -> dict:
    """The dtype ``features`` and ``head`` produced: that of the last matrix product that used their weights."""
    dtypes = {}
    for name in ("features", "head"):
        weights = {id(p) for p in getattr(model, name).parameters()}
        for op in done.calls:
            uses = any(id(t) in weights for t in float_tensors((op.args, op.kwargs)))
            if (
                uses
                and getattr(op.func, "__name__", "") in MATMUL_LIKE
                and isinstance(op.result, torch.Tensor)
            ):
                dtypes[name] = op.result.dtype
    return dtypes


def _program(data: dict):
    """The traced forward as a function of (model, x), replayed by the checker on the model's current
    parameters: what a training step and ``autograd.grad`` run through (the graph is the checker's own)."""

    def forward(model, x):
        try:
            return _replayed(data, model, x, verify=False)[1]
        except trace.TraceProblem as problem:
            raise _could_not_follow(problem) from None

    return forward


def _autocasts(report: dict) -> list:
    entered = []
    for item in report.get("entered") or []:
        if isinstance(item, list) and len(item) == 4:
            device_type, enabled, dtype, given = item
            entered.append(
                cases.Autocast(str(device_type), bool(enabled), getattr(torch, str(dtype), None), given)
            )
    return entered


def _run_learner(fn, model, x, *, autocast: bool, gpu: bool = False):
    """Trace the learner's forward beside it (``spies.trace_texture_forward``) and replay the trace here:
    ``(report, replay, returned value)``; ``None`` for the replay when it raised on the pretend GPU."""
    report = run_beside_learner(
        fn, spies.trace_texture_forward, copy.deepcopy(model), x.clone(), autocast=autocast, gpu=gpu
    )
    if not isinstance(report, dict):
        raise _could_not_follow(trace.TraceProblem("no report came back"))
    if report.get("problem"):
        raise _stopped(report)
    if report.get("raised"):
        if gpu:
            return report, None, None
        raise _could_not_follow(trace.TraceProblem("the trace of your forward broke off"))
    try:
        done, tensor = _replayed(report, model, x, verify=True)
        result = report.get("result") if isinstance(report.get("result"), dict) else {}
        if tensor is not None and not trace.same_values(result.get("value"), tensor):
            raise trace.TraceProblem("the tensor it returned is not the one its last ops computed")
    except trace.TraceProblem as problem:
        raise _could_not_follow(problem) from None
    still_on = report.get("autocast_after")
    if gpu:
        return report, done, _returned_value(result, tensor)
    if still_on and not autocast:
        raise LearnerProblem(
            failed(
                "Called without autocast, your function left autocast switched on after it returned "
                "(torch.set_autocast_enabled, or an autocast entered and never left): every op the caller "
                "runs next would be cast too. Change the precision only inside "
                "`with torch.autocast(device_type=..., enabled=...):` blocks, which restore the caller's state "
                "on exit."
            )
        )
    if autocast and not still_on:
        raise LearnerProblem(
            failed(
                "After your function returned, autocast was switched off for the caller: disable it only inside "
                "a `with torch.autocast(device_type=..., enabled=False):` block, which restores it on exit."
            )
        )
    return report, done, _returned_value(result, tensor)


def _gram_call(recorder, batch, channels):
    """The matmul that produced the [batch, C, C] Gram matrix (None when there is none)."""
    return next((c for c in recorder.matmuls if c.shape == (batch, channels, channels)), None)


@dataclass
class TextureRun:
    """One call of the learner's forward (facts for the 05.2 rules), as the checker replayed its trace: its
    output, the ops it ran, the dtype each of ``features`` and ``head`` returned, and the FP32 reference it
    must match."""

    got: object
    recorder: OpDtypeRecorder
    module_dtypes: dict
    reference: torch.Tensor
    batch: int
    channels: int
    classes: int
    entered: list = field(default_factory=list)  # (device type, enabled) of each autocast the call entered
    program: Callable | None = None  # the traced forward, replayed by the checker (see ``_program``)

    @property
    def returned_type(self) -> str:
        return self.got.type_name if isinstance(self.got, _Returned) else type(self.got).__name__

    @property
    def gram(self):
        return _gram_call(self.recorder, self.batch, self.channels)

    @property
    def hid(self) -> list:
        return _hiding_ops(self.recorder)

    @property
    def finite(self) -> bool:
        return bool(torch.isfinite(self.got).all())

    def ran_in(self, module: str):
        return self.module_dtypes.get(module)

    @property
    def matches_reference(self) -> bool:
        return self.got.dtype == torch.float32 and torch.allclose(
            self.got.detach().float(), self.reference, rtol=1e-4, atol=1e-3
        )

    @property
    def cast_after(self) -> bool:
        """A cast to float32 whose result is already non-finite: the inf came from float16 before it."""
        return any(
            c.name in ("float", "to", "type") and c.output_dtype == "float32" and not c.finite
            for c in self.recorder.calls
        )

    def switched_off(self, *, other_than: str) -> list:
        """The device types, other than ``other_than``, for which the call switched autocast off."""
        return sorted({a.device_type for a in self.entered if not a.enabled and a.device_type != other_than})

    @property
    def gram_fixed(self) -> bool:
        return (
            isinstance(self.got, torch.Tensor)
            and self.finite
            and self.gram is not None
            and (self.gram.output_dtype == "float32")
        )

    @property
    def difference(self) -> float:
        return (self.got.detach().float() - self.reference).abs().max().item()

    @property
    def tolerance(self) -> float:
        return 2e-3 * self.reference.abs().max().item() + 1e-2


def _texture_run(report, done, got, model, x, reference) -> TextureRun:
    recorder = OpDtypeRecorder("cpu")
    recorder.calls = _calls(done)
    return TextureRun(
        got,
        recorder,
        _module_dtypes(done, model),
        reference,
        x.shape[0],
        model.features[0].out_features,
        model.head.out_features,
        _autocasts(report),
        _program(report),
    )


def _observe(texture_forward, model, x, reference, *, autocast: bool) -> TextureRun:
    report, done, got = _run_learner(texture_forward, model, x, autocast=autocast)
    return _texture_run(report, done, got, model, x, reference)


def _observe_on_gpu(texture_forward, model, x, reference) -> TextureRun | None:
    """The learner's forward on a pretend GPU, under an autocast that stands for CUDA's (None when it raised
    there: then nothing is claimed)."""
    report, done, got = _run_learner(texture_forward, model, x, autocast=True, gpu=True)
    if done is None:
        return None
    return _texture_run(report, done, got, model, x, reference)


def _not_a_tensor_message(run: TextureRun) -> str:
    return (
        f"texture_forward returned a {run.returned_type}; return the logits tensor "
        "(what `model.head(...)` gives)."
    )


@rule("not a tensor", _not_a_tensor_message)
def not_a_tensor(run: TextureRun) -> bool:
    return not isinstance(run.got, torch.Tensor)


def _not_the_logits_shape_message(run: TextureRun) -> str:
    return (
        f"texture_forward returned shape {tuple(run.got.shape)}; the logits are [{run.batch}, {run.classes}] "
        "(batch, classes). Return `model.head(gram.flatten(1))`."
    )


@rule("not the logits' shape", _not_the_logits_shape_message)
def not_the_logits_shape(run: TextureRun) -> bool:
    return tuple(run.got.shape) != (run.batch, run.classes)


@rule("Gram product in bfloat16", _BF16_MESSAGE)
def gram_product_in_bfloat16_without_autocast(run: TextureRun) -> bool:
    return run.gram is not None and run.gram.output_dtype == "bfloat16"


def _hid_the_overflow_without_autocast_message(run: TextureRun) -> str:
    return (
        _hiding_message(run.hid) + " Even in float32 your clamping changes the Gram entries above "
        "65504, which are perfectly valid there."
    )


@rule("hid the overflow", _hid_the_overflow_without_autocast_message)
def hid_the_overflow_without_autocast(run: TextureRun) -> bool:
    return not run.matches_reference and run.hid


@rule(
    "changed the math",
    "Called without autocast, your function does not reproduce TextureNet.forward: keep the math as it "
    "is (features -> Gram product h^T @ h -> divide by the number of tokens -> head); only the precision "
    "of one op should change.",
)
def changed_the_math(run: TextureRun) -> bool:
    return not run.matches_reference


# 1. Called without autocast, the function must be TextureNet.forward itself.
PLAIN_MISTAKES = (
    not_a_tensor,
    not_the_logits_shape,
    gram_product_in_bfloat16_without_autocast,
    hid_the_overflow_without_autocast,
    changed_the_math,
)


@rule("not the logits", "Under autocast texture_forward did not return the [batch, classes] logits tensor.")
def not_the_logits_under_autocast(run: TextureRun) -> bool:
    return not isinstance(run.got, torch.Tensor) or tuple(run.got.shape) != (run.batch, run.classes)


@rule(
    "features in float32 too",
    "`model.features` ran in float32: your `enabled=False` block starts too early (head still "
    "runs in float16). Compute `h = model.features(x)` under autocast and switch autocast off "
    "only around the Gram product.",
)
def features_in_float32_too(run: TextureRun) -> bool:
    return run.ran_in("features") == torch.float32 and run.ran_in("head") == torch.float16


@rule(
    "everything in float32",
    "Your whole forward ran in float32: `model.features` produced float32 although it is a Linear that "
    "autocast runs in float16. Disabling autocast for the whole model throws away the mixed precision; "
    "keep `enabled=False` around the Gram product only.",
)
def everything_in_float32(run: TextureRun) -> bool:
    return run.ran_in("features") == torch.float32


@rule(
    "no Gram product",
    "No matmul produced the [batch, channels, channels] Gram matrix: compute "
    "`h.transpose(1, 2) @ h` (in float32) as TextureNet.forward does.",
)
def no_gram_product(run: TextureRun) -> bool:
    return run.gram is None


@rule("Gram product in bfloat16", _BF16_MESSAGE)
def gram_product_in_bfloat16(run: TextureRun) -> bool:
    return run.gram.output_dtype == "bfloat16"


@rule("Gram product in float64", _FLOAT64_MESSAGE)
def gram_product_in_float64(run: TextureRun) -> bool:
    return run.gram.output_dtype == "float64"


@rule(
    "inputs left in float16",
    "You switched autocast off around the Gram product but its inputs are still float16 (h comes "
    "out of a float16 Linear), so the product ran in float16 and overflowed anyway. Cast them: "
    "`h.float().transpose(1, 2) @ h.float()`.",
)
def inputs_left_in_float16(run: TextureRun) -> bool:
    return not run.finite and run.gram.output_dtype == "float16" and not run.gram.autocast


@rule(
    "the wrong op in float32",
    "You moved the wrong op to float32: `head` ran in float32, but the Gram product still ran in "
    "float16 and overflowed before head ever saw it. Use the finder's report: the first non-finite "
    "value is the input of head, computed by h^T @ h.",
)
def the_wrong_op_in_float32(run: TextureRun) -> bool:
    return not run.finite and run.ran_in("head") == torch.float32


@rule(
    "cast after the product",
    "You cast to float32 AFTER the product: `(h.transpose(1, 2) @ h).float()` converts an inf that "
    "float16 already produced. The inputs must be float32 before the matmul runs.",
)
def cast_after_the_product(run: TextureRun) -> bool:
    return not run.finite and run.cast_after


def _autocast_off_for_another_device_message(run: TextureRun) -> str:
    return (
        f"You switched autocast off for {run.switched_off(other_than='cpu')[0]!r}, but these tensors are on "
        "the CPU ('cpu'): autocast is per device type, so CPU autocast stayed on and the Gram product still "
        "ran in float16. Take the device type from the tensors: "
        "`torch.autocast(device_type=x.device.type, enabled=False)`."
    )


@rule("autocast off for another device", _autocast_off_for_another_device_message)
def autocast_off_for_another_device(run: TextureRun) -> bool:
    return not run.finite and run.gram.autocast and run.switched_off(other_than="cpu")


@rule(
    "nothing fixed",
    "Nothing was fixed: under float16 autocast the Gram product h^T @ h still runs in float16, exceeds "
    "65504 and the logits are inf/NaN. Wrap it in `with torch.autocast(device_type=x.device.type, "
    "enabled=False):` and cast its inputs with .float().",
)
def nothing_fixed(run: TextureRun) -> bool:
    return not run.finite


def _hid_the_overflow_message(run: TextureRun) -> str:
    return _hiding_message(run.hid)


@rule("hid the overflow", _hid_the_overflow_message)
def hid_the_overflow(run: TextureRun) -> bool:
    return run.hid or (run.gram.output_dtype == "float16" and not run.gram.finite)


@rule(
    "rescaled instead",
    "Your Gram product still runs in float16 and happens to stay finite (did you rescale h before the "
    "product?). That is a legitimate trick, but it still depends on float16's range — a longer sequence "
    "overflows again. This exercise practises the precision "
    "fix: autocast off locally, inputs cast to float32.",
)
def rescaled_instead(run: TextureRun) -> bool:
    return run.gram.output_dtype == "float16"


@rule(
    "float32 block too wide",
    "The Gram product is float32 now (good), but `head` ran in float32 too: your `enabled=False` block is "
    "wider than needed. End it right after the product so head's Linear runs in float16 as autocast chooses.",
)
def float32_block_too_wide(run: TextureRun) -> bool:
    return run.ran_in("head") == torch.float32


def _logits_off_the_reference_message(run: TextureRun) -> str:
    return (
        f"The logits differ from the FP32 reference by up to {run.difference:.4g} (allowed "
        f"{run.tolerance:.3g}): keep the rest of the forward unchanged."
    )


@rule("logits off the reference", _logits_off_the_reference_message)
def logits_off_the_reference(run: TextureRun) -> bool:
    return not run.difference <= run.tolerance


# 2. Under float16 autocast: finite, the Gram product in float32, the rest in float16, close to the reference.
AUTOCAST_MISTAKES = (
    not_the_logits_under_autocast,
    features_in_float32_too,
    everything_in_float32,
    no_gram_product,
    gram_product_in_bfloat16,
    gram_product_in_float64,
    inputs_left_in_float16,
    the_wrong_op_in_float32,
    cast_after_the_product,
    autocast_off_for_another_device,
    nothing_fixed,
    hid_the_overflow,
    rescaled_instead,
    float32_block_too_wide,
    logits_off_the_reference,
)


# 3. On a pretend GPU (tensors on 'cuda', the outer autocast CUDA's): the fix must follow the tensors' device.
def _gpu_outcome(run: TextureRun) -> str:
    if not isinstance(run.got, torch.Tensor) or not bool(torch.isfinite(run.got).all()):
        return "the logits are not finite"
    return f"the Gram product ran in {run.gram.output_dtype}" if run.gram else "no Gram product ran"


def _autocast_off_for_a_fixed_device_type_message(run: TextureRun) -> str:
    return (
        f"Your function switches autocast off for {run.switched_off(other_than='cuda')[0]!r} "
        "whatever the tensors' device. That works only there: run with the model and the batch on a "
        f"GPU ('cuda'), CUDA's autocast stays on and {_gpu_outcome(run)}. Take the device type from "
        "the tensors: `with torch.autocast(device_type=x.device.type, enabled=False):`."
    )


@rule("autocast off for a fixed device type", _autocast_off_for_a_fixed_device_type_message)
def autocast_off_for_a_fixed_device_type(run: TextureRun) -> bool:
    return not run.gram_fixed and run.switched_off(other_than="cuda")


def _not_fixed_on_a_gpu_message(run: TextureRun) -> str:
    return (
        f"Run with the model and the batch on a GPU ('cuda'), {_gpu_outcome(run)}: what decides the "
        "precision in your function does not follow the tensors' device. Use `torch.autocast(device_type="
        "x.device.type, enabled=False)` and .float() on both operands."
    )


@rule("not fixed on a GPU", _not_fixed_on_a_gpu_message)
def not_fixed_on_a_gpu(run: TextureRun) -> bool:
    return not run.gram_fixed


GPU_MISTAKES = (
    autocast_off_for_a_fixed_device_type,
    not_fixed_on_a_gpu,
)


def _held_out_case() -> tuple:
    """Another TextureNet and batch of the same shapes, drawn afresh for each check and never shown to the
    learner's code: ``(model, x, FP32 reference)``."""
    model, x, _ = cases.texture_case(random.SystemRandom().randrange(10_000, 2**31))
    with torch.no_grad():
        return model, x, model(x)


def _held_out_problem(run: TextureRun, held_out: tuple, *, autocast: bool) -> str | None:
    """3b. The traced ops, replayed on a model and a batch the learner's code never saw, must still give the
    right logits (None when they do). A trace is a program: one that computes the logits from ``x`` and the
    parameters passes on any batch; one that carries values fixed for the check's own batch (a made-up
    trace, logits typed in as constants) does not. Ten times the usual tolerance, so rounding never decides:
    a right forward on thousands of random TextureNets stays within 1.6 times it."""
    model, x, reference = held_out
    got = run.program(model, x)
    tolerance = 10 * (2e-3 * reference.abs().max().item() + 1e-2)
    if isinstance(got, torch.Tensor) and got.shape == reference.shape and trace.finite(got):
        difference = (got.detach().float() - reference).abs().max().item()
        if difference <= tolerance and (autocast or got.dtype == torch.float32):
            return None
    where = "under float16 autocast" if autocast else "without autocast"
    return (
        f"The ops your forward ran {where}, run again by the check on another batch and another TextureNet of "
        "the same shapes, no longer give that model's logits: your forward must compute the logits from `x` "
        "and the model's layers, not from values fixed in advance for the check's own batch."
    )


def _training_step_problem(run: TextureRun, model, x, y) -> str | None:
    """4. A real training step through the fixed forward must be finite (None when it is). It runs through the
    traced forward replayed here (``run.program``), on the model's own parameters."""
    patched = cases.WithForward(model, run.program)
    optimizer = torch.optim.SGD(patched.parameters(), lr=1e-4)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**4)
    try:
        report = find_first_nonfinite(patched, optimizer, scaler, F.cross_entropy, x, y, dtype=torch.float16)
    except LearnerProblem:
        raise
    except Exception as exc:  # the forward already ran twice above; an error here is still the learner's
        return f"A training step through texture_forward raised {type(exc).__name__}: {exc}"
    if report.found:
        return "The forward is finite but a training step through it is not. " + report.headline()
    return None


def _gradient_problem(run: TextureRun, model, x, y) -> str | None:
    """5. Gradients must still reach ``features`` (a ``no_grad`` block or ``.detach()`` cuts them). ``run`` is
    the call without autocast; its traced forward is replayed here, so the graph is the checker's own."""
    params = list(model.features.parameters())
    try:
        loss = F.cross_entropy(run.program(model, x).float(), y)
        grads = torch.autograd.grad(loss, params, allow_unused=True)
    except RuntimeError:
        grads = [None]
    if all(g is not None and bool(g.abs().sum() > 0) for g in grads):
        return None
    return (
        "Called without autocast, no gradient reaches `features` through your forward: torch.no_grad(), "
        ".detach() or .data cut the graph before the Gram product, so training would never update the "
        "features. Change only the precision (autocast off + .float()); the product must stay differentiable."
    )


@checker("05.2 texture_forward keeps only the Gram product in FP32")
def check_texture_forward(texture_forward):
    """The learner's TextureNet forward: finite under FP16 autocast, FP32 only for ``h^T @ h``, same math.

    Every call traces the forward beside the learner's code (``spies.trace_texture_forward``) and replays
    the trace here on the checker's own ``x`` and parameters (``trace.replay``): each fact below is the
    checker's own computation. The traced ops must also give the right logits on a model and batch the
    learner's code never saw, so a made-up trace passes only if it is the right forward.
    """
    held_out = _held_out_case()
    for seed in (0, 1):
        model, x, y = cases.texture_case(seed)
        with torch.no_grad():
            reference = model(x)
        runs = {}
        for rules, autocast in ((PLAIN_MISTAKES, False), (AUTOCAST_MISTAKES, True)):
            run = runs[autocast] = _observe(texture_forward, model, x, reference, autocast=autocast)
            rule = first_mistake(rules, run)
            if rule:
                return failed(rule.text(run))
            problem = _held_out_problem(run, held_out, autocast=autocast)
            if problem:
                return failed(problem)
        problem = _training_step_problem(runs[True], model, x, y) or _gradient_problem(
            runs[False], model, x, y
        )
        if problem:
            return failed(problem)
    gpu_run = _observe_on_gpu(texture_forward, model, x, reference)
    rule = first_mistake(GPU_MISTAKES, gpu_run) if gpu_run is not None else None
    if rule:
        return failed(rule.text(gpu_run))
    device = (
        " Your autocast switch follows the tensors' device (tried with the model and batch on a pretend GPU)."
        if gpu_run is not None
        else " (On a pretend GPU your forward raised, so "
        "whether it follows the tensors' device was not checked.)"
    )
    return passed(
        "Only the Gram product runs in float32; features and head still run in float16; the logits are "
        f"finite, match the FP32 reference, and a training step through your forward is finite.{device}"
    )
