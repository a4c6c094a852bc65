"""Lesson 05's checkers: name the first non-finite module, and keep exactly one op in FP32.

Both run on the CPU with small, deterministic models whose float16 overflow is certain (values between
65504 and float32's range), so a check answers in well under a second on any machine.

Each names the mistake with tables of small named rules (``amp_lessons.checks.mistakes``), first match wins:
- 05.1 checks every call (``CALL_MISTAKES``: hooks left, model changed, autocast left on, not a name), then
  reads all wrong answers together (``FINDER_MISTAKES``): a known wrong approach (no autocast, the last
  name, NaN only, ...) is recognised when, replayed on the same cases, it gives every one of them;
- 05.2 watches the learner's forward without autocast (``PLAIN_MISTAKES``: it must be TextureNet.forward)
  and under float16 autocast (``AUTOCAST_MISTAKES``: which op ran in which dtype, finite, close to FP32),
  then runs one real training step through it.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from amp_lessons.autocast_state import OpDtypeRecorder, autocast_enabled
from amp_lessons.checks.harness import FAILED, LearnerProblem, call_learner, checker, failed, passed, stop
from amp_lessons.checks.mistakes import Mistake, first_mistake
from amp_lessons.debugging import find_first_nonfinite, hook_count
from amp_lessons.models import TextureNet, texture_batch

DTYPE = torch.float16  # the autocast dtype every 05.1 case is run in

# --------------------------------------------------------------------------------------------------
# 05.1 first_nonfinite_module(model, inputs, dtype) -> qualified name | None
# --------------------------------------------------------------------------------------------------


def _nested():
    """The overflow is inside a block: the answer is 'block.fc2', not the block."""
    block = nn.Sequential(OrderedDict(fc1=nn.Linear(4, 8), relu=nn.ReLU(), fc2=nn.Linear(8, 8)))
    return nn.Sequential(OrderedDict(block=block, out=nn.Linear(8, 2)))


class _DefinedBackwards(nn.Module):
    """`late` is defined first but runs second: definition order is not execution order."""

    def __init__(self):
        super().__init__()
        self.late = nn.Linear(8, 2)
        self.early = nn.Linear(4, 8)

    def forward(self, x):
        return self.late(torch.relu(self.early(x)))


class _InlineMatmul(nn.Module):
    """The overflow happens in the container's own code; the first non-finite module *output* is `b`'s."""

    def __init__(self):
        super().__init__()
        self.a = nn.Linear(4, 8)
        self.mix = nn.Parameter(torch.full((8, 8), 2000.0))
        self.b = nn.Linear(8, 2)

    def forward(self, x):
        return self.b(torch.relu(self.a(x)) @ self.mix)


def _finder_cases():
    """(label, model, inputs, expected answer); every overflow is float16-only (finite in float32)."""

    def build(seed, factory):
        torch.manual_seed(seed)
        return factory()

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(5)
        big = torch.randn(6, 4) * 40
        quiet = torch.randn(6, 4)
        poisoned = quiet.clone()
        poisoned[2, 1] = float("nan")
        signs = torch.sign(torch.randn(8, 4))

        sequential = build(1, lambda: nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 8), nn.ReLU(),
                                                    nn.Linear(8, 2)))
        nested = build(2, _nested)
        backwards = build(3, _DefinedBackwards)
        inf_then_nan = build(4, lambda: nn.Sequential(nn.Linear(4, 8), nn.Linear(8, 4), nn.Linear(4, 2)))
        inline = build(5, _InlineMatmul)
        calm = build(6, lambda: nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2)))
        with torch.no_grad():
            sequential[2].weight.fill_(2000.0)
            nested.block.fc2.weight.fill_(2000.0)
            backwards.early.weight.copy_(signs * 800.0)
            inf_then_nan[0].weight.copy_(signs * 800.0)
            inf_then_nan[1].weight.copy_(torch.tensor([1.0, -1.0]).repeat(4, 4))
            inline.mix.fill_(2000.0)
    return [
        ("a Sequential whose 3rd layer overflows", sequential, big, "2"),
        ("a model with a nested block", nested, big, "block.fc2"),
        ("a model whose layers are defined in a different order than they run", backwards, big, "early"),
        ("a layer that gives +-inf, followed by one that turns it into NaN", inf_then_nan, big, "0"),
        ("a container whose own inline matmul overflows", inline, big, "b"),
        ("a model that stays finite", calm, quiet, None),
        ("a batch that already holds a NaN", calm, poisoned, "0"),
    ]


def _outputs_in_finish_order(model, inputs, dtype, *, autocast=True, top_only=False):
    """[(name, output)] in the order modules finished their forward (for the answer and wrong approaches)."""
    seen = []
    children = {id(m) for m in model.children()}
    handles = []
    for name, module in model.named_modules():
        if top_only and id(module) not in children:
            continue
        handles.append(module.register_forward_hook(lambda m, a, out, name=name: seen.append((name, out))))
    try:
        with torch.no_grad(), torch.autocast(device_type=inputs.device.type, dtype=dtype, enabled=autocast):
            model(inputs)
    finally:
        for handle in handles:
            handle.remove()
    return seen


def _first(pairs, test=lambda t: not bool(torch.isfinite(t).all())):
    """The first name in ``pairs`` whose output is a tensor that passes ``test`` (default: non-finite)."""
    return next((name for name, out in pairs if isinstance(out, torch.Tensor) and test(out)), None)


def _last(pairs):
    """The last non-finite output of a submodule (the model itself, '', is handled on its own)."""
    return _first([(name, out) for name, out in reversed(pairs) if name])


def _definition_order(model, pairs):
    """The first non-finite submodule output, scanning modules in the order they are defined."""
    outputs = dict(pairs)
    return _first([(name, outputs[name]) for name, _ in model.named_modules() if name and name in outputs])


def _without_autocast(model, inputs, dtype):
    return _first(_outputs_in_finish_order(model, inputs, dtype, autocast=False))


def _last_nonfinite(model, inputs, dtype):
    return _last(_outputs_in_finish_order(model, inputs, dtype))


def _nan_only(model, inputs, dtype):
    return _first(_outputs_in_finish_order(model, inputs, dtype), test=lambda t: bool(torch.isnan(t).any()))


def _inf_only(model, inputs, dtype):
    return _first(_outputs_in_finish_order(model, inputs, dtype), test=lambda t: bool(torch.isinf(t).any()))


def _top_level_only(model, inputs, dtype):
    return _first(_outputs_in_finish_order(model, inputs, dtype, top_only=True))


def _in_definition_order(model, inputs, dtype):
    return _definition_order(model, _outputs_in_finish_order(model, inputs, dtype))


@dataclass
class FinderCall:
    """What one call of the learner's finder did besides answering (facts for ``CALL_MISTAKES``)."""

    label: str
    got: object
    hooks_left: int
    changed_model: bool
    autocast_on: bool


