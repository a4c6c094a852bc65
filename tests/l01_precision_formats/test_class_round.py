"""Lesson 01, a class round (issue 19): answers written unlike the solution that must pass, and natural wrong
answers the other tests do not cover, each named by its own mistake.

What the round found (fixed in check.py): rounding to decimal digits (``f"{x:.4g}"``, ``round(x, 10)``) was
told "You returned x unchanged"; a hand-written tie test with the parity inverted (ties to odd) was told
"truncated"; rounding with the unclamped exponent and then zeroing what lies below the smallest subnormal was
told the bias is wrong; 01.2 with ``>`` instead of ``>=`` at the normal boundary passed (no probe sat on the
tie between the largest subnormal and the smallest normal); a bfloat16 classify that flushes subnormals was
told it used float16's range.
"""

import bisect
import math
import struct

import numpy as np
import pytest
import torch

from amp_lessons.l01_precision_formats.check import check_classify, check_stored_value

LAYOUTS = {"float16": (5, 10), "bfloat16": (8, 7)}


# ------------------------------------------------------------------------------------------------
# 01.1 stored_value: correct answers in other styles
# ------------------------------------------------------------------------------------------------


def stored_value_struct(x, fmt):
    """struct's IEEE half ('e', OverflowError means inf) for float16; float32 bits rounded for bfloat16."""
    if fmt == "float16":
        try:
            return struct.unpack("<e", struct.pack("<e", x))[0]
        except OverflowError:
            return math.copysign(math.inf, x)
    if x != x:
        return x
    (bits,) = struct.unpack("<I", struct.pack("<f", x))
    lower, upper = bits & 0xFFFF, bits >> 16
    if lower > 0x8000 or (lower == 0x8000 and upper & 1):
        upper += 1
    return struct.unpack("<f", struct.pack("<I", upper << 16))[0]


_TABLES = {}


def _every_positive_value(fmt):
    if fmt not in _TABLES:
        e, m = LAYOUTS[fmt]
        bias = 2 ** (e - 1) - 1
        values = [math.ldexp(frac, 1 - bias - m) for frac in range(2**m)]  # exponent field 0
        for field in range(1, 2**e - 1):
            values += [math.ldexp(2**m + frac, field - bias - m) for frac in range(2**m)]
        _TABLES[fmt] = values
    return _TABLES[fmt]


def stored_value_table(x, fmt):
    """Lists every finite value of the format, bisects, takes the nearest (a tie: the even index)."""
    if math.isnan(x) or math.isinf(x):
        return x
    values, a = _every_positive_value(fmt), abs(x)
    i = bisect.bisect_left(values, a)
    if i == len(values):
        beyond = 2 * values[-1] - values[-2]  # where the next value would be
        r = values[-1] if a - values[-1] < beyond - a else math.inf
    elif values[i] == a:
        r = a
    else:
        lo, hi = values[i - 1], values[i]
        r = lo if a - lo < hi - a or (a - lo == hi - a and (i - 1) % 2 == 0) else hi
    return math.copysign(r, x)


def stored_value_divmod(x, fmt):
    """numpy's frexp, divmod by the step and a hand-written tie test; the sign by a conditional."""
    e_bits, m_bits = LAYOUTS[fmt]
    if not np.isfinite(x) or x == 0:
        return float(x)
    bias = 2 ** (e_bits - 1) - 1
    exponent = max(int(np.frexp(abs(x))[1]) - 1, 1 - bias)
    step = 2.0 ** (exponent - m_bits)
    q, r = divmod(abs(x), step)
    if r > step / 2 or (r == step / 2 and q % 2 == 1):
        q += 1
    magnitude = q * step
    if magnitude > (2 ** (m_bits + 1) - 1) * 2.0 ** (bias - m_bits):
        magnitude = float("inf")
    return magnitude if x > 0 else -magnitude


def stored_value_exponent_loop(x, fmt):
    """Finds the exponent with a for loop from the top down; np.rint rounds; overflow when it reaches 2^(bias+1)."""
    e_bits, m_bits = LAYOUTS[fmt]
    if math.isnan(x) or math.isinf(x) or x == 0:
        return x
    bias = 2 ** (e_bits - 1) - 1
    exponent = 1 - bias
    for e in range(bias + 10, -bias - 30, -1):
        if abs(x) >= 2.0**e:
            exponent = max(e, 1 - bias)
            break
    r = int(np.rint(abs(x) * 2.0 ** (m_bits - exponent))) * 2.0 ** (exponent - m_bits)
    if r >= 2.0 ** (bias + 1):
        r = math.inf
    return -r if math.copysign(1, x) < 0 else r


