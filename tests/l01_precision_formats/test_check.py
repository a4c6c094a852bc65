"""Lesson 01 checkers: the solution passes, the untouched exercise is "not done", each known wrong answer is
named, junk never raises; and each rule of the two mistake tables recognises its own case."""

import math
import time

import numpy as np
import pytest
import torch
from notebook_code import exercise, solution

from amp_lessons.checks.harness import NOT_DONE
from amp_lessons.l01_precision_formats import formats
from amp_lessons.l01_precision_formats.check import (
    check_classify,
    check_stored_value,
    classify_mistakes,
    kind_of_stored,
    model_round,
    oracle_values,
    probe_values,
    same_float,
    stored_value_mistakes,
)
from amp_lessons.l01_precision_formats.formats import BFLOAT16, FLOAT16

NOTEBOOK = "01_precision_formats.ipynb"


def _rounding(exponent_bits=None, mantissa_bits=None, **mistake):
    """A learner-style stored_value with one deliberate mistake (see model_round's options)."""

    def stored_value(x, fmt):
        e, m = {"float16": (5, 10), "bfloat16": (8, 7)}[fmt]
        widths = (exponent_bits or {}).get(fmt, e), (mantissa_bits or {}).get(fmt, m)
        return model_round(x, *widths, **mistake)

    return stored_value


def keeps_nan_as_zero(x, fmt):
    return 0.0 if math.isnan(x) else solution(NOTEBOOK, "stored_value")(x, fmt)


def loses_negative_zero(x, fmt):
    value = solution(NOTEBOOK, "stored_value")(x, fmt)
    return 0.0 if value == 0 else value


def returns_x(x, fmt):
    return x


WRONG_STORED_VALUES = {
    "truncation": (_rounding(rounding="trunc"), "truncated"),
    "ties away from zero": (_rounding(rounding="away"), "ties to EVEN"),
    "flush subnormals": (_rounding(subnormals="flush"), "No subnormals"),
    "full precision below the normals": (_rounding(subnormals="unbounded"), "FEWER significant bits"),
    "saturate at max": (_rounding(overflow="saturate"), "saturated at max (65504)"),
    "overflow before rounding": (_rounding(overflow="before_rounding"), "round DOWN to max"),
    "sign lost": (_rounding(keep_sign=False), "sign is lost"),
    "negative zero lost": (loses_negative_zero, "Negative zero lost its sign"),
    "nan not kept": (keeps_nan_as_zero, "NaN must stay NaN"),
    "bf16 with fp16's mantissa": (
        _rounding(mantissa_bits={"bfloat16": 10}),
        "kept float16's 10 for bfloat16",
    ),
    "bf16 with fp16's exponent": (
        _rounding(exponent_bits={"bfloat16": 5}),
        "bfloat16 has float32's 8 exponent bits",
    ),
    "bf16 done as fp16": (
        _rounding(exponent_bits={"bfloat16": 5}, mantissa_bits={"bfloat16": 10}),
        "stored bfloat16 values as float16",
    ),
    "fp16 done as bf16": (
        _rounding(exponent_bits={"float16": 8}, mantissa_bits={"float16": 7}),
        "float16 values with bfloat16's layout",
    ),
    "mantissa off by one": (
        _rounding(mantissa_bits={"float16": 11, "bfloat16": 8}),
        "Off by one in the mantissa",
    ),
    "no rounding at all": (returns_x, "returned x unchanged"),
}


def test_stored_value_solution_passes(strict):
    started = time.perf_counter()
    result = check_stored_value(solution(NOTEBOOK, "stored_value"))
    assert result.passed, result.message
    assert time.perf_counter() - started < 2.0


def test_stored_value_exercise_is_not_done():
    assert check_stored_value(exercise(NOTEBOOK, "stored_value")).status == NOT_DONE


@pytest.mark.parametrize("name", WRONG_STORED_VALUES)
def test_stored_value_names_each_mistake(name):
    wrong, words = WRONG_STORED_VALUES[name]
    result = check_stored_value(wrong)
    assert not result.passed and result.status == "failed"
    assert words in result.message, result.message
    assert "Example: stored_value(" in result.message


def test_the_models_are_really_wrong_and_the_right_one_is_right():
    for fmt in (FLOAT16, BFLOAT16):
        for x in probe_values(fmt):
            want = torch.tensor(x, dtype=torch.float32).to(fmt.dtype).item()
            got = model_round(x, fmt.exponent_bits, fmt.mantissa_bits)
            assert got == want or (math.isnan(got) and math.isnan(want))


