"""Lesson 02's checkers: the fraction of a gradient lost to underflow/overflow, the largest safe loss scale.

Both compare the learner's function with an oracle on many tensors (typical gradients spread over 60
octaves, BF16-range values, empty, all-zero, subnormal-only, inf/NaN, huge values, values right at the
rounding edges 2^-25 and 65520) and, when an answer is wrong, replay the usual mistakes on the same inputs
to name the one that explains it.
"""

from __future__ import annotations

import math
from functools import partial

import torch

from amp_lessons.checks.harness import (
    FAILED,
    LearnerProblem,
    as_number,
    call_learner,
    checker,
    failed,
    passed,
    stop,
)
from amp_lessons.checks.mistakes import Mistake, best_mistake, rule
from amp_lessons.core.environment import dtype_name
from amp_lessons.l02_fp16_underflow_and_loss_scaling.scaling import classify, flat_values, limits
from amp_lessons.l02_fp16_underflow_and_loss_scaling.scaling import log_uniform as _log_uniform

F16, BF16 = torch.float16, torch.bfloat16


def _call(fn, case: str, *args):
    """call_learner, with the input named in the message when the learner's code fails on it."""
    try:
        return call_learner(fn, *args)
    except LearnerProblem as problem:
        if problem.result.status == FAILED:
            problem.result.message += f"\n(This happened on the input: {case}.)"
        raise


def _same(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-9)  # a float32 mean() is fine


def _run_cases(cases: list, answer, oracle):
    """``answer(*case)`` for every case, then the oracle up to the first disagreement.

    Returns ``(answers, first_wrong, expected)``: the learner's answers in case order, the index of the first
    one the oracle disagrees with (None when all agree) and the oracle's answer for it.
    """
    answers = [answer(*case) for case in cases]
    for index, case in enumerate(cases):
        expected = oracle(*case[1:])
        if not _matches(answers[index], expected):
            return answers, index, expected
    return answers, None, None


def _explain(answers: list, cases: list, rules, first_wrong: int) -> Mistake | None:
    """The rule that reproduces the learner's answer on the first wrong input (and on most others)."""
    candidates = [rule for rule in rules if rule.matches(cases[first_wrong], answers[first_wrong])]
    rule, _ = best_mistake(candidates, zip(cases, answers))
    return rule


def _matches(a, b) -> bool:
    if a is None or b is None:
        return a is None and b is None
    if isinstance(a, tuple):
        return all(_same(float(x), float(y)) for x, y in zip(a, b))
    return _same(float(a), float(b))


# ----------------------------------------------------------------------------- 02.1 lost_fractions


def _oracle_fractions(grad, dtype, scale):
    counts = classify(grad, dtype, scale)
    n = counts["nonzero"]
    return (counts["zero"] / n, counts["inf"] / n) if n else (0.0, 0.0)


def _fraction_cases():
    """(description, tensor, dtype, scale) — the order matters only for which failure is reported first."""
    spread = _log_uniform(1500, -40, 20, seed=1)
    wide = _log_uniform(1500, -150, 127, seed=2)
    edges = torch.tensor(
        [
            2.0**-26,
            2.0**-25,
            1.5 * 2.0**-25,
            0.75 * 2.0**-24,
            2.0**-24,
            3 * 2.0**-24,
            2.0**-15,
            2.0**-14,
            0.5,
            65504.0,
            65510.0,
            65519.0,
            65520.0,
            65536.0,
            1e5,
        ]
    )
    negative = -_log_uniform(1000, -40, 20, seed=3, signed=False)
    subnormal_only = torch.tensor(
        [2.0**-24, 2.0**-20, 2.0**-15, -(2.0**-17), 1.25 * 2.0**-24, 2.0**-14 * 0.999]
    )
    mixed = torch.cat(
        [
            _log_uniform(1000, -35, 18, seed=4),
            torch.zeros(300),
            torch.tensor([float("inf"), float("-inf"), float("nan")] * 50),
        ]
    )
    huge = torch.tensor([1e5, -1e5, 3e38, -3e38, 1e30, 7e4, -7e4, 1.0])
    cases = [
        (
            f"log-uniform gradients 2^-40..2^20, random signs, {dtype_name(F16)}, scale 2^{e}",
            spread,
            F16,
            2.0**e,
        )
        for e in (0, 8, 16, 24)
    ]
    cases += [
        (
            "values at the rounding edges (2^-26, 2^-25, 1.5*2^-25, ..., 65510, 65519, "
            "65520, 1e5), float16, scale 1",
            edges,
            F16,
            1.0,
        ),
        ("only negative gradients 2^-40..2^20, float16, scale 2^16", negative, F16, 2.0**16),
        ("FP16-subnormal values only (2^-24..2^-14), float16, scale 1", subnormal_only, F16, 1.0),
        ("gradients with zeros, inf and NaN mixed in, float16, scale 2^8", mixed, F16, 2.0**8),
        ("huge values (1e5, 3e38, ...), float16, scale 2^8", huge, F16, 2.0**8),
        ("values 2^-150..2^127 (BF16's whole range), bfloat16, scale 1", wide, BF16, 1.0),
        ("values 2^-150..2^127, bfloat16, scale 2^16", wide, BF16, 2.0**16),
        ("huge values (1e5, 3e38, ...), bfloat16, scale 2^8", huge, BF16, 2.0**8),
    ]
    return cases


