"""Lesson 02 checkers four ways (the solution passes, the untouched exercise is "not done", each known wrong
answer is named, junk never raises), and each rule of the two mistake tables recognises its own case."""

import math
import time

import numpy as np
import pytest
import torch
from notebook_code import exercise, solution

import amp_lessons.l02_fp16_underflow_and_loss_scaling.check as l02
from amp_lessons.checks.harness import NOT_DONE
from amp_lessons.l02_fp16_underflow_and_loss_scaling.check import (
    check_largest_safe_scale,
    check_lost_fractions,
)

LESSON = "02_fp16_underflow_and_loss_scaling.ipynb"
F16, BF16 = torch.float16, torch.bfloat16
REFERENCE_FRACTIONS = solution(LESSON, "lost_fractions")
REFERENCE_SCALE = solution(LESSON, "largest_safe_scale")


# ----------------------------------------------------------------------------- checker 02.1 lost_fractions


def test_lost_fractions_solution_passes():
    result = check_lost_fractions(solution(LESSON, "lost_fractions"))
    assert result.passed, result.message


def test_lost_fractions_untouched_exercise_is_not_done():
    result = check_lost_fractions(exercise(LESSON, "lost_fractions"))
    assert result.status == NOT_DONE, result.message


def _kept(grad):
    return grad[torch.isfinite(grad) & (grad != 0)]


def frac_thresholds(grad, dtype, scale):
    v = _kept(grad)
    if not v.numel():
        return 0.0, 0.0
    s = (v * scale).abs()
    return (s < 2.0**-24).float().mean().item(), (s > 65504).float().mean().item()


def frac_cast_first(grad, dtype, scale):
    v = _kept(grad)
    if not v.numel():
        return 0.0, 0.0
    stored = v.to(dtype) * scale
    return (stored == 0).float().mean().item(), torch.isinf(stored).float().mean().item()


def frac_normal_threshold(grad, dtype, scale):
    v = _kept(grad)
    if not v.numel():
        return 0.0, 0.0
    stored = (v * scale).to(dtype)
    under = (stored.abs() < torch.finfo(dtype).tiny).float().mean().item()
    return under, torch.isinf(stored).float().mean().item()


def frac_no_abs(grad, dtype, scale):
    v = _kept(grad)
    if not v.numel():
        return 0.0, 0.0
    stored = (v * scale).to(dtype)
    return ((v * scale) < 2.0**-24).float().mean().item(), torch.isinf(stored).float().mean().item()


def frac_over_numel(grad, dtype, scale):
    if not grad.numel():
        return 0.0, 0.0
    stored = (_kept(grad) * scale).to(dtype)
    return (stored == 0).sum().item() / grad.numel(), torch.isinf(stored).sum().item() / grad.numel()


def frac_zeros_counted(grad, dtype, scale):
    v = grad[torch.isfinite(grad)]
    if not v.numel():
        return 0.0, 0.0
    stored = (v * scale).to(dtype)
    return (stored == 0).float().mean().item(), torch.isinf(stored).float().mean().item()


def frac_nan_on_empty(grad, dtype, scale):
    stored = (_kept(grad) * scale).to(dtype)
    return (stored == 0).float().mean().item(), torch.isinf(stored).float().mean().item()


def frac_divides_by_zero(grad, dtype, scale):
    v = _kept(grad)
    stored = (v * scale).to(dtype)
    return (stored == 0).sum().item() / v.numel(), torch.isinf(stored).sum().item() / v.numel()


def frac_off_by_one(grad, dtype, scale):
    v = _kept(grad)
    if not v.numel():
        return 0.0, 0.0
    s = v * scale
    tiny = torch.finfo(dtype).smallest_normal * torch.finfo(dtype).eps / 2  # 2^-25 for FP16
    return (s.abs() < tiny).float().mean().item(), torch.isinf(s.to(dtype)).float().mean().item()


def frac_always_fp16(grad, dtype, scale):
    return REFERENCE_FRACTIONS(grad, torch.float16, scale)


def frac_swapped(grad, dtype, scale):
    return REFERENCE_FRACTIONS(grad, dtype, scale)[::-1]


def frac_percent(grad, dtype, scale):
    return tuple(100 * v for v in REFERENCE_FRACTIONS(grad, dtype, scale))


@pytest.mark.parametrize(
    "wrong, named",
    [
        (frac_thresholds, "instead of casting"),
        (frac_cast_first, "scaled afterwards"),
        (frac_normal_threshold, "smallest *normal* 2^-14"),
        (frac_no_abs, "ignored the sign"),
        (frac_over_numel, "grad.numel()"),
        (frac_zeros_counted, "already 0 in FP32"),
        (frac_nan_on_empty, "0/0"),
        (frac_divides_by_zero, "instead of dividing by zero"),
        (frac_off_by_one, "compared with 2^-25"),
        (frac_always_fp16, "ignores `dtype`"),
        (frac_swapped, "(underflow, overflow), in that order"),
        (frac_percent, "percentages"),
    ],
    ids=lambda v: getattr(v, "__name__", "")[:30],
)
def test_lost_fractions_names_each_mistake(wrong, named):
    result = check_lost_fractions(wrong)
    assert not result.passed and result.status == "failed"
    assert named in result.message, result.message


