"""Lesson 02, a class round (issue 19): right answers written unlike the solution, and natural wrong answers
the other tests do not cover, each named by its own mistake.

What the round found (fixed in check.py). 02.1: `//` instead of `/`, rounded fractions, inf/NaN counted in the
denominator, inf/NaN dropped after scaling (or `grad` scaled in place first) and values cast to finfo.max
counted as overflow got "Your fractions differ from the definition"; `torch.nan_to_num` likewise; the scale
stored in float16 (2^16 is inf there) was told it answered yes/no. 02.2: the norm, the mean or the smallest
|g| instead of the largest, the largest of the per-tensor scales and the last tensor only were told "first
only" or "Not the largest safe power of two"; the sum of the magnitudes passed (no case had many values close
to the largest: one now does), and a scale stored in float16 (never above 2^15) got the generic message.
"""

import math

import pytest
import torch

from amp_lessons.l02_fp16_underflow_and_loss_scaling.check import (
    check_largest_safe_scale,
    check_lost_fractions,
)

# ------------------------------------------------------------------------------------------------ 02.1 right


def r_mean(grad, dtype, scale):
    s = (grad[grad.isfinite() & grad.ne(0)] * scale).to(dtype)
    if not s.numel():
        return (0.0, 0.0)
    return (s == 0).float().mean().item(), s.isinf().float().mean().item()


def r_notfinite(grad, dtype, scale):
    mask = torch.isfinite(grad) & (grad != 0)
    n = int(mask.sum())
    if n == 0:
        return 0, 0
    s = (grad * scale).to(dtype)[mask]
    return float((s == 0).sum()) / n, float((~torch.isfinite(s)).sum()) / n


def r_loop(grad, dtype, scale):
    lost_u = lost_o = n = 0
    for v in grad.tolist():
        if v == 0 or not math.isfinite(v):
            continue
        n += 1
        c = torch.tensor(v * scale, dtype=torch.float32).to(dtype).item()
        lost_u += c == 0
        lost_o += math.isinf(c)
    return [lost_u / n, lost_o / n] if n else [0.0, 0.0]


def r_tensors(grad, dtype, scale):
    v = grad[torch.isfinite(grad) & (grad != 0)]
    if len(v) == 0:
        return torch.tensor(0.0), torch.tensor(0.0)
    s = torch.mul(v, scale).to(dtype)
    return torch.count_nonzero(s == 0) / len(v), torch.count_nonzero(s.isinf()) / len(v)


def r_one_minus_the_kept(grad, dtype, scale):
    """One minus the fractions that survived."""
    values = grad[torch.isfinite(grad) & (grad != 0)]
    if values.numel() == 0:
        return 0.0, 0.0
    stored = (values * scale).to(dtype)
    return 1 - (stored != 0).sum().item() / values.numel(), 1 - torch.isfinite(
        stored
    ).sum().item() / values.numel()


@pytest.mark.parametrize(
    "answer", [r_mean, r_notfinite, r_loop, r_tensors, r_one_minus_the_kept], ids=lambda f: f.__name__
)
def test_class_round_lost_fractions_right_answers_pass(answer):
    result = check_lost_fractions(answer)
    assert result.passed, result.message


# ------------------------------------------------------------------------------------------------ 02.1 wrong


def _right(grad, dtype, scale):
    values = grad[torch.isfinite(grad) & (grad != 0)]
    if values.numel() == 0:
        return 0.0, 0.0
    stored = (values * scale).to(dtype)
    return (stored == 0).sum().item() / values.numel(), torch.isinf(stored).sum().item() / values.numel()


def w_intdiv(grad, dtype, scale):
    values = grad[torch.isfinite(grad) & (grad != 0)]
    if values.numel() == 0:
        return 0, 0
    stored = (values * scale).to(dtype)
    return (stored == 0).sum().item() // values.numel(), torch.isinf(stored).sum().item() // values.numel()


def w_round(grad, dtype, scale):
    u, o = _right(grad, dtype, scale)
    return round(u, 2), round(o, 2)


def w_den_nonzero(grad, dtype, scale):
    n = int((grad != 0).sum())
    values = grad[torch.isfinite(grad) & (grad != 0)]
    if n == 0:
        return 0.0, 0.0
    stored = (values * scale).to(dtype)
    return (stored == 0).sum().item() / n, torch.isinf(stored).sum().item() / n