def _edge_fraction_cases():
    return [
        ("an empty tensor", torch.zeros(0), F16, 1.0),
        ("an all-zero tensor", torch.zeros(100), F16, 2.0**16),
        (
            "a tensor holding only inf and NaN",
            torch.tensor([float("inf"), float("nan"), float("-inf")]),
            F16,
            1.0,
        ),
    ]


def _finite_nonzero(grad):
    return grad[torch.isfinite(grad) & (grad != 0)]


# Known wrong answers. A rule reads one ``(case, answer)`` pair: the checker's input ``(description, *args)``
# and the learner's answer on it. Most rules are *models*: a wrong implementation, replayed on the same
# arguments. (``mistakes.replays`` reads facts ``(*inputs, expected, got)``; these facts carry the case's
# description first and no expected answer, hence ``model_rule`` here.)


def _reproduces(wrong, case, answer) -> bool:
    """Does the wrong implementation give the learner's answer on this case?"""
    return _matches(wrong(*case[1:]), answer)


def model_rule(name: str, message: str):
    """``@rule`` for a model: decorate a wrong implementation (same arguments as the exercise's function)."""
    return lambda wrong: rule(name, message)(partial(_reproduces, wrong))


def _ratio(mask, denominator):
    return int(mask.sum()) / denominator if denominator else 0.0


def _power_of_two_above_max(fmt):
    return 2.0 ** math.ceil(math.log2(fmt.max))


_TINY = "the smallest subnormal 2^-24"

# -- 02.1: wrong implementations of lost_fractions(grad, dtype, scale), each reproducing one mistake exactly


@model_rule(
    "swapped",
    "You returned (overflow, underflow): the exercise asks for (underflow, overflow), in that order.",
)
def swapped_pair(grad, dtype, scale):
    return _oracle_fractions(grad, dtype, scale)[::-1]


@model_rule(
    "percent", "Your numbers are 100 times too large: return fractions between 0 and 1, not percentages."
)
def percentages(grad, dtype, scale):
    return tuple(100 * v for v in _oracle_fractions(grad, dtype, scale))


@model_rule("counts", "You returned counts, not fractions: divide by the number of nonzero finite values.")
def counts_not_fractions(grad, dtype, scale):
    return tuple(v * _finite_nonzero(grad).numel() for v in _oracle_fractions(grad, dtype, scale))


@model_rule(
    "no scale", "Your answer does not change with `scale`: multiply the gradient by `scale` before casting."
)
def scale_ignored(grad, dtype, scale):
    return _oracle_fractions(grad, dtype, 1.0)


@model_rule(
    "divided by scale",
    "You divided by `scale`: loss scaling *multiplies* each value (`g * scale`) before the cast, "
    "which is what lifts small gradients out of the underflow range.",
)
def divided_by_scale(grad, dtype, scale):
    return _oracle_fractions(grad, dtype, 1.0 / scale)


@rule(
    "yes/no",
    'You returned 1.0 or 0.0 ("was anything lost?", e.g. `.any()`) instead of a fraction: '
    "divide the number of values lost by the number of nonzero finite values.",
)
def answered_yes_or_no(case, answer) -> bool:
    under, over = _oracle_fractions(*case[1:])
    return any(_matches(v, answer) for v in ((under, over > 0), (under > 0, over), (under > 0, over > 0)))


@model_rule(
    "cast first",
    "You cast to the low-precision dtype first and scaled afterwards (`g.to(dtype) * scale`): "
    "by then the small values are already 0. Loss scaling works because the multiplication happens before "
    "the value is stored in FP16: compute `(g * scale).to(dtype)`.",
)
def cast_then_scaled(grad, dtype, scale):
    g = _finite_nonzero(grad)
    c = g.to(dtype) * scale
    return _ratio(c == 0, g.numel()), _ratio(torch.isinf(c), g.numel())


@model_rule(
    "normal threshold",
    "You counted subnormal results as underflow (compared with the smallest *normal* 2^-14). "
    "A subnormal is still nonzero, only less precise; underflow means the cast gives exactly 0, i.e. "
    f"below {_TINY} (after rounding).",
)
def below_smallest_normal(grad, dtype, scale):
    g = _finite_nonzero(grad)
    c = (g * scale).to(dtype)
    return _ratio(c.abs() < torch.finfo(dtype).smallest_normal, g.numel()), _ratio(torch.isinf(c), g.numel())


@model_rule(
    "thresholds",
    f"You compared |g * scale| with {_TINY} and with 65504 instead of casting. "
    "Casting rounds to nearest: values above 2^-25 round *up* to 2^-24 and survive, and values below 65520 "
    "round *down* to 65504 and stay finite. Cast and test the result (`== 0`, `isinf`).",
)
def compared_with_the_limits(grad, dtype, scale):
    g = _finite_nonzero(grad)
    fmt = limits(dtype)
    s = (g * scale).abs()
    return _ratio(s < fmt.smallest_subnormal, g.numel()), _ratio(s > fmt.max, g.numel())


@model_rule(
    "eps",
    "You compared with torch.finfo(dtype).eps, "
    "which measures *precision* (the gap between 1.0 and the next number: 2^-10 in float16), "
    "not *range*: values far below eps, down to the smallest subnormal 2^-24, are stored fine. "
    f"Underflow means the cast gives exactly 0: below {_TINY} after rounding. Cast and test `== 0`.",
)
def underflow_below_eps(grad, dtype, scale):
    g = _finite_nonzero(grad)
    s = g * scale
    return _ratio(s.abs() < torch.finfo(dtype).eps, g.numel()), _ratio(torch.isinf(s.to(dtype)), g.numel())