@pytest.mark.parametrize(
    "junk, expected",
    [
        (None, "got None"),
        ("lost_fractions", "got a str"),
        (lambda grad: 0.0, "signature"),
        (lambda grad, dtype, scale: 0.5, "return a tuple"),
        (lambda grad, dtype, scale: (0.1, 0.2, 0.3), "return a tuple"),
        (lambda grad, dtype, scale: (float("nan"), 0.0), "NaN"),
        (lambda grad, dtype, scale: (torch.zeros(3), 0.0), "tensor with 3 elements"),
        (lambda grad, dtype, scale: ("a", "b"), "return a number"),
        (lambda grad, dtype, scale: grad[10**9], "IndexError"),
    ],
)
def test_lost_fractions_junk_never_raises(junk, expected):
    result = check_lost_fractions(junk)
    assert not result.passed and result.status == "failed"
    assert expected in result.message, result.message


def test_lost_fractions_check_is_fast():
    import time

    start = time.perf_counter()
    check_lost_fractions(solution(LESSON, "lost_fractions"))
    assert time.perf_counter() - start < 2.0


# ---------------------------------------------------------------------------- checker 02.2 largest_safe_scale


def test_largest_safe_scale_solution_passes():
    result = check_largest_safe_scale(solution(LESSON, "largest_safe_scale"))
    assert result.passed, result.message


def test_largest_safe_scale_untouched_exercise_is_not_done():
    result = check_largest_safe_scale(exercise(LESSON, "largest_safe_scale"))
    assert result.status == NOT_DONE, result.message


def _all(grads):
    return torch.cat([g.reshape(-1).float() for g in grads] + [torch.zeros(0)])


def _reference(grads, dtype, max_exponent=24):
    return REFERENCE_SCALE(grads, dtype, max_exponent)


def scale_too_big(grads, dtype, max_exponent=24):
    answer = _reference(grads, dtype, max_exponent)
    return None if answer is None else 2 * answer


def scale_too_small(grads, dtype, max_exponent=24):
    answer = _reference(grads, dtype, max_exponent)
    return None if answer is None or answer == 2.0**max_exponent else answer / 2


def scale_signed_max(grads, dtype, max_exponent=24):
    values = _all(grads)
    if not torch.isfinite(values).all():
        return None
    if not values.numel() or values.max() <= 0:
        return 2.0**max_exponent
    return _reference([values.max().reshape(1)], dtype, max_exponent)


def scale_threshold_65504(grads, dtype, max_exponent=24):
    values = _all(grads)
    if not torch.isfinite(values).all():
        return None
    largest = values.abs().max().item() if values.numel() else 0.0
    if largest == 0:
        return 2.0**max_exponent
    return 2.0 ** min(max_exponent, math.floor(math.log2(torch.finfo(dtype).max / largest)))


def scale_threshold_65536(grads, dtype, max_exponent=24):
    values = _all(grads)
    if not torch.isfinite(values).all():
        return None
    largest = values.abs().max().item() if values.numel() else 0.0
    if largest == 0:
        return 2.0**max_exponent
    k = max_exponent
    while largest * 2.0**k >= 2.0 ** math.ceil(math.log2(torch.finfo(dtype).max)):
        k -= 1
    return 2.0**k


def scale_ignores_inf(grads, dtype, max_exponent=24):
    values = _all(grads)
    return _reference([values[torch.isfinite(values)]], dtype, max_exponent)


def scale_log_of_zero(grads, dtype, max_exponent=24):
    values = _all(grads)
    math.log2(values.abs().max().item())  # max() of nothing raises; log2(0) raises on all-zero gradients
    return _reference(grads, dtype, max_exponent)


def scale_none_for_zeros(grads, dtype, max_exponent=24):
    values = _all(grads)
    if not values.numel() or values.abs().max() == 0:
        return None
    return _reference(grads, dtype, max_exponent)


def scale_first_only(grads, dtype, max_exponent=24):
    return _reference(grads[:1], dtype, max_exponent)


def scale_cast_first(grads, dtype, max_exponent=24):
    if any(not torch.isfinite(g.to(dtype)).all() for g in grads):
        return None
    return _reference(grads, dtype, max_exponent)


def scale_at_least_one(grads, dtype, max_exponent=24):
    answer = _reference(grads, dtype, max_exponent)
    return None if answer is None else max(answer, 1.0)