def _raises_on_nan(x, fmt):
    if math.isnan(x):
        raise ValueError("cannot convert float NaN to integer")
    return solution(NOTEBOOK, "stored_value")(x, fmt)


@pytest.mark.parametrize(
    "junk, words",
    [
        (None, "got None"),
        ("stored_value", "got a str"),
        (42, "got a int"),
        (lambda: 1.0, "signature"),
        (lambda x: x, "signature"),
        (lambda x, fmt: None, "returned a NoneType"),
        (lambda x, fmt: "1.0", "returned a str"),
        (lambda x, fmt: [x], "returned a list"),
        (lambda x, fmt: True, "returned a bool"),
        (lambda x, fmt: 10**400, "not a float"),
        (lambda x, fmt: math.nan, "returned nan"),
        (lambda x, fmt: 1.0 + 1j, "returned a complex"),
        (lambda x, fmt: torch.ones(2), "returned a tensor with 2 elements"),
        (lambda x, fmt: 1 / 0, "ZeroDivisionError"),
        (_raises_on_nan, "stored_value(nan, 'float16')` raised an error: ValueError"),
    ],
)
def test_stored_value_never_raises_on_junk(junk, words):
    result = check_stored_value(junk)
    assert not result.passed and words in result.message, result.message


def test_stored_value_accepts_tensor_and_numpy_scalars():
    right = solution(NOTEBOOK, "stored_value")
    assert check_stored_value(lambda x, fmt: torch.tensor(right(x, fmt), dtype=torch.float64)).passed
    assert check_stored_value(lambda x, fmt: np.float64(right(x, fmt))).passed


def _classify_like(**mistake):
    """A learner-style classify with one deliberate mistake, built on thresholds like the solution."""

    def classify(values, fmt):
        e, m = (5, 10) if fmt == "float16" or mistake.get("fp16_range") else (8, 7)
        bias = 2 ** (e - 1) - 1
        normal, sub = 2.0 ** (1 - bias), 2.0 ** (1 - bias - m)
        largest = (2 - 2.0**-m) * 2.0**bias
        kinds = []
        for x in values:
            a = x if mistake.get("signed") else abs(x)
            if not mistake.get("no_nan") and math.isnan(x):
                kinds.append("nan")
            elif (
                (a > largest) if mistake.get("overflow_at_max") else (a >= (2 - 2.0 ** -(m + 1)) * 2.0**bias)
            ):
                kinds.append("normal" if mistake.get("never_inf") and math.isfinite(x) else "inf")
            elif a >= (normal if mistake.get("raw_normal") else normal - sub / 2):
                kinds.append("normal")
            elif mistake.get("flush"):
                kinds.append("zero")
            elif (a >= sub) if mistake.get("zero_below_sub") else (a > sub / 2):
                kinds.append("subnormal")
            else:
                kinds.append("subnormal" if mistake.get("never_zero") and x != 0 else "zero")
        return kinds

    return classify


WRONG_CLASSIFY = {
    "nan falls through": (_classify_like(no_nan=True), "A NaN input stays NaN"),
    "x instead of |x|": (_classify_like(signed=True), "compare abs(x) with the thresholds"),
    "overflow at max": (_classify_like(overflow_at_max=True), "round DOWN to max (65504)"),
    "never inf": (_classify_like(never_inf=True), "is a tie"),
    "flush subnormals": (_classify_like(flush=True), "No subnormals"),
    "zero below the smallest subnormal": (_classify_like(zero_below_sub=True), "round UP to 5.96e-08"),
    "never zero": (_classify_like(never_zero=True), "rounds to zero"),
    "raw normal boundary": (_classify_like(raw_normal=True), "round UP to it"),
    "fp16 range for bf16": (_classify_like(fp16_range=True), "You used float16's range for bfloat16"),
}


def test_classify_solution_passes(strict):
    started = time.perf_counter()
    result = check_classify(solution(NOTEBOOK, "classify"))
    assert result.passed, result.message
    assert time.perf_counter() - started < 2.0


def test_classify_exercise_is_not_done():
    assert check_classify(exercise(NOTEBOOK, "classify")).status == NOT_DONE