@model_rule(
    "overflow by comparing with max",
    "Your underflow is right, but you tested overflow with |g * scale| > finfo.max (65504 in float16). "
    "Casting rounds to nearest: values below 65520 round *down* to 65504 and stay finite. "
    "Test the cast the same way you did for underflow: `torch.isinf((g * scale).to(dtype))`.",
)
def overflow_compared_with_max(grad, dtype, scale):
    g = _finite_nonzero(grad)
    s = g * scale
    return _ratio(s.to(dtype) == 0, g.numel()), _ratio(s.abs() > limits(dtype).max, g.numel())


@model_rule(
    "underflow by comparing with the smallest subnormal",
    f"Your overflow is right, but you tested underflow with |g * scale| < {_TINY}. "
    "Casting rounds to nearest: values above 2^-25 round *up* to 2^-24 and survive. "
    "Test the cast the same way you did for overflow: `(g * scale).to(dtype) == 0`.",
)
def underflow_compared_with_tiny(grad, dtype, scale):
    g = _finite_nonzero(grad)
    s = g * scale
    under = s.abs() < limits(dtype).smallest_subnormal
    return _ratio(under, g.numel()), _ratio(torch.isinf(s.to(dtype)), g.numel())


@model_rule(
    "2^-23",
    f"Off by one in the exponent: you treated everything below 2^-23 as underflow, but {_TINY} itself is "
    "representable (and values above 2^-25 round up to it). Cast and test `== 0` instead.",
)
def underflow_below_2_23(grad, dtype, scale):
    g = _finite_nonzero(grad)
    s = g * scale
    under = s.abs() < limits(dtype).smallest_subnormal * 2.0
    return _ratio(under, g.numel()), _ratio(torch.isinf(s.to(dtype)), g.numel())


@model_rule(
    "2^-25",
    "Off by one in the exponent: you compared with 2^-25, but exactly 2^-25 is a tie that rounds to 0 "
    "(ties go to the even neighbour, 0). Cast and test `== 0` instead of comparing.",
)
def underflow_below_2_25(grad, dtype, scale):
    g = _finite_nonzero(grad)
    s = g * scale
    under = s.abs() < limits(dtype).smallest_subnormal * 0.5
    return _ratio(under, g.numel()), _ratio(torch.isinf(s.to(dtype)), g.numel())


@model_rule(
    "65536",
    "You used 2^16 = 65536 as FP16's overflow limit, but values from 65520 up already round to inf "
    "(the largest FP16 number is 65504). Cast and test `torch.isinf` instead.",
)
def overflow_at_65536(grad, dtype, scale):
    g = _finite_nonzero(grad)
    s = g * scale
    over = s.abs() >= _power_of_two_above_max(limits(dtype))
    return _ratio(s.to(dtype) == 0, g.numel()), _ratio(over, g.numel())


@model_rule(
    "no abs",
    "You ignored the sign: `g * scale < threshold` is true for every negative gradient, and a large "
    "negative value never exceeds +65504. Negative gradients under/overflow exactly like positive ones: "
    "cast and test (`== 0`, `torch.isinf`), or use `.abs()`.",
)
def sign_ignored(grad, dtype, scale):
    g = _finite_nonzero(grad)
    fmt = limits(dtype)
    s = g * scale
    return _ratio(s < fmt.smallest_subnormal, g.numel()), _ratio(s > fmt.max, g.numel())


@model_rule(
    "positive inf only",
    "You counted only +inf as overflow: large *negative* values become -inf. Use `torch.isinf`.",
)
def positive_inf_only(grad, dtype, scale):
    g = _finite_nonzero(grad)
    c = (g * scale).to(dtype)
    return _ratio(c == 0, g.numel()), _ratio(c == float("inf"), g.numel())


@model_rule(
    "over numel",
    "You divided by `grad.numel()`, which includes zeros and inf/NaN. "
    "The fractions are of the nonzero, finite values only.",
)
def divided_by_numel(grad, dtype, scale):
    n = grad.numel()
    c = (_finite_nonzero(grad) * scale).to(dtype)
    return _ratio(c == 0, n), _ratio(torch.isinf(c), n)


# Three ways to get the zeros wrong, each a different answer with its own test: zeros (and inf) counted
# over all values, zeros left out of the counts but kept in the denominator, zeros counted among the finite.


@model_rule(
    "zeros counted",
    "You counted values that were already 0 in FP32 as underflow. Underflow means nonzero *before* the cast "
    "and zero after: leave zeros (and inf/NaN) out of both counts and the denominator.",
)
def zeros_and_inf_counted(grad, dtype, scale):
    c = (grad[~torch.isnan(grad)] * scale).to(dtype)
    n = grad.numel()
    return _ratio(c == 0, n), _ratio(torch.isinf(c), n)


@model_rule(
    "zeros in the denominator",
    "You counted right, but divided by the number of finite values, zeros included. "
    "The fractions are of the nonzero finite values: a value that was already 0 in FP32 lost nothing to the "
    "cast, so it belongs in neither the counts nor the denominator.",
)
def zeros_in_the_denominator(grad, dtype, scale):
    finite = grad[torch.isfinite(grad)]
    c = (finite[finite != 0] * scale).to(dtype)
    return _ratio(c == 0, finite.numel()), _ratio(torch.isinf(c), finite.numel())


