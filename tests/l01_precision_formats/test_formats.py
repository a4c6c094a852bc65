"""Lesson 01: amp_lessons.l01_precision_formats.formats (decompose, tables, explorer).
The checkers are tested in tests/checks/test_l01_formats.py."""

import math
import random
import struct
from fractions import Fraction

import numpy as np
import pytest
import torch

from amp_lessons.l01_precision_formats import formats
from amp_lessons.l01_precision_formats.formats import BFLOAT16, FLOAT16, FLOAT32, FORMATS, KINDS, decompose

INT_TYPE = {torch.float32: torch.int32, torch.float16: torch.int16, torch.bfloat16: torch.int16}
DTYPES = [fmt.dtype for fmt in FORMATS]


def torch_bits(values, dtype):
    """What torch stores for Python floats: (value, bit pattern as an unsigned int) per value."""
    stored = torch.tensor(values, dtype=dtype)
    bits = stored.view(INT_TYPE[dtype]).tolist()
    mask = (1 << torch.finfo(dtype).bits) - 1
    return list(zip(stored.double().tolist(), (b & mask for b in bits)))


def interesting_values():
    rng = random.Random(0)
    values = [struct.unpack("<f", struct.pack("<I", rng.getrandbits(32)))[0] for _ in range(1500)]
    values += [rng.choice((-1, 1)) * math.ldexp(rng.random(), rng.randint(-160, 135)) for _ in range(1500)]
    for fmt in FORMATS:
        m = fmt.mantissa_bits
        for k in range(-30, 20, 3):  # ties of both parities in many binades, and their neighbours
            for j in range(3):
                tie = math.ldexp(1 + (2 * j + 1) * 2.0 ** -(m + 1), k)
                values += [tie, -tie, math.nextafter(tie, 0), math.nextafter(tie, math.inf)]
        sub, normal = fmt.smallest_subnormal, fmt.smallest_normal
        values += [
            sub,
            sub / 2,
            sub * 0.75,
            sub * 1.5,
            sub * 2.5,
            normal,
            normal - sub / 2,
            normal - sub / 4,
            fmt.max,
            fmt.overflow_threshold,
            math.nextafter(fmt.overflow_threshold, 0),
            fmt.max * 1.5,
        ]
    return values + [
        0.0,
        -0.0,
        math.inf,
        -math.inf,
        math.nan,
        65504.0,
        65510.0,
        65519.0,
        65520.0,
        1e5,
        3.4e38,
    ]


# ------------------------------------------------------------------------------------------------
# decompose against torch (and other casts)
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_decompose_matches_torch_bit_for_bit(dtype):
    values = interesting_values()
    for x, (stored, bits) in zip(values, torch_bits(values, dtype)):
        d = decompose(x, dtype)
        if math.isnan(stored):
            assert d.kind == "nan" and math.isnan(d.value), x
            assert d.exponent == "1" * len(d.exponent) and "1" in d.mantissa
            continue
        assert int(d.bits, 2) == bits, (x, d, hex(bits))
        assert d.value == stored and math.copysign(1, d.value) == math.copysign(1, stored), (x, d, stored)


def test_decompose_matches_single_rounding_casts_on_float32_values():
    """For float32 inputs every route agrees: NumPy's float16, struct's half, ml_dtypes' bfloat16."""
    ml_dtypes = pytest.importorskip("ml_dtypes")
    values = torch.tensor(interesting_values(), dtype=torch.float32).double().tolist()
    np.seterr(over="ignore")
    for x in values:
        if math.isnan(x):
            continue
        want16 = float(np.float32(x).astype(np.float16))
        assert decompose(x, torch.float16).value == want16, x
        assert formats.round_to(x, torch.float16) == want16, x
        try:
            assert struct.unpack("<e", struct.pack("<e", x))[0] == want16, x
        except OverflowError:  # struct refuses to round to inf
            assert math.isinf(want16)
        want_bf = float(np.float32(x).astype(ml_dtypes.bfloat16))
        assert decompose(x, torch.bfloat16).value == want_bf, x