def w_inplace(grad, dtype, scale):
    grad.mul_(scale)
    values = grad[torch.isfinite(grad) & (grad != 0)]
    if values.numel() == 0:
        return 0.0, 0.0
    stored = values.to(dtype)
    return (stored == 0).sum().item() / values.numel(), torch.isinf(stored).sum().item() / values.numel()


def w_nan_to_num(grad, dtype, scale):
    return _right(torch.nan_to_num(grad), dtype, scale)


def w_scale_in_dtype(grad, dtype, scale):
    values = grad[torch.isfinite(grad) & (grad != 0)]
    if values.numel() == 0:
        return 0.0, 0.0
    stored = values.to(torch.float32) * torch.tensor(scale, dtype=dtype)
    stored = stored.to(dtype)
    return (stored == 0).sum().item() / values.numel(), torch.isinf(stored).sum().item() / values.numel()


def w_overflow_above_max_after_cast(grad, dtype, scale):
    values = grad[torch.isfinite(grad) & (grad != 0)]
    if values.numel() == 0:
        return 0.0, 0.0
    stored = (values * scale).to(dtype)
    return (stored == 0).sum().item() / values.numel(), (
        stored.abs() >= torch.finfo(dtype).max
    ).sum().item() / values.numel()


def w_filtered_after_scaling(grad, dtype, scale):
    scaled = grad * scale
    kept = scaled[torch.isfinite(scaled) & (scaled != 0)]
    if kept.numel() == 0:
        return 0.0, 0.0
    stored = kept.to(dtype)
    return (stored == 0).float().mean().item(), stored.isinf().float().mean().item()


@pytest.mark.parametrize(
    ("wrong", "words"),
    [
        (w_intdiv, "You divided with `//`"),
        (w_round, "Your fractions are rounded"),
        (w_den_nonzero, "divided by the number of nonzero values, inf/NaN included"),
        (w_inplace, "You dropped inf/NaN *after* multiplying"),
        (w_filtered_after_scaling, "You dropped inf/NaN *after* multiplying"),
        (w_nan_to_num, "torch.nan_to_num"),
        (w_scale_in_dtype, "You stored `scale` in the low-precision dtype"),
        (w_overflow_above_max_after_cast, "cast to finfo.max (65504 in float16) as overflow"),
    ],
    ids=lambda x: getattr(x, "__name__", ""),
)
def test_class_round_lost_fractions_wrong_answers_are_named(wrong, words):
    result = check_lost_fractions(wrong)
    assert result.status == "failed", result.message
    assert words in result.message, result.message
    assert "differ from the definition" not in result.message


# ------------------------------------------------------------------------------------------------ 02.2 right


def r_log2(grads, dtype, max_exponent=24):
    if any(not torch.isfinite(g).all() for g in grads):
        return None
    amax = max((float(g.abs().max()) for g in grads if g.numel()), default=0.0)
    if amax == 0:
        return 2.0**max_exponent
    k = min(max_exponent, math.floor(math.log2(torch.finfo(dtype).max / amax)))
    while k < max_exponent and torch.isfinite(
        torch.tensor(amax * 2.0 ** (k + 1), dtype=torch.float32).to(dtype)
    ):
        k += 1
    while torch.isinf(torch.tensor(amax * 2.0**k, dtype=torch.float32).to(dtype)):
        k -= 1
    return 2.0**k


def r_bisect(grads, dtype, max_exponent=24):
    flat = torch.cat([g.flatten() for g in grads]) if grads else torch.tensor([])
    if flat.isnan().any() or flat.isinf().any():
        return None
    if not flat.count_nonzero():
        return 2.0**max_exponent
    amax = flat.abs().max()

    def ok(k):
        return bool(torch.isfinite((amax * 2.0**k).to(dtype)))

    lo, hi = -300, max_exponent  # ok(lo) true, find largest ok
    if ok(hi):
        return 2.0**hi
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if ok(mid) else (lo, mid)
    return math.ldexp(1.0, lo)