@model_rule(
    "zeros counted finite",
    "You counted values that were already 0 in FP32 as underflow (and in the denominator). "
    "Keep only nonzero, finite values: `g = g[torch.isfinite(g) & (g != 0)]`.",
)
def zeros_counted_among_the_finite(grad, dtype, scale):
    f = grad[torch.isfinite(grad)]
    c = (f * scale).to(dtype)
    return _ratio(c == 0, f.numel()), _ratio(torch.isinf(c), f.numel())


@model_rule(
    "nonfinite kept",
    "You kept inf/NaN values that were already in the gradient: they count as overflow in your answer. "
    "Scaling cannot cause or fix them; leave them out (use `torch.isfinite`).",
)
def nonfinite_kept(grad, dtype, scale):
    g = grad[grad != 0]
    c = (g * scale).to(dtype)
    return _ratio(c == 0, g.numel()), _ratio(torch.isinf(c) | torch.isnan(c), g.numel())


@model_rule(
    "always fp16",
    "Your answer ignores `dtype`: for bfloat16 the thresholds are 2^-133 and about 3.4e38. "
    "Cast to the `dtype` you are given (or read the limits from `torch.finfo(dtype)`).",
)
def always_float16(grad, dtype, scale):
    return _oracle_fractions(grad, F16, scale)


# Found in the class round (issue 19): each gave "differ from the definition" or another mistake's message.


@model_rule(
    "integer division",
    "You divided with `//`: integer division of a count by a larger count is always 0. "
    "Use `/` to get the fraction.",
)
def integer_division(grad, dtype, scale):
    return tuple(float(math.floor(v)) for v in _oracle_fractions(grad, dtype, scale))


@rule(
    "rounded",
    "Your fractions are rounded (`round(x, 2)` or similar): return them as computed. A small fraction "
    "lost to underflow rounds to 0, and the small losses are the ones that say the scale is too low.",
)
def rounded_fractions(case, answer) -> bool:
    expected = _oracle_fractions(*case[1:])
    return not _matches(answer, expected) and any(
        _matches(answer, tuple(round(v, digits) for v in expected)) for digits in range(1, 5)
    )


@model_rule(
    "nonfinite in the denominator",
    "You counted right, but divided by the number of nonzero values, inf/NaN included. "
    "The fractions are of the nonzero *finite* values: a value that was inf/NaN before the cast lost "
    "nothing to it, so it belongs in neither the counts nor the denominator.",
)
def nonfinite_in_the_denominator(grad, dtype, scale):
    c = (_finite_nonzero(grad) * scale).to(dtype)
    n = int((grad != 0).sum())
    return _ratio(c == 0, n), _ratio(torch.isinf(c), n)


@model_rule(
    "filtered after scaling",
    "You dropped inf/NaN *after* multiplying by `scale` (or scaled `grad` in place first): a value whose "
    "product already overflows in FP32 (3e38 * 2^8 is inf) then vanishes from your counts instead of "
    "counting as overflow. Keep the nonzero finite values of the gradient first, then scale and cast.",
)
def filtered_after_scaling(grad, dtype, scale):
    scaled = grad * scale
    kept = scaled[torch.isfinite(scaled) & (scaled != 0)]
    c = kept.to(dtype)
    return _ratio(c == 0, kept.numel()), _ratio(torch.isinf(c), kept.numel())


@model_rule(
    "nan_to_num",
    "You replaced inf/NaN with `torch.nan_to_num`: NaN becomes 0, but inf becomes FP32's max (3.4e38), "
    "which then counts as a value the cast overflowed. Leave inf/NaN out instead: "
    "`g[torch.isfinite(g) & (g != 0)]`.",
)
def nan_to_num_first(grad, dtype, scale):
    return _oracle_fractions(torch.nan_to_num(grad), dtype, scale)


@model_rule(
    "scale in dtype",
    "You stored `scale` in the low-precision dtype (`torch.tensor(scale, dtype=dtype)`): 2^16 = 65536 "
    "is already inf in float16, so every value 'overflows'. Keep the scale a Python float (or FP32) "
    "and cast only the product `(g * scale).to(dtype)`.",
)
def scale_stored_in_dtype(grad, dtype, scale):
    g = _finite_nonzero(grad)
    c = (g * torch.tensor(scale, dtype=dtype)).to(dtype)  # 2^16 in float16 is inf: so is every product
    return _ratio(c == 0, g.numel()), _ratio(torch.isinf(c), g.numel())


@model_rule(
    "max counted as overflow",
    "You counted values that cast to finfo.max (65504 in float16) as overflow: the largest finite number "
    "is stored fine. Overflow means the cast gives inf: `torch.isinf((g * scale).to(dtype))`.",
)
def max_counted_as_overflow(grad, dtype, scale):
    g = _finite_nonzero(grad)
    c = (g * scale).to(dtype)
    return _ratio(c == 0, g.numel()), _ratio(c.abs() >= torch.finfo(dtype).max, g.numel())


