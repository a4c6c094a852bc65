"""Lesson 02's checkers: the fraction of a gradient lost to underflow/overflow, the largest safe loss scale.

Both compare the learner's function with an oracle on many tensors (typical gradients spread over 60
octaves, BF16-range values, empty, all-zero, subnormal-only, inf/NaN, huge values, values right at the
rounding edges 2^-25 and 65520) and, when an answer is wrong, replay the usual mistakes on the same inputs
to name the one that explains it.
"""

from __future__ import annotations

import math

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
from amp_lessons.checks.mistakes import Mistake, best_mistake
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
            "values at the rounding edges (2^-26, 2^-25, 1.5*2^-25, ..., 65510, 65519, 65520, 1e5), "
            "float16, scale 1",
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


def replays(wrong):
    """A model rule's ``recognise(case, answer)``: does the wrong implementation give the learner's answer?"""
    return lambda case, answer: _matches(wrong(*case[1:]), answer)


# Wrong implementations of lost_fractions(grad, dtype, scale), each reproducing one plausible mistake exactly.


def _ratio(mask, denominator):
    return int(mask.sum()) / denominator if denominator else 0.0


def _cast_first(g, dtype, scale):
    g = _finite_nonzero(g)
    c = g.to(dtype) * scale
    return _ratio(c == 0, g.numel()), _ratio(torch.isinf(c), g.numel())


def _normal_threshold(g, dtype, scale):
    g = _finite_nonzero(g)
    c = (g * scale).to(dtype)
    return _ratio(c.abs() < torch.finfo(dtype).smallest_normal, g.numel()), _ratio(torch.isinf(c), g.numel())


def _thresholds(g, dtype, scale):
    g = _finite_nonzero(g)
    fmt = limits(dtype)
    s = (g * scale).abs()
    return _ratio(s < fmt.smallest_subnormal, g.numel()), _ratio(s > fmt.max, g.numel())


def _shifted(g, dtype, scale, under_factor=None, over=None):
    g = _finite_nonzero(g)
    fmt = limits(dtype)
    s = g * scale
    c = s.to(dtype)
    under = c == 0 if under_factor is None else s.abs() < fmt.smallest_subnormal * under_factor
    overflow = torch.isinf(c) if over is None else s.abs() >= over(fmt)
    return _ratio(under, g.numel()), _ratio(overflow, g.numel())


def _no_abs(g, dtype, scale):
    g = _finite_nonzero(g)
    fmt = limits(dtype)
    s = g * scale
    return _ratio(s < fmt.smallest_subnormal, g.numel()), _ratio(s > fmt.max, g.numel())


def _positive_inf_only(g, dtype, scale):
    g = _finite_nonzero(g)
    c = (g * scale).to(dtype)
    return _ratio(c == 0, g.numel()), _ratio(c == float("inf"), g.numel())


def _over_numel(g, dtype, scale):
    n = g.numel()
    c = (_finite_nonzero(g) * scale).to(dtype)
    return _ratio(c == 0, n), _ratio(torch.isinf(c), n)


def _zeros_counted(g, dtype, scale):
    c = (g[~torch.isnan(g)] * scale).to(dtype)
    n = g.numel()
    return _ratio(c == 0, n), _ratio(torch.isinf(c), n)


def _zeros_counted_finite(g, dtype, scale):
    f = g[torch.isfinite(g)]
    c = (f * scale).to(dtype)
    return _ratio(c == 0, f.numel()), _ratio(torch.isinf(c), f.numel())


def _nonfinite_kept(g, dtype, scale):
    g = g[g != 0]
    c = (g * scale).to(dtype)
    return _ratio(c == 0, g.numel()), _ratio(torch.isinf(c) | torch.isnan(c), g.numel())


def _one_threshold(g, dtype, scale, under=None, over=None):
    """The cast judges each end, except one that ``under``/``over`` (``(g * scale, dtype) -> mask``) judge."""
    g = _finite_nonzero(g)
    s = g * scale
    c = s.to(dtype)
    under_mask = c == 0 if under is None else under(s, dtype)
    over_mask = torch.isinf(c) if over is None else over(s, dtype)
    return _ratio(under_mask, g.numel()), _ratio(over_mask, g.numel())