def r_tensor_pow(grads, dtype, max_exponent=24):
    amaxes = [g.abs().amax() for g in grads if g.numel()]
    amax = torch.stack(amaxes).amax() if amaxes else torch.tensor(0.0)
    if not torch.isfinite(amax):
        return None
    for g in grads:
        if torch.isnan(g).any():
            return None
    if amax == 0:
        return torch.tensor(2.0) ** max_exponent
    ks = torch.arange(max_exponent, -200, -1, dtype=torch.float32)
    fine = torch.isfinite((amax * torch.exp2(ks)).to(dtype))
    return torch.exp2(ks[fine][0])


def r_int_when_whole(grads, dtype, max_exponent=24):
    r = _k(grads, dtype, max_exponent)
    return r if r is None or r < 1 else int(r)


@pytest.mark.parametrize(
    "answer", [r_log2, r_bisect, r_tensor_pow, r_int_when_whole], ids=lambda f: f.__name__
)
def test_class_round_largest_safe_scale_right_answers_pass(answer):
    result = check_largest_safe_scale(answer)
    assert result.passed, result.message


# ------------------------------------------------------------------------------------------------ 02.2 wrong


def _k(grads, dtype, max_exponent, nanonly=False, start=None, amax_of=None):
    vals = torch.cat([g.flatten() for g in grads]) if grads else torch.zeros(0)
    if nanonly:
        if torch.isnan(vals).any():
            return None
    elif not torch.isfinite(vals).all():
        return None
    if vals.numel() == 0 or vals.abs().max() == 0:
        return 2.0**max_exponent
    amax = vals.abs().max() if amax_of is None else amax_of(vals)
    for k in range(max_exponent, -150, -1):
        if not torch.isinf((amax * 2.0**k).to(dtype)):
            return 2.0**k
    return None


def w_mean(grads, dtype, max_exponent=24):
    return _k(grads, dtype, max_exponent, amax_of=lambda v: v.abs().mean())


def w_norm(grads, dtype, max_exponent=24):
    return _k(grads, dtype, max_exponent, amax_of=lambda v: v.norm())


def w_last_only(grads, dtype, max_exponent=24):
    return _k(grads[-1:], dtype, max_exponent)


def w_finfo_tiny(grads, dtype, max_exponent=24):
    # scale so that smallest nonzero does not underflow?  "largest" read as smallest
    return _k(grads, dtype, max_exponent, amax_of=lambda v: v[v != 0].abs().min())


def w_scale_stored_in_dtype(grads, dtype, max_exponent=24):
    vals = torch.cat([g.flatten() for g in grads]) if grads else torch.zeros(0)
    if not torch.isfinite(vals).all():
        return None
    if vals.numel() == 0 or vals.abs().max() == 0:
        return 2.0**max_exponent
    amax = vals.abs().max()
    for k in range(max_exponent, -150, -1):
        if torch.isfinite(amax * torch.tensor(2.0**k, dtype=dtype)).all() and torch.isfinite(
            (amax * 2.0**k).to(dtype)
        ):
            return 2.0**k


def w_per_tensor_min(grads, dtype, max_exponent=24):
    # each tensor's own safe scale, return the max of those
    outs = [_k([g], dtype, max_exponent) for g in grads]
    if any(o is None for o in outs):
        return None
    return max(outs, default=2.0**max_exponent)


def w_sum(grads, dtype, max_exponent=24):
    return _k(grads, dtype, max_exponent, amax_of=lambda v: v.abs().sum())


@pytest.mark.parametrize(
    ("wrong", "words"),
    [
        (w_mean, "You used the mean |gradient|"),
        (w_norm, "You used the norm of the gradients"),
        (w_sum, "You added the magnitudes up"),
        (w_last_only, "only at the last tensor"),
        (w_finfo_tiny, "You used the smallest nonzero |gradient|"),
        (w_scale_stored_in_dtype, "you stored the scale itself in `dtype`"),
        (w_per_tensor_min, "the largest of the per-tensor safe scales"),
    ],
    ids=lambda x: getattr(x, "__name__", ""),
)
def test_class_round_largest_safe_scale_wrong_answers_are_named(wrong, words):
    result = check_largest_safe_scale(wrong)
    assert result.status == "failed", result.message
    assert words in result.message, result.message
    assert "Not the largest safe power of two" not in result.message
    assert "first tensor" not in result.message