# 02.1's table; the order breaks ties in how many cases a rule explains.
FRACTION_MISTAKES = (
    swapped_pair,
    percentages,
    counts_not_fractions,
    scale_ignored,
    divided_by_scale,
    scale_stored_in_dtype,
    answered_yes_or_no,
    cast_then_scaled,
    below_smallest_normal,
    compared_with_the_limits,
    underflow_below_eps,
    overflow_compared_with_max,
    underflow_compared_with_tiny,
    underflow_below_2_23,
    underflow_below_2_25,
    overflow_at_65536,
    sign_ignored,
    positive_inf_only,
    divided_by_numel,
    zeros_and_inf_counted,
    zeros_in_the_denominator,
    zeros_counted_among_the_finite,
    nonfinite_kept,
    always_float16,
    integer_division,
    rounded_fractions,
    nonfinite_in_the_denominator,
    filtered_after_scaling,
    nan_to_num_first,
    max_counted_as_overflow,
)


def _get_pair(fn, case, grad, dtype, scale):
    got = _call(fn, case, grad.clone(), dtype, scale)
    if not isinstance(got, (tuple, list)) or len(got) != 2:
        stop(
            f"`lost_fractions` returned {type(got).__name__} {str(got)[:80]!r}; "
            f"return a tuple `(underflow, overflow)` of two numbers. (Input: {case}.)"
        )
    return tuple(as_number(v, f"Part {i} of the result is") for i, v in enumerate(got))


def _fraction_answer(fn, case, grad, dtype, scale):
    got = _get_pair(fn, case, grad, dtype, scale)
    if any(math.isnan(v) for v in got):
        stop(f"Your function returned NaN on {case}. Return fractions between 0 and 1.")
    return got


@checker("02.1 lost_fractions")
def check_lost_fractions(lost_fractions):
    """``lost_fractions(grad, dtype, scale) -> (underflow, overflow)`` as defined in the exercise."""
    cases = _fraction_cases()
    answers, first_wrong, expected = _run_cases(
        cases, lambda *case: _fraction_answer(lost_fractions, *case), _oracle_fractions
    )
    if first_wrong is not None:
        case, grad, dtype, scale = cases[first_wrong]
        detail = [
            f"input: {case}",
            f"expected (underflow, overflow) = ({expected[0]:.6g}, {expected[1]:.6g})",
            f"yours = ({answers[first_wrong][0]:.6g}, {answers[first_wrong][1]:.6g})",
        ]
        mistake = _explain(answers, cases, FRACTION_MISTAKES, first_wrong)
        if mistake is None:
            flipped = _get_pair(lost_fractions, f"{case}, with every sign flipped", -grad, dtype, scale)
            if not _matches(flipped, answers[first_wrong]):
                mistake = sign_ignored
                detail.append(
                    f"the same values with their signs flipped gave ({flipped[0]:.6g}, {flipped[1]:.6g})"
                )
        if mistake is None:
            return failed(
                "Your fractions differ from the definition. Keep the nonzero finite values, "
                "compute `(g * scale).to(dtype)`, and count `== 0` (underflow) and `torch.isinf` (overflow).",
                detail,
            )
        return failed(mistake.text(), detail)
    for case, grad, dtype, scale in _edge_fraction_cases():
        try:
            got = _get_pair(lost_fractions, case, grad, dtype, scale)
        except LearnerProblem as problem:
            problem.result.message += (
                " When there are no nonzero finite values there is nothing to lose: "
                "return (0.0, 0.0) instead of dividing by zero."
            )
            raise
        if any(math.isnan(v) for v in got):
            return failed(
                f"On {case} you returned {got}: that is 0/0. "
                "With no nonzero finite values there is nothing to lose: return (0.0, 0.0)."
            )
        if not _matches(got, (0.0, 0.0)):
            return failed(
                f"On {case} you returned {got}; with no nonzero finite values the answer is (0.0, 0.0) "
                "(zeros were zero before the cast, inf/NaN were broken before it)."
            )
    return passed(
        f"Right on all {len(cases) + 3} inputs, including the rounding edges (1.5*2^-25 survives, "
        "65519 stays finite), negative values, inf/NaN, empty and all-zero tensors, and bfloat16's range."
    )


# ----------------------------------------------------------------------------- 02.2 largest_safe_scale


def _oracle_scale(grads, dtype, max_exponent):
    values = flat_values(grads)
    if not bool(torch.isfinite(values).all()):
        return None
    amax = values.abs().max() if values.numel() else torch.tensor(0.0)
    if float(amax) == 0.0:
        return 2.0**max_exponent
    info = torch.finfo(dtype)
    k = min(max_exponent, math.floor(math.log2(info.max) - math.log2(float(amax))) + 1)
    while bool(torch.isinf((amax * 2.0**k).to(dtype))):
        k -= 1
    return 2.0**k