def test_torch_rounds_python_floats_through_float32_and_decompose_follows():
    x = 65519.999999  # float32 rounds it to 65520, a float16 tie that goes to inf; rounding once gives 65504
    assert torch.tensor(x, dtype=torch.float16).item() == decompose(x, torch.float16).value == math.inf
    assert formats.round_to(x, torch.float16) == 65504.0 == float(np.float16(x))
    assert "twice" in decompose(x, torch.float16).note


@pytest.mark.parametrize(
    "dtype, exponent, mantissa",
    [(torch.float32, 8, 23), (torch.float16, 5, 10), (torch.bfloat16, 8, 7)],
    ids=str,
)
def test_contract_fields(dtype, exponent, mantissa):
    for x in (0.1, -3.0, 0.0, -0.0, 1e-7, 1e-40, math.inf, math.nan, 1e6, 65520.0):
        d = decompose(x, dtype)
        assert d.sign in (0, 1) and isinstance(d.sign, int)
        assert len(d.exponent) == exponent and set(d.exponent) <= {"0", "1"}
        assert len(d.mantissa) == mantissa and set(d.mantissa) <= {"0", "1"}
        assert d.kind in KINDS and isinstance(d.value, float)
        assert len(d.bits) == 1 + exponent + mantissa
        assert d.dtype == dtype


@pytest.mark.parametrize(
    "x, dtype, value, kind",
    [
        (-0.0, torch.float16, -0.0, "zero"),
        (0.0, torch.bfloat16, 0.0, "zero"),
        (math.inf, torch.float16, math.inf, "inf"),
        (-math.inf, torch.bfloat16, -math.inf, "inf"),
        (65504.0, torch.float16, 65504.0, "normal"),
        (65510.0, torch.float16, 65504.0, "normal"),  # just above max: rounds down
        (65519.0, torch.float16, 65504.0, "normal"),
        (65520.0, torch.float16, math.inf, "inf"),  # the tie at max + half a step goes to inf
        (-1e5, torch.float16, -math.inf, "inf"),
        (1e5, torch.bfloat16, 99840.0, "normal"),
        (3.4e38, torch.bfloat16, math.inf, "inf"),
        (2.0**-24, torch.float16, 2.0**-24, "subnormal"),
        (2.0**-25, torch.float16, 0.0, "zero"),  # tie with 0: goes to the even neighbour 0
        (-(2.0**-25), torch.float16, -0.0, "zero"),
        (0.75 * 2.0**-24, torch.float16, 2.0**-24, "subnormal"),
        (2.0**-14 - 2.0**-26, torch.float16, 2.0**-14, "normal"),  # rounds up into the normals
        (1e-39, torch.bfloat16, 11 * 2.0**-133, "subnormal"),
        (2.0**-134, torch.bfloat16, 0.0, "zero"),
        (1e-46, torch.float32, 0.0, "zero"),
        (2049.0, torch.float16, 2048.0, "normal"),  # tie: to even
        (2051.0, torch.float16, 2052.0, "normal"),
        (1 + 2.0**-11, torch.float16, 1.0, "normal"),
        (1 + 2.0**-8, torch.bfloat16, 1.0, "normal"),
        (257.0, torch.bfloat16, 256.0, "normal"),
        (259.0, torch.bfloat16, 260.0, "normal"),
    ],
)
def test_edge_cases(x, dtype, value, kind):
    d = decompose(x, dtype)
    assert d.value == value and math.copysign(1, d.value) == math.copysign(1, value)
    assert d.kind == kind
    assert d.sign == (1 if math.copysign(1, x) < 0 else 0)


def test_nan_fields_follow_torch():
    assert decompose(math.nan, torch.float16).bits == "0111111000000000"
    assert decompose(-math.nan, torch.float16).sign == 1
    assert decompose(-math.nan, torch.bfloat16).bits == "0111111111000000"  # torch: canonical NaN 0x7FC0
    assert decompose(math.nan, torch.float32).bits == "0" + "1" * 9 + "0" * 22