def scale_always_fp16(grads, dtype, max_exponent=24):
    return _reference(grads, torch.float16, max_exponent)


def scale_no_cap(grads, dtype, max_exponent=24):
    values = _all(grads)
    if values.numel() and torch.isfinite(values).all() and values.abs().max() > 0:
        return _reference(grads, dtype, 200)
    return _reference(grads, dtype, max_exponent)


def scale_not_power_of_two(grads, dtype, max_exponent=24):
    values = _all(grads)
    if not torch.isfinite(values).all():
        return None
    if not values.numel() or values.abs().max() == 0:
        return 2.0**max_exponent
    return min(2.0**max_exponent, torch.finfo(dtype).max / values.abs().max().item())


@pytest.mark.parametrize(
    "wrong, named",
    [
        (scale_too_big, "twice the largest safe one"),
        (scale_too_small, "half the largest safe one"),
        (scale_signed_max, "ignored the sign"),
        (scale_threshold_65504, "values below 65520 round *down*"),
        (scale_threshold_65536, "2^16 = 65536"),
        (scale_ignores_inf, "return None (skip this step"),
        (scale_log_of_zero, "return the cap"),
        (scale_none_for_zeros, "the answer is the cap"),
        (scale_first_only, "only at the first tensor"),
        (scale_cast_first, "returned None for finite gradients"),
        (scale_at_least_one, "below 1"),
        (scale_always_fp16, "ignores `dtype`"),
        (scale_no_cap, "larger than 2**max_exponent"),
        (scale_not_power_of_two, "not a power of two"),
    ],
    ids=lambda v: getattr(v, "__name__", "")[:30],
)
def test_largest_safe_scale_names_each_mistake(wrong, named):
    result = check_largest_safe_scale(wrong)
    assert not result.passed and result.status == "failed"
    assert named in result.message, result.message


@pytest.mark.parametrize(
    "junk, expected",
    [
        (None, "got None"),
        (42, "got a int"),
        (lambda grads: 1.0, "signature"),
        (lambda grads, dtype, max_exponent: "2^16", "return a number"),
        (lambda grads, dtype, max_exponent: True, "bool"),
        (lambda grads, dtype, max_exponent: float("nan"), "positive, finite power of two"),
        (lambda grads, dtype, max_exponent: -4.0, "positive, finite power of two"),
        (lambda grads, dtype, max_exponent: torch.ones(2), "tensor with 2 elements"),
        (lambda grads, dtype, max_exponent: grads.shape, "AttributeError"),
    ],
)
def test_largest_safe_scale_junk_never_raises(junk, expected):
    result = check_largest_safe_scale(junk)
    assert not result.passed and result.status == "failed"
    assert expected in result.message, result.message


def test_largest_safe_scale_accepts_an_int_power_of_two_and_a_tensor():
    reference = solution(LESSON, "largest_safe_scale")

    def as_tensor(grads, dtype, max_exponent=24):
        answer = reference(grads, dtype, max_exponent)
        return None if answer is None else torch.tensor(answer)

    assert check_largest_safe_scale(as_tensor).passed


def test_checks_run_in_strict_mode_on_the_solution(strict):
    assert check_lost_fractions(solution(LESSON, "lost_fractions")).passed
    assert check_largest_safe_scale(solution(LESSON, "largest_safe_scale")).passed


# --------------------------------------------------------------------------- the mistake tables, rule by rule


def frac_counts(grad, dtype, scale):
    return tuple(v * _kept(grad).numel() for v in REFERENCE_FRACTIONS(grad, dtype, scale))


def frac_no_scale(grad, dtype, scale):
    return REFERENCE_FRACTIONS(grad, dtype, 1.0)


def frac_below_2_23(grad, dtype, scale):
    v = _kept(grad) * scale
    if not v.numel():
        return 0.0, 0.0
    tiny = torch.finfo(dtype).smallest_normal * torch.finfo(dtype).eps  # 2^-24 for FP16
    return (v.abs() < 2 * tiny).float().mean().item(), torch.isinf(v.to(dtype)).float().mean().item()


def frac_65536(grad, dtype, scale):
    v = _kept(grad) * scale
    if not v.numel():
        return 0.0, 0.0
    limit = 2.0 ** math.ceil(math.log2(torch.finfo(dtype).max))
    return (v.to(dtype) == 0).float().mean().item(), (v.abs() >= limit).float().mean().item()


def frac_signed_thresholds(grad, dtype, scale):
    v = _kept(grad) * scale
    if not v.numel():
        return 0.0, 0.0
    tiny = torch.finfo(dtype).smallest_normal * torch.finfo(dtype).eps
    return (v < tiny).float().mean().item(), (v > torch.finfo(dtype).max).float().mean().item()