@pytest.mark.parametrize("name", WRONG_CLASSIFY)
def test_classify_names_each_mistake(name):
    wrong, words = WRONG_CLASSIFY[name]
    result = check_classify(wrong)
    assert not result.passed and result.status == "failed"
    assert words in result.message, result.message


def test_classify_via_the_learners_own_stored_value_passes():
    right = solution(NOTEBOOK, "stored_value")

    def classify(values, fmt):
        return [formats.decompose(right(x, fmt), fmt).kind for x in values]

    assert check_classify(classify).passed


@pytest.mark.parametrize(
    "junk, words",
    [
        (None, "got None"),
        (lambda values: ["normal"], "signature"),
        (lambda values, fmt: None, "return a list"),
        (lambda values, fmt: "normal", "return a list"),
        (lambda values, fmt: 3, "return a list"),
        (lambda values, fmt: ["normal"] * 2, "2 labels for 1 values"),
        (lambda values, fmt: [1 for _ in values], "label 0 is a int"),
        (lambda values, fmt: ["Normal" for _ in values], "lower case: 'normal'"),
        (lambda values, fmt: ["denormal" for _ in values], "'subnormal'"),
        (lambda values, fmt: ["tiny" for _ in values], "not one of"),
        (lambda values, fmt: [math.nan for _ in values], "label 0 is a float"),
        (lambda values, fmt: {"a": 1}, "return a list"),
        (lambda values, fmt: values[0] / 0, "ZeroDivisionError"),
        (lambda values, fmt: ["normal"] if len(values) == 1 else ["normal"], "labels for"),
    ],
)
def test_classify_never_raises_on_junk(junk, words):
    result = check_classify(junk)
    assert not result.passed and words in result.message, result.message


def test_classify_accepts_tuples_and_arrays():
    right = solution(NOTEBOOK, "classify")
    assert check_classify(lambda values, fmt: tuple(right(values, fmt))).passed
    assert check_classify(lambda values, fmt: np.array(right(values, fmt))).passed


# ------------------------------------------------------------------------------------------------
# the mistake tables, rule by rule: each recognises the mismatch its mistake produces
# ------------------------------------------------------------------------------------------------


def _stored(x, fmt):
    return oracle_values([x], fmt)[0]


F16_SUB, F16_NORMAL = FLOAT16.smallest_subnormal, FLOAT16.smallest_normal
STORED_VALUE_CASES = {  # rule name: (format, x, the learner's wrong value)
    "nan": (FLOAT16, math.nan, 0.0),
    "inf": (FLOAT16, math.inf, 65504.0),
    "unchanged": (FLOAT16, 0.1, 0.1),
    "negative zero": (FLOAT16, -0.0, 0.0),
    "sign": (FLOAT16, -0.1, _stored(0.1, FLOAT16)),
    "truncation": (FLOAT16, 1 + 0.7 * 2.0**-10, 1.0),
    "ties away": (FLOAT16, 1 + 2.0**-11, 1 + 2.0**-10),
    "ties to odd": (FLOAT16, 1 + 3 * 2.0**-11, 1 + 2.0**-10),
    "decimal digits": (FLOAT16, 1 / 3, 0.333),
    "flush": (FLOAT16, 0.5 * F16_NORMAL, 0.0),
    "subnormal precision": (
        FLOAT16,
        3.3 * F16_SUB,
        model_round(3.3 * F16_SUB, 5, 10, subnormals="unbounded"),
    ),
    "saturate": (FLOAT16, 1e5, 65504.0),
    "overflow before rounding": (FLOAT16, 65519.0, math.inf),
    "bfloat16 for float16": (FLOAT16, 0.1, model_round(0.1, 8, 7)),
    "float16 for bfloat16": (BFLOAT16, 0.1, model_round(0.1, 5, 10)),
    "mantissa bits": (BFLOAT16, 1e5, model_round(1e5, 8, 10)),
    "exponent bits": (BFLOAT16, 1e5, math.inf),
    "mantissa off by one": (FLOAT16, 0.1, model_round(0.1, 5, 11)),
    "no overflow": (FLOAT16, 1e5, model_round(1e5, 5, 10, largest=math.inf)),
    "max at the next power of two": (FLOAT16, 65520.0, 65536.0),
    "max itself overflows": (FLOAT16, 65504.0, math.inf),
    "exponent one too high": (
        FLOAT16,
        0.1 + 2**-14,
        model_round(0.1 + 2**-14, 5, 10, exponent_of="plus_one"),
    ),
    "exponent one too low": (FLOAT16, 0.1, model_round(0.1, 5, 10, exponent_of="minus_one")),
    "subnormal exponent": (FLOAT16, 0.3 * F16_SUB, model_round(0.3 * F16_SUB, 5, 10, emin_shift=-1)),
    "bias": (FLOAT16, 0.3 * F16_SUB, model_round(0.3 * F16_SUB, 5, 10, bias=16)),
}