def test_errors_and_outcomes():
    d = decompose(0.1, torch.float16)
    assert d.abs_error == abs(d.value - 0.1) > 0 and d.rel_error == pytest.approx(d.abs_error / 0.1)
    assert d.outcome == "rounded" and d.exponent_value == -4 and d.significand == pytest.approx(1.599609375)
    exact = decompose(0.5, torch.bfloat16)
    assert exact.abs_error == exact.rel_error == 0.0 and exact.outcome == "exact"
    over = decompose(70000.0, torch.float16)
    assert over.abs_error == over.rel_error == math.inf
    assert over.outcome == "overflow" and "overflow" in over.note
    under = decompose(1e-9, torch.float16)
    assert under.rel_error == 1.0 and under.outcome == "underflow" and under.exponent_value is None
    nan = decompose(math.nan, torch.float16)
    assert math.isnan(nan.abs_error) and math.isnan(nan.rel_error) and nan.outcome == "nan"
    zero = decompose(-0.0, torch.float16)
    assert zero.abs_error == zero.rel_error == 0.0
    sub = decompose(3e-8, torch.float16)
    assert sub.exponent_value == -14 and sub.significand == 2.0**-10 and "subnormal" in sub.note
    assert "rounds down to max" in decompose(65510.0, torch.float16).note
    assert str(d).startswith("float16: 0 01011 1001100110") and "<span" in d._repr_html_()
    assert set(d.as_dict()) >= {
        "sign",
        "exponent",
        "mantissa",
        "stored value",
        "kind",
        "abs error",
        "rel error",
    }


@pytest.mark.parametrize(
    "x",
    [
        np.float32(0.1),
        np.float64(0.1),
        np.array([0.1]),
        torch.tensor(0.1),
        torch.tensor([0.1]),
        Fraction(1, 10),
        1,
    ],
)
def test_accepts_real_numbers_of_many_types(x):
    assert decompose(x, torch.float16).value == pytest.approx(0.1 if x != 1 else 1.0, rel=1e-3)


def test_huge_python_int_overflows_cleanly():
    assert decompose(10**400, torch.float32).kind == "inf"
    assert decompose(-(10**400), torch.float16).value == -math.inf


@pytest.mark.parametrize(
    "x, error, words",
    [
        ("0.1", TypeError, "float('0.1')"),
        (None, TypeError, "real number"),
        (True, TypeError, "bool"),
        (1 + 2j, TypeError, "complex"),
        ([0.1], TypeError, "list"),
        (torch.ones(3), ValueError, "3 elements"),
        (torch.tensor(1 + 1j), TypeError, "complex"),
    ],
)
def test_bad_numbers_give_clear_errors(x, error, words):
    with pytest.raises(error, match=None) as info:
        decompose(x, torch.float16)
    assert words in str(info.value)


@pytest.mark.parametrize(
    "dtype, error, words",
    [
        (torch.float64, ValueError, "torch.float16"),
        (torch.int8, ValueError, "torch.bfloat16"),
        ("fp8", ValueError, "Unknown format"),
        (16, TypeError, "not a int"),
        (None, TypeError, "torch dtype"),
    ],
)
def test_bad_dtypes_give_clear_errors(dtype, error, words):
    with pytest.raises(error) as info:
        decompose(1.0, dtype)
    assert words in str(info.value)


def test_dtype_aliases():
    assert formats.get_format("bf16") is BFLOAT16 and formats.get_format("torch.float16") is FLOAT16
    assert formats.get_format(" FP32 ") is FLOAT32 and formats.get_format(FLOAT16) is FLOAT16
    assert decompose(0.1, "half").value == decompose(0.1, torch.float16).value