def _scale_cases():
    """(description, list of tensors, dtype, max_exponent)."""
    generator = torch.Generator().manual_seed(5)
    model_like = [
        torch.randn(64, 32, generator=generator) * 2.0**-20,
        torch.randn(64, generator=generator) * 2.0**-12,
        torch.randn(10, 64, generator=generator) * 2.0**-7,
    ]
    cases = [
        (
            "three layers of gradients (largest about 2^-5, in the last tensor), float16, max_exponent=24",
            model_like,
            F16,
            24,
        ),
        (
            "one tensor with largest |value| 3.0, float16, max_exponent=24",
            [torch.tensor([0.5, -3.0, 1e-9])],
            F16,
            24,
        ),
        (
            "the largest value is negative (-3000.0), float16, max_exponent=24",
            [torch.tensor([1.0, 2.0]), torch.tensor([-3000.0, 5.0])],
            F16,
            24,
        ),
        (
            "tiny gradients (largest 2^-30): capped, float16, max_exponent=24",
            [torch.full((5,), 2.0**-30)],
            F16,
            24,
        ),
        ("tiny gradients, max_exponent=16", [torch.full((5,), -(2.0**-30))], F16, 16),
        (
            "largest 65510 * 2^-10 (times 2^10 it rounds DOWN to 65504, finite), float16, max_exponent=24",
            [torch.tensor([65510.0 * 2.0**-10, 1.0])],
            F16,
            24,
        ),
        (
            "largest 65530 * 2^-10 (times 2^10 it rounds UP to inf), float16, max_exponent=24",
            [torch.tensor([65530.0 * 2.0**-10, 1.0])],
            F16,
            24,
        ),
        (
            "largest exactly 65504 * 2^-8, float16, max_exponent=24",
            [torch.tensor([65504.0 * 2.0**-8])],
            F16,
            24,
        ),
        (
            "gradients already above FP16's max (largest 1e6): the scale must go below 1, float16, max_exponent=24",
            [torch.tensor([1e6, -2.0]), torch.tensor([3.0])],
            F16,
            24,
        ),
        ("gradients with largest 1e36, bfloat16, max_exponent=24", [torch.tensor([1e36, -1.0])], BF16, 24),
        (
            "gradients with largest 3.0, bfloat16, max_exponent=30 (BF16 has room for the cap)",
            [torch.tensor([3.0, -1.0])],
            BF16,
            30,
        ),
        ("largest 3.0, float16, max_exponent=0", [torch.tensor([3.0])], F16, 0),
        (
            "seventeen values of 20000.0 in two tensors (each value is safe at 2^1), float16, max_exponent=24",
            [torch.full((16,), 20000.0), torch.tensor([-20000.0])],
            F16,
            24,
        ),
    ]
    return cases


def _special_scale_cases():
    inf, nan = float("inf"), float("nan")
    return {
        "inf": [
            (
                "gradients containing inf (in the second tensor)",
                [torch.tensor([1.0, 2.0]), torch.tensor([inf, 1.0])],
                F16,
                24,
            ),
            ("gradients containing NaN", [torch.tensor([1.0, nan])], F16, 24),
            ("gradients containing -inf, bfloat16", [torch.tensor([-inf, 1.0])], BF16, 24),
        ],
        "zero": [
            ("all-zero gradients, max_exponent=24", [torch.zeros(3, 4), torch.zeros(5)], F16, 24),
            ("an empty list of gradients, max_exponent=16", [], F16, 16),
            ("a list holding one empty tensor, max_exponent=24", [torch.zeros(0)], F16, 24),
        ],
    }


# -- 02.2: wrong implementations of largest_safe_scale(grads, dtype, max_exponent)


def _scale_by_limit(grads, dtype, max_exponent, limit):
    """The largest k <= max_exponent with amax * 2^k < limit (a threshold test instead of the cast)."""
    values = flat_values(grads)
    if not bool(torch.isfinite(values).all()):
        return None
    amax = float(values.abs().max()) if values.numel() else 0.0
    if amax == 0:
        return 2.0**max_exponent
    k = math.floor(math.log2(limit / amax))
    while amax * 2.0**k >= limit:
        k -= 1
    while amax * 2.0 ** (k + 1) < limit:
        k += 1
    return 2.0 ** min(k, max_exponent)


def _scale_times(grads, dtype, max_exponent, factor):
    answer = _oracle_scale(grads, dtype, max_exponent)
    return None if answer is None else answer * factor


@model_rule(
    "too big",
    "Off by one in the exponent: your scale is twice the largest safe one, so the largest |gradient| times "
    "your scale becomes inf. (`ceil`/`round` where `floor` belongs, or `<=` that should be `<`?)",
)
def twice_the_safe_scale(grads, dtype, max_exponent):
    return _scale_times(grads, dtype, max_exponent, 2.0)


@model_rule(
    "too small",
    "Off by one in the exponent: your scale is half the largest safe one; twice your scale still causes no "
    "overflow. (`floor(...) - 1`, a loop that stops one step late, or `<` that should be `<=`?)",
)
def half_the_safe_scale(grads, dtype, max_exponent):
    return _scale_times(grads, dtype, max_exponent, 0.5)


@model_rule(
    "65504 compare",
    "You compared max|g| * scale with finfo.max = 65504, but casting rounds to nearest: "
    "values below 65520 round *down* to 65504 and stay finite. "
    "Overflow means the *cast* gives inf: test `torch.isinf((amax * scale).to(dtype))`.",
)
def compared_with_finfo_max(grads, dtype, max_exponent):
    return _scale_by_limit(grads, dtype, max_exponent, torch.finfo(dtype).max * (1 + 2.0**-40))


@model_rule(
    "65536",
    "You used 2^16 = 65536 as FP16's limit, but values from 65520 up already round to inf "
    "(the largest FP16 number is 65504). Test the cast itself: `torch.isinf((amax * scale).to(dtype))`.",
)
def limit_at_65536(grads, dtype, max_exponent):
    return _scale_by_limit(grads, dtype, max_exponent, _power_of_two_above_max(torch.finfo(dtype)))