def _zeros_in_denominator(g, dtype, scale):
    finite = g[torch.isfinite(g)]
    c = (finite[finite != 0] * scale).to(dtype)
    return _ratio(c == 0, finite.numel()), _ratio(torch.isinf(c), finite.numel())


def _power_of_two_above_max(fmt):
    return 2.0 ** math.ceil(math.log2(fmt.max))


_TINY = "the smallest subnormal 2^-24"

NO_ABS = Mistake(
    "no abs",
    replays(_no_abs),
    "You ignored the sign: `g * scale < threshold` is true for every negative gradient, and a large "
    "negative value never exceeds +65504. Negative gradients under/overflow exactly like positive ones: "
    "cast and test (`== 0`, `torch.isinf`), or use `.abs()`.",
)

# Each rule reads one (case, answer) pair; the table order breaks ties in how many cases a rule explains.
FRACTION_MISTAKES = (
    Mistake(
        "swapped",
        replays(lambda g, d, s: _oracle_fractions(g, d, s)[::-1]),
        "You returned (overflow, underflow): the exercise asks for (underflow, overflow), in that order.",
    ),
    Mistake(
        "percent",
        replays(lambda g, d, s: tuple(100 * v for v in _oracle_fractions(g, d, s))),
        "Your numbers are 100 times too large: return fractions between 0 and 1, not percentages.",
    ),
    Mistake(
        "counts",
        replays(lambda g, d, s: tuple(v * _finite_nonzero(g).numel() for v in _oracle_fractions(g, d, s))),
        "You returned counts, not fractions: divide by the number of nonzero finite values.",
    ),
    Mistake(
        "no scale",
        replays(lambda g, d, s: _oracle_fractions(g, d, 1.0)),
        "Your answer does not change with `scale`: multiply the gradient by `scale` before casting.",
    ),
    Mistake(
        "divided by scale",
        replays(lambda g, d, s: _oracle_fractions(g, d, 1.0 / s)),
        "You divided by `scale`: loss scaling *multiplies* each value (`g * scale`) before the cast, "
        "which is what lifts small gradients out of the underflow range.",
    ),
    Mistake(
        "yes/no",
        lambda c, a: any(
            _matches(v, a)
            for u, o in [_oracle_fractions(*c[1:])]  # .any()
            for v in ((u, o > 0), (u > 0, o), (u > 0, o > 0))
        ),
        'You returned 1.0 or 0.0 ("was anything lost?", e.g. `.any()`) instead of a fraction: divide '
        "the number of values lost by the number of nonzero finite values.",
    ),
    Mistake(
        "cast first",
        replays(_cast_first),
        "You cast to the low-precision dtype first and scaled afterwards (`g.to(dtype) * "
        "scale`): by then the small values are already 0. Loss scaling works because the multiplication "
        "happens before the value is stored in FP16: compute `(g * scale).to(dtype)`.",
    ),
    Mistake(
        "normal threshold",
        replays(_normal_threshold),
        "You counted subnormal results as underflow (compared with the smallest *normal* 2^-14). A "
        "subnormal is still nonzero, only less precise; underflow means the cast gives exactly 0, i.e. "
        f"below {_TINY} (after rounding).",
    ),
    Mistake(
        "thresholds",
        replays(_thresholds),
        f"You compared |g * scale| with {_TINY} and with 65504 instead of casting. Casting rounds to "
        "nearest: values above 2^-25 round *up* to 2^-24 and survive, and values below 65520 round "
        "*down* to 65504 and stay finite. Cast and test the result (`== 0`, `isinf`).",
    ),
    Mistake(
        "eps",
        replays(
            lambda g, d, s: _one_threshold(g, d, s, under=lambda v, dtype: v.abs() < torch.finfo(dtype).eps)
        ),
        "You compared with torch.finfo(dtype).eps, which measures *precision* (the gap between 1.0 and "
        "the next number: 2^-10 in float16), not *range*: values far below eps, down to the smallest "
        f"subnormal 2^-24, are stored fine. Underflow means the cast gives exactly 0: below {_TINY} "
        "after rounding. Cast and test `== 0`.",
    ),
    Mistake(
        "overflow by comparing with max",
        replays(lambda g, d, s: _one_threshold(g, d, s, over=lambda v, dtype: v.abs() > limits(dtype).max)),
        "Your underflow is right, but you tested overflow with |g * scale| > finfo.max (65504 in "
        "float16). Casting rounds to nearest: values below 65520 round *down* to 65504 and stay finite. "
        "Test the cast the same way you did for underflow: `torch.isinf((g * scale).to(dtype))`.",
    ),
    Mistake(
        "underflow by comparing with the smallest subnormal",
        replays(
            lambda g, d, s: _one_threshold(
                g, d, s, under=lambda v, dtype: v.abs() < limits(dtype).smallest_subnormal
            )
        ),
        f"Your overflow is right, but you tested underflow with |g * scale| < {_TINY}. Casting rounds to "
        "nearest: values above 2^-25 round *up* to 2^-24 and survive. Test the cast the same way you did "
        "for overflow: `(g * scale).to(dtype) == 0`.",
    ),
    Mistake(
        "2^-23",
        replays(lambda g, d, s: _shifted(g, d, s, under_factor=2.0)),
        f"Off by one in the exponent: you treated everything below 2^-23 as underflow, but {_TINY} "
        "itself is representable (and values above 2^-25 round up to it). Cast and test `== 0` instead.",
    ),
    Mistake(
        "2^-25",
        replays(lambda g, d, s: _shifted(g, d, s, under_factor=0.5)),
        "Off by one in the exponent: you compared with 2^-25, but exactly 2^-25 is a tie that "
        "rounds to 0 (ties go to the even neighbour, 0). Cast and test `== 0` instead of comparing.",
    ),
    Mistake(
        "65536",
        replays(lambda g, d, s: _shifted(g, d, s, over=_power_of_two_above_max)),
        "You used 2^16 = 65536 as FP16's overflow limit, but values from 65520 up already round to inf "
        "(the largest FP16 number is 65504). Cast and test `torch.isinf` instead.",
    ),
    NO_ABS,
    Mistake(
        "positive inf only",
        replays(_positive_inf_only),
        "You counted only +inf as overflow: large *negative* values become -inf. Use `torch.isinf`.",
    ),
    Mistake(
        "over numel",
        replays(_over_numel),
        "You divided by `grad.numel()`, which includes zeros and inf/NaN. The fractions are of the "
        "nonzero, finite values only.",
    ),
    Mistake(
        "zeros counted",
        replays(_zeros_counted),
        "You counted values that were already 0 in FP32 as underflow. Underflow means nonzero *before* "
        "the cast and zero after: leave zeros (and inf/NaN) out of both counts and the denominator.",
    ),
    Mistake(
        "zeros in the denominator",
        replays(_zeros_in_denominator),
        "You counted right, but divided by the number of finite values, zeros included. The fractions "
        "are of the nonzero finite values: a value that was already 0 in FP32 lost nothing to the cast, "
        "so it belongs in neither the counts nor the denominator.",
    ),
    Mistake(
        "zeros counted finite",
        replays(_zeros_counted_finite),
        "You counted values that were already 0 in FP32 as underflow (and in the denominator). "
        "Keep only nonzero, finite values: `g = g[torch.isfinite(g) & (g != 0)]`.",
    ),
    Mistake(
        "nonfinite kept",
        replays(_nonfinite_kept),
        "You kept inf/NaN values that were already in the gradient: they count as overflow in your "
        "answer. Scaling cannot cause or fix them; leave them out (use `torch.isfinite`).",
    ),
    Mistake(
        "always fp16",
        replays(lambda g, d, s: _oracle_fractions(g, F16, s)),
        "Your answer ignores `dtype`: for bfloat16 the thresholds are 2^-133 and about 3.4e38. Cast to "
        "the `dtype` you are given (or read the limits from `torch.finfo(dtype)`).",
    ),
)