# ------------------------------------------------------------------------------------------------
# format constants, tables, spacing
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", FORMATS, ids=lambda f: f.name)
def test_format_constants_match_torch(fmt):
    info = torch.finfo(fmt.dtype)
    assert (fmt.max, fmt.smallest_normal, fmt.eps, fmt.bits) == (info.max, info.tiny, info.eps, info.bits)
    zero = torch.zeros(1, dtype=fmt.dtype)
    assert formats.next_up(zero).item() == fmt.smallest_subnormal
    assert decompose(fmt.overflow_threshold, fmt.dtype).kind == "inf"
    below = math.nextafter(fmt.overflow_threshold, 0)
    assert formats.round_to(below, fmt.dtype) == fmt.max  # rounding once: just below the tie rounds down
    below32 = float(np.nextafter(np.float32(fmt.overflow_threshold), np.float32(0)))
    assert decompose(below32, fmt.dtype).value == fmt.max == torch.tensor(below32, dtype=fmt.dtype).item()


def test_finfo_table():
    table = formats.finfo_table()
    assert list(table.index) == ["float32", "float16", "bfloat16"]
    assert table["exponent bits"].tolist() == [8, 5, 8] and table["mantissa bits"].tolist() == [23, 10, 7]
    assert table.loc["float16", "max"] == 65504.0 and table.loc["float16", "smallest subnormal"] == 2.0**-24
    assert table.loc["bfloat16", "smallest subnormal"] == 2.0**-133
    assert table.loc["float32", "smallest subnormal"] == 2.0**-149


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_ulp_and_next_up_agree_with_nextafter(dtype):
    x = torch.tensor([1.0, 3.0, 1000.0, 1e-3, 2.0**-20, 0.0], dtype=dtype)
    up = formats.next_up(x)
    try:
        reference = torch.nextafter(x, torch.full_like(x, math.inf))
    except RuntimeError:  # older torch builds lack nextafter for some dtypes
        reference = None
    if reference is not None:
        assert torch.equal(up, reference)
    for value, nxt in zip(x.tolist(), up.tolist()):
        assert formats.ulp(value, dtype) == nxt - value
    assert math.isnan(formats.ulp(math.inf, dtype))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_spacing_curve(dtype):
    fmt = formats.get_format(dtype)
    curve = formats.spacing_curve(dtype, points=300)
    assert len(curve) > 100 and (curve.x.diff().dropna() > 0).all()
    assert (curve.spacing.diff().dropna() >= 0).all()  # the gap never shrinks as numbers grow
    normal = curve[curve.x >= fmt.smallest_normal]
    assert (normal.relative <= fmt.eps).all() and (normal.relative > fmt.eps / 2).all()
    assert curve.spacing.iloc[0] == fmt.smallest_subnormal and curve.relative.iloc[0] == 1.0


# ------------------------------------------------------------------------------------------------
# the explorer
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, value",
    [
        ("0.1", 0.1),
        (" -1e-8 ", -1e-8),
        ("inf", math.inf),
        ("-0.0", -0.0),
        ("2**-24", 2.0**-24),
        ("2^-24", 2.0**-24),
        ("-3*2**-24", -3 * 2.0**-24),
        ("2**2000", math.inf),
        ("1_000", 1000.0),
        (0.5, 0.5),
    ],
)
def test_parse_number(text, value):
    got = formats.parse_number(text)
    assert got == value and math.copysign(1, got) == math.copysign(1, value)


@pytest.mark.parametrize("text", ["abc", "", "22**5", "0.1.2", "2**"])
def test_parse_number_rejects_junk(text):
    with pytest.raises(ValueError, match="not a number"):
        formats.parse_number(text)


def test_explorer_table():
    table = formats.explorer_table(65510)
    assert list(table.index) == ["float32", "float16", "bfloat16"]
    assert table.loc["float16", "stored value"] == 65504.0 and table.loc["float16", "exponent"] == "11110"
    assert table.loc["bfloat16", "mantissa"] == decompose(65510, torch.bfloat16).mantissa
    assert {"sign", "kind", "abs error", "rel error", "what happened"} <= set(table.columns)