@pytest.mark.parametrize("name", STORED_VALUE_CASES)
def test_each_stored_value_rule_recognises_its_mistake(name):
    fmt, x, got = STORED_VALUE_CASES[name]
    expected = _stored(x, fmt)
    assert not same_float(got, expected), "the case must be a real mismatch"
    rules = {rule.name: rule for rule in stored_value_mistakes(fmt)}
    assert rules[name].matches(x, expected, got)
    assert isinstance(rules[name].text(x, expected, got), str)


def test_every_stored_value_rule_has_a_case():
    names = {rule.name for fmt in (FLOAT16, BFLOAT16) for rule in stored_value_mistakes(fmt)}
    assert names == set(STORED_VALUE_CASES)


CLASSIFY_CASES = {  # rule name: (format, x, the learner's wrong label)
    "nan": (FLOAT16, math.nan, "normal"),
    "inf input": (FLOAT16, -math.inf, "normal"),
    "zero input": (FLOAT16, -0.0, "subnormal"),
    "negative values": (FLOAT16, -1.0, "zero"),
    "float16 range for bfloat16": (BFLOAT16, 1e5, "inf"),
    "overflow before rounding": (FLOAT16, 65519.0, "inf"),
    "overflow missed": (FLOAT16, 65520.0, "normal"),
    "underflow too early": (FLOAT16, 0.75 * F16_SUB, "zero"),
    "flush": (FLOAT16, 0.5 * F16_NORMAL, "zero"),
    "underflow missed": (FLOAT16, 0.25 * F16_SUB, "subnormal"),
    "normal boundary": (FLOAT16, F16_NORMAL - 0.25 * F16_SUB, "subnormal"),
    "subnormal missed": (FLOAT16, 0.5 * F16_NORMAL, "normal"),
}


@pytest.mark.parametrize("name", CLASSIFY_CASES)
def test_each_classify_rule_recognises_its_mistake(name):
    fmt, x, label = CLASSIFY_CASES[name]
    expected = kind_of_stored(_stored(x, fmt), fmt)
    assert label != expected, "the case must be a real mismatch"
    values, labels = [-x, x], [expected, label]  # the positive twin labelled right, x labelled wrong
    rules = {rule.name: rule for rule in classify_mistakes(fmt, values, labels)}
    assert rules[name].matches(x, expected, label)


def test_every_classify_rule_has_a_case():
    names = {rule.name for fmt in (FLOAT16, BFLOAT16) for rule in classify_mistakes(fmt, [], [])}
    assert names == set(CLASSIFY_CASES)


# ------------------------------------------------------------------------------------------------
# correct answers written differently from the reference, and more wrong answers a class writes
# ------------------------------------------------------------------------------------------------


def stored_value_log2_floor(x, fmt):
    """floor(log2|x|) for the exponent, a while loop for overflow: no frexp."""
    e_bits, m_bits = {"float16": (5, 10), "bfloat16": (8, 7)}[fmt]
    if x != x or x in (math.inf, -math.inf) or x == 0:
        return x
    bias = 2 ** (e_bits - 1) - 1
    exponent = max(math.floor(math.log2(abs(x))), 1 - bias)
    if 2.0**exponent > abs(x):  # log2 rounded up just below a power of two
        exponent -= 1
    exponent = max(exponent, 1 - bias)
    quantum = 2.0 ** (exponent - m_bits)
    magnitude = round(abs(x) / quantum) * quantum
    return math.copysign(magnitude if magnitude <= (2 - 2**-m_bits) * 2**bias else math.inf, x)