def frac_positive_inf_only(grad, dtype, scale):
    stored = (_kept(grad) * scale).to(dtype)
    if not stored.numel():
        return 0.0, 0.0
    return (stored == 0).float().mean().item(), (stored == float("inf")).float().mean().item()


def frac_zeros_and_inf_counted(grad, dtype, scale):
    stored = (grad[~torch.isnan(grad)] * scale).to(dtype)
    if not grad.numel():
        return 0.0, 0.0
    return (stored == 0).sum().item() / grad.numel(), torch.isinf(stored).sum().item() / grad.numel()


def frac_nonfinite_kept(grad, dtype, scale):
    stored = (grad[grad != 0] * scale).to(dtype)
    if not stored.numel():
        return 0.0, 0.0
    return (stored == 0).float().mean().item(), (~torch.isfinite(stored)).float().mean().item()


# ---------------------------------- correct answers written differently, and more natural wrong answers


def frac_numpy(grad, dtype, scale):
    g = grad.detach().cpu().numpy().ravel()
    g = g[np.isfinite(g) & (g != 0)]
    if g.size == 0:
        return 0.0, 0.0
    with np.errstate(over="ignore"):
        scaled = g * np.float32(scale)
    stored = torch.from_numpy(scaled).to(dtype).float().numpy()
    return float(np.mean(stored == 0)), float(np.mean(np.isinf(stored)))


def frac_fractions_of(stored, overflowed):
    """(underflow, overflow) of already-stored values, with ``overflowed`` the learner's overflow test."""
    if stored.numel() == 0:
        return 0.0, 0.0
    return (stored == 0).float().mean().item(), overflowed(stored).float().mean().item()


def frac_count_nonzero(grad, dtype, scale):
    keep = torch.isfinite(grad) & grad.ne(0)
    n = int(torch.count_nonzero(keep))
    if n == 0:
        return [0.0, 0.0]
    stored = grad[keep].mul(scale).to(dtype)
    return [torch.count_nonzero(stored == 0) / n, torch.count_nonzero(stored.isinf()) / n]


def frac_python_loop(grad, dtype, scale):
    under = over = n = 0
    for v in grad.flatten().tolist():
        if v == 0 or math.isinf(v) or math.isnan(v):
            continue
        n += 1
        s = torch.tensor(v * scale, dtype=torch.float32).to(dtype).item()
        under += s == 0
        over += math.isinf(s)
    return (under / n, over / n) if n else (0.0, 0.0)


def frac_exact_thresholds(grad, dtype, scale):
    """Thresholds with the rounding done right: <= half the smallest subnormal, >= max + half a step."""
    g = grad[torch.isfinite(grad) & (grad != 0)].double() * scale
    if g.numel() == 0:
        return 0.0, 0.0
    info = torch.finfo(dtype)
    mantissa = {torch.float16: 10, torch.bfloat16: 7}[dtype]
    smallest = info.tiny * 2.0**-mantissa
    top = info.max + 2.0 ** (math.floor(math.log2(info.max)) - mantissa - 1)
    a = g.abs()
    return (a <= smallest / 2).double().mean().item(), (a >= top).double().mean().item()


def _kept_or_none(grad):
    v = grad[torch.isfinite(grad) & (grad != 0)]
    return v if v.numel() else None


def frac_eps(grad, dtype, scale):
    v = _kept_or_none(grad)
    if v is None:
        return 0.0, 0.0
    s = v * scale
    under = (s.abs() < torch.finfo(dtype).eps).float().mean().item()
    return under, torch.isinf(s.to(dtype)).float().mean().item()


def frac_mixed(grad, dtype, scale):
    v = _kept_or_none(grad)
    if v is None:
        return 0.0, 0.0
    s = v * scale
    return (s.to(dtype) == 0).float().mean().item(), (s.abs() > torch.finfo(dtype).max).float().mean().item()


def frac_under_by_threshold(grad, dtype, scale):
    v = _kept_or_none(grad)
    if v is None:
        return 0.0, 0.0
    s = v * scale
    tiny = torch.finfo(dtype).tiny * torch.finfo(dtype).eps
    return (s.abs() < tiny).float().mean().item(), torch.isinf(s.to(dtype)).float().mean().item()


def frac_half(grad, dtype, scale):
    v = _kept_or_none(grad)
    if v is None:
        return 0.0, 0.0
    s = (v * scale).half()
    return (s == 0).float().mean().item(), torch.isinf(s).float().mean().item()


def frac_after_mean(grad, dtype, scale):
    finite = grad[torch.isfinite(grad)]
    if finite.numel() == 0:
        return 0.0, 0.0
    s = (finite[finite != 0] * scale).to(dtype)
    return (s == 0).sum().item() / finite.numel(), torch.isinf(s).sum().item() / finite.numel()