@model_rule(
    "signed max",
    "You ignored the sign: `max()` misses a large *negative* gradient, "
    "which overflows to -inf just the same. Use the largest magnitude, `g.abs().max()`.",
)
def signed_max(grads, dtype, max_exponent):
    values = flat_values(grads)
    if not bool(torch.isfinite(values).all()):
        return None
    top = float(values.max()) if values.numel() else 0.0
    if top <= 0:
        return 2.0**max_exponent
    return _oracle_scale([torch.tensor([top])], dtype, max_exponent)


@model_rule(
    "first only",
    "You looked only at the first tensor of the list: the largest gradient can be in any of them.",
)
def first_tensor_only(grads, dtype, max_exponent):
    return _oracle_scale(grads[:1], dtype, max_exponent)


@model_rule(
    "no cap",
    "Your scale is larger than 2**max_exponent: "
    "the cap is part of the answer (it is also what keeps a scaler from growing forever on tiny gradients).",
)
def no_cap(grads, dtype, max_exponent):
    return _oracle_scale(grads, dtype, 200)


@model_rule(
    "cap fixed at the default",
    "Your cap is always 2**24, the default, whatever max_exponent the call passes (the input below says which "
    "one this call used). Cap at the argument: the largest k <= max_exponent.",
)
def cap_fixed_at_the_default(grads, dtype, max_exponent):
    return _oracle_scale(grads, dtype, 24)


@model_rule(
    "cast first",
    "You cast the largest gradient to the low-precision dtype before scaling it (`amax.to(dtype) * 2**k`): "
    "the cast rounds it first, so near the top of the range you test a different "
    "number (and one above the format's max is inf before any scale is tried). "
    "Loss scaling multiplies in FP32 and casts once: test `(amax * 2.0**k).to(dtype)`.",
)
def amax_cast_first(grads, dtype, max_exponent):
    """The largest gradient cast to ``dtype`` first, then scaled there (the learner's loop, bounded)."""
    values = flat_values(grads)
    if not bool(torch.isfinite(values).all()):
        return None
    amax = values.abs().max() if values.numel() else torch.tensor(0.0)
    if float(amax) == 0.0:
        return 2.0**max_exponent
    low = amax.to(dtype)
    for k in range(max_exponent, -160, -1):
        if not bool(torch.isinf(low * 2.0**k)):
            return 2.0**k
    return None


@model_rule(
    "at least one",
    "You never return a scale below 1, but gradients above the format's max (here 1e6 > 65504) already "
    "overflow at scale 1: the largest safe scale is then a negative power of two.",
)
def never_below_one(grads, dtype, max_exponent):
    answer = _oracle_scale(grads, dtype, max_exponent)
    return None if answer is None else max(answer, 1.0)


@model_rule(
    "always fp16",
    "Your answer ignores `dtype`: bfloat16 reaches about 3.4e38, "
    "so it needs a different scale (read the limit from `torch.finfo(dtype)` or cast to `dtype`).",
)
def scale_for_float16_always(grads, dtype, max_exponent):
    return _oracle_scale(grads, F16, max_exponent)


# Found in the class round (issue 19): each gave "Not the largest safe power of two" or "first only".


def _scale_by_size(grads, dtype, max_exponent, size):
    """The oracle with the largest |g| replaced by ``size(values)`` (another measure of the gradients)."""
    values = flat_values(grads)
    if not bool(torch.isfinite(values).all()):
        return None
    nonzero = values[values != 0]
    if nonzero.numel() == 0:
        return 2.0**max_exponent
    return _oracle_scale([size(nonzero.abs()).reshape(1)], dtype, max_exponent)


@model_rule(
    "norm",
    "You used the norm of the gradients (`torch.norm`, as clipping does), not the largest magnitude: "
    "overflow happens value by value, so only the largest |g| matters. Use the largest `g.abs().max()`.",
)
def norm_not_max(grads, dtype, max_exponent):
    return _scale_by_size(grads, dtype, max_exponent, torch.linalg.vector_norm)


@model_rule(
    "sum",
    "You added the magnitudes up (`g.abs().sum()`): overflow happens value by value, "
    "so only the largest |g| matters. Use the largest `g.abs().max()` over all tensors.",
)
def sum_not_max(grads, dtype, max_exponent):
    return _scale_by_size(grads, dtype, max_exponent, torch.sum)


@model_rule(
    "mean",
    "You used the mean |gradient|: one large value overflows however small the others are, "
    "so the scale is set by the largest |g| over all tensors, `g.abs().max()`.",
)
def mean_not_max(grads, dtype, max_exponent):
    return _scale_by_size(grads, dtype, max_exponent, torch.mean)


@model_rule(
    "smallest",
    "You used the smallest nonzero |gradient|: that one decides *underflow*. "
    "The largest safe scale is set by the largest |g| over all tensors: it is the one that overflows first.",
)
def smallest_not_largest(grads, dtype, max_exponent):
    return _scale_by_size(grads, dtype, max_exponent, torch.min)


@model_rule(
    "last only",
    "You looked only at the last tensor of the list: the largest gradient can be in any of them.",
)
def last_tensor_only(grads, dtype, max_exponent):
    return _oracle_scale(grads[-1:], dtype, max_exponent)


@model_rule(
    "largest per-tensor scale",
    "You took the largest of the per-tensor safe scales: one scale multiplies every tensor, so it must be "
    "safe for all of them at once, i.e. set by the largest |g| over all tensors (the smallest of your scales).",
)
def largest_per_tensor_scale(grads, dtype, max_exponent):
    scales = [_oracle_scale([g], dtype, max_exponent) for g in grads]
    if any(scale is None for scale in scales):
        return None
    return max(scales, default=2.0**max_exponent)


