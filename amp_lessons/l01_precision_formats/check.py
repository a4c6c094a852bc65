"""Lesson 01's checkers: storing a number in FP16/BF16 by hand, and predicting what kind of number it becomes.

Both checkers compare the learner's answers with an oracle — real torch casts of float32 tensors — on probe
values chosen to expose the classic mistakes: ties, values just above ``max``, subnormals, the underflow edge,
NaN, inf and negative zero. Every probe value is a float32 number, so "round once to the format" and "what
torch stores" are the same thing.

To name the mistake, each known wrong answer is written down as a rule (``Mistake``), most of them models
(e.g. "rounds ties away from zero", "flushes subnormals to zero", "saturates at max"). Among the values where
the learner disagrees with the oracle, ``best_mistake`` counts how many each rule reproduces, and the checker
reports the one that explains the most of them.
"""

from __future__ import annotations

import math
import numbers

import torch

from amp_lessons.checks.harness import as_number, call_learner, checker, failed, passed, stop
from amp_lessons.checks.mistakes import Mistake, best_mistake
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

    rounding: ``even`` (IEEE), ``away`` (ties away from zero) or ``trunc`` (chop the extra bits);
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
        else:
            q = math.floor(scaled)
        value = math.ldexp(q, exponent - mantissa_bits)
        if subnormals == "flush" and value < math.ldexp(1.0, emin):
            value = 0.0
        if value > largest or (overflow == "at_max" and value >= largest):
            value = largest if overflow == "saturate" else math.inf
    return -value if negative else value


def stored_value_mistakes(fmt: FloatFormat) -> tuple[Mistake, ...]:
    """Every known wrong answer for ``fmt``, in priority order (the first wins a tie in how many it explains).

    Each rule reads one mismatch ``(x, expected, got)``: the probe value, what torch stores, the learner's
    value. Most rules are *models*: ``model_round`` with one mistake built in, replayed on ``x``.
    """
    e, m = fmt.exponent_bits, fmt.mantissa_bits
    name = fmt.name

    def model(**kwargs):
        widths = (kwargs.pop("e", e), kwargs.pop("m", m))
        return lambda x, expected, got: same_float(got, model_round(x, *widths, **kwargs))

    sub, normal = fmt.smallest_subnormal, fmt.smallest_normal
    mistakes = [
        Mistake(
            "nan",
            lambda x, expected, got: math.isnan(x) and not math.isnan(got),
            "NaN must stay NaN: a NaN input is stored as NaN (check math.isnan(x) first; NaN compares "
            "False with everything, so it slips through comparisons).",
        ),
        Mistake(
            "inf",
            lambda x, expected, got: math.isinf(x) and not same_float(got, x),
            "+-inf must be stored as +-inf (math.frexp(inf) does not give an exponent; handle inf before "
            "rounding).",
        ),
        Mistake(
            "unchanged",
            lambda x, expected, got: same_float(got, x),
            f"You returned x unchanged: {name} keeps only {m} mantissa bits, so most values must be rounded.",
        ),
        Mistake(
            "negative zero",
            lambda x, expected, got: (
                expected == 0 and math.copysign(1, expected) < 0 and got == 0 and math.copysign(1, got) > 0
            ),
            "Negative zero lost its sign: -0.0 (and a negative value that underflows) must come back as "
            "-0.0. Use math.copysign(result, x) at the end.",
        ),
        Mistake(
            "sign",
            model(keep_sign=False),
            "The sign is lost: negative inputs came back positive. Round |x|, then put the sign back "
            "with math.copysign(result, x).",
        ),
        Mistake(
            "truncation",
            model(rounding="trunc"),
            "You truncated (chopped off) the extra mantissa bits. Storing a number rounds it to the "
            f"NEAREST {name} value, so e.g. 1 + 0.7*2^-{m} becomes 1 + 2^-{m}, not 1.",
        ),
        Mistake(
            "ties away",
            model(rounding="away"),
            f"Ties are rounded away from zero, but IEEE rounds ties to EVEN: 1 + 2^-{m + 1} lies exactly "
            f"halfway between 1 and 1 + 2^-{m} and is stored as 1 (last mantissa bit 0). Python's "
            "round() does ties-to-even; math.floor(q + 0.5) does not.",
        ),
        Mistake(
            "flush",
            model(subnormals="flush"),
            f"No subnormals: you flushed values below the smallest normal ({normal:.4g} = 2^{fmt.emin}) "
            f"to zero. {name} keeps subnormals down to {sub:.4g} = 2^{fmt.emin - m}: clamp the exponent "
            f"at {fmt.emin} and keep the (fewer) bits that remain.",
        ),
        Mistake(
            "subnormal precision",
            model(subnormals="unbounded"),
            f"Below the smallest normal ({normal:.4g} = 2^{fmt.emin}) the spacing stays "
            f"2^{fmt.emin - m}: subnormals have FEWER significant bits and tiny values underflow to 0. "
            f"You kept full precision there; use exponent = max(exponent, {fmt.emin}).",
        ),
        Mistake(
            "saturate",
            model(overflow="saturate"),
            f"You saturated at max ({fmt.max:.6g}), but a value that rounds beyond max overflows to inf.",
        ),
        Mistake(
            "overflow before rounding",
            model(overflow="before_rounding"),
            f"You sent every |x| > max ({fmt.max:.6g}) to inf before rounding. Values between max and "
            f"{fmt.overflow_threshold:.6g} (max + half a step) round DOWN to max; only |x| >= "
            f"{fmt.overflow_threshold:.6g} overflows. Round first, then check for overflow.",
        ),
    ]
    mistakes += _layout_mistakes(fmt, model)
    if fmt is BFLOAT16:
        mistakes += [
            Mistake(
                "float16 for bfloat16",
                model(e=5, m=10),
                "You stored bfloat16 values as float16 (5 exponent bits, 10 mantissa bits). bfloat16 has "
                "8 exponent bits and 7 mantissa bits.",
            ),
            Mistake(
                "mantissa bits",
                model(m=10),
                "Wrong number of mantissa bits: you kept float16's 10 for bfloat16, which has only 7.",
            ),
            Mistake(
                "exponent bits",
                model(e=5),
                "Wrong exponent range: bfloat16 has float32's 8 exponent bits (max 3.39e38, smallest "
                "normal 1.18e-38); you used float16's 5 (max 65504).",
            ),
        ]
    else:
        mistakes += [
            Mistake(
                "bfloat16 for float16",
                model(e=8, m=7),
                "You stored float16 values with bfloat16's layout (8 exponent, 7 mantissa bits). float16 "
                "has 5 exponent bits and 10 mantissa bits.",
            ),
        ]
    mistakes += [
        Mistake(
            "mantissa off by one",
            lambda x, expected, got: any(same_float(got, model_round(x, e, m + d)) for d in (-1, 1)),
            f"Off by one in the mantissa: {name} stores {m} fraction bits after an implicit leading 1 "
            f"({m + 1} significant bits), so the spacing above 1 is 2^-{m}.",
        ),
    ]
    return tuple(mistakes)