def test_explorer_html():
    page = formats.explorer_html("0.1")
    assert page.count("<tr>") == 4 and "#c62828" in page and "#1565c0" in page and "#ef6c00" in page
    assert repr(decompose(0.1, torch.float16).value) in page
    assert "not a number" in formats.explorer_html("zero point one")
    assert "inf" in formats.explorer_html(1e5)


def test_explorer_widget_redraws_on_typing_and_sliding():
    box = formats.format_explorer(0.1)
    first = box.output.value
    assert box.slider.value == pytest.approx(math.log2(0.1), abs=0.25)
    box.text.value = "65519"
    assert box.output.value != first and "65504.0" in box.output.value
    assert box.slider.value == pytest.approx(math.log2(65519), abs=0.25)
    box.slider.value = -24.0
    assert formats.parse_number(box.text.value) == 2.0**-24 and "5.960464477539063e-08" in box.output.value
    box.text.value = "-1e-3"
    box.slider.value = 3.0
    assert formats.parse_number(box.text.value) == -8.0  # the slider keeps the sign you typed
    box.text.value = "banana"
    assert "not a number" in box.output.value


def test_slider_position_is_on_the_grid_and_clamped():
    assert formats.slider_position("65519") == 16.0  # log2 65519 = 15.99996, on the 0.25 grid
    assert formats.slider_position("-0.1") == pytest.approx(-3.25)
    assert formats.slider_position("2**-24") == -24.0
    assert formats.slider_position("1e-60") == formats.SLIDER_RANGE[0]
    assert formats.slider_position("1e300") == formats.SLIDER_RANGE[1]
    for nowhere in ("0", "-0.0", "inf", "-inf", "nan", "banana", ""):
        assert formats.slider_position(nowhere) is None, nowhere


def test_typed_after_slide_keeps_the_typed_number_at_its_own_place():
    # the slider following the box (or snapping to its step and reporting back) is not a move
    for echo in (16.0, 15.99996, 15.9, 16.1):
        assert formats.typed_after_slide(echo, "65519") is None, echo
    assert formats.typed_after_slide(-150.0, "1e-60") is None  # clamped: still the typed number's place
    # a real move writes 2**position, with the sign that was typed
    assert formats.typed_after_slide(16.25, "65519") == repr(2.0**16.25)
    assert formats.typed_after_slide(3.0, "-1e-3") == "-8.0"
    assert formats.typed_after_slide(-24.0, "0") == repr(2.0**-24)
    assert formats.typed_after_slide(1.0, "-0.0") == "-2.0"
    assert formats.typed_after_slide(2.0, "banana") == "4.0"


def test_explorer_keeps_what_was_typed_when_the_slider_echoes():
    box = formats.format_explorer(0.1)
    box.text.value = "65519"
    assert box.slider.value == 16.0  # already on the step: a front end has nothing to snap
    box.slider.value = 15.99996  # what a front end that snapped differently would report back
    assert box.text.value == "65519"
    float16_row = box.output.value.split("<b>float16</b>")[1].split("</tr>")[0]
    assert "<code>65504.0</code>" in float16_row  # what float16 stores for 65519, as the lesson's quiz says
    box.slider.value = 16.25  # a real move
    assert box.text.value == repr(2.0**16.25) and "inf" in box.output.value


# ------------------------------------------------------------------------------------------------
# lesson 11's 8-bit formats: E4M3FN, E5M2 and (torch 2.7+) E8M0, against torch and ml_dtypes
# ------------------------------------------------------------------------------------------------

FLOAT8 = formats.FLOAT8_FORMATS


