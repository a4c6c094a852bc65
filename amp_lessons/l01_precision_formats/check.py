"""Lesson 01's checkers: storing a number in FP16/BF16 by hand, and predicting what kind of number it becomes.

Both checkers compare the learner's answers with an oracle — real torch casts of float32 tensors — on probe
values chosen to expose the classic mistakes: ties, values just above ``max``, subnormals, the underflow edge,
NaN, inf and negative zero. Every probe value is a float32 number, so "round once to the format" and "what
torch stores" are the same thing.

To name the mistake, each known wrong answer is written down once, for both formats, as a named rule
(``FormatRule``), most of them models (e.g. "rounds ties away from zero", "flushes subnormals to zero",
"saturates at max"); ``STORED_VALUE_RULES`` and ``CLASSIFY_RULES`` list them in priority order, and
``stored_value_mistakes``/``classify_mistakes`` bind them to one format. Among the values where the learner
disagrees with the oracle, ``best_mistake`` counts how many each rule reproduces, and the checker reports the
one that explains the most of them.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import torch

from amp_lessons.checks.harness import as_number, call_learner, checker, failed, passed, stop
from amp_lessons.checks.mistakes import Mistake, best_mistake, replays, rule
from amp_lessons.l01_precision_formats.formats import BFLOAT16, FLOAT16, KINDS, FloatFormat

FORMATS_CHECKED = (FLOAT16, BFLOAT16)


def _f32(values) -> list[float]:
    """The float32 numbers nearest to ``values`` (as Python floats), so every probe is exactly a float32."""
    return torch.tensor(values, dtype=torch.float64).to(torch.float32).double().tolist()


def probe_values(fmt: FloatFormat) -> list[float]:
    """Probe values for ``fmt``: exact, plain rounding, ties, subnormals, overflow, specials, negatives."""
    m, sub, normal, big = fmt.mantissa_bits, fmt.smallest_subnormal, fmt.smallest_normal, fmt.max
    half_tie = 2.0 ** -(m + 1)  # half the gap between 1 and the next number
    step_at_max = math.ldexp(1.0, fmt.emax - m)
    exact = [1.0, 0.5, 3.0, -2.0, big, normal, sub, 3 * sub, 0.0, -0.0]
    plain = [0.1, -0.1, 1 / 3, math.pi, -math.e, 7.77, 123.456, 1e-3, 1 + 0.7 * 2.0**-m, 1 + 0.3 * 2.0**-m]
    ties = [
        1 + half_tie,
        1 + 3 * half_tie,
        -(1 + 3 * half_tie),
        4 * (1 + 5 * half_tie),
        0.25 * (1 + 7 * half_tie),
        2.0 ** (m + 1) + 1,
        2.0 ** (m + 1) + 3,
        -(2.0 ** (m + 1) + 3),
    ]
    subnormal = [
        0.75 * sub,
        0.5 * sub,
        0.25 * sub,
        1.5 * sub,
        2.5 * sub,
        3.3 * sub,
        100.7 * sub,
        0.5 * normal,
        normal - 0.25 * sub,
        -0.75 * sub,
        -0.25 * sub,
        -3.3 * sub,
    ]
    overflow = [
        big + 0.25 * step_at_max,
        big + 0.45 * step_at_max,
        fmt.overflow_threshold,
        -(big + 0.3 * step_at_max),
        1.5 * big if fmt is FLOAT16 else 3.4e38,
    ]
    if fmt is FLOAT16:
        overflow += [1e5, -1e5, 70000.0, 1e10, 65519.0]
    else:
        overflow += [1e5, -1e5, 3.0e38, 1e38, 1e-6, 1e-39]  # fine in bfloat16's float32-like range
    special = [math.inf, -math.inf, math.nan]
    return _f32(exact + plain + ties + subnormal + overflow + special)


def oracle_values(values: list[float], fmt: FloatFormat) -> list[float]:
    """What torch stores for each float32 value, read back as Python floats."""
    return torch.tensor(values, dtype=torch.float32).to(fmt.dtype).double().tolist()


def same_float(a: float, b: float) -> bool:
    """Equal as stored numbers: NaN matches NaN, and -0.0 does not match 0.0."""
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    return a == b and math.copysign(1.0, a) == math.copysign(1.0, b)


# --------------------------------------------------------------------------------------------------
# 01.1 stored_value(x, fmt) -> float
# --------------------------------------------------------------------------------------------------


def model_round(
    x: float,
    exponent_bits: int,
    mantissa_bits: int,
    *,
    rounding: str = "even",
    subnormals: str = "keep",
    overflow: str = "inf",
    keep_sign: bool = True,
    bias: int | None = None,
    exponent_of: str = "floor",
    emin_shift: int = 0,
    largest: float | None = None,
) -> float:
    """Store ``x`` in a format with the given widths, optionally the way a known wrong answer does it.

    rounding: ``even`` (IEEE), ``away`` (ties away from zero), ``odd`` (ties to the odd neighbour), ``half_down`` (ties towards zero) or
    ``trunc`` (chop the extra bits);
    subnormals: ``keep`` (IEEE), ``flush`` (below the smallest normal -> 0) or ``unbounded`` (never clamp the
    exponent, i.e. full precision all the way down); overflow: ``inf`` (IEEE), ``saturate`` (clamp at max),
    ``before_rounding`` (``|x| > max`` -> inf without rounding first) or ``at_max`` (a value that rounds to
    max itself -> inf); keep_sign=False drops the sign. The layout itself can be wrong too: ``bias``
    (instead of 2^(exponent_bits - 1) - 1), ``largest`` (instead of the format's max), ``emin_shift``
    (subnormals clamped at another exponent) and ``exponent_of``: the exponent of |x| taken as ``floor``
    (IEEE: the leading bit), ``ceil`` (ceil(log2|x|)), ``plus_one`` (frexp's exponent without the -1) or
    ``minus_one``.
    """
    if math.isnan(x):
        return math.nan
    negative = keep_sign and math.copysign(1.0, x) < 0
    magnitude = abs(x)
    bias = 2 ** (exponent_bits - 1) - 1 if bias is None else bias
    emin = 1 - bias + emin_shift
    largest = math.ldexp(2.0 - 2.0**-mantissa_bits, bias) if largest is None else largest
    if math.isinf(magnitude) or (overflow == "before_rounding" and magnitude > largest):
        value = math.inf
    elif magnitude == 0.0:
        value = 0.0
    else:
        exponent = math.frexp(magnitude)[1] - 1
        if exponent_of == "ceil":
            exponent = math.ceil(math.log2(magnitude))
        elif exponent_of in ("plus_one", "minus_one"):
            exponent += 1 if exponent_of == "plus_one" else -1
        if subnormals != "unbounded":
            exponent = max(exponent, emin)
        scaled = math.ldexp(magnitude, mantissa_bits - exponent)
        if rounding == "even":
            q = round(scaled)
        elif rounding == "away":
            q = math.floor(scaled + 0.5)
        elif rounding == "half_down":
            q = math.ceil(scaled - 0.5)
        elif rounding == "odd":
            q = round(scaled)
            if q - scaled in (0.5, -0.5) and q % 2 == 0:
                q += 1 if q < scaled else -1
        else:
            q = math.floor(scaled)
        value = math.ldexp(q, exponent - mantissa_bits)
        if subnormals == "flush" and value < math.ldexp(1.0, emin):
            value = 0.0
        if value > largest or (overflow == "at_max" and value >= largest):
            value = largest if overflow == "saturate" else math.inf
    return -value if negative else value


# --- known wrong answers for 01.1, each written once for both formats ------------------------------


@dataclass(frozen=True)
class FormatRule:
    """A rule written once for both formats: ``bind`` makes the format's :class:`Mistake` from it.

    ``recognise(setting, *facts)`` reads one mismatch, where the setting is the format (01.1) or the
    learner's whole labelling (01.2); ``message`` is a string or ``message(fmt)``, since the numbers a
    message quotes are the format's. A *model* rule's ``recognise`` is a wrong way to store a value,
    ``wrong(fmt, x)``, and the rule recognises a mismatch it reproduces (``replays``). ``only``: the one
    format the rule applies to.
    """

    name: str
    recognise: Callable[..., object]
    message: str | Callable[[FloatFormat], str]
    only: FloatFormat | None = None
    model: bool = False

    def applies_to(self, fmt: FloatFormat) -> bool:
        return self.only is None or self.only is fmt

    def bind(self, fmt: FloatFormat, setting=None) -> Mistake:
        bound = partial(self.recognise, fmt if setting is None else setting)
        text = self.message(fmt) if callable(self.message) else self.message
        return rule(self.name, text)(replays(bound, same_float) if self.model else bound)


def format_rule(name: str, message, only: FloatFormat | None = None):
    """``@rule`` for a predicate of the format (or labelling) and one mismatch."""
    return lambda recognise: FormatRule(name, recognise, message, only)


def format_model(name: str, message, only: FloatFormat | None = None):
    """``@rule`` for a model: decorate ``wrong(fmt, x)``, a known wrong way to store ``x``."""
    return lambda wrong: FormatRule(name, wrong, message, only, model=True)


def _stored_as(fmt: FloatFormat, x: float, **mistake) -> float:
    """``model_round`` with the format's widths and one mistake built in."""
    return model_round(x, fmt.exponent_bits, fmt.mantissa_bits, **mistake)


@format_rule(
    "nan",
    "NaN must stay NaN: a NaN input is stored as NaN (check math.isnan(x) first; "
    "NaN compares False with everything, so it slips through comparisons).",
)
def nan_not_kept(fmt, x, expected, got) -> bool:
    return math.isnan(x) and not math.isnan(got)


@format_rule(
    "inf",
    "+-inf must be stored as +-inf (math.frexp(inf) does not give an exponent; handle inf before rounding).",
)
def inf_not_kept(fmt, x, expected, got) -> bool:
    return math.isinf(x) and not same_float(got, x)


def _unchanged_message(fmt):
    return (
        f"You returned x unchanged: {fmt.name} keeps only {fmt.mantissa_bits} mantissa bits, "
        "so most values must be rounded."
    )


@format_rule("unchanged", _unchanged_message)
def returned_unchanged(fmt, x, expected, got) -> bool:
    return same_float(got, x)


@format_rule(
    "negative zero",
    "Negative zero lost its sign: -0.0 (and a negative value that underflows) must come back as -0.0. "
    "Use math.copysign(result, x) at the end.",
)
def negative_zero_lost(fmt, x, expected, got) -> bool:
    return expected == 0 and math.copysign(1, expected) < 0 and got == 0 and math.copysign(1, got) > 0


@format_model(
    "sign",
    "The sign is lost: negative inputs came back positive. "
    "Round |x|, then put the sign back with math.copysign(result, x).",
)
def sign_dropped(fmt, x):
    return _stored_as(fmt, x, keep_sign=False)


def _truncation_message(fmt):
    m = fmt.mantissa_bits
    return (
        "You truncated (chopped off) the extra mantissa bits. Storing a number rounds it to the NEAREST "
        f"{fmt.name} value, so e.g. 1 + 0.7*2^-{m} becomes 1 + 2^-{m}, not 1."
    )


@format_model("truncation", _truncation_message)
def truncated(fmt, x):
    return _stored_as(fmt, x, rounding="trunc")


def _ties_away_message(fmt):
    m = fmt.mantissa_bits
    return (
        f"Ties are rounded away from zero, but IEEE rounds ties to EVEN: 1 + 2^-{m + 1} lies "
        f"exactly halfway between 1 and 1 + 2^-{m} and is stored as 1 (last mantissa bit 0). "
        "Python's round() does ties-to-even; math.floor(q + 0.5) does not."
    )


@format_rule("ties away", _ties_away_message)
def ties_away_from_zero(fmt, x, expected, got) -> bool:
    """Ties away from zero; or math.floor(x / step + 0.5) on the signed x, which sends negative ties towards
    zero (half down on the magnitude)."""
    away = same_float(got, _stored_as(fmt, x, rounding="away"))
    return away or (x < 0 and same_float(got, _stored_as(fmt, x, rounding="half_down")))


def _flush_message(fmt):
    return (
        "No subnormals: you flushed values below the smallest normal "
        f"({fmt.smallest_normal:.4g} = 2^{fmt.emin}) to zero. {fmt.name} keeps subnormals "
        f"down to {fmt.smallest_subnormal:.4g} = 2^{fmt.emin - fmt.mantissa_bits}: "
        f"clamp the exponent at {fmt.emin} and keep the (fewer) bits that remain."
    )


@format_model("flush", _flush_message)
def flushed_subnormals(fmt, x):
    return _stored_as(fmt, x, subnormals="flush")


def _subnormal_precision_message(fmt):
    return (
        f"Below the smallest normal ({fmt.smallest_normal:.4g} = 2^{fmt.emin}) the spacing stays "
        f"2^{fmt.emin - fmt.mantissa_bits}: subnormals have FEWER significant bits and tiny values "
        f"underflow to 0. You kept full precision there; use exponent = max(exponent, {fmt.emin})."
    )


@format_rule("subnormal precision", _subnormal_precision_message)
def full_precision_subnormals(fmt, x, expected, got) -> bool:
    """Rounded with the unclamped exponent; also when what then lies below the smallest subnormal was
    flushed to zero (the same mistake, with a patch on it)."""
    full = _stored_as(fmt, x, subnormals="unbounded")
    return same_float(got, full) or (got == 0 and 0 < abs(full) < fmt.smallest_subnormal)


def _ties_to_odd_message(fmt):
    m = fmt.mantissa_bits
    return (
        f"Ties went to the ODD neighbour: IEEE rounds ties to EVEN (last mantissa bit 0). 1 + 2^-{m + 1} lies "
        f"exactly halfway between 1 and 1 + 2^-{m} and is stored as 1. Check your tie test: round q up "
        "when the part below is more than half, or exactly half and q is odd (Python's round() does this)."
    )


@format_model("ties to odd", _ties_to_odd_message)
def ties_to_odd(fmt, x):
    return _stored_as(fmt, x, rounding="odd")


def _saturate_message(fmt):
    return f"You saturated at max ({fmt.max:.6g}), but a value that rounds beyond max overflows to inf."


@format_model("saturate", _saturate_message)
def saturated_at_max(fmt, x):
    return _stored_as(fmt, x, overflow="saturate")


def _overflow_before_rounding_message(fmt):
    return (
        f"You sent every |x| > max ({fmt.max:.6g}) to inf before rounding. "
        f"Values between max and {fmt.overflow_threshold:.6g} (max + half a step) round DOWN to max; "
        f"only |x| >= {fmt.overflow_threshold:.6g} overflows. Round first, then check for overflow."
    )


@format_model("overflow before rounding", _overflow_before_rounding_message)
def overflowed_before_rounding(fmt, x):
    return _stored_as(fmt, x, overflow="before_rounding")


# Mistakes in the layout arithmetic: the maximum, the exponent of |x|, the subnormal exponent, the bias.
# Each one changes the grid or the range by a factor of two, so without its own rule it would look like
# "one mantissa bit too many or too few"; with one, the message names the line that is wrong.


def _power_above_max(fmt) -> float:
    return 2.0 ** (fmt.bias + 1)


def _max_at_power_above_message(fmt):
    return (
        f"You let values up to 2^{fmt.bias + 1} = {_power_above_max(fmt):g} stay finite, but {fmt.name}'s "
        f"largest finite number is {fmt.max:.6g} = (2 - 2^-{fmt.mantissa_bits}) * 2^{fmt.bias}: "
        f"the largest mantissa is all ones, not 2.0. A value that rounds beyond {fmt.max:.6g} "
        f"(every |x| >= {fmt.overflow_threshold:.6g}) overflows to inf."
    )


@format_model("max at the next power of two", _max_at_power_above_message)
def max_at_the_power_above(fmt, x):
    return _stored_as(fmt, x, largest=_power_above_max(fmt))


def _no_overflow_message(fmt):
    return (
        f"Nothing ever overflows in your answer: values beyond max come back finite, but {fmt.name} "
        f"cannot hold them. After rounding, a magnitude above max ({fmt.max:.6g}) is stored as inf: "
        "`if magnitude > largest: magnitude = math.inf`."
    )


@format_model("no overflow", _no_overflow_message)
def never_overflows(fmt, x):
    return _stored_as(fmt, x, largest=math.inf)


def _max_overflows_message(fmt):
    return (
        f"You sent values that round to exactly max ({fmt.max:.6g}) to inf, but max itself is finite: "
        "only a value that rounds *beyond* max overflows. Compare with `>`, not `>=`."
    )


@format_model("max itself overflows", _max_overflows_message)
def max_itself_overflows(fmt, x):
    return _stored_as(fmt, x, overflow="at_max")


def _exponent_too_high_message(fmt):
    return (
        f"Your exponent of |x| is one too high, so you rounded to a grid twice as coarse as {fmt.name}'s "
        "(and overflow and subnormals start one power of two off). The exponent is the position of the "
        "leading bit, `math.frexp(abs(x))[1] - 1` (frexp's mantissa lies in [0.5, 1), hence the -1) or "
        "floor(log2|x|); ceil(log2|x|) is one too high for every value that is not a power of two."
    )


@format_model("exponent one too high", _exponent_too_high_message)
def exponent_one_too_high(fmt, x):
    return _stored_as(fmt, x, exponent_of="plus_one")


def _exponent_too_low_message(fmt):
    return (
        "Your exponent of |x| is one too low, so you rounded to a grid twice as fine "
        f"as {fmt.name}'s (one bit more than its {fmt.mantissa_bits} fraction bits). "
        "The exponent is the position of the leading bit: `math.frexp(abs(x))[1] - 1`, or floor(log2|x|)."
    )


@format_model("exponent one too low", _exponent_too_low_message)
def exponent_one_too_low(fmt, x):
    return _stored_as(fmt, x, exponent_of="minus_one")


def _subnormal_exponent_message(fmt):
    return (
        f"Subnormals share the smallest normal's exponent, 1 - bias = {fmt.emin}: "
        f"the exponent field 0 means 2^{fmt.emin} with a leading 0, "
        f"so the subnormal spacing is 2^{fmt.emin - fmt.mantissa_bits}. "
        f"Clamp the exponent with max(exponent, {fmt.emin}), not one power of two off."
    )


@format_rule("subnormal exponent", _subnormal_exponent_message)
def subnormal_exponent_off_by_one(fmt, x, expected, got) -> bool:
    return any(same_float(got, _stored_as(fmt, x, emin_shift=d)) for d in (-1, 1))


def _bias_message(fmt):
    e, m, bias = fmt.exponent_bits, fmt.mantissa_bits, fmt.bias
    return (
        f"Your exponent bias is wrong: {fmt.name} has {e} exponent bits, so bias = 2^({e} - 1) - 1 = "
        f"{bias}. The bias sets the range: the smallest normal is 2^(1 - bias) = 2^{fmt.emin} and the "
        f"largest value (2 - 2^-{m}) * 2^bias = {fmt.max:.6g}; another bias moves both."
    )


@format_rule("bias", _bias_message)
def other_bias(fmt, x, expected, got) -> bool:
    e, bias = fmt.exponent_bits, fmt.bias
    wrong_biases = sorted({bias - 1, bias + 1, 2**e - 1, 2**e} - {bias})
    return any(same_float(got, _stored_as(fmt, x, bias=b)) for b in wrong_biases)


# The other format's widths, in whole or in part.


@format_model(
    "float16 for bfloat16",
    "You stored bfloat16 values as float16 (5 exponent bits, 10 mantissa bits). "
    "bfloat16 has 8 exponent bits and 7 mantissa bits.",
    only=BFLOAT16,
)
def float16_for_bfloat16(fmt, x):
    return model_round(x, 5, 10)


@format_model(
    "mantissa bits",
    "Wrong number of mantissa bits: you kept float16's 10 for bfloat16, which has only 7.",
    only=BFLOAT16,
)
def float16_mantissa_for_bfloat16(fmt, x):
    return model_round(x, fmt.exponent_bits, 10)


@format_model(
    "exponent bits",
    "Wrong exponent range: bfloat16 has float32's 8 exponent bits (max 3.39e38, smallest normal 1.18e-38); "
    "you used float16's 5 (max 65504).",
    only=BFLOAT16,
)
def float16_exponent_for_bfloat16(fmt, x):
    return model_round(x, 5, fmt.mantissa_bits)


@format_model(
    "bfloat16 for float16",
    "You stored float16 values with bfloat16's layout (8 exponent, 7 mantissa bits). "
    "float16 has 5 exponent bits and 10 mantissa bits.",
    only=FLOAT16,
)
def bfloat16_for_float16(fmt, x):
    return model_round(x, 8, 7)


def _mantissa_off_by_one_message(fmt):
    m = fmt.mantissa_bits
    return (
        f"Off by one in the mantissa: {fmt.name} stores {m} fraction bits after an implicit leading 1 "
        f"({m + 1} significant bits), so the spacing above 1 is 2^-{m}."
    )


@format_rule("mantissa off by one", _mantissa_off_by_one_message)
def mantissa_off_by_one(fmt, x, expected, got) -> bool:
    return any(same_float(got, model_round(x, fmt.exponent_bits, fmt.mantissa_bits + d)) for d in (-1, 1))


def _decimal_message(fmt):
    tenth = _stored_as(fmt, 0.1)
    return (
        f"You rounded to DECIMAL digits, but {fmt.name} keeps {fmt.mantissa_bits} BINARY digits after the "
        f"leading 1: a stored value is a whole number of steps 2^(exponent - {fmt.mantissa_bits}), "
        f"so 0.1 becomes {tenth!r}, not 0.1. Round abs(x) / step, not round(x, digits) or a '%g' format."
    )


@format_rule("decimal digits", _decimal_message)
def rounded_to_decimal_digits(fmt, x, expected, got) -> bool:
    if not math.isfinite(x) or got == 0 or same_float(got, x):
        return False
    return any(same_float(got, float(f"{x:.{d}g}")) or same_float(got, round(x, d)) for d in range(1, 13))


# 01.1's table, most specific first: the first rule wins a tie in how many mismatches it explains.
STORED_VALUE_RULES = (
    nan_not_kept,
    inf_not_kept,
    returned_unchanged,
    negative_zero_lost,
    sign_dropped,
    truncated,
    ties_away_from_zero,
    ties_to_odd,
    flushed_subnormals,
    full_precision_subnormals,
    saturated_at_max,
    overflowed_before_rounding,
    max_at_the_power_above,
    never_overflows,
    max_itself_overflows,
    exponent_one_too_high,
    exponent_one_too_low,
    subnormal_exponent_off_by_one,
    other_bias,
    float16_for_bfloat16,
    float16_mantissa_for_bfloat16,
    float16_exponent_for_bfloat16,
    bfloat16_for_float16,
    mantissa_off_by_one,
    rounded_to_decimal_digits,
)


def stored_value_mistakes(fmt: FloatFormat) -> tuple[Mistake, ...]:
    """Every known wrong answer for ``fmt``, in priority order (the first wins a tie in how many it explains).

    Each rule reads one mismatch ``(x, expected, got)``: the probe value, what torch stores, the learner's
    value. Most rules are *models*: ``model_round`` with one mistake built in, replayed on ``x``.
    """
    return tuple(known.bind(fmt) for known in STORED_VALUE_RULES if known.applies_to(fmt))


def _to_float(got, call: str) -> float:
    """The learner's return value as a float, or stop the check with what was wrong with it."""
    return as_number(got, f"{call} returned", "return the stored value as a Python float")


def _name_mismatches(mismatches: list, rules, what_differs: str, show):
    """The failed result naming the known mistake that explains the most mismatches (``best_mistake``)."""
    rule, count = best_mistake(rules, mismatches)
    details = [show(*item) for item in mismatches[:6]]
    if rule is None:
        return failed(
            f"{len(mismatches)} {what_differs}. None of the usual mistakes explains them; compare your "
            "steps with the lesson (exponent, rounding to nearest even, subnormals, overflow, sign).",
            details,
        )
    example = next(item for item in mismatches if rule.matches(*item))
    extra = ""
    if count < len(mismatches):
        extra = f" (That explains {count} of the {len(mismatches)} wrong answers; fix it, then check again.)"
    return failed(f"{rule.text(*example)} Example: {show(*example)}.{extra}", details)


@checker("01.1 stored_value")
def check_stored_value(stored_value):
    """``stored_value(x, fmt)``: the float that ``fmt`` ('float16' or 'bfloat16') stores for ``x``."""
    got = call_learner(stored_value, 1.0, "float16")
    first = _to_float(got, "stored_value(1.0, 'float16')")
    if first != 1.0:
        stop(
            f"stored_value(1.0, 'float16') returned {first!r}; "
            "1.0 is exactly representable, so it is stored as 1.0."
        )
    total = 0
    for fmt in FORMATS_CHECKED:
        values = probe_values(fmt)
        expected = oracle_values(values, fmt)
        mismatches = []
        for x, want in zip(values, expected):
            call = f"stored_value({x!r}, {fmt.name!r})"
            got = _to_float(call_learner(stored_value, x, fmt.name, what=f"`{call}`"), call)
            if not same_float(got, want):
                mismatches.append((x, want, got))
        total += len(values)
        if mismatches:

            def show(x, want, got, fmt=fmt):
                return f"stored_value({x!r}, {fmt.name!r}) should be {want!r}, yours gave {got!r}"

            what_differs = f"of {len(values)} {fmt.name} values differ from what torch stores"
            return _name_mismatches(mismatches, stored_value_mistakes(fmt), what_differs, show)
    return passed(
        f"All {total} values match torch's float16 and bfloat16 casts bit for bit: "
        "rounding to nearest even, subnormals, overflow to inf, NaN and -0.0."
    )


# --------------------------------------------------------------------------------------------------
# 01.2 classify(values, fmt) -> list[str]
# --------------------------------------------------------------------------------------------------


def kind_of_stored(value: float, fmt: FloatFormat) -> str:
    """The kind of an already-stored value: zero, subnormal, normal, inf or nan."""
    if math.isnan(value):
        return "nan"
    if math.isinf(value):
        return "inf"
    if value == 0:
        return "zero"
    return "subnormal" if abs(value) < fmt.smallest_normal else "normal"


def classify_values(fmt: FloatFormat) -> list[float]:
    """Values around every boundary of ``fmt``, each negative one with its positive twin in the list."""
    sub, normal, big = fmt.smallest_subnormal, fmt.smallest_normal, fmt.max
    step_at_max = math.ldexp(1.0, fmt.emax - fmt.mantissa_bits)
    positive = [
        1.0,
        0.1,
        1000.0,
        big,
        big + 0.25 * step_at_max,
        big + 0.45 * step_at_max,
        fmt.overflow_threshold,
        1.5 * big if fmt is FLOAT16 else 3.4e38,
        normal,
        normal - 0.5 * sub,  # the tie between the largest subnormal and the smallest normal: normal
        normal - sub,
        0.5 * normal,
        3.3 * sub,
        sub,
        0.75 * sub,
        0.5 * sub,
        0.25 * sub,
        0.0,
        math.inf,
        1e5,
        1e-6,
        1e-20,
        1e-39,
    ]
    negative = [-v for v in positive if v not in (0.0, math.inf, 1000.0, 1e-20)]
    return _f32(positive + negative + [-0.0, -math.inf, math.nan])


# --- known wrong labellings for 01.2, each written once for both formats ----------------------------


@dataclass(frozen=True)
class Labelling:
    """What a 01.2 rule reads besides the mismatch: the format, and all of the learner's labels by value."""

    fmt: FloatFormat
    values: list[float]
    labels: list[str]

    def label_of(self, value: float) -> str | None:
        """The learner's label for ``value`` (its first occurrence), or None when it was not asked."""
        for v, label in zip(self.values, self.labels):
            if v == value:
                return label
        return None


@format_rule(
    "nan",
    "A NaN input stays NaN after the cast: its kind is 'nan'. Test math.isnan(x) first: "
    "NaN compares False with every threshold, so it falls through to whatever your last branch returns.",
)
def nan_not_labelled_nan(answers, x, expected, got) -> bool:
    return math.isnan(x) and got != "nan"


@format_rule("inf input", "+-inf is stored as +-inf: its kind is 'inf'.")
def inf_not_labelled_inf(answers, x, expected, got) -> bool:
    return math.isinf(x) and got != "inf"


@format_rule("zero input", "0.0 and -0.0 are stored as zero: kind 'zero'.")
def zero_not_labelled_zero(answers, x, expected, got) -> bool:
    return x == 0 and got != "zero"


@format_rule(
    "negative values",
    "Your labels for negative values are wrong although you got their magnitudes right: "
    "the kind depends on |x|, so compare abs(x) with the thresholds.",
)
def positive_twin_right(answers, x, expected, got) -> bool:
    return x < 0 and answers.label_of(-x) == expected


@format_rule(
    "float16 range for bfloat16",
    "You used float16's range for bfloat16. bfloat16 has float32's 8 exponent bits: normal from 1.18e-38 up "
    "to 3.39e38, subnormal down to 9.2e-41 (e.g. 1e5 and 1e-6 are ordinary normal numbers in bfloat16).",
    only=BFLOAT16,
)
def float16_range_for_bfloat16(answers, x, expected, got) -> bool:
    return got == _float16_kind(x) and _float16_beyond_flushing(answers)


def _float16_kind(x: float) -> str:
    return kind_of_stored(model_round(x, 5, 10), FLOAT16)


def _float16_beyond_flushing(answers: Labelling) -> bool:
    """Some label follows float16's range where flushing bfloat16's subnormals would not explain it (1e5 as
    'inf', 1e-6 as 'subnormal', ...): a bfloat16 answer that only flushes its subnormals is a 'flush'."""
    return any(
        label == _float16_kind(v) != "zero" and label != kind_of_stored(model_round(v, 8, 7), BFLOAT16)
        for v, label in zip(answers.values, answers.labels)
    )


def _overflow_too_early_message(fmt):
    return (
        f"Values just above max round DOWN to max ({fmt.max:.6g}): "
        f"only |x| >= {fmt.overflow_threshold:.6g} (max + half a step) becomes inf. "
        "Compare with that threshold, or round first and classify the rounded value."
    )


@format_rule("overflow before rounding", _overflow_too_early_message)
def overflow_too_early(answers, x, expected, got) -> bool:
    return expected == "normal" and got == "inf" and abs(x) > answers.fmt.max


def _overflow_missed_message(fmt):
    threshold = fmt.overflow_threshold
    return (
        f"|x| >= {threshold:.6g} rounds beyond max, so it is stored as inf. "
        f"Exactly {threshold:.6g} is a tie between max and the next power of two; "
        "the tie goes to the even one, which is beyond the range: inf."
    )


@format_rule("overflow missed", _overflow_missed_message)
def overflow_missed(answers, x, expected, got) -> bool:
    return expected == "inf" and got != "inf" and math.isfinite(x)


def _underflow_too_early_message(fmt):
    sub = fmt.smallest_subnormal
    return (
        f"Values between half the smallest subnormal ({sub / 2:.4g}) and the smallest subnormal ({sub:.4g}) "
        f"round UP to {sub:.4g}: they are 'subnormal', not 'zero'. Only |x| <= {sub / 2:.4g} rounds to zero."
    )


@format_rule("underflow too early", _underflow_too_early_message)
def underflow_too_early(answers, x, expected, got) -> bool:
    return expected == "subnormal" and got == "zero" and abs(x) < answers.fmt.smallest_subnormal


def _flush_labels_message(fmt):
    return (
        f"No subnormals: values below the smallest normal ({fmt.smallest_normal:.4g}) are not zero. "
        f"Down to the smallest subnormal ({fmt.smallest_subnormal:.4g} = 2^{fmt.emin - fmt.mantissa_bits}) "
        "they are stored as subnormals."
    )


@format_rule("flush", _flush_labels_message)
def subnormals_labelled_zero(answers, x, expected, got) -> bool:
    return expected == "subnormal" and got == "zero"


def _underflow_missed_message(fmt):
    return (
        f"|x| <= {fmt.smallest_subnormal / 2:.4g} (half the smallest subnormal) rounds to zero; "
        "exactly half is a tie and goes to the even neighbour, which is 0."
    )


@format_rule("underflow missed", _underflow_missed_message)
def underflow_missed(answers, x, expected, got) -> bool:
    return expected == "zero" and got != "zero" and x != 0


def _normal_boundary_message(fmt):
    normal, sub = fmt.smallest_normal, fmt.smallest_subnormal
    return (
        f"Values just below the smallest normal ({normal:.4g}) round UP to it: "
        f"|x| >= {normal - sub / 2:.6g} (halfway between the largest subnormal and the smallest normal) "
        "is stored as a normal number."
    )


@format_rule("normal boundary", _normal_boundary_message)
def normal_boundary_missed(answers, x, expected, got) -> bool:
    return expected == "normal" and got == "subnormal" and abs(x) < answers.fmt.smallest_normal


def _subnormal_missed_message(fmt):
    return (
        f"|x| below the smallest normal ({fmt.smallest_normal:.4g} = 2^{fmt.emin}) is stored as a "
        "subnormal (exponent field 0)."
    )


@format_rule("subnormal missed", _subnormal_missed_message)
def subnormal_labelled_normal(answers, x, expected, got) -> bool:
    return expected == "subnormal" and got == "normal"


# 01.2's table, most specific first: the first rule wins a tie in how many mismatches it explains.
CLASSIFY_RULES = (
    nan_not_labelled_nan,
    inf_not_labelled_inf,
    zero_not_labelled_zero,
    positive_twin_right,
    float16_range_for_bfloat16,
    overflow_too_early,
    overflow_missed,
    underflow_too_early,
    subnormals_labelled_zero,
    underflow_missed,
    normal_boundary_missed,
    subnormal_labelled_normal,
)


def classify_mistakes(fmt: FloatFormat, values: list[float], labels: list[str]) -> tuple[Mistake, ...]:
    """Every known wrong labelling, in priority order; each rule reads one mismatch ``(x, expected, got)``.

    ``values`` and ``labels`` (all of the learner's answers) let a rule compare a value with its positive
    twin.
    """
    answers = Labelling(fmt, list(values), list(labels))
    return tuple(known.bind(fmt, answers) for known in CLASSIFY_RULES if known.applies_to(fmt))


def _labels(got, n: int, call: str) -> list[str]:
    if isinstance(got, (str, bytes)) or got is None or isinstance(got, (numbers.Number, dict, set)):
        stop(f"{call} returned {type(got).__name__} {got!r}; return a list with one label per value.")
    try:
        labels = list(got)
    except TypeError:
        stop(f"{call} returned a {type(got).__name__}; return a list with one label per value.")
    if len(labels) != n:
        stop(
            f"{call} returned {len(labels)} labels for {n} values; "
            "return exactly one label per value, in order."
        )
    for i, label in enumerate(labels):
        if not isinstance(label, str):
            stop(
                f"{call}: label {i} is a {type(label).__name__} ({label!r}); "
                f"use one of the strings {', '.join(KINDS)}."
            )
        if label not in KINDS:
            cleaned = label.strip().lower()
            if cleaned in KINDS:
                stop(f"{call}: label {i} is {label!r}; write the labels exactly, lower case: {cleaned!r}.")
            if cleaned in ("denormal", "denormalized", "denorm"):
                stop(f"{call}: label {i} is {label!r}; the course calls these 'subnormal'.")
            stop(f"{call}: label {i} is {label!r}, which is not one of {', '.join(repr(k) for k in KINDS)}.")
    return labels


@checker("01.2 classify")
def check_classify(classify):
    """``classify(values, fmt)`` must return, for each value, the kind of number it becomes in ``fmt``."""
    got = call_learner(classify, [1.0], "float16")
    _labels(got, 1, "classify([1.0], 'float16')")
    total = 0
    for fmt in FORMATS_CHECKED:
        values = classify_values(fmt)
        expected = [kind_of_stored(v, fmt) for v in oracle_values(values, fmt)]
        call = f"classify(values, {fmt.name!r})"
        labels = _labels(call_learner(classify, list(values), fmt.name, what=f"`{call}`"), len(values), call)
        mismatches = [(x, want, label) for x, want, label in zip(values, expected, labels) if label != want]
        total += len(values)
        if mismatches:

            def show(x, want, label, fmt=fmt):
                return f"{x!r} in {fmt.name} is {want!r}, yours said {label!r}"

            return _name_mismatches(
                mismatches,
                classify_mistakes(fmt, values, labels),
                f"of {len(values)} {fmt.name} labels are wrong",
                show,
            )
    return passed(
        f"All {total} labels match what torch's float16 and bfloat16 casts produce, including the edges: "
        "just above max, the overflow tie, the underflow tie and the normal/subnormal boundary."
    )