def _layout_mistakes(fmt: FloatFormat, model) -> list[Mistake]:
    """Mistakes in the layout arithmetic: the exponent of |x|, the bias, the subnormal exponent, the maximum.

    Each one changes the grid or the range by a factor of two, so without its own rule it would look like
    "one mantissa bit too many or too few"; with one, the message names the line that is wrong.
    """
    e, m, bias, name = fmt.exponent_bits, fmt.mantissa_bits, fmt.bias, fmt.name
    wrong_biases = sorted({bias - 1, bias + 1, 2**e - 1, 2**e} - {bias})
    power_above = 2.0 ** (bias + 1)

    def other_bias(x, expected, got):
        return any(same_float(got, model_round(x, e, m, bias=b)) for b in wrong_biases)

    return [
        Mistake(
            "max at the next power of two",
            model(largest=power_above),
            (
                f"You let values up to 2^{bias + 1} = {power_above:g} stay finite, but {name}'s largest "
                f"finite number is {fmt.max:.6g} = (2 - 2^-{m}) * 2^{bias}: the largest mantissa is all ones, "
                f"not 2.0. A value that rounds beyond {fmt.max:.6g} (every |x| >= "
                f"{fmt.overflow_threshold:.6g}) overflows to inf."
            ),
        ),
        Mistake(
            "no overflow",
            model(largest=math.inf),
            (
                f"Nothing ever overflows in your answer: values beyond max come back finite, but {name} "
                f"cannot hold them. After rounding, a magnitude above max ({fmt.max:.6g}) is stored as inf: "
                "`if magnitude > largest: magnitude = math.inf`."
            ),
        ),
        Mistake(
            "max itself overflows",
            model(overflow="at_max"),
            (
                f"You sent values that round to exactly max ({fmt.max:.6g}) to inf, but max itself is "
                "finite: only a value that rounds *beyond* max overflows. Compare with `>`, not `>=`."
            ),
        ),
        Mistake(
            "exponent one too high",
            model(exponent_of="plus_one"),
            (
                f"Your exponent of |x| is one too high, so you rounded to a grid twice as coarse as {name}'s "
                "(and overflow and subnormals start one power of two off). The exponent is the position of "
                "the leading bit, `math.frexp(abs(x))[1] - 1` (frexp's mantissa lies in [0.5, 1), hence the "
                "-1) or floor(log2|x|); ceil(log2|x|) is one too high for every value that is not a power of "
                "two."
            ),
        ),
        Mistake(
            "exponent one too low",
            model(exponent_of="minus_one"),
            (
                f"Your exponent of |x| is one too low, so you rounded to a grid twice as fine as {name}'s "
                f"(one bit more than its {m} fraction bits). The exponent is the position of the leading "
                "bit: `math.frexp(abs(x))[1] - 1`, or floor(log2|x|)."
            ),
        ),
        Mistake(
            "subnormal exponent",
            lambda x, expected, got: any(
                same_float(got, model_round(x, e, m, emin_shift=d)) for d in (-1, 1)
            ),
            (
                f"Subnormals share the smallest normal's exponent, 1 - bias = {fmt.emin}: the exponent field "
                f"0 means 2^{fmt.emin} with a leading 0, so the subnormal spacing is 2^{fmt.emin - m}. Clamp "
                f"the exponent with max(exponent, {fmt.emin}), not one power of two off."
            ),
        ),
        Mistake(
            "bias",
            other_bias,
            (
                f"Your exponent bias is wrong: {name} has {e} exponent bits, so bias = 2^({e} - 1) - 1 = "
                f"{bias}. The bias sets the range: the smallest normal is 2^(1 - bias) = 2^{fmt.emin} and the "
                f"largest value (2 - 2^-{m}) * 2^bias = {fmt.max:.6g}; another bias moves both."
            ),
        ),
    ]