def scale_closed_form(grads, dtype, max_exponent=24):
    values = [g.detach().abs().float() for g in grads if g.numel()]
    if any(not torch.isfinite(v).all() for v in values):
        return None
    amax = max((v.max().item() for v in values), default=0.0)
    if amax == 0:
        return 2.0**max_exponent
    k = min(max_exponent, math.floor(math.log2(torch.finfo(dtype).max / amax)) + 1)
    while math.isinf(torch.tensor(amax * 2.0**k).to(dtype).item()):
        k -= 1
    return 2.0**k


def scale_count_up(grads, dtype, max_exponent=24):
    flat = torch.cat([g.flatten() for g in grads]) if grads else torch.zeros(0)
    if flat.isnan().any() or flat.isinf().any():
        return None
    amax = flat.abs().max() if flat.numel() else torch.tensor(0.0)
    k = -160
    while k < max_exponent and not torch.isinf((amax * 2.0 ** (k + 1)).to(dtype)):
        k += 1
    return 2**k


def scale_numpy_threshold(grads, dtype, max_exponent=24):
    arrays = [g.detach().cpu().numpy().ravel() for g in grads]
    flat = np.concatenate(arrays) if arrays else np.zeros(0, dtype=np.float32)
    if not np.all(np.isfinite(flat)):
        return None
    amax = float(np.max(np.abs(flat))) if flat.size else 0.0
    if amax == 0.0:
        return float(2**max_exponent)
    overflow_at = {torch.float16: 65520.0, torch.bfloat16: (2 - 2.0**-8) * 2.0**127}[dtype]
    k = max_exponent
    while amax * 2.0**k >= overflow_at:
        k -= 1
    return 2.0**k


def scale_frexp(grads, dtype, max_exponent=24):
    if not grads or all(g.numel() == 0 for g in grads):
        return 2.0**max_exponent
    amax = torch.stack([g.abs().max() for g in grads if g.numel()]).max()
    if not torch.isfinite(amax):
        return None
    if amax == 0:
        return 2.0**max_exponent
    _, e = torch.frexp(amax)
    k = min(max_exponent, int(math.log2(torch.finfo(dtype).max)) - int(e) + 2)
    while torch.isinf((amax * 2.0**k).to(dtype)):
        k -= 1
    return 2.0**k


def _largest_k(grads, dtype, max_exponent, cast_first=False):
    """The solution's loop (amax cast to ``dtype`` first when asked); None when a value is not finite."""
    flat = torch.cat([g.flatten() for g in grads] + [torch.zeros(0)])
    if not torch.isfinite(flat).all():
        return None
    if flat.numel() == 0 or flat.abs().max() == 0:
        return max_exponent
    amax = flat.abs().max().to(dtype) if cast_first else flat.abs().max()
    k = max_exponent
    while torch.isinf((amax * 2.0**k).to(dtype)) and k > -40:
        k -= 1
    return k


def scale_returns_exponent(grads, dtype, max_exponent=24):
    return _largest_k(grads, dtype, max_exponent)


def scale_zero_for_inf(grads, dtype, max_exponent=24):
    k = _largest_k(grads, dtype, max_exponent)
    return 0.0 if k is None else 2.0**k


def scale_cast_amax_fp16(grads, dtype, max_exponent=24):
    k = _largest_k(grads, dtype, max_exponent, cast_first=True)
    return None if k is None else 2.0**k


def scale_finite_after_cast(grads, dtype, max_exponent=24):
    if grads and not all(torch.isfinite(g.to(dtype)).all() for g in grads):
        return None  # the raw gradients checked after a cast: a finite 1e6 looks broken
    k = _largest_k(grads, dtype, max_exponent)
    return None if k is None else 2.0**k


def frac_divides_by_scale(grad, dtype, scale):
    return frac_numpy(grad, dtype, 1 / scale)  # "scaling" as division


def frac_overflow_any(grad, dtype, scale):
    kept = grad[torch.isfinite(grad) & (grad != 0)]
    if kept.numel() == 0:
        return 0.0, 0.0
    stored = (kept * scale).to(dtype)
    return (stored == 0).float().mean().item(), float(torch.isinf(stored).any())