def float32_values(n=6000, seed=1):
    """Random float32 bit patterns, random magnitudes over float32's range, and the 8-bit formats' edges."""
    rng = random.Random(seed)
    values = [struct.unpack("<f", struct.pack("<I", rng.getrandbits(32)))[0] for _ in range(n)]
    values += [rng.choice((-1, 1)) * math.ldexp(rng.random(), rng.randint(-140, 130)) for _ in range(n)]
    for fmt in FLOAT8:
        for v in (fmt.max, fmt.smallest_normal, fmt.smallest_subnormal, fmt.overflow_threshold):
            values += [v, -v, v * 1.25, v * 0.75, v / 2, v * 2]
    values += [448.0, 464.0, 465.0, 480.0, 500.0, 57344.0, 61440.0, 1e6, 0.0, -0.0, 3.0, 1.5, 0.75, 2.0**-127]
    return torch.tensor(values, dtype=torch.float32).double().tolist()  # every value exactly a float32


@pytest.mark.parametrize("fmt", FLOAT8, ids=lambda f: f.name)
def test_eight_bit_decompose_matches_this_builds_torch_bit_for_bit(fmt):
    values = float32_values()
    stored = torch.tensor(values, dtype=torch.float32).to(fmt.dtype)
    direct = torch.tensor(values, dtype=fmt.dtype)  # a Python float's own route
    assert torch.equal(stored.view(torch.uint8), direct.view(torch.uint8))
    for x, bits, value in zip(values, stored.view(torch.uint8).tolist(), stored.double().tolist()):
        d = decompose(x, fmt.dtype)
        if math.isnan(value):
            assert d.kind == "nan" and math.isnan(d.value), (x, d)
            continue
        assert int(d.bits, 2) == bits and d.value == value, (x, d, bits, value)
        assert math.copysign(1, d.value) == math.copysign(1, value), x


@pytest.mark.parametrize("name", ["float8_e4m3fn", "float8_e5m2"])
def test_eight_bit_decompose_matches_ml_dtypes_non_saturating_casts(name):
    """ml_dtypes rounds to nearest even and turns E4M3FN overflow into NaN: an independent oracle."""
    ml_dtypes = pytest.importorskip("ml_dtypes")
    fmt = formats.get_format(name)
    values = float32_values(seed=2)
    with np.errstate(all="ignore"):
        oracle = np.array(values, np.float32).astype(getattr(ml_dtypes, name)).astype(np.float64).tolist()
    for x, want in zip(values, oracle):
        got = decompose(x, fmt.dtype, overflow="nan").value
        assert (math.isnan(got) and math.isnan(want)) or got == want, (x, got, want)


def test_e8m0_matches_ml_dtypes_where_both_define_it():
    """Positive normal float32 values below 1.5 * 2^127 round to the same power of two in torch's rule and in
    ml_dtypes; zero, negatives and float32 subnormals differ (torch: 2^-127 or |x|; ml_dtypes: NaN)."""
    ml_dtypes = pytest.importorskip("ml_dtypes")
    if formats.E8M0 is None or not hasattr(ml_dtypes, "float8_e8m0fnu"):
        pytest.skip(f"torch {torch.__version__} has no float8_e8m0fnu (torch 2.7+)")
    values = [v for v in float32_values(seed=3) if 2.0**-126 <= v < 1.5 * 2.0**127]
    with np.errstate(all="ignore"):
        oracle = np.array(values, np.float32).astype(ml_dtypes.float8_e8m0fnu).astype(np.float64).tolist()
    assert len(values) > 1000
    for x, want in zip(values, oracle):
        assert decompose(x, torch.float8_e8m0fnu).value == want, x
    assert math.isnan(float(np.float32(0.0).astype(ml_dtypes.float8_e8m0fnu)))  # where they differ
    assert (
        decompose(0.0, torch.float8_e8m0fnu).value == 2.0**-127 and "no zero" in decompose(0.0, "e8m0").note
    )