def _to_float(got, call: str) -> float:
    """The learner's return value as a float, or stop the check with what was wrong with it."""
    return as_number(got, f"{call} returned", "return the stored value as a Python float")


def _name_mismatches(mismatches: list, rules, what_differs: str, show):
    """The failed result naming the known mistake that explains the most mismatches (``best_mistake``)."""
    rule, count = best_mistake(rules, mismatches)
    details = [show(*item) for item in mismatches[:6]]
    if rule is None:
        return failed(
            f"{len(mismatches)} {what_differs}. None of the usual mistakes explains them; compare "
            "your steps with the lesson (exponent, rounding to nearest even, subnormals, overflow, "
            "sign).",
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
            f"stored_value(1.0, 'float16') returned {first!r}; 1.0 is exactly representable, so it is "
            "stored as 1.0."
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
        f"All {total} values match torch's float16 and bfloat16 casts bit for bit: rounding to "
        "nearest even, subnormals, overflow to inf, NaN and -0.0."
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
        normal - 0.25 * sub,
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


def classify_mistakes(fmt: FloatFormat, values: list[float], labels: list[str]) -> tuple[Mistake, ...]:
    """Every known wrong labelling, in priority order; each rule reads one mismatch ``(x, expected, got)``.

    ``values`` and ``labels`` (all of the learner's answers) let a rule compare a value with its positive
    twin.
    """
    sub, normal, big, threshold = fmt.smallest_subnormal, fmt.smallest_normal, fmt.max, fmt.overflow_threshold
    position = {}
    for i, v in enumerate(values):
        position.setdefault(v, i)

    def positive_twin_right(x, expected, got):
        if not x < 0:
            return False
        twin = position.get(-x)
        return twin is not None and labels[twin] == expected

    def float16_kind(x):
        return kind_of_stored(model_round(x, 5, 10), FLOAT16)

    mistakes = [
        Mistake(
            "nan",
            lambda x, expected, got: math.isnan(x) and got != "nan",
            "A NaN input stays NaN after the cast: its kind is 'nan'. Test math.isnan(x) first: NaN "
            "compares False with every threshold, so it falls through to whatever your last branch "
            "returns.",
        ),
        Mistake(
            "inf input",
            lambda x, expected, got: math.isinf(x) and got != "inf",
            "+-inf is stored as +-inf: its kind is 'inf'.",
        ),
        Mistake(
            "zero input",
            lambda x, expected, got: x == 0 and got != "zero",
            "0.0 and -0.0 are stored as zero: kind 'zero'.",
        ),
        Mistake(
            "negative values",
            positive_twin_right,
            "Your labels for negative values are wrong although you got their magnitudes right: the kind "
            "depends on |x|, so compare abs(x) with the thresholds.",
        ),
    ]
    if fmt is BFLOAT16:
        mistakes.append(
            Mistake(
                "float16 range for bfloat16",
                lambda x, expected, got: got == float16_kind(x),
                "You used float16's range for bfloat16. bfloat16 has float32's 8 exponent bits: normal from "
                "1.18e-38 up to 3.39e38, subnormal down to 9.2e-41 (e.g. 1e5 and 1e-6 are ordinary normal "
                "numbers in bfloat16).",
            )
        )
    mistakes += [
        Mistake(
            "overflow before rounding",
            lambda x, expected, got: expected == "normal" and got == "inf" and abs(x) > big,
            f"Values just above max round DOWN to max ({big:.6g}): only |x| >= {threshold:.6g} (max + "
            "half a step) becomes inf. Compare with that threshold, or round first and classify the "
            "rounded value.",
        ),
        Mistake(
            "overflow missed",
            lambda x, expected, got: expected == "inf" and got != "inf" and math.isfinite(x),
            f"|x| >= {threshold:.6g} rounds beyond max, so it is stored as inf. Exactly {threshold:.6g} "
            "is a tie between max and the next power of two; the tie goes to the even one, which is "
            "beyond the range: inf.",
        ),
        Mistake(
            "underflow too early",
            lambda x, expected, got: expected == "subnormal" and got == "zero" and abs(x) < sub,
            f"Values between half the smallest subnormal ({sub / 2:.4g}) and the smallest subnormal "
            f"({sub:.4g}) round UP to {sub:.4g}: they are 'subnormal', not 'zero'. Only |x| <= "
            f"{sub / 2:.4g} rounds to zero.",
        ),
        Mistake(
            "flush",
            lambda x, expected, got: expected == "subnormal" and got == "zero",
            f"No subnormals: values below the smallest normal ({normal:.4g}) are not zero. Down to the "
            f"smallest subnormal ({sub:.4g} = 2^{fmt.emin - fmt.mantissa_bits}) they are stored as "
            "subnormals.",
        ),
        Mistake(
            "underflow missed",
            lambda x, expected, got: expected == "zero" and got != "zero" and x != 0,
            f"|x| <= {sub / 2:.4g} (half the smallest subnormal) rounds to zero; exactly half is a tie "
            "and goes to the even neighbour, which is 0.",
        ),
        Mistake(
            "normal boundary",
            lambda x, expected, got: expected == "normal" and got == "subnormal" and abs(x) < normal,
            f"Values just below the smallest normal ({normal:.4g}) round UP to it: |x| >= "
            f"{normal - sub / 2:.6g} (halfway between the largest subnormal and the smallest normal) is "
            "stored as a normal number.",
        ),
        Mistake(
            "subnormal missed",
            lambda x, expected, got: expected == "subnormal" and got == "normal",
            f"|x| below the smallest normal ({normal:.4g} = 2^{fmt.emin}) is stored as a subnormal "
            "(exponent field 0).",
        ),
    ]
    return tuple(mistakes)


def _labels(got, n: int, call: str) -> list[str]:
    if isinstance(got, (str, bytes)) or got is None or isinstance(got, (numbers.Number, dict, set)):
        stop(f"{call} returned {type(got).__name__} {got!r}; return a list with one label per value.")
    try:
        labels = list(got)
    except TypeError:
        stop(f"{call} returned a {type(got).__name__}; return a list with one label per value.")
    if len(labels) != n:
        stop(
            f"{call} returned {len(labels)} labels for {n} values; return exactly one label per value, in "
            "order."
        )
    for i, label in enumerate(labels):
        if not isinstance(label, str):
            stop(
                f"{call}: label {i} is a {type(label).__name__} ({label!r}); use one of the strings "
                f"{', '.join(KINDS)}."
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
        f"All {total} labels match what torch's float16 and bfloat16 casts produce, including the "
        "edges: just above max, the overflow tie, the underflow tie and the normal/subnormal "
        "boundary."
    )