def stored_value_float32_numpy(x, fmt):
    """All in np.float32 (exact here: float32 inputs, power-of-two steps)."""
    e_bits, m_bits = LAYOUTS[fmt]
    if not math.isfinite(x) or x == 0:
        return x
    bias = 2 ** (e_bits - 1) - 1
    step = np.float32(2.0) ** np.float32(max(math.frexp(abs(x))[1] - 1, 1 - bias) - m_bits)
    with np.errstate(over="ignore"):
        magnitude = np.round(np.float32(abs(x)) / step) * step
    if magnitude > (2 - 2.0**-m_bits) * 2.0**bias:
        magnitude = np.inf
    return float(np.copysign(magnitude, x))


@pytest.mark.parametrize(
    "answer",
    [
        stored_value_struct,
        stored_value_table,
        stored_value_divmod,
        stored_value_exponent_loop,
        stored_value_float32_numpy,
    ],
    ids=lambda f: f.__name__,
)
def test_class_round_stored_value_correct_answers_pass(answer):
    result = check_stored_value(answer)
    assert result.passed, result.message


# ------------------------------------------------------------------------------------------------
# 01.1 stored_value: natural wrong answers
# ------------------------------------------------------------------------------------------------


def _ldexp(x, e_bits, m_bits):
    if not math.isfinite(x) or x == 0:
        return x
    bias = 2 ** (e_bits - 1) - 1
    exponent = max(math.frexp(abs(x))[1] - 1, 1 - bias)
    value = math.ldexp(round(math.ldexp(abs(x), m_bits - exponent)), exponent - m_bits)
    return math.copysign(value if value <= math.ldexp(2 ** (m_bits + 1) - 1, bias - m_bits) else math.inf, x)


def decimal_significant_digits(x, fmt):
    """'float16 has about 3-4 decimal digits, bfloat16 about 2-3'."""
    if not math.isfinite(x) or x == 0:
        return x
    return float(f"{x:.{ {'float16': 4, 'bfloat16': 3}[fmt] }g}")


def decimal_places(x, fmt):
    """round(x, mantissa_bits): decimal places, not bits."""
    return x if not math.isfinite(x) else round(x, LAYOUTS[fmt][1])


def _hand_rounded(x, fmt, *, ties, clamp=True, flush_below_smallest=False, overflow=True):
    e_bits, m_bits = LAYOUTS[fmt]
    if not math.isfinite(x) or x == 0:
        return x
    bias = 2 ** (e_bits - 1) - 1
    exponent = math.frexp(abs(x))[1] - 1
    step = 2.0 ** ((max(exponent, 1 - bias) if clamp else exponent) - m_bits)
    if ties == "signed floor":
        magnitude = abs(math.floor(x / step + 0.5) * step)
    else:
        q = math.floor(abs(x) / step)
        frac = abs(x) / step - q
        q += frac > 0.5 or (frac == 0.5 and q % 2 == (0 if ties == "odd" else 1))
        magnitude = q * step
    if flush_below_smallest and magnitude < 2.0 ** (1 - bias - m_bits):
        magnitude = 0.0
    if overflow and magnitude > (2 - 2.0**-m_bits) * 2.0**bias:
        magnitude = math.inf
    return math.copysign(magnitude, x)


def ties_to_odd(x, fmt):
    """A hand-written tie test with the parity the wrong way round."""
    return _hand_rounded(x, fmt, ties="odd")


def signed_floor_plus_half(x, fmt):
    """math.floor(x / step + 0.5) on the signed x: positive ties go away from zero, negative ones towards it."""
    return _hand_rounded(x, fmt, ties="signed floor")


def unclamped_then_zero_below_smallest(x, fmt):
    """Rounds with the unclamped exponent, then patches: below the smallest subnormal is zero."""
    return _hand_rounded(x, fmt, ties="even", clamp=False, flush_below_smallest=True)


def overflow_from_the_next_power_of_two(x, fmt):
    """inf only from 2^(bias+1), and no overflow test after rounding: 65520 comes back as 65536."""
    bias = 2 ** (LAYOUTS[fmt][0] - 1) - 1
    if math.isfinite(x) and abs(x) >= 2.0 ** (bias + 1):
        return math.copysign(math.inf, x)
    return _hand_rounded(x, fmt, ties="even", overflow=False)


def zero_as_literal(x, fmt):
    return 0.0 if x == 0 else _ldexp(x, *LAYOUTS[fmt])


def infinity_without_sign(x, fmt):
    return math.inf if math.isinf(x) else _ldexp(x, *LAYOUTS[fmt])