# Checked after every call, in this order: a finder must only watch, and answer with a name or None.
CALL_MISTAKES = (
    Mistake("left hooks on the model", lambda call: call.hooks_left != 0, lambda call: (
        f"On {call.label} your function left {call.hooks_left} hook(s) on the model. Keep the handles that "
        "register_forward_hook returns and call handle.remove() on each in a `finally:` block, so they are "
        "removed even when the forward raises.")),
    Mistake("changed the model", lambda call: call.changed_model, lambda call: (
        f"On {call.label} your function changed the model (its weights or their dtype, e.g. with "
        "model.half()). A finder must only watch: autocast picks each op's dtype without touching the "
        "model.")),
    Mistake("left autocast on", lambda call: call.autocast_on,
            "Autocast is still on after your function returned: use it as `with torch.autocast(...):`."),
    Mistake("returned a module", lambda call: isinstance(call.got, nn.Module),
            "You returned a module object; return its qualified name, the string `model.named_modules()` "
            "gives with it (e.g. 'block.fc2')."),
    Mistake("returned neither a name nor None",
            lambda call: call.got is not None and not isinstance(call.got, str), lambda call: (
                f"Your function returned a {type(call.got).__name__}; return a module name (str) or None.")),
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


def _lines(wrong: list, words: str = "the first non-finite module is") -> list:
    return [f"{w.label}: you returned {w.got!r}, {words} {w.expected!r}" for w in wrong]


@dataclass(frozen=True)
class FinderMistake(Mistake):
    """A known wrong answer to 05.1 (facts: the list of ``WrongAnswer``) and the evidence listed under it."""

    details: Callable[[list], list] = lambda wrong: _lines(wrong[:1])


def _everywhere(approach):
    """recognise: on every case you got wrong, you answered what ``approach`` answers there."""
    return lambda wrong: all(w.got == approach(w.model, w.inputs, w.dtype) for w in wrong)


def _returned_the_model_itself(wrong: list) -> bool:
    return all(w.got == "" for w in wrong if w.expected is not None) and any(w.expected for w in wrong)


def _named_a_finite_case(wrong: list) -> str:
    return (f"On {wrong[0].label} every output is finite, so the answer is None; you returned "
            f"{wrong[0].got!r}. Return a name only when `torch.isfinite(output).all()` is False.")


def _named_the_model_once(wrong: list) -> str:
    return (f"On {wrong[0].label} you returned '' — the model itself. Its forward hook fires last, after all "
            f"submodules; the first non-finite output is {wrong[0].expected!r}.")


def _named_another_module(wrong: list) -> str:
    return (f"On {wrong[0].label} you returned {wrong[0].got!r}, but the first module (in the order modules "
            f"finish) whose output is non-finite is {wrong[0].expected!r}.")


# What the wrong answers, all together, say about the approach: most specific first, the last one always fits.
# A wrong approach is recognised when, on every case you got wrong, you answered what it answers.
FINDER_MISTAKES = (
    FinderMistake("returned the model itself", _returned_the_model_itself, (
        "You returned '' — the model itself. Its forward hook fires LAST, after every submodule, and its "
        "output is non-finite as soon as anything inside is. Either you kept the last name your hooks saw "
        "(keep the first), or you scanned `model.named_modules()`, which lists the model itself first "
        "(record names in the hooks, in the order they fire)."), details=_lines),
    FinderMistake("ran without autocast", _everywhere(_without_autocast), (
        "Your function found nothing where float16 overflows: it ran the model without autocast (or in "
        "another dtype), and in float32 these values are ordinary numbers. Run the forward inside `with "
        "torch.autocast(device_type=inputs.device.type, dtype=dtype):`.")),
    FinderMistake("kept the last", _everywhere(_last_nonfinite), (
        "You returned the LAST module whose output is non-finite. Once one value is inf/NaN every later "
        "layer (and the model itself, whose hook fires last) is non-finite too: keep the first name you see "
        "and ignore the rest (e.g. `if not found: found.append(name)`).")),
    FinderMistake("NaN only", _everywhere(_nan_only), (
        "You looked for NaN only. An overflow produces +-inf first; NaN appears a layer later (inf - inf, "
        "0 * inf). Test with `torch.isfinite(output).all()`, which catches both.")),
    FinderMistake("inf only", _everywhere(_inf_only), (
        "You looked for inf only, so a NaN (here one that was already in the batch) went unnoticed. Test "
        "with `torch.isfinite(output).all()`, which catches inf and NaN.")),
    FinderMistake("top-level children only", _everywhere(_top_level_only), (
        "You only watched the top-level children (model.children()), so you named the block that contains "
        "the overflowing layer. Register the hook on every module from `model.named_modules()` to see inside "
        "blocks.")),
    FinderMistake("definition order", _everywhere(_in_definition_order), (
        "You reported modules in the order they are DEFINED (named_modules()), not the order they RUN. "
        "Record the names inside the forward hooks, as the hooks fire: that is the order the values are "
        "produced.")),
    FinderMistake("a name where everything is finite", lambda wrong: wrong[0].expected is None,
                  _named_a_finite_case, details=lambda wrong: []),
    FinderMistake("returned the model itself once", lambda wrong: wrong[0].got == "", _named_the_model_once,
                  details=lambda wrong: _lines(wrong, "expected")),
    FinderMistake("another module", lambda wrong: True, _named_another_module,
                  details=lambda wrong: _lines(wrong, "expected")),
)


def _wrong_answers(first_nonfinite_module) -> list:
    """Run the learner's finder on every case: the ``WrongAnswer`` list, or stop at the first call mistake."""
    wrong = []
    for label, model, inputs, expected in _finder_cases():
        hooks_before = hook_count(model)
        state = {k: v.clone() for k, v in model.state_dict().items()}
        got = call_learner(first_nonfinite_module, model, inputs.clone(), DTYPE)
        changed = any(p.dtype != torch.float32 for p in model.parameters()) or any(
            not torch.equal(state[k], v) for k, v in model.state_dict().items())
        call = FinderCall(label, got, hook_count(model) - hooks_before, changed, autocast_enabled("cpu"))
        rule = first_mistake(CALL_MISTAKES, call)
        if rule:
            stop(rule.text(call))
        if got != expected:
            wrong.append(WrongAnswer(label, got, expected, model, inputs, DTYPE))
    return wrong


@checker("05.1 first_nonfinite_module")
def check_first_nonfinite_module(first_nonfinite_module):
    """``first_nonfinite_module(model, inputs, dtype)``: the first module (finish order) whose output is
    non-finite."""
    wrong = _wrong_answers(first_nonfinite_module)
    if not wrong:
        return passed(
            "You named the first non-finite module on all seven cases: inside blocks, in the order modules "
            "run, inf as well as NaN, None when everything is finite, and your hooks are gone afterwards."
        )
    rule = first_mistake(FINDER_MISTAKES, wrong)
    return failed(rule.text(wrong), rule.details(wrong))


# --------------------------------------------------------------------------------------------------
# 05.2 texture_forward(model, x): the Gram product in FP32, everything else as autocast chooses
# --------------------------------------------------------------------------------------------------
_HIDING_OPS = {"clamp", "clamp_", "clip", "clip_", "nan_to_num", "nan_to_num_", "where", "masked_fill",
               "masked_fill_",
               "clamp_max", "clamp_min", "minimum", "maximum", "hardtanh"}


def _hiding_ops(recorder) -> list:
    """The ops that hide an overflow (clamp, nan_to_num, where, ...) the learner's forward called, sorted."""
    return sorted({c.name for c in recorder.calls if c.name in _HIDING_OPS})


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


class _Patched(nn.Module):
    """A TextureNet whose forward is the learner's function (so a real training step can run through it)."""

    def __init__(self, inner, forward_fn):
        super().__init__()
        self.inner = inner
        self.forward_fn = forward_fn

    def forward(self, x):
        return self.forward_fn(self.inner, x)


def _texture_case(seed: int):
    model = TextureNet(seed=seed)
    x, y = texture_batch(n=8, seed=seed)
    return model, x, y


def _run_learner(fn, model, x, *, autocast: bool):
    """Call the learner's forward, watching op dtypes and the dtypes of `features` / `head` outputs."""
    module_dtypes = {}
    handles = [
        module.register_forward_hook(lambda m, a, out, name=name: module_dtypes.__setitem__(name, out.dtype))
        for name, module in (("features", model.features), ("head", model.head))
    ]
    recorder = OpDtypeRecorder("cpu")
    try:
        with torch.autocast(device_type="cpu", dtype=torch.float16, enabled=autocast):
            with recorder:
                got = call_learner(fn, model, x.clone(), what="`texture_forward`")
            still_on = autocast_enabled("cpu")
    except LearnerProblem as problem:
        message = problem.result.message
        if problem.result.status == FAILED and any(c.output_dtype == "bfloat16" for c in recorder.matmuls):
            problem.result.message = _BF16_MESSAGE + "\n(" + message + ")"
        elif problem.result.status == FAILED and "dtype" in message.lower():
            problem.result.message = (
                "Inside `torch.autocast(..., enabled=False)` nothing is cast for you, so a float32 and a "
                "float16 operand meet in one matmul. Cast BOTH operands with .float() inside the "
                "block.\n" + message
            )
        raise
    finally:
        for handle in handles:
            handle.remove()
    if autocast and not still_on:
        raise LearnerProblem(failed(
            "After your function returned, autocast was switched off for the caller: disable it only inside "
            "a `with torch.autocast(device_type=..., enabled=False):` block, which restores it on exit."))
    return got, recorder, module_dtypes


def _gram_call(recorder, batch, channels):
    """The matmul that produced the [batch, C, C] Gram matrix (None when there is none)."""
    return next((c for c in recorder.matmuls if c.shape == (batch, channels, channels)), None)


@dataclass
class TextureRun:
    """One call of the learner's forward (facts for the 05.2 rules): its output, the ops it ran, the dtype
    each of ``features`` and ``head`` returned, and the FP32 reference it must match."""

    got: object
    recorder: OpDtypeRecorder
    module_dtypes: dict
    reference: torch.Tensor
    batch: int
    channels: int
    classes: int

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
        return self.got.dtype == torch.float32 and torch.allclose(self.got.detach().float(), self.reference,
                                                                   rtol=1e-4, atol=1e-3)

    @property
    def cast_after(self) -> bool:
        """A cast to float32 whose result is already non-finite: the inf came from float16 before it."""
        return any(c.name in ("float", "to", "type") and c.output_dtype == "float32" and not c.finite
                   for c in self.recorder.calls)

    @property
    def difference(self) -> float:
        return (self.got.detach().float() - self.reference).abs().max().item()

    @property
    def tolerance(self) -> float:
        return 2e-3 * self.reference.abs().max().item() + 1e-2


def _observe(texture_forward, model, x, reference, *, autocast: bool) -> TextureRun:
    got, recorder, module_dtypes = _run_learner(texture_forward, model, x, autocast=autocast)
    return TextureRun(got, recorder, module_dtypes, reference, x.shape[0], model.features[0].out_features,
                      model.head.out_features)


# 1. Called without autocast, the function must be TextureNet.forward itself.
PLAIN_MISTAKES = (
    Mistake("not a tensor", lambda run: not isinstance(run.got, torch.Tensor), lambda run: (
        f"texture_forward returned a {type(run.got).__name__}; return the logits tensor "
        "(what `model.head(...)` gives).")),
    Mistake("not the logits' shape", lambda run: tuple(run.got.shape) != (run.batch, run.classes),
            lambda run: (
        f"texture_forward returned shape {tuple(run.got.shape)}; the logits are [{run.batch}, {run.classes}] "
        "(batch, classes). Return `model.head(gram.flatten(1))`.")),
    Mistake("Gram product in bfloat16",
            lambda run: run.gram is not None and run.gram.output_dtype == "bfloat16", _BF16_MESSAGE),
    Mistake("hid the overflow", lambda run: not run.matches_reference and run.hid, lambda run: (
        _hiding_message(run.hid) + " Even in float32 your clamping changes the Gram entries above "
        "65504, which are perfectly valid there.")),
    Mistake("changed the math", lambda run: not run.matches_reference, (
        "Called without autocast, your function does not reproduce TextureNet.forward: keep the math as it "
        "is (features -> Gram product h^T @ h -> divide by the number of tokens -> head); only the precision "
        "of one op should change.")),
)

# 2. Under float16 autocast: finite, the Gram product in float32, the rest in float16, close to the reference.
AUTOCAST_MISTAKES = (
    Mistake("not the logits", lambda run: not isinstance(run.got, torch.Tensor)
            or tuple(run.got.shape) != (run.batch, run.classes),
            "Under autocast texture_forward did not return the [batch, classes] logits tensor."),
    Mistake("everything in float32", lambda run: run.ran_in("features") == torch.float32, (
        "Your whole forward ran in float32: `model.features` produced float32 although it is a Linear that "
        "autocast runs in float16. Disabling autocast for the whole model throws away the mixed precision; "
        "keep `enabled=False` around the Gram product only.")),
    Mistake("no Gram product", lambda run: run.gram is None, (
        "No matmul produced the [batch, channels, channels] Gram matrix: compute "
        "`h.transpose(1, 2) @ h` (in float32) as TextureNet.forward does.")),
    Mistake("Gram product in bfloat16", lambda run: run.gram.output_dtype == "bfloat16", _BF16_MESSAGE),
    Mistake("inputs left in float16",
            lambda run: not run.finite and run.gram.output_dtype == "float16" and not run.gram.autocast, (
                "You switched autocast off around the Gram product but its inputs are still float16 (h comes "
                "out of a float16 Linear), so the product ran in float16 and overflowed anyway. Cast them: "
                "`h.float().transpose(1, 2) @ h.float()`.")),
    Mistake("the wrong op in float32", lambda run: not run.finite and run.ran_in("head") == torch.float32, (
        "You moved the wrong op to float32: `head` ran in float32, but the Gram product still ran in "
        "float16 and overflowed before head ever saw it. Use the finder's report: the first non-finite "
        "value is the input of head, computed by h^T @ h.")),
    Mistake("cast after the product", lambda run: not run.finite and run.cast_after, (
        "You cast to float32 AFTER the product: `(h.transpose(1, 2) @ h).float()` converts an inf that "
        "float16 already produced. The inputs must be float32 before the matmul runs.")),
    Mistake("nothing fixed", lambda run: not run.finite, (
        "Nothing was fixed: under float16 autocast the Gram product h^T @ h still runs in float16, exceeds "
        "65504 and the logits are inf/NaN. Wrap it in `with torch.autocast(device_type=x.device.type, "
        "enabled=False):` and cast its inputs with .float().")),
    Mistake("hid the overflow",
            lambda run: run.hid or (run.gram.output_dtype == "float16" and not run.gram.finite),
            lambda run: _hiding_message(run.hid)),
    Mistake("rescaled instead", lambda run: run.gram.output_dtype == "float16", (
        "Your Gram product still runs in float16 and happens to stay finite (did you rescale h before the "
        "product?). That is a legitimate trick, but it still depends on float16's range — a longer sequence "
        "overflows again. This exercise practises the precision fix: autocast off locally, inputs cast "
        "to float32.")),
    Mistake("float32 block too wide", lambda run: run.ran_in("head") == torch.float32, (
        "The Gram product is float32 now (good), but `head` ran in float32 too: your `enabled=False` block "
        "is wider than needed. End it right after the product so head's Linear runs in float16 as "
        "autocast chooses.")),
    Mistake("logits off the reference", lambda run: not run.difference <= run.tolerance, lambda run: (
        f"The logits differ from the FP32 reference by up to {run.difference:.4g} (allowed "
        f"{run.tolerance:.3g}): keep the rest of the forward unchanged.")),
)


def _training_step_problem(texture_forward, model, x, y) -> str | None:
    """3. A real training step through the fixed forward must be finite (None when it is)."""
    patched = _Patched(model, texture_forward)
    optimizer = torch.optim.SGD(patched.parameters(), lr=1e-4)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 4)
    try:
        report = find_first_nonfinite(patched, optimizer, scaler, F.cross_entropy, x, y, dtype=torch.float16)
    except LearnerProblem:
        raise
    except Exception as exc:  # the forward already ran twice above; an error here is still the learner's
        return f"A training step through texture_forward raised {type(exc).__name__}: {exc}"
    if report.found:
        return "The forward is finite but a training step through it is not. " + report.headline()
    return None


@checker("05.2 texture_forward keeps only the Gram product in FP32")
def check_texture_forward(texture_forward):
    """The learner's TextureNet forward: finite under FP16 autocast, FP32 only for ``h^T @ h``, same math."""
    for seed in (0, 1):
        model, x, y = _texture_case(seed)
        with torch.no_grad():
            reference = model(x)
        for rules, autocast in ((PLAIN_MISTAKES, False), (AUTOCAST_MISTAKES, True)):
            run = _observe(texture_forward, model, x, reference, autocast=autocast)
            rule = first_mistake(rules, run)
            if rule:
                return failed(rule.text(run))
        problem = _training_step_problem(texture_forward, model, x, y)
        if problem:
            return failed(problem)
    return passed(
        "Only the Gram product runs in float32; features and head still run in float16; the logits are "
        "finite, match the FP32 reference, and a training step through your forward is finite."
    )