def stored_value_integer_mantissa(x, fmt):
    """An integer significand from frexp, rounded with numpy's round-half-even, rebuilt with ldexp."""
    e_bits, m_bits = {"float16": (5, 10), "bfloat16": (8, 7)}[fmt]
    if math.isnan(x) or math.isinf(x) or x == 0.0:
        return x
    emin = 2 - 2 ** (e_bits - 1)
    mantissa, exponent = math.frexp(abs(x))  # abs(x) = mantissa * 2**exponent, 0.5 <= mantissa < 1
    shift = m_bits + 1 if exponent - 1 >= emin else m_bits + 1 - (emin - (exponent - 1))
    significand = int(np.round(mantissa * 2.0**shift))
    value = math.ldexp(significand, exponent - shift)
    largest = math.ldexp(2 ** (m_bits + 1) - 1, 2 ** (e_bits - 1) - 1 - m_bits)
    return math.copysign(math.inf if value > largest else value, x)


def stored_value_fractions(x, fmt):
    """Exact rational arithmetic: the grid step as a Fraction, ties settled by hand (to the even multiple)."""
    from fractions import Fraction

    e_bits, m_bits = {"float16": (5, 10), "bfloat16": (8, 7)}[fmt]
    if math.isnan(x) or math.isinf(x) or x == 0:
        return x
    bias = 2 ** (e_bits - 1) - 1
    a = Fraction(abs(x))
    exponent = 1 - bias
    while a >= Fraction(2) ** (exponent + 1):
        exponent += 1
    step = Fraction(2) ** (exponent - m_bits)
    q, remainder = divmod(a, step)
    if remainder * 2 > step or (remainder * 2 == step and q % 2 == 1):
        q += 1
    value = float(q * step)
    if value > (2 - 2.0**-m_bits) * 2.0**bias:
        value = math.inf
    return math.copysign(value, x)


def stored_value_bit_tricks(x, fmt):
    """numpy's float16 for float16; for bfloat16 the classic float32 bit trick (round the upper 16 bits)."""
    import struct

    if fmt == "float16":
        with np.errstate(over="ignore"):
            return float(np.float16(np.float32(x)))
    bits = struct.unpack("<I", struct.pack("<f", x))[0]
    if math.isnan(x):
        return x
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000  # round to nearest, ties to even
    return struct.unpack("<f", struct.pack("<I", bits))[0]


def stored_value_torch(x, fmt):
    """Lets torch do it (the exercise asks for arithmetic, but the check judges the values)."""
    return torch.tensor(x, dtype=torch.float32).to(getattr(torch, fmt)).item()


CORRECT_STORED_VALUES = [
    stored_value_log2_floor,
    stored_value_integer_mantissa,
    stored_value_fractions,
    stored_value_bit_tricks,
    stored_value_torch,
]


@pytest.mark.parametrize("variant", CORRECT_STORED_VALUES, ids=lambda f: f.__name__)
def test_stored_value_correct_variants_pass(variant):
    result = check_stored_value(variant)
    assert result.passed, result.message


def _layout(**changes):
    """The solution's arithmetic with one line of the layout changed, as a learner might write it."""

    def stored_value(x, fmt):
        e_bits, m_bits = {"float16": (5, 10), "bfloat16": (8, 7)}[fmt]
        if math.isnan(x) or math.isinf(x) or x == 0:
            return x
        bias = changes.get("bias", lambda e: 2 ** (e - 1) - 1)(e_bits)
        largest = changes.get("largest", lambda m, b: (2 - 2.0**-m) * 2.0**b)(m_bits, bias)
        exponent = changes.get("exponent", lambda a: math.frexp(a)[1] - 1)(abs(x))
        exponent = max(exponent, changes.get("emin", lambda b: 1 - b)(bias))
        step = 2.0 ** (exponent - m_bits)
        magnitude = round(abs(x) / step) * step
        if changes.get("overflow", lambda mag, top: mag > top)(magnitude, largest):
            magnitude = math.inf
        return math.copysign(magnitude, x)

    return stored_value


MORE_WRONG_STORED_VALUES = {
    "frexp without the -1": (_layout(exponent=lambda a: math.frexp(a)[1]), "exponent of |x| is one too high"),
    "ceil(log2|x|)": (_layout(exponent=lambda a: math.ceil(math.log2(a))), "ceil(log2|x|) is one too high"),
    "frexp minus 2": (_layout(exponent=lambda a: math.frexp(a)[1] - 2), "exponent of |x| is one too low"),
    "bias 2**(e-1)": (_layout(bias=lambda e: 2 ** (e - 1)), "bias = 2^(5 - 1) - 1 = 15"),
    "bias 2**e - 1": (_layout(bias=lambda e: 2**e - 1), "Your exponent bias is wrong"),
    "bias 2**(e-1) - 2": (_layout(bias=lambda e: 2 ** (e - 1) - 2), "Your exponent bias is wrong"),
    "subnormals at -bias": (_layout(emin=lambda b: -b), "Subnormals share the smallest normal's exponent"),
    "max 2**16": (_layout(largest=lambda m, b: 2.0 ** (b + 1)), "up to 2^16 = 65536 stay finite"),
    "max >= instead of >": (_layout(overflow=lambda mag, top: mag >= top), "Compare with `>`, not `>=`"),
    "never overflows": (_layout(overflow=lambda mag, top: False), "Nothing ever overflows"),
}