FRACTION_RULE_CASES = {  # rule name: a learner-style lost_fractions with that mistake
    "divided by scale": frac_divides_by_scale,
    "yes/no": frac_overflow_any,
    "swapped": frac_swapped,
    "percent": frac_percent,
    "counts": frac_counts,
    "no scale": frac_no_scale,
    "cast first": frac_cast_first,
    "normal threshold": frac_normal_threshold,
    "thresholds": frac_thresholds,
    "2^-23": frac_below_2_23,
    "2^-25": frac_off_by_one,
    "65536": frac_65536,
    "no abs": frac_signed_thresholds,
    "positive inf only": frac_positive_inf_only,
    "over numel": frac_over_numel,
    "zeros counted": frac_zeros_and_inf_counted,
    "zeros counted finite": frac_zeros_counted,
    "nonfinite kept": frac_nonfinite_kept,
    "always fp16": frac_always_fp16,
    "eps": frac_eps,
    "overflow by comparing with max": frac_mixed,
    "underflow by comparing with the smallest subnormal": frac_under_by_threshold,
    "zeros in the denominator": frac_after_mean,
    # the class round's (issue 19); its learner-style answers are in test_class_round.py
    "integer division": lambda g, d, s: tuple(float(int(v)) for v in frac_numpy(g, d, s)),
    "rounded": lambda g, d, s: tuple(round(v, 2) for v in frac_numpy(g, d, s)),
    "nonfinite in the denominator": lambda g, d, s: tuple(
        v * int((g[torch.isfinite(g)] != 0).sum()) / max(int((g != 0).sum()), 1) for v in frac_numpy(g, d, s)
    ),
    "filtered after scaling": lambda g, d, s: frac_numpy(g * s, d, 1.0),
    "nan_to_num": lambda g, d, s: frac_numpy(torch.nan_to_num(g), d, s),
    "scale in dtype": lambda g, d, s: frac_fractions_of(
        (g[torch.isfinite(g) & (g != 0)] * torch.tensor(s, dtype=d)).to(d), torch.isinf
    ),
    "max counted as overflow": lambda g, d, s: frac_fractions_of(
        (g[torch.isfinite(g) & (g != 0)] * s).to(d), lambda c: c.abs() >= torch.finfo(d).max
    ),
}

SCALE_RULE_CASES = {  # rule name: a learner-style largest_safe_scale with that mistake
    "too big": scale_too_big,
    "too small": scale_too_small,
    "65504 compare": scale_threshold_65504,
    "65536": scale_threshold_65536,
    "signed max": scale_signed_max,
    "first only": scale_first_only,
    "no cap": scale_no_cap,
    "cap fixed at the default": lambda *args: scale_capped_at_24(*args),
    "at least one": scale_at_least_one,
    "always fp16": scale_always_fp16,
    "cast first": scale_cast_amax_fp16,
    # the class round's (issue 19); its learner-style answers are in test_class_round.py
    "norm": lambda grads, dtype, e: l02._oracle_scale(
        [torch.cat([g.flatten() for g in grads]).norm().reshape(1)] if grads else [], dtype, e
    ),
    "sum": lambda grads, dtype, e: l02._oracle_scale(
        [sum(g.abs().sum() for g in grads).reshape(1)] if grads else [], dtype, e
    ),
    "mean": lambda grads, dtype, e: l02._oracle_scale(
        [torch.cat([g.flatten() for g in grads]).abs().mean().reshape(1)] if grads else [], dtype, e
    ),
    "smallest": lambda grads, dtype, e: l02._oracle_scale(
        [min(g[g != 0].abs().min() for g in grads if g.count_nonzero()).reshape(1)], dtype, e
    ),
    "last only": lambda grads, dtype, e: l02._oracle_scale(grads[-1:], dtype, e),
    "largest per-tensor scale": lambda grads, dtype, e: max(l02._oracle_scale([g], dtype, e) for g in grads),
    "scale in dtype": lambda grads, dtype, e: min(
        l02._oracle_scale(grads, dtype, e), 2.0**15 if dtype == torch.float16 else 2.0**127
    ),
}


def _revealing_case(wrong, cases, oracle):
    """The first checker input on which ``wrong`` disagrees with the oracle, with its answer."""
    for case in cases:
        answer = wrong(*case[1:])
        if not l02._matches(answer, oracle(*case[1:])):
            return case, answer
    raise AssertionError(f"{wrong.__name__} agrees with the oracle on every input")


@pytest.mark.parametrize("name", FRACTION_RULE_CASES)
def test_each_fraction_rule_recognises_its_mistake(name):
    cases = l02._fraction_cases() + l02._edge_fraction_cases()
    case, answer = _revealing_case(FRACTION_RULE_CASES[name], cases, l02._oracle_fractions)
    rule = {rule.name: rule for rule in l02.FRACTION_MISTAKES}[name]
    assert rule.matches(case, answer), case[0]


@pytest.mark.parametrize("name", SCALE_RULE_CASES)
def test_each_scale_rule_recognises_its_mistake(name):
    special = l02._special_scale_cases()
    cases = l02._scale_cases() + special["inf"] + special["zero"]
    case, answer = _revealing_case(SCALE_RULE_CASES[name], cases, l02._oracle_scale)
    rule = {rule.name: rule for rule in l02.SCALE_MISTAKES}[name]
    assert rule.matches(case, answer), case[0]