@model_rule(
    "scale in dtype",
    "Your scale never reaches a power of two that is inf in the low-precision dtype (2^16 = 65536 and up "
    "in float16): you stored the scale itself in `dtype`. Only the product is stored there: keep the scale "
    "a Python float and test `(amax * 2.0**k).to(dtype)`.",
)
def scale_stored_in_dtype_too(grads, dtype, max_exponent):
    answer = _oracle_scale(grads, dtype, max_exponent)
    largest = 2.0 ** math.floor(math.log2(torch.finfo(dtype).max))
    return None if answer is None else min(answer, largest)


# 02.2's table; the order breaks ties in how many cases a rule explains.
SCALE_MISTAKES = (
    twice_the_safe_scale,
    half_the_safe_scale,
    compared_with_finfo_max,
    limit_at_65536,
    signed_max,
    first_tensor_only,
    no_cap,
    cap_fixed_at_the_default,
    amax_cast_first,
    never_below_one,
    scale_for_float16_always,
    norm_not_max,
    sum_not_max,
    mean_not_max,
    smallest_not_largest,
    last_tensor_only,
    largest_per_tensor_scale,
    scale_stored_in_dtype_too,
)


def _check_scale_value(got, case):
    if got is None:
        return None
    if isinstance(got, bool):
        stop(
            f"`largest_safe_scale` returned the bool {got} on {case}; "
            "return a number (a power of two) or None."
        )
    value = as_number(got, "Your result is")
    if not math.isfinite(value) or value <= 0:
        stop(
            f"`largest_safe_scale` returned {value} on {case}; a loss scale is a positive, "
            "finite power of two (return None only for inf/NaN gradients)."
        )
    mantissa, _ = math.frexp(value)
    if mantissa != 0.5:
        exponent_hint = (
            f" (Is {value:g} the exponent k itself? Return the scale, 2.0**k.)"
            if value.is_integer() and abs(value) <= 200
            else ""
        )
        stop(
            f"`largest_safe_scale` returned {value:g} on {case}, which is not a power of two. "
            "Return 2.0**k: multiplying by a power of two only shifts the exponent, "
            "so it never adds rounding error itself." + exponent_hint
        )
    return value


def _scale_answer(fn, case, grads, dtype, max_exponent):
    return _check_scale_value(_call(fn, case, [g.clone() for g in grads], dtype, max_exponent), case)


@checker("02.2 largest_safe_scale")
def check_largest_safe_scale(largest_safe_scale):
    """``largest_safe_scale(grads, dtype, max_exponent) -> float | None`` as defined in the exercise."""
    cases = _scale_cases()
    answers, first_wrong, expected = _run_cases(
        cases, lambda *case: _scale_answer(largest_safe_scale, *case), _oracle_scale
    )
    if first_wrong is not None:
        case, _, _, max_exponent = cases[first_wrong]
        got = answers[first_wrong]
        detail = [
            f"input: {case}"
            + ("" if f"max_exponent={max_exponent}" in case else f" (max_exponent={max_exponent})"),
            f"expected 2^{int(math.log2(expected))} = {expected:g}",
            "yours: None" if got is None else f"yours: 2^{math.log2(got):g} = {got:g}",
        ]
        if got is None:
            return failed(
                "You returned None for finite gradients. None is only for gradients that already "
                "contain inf/NaN; check `torch.isfinite` on the FP32 gradients themselves, "
                "not after casting them (a finite 1e6 casts to inf in FP16, yet a scale below 1 handles it).",
                detail,
            )
        mistake = _explain(answers, cases, SCALE_MISTAKES, first_wrong)
        if mistake is None:
            return failed(
                "Not the largest safe power of two. Find the largest |gradient| over all tensors, "
                "then the largest integer k <= max_exponent with `(amax * 2.0**k).to(dtype)` finite.",
                detail,
            )
        return failed(mistake.text(), detail)
    special = _special_scale_cases()
    for case, grads, dtype, max_exponent in special["inf"]:
        got = _scale_answer(largest_safe_scale, case, grads, dtype, max_exponent)
        if got is not None:
            return failed(
                f"On {case} you returned {got:g}. When a gradient is already inf or NaN no loss scale can "
                "make it finite: return None (skip this step and look for the cause). Lowering the scale "
                "further is what GradScaler does, and it only helps when the scale caused the overflow."
            )
    for case, grads, dtype, max_exponent in special["zero"]:
        try:
            got = _scale_answer(largest_safe_scale, case, grads, dtype, max_exponent)
        except LearnerProblem as problem:
            problem.result.message += (
                " With no nonzero gradient nothing can overflow: "
                "return the cap 2.0**max_exponent (log2 of 0 or max() of nothing must not be reached)."
            )
            raise
        if got != 2.0**max_exponent:
            shown = "None" if got is None else f"{got:g}"
            return failed(
                f"On {case} you returned {shown}. With no nonzero gradient nothing can overflow at any "
                f"scale, so the answer is the cap 2.0**max_exponent = {2.0**max_exponent:g}."
            )
    return passed(
        f"Right on all {len(cases) + 6} inputs: the sign, every tensor in the list, the rounding edge at "
        "65520, scales below 1, the cap, bfloat16, inf/NaN (None) and all-zero/empty (the cap)."
    )