def widths_unpacked_the_wrong_way(x, fmt):
    e_bits, m_bits = LAYOUTS[fmt]
    return _ldexp(x, m_bits, e_bits)


def bfloat16_upper_bits(x, fmt):
    """bfloat16 as the upper 16 bits of float32: chops instead of rounding."""
    if fmt == "float16":
        return _ldexp(x, 5, 10)
    (bits,) = struct.unpack("<I", struct.pack("<f", x))
    return struct.unpack("<f", struct.pack("<I", bits & 0xFFFF0000))[0]


@pytest.mark.parametrize(
    "wrong, words",
    [
        (decimal_significant_digits, "You rounded to DECIMAL digits"),
        (decimal_places, "You rounded to DECIMAL digits"),
        (ties_to_odd, "Ties went to the ODD neighbour"),
        (signed_floor_plus_half, "Ties are rounded away from zero"),
        (unclamped_then_zero_below_smallest, "You kept full precision there"),
        (overflow_from_the_next_power_of_two, "You let values up to 2^16 = 65536 stay finite"),
        (zero_as_literal, "Negative zero lost its sign"),
        (infinity_without_sign, "+-inf must be stored as +-inf"),
        (widths_unpacked_the_wrong_way, "float16 values with bfloat16's layout"),
        (bfloat16_upper_bits, "You truncated"),
    ],
    ids=lambda v: getattr(v, "__name__", ""),
)
def test_class_round_stored_value_wrong_answers_are_named(wrong, words):
    result = check_stored_value(wrong)
    assert result.status == "failed", result.message
    assert words in result.message, result.message
    assert "You returned x unchanged" not in result.message and "bias is wrong" not in result.message


def test_decimal_message_gives_the_binary_value_of_a_tenth():
    result = check_stored_value(decimal_significant_digits)
    assert "0.1 becomes 0.0999755859375" in result.message, result.message


# ------------------------------------------------------------------------------------------------
# 01.2 classify: correct answers in other styles
# ------------------------------------------------------------------------------------------------


def _limits(fmt, extra_mantissa_bits=0):
    e, m = LAYOUTS[fmt]
    m += extra_mantissa_bits
    bias = 2 ** (e - 1) - 1
    normal, sub = 2.0 ** (1 - bias), 2.0 ** (1 - bias - m)
    return normal, sub, (2 - 2.0 ** -(m + 1)) * 2.0**bias


def classify_exponent_field(values, fmt):
    """Rounds with struct / float32 bits, then reads the exponent and fraction fields."""
    kinds = []
    for x in values:
        if fmt == "float16":
            try:
                (h,) = struct.unpack("<H", struct.pack("<e", x))
            except OverflowError:
                kinds.append("inf")
                continue
            field, frac, top = (h >> 10) & 0x1F, h & 0x3FF, 0x1F
        else:
            (b,) = struct.unpack("<I", struct.pack("<f", x))
            if not math.isnan(x):
                b = (b + 0x7FFF + ((b >> 16) & 1)) & 0xFFFF0000
            field, frac, top = (b >> 23) & 0xFF, (b >> 16) & 0x7F, 0xFF
        if field == top:
            kinds.append("nan" if frac else "inf")
        elif field == 0:
            kinds.append("subnormal" if frac else "zero")
        else:
            kinds.append("normal")
    return kinds


def classify_lazy_map(values, fmt):
    """Returns a map object; bisect over the two upper thresholds (both inclusive)."""
    normal, sub, inf_from = _limits(fmt)
    edges = [normal - sub / 2, inf_from]

    def kind(x):
        if x != x:
            return "nan"
        if abs(x) <= sub / 2:
            return "zero"
        return ("subnormal", "normal", "inf")[bisect.bisect_right(edges, abs(x))]

    return map(kind, values)


def classify_torch_masks(values, fmt):
    """torch casts, boolean masks fill a numpy object array."""
    t = torch.tensor(values, dtype=torch.float32).to(getattr(torch, fmt)).float()
    labels = np.full(len(values), "normal", dtype=object)
    labels[(t.abs() < torch.finfo(getattr(torch, fmt)).tiny).numpy()] = "subnormal"
    labels[(t == 0).numpy()] = "zero"
    labels[torch.isinf(t).numpy()] = "inf"
    labels[torch.isnan(t).numpy()] = "nan"
    return labels