def test_eight_bit_format_constants_match_torch_finfo():
    for fmt in FLOAT8:
        info = torch.finfo(fmt.dtype)
        assert (fmt.max, fmt.smallest_normal, fmt.eps, fmt.bits) == (info.max, info.tiny, info.eps, info.bits)
    e4m3, e5m2 = formats.FLOAT8_E4M3FN, formats.FLOAT8_E5M2
    assert (e4m3.max, e4m3.smallest_subnormal, e4m3.overflow_threshold, e4m3.has_inf) == (
        448,
        2**-9,
        464,
        False,
    )
    assert (e5m2.max, e5m2.smallest_subnormal, e5m2.overflow_threshold, e5m2.has_inf) == (
        57344,
        2**-16,
        61440,
        True,
    )
    table = formats.finfo_table(FLOAT8)
    assert table.loc["float8_e4m3fn", "exponent bits"] == 4 and table.loc["float8_e5m2", "mantissa bits"] == 2
    if formats.E8M0 is not None:
        assert (
            table.loc["float8_e8m0fnu", "exponent bits"] == 8
            and table.loc["float8_e8m0fnu", "mantissa bits"] == 0
        )


def test_e4m3fn_overflow_follows_the_build_or_the_mode_asked_for():
    mode = formats.cast_overflow(torch.float8_e4m3fn)
    measured = torch.tensor([500.0]).to(torch.float8_e4m3fn).float().item()
    assert mode == ("nan" if math.isnan(measured) else "saturate")
    assert formats.cast_overflow(torch.float8_e5m2) == "inf"
    assert decompose(500.0, torch.float8_e4m3fn, overflow="saturate").value == 448.0
    assert math.isnan(decompose(500.0, torch.float8_e4m3fn, overflow="nan").value)
    assert decompose(464.0, "e4m3", overflow="nan").value == 448.0  # the tie rounds down to the even 448
    assert math.isnan(decompose(465.0, "e4m3", overflow="nan").value)
    assert decompose(-math.inf, "e4m3", overflow="saturate").value == -448.0
    assert "no infinity" in decompose(1e6, "e4m3").note
    assert decompose(61440.0, "e5m2").kind == "inf" and decompose(57344.0, "e5m2").kind == "normal"
    with pytest.raises(ValueError, match="overflow must be"):
        decompose(500.0, "e4m3", overflow="clip")


def test_eight_bit_fields_and_kinds():
    d = decompose(0.1, torch.float8_e4m3fn)
    assert (d.sign, d.exponent, d.mantissa, d.value, d.kind) == (0, "0011", "101", 0.1015625, "normal")
    assert decompose(2.0**-9, "e4m3").kind == "subnormal" and decompose(2.0**-11, "e4m3").kind == "zero"
    assert decompose(math.nan, "e4m3").bits == "01111111" and decompose(-math.nan, "e5m2").bits == "11111111"
    assert decompose(2.0**-16, "e5m2").kind == "subnormal" and len(decompose(1.0, "e5m2").mantissa) == 2
    if formats.E8M0 is not None:
        e = decompose(3.0, torch.float8_e8m0fnu)
        assert (e.exponent, e.mantissa, e.bits, e.value, e.kind) == (
            "10000001",
            "",
            "10000001",
            4.0,
            "normal",
        )
        assert decompose(-4.0, "e8m0").value == 4.0 and "no sign" in decompose(-4.0, "e8m0").note
        assert decompose(math.inf, "e8m0").kind == "nan" and decompose(1.5 * 2.0**127, "e8m0").kind == "nan"
        assert e.significand == 1.0 and e.exponent_value == 2


def test_the_explorer_shows_eight_bit_formats_when_asked():
    table = formats.explorer_table(500, formats=FLOAT8)
    assert list(table.index) == [f.name for f in FLOAT8]
    assert table.loc["float8_e5m2", "stored value"] == 512.0
    page = formats.explorer_html("500", formats=FLOAT8)
    assert page.count("<tr>") == 1 + len(FLOAT8) and "float8_e4m3fn" in page
    box = formats.format_explorer(0.1, formats=FLOAT8)
    box.text.value = "1e6"
    assert "float8_e5m2" in box.output.value and "inf" in box.output.value
    assert formats.explorer_table(500).index.tolist() == [
        "float32",
        "float16",
        "bfloat16",
    ]  # lesson 01's default