@pytest.mark.parametrize("name", MORE_WRONG_STORED_VALUES)
def test_stored_value_names_layout_mistakes(name):
    wrong, words = MORE_WRONG_STORED_VALUES[name]
    result = check_stored_value(wrong)
    assert result.status == "failed", result.message
    assert words in result.message, result.message
    assert "Off by one in the mantissa" not in result.message and "layout (8 exponent" not in result.message


def test_a_slow_stored_value_is_stopped_with_a_message(monkeypatch):
    monkeypatch.setenv("AMP_LESSONS_CHECK_BUDGET", "1")
    right = solution(NOTEBOOK, "stored_value")

    def slow(x, fmt):
        time.sleep(0.05)  # about 55 calls: 3 s in all, past the budget
        return right(x, fmt)

    started = time.perf_counter()
    result = check_stored_value(slow)
    assert time.perf_counter() - started < 2.0
    assert result.status == "failed" and "stopped after 1 s" in result.message, result.message


@pytest.mark.parametrize(
    "variant", [stored_value_log2_floor, stored_value_fractions], ids=lambda f: f.__name__
)
def test_a_reasonable_loop_answer_is_checked_in_under_2_s(variant):
    started = time.perf_counter()
    assert check_stored_value(variant).passed
    assert time.perf_counter() - started < 2.0


def classify_by_casting(values, fmt):
    """torch does the rounding, the kind is read off the stored value."""
    stored = torch.tensor(list(values), dtype=torch.float32).to(getattr(torch, fmt)).double()
    tiny = torch.finfo(getattr(torch, fmt)).tiny
    return [
        "nan"
        if math.isnan(v)
        else "inf"
        if math.isinf(v)
        else "zero"
        if v == 0
        else "subnormal"
        if abs(v) < tiny
        else "normal"
        for v in stored.tolist()
    ]


def classify_numpy_thresholds(values, fmt):
    """Thresholds from the format's numbers, compared in numpy, with <= and < written the other way round."""
    e_bits, m_bits = {"float16": (5, 10), "bfloat16": (8, 7)}[fmt]
    bias = 2 ** (e_bits - 1) - 1
    tiny, sub = 2.0 ** (1 - bias), 2.0 ** (1 - bias - m_bits)
    a = np.abs(np.asarray(values, dtype=np.float64))
    labels = np.where(a <= sub / 2, "zero", np.where(a < tiny - sub / 2, "subnormal", "normal"))
    labels = np.where(a >= (2 - 2.0 ** -(m_bits + 1)) * 2.0**bias, "inf", labels)
    return list(np.where(np.isnan(a), "nan", labels))


def classify_via_stored_value_variant(values, fmt):
    kinds = []
    for x in values:
        v = stored_value_fractions(x, fmt)
        smallest_normal = 2.0 ** (2 - 2 ** ({"float16": 5, "bfloat16": 8}[fmt] - 1))
        kinds.append(
            "nan"
            if v != v
            else "inf"
            if math.isinf(v)
            else "zero"
            if v == 0
            else "subnormal"
            if abs(v) < smallest_normal
            else "normal"
        )
    return kinds


@pytest.mark.parametrize(
    "variant",
    [classify_by_casting, classify_numpy_thresholds, classify_via_stored_value_variant],
    ids=lambda f: f.__name__,
)
def test_classify_correct_variants_pass(variant):
    result = check_classify(variant)
    assert result.passed, result.message