def classify_frexp_of_rounded(values, fmt):
    """Rounds in the loop, then compares frexp's exponent of the rounded value with 1 - bias."""
    e, m = LAYOUTS[fmt]
    bias = 2 ** (e - 1) - 1
    kinds = []
    for x in values:
        a = abs(x)
        if math.isnan(x) or math.isinf(a) or a == 0:
            kinds.append("nan" if math.isnan(x) else "inf" if math.isinf(a) else "zero")
            continue
        step = 2.0 ** (max(math.frexp(a)[1] - 1, 1 - bias) - m)
        v = round(a / step) * step
        if v > (2 - 2.0**-m) * 2.0**bias:
            kinds.append("inf")
        else:
            kinds.append("zero" if v == 0 else "subnormal" if math.frexp(v)[1] - 1 < 1 - bias else "normal")
    return kinds


@pytest.mark.parametrize(
    "answer",
    [classify_exponent_field, classify_lazy_map, classify_torch_masks, classify_frexp_of_rounded],
    ids=lambda f: f.__name__,
)
def test_class_round_classify_correct_answers_pass(answer):
    result = check_classify(answer)
    assert result.passed, result.message


# ------------------------------------------------------------------------------------------------
# 01.2 classify: natural wrong answers
# ------------------------------------------------------------------------------------------------


def _thresholds(
    values, fmt, *, normal_strict=False, inf_strict=False, zero_inclusive_tie=False, extra_bits=0
):
    normal, sub, inf_from = _limits(fmt, extra_bits)
    kinds = []
    for x in values:
        a = abs(x)
        if math.isnan(x):
            kinds.append("nan")
        elif (a > inf_from) if inf_strict else (a >= inf_from):
            kinds.append("inf")
        elif (a > normal - sub / 2) if normal_strict else (a >= normal - sub / 2):
            kinds.append("normal")
        elif (a >= sub / 2) if zero_inclusive_tie else (a > sub / 2):
            kinds.append("subnormal")
        else:
            kinds.append("zero")
    return kinds


def normal_boundary_strict(values, fmt):
    """`>` at the normal boundary: the tie between the largest subnormal and the smallest normal goes wrong."""
    return _thresholds(values, fmt, normal_strict=True)


def overflow_tie_strict(values, fmt):
    return _thresholds(values, fmt, inf_strict=True)


def underflow_tie_kept(values, fmt):
    return _thresholds(values, fmt, zero_inclusive_tie=True)


def bfloat16_flushes_subnormals(values, fmt):
    """'bfloat16 has no subnormals' (some hardware flushes them): subnormals only for float16."""
    kinds = _thresholds(values, fmt)
    return kinds if fmt == "float16" else ["zero" if k == "subnormal" else k for k in kinds]


def eps_as_the_smallest_subnormal(values, fmt):
    info = torch.finfo(getattr(torch, fmt))
    return [
        "nan"
        if a != a
        else "inf"
        if a >= info.max * (1 + info.eps / 4)
        else "normal"
        if a >= info.tiny
        else "subnormal"
        if a >= info.eps / 2
        else "zero"
        for a in map(abs, values)
    ]


def inf_only_for_inf_inputs(values, fmt):
    normal, sub, _ = _limits(fmt)
    return [
        "nan"
        if math.isnan(x)
        else "inf"
        if math.isinf(x)
        else "normal"
        if abs(x) >= normal - sub / 2
        else "subnormal"
        if abs(x) > sub / 2
        else "zero"
        for x in values
    ]


def duplicates_dropped(values, fmt):
    return _thresholds(list(dict.fromkeys(values)), fmt)


@pytest.mark.parametrize(
    "wrong, words",
    [
        (normal_boundary_strict, "halfway between the largest subnormal and the smallest normal"),
        (bfloat16_flushes_subnormals, "No subnormals: values below the smallest normal (1.175e-38)"),
        (overflow_tie_strict, "Exactly 65520 is a tie"),
        (underflow_tie_kept, "exactly half is a tie and goes to the even neighbour"),
        (eps_as_the_smallest_subnormal, "No subnormals"),
        (inf_only_for_inf_inputs, "rounds beyond max, so it is stored as inf"),
        (duplicates_dropped, "return exactly one label per value"),
    ],
    ids=lambda v: getattr(v, "__name__", ""),
)
def test_class_round_classify_wrong_answers_are_named(wrong, words):
    result = check_classify(wrong)
    assert result.status == "failed", result.message
    assert words in result.message, result.message
    assert "You used float16's range" not in result.message


def test_the_implicit_bit_in_classify_is_caught_at_the_overflow_tie():
    """One mantissa bit too many moves the overflow and underflow ties; the message names the overflow tie
    (2 of its 4 wrong labels) and says there is more to fix."""
    result = check_classify(lambda values, fmt: _thresholds(values, fmt, extra_bits=1))
    assert result.status == "failed" and "Exactly 65520 is a tie" in result.message, result.message
    assert "fix it, then check again" in result.message