# Three different wrong answers about zeros, three rules: each answer is named by its own rule, not a neighbour's.
ZEROS_MISTAKES = {
    "zeros counted": frac_zeros_and_inf_counted,  # drops only NaN: zeros (and inf) counted, over grad.numel()
    "zeros in the denominator": frac_after_mean,  # counts right, divides by the finite count, zeros included
    "zeros counted finite": frac_zeros_counted,  # keeps the finite values, zeros included, counts and divides
}


@pytest.mark.parametrize("name", ZEROS_MISTAKES)
def test_each_zeros_mistake_gets_its_own_rule(name):
    rule = {rule.name: rule for rule in l02.FRACTION_MISTAKES}[name]
    result = check_lost_fractions(ZEROS_MISTAKES[name])
    assert result.status == "failed" and result.message == rule.text(), result.message


def test_every_rule_has_a_case():
    assert {rule.name for rule in l02.FRACTION_MISTAKES} == set(FRACTION_RULE_CASES)
    assert {rule.name for rule in l02.SCALE_MISTAKES} == set(SCALE_RULE_CASES)


@pytest.mark.parametrize(
    "variant",
    [frac_numpy, frac_count_nonzero, frac_python_loop, frac_exact_thresholds],
    ids=lambda f: f.__name__,
)
def test_lost_fractions_correct_variants_pass(variant):
    result = check_lost_fractions(variant)
    assert result.passed, result.message


MORE_WRONG_FRACTIONS = {
    frac_eps: "which measures *precision*",
    frac_mixed: "you tested overflow with |g * scale| > finfo.max",
    frac_under_by_threshold: "you tested underflow with |g * scale| <",
    frac_half: "Your answer ignores `dtype`",
    frac_after_mean: "divided by the number of finite values, zeros included",
}


@pytest.mark.parametrize("wrong", list(MORE_WRONG_FRACTIONS), ids=lambda f: f.__name__)
def test_lost_fractions_names_more_mistakes(wrong):
    result = check_lost_fractions(wrong)
    assert result.status == "failed" and MORE_WRONG_FRACTIONS[wrong] in result.message, result.message


@pytest.mark.parametrize(
    "variant",
    [scale_closed_form, scale_count_up, scale_numpy_threshold, scale_frexp],
    ids=lambda f: f.__name__,
)
def test_largest_safe_scale_correct_variants_pass(variant):
    result = check_largest_safe_scale(variant)
    assert result.passed, result.message


MORE_WRONG_SCALES = {
    scale_returns_exponent: "Is 21 the exponent k itself?",
    scale_zero_for_inf: "return None only for inf/NaN gradients",
    scale_cast_amax_fp16: "You cast the largest gradient to the low-precision dtype before scaling it",
    scale_finite_after_cast: "not after casting them",
}


@pytest.mark.parametrize("wrong", list(MORE_WRONG_SCALES), ids=lambda f: f.__name__)
def test_largest_safe_scale_names_more_mistakes(wrong):
    result = check_largest_safe_scale(wrong)
    assert result.status == "failed" and MORE_WRONG_SCALES[wrong] in result.message, result.message


# ----------------------------------- a review pass: more styles a class writes, and more mistakes


def frac_tensor_results(grad, dtype, scale):
    """torch.where keeps the shape; returns two 0-d tensors (the check reads them as numbers)."""
    keep = torch.isfinite(grad) & (grad != 0)
    n = keep.sum()
    if n == 0:
        return 0.0, 0.0
    stored = torch.where(keep, grad * scale, torch.ones_like(grad)).to(dtype)
    return ((stored == 0) & keep).sum() / n, (stored.isinf() & keep).sum() / n


def frac_masked_select_list(grad, dtype, scale):
    """float64 before the cast (the product is exact either way), a list instead of a tuple, a print."""
    values = grad.masked_select(grad.isfinite() & grad.ne(0)).double()
    print("counted", values.numel())
    if len(values) == 0:
        return [0.0, 0.0]
    stored = (values * scale).to(dtype).float()
    return [stored.eq(0).float().mean().item(), stored.isinf().float().mean().item()]


@pytest.mark.parametrize("variant", [frac_tensor_results, frac_masked_select_list], ids=lambda f: f.__name__)
def test_review_lost_fractions_variants_pass(variant):
    assert check_lost_fractions(variant).passed


@pytest.mark.parametrize(
    "wrong, named",
    [
        (frac_divides_by_scale, "You divided by `scale`"),
        (frac_overflow_any, "You returned 1.0 or 0.0"),
    ],
    ids=["divided by scale", "overflow any()"],
)
def test_review_lost_fractions_mistakes_are_named(wrong, named):
    result = check_lost_fractions(wrong)
    assert result.status == "failed" and named in result.message, result.message