def classify_compares_unrounded(values, fmt):
    """Classifies x itself, not the value it becomes: no rounding at any edge."""
    e_bits, m_bits = {"float16": (5, 10), "bfloat16": (8, 7)}[fmt]
    bias = 2 ** (e_bits - 1) - 1
    tiny, sub, top = 2.0 ** (1 - bias), 2.0 ** (1 - bias - m_bits), (2 - 2.0**-m_bits) * 2.0**bias
    kinds = []
    for x in values:
        a = abs(x)
        kinds.append(
            "nan"
            if math.isnan(x)
            else "inf"
            if a > top
            else "normal"
            if a >= tiny
            else "subnormal"
            if a >= sub
            else "zero"
        )
    return kinds


def classify_finfo_of_float16(values, fmt):
    info = torch.finfo(torch.float16)  # the same limits for both formats
    return classify_numpy_thresholds(values, "float16") if info else []


@pytest.mark.parametrize(
    "wrong, words",
    [
        (classify_compares_unrounded, "round DOWN to max"),
        (classify_finfo_of_float16, "You used float16's range for bfloat16"),
    ],
    ids=["unrounded", "float16 limits for both"],
)
def test_classify_names_more_mistakes(wrong, words):
    result = check_classify(wrong)
    assert result.status == "failed" and words in result.message, result.message


# ------------------------------------------------------------------------------------------------
# a review pass: more styles a class writes (numpy results, tensors, loops), and more natural mistakes
# ------------------------------------------------------------------------------------------------

LAYOUTS = {"float16": (5, 10), "bfloat16": (8, 7)}


def _ldexp_round(x, e_bits, m_bits):
    """Scale |x| so the last kept bit is 1, round half to even, scale back: the arithmetic with ldexp."""
    if not math.isfinite(x) or x == 0:
        return x
    bias = 2 ** (e_bits - 1) - 1
    exponent = max(math.frexp(abs(x))[1] - 1, 1 - bias)
    value = math.ldexp(round(math.ldexp(abs(x), m_bits - exponent)), exponent - m_bits)
    largest = math.ldexp(2 ** (m_bits + 1) - 1, bias - m_bits)
    return math.copysign(value if value <= largest else math.inf, x)


def stored_value_ldexp(x, fmt):
    return _ldexp_round(x, *LAYOUTS[fmt])


def stored_value_while_loops_numpy(x, fmt):
    """Normalises by halving/doubling in while loops, rounds with numpy, returns a numpy float64."""
    e_bits, m_bits = LAYOUTS[fmt]
    if x != x or abs(x) == float("inf") or x == 0:
        return x
    bias = 2 ** (e_bits - 1) - 1
    m, e = abs(x), 0
    while m >= 2:
        m, e = m / 2, e + 1
    while m < 1 and e > 1 - bias:
        m, e = m * 2, e - 1
    step = 2.0 ** (e - m_bits)
    magnitude = np.round(abs(x) / step) * step
    if magnitude > (2 - 2.0**-m_bits) * 2.0**bias:
        magnitude = np.inf
    return np.float64(np.copysign(magnitude, x))


def stored_value_as_a_tensor(x, fmt):
    print("storing", x, "in", fmt)
    return torch.tensor(stored_value_ldexp(x, fmt), dtype=torch.float64)


@pytest.mark.parametrize(
    "variant",
    [stored_value_ldexp, stored_value_while_loops_numpy, stored_value_as_a_tensor],
    ids=lambda f: f.__name__,
)
def test_review_stored_value_variants_pass(variant):
    assert check_stored_value(variant).passed


def stored_value_counts_the_implicit_bit(x, fmt):
    e_bits, m_bits = LAYOUTS[fmt]
    return _ldexp_round(x, e_bits, m_bits + 1)  # 11 "mantissa" bits for float16: one too many


def stored_value_unsigned_overflow(x, fmt):
    value = stored_value_ldexp(x, fmt)
    return math.inf if math.isinf(value) else value  # float("inf") for -100000 too


def stored_value_inf_becomes_nan(x, fmt):
    return math.nan if math.isinf(x) else stored_value_ldexp(x, fmt)


def stored_value_floor_log2_no_clamp(x, fmt):
    """floor(log2|x|) with no clamp at the smallest exponent: anything below the normals becomes zero."""
    e_bits, m_bits = LAYOUTS[fmt]
    if not math.isfinite(x) or x == 0:
        return x
    bias = 2 ** (e_bits - 1) - 1
    exponent = math.floor(math.log2(abs(x)))
    if exponent < 1 - bias:
        return 0.0 * x
    step = 2.0 ** (exponent - m_bits)
    magnitude = round(abs(x) / step) * step
    return math.copysign(magnitude if magnitude <= (2 - 2.0**-m_bits) * 2.0**bias else math.inf, x)