def _get_pair(fn, case, grad, dtype, scale):
    got = _call(fn, case, grad.clone(), dtype, scale)
    if not isinstance(got, (tuple, list)) or len(got) != 2:
        stop(
            f"`lost_fractions` returned {type(got).__name__} {str(got)[:80]!r}; return a tuple "
            f"`(underflow, overflow)` of two numbers. (Input: {case}.)"
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
                mistake = NO_ABS
                detail.append(
                    f"the same values with their signs flipped gave ({flipped[0]:.6g}, {flipped[1]:.6g})"
                )
        if mistake is None:
            return failed(
                "Your fractions differ from the definition. Keep the nonzero finite "
                "values, compute `(g * scale).to(dtype)`, and count `== 0` (underflow) and "
                "`torch.isinf` (overflow).",
                detail,
            )
        return failed(mistake.text(), detail)
    for case, grad, dtype, scale in _edge_fraction_cases():
        try:
            got = _get_pair(lost_fractions, case, grad, dtype, scale)
        except LearnerProblem as problem:
            problem.result.message += (
                " When there are no nonzero finite values there is nothing to "
                "lose: return (0.0, 0.0) instead of dividing by zero."
            )
            raise
        if any(math.isnan(v) for v in got):
            return failed(
                f"On {case} you returned {got}: that is 0/0. With no nonzero finite "
                "values there is nothing to lose: return (0.0, 0.0)."
            )
        if not _matches(got, (0.0, 0.0)):
            return failed(
                f"On {case} you returned {got}; with no nonzero finite values the answer "
                "is (0.0, 0.0) (zeros were zero before the cast, inf/NaN were broken before it)."
            )
    return passed(
        f"Right on all {len(cases) + 3} inputs, including the rounding edges (1.5*2^-25 "
        "survives, 65519 stays finite), negative values, inf/NaN, empty and all-zero tensors, and "
        "bfloat16's range."
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
            "gradients already above FP16's max (largest 1e6): the scale must go below 1, float16",
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


# Wrong implementations of largest_safe_scale(grads, dtype, max_exponent).


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


def _scale_signed_max(grads, dtype, max_exponent):
    values = flat_values(grads)
    if not bool(torch.isfinite(values).all()):
        return None
    top = float(values.max()) if values.numel() else 0.0
    if top <= 0:
        return 2.0**max_exponent
    return _oracle_scale([torch.tensor([top])], dtype, max_exponent)


def _scale_cast_first(grads, dtype, max_exponent):
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


def _scale_at_least_one(grads, dtype, max_exponent):
    answer = _oracle_scale(grads, dtype, max_exponent)
    return None if answer is None else max(answer, 1.0)


SCALE_MISTAKES = (
    Mistake(
        "too big",
        replays(lambda g, d, m: _scale_times(g, d, m, 2.0)),
        "Off by one in the exponent: your scale is twice the largest safe one, so the largest |gradient| "
        "times your scale becomes inf. (`ceil`/`round` where `floor` belongs, or `<=` that "
        "should be `<`?)",
    ),
    Mistake(
        "too small",
        replays(lambda g, d, m: _scale_times(g, d, m, 0.5)),
        "Off by one in the exponent: your scale is half the largest safe one; twice your scale still "
        "causes no overflow. (`floor(...) - 1`, a loop that stops one step late, or `<` that should be "
        "`<=`?)",
    ),
    Mistake(
        "65504 compare",
        replays(lambda g, d, m: _scale_by_limit(g, d, m, torch.finfo(d).max * (1 + 2.0**-40))),
        "You compared max|g| * scale with finfo.max = 65504, but casting rounds to nearest: values "
        "below 65520 round *down* to 65504 and stay finite. Overflow means the *cast* gives inf: test "
        "`torch.isinf((amax * scale).to(dtype))`.",
    ),
    Mistake(
        "65536",
        replays(lambda g, d, m: _scale_by_limit(g, d, m, _power_of_two_above_max(torch.finfo(d)))),
        "You used 2^16 = 65536 as FP16's limit, but values from 65520 up already round to inf "
        "(the largest FP16 number is 65504). Test the cast itself: `torch.isinf((amax * "
        "scale).to(dtype))`.",
    ),
    Mistake(
        "signed max",
        replays(_scale_signed_max),
        "You ignored the sign: `max()` misses a large *negative* gradient, which overflows to -inf just "
        "the same. Use the largest magnitude, `g.abs().max()`.",
    ),
    Mistake(
        "first only",
        replays(lambda g, d, m: _oracle_scale(g[:1], d, m)),
        "You looked only at the first tensor of the list: the largest gradient can be in any of them.",
    ),
    Mistake(
        "no cap",
        replays(lambda g, d, m: _oracle_scale(g, d, 200)),
        "Your scale is larger than 2**max_exponent: the cap is part of the answer (it is also "
        "what keeps a scaler from growing forever on tiny gradients).",
    ),
    Mistake(
        "cast first",
        replays(_scale_cast_first),
        "You cast the largest gradient to the low-precision dtype before scaling it (`amax.to(dtype) * "
        "2**k`): the cast rounds it first, so near the top of the range you test a different number (and "
        "one above the format's max is inf before any scale is tried). Loss scaling multiplies in FP32 "
        "and casts once: test `(amax * 2.0**k).to(dtype)`.",
    ),
    Mistake(
        "at least one",
        replays(_scale_at_least_one),
        "You never return a scale below 1, but gradients above the format's max (here 1e6 > 65504) "
        "already overflow at scale 1: the largest safe scale is then a negative power of two.",
    ),
    Mistake(
        "always fp16",
        replays(lambda g, d, m: _oracle_scale(g, F16, m)),
        "Your answer ignores `dtype`: bfloat16 reaches about 3.4e38, so it needs a different scale "
        "(read the limit from `torch.finfo(dtype)` or cast to `dtype`).",
    ),
)


def _check_scale_value(got, case):
    if got is None:
        return None
    if isinstance(got, bool):
        stop(
            f"`largest_safe_scale` returned the bool {got} on {case}; return a number (a power of "
            "two) or None."
        )
    value = as_number(got, "Your result is")
    if not math.isfinite(value) or value <= 0:
        stop(
            f"`largest_safe_scale` returned {value} on {case}; a loss scale is a positive, finite "
            "power of two (return None only for inf/NaN gradients)."
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
            "Return 2.0**k: multiplying by a power of two only shifts the exponent, so it never adds "
            "rounding error itself." + exponent_hint
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
        case = cases[first_wrong][0]
        got = answers[first_wrong]
        detail = [
            f"input: {case}",
            f"expected 2^{int(math.log2(expected))} = {expected:g}",
            "yours: None" if got is None else f"yours: 2^{math.log2(got):g} = {got:g}",
        ]
        if got is None:
            return failed(
                "You returned None for finite gradients. None is only for gradients that "
                "already contain inf/NaN; check `torch.isfinite` on the FP32 gradients themselves, "
                "not after casting them (a finite 1e6 casts to inf in FP16, yet a scale below 1 "
                "handles it).",
                detail,
            )
        mistake = _explain(answers, cases, SCALE_MISTAKES, first_wrong)
        if mistake is None:
            return failed(
                "Not the largest safe power of two. Find the largest |gradient| over all tensors, "
                "then the largest integer k <= max_exponent with `(amax * "
                "2.0**k).to(dtype)` finite.",
                detail,
            )
        return failed(mistake.text(), detail)
    special = _special_scale_cases()
    for case, grads, dtype, max_exponent in special["inf"]:
        got = _scale_answer(largest_safe_scale, case, grads, dtype, max_exponent)
        if got is not None:
            return failed(
                f"On {case} you returned {got:g}. When a gradient is already inf or NaN no "
                "loss scale can make it finite: return None (skip this step and look for the "
                "cause). Lowering the scale further is what GradScaler does, and it only helps "
                "when the scale caused the overflow."
            )
    for case, grads, dtype, max_exponent in special["zero"]:
        try:
            got = _scale_answer(largest_safe_scale, case, grads, dtype, max_exponent)
        except LearnerProblem as problem:
            problem.result.message += (
                " With no nonzero gradient nothing can overflow: return the cap "
                "2.0**max_exponent (log2 of 0 or max() of nothing must not "
                "be reached)."
            )
            raise
        if got != 2.0**max_exponent:
            shown = "None" if got is None else f"{got:g}"
            return failed(
                f"On {case} you returned {shown}. With no nonzero gradient nothing can overflow "
                "at any scale, so the answer is the cap 2.0**max_exponent = "
                f"{2.0**max_exponent:g}."
            )
    return passed(
        f"Right on all {len(cases) + 6} inputs: the sign, every tensor in the list, the "
        "rounding edge at 65520, scales below 1, the cap, bfloat16, inf/NaN (None) and "
        "all-zero/empty (the cap)."
    )