def scale_binary_search(grads, dtype, max_exponent=24):
    flat = [g.detach().float().flatten() for g in grads]
    values = torch.cat(flat) if flat else torch.zeros(0)
    if (~torch.isfinite(values)).any():
        return None
    if values.numel() == 0 or not values.any():
        return float(2**max_exponent)
    largest = values.abs().max()

    def safe(k):
        return not torch.isinf((largest * 2.0**k).to(dtype)).item()

    low, high = -300, max_exponent
    if safe(high):
        return 2.0**high
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (middle, high) if safe(middle) else (low, middle)
    return 2.0**low


def scale_per_tensor_minimum(grads, dtype, max_exponent=24):
    best = 2.0**max_exponent
    for g in grads:
        if g.numel() == 0:
            continue
        if not torch.isfinite(g).all():
            return None
        k = max_exponent
        while torch.isinf((g * 2.0**k).to(dtype)).any():
            k -= 1
        best = min(best, 2.0**k)
    return best


def scale_python_floats(grads, dtype, max_exponent=24):
    biggest = 0.0
    for g in grads:
        for v in g.reshape(-1).tolist():
            if math.isnan(v) or math.isinf(v):
                return None
            biggest = max(biggest, abs(v))
    if biggest == 0:
        return 2**max_exponent
    k = max_exponent
    while math.isinf(torch.tensor(biggest * 2.0**k, dtype=torch.float32).to(dtype).item()):
        k -= 1
    return 2**k if k >= 0 else 2.0**k


@pytest.mark.parametrize(
    "variant", [scale_binary_search, scale_per_tensor_minimum, scale_python_floats], ids=lambda f: f.__name__
)
def test_review_largest_safe_scale_variants_pass(variant):
    assert check_largest_safe_scale(variant).passed


def scale_max_of_empty(grads, dtype, max_exponent=24):
    largest = max(g.abs().max() for g in grads) if grads else torch.tensor(0.0)  # raises on an empty tensor
    return _reference([largest.reshape(1)], dtype, max_exponent)


def scale_cat_of_shapes(grads, dtype, max_exponent=24):
    return _reference([torch.cat(grads)] if grads else [], dtype, max_exponent)  # 2-D and 1-D do not cat


def scale_nan_only(grads, dtype, max_exponent=24):
    values = torch.cat([g.reshape(-1) for g in grads] + [torch.zeros(0)])
    if torch.isnan(values).any():
        return None
    return _reference([values[torch.isfinite(values)]], dtype, max_exponent)


@pytest.mark.parametrize(
    "wrong, named",
    [
        (scale_max_of_empty, "RuntimeError: max(): Expected reduction dim"),
        (scale_cat_of_shapes, "RuntimeError: Tensors must have same number of dimensions"),
        (scale_nan_only, "On gradients containing inf"),
    ],
    ids=["max of empty", "cat of shapes", "NaN only"],
)
def test_review_largest_safe_scale_mistakes_are_named(wrong, named):
    result = check_largest_safe_scale(wrong)
    assert result.status == "failed" and named in result.message, result.message


def test_review_checks_are_fast_on_the_reference():
    for check, answer in (
        (check_lost_fractions, REFERENCE_FRACTIONS),
        (check_largest_safe_scale, REFERENCE_SCALE),
    ):
        check(answer)
        started = time.perf_counter()
        assert check(answer).passed
        assert time.perf_counter() - started < 2.0


# ----------------------------------- issue 19: the max_exponent a failing case used is said


def scale_capped_at_24(grads, dtype, max_exponent=24):
    values = torch.cat([g.detach().reshape(-1).float() for g in grads] + [torch.zeros(0)])
    if not torch.isfinite(values).all():
        return None
    if values.numel() == 0 or values.abs().max() == 0:
        return 2.0**24
    k = 24  # the default, not the argument
    while torch.isinf((values.abs().max() * 2.0**k).to(dtype)):
        k -= 1
    return 2.0**k


def scale_never_below_one_in_a_loop(grads, dtype, max_exponent=24):
    largest = max((float(g.abs().max()) for g in grads if g.numel()), default=0.0)
    if largest != largest or largest == float("inf"):
        return None
    for k in range(max_exponent, -1, -1):
        if not torch.isinf(torch.tensor(largest * 2.0**k).to(dtype)):
            return 2.0**k
    return 1.0


def test_a_cap_fixed_at_the_default_is_named_with_the_max_exponent_used():
    result = check_largest_safe_scale(scale_capped_at_24)
    assert result.status == "failed" and "whatever max_exponent the call passes" in result.message
    assert any("max_exponent=16" in line for line in result.details), result.details


def test_every_failing_input_line_says_its_max_exponent():
    result = check_largest_safe_scale(scale_never_below_one_in_a_loop)
    assert result.status == "failed", result.message
    assert any(line.startswith("input:") and "max_exponent=24" in line for line in result.details), (
        result.details
    )