@pytest.mark.parametrize(
    "wrong, words",
    [
        (stored_value_counts_the_implicit_bit, "Off by one in the mantissa"),
        (stored_value_unsigned_overflow, "The sign is lost"),
        (stored_value_inf_becomes_nan, "+-inf must be stored as +-inf"),
        (stored_value_floor_log2_no_clamp, "No subnormals"),
    ],
    ids=["11 mantissa bits", "inf without sign", "inf to nan", "no exponent clamp"],
)
def test_review_stored_value_mistakes_are_named(wrong, words):
    result = check_stored_value(wrong)
    assert result.status == "failed" and words in result.message, result.message


def classify_np_select_tuple(values, fmt):
    """Vectorised with np.select; returns a tuple of numpy strings."""
    e_bits, m_bits = LAYOUTS[fmt]
    bias = 2 ** (e_bits - 1) - 1
    a = np.abs(np.asarray(values, dtype=np.float64))
    tiny, sub = 2.0 ** (1 - bias), 2.0 ** (1 - bias - m_bits)
    big = (2 - 2.0 ** -(m_bits + 1)) * 2.0**bias
    with np.errstate(invalid="ignore"):
        conditions = [np.isnan(a), a >= big, a >= tiny - sub / 2, a > sub / 2]
        return tuple(np.select(conditions, ["nan", "inf", "normal", "subnormal"], "zero"))


def classify_finfo_after_rounding(values, fmt):
    """Rounds with the learner's own stored_value, then compares with torch.finfo's tiny."""
    tiny = torch.finfo(getattr(torch, fmt)).tiny
    kinds = []
    for x in values:
        v = stored_value_ldexp(float(x), fmt)
        if v != v:
            kinds.append("nan")
        elif abs(v) == math.inf:
            kinds.append("inf")
        elif v == 0:
            kinds.append("zero")
        else:
            kinds.append("subnormal" if abs(v) < tiny else "normal")
    return kinds


@pytest.mark.parametrize(
    "variant", [classify_np_select_tuple, classify_finfo_after_rounding], ids=lambda f: f.__name__
)
def test_review_classify_variants_pass(variant):
    assert check_classify(variant).passed


def classify_without_abs(values, fmt):
    e_bits, m_bits = LAYOUTS[fmt]
    bias = 2 ** (e_bits - 1) - 1
    tiny, sub = 2.0 ** (1 - bias), 2.0 ** (1 - bias - m_bits)
    big = (2 - 2.0 ** -(m_bits + 1)) * 2.0**bias
    return [
        "nan"
        if math.isnan(x)
        else "inf"
        if x >= big
        else "normal"
        if x >= tiny - sub / 2
        else "subnormal"
        if x > sub / 2
        else "zero"
        for x in values
    ]


def classify_finfo_max_for_inf(values, fmt):
    info = torch.finfo(getattr(torch, fmt))
    right = classify_np_select_tuple(values, fmt)
    return [
        "inf" if abs(x) > info.max else "normal" if kind == "inf" else kind for x, kind in zip(values, right)
    ]


def classify_below_smallest_subnormal_is_zero(values, fmt):
    e_bits, m_bits = LAYOUTS[fmt]
    smallest = 2.0 ** (2 - 2 ** (e_bits - 1) - m_bits)
    right = classify_np_select_tuple(values, fmt)
    return ["zero" if kind == "subnormal" and abs(x) < smallest else kind for x, kind in zip(values, right)]


@pytest.mark.parametrize(
    "wrong, words",
    [
        (classify_without_abs, "compare abs(x) with the thresholds"),
        (classify_finfo_max_for_inf, "round DOWN to max"),
        (classify_below_smallest_subnormal_is_zero, "round UP to 5.96e-08"),
    ],
    ids=["no abs", "finfo max", "below smallest subnormal"],
)
def test_review_classify_mistakes_are_named(wrong, words):
    result = check_classify(wrong)
    assert result.status == "failed" and words in result.message, result.message


def test_review_checks_are_fast_on_the_reference():
    for check, name in ((check_stored_value, "stored_value"), (check_classify, "classify")):
        answer = solution(NOTEBOOK, name)
        check(answer)
        started = time.perf_counter()
        assert check(answer).passed
        assert time.perf_counter() - started < 2.0
