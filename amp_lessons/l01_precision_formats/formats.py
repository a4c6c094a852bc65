"""Lesson 01: FP32, FP16 and BF16 down to the bits: what a number becomes when it is stored in each format.

A binary floating-point number is three fields: a **sign** bit, an **exponent** field ``E`` stored with a
*bias*, and a **mantissa** (fraction) field ``m``. For a *normal* number (``0 < E < all ones``) the value is
``(-1)^sign * 2^(E - bias) * 1.m``: the leading 1 is implicit, so ``mantissa_bits`` bits give
``mantissa_bits + 1`` significant bits. ``E == 0`` holds zero and the *subnormals*
``(-1)^sign * 2^(1 - bias) * 0.m``: they fill the gap between the smallest normal and zero with the same
spacing as the lowest binade, trading precision for range ("gradual underflow"). ``E == all ones`` holds
infinity (``m == 0``) and NaN (``m != 0``).

============  ======  ========  ========  ================================================
format        bits    exponent  mantissa  consequence
============  ======  ========  ========  ================================================
float32       32      8         23        range ~1e-45 .. 3.4e38, ~7 decimal digits
float16       16      5         10        range ~6e-8 .. 65504, ~3 decimal digits
bfloat16      16      8         7         float32's range, ~2 decimal digits
============  ======  ========  ========  ================================================

Storing a real number in a format rounds it to the nearest representable value, **ties to the one whose
last mantissa bit is 0** (round-to-nearest-even, IEEE 754's default). Rounding past the largest finite
value gives infinity: a value overflows only when it is at least ``max + ulp(max)/2`` (65520 for float16),
so 65510 still rounds *down* to 65504.

Lesson 11 adds the 8-bit formats: ``float8_e4m3fn`` (4 exponent, 3 mantissa bits; **no infinity**: the all-ones
exponent holds normal numbers up to 448 and only ``S.1111.111`` is NaN), ``float8_e5m2`` (IEEE-like, with inf, up to
57344) and, where torch has it (torch 2.7+), the scale format ``float8_e8m0fnu`` (8 exponent bits, no sign, no
mantissa, no zero: every value is a power of two from 2^-127 to 2^127, and 0xFF is NaN). What a cast to E4M3FN does
beyond 448 is a property of the *build*, not of the format: a saturating cast gives +-448, a non-saturating one NaN;
:func:`cast_overflow` probes this build's torch, and :func:`decompose` follows it unless told otherwise.

:func:`decompose` does this rounding with exact integer arithmetic (no cast), so the course can show *why* a
value is stored the way it is; the tests check it bit for bit against torch casts.
"""

from __future__ import annotations

import html
import math
import numbers
import re
import struct
from dataclasses import dataclass

import torch

KINDS = ("zero", "subnormal", "normal", "inf", "nan")


@dataclass(frozen=True)
class FloatFormat:
    """The layout of one binary floating-point format and the limits that follow from it.

    ``special`` says where the special values live: ``"ieee"`` (the all-ones exponent is inf and NaN), ``"fn"``
    (finite and NaN only, as E4M3FN: the all-ones exponent holds normals, all-ones mantissa there is NaN) or
    ``"e8m0"`` (exponent only, unsigned, no zero; 0xFF is NaN).
    """

    name: str
    dtype: torch.dtype
    exponent_bits: int
    mantissa_bits: int
    special: str = "ieee"

    @property
    def signed(self) -> bool:
        return self.special != "e8m0"

    @property
    def has_inf(self) -> bool:
        return self.special == "ieee"

    @property
    def bits(self) -> int:
        return int(self.signed) + self.exponent_bits + self.mantissa_bits

    @property
    def bias(self) -> int:
        return 2 ** (self.exponent_bits - 1) - 1

    @property
    def emin(self) -> int:
        """Exponent of the smallest normal number (subnormals share it)."""
        return -self.bias if self.special == "e8m0" else 1 - self.bias

    @property
    def emax(self) -> int:
        """Exponent of the largest finite number."""
        return self.bias + 1 if self.special == "fn" else self.bias

    @property
    def max(self) -> float:
        if self.special == "fn":  # the all-ones mantissa of the top binade is NaN: one step below it
            return math.ldexp(2.0 - 2.0 ** (1 - self.mantissa_bits), self.emax)
        return math.ldexp(2.0 - 2.0**-self.mantissa_bits, self.emax)

    @property
    def smallest_normal(self) -> float:
        return math.ldexp(1.0, self.emin)

    @property
    def smallest_subnormal(self) -> float:
        return math.ldexp(1.0, self.emin - self.mantissa_bits)

    @property
    def eps(self) -> float:
        """Gap between 1 and the next representable number."""
        return 2.0**-self.mantissa_bits

    @property
    def overflow_threshold(self) -> float:
        """The smallest magnitude that rounds to infinity: ``max + ulp(max)/2`` (a tie; to even = inf).

        For E4M3FN (no inf) it is the tie ``max + ulp(max)/2`` = 464, which rounds *down* to the even 448: only
        magnitudes strictly above it overflow (to NaN, or to 448 on a saturating cast)."""
        if self.special == "fn":
            return self.max + math.ldexp(1.0, self.emax - self.mantissa_bits - 1)
        return math.ldexp(2.0 - 2.0 ** -(self.mantissa_bits + 1), self.emax)

    def log2(self) -> tuple[float, float, float]:
        """(log2 smallest subnormal, log2 smallest normal, log2 max): -24, -14, ~16 for float16."""
        return (math.log2(self.smallest_subnormal), math.log2(self.smallest_normal), math.log2(self.max))


FLOAT32 = FloatFormat("float32", torch.float32, 8, 23)
FLOAT16 = FloatFormat("float16", torch.float16, 5, 10)
BFLOAT16 = FloatFormat("bfloat16", torch.bfloat16, 8, 7)
FORMATS = (FLOAT32, FLOAT16, BFLOAT16)
FLOAT8_E4M3FN = FloatFormat("float8_e4m3fn", torch.float8_e4m3fn, 4, 3, "fn")
FLOAT8_E5M2 = FloatFormat("float8_e5m2", torch.float8_e5m2, 5, 2)
# the MX scale format: torch 2.7 and later (torch 2.4 has no such dtype, and then no E8M0 here)
E8M0 = (
    FloatFormat("float8_e8m0fnu", torch.float8_e8m0fnu, 8, 0, "e8m0")
    if hasattr(torch, "float8_e8m0fnu")
    else None
)
FLOAT8_FORMATS = tuple(fmt for fmt in (FLOAT8_E4M3FN, FLOAT8_E5M2, E8M0) if fmt is not None)
ALL_FORMATS = FORMATS + FLOAT8_FORMATS
OVERFLOW_MODES = ("saturate", "nan")

_ALIASES = {
    "float32": FLOAT32,
    "fp32": FLOAT32,
    "float": FLOAT32,
    "single": FLOAT32,
    "float16": FLOAT16,
    "fp16": FLOAT16,
    "half": FLOAT16,
    "bfloat16": BFLOAT16,
    "bf16": BFLOAT16,
    "float8_e4m3fn": FLOAT8_E4M3FN,
    "e4m3fn": FLOAT8_E4M3FN,
    "e4m3": FLOAT8_E4M3FN,
    "fp8_e4m3": FLOAT8_E4M3FN,
    "float8_e5m2": FLOAT8_E5M2,
    "e5m2": FLOAT8_E5M2,
    "fp8_e5m2": FLOAT8_E5M2,
}
if E8M0 is not None:
    _ALIASES.update({"float8_e8m0fnu": E8M0, "e8m0": E8M0})
_SUPPORTED = (
    "torch.float32, torch.float16 or torch.bfloat16 (or the strings 'float32', 'float16', 'bfloat16')"
)


def get_format(dtype) -> FloatFormat:
    """The :class:`FloatFormat` for ``torch.float32/float16/bfloat16`` (or their names); clear errors else."""
    if isinstance(dtype, FloatFormat):
        return dtype
    if isinstance(dtype, torch.dtype):
        for fmt in ALL_FORMATS:
            if fmt.dtype == dtype:
                return fmt
        raise ValueError(f"{dtype} is not one of the formats this course decomposes; use {_SUPPORTED}.")
    if isinstance(dtype, str):
        key = dtype.strip().lower().removeprefix("torch.")
        if key in _ALIASES:
            return _ALIASES[key]
        raise ValueError(f"Unknown format {dtype!r}; use {_SUPPORTED}.")
    raise TypeError(
        f"dtype must be a torch dtype such as torch.float16, not a {type(dtype).__name__}; use {_SUPPORTED}."
    )


def _as_float(x) -> float:
    """A Python float for a real number (int, float, NumPy scalar, one-element tensor); clear errors else."""
    if isinstance(x, torch.Tensor):
        if x.numel() != 1:
            raise ValueError(
                f"decompose takes one number, but got a tensor with {x.numel()} elements; pass t.item()."
            )
        if x.is_complex():
            raise TypeError("decompose takes a real number, not a complex tensor.")
        return float(x.item())
    if isinstance(x, bool) or not isinstance(x, numbers.Real):
        # NumPy scalars and one-element arrays
        if hasattr(x, "dtype") and hasattr(x, "item") and getattr(x, "size", 2) == 1:
            return _as_float(x.item())
        hint = " Convert it first, e.g. float('0.1')." if isinstance(x, str) else ""
        raise TypeError(f"decompose takes a real number such as 0.1, not a {type(x).__name__} ({x!r}).{hint}")
    try:
        return float(x)
    except OverflowError:  # a Python int or Fraction beyond float64: beyond every format too
        return math.inf if x > 0 else -math.inf


# --------------------------------------------------------------------------------------------------
# Rounding with integers: the fields of the nearest representable value
# --------------------------------------------------------------------------------------------------


def encode(x: float, fmt: FloatFormat, overflow: str = "nan") -> tuple[int, int, int]:
    """``(sign, biased_exponent, mantissa)`` of ``x`` rounded once to ``fmt``, ties to even.

    How: write ``|x| = q * 2^(e - mantissa_bits)`` where ``e`` is the exponent of ``|x|``'s leading bit, but
    never below ``emin`` (that clamp is what makes subnormals: below the smallest normal the spacing stays
    ``2^(emin - mantissa_bits)``). Then ``q`` is a real number with at most ``mantissa_bits + 1`` integer
    bits, and rounding the number to the format is rounding ``q`` to an integer, ties to even (Python's
    ``round``). If that carries into a new bit the exponent grows by one; past ``emax`` the result is
    infinity.

    A format with no infinity (E4M3FN) overflows to NaN (``overflow="nan"``, a non-saturating cast, as
    ml_dtypes) or to +-max (``"saturate"``, as torch's CPU cast since 2026); E8M0 has its own rule
    (:func:`encode_e8m0`).
    """
    if fmt.special == "e8m0":
        return encode_e8m0(x)
    if fmt.special == "fn":
        return _encode_finite(x, fmt, overflow)
    sign = 1 if math.copysign(1.0, x) < 0 else 0
    all_ones = 2**fmt.exponent_bits - 1
    if math.isnan(x):
        return sign, all_ones, 1 << (fmt.mantissa_bits - 1)  # a quiet NaN
    magnitude = abs(x)
    if math.isinf(magnitude):
        return sign, all_ones, 0
    if magnitude == 0.0:
        return sign, 0, 0
    exponent = max(math.frexp(magnitude)[1] - 1, fmt.emin)
    # exact scaling by a power of two, then round to nearest, ties to even
    q = round(math.ldexp(magnitude, fmt.mantissa_bits - exponent))
    if q == 2 ** (fmt.mantissa_bits + 1):  # rounding carried into the next binade (e.g. 1.111..1 -> 10.0)
        q //= 2
        exponent += 1
    if exponent > fmt.emax:
        return sign, all_ones, 0  # overflow: rounds to infinity
    hidden = 2**fmt.mantissa_bits
    if q >= hidden:
        return sign, exponent + fmt.bias, q - hidden
    return sign, 0, q  # subnormal (or zero when everything rounded away)


def _encode_finite(x: float, fmt: FloatFormat, overflow: str) -> tuple[int, int, int]:
    """:func:`encode` for a format without infinity: the IEEE rounding, with overflow to NaN or to +-max."""
    if overflow not in OVERFLOW_MODES:
        raise ValueError(f"overflow must be one of {OVERFLOW_MODES}; got {overflow!r}.")
    sign = 1 if math.copysign(1.0, x) < 0 else 0
    all_ones, nan_mantissa = 2**fmt.exponent_bits - 1, 2**fmt.mantissa_bits - 1
    saturated = (
        (sign, all_ones, nan_mantissa - 1) if overflow == "saturate" else (sign, all_ones, nan_mantissa)
    )
    if math.isnan(x):
        return sign, all_ones, nan_mantissa
    magnitude = abs(x)
    if math.isinf(magnitude) or magnitude > fmt.overflow_threshold:
        return saturated
    if magnitude == 0.0:
        return sign, 0, 0
    exponent = max(math.frexp(magnitude)[1] - 1, fmt.emin)
    q = round(math.ldexp(magnitude, fmt.mantissa_bits - exponent))
    if q == 2 ** (fmt.mantissa_bits + 1):
        q //= 2
        exponent += 1
    hidden = 2**fmt.mantissa_bits
    if q >= hidden:
        return sign, exponent + fmt.bias, q - hidden
    return sign, 0, q


def encode_e8m0(x: float) -> tuple[int, int, int]:
    """``(0, biased_exponent, 0)`` of ``x`` in E8M0, by torch's rule on the float32 bits of ``x``.

    E8M0 has no sign, no zero and no mantissa: torch keeps float32's exponent field and rounds the significand
    to nearest, ties up (1.5 * 2^k becomes 2^(k+1)); the sign is dropped, zero and everything below 2^-127
    become 2^-127 (torch also rounds a float32 subnormal above 2^-127 up to 2^-126), inf and NaN become NaN
    (0xFF), and rounding up from 2^127 gives NaN too. ml_dtypes differs on zero, negatives and subnormals (NaN).
    """
    bits = struct.unpack("<I", struct.pack("<f", x))[0] if math.isfinite(x) else 0xFF << 23
    exponent = (bits >> 23) & 0xFF
    if exponent == 0xFF:
        return 0, 0xFF, 0
    guard, round_bit, sticky = bool(bits & 0x400000), bool(bits & 0x200000), bool(bits & 0x1FFFFF)
    if guard and (round_bit or sticky or exponent > 0):
        exponent += 1  # 254 -> 255: NaN
    return 0, exponent, 0


def decode(sign: int, biased_exponent: int, mantissa: int, fmt: FloatFormat) -> float:
    """The value of the fields ``(sign, biased_exponent, mantissa)`` in ``fmt`` as a Python float (exact)."""
    all_ones = 2**fmt.exponent_bits - 1
    if fmt.special == "e8m0":
        return math.nan if biased_exponent == all_ones else math.ldexp(1.0, biased_exponent - fmt.bias)
    if biased_exponent == all_ones and fmt.special == "fn":  # no inf: normals, and one NaN pattern
        if mantissa == 2**fmt.mantissa_bits - 1:
            return math.nan
        magnitude = math.ldexp(
            mantissa + 2**fmt.mantissa_bits, biased_exponent - fmt.bias - fmt.mantissa_bits
        )
    elif biased_exponent == all_ones:
        magnitude = math.nan if mantissa else math.inf
    elif biased_exponent == 0:
        magnitude = math.ldexp(mantissa, fmt.emin - fmt.mantissa_bits)
    else:
        magnitude = math.ldexp(
            mantissa + 2**fmt.mantissa_bits, biased_exponent - fmt.bias - fmt.mantissa_bits
        )
    return -magnitude if sign else magnitude


def round_to(x: float, dtype, overflow: str = "nan") -> float:
    """``x`` rounded once to the format (IEEE round-to-nearest-even), as a Python float."""
    fmt = get_format(dtype)
    return decode(*encode(_as_float(x), fmt, overflow), fmt)


_OVERFLOW_PROBE = {}


def cast_overflow(dtype=torch.float8_e4m3fn) -> str:
    """What *this build's* ``tensor.to(float8_e4m3fn)`` does beyond the largest finite value: ``"saturate"``
    (500 -> 448, torch's CPU cast since 2026) or ``"nan"`` (500 -> NaN: torch 2.4, and ml_dtypes). Measured
    once per process; ``"inf"`` for a format that has infinity."""
    fmt = get_format(dtype)
    if fmt.special != "fn":
        return "inf"
    if fmt.name not in _OVERFLOW_PROBE:
        stored = torch.tensor([2 * fmt.max], dtype=torch.float32).to(fmt.dtype).float().item()
        _OVERFLOW_PROBE[fmt.name] = "nan" if math.isnan(stored) else "saturate"
    return _OVERFLOW_PROBE[fmt.name]


@dataclass(frozen=True)
class Decomposition:
    """What ``x`` becomes in one format: its three bit fields, the stored value, its kind and the error."""

    x: float
    format: FloatFormat
    sign: int
    exponent: str
    mantissa: str
    value: float
    kind: str
    overflow: str = "nan"

    @property
    def dtype(self) -> torch.dtype:
        return self.format.dtype

    @property
    def bits(self) -> str:
        if not self.format.signed:
            return f"{self.exponent}{self.mantissa}"
        return f"{self.sign}{self.exponent}{self.mantissa}"

    @property
    def exponent_value(self) -> int | None:
        """The power of two the significand is scaled by (``emin`` for subnormals); None: zero, inf, NaN."""
        if self.kind == "normal":
            return int(self.exponent, 2) - self.format.bias
        if self.kind == "subnormal":
            return self.format.emin
        return None

    @property
    def significand(self) -> float | None:
        """``1.m`` for normal numbers, ``0.m`` for subnormals, as a float; None otherwise."""
        if self.kind not in ("normal", "subnormal"):
            return None
        lead = 1 if self.kind == "normal" else 0
        return lead + int(self.mantissa or "0", 2) / 2 ** len(self.mantissa)

    @property
    def abs_error(self) -> float:
        """``|stored - x|`` (inf when a finite x overflowed; NaN when x is NaN)."""
        if math.isnan(self.x) or math.isnan(self.value):
            return math.nan
        if self.value == self.x:
            return 0.0
        return abs(self.value - self.x)

    @property
    def rel_error(self) -> float:
        """``|stored - x| / |x|`` (0 for an exact zero, inf for x == 0 stored as non-zero, NaN for NaN)."""
        error = self.abs_error
        if math.isnan(error) or error == 0.0:
            return error
        return error / abs(self.x) if self.x != 0 and not math.isinf(self.x) else math.inf

    @property
    def outcome(self) -> str:
        """``exact``, ``rounded``, ``overflow`` (finite -> inf), ``underflow`` (non-zero -> 0) or ``nan``."""
        if self.kind == "nan":
            return "nan"
        if self.value == self.x:
            return "exact"
        if self.kind == "inf":
            return "overflow"
        if self.kind == "zero":
            return "underflow"
        return "rounded"

    @property
    def note(self) -> str:
        """One sentence on what happened to x, for tables and the explorer."""
        fmt = self.format
        if fmt.special != "ieee" or fmt in FLOAT8_FORMATS:
            return _eight_bit_note(self)
        if self.kind == "nan":
            return "NaN stays NaN"
        once = round_to(self.x, fmt)
        if not (once == self.value or math.isnan(once)):
            via = round_to(self.x, FLOAT32)
            return (
                f"rounded twice, like torch: to float32 first ({via!r}), then to {fmt.name} "
                f"(rounding once would give {once!r})"
            )
        if self.outcome == "overflow":
            return f"overflow: |x| >= {fmt.overflow_threshold:.6g} rounds to inf"
        if self.outcome == "underflow":
            return f"underflow: |x| <= {fmt.smallest_subnormal / 2:.3g} rounds to zero"
        if abs(self.value) == fmt.max and abs(self.x) > fmt.max:
            return "just above max: rounds down to max"
        if self.outcome == "exact":
            return "exact" + (" (subnormal)" if self.kind == "subnormal" else "")
        if self.kind == "subnormal":
            bits = int(self.mantissa, 2).bit_length()
            return f"rounded; subnormal, only {bits} significant bit{'s' if bits != 1 else ''} left"
        return "rounded to nearest" + (" (up into the normals)" if abs(self.x) < fmt.smallest_normal else "")

    def as_dict(self) -> dict:
        return {
            "format": self.format.name,
            "x": self.x,
            "sign": self.sign,
            "exponent": self.exponent,
            "mantissa": self.mantissa,
            "stored value": self.value,
            "kind": self.kind,
            "abs error": self.abs_error,
            "rel error": self.rel_error,
            "what happened": self.note,
        }

    def __str__(self) -> str:
        return (
            f"{self.format.name}: {self.sign} {self.exponent} {self.mantissa} -> {self.value!r} "
            f"({self.kind}; abs error {self.abs_error:.3g}, rel error {self.rel_error:.3g})"
        )

    def _repr_html_(self) -> str:
        return (
            f"<div>{bits_html(self)} &rarr; <code>{self.value!r}</code> "
            f"({self.kind}; {html.escape(self.note)})</div>"
        )


def _eight_bit_note(d: Decomposition) -> str:
    """:attr:`Decomposition.note` for the 8-bit formats (lesson 11): their special values differ."""
    fmt, x = d.format, d.x
    if math.isnan(x):
        return "NaN stays NaN"
    if fmt.special == "e8m0":
        if math.isinf(x):
            return "E8M0 has no infinity: inf becomes NaN (0xFF)"
        if x == 0 or abs(x) < fmt.smallest_normal:
            return "E8M0 has no zero: torch stores 2^-127, its smallest value (ml_dtypes gives NaN)"
        if d.kind == "nan":
            return "beyond 2^127 E8M0 has only NaN"
        sign = "no sign bit: |x| kept; " if x < 0 else ""
        return sign + (
            "exact: a power of two"
            if d.value == abs(x)
            else f"rounded to the power of two 2^{d.exponent_value}"
        )
    if fmt.special == "fn" and (math.isinf(x) or abs(x) > fmt.overflow_threshold):
        if d.kind == "nan":
            return f"no infinity in {fmt.name}: |x| > {fmt.overflow_threshold:g} becomes NaN (a non-saturating cast)"
        return (
            f"no infinity in {fmt.name}: this cast saturates |x| > {fmt.overflow_threshold:g} to {fmt.max:g}"
        )
    if d.outcome == "overflow":
        return f"overflow: |x| >= {fmt.overflow_threshold:.6g} rounds to inf"
    if d.outcome == "underflow":
        return f"underflow: |x| <= {fmt.smallest_subnormal / 2:.3g} rounds to zero"
    if abs(d.value) == fmt.max and abs(x) > fmt.max:
        return "just above max: rounds down to max"
    if d.outcome == "exact":
        return "exact" + (" (subnormal)" if d.kind == "subnormal" else "")
    return "rounded to nearest" + (" (subnormal)" if d.kind == "subnormal" else "")


def decompose(x, dtype, *, overflow: str | None = None) -> Decomposition:
    """Split ``x`` as it is stored in ``dtype`` (torch.float32, float16 or bfloat16) into its fields.

    Returns a :class:`Decomposition` with ``sign`` (0/1), ``exponent`` and ``mantissa`` (bit strings: 8/23
    bits for float32, 5/10 for float16, 8/7 for bfloat16), ``value`` (the float actually stored), ``kind``
    (``"zero"``, ``"subnormal"``, ``"normal"``, ``"inf"``, ``"nan"``) and ``abs_error`` / ``rel_error`` of
    ``value`` against ``x``.

    ``value`` is what ``torch.tensor(x, dtype=dtype)`` stores. Torch turns a Python float (a float64) into a
    float16/bfloat16 *through float32*, so this function does the same: round to float32, then to the target.
    For every float32 number (every element of a float32 tensor, so every value AMP casts) that is the single
    IEEE rounding; only a float64 that lies within 2^-24 (relative) of a tie can land one step away from the
    single rounding of the float64 itself (e.g. 65519.999999 -> inf, where exact rounding would give 65504).

    Negative zero keeps its sign; NaN and +-inf pass through; a finite x that rounds beyond ``max`` becomes
    +-inf (only ``|x| >= max + ulp(max)/2`` does: 65510 rounds down to 65504 in float16).

    Lesson 11's 8-bit formats work too (``torch.float8_e4m3fn``, ``torch.float8_e5m2`` and, on torch 2.7+,
    ``torch.float8_e8m0fnu``; E8M0 has no sign bit and no mantissa, so ``mantissa`` is ``""`` and ``bits`` has 8
    digits). E4M3FN has no infinity: beyond 464 it becomes NaN or saturates to +-448 depending on the cast;
    ``overflow`` (``"nan"`` or ``"saturate"``) picks one, and by default it is what this build's torch cast does
    (:func:`cast_overflow`).
    """
    fmt = get_format(dtype)
    value = _as_float(x)
    if fmt is not FLOAT32 and math.isfinite(value):
        via = round_to(value, FLOAT32)  # torch's route for a Python float: float64 -> float32 -> target
    else:
        via = value
    if overflow is None:
        overflow = cast_overflow(fmt.dtype) if fmt.special == "fn" else "nan"
    sign, biased, mantissa = encode(via, fmt, overflow)
    if math.isnan(via) and fmt is BFLOAT16:
        sign = 0  # torch's bfloat16 conversion returns the canonical NaN 0x7FC0, whatever the sign
    if math.isnan(via) and fmt in FLOAT8_FORMATS:
        mantissa = 2**fmt.mantissa_bits - 1  # torch's 8-bit NaN: all ones (0x7F, 0xFF)
    stored = decode(sign, biased, mantissa, fmt)
    all_ones = 2**fmt.exponent_bits - 1
    if fmt.special != "ieee":
        kind = "nan" if math.isnan(stored) else ("zero" if stored == 0 else "normal")
        if stored != 0 and biased == 0 and fmt.special == "fn":
            kind = "subnormal"
    elif biased == all_ones:
        kind = "nan" if mantissa else "inf"
    elif biased == 0:
        kind = "subnormal" if mantissa else "zero"
    else:
        kind = "normal"
    return Decomposition(
        x=value,
        format=fmt,
        sign=sign,
        exponent=format(biased, f"0{fmt.exponent_bits}b"),
        mantissa=format(mantissa, f"0{fmt.mantissa_bits}b") if fmt.mantissa_bits else "",
        value=stored,
        kind=kind,
        overflow=overflow,
    )


def ulp(x, dtype) -> float:
    """Spacing between the stored ``x`` and the next number away from zero (``inf`` past max)."""
    d = decompose(x, dtype)
    if d.kind in ("inf", "nan"):
        return math.nan
    fmt = d.format
    if d.kind in ("zero", "subnormal"):
        return fmt.smallest_subnormal
    return math.ldexp(1.0, d.exponent_value - fmt.mantissa_bits)


# --------------------------------------------------------------------------------------------------
# Tables and pictures
# --------------------------------------------------------------------------------------------------


def finfo_table(formats=FORMATS):
    """One row per format, every number taken from ``torch.finfo`` (smallest subnormal = tiny * eps).

    ``torch.finfo`` has no field for the smallest subnormal; it is one mantissa step above zero in the lowest
    binade, ``smallest_normal * eps``. Exponent and mantissa widths follow from ``bits`` and
    ``eps = 2^-mantissa``. ``formats`` (default FP32, FP16, BF16) may name lesson 11's 8-bit formats too
    (E8M0 has no sign bit and no subnormals: its smallest subnormal is its smallest value, 2^-127).
    """
    import pandas as pd

    rows = []
    for fmt in (get_format(f) for f in formats):
        info = torch.finfo(fmt.dtype)
        mantissa = round(-math.log2(info.eps))
        rows.append(
            {
                "format": fmt.name,
                "bits": info.bits,
                "exponent bits": info.bits - int(fmt.signed) - mantissa,
                "mantissa bits": mantissa,
                "max": info.max,
                "smallest normal": info.tiny,
                "smallest subnormal": info.tiny * info.eps,
                "eps (1 -> next)": info.eps,
                "decimal digits": round(-math.log10(info.eps), 1),
            }
        )
    return pd.DataFrame(rows).set_index("format")


def next_up(t: torch.Tensor) -> torch.Tensor:
    """The next representable number above each (finite, non-negative) element of a float tensor.

    For non-negative floats the bit patterns, read as integers, are in the same order as the values: the next
    float up is the next integer. That works on every device and torch version (``torch.nextafter`` does not
    support float16/bfloat16 everywhere).
    """
    int_type = {torch.float32: torch.int32, torch.float16: torch.int16, torch.bfloat16: torch.int16}.get(
        t.dtype, torch.uint8
    )
    return (t.view(int_type) + 1).view(t.dtype)


def spacing_curve(dtype, points: int = 600, device=None):
    """Spacing to the next number up for ``points`` magnitudes spread log-uniformly over the finite range.

    Returns a DataFrame with columns ``x`` (a representable positive number), ``spacing`` (next_up(x) - x) and
    ``relative`` (spacing / x), computed with real tensors of ``dtype`` on ``device`` (default: the CPU).
    """
    import pandas as pd

    fmt = get_format(dtype)
    exponents = torch.linspace(
        math.log2(fmt.smallest_subnormal), math.log2(fmt.max), points, dtype=torch.float64
    )
    # an exact round trip: every x is a number of the format
    x = torch.exp2(exponents).to(fmt.dtype).double().unique().to(fmt.dtype).to(device or "cpu")
    x = x[torch.isfinite(x) & (x > 0) & (x < fmt.max)]
    spacing = (next_up(x).double() - x.double()).cpu()
    x64 = x.double().cpu()
    return pd.DataFrame({"x": x64.numpy(), "spacing": spacing.numpy(), "relative": (spacing / x64).numpy()})


_COLOURS = {"sign": "#c62828", "exponent": "#1565c0", "mantissa": "#ef6c00"}


def bits_html(d: Decomposition) -> str:
    """The bit fields as coloured monospace HTML: sign red, exponent blue, mantissa orange."""
    parts = []
    fields = (("sign", str(d.sign)), ("exponent", d.exponent), ("mantissa", d.mantissa))
    for field, text in fields if d.format.signed else fields[1:]:
        if not text:
            continue
        parts.append(f"<span title='{field}' style='color:{_COLOURS[field]};font-weight:bold'>{text}</span>")
    return "<code style='font-size:110%;letter-spacing:1px'>" + "&nbsp;".join(parts) + "</code>"


def parse_number(text) -> float:
    """Read a typed number: ``0.1``, ``-1e-8``, ``inf``, ``nan``, ``-0.0``, ``2**-24`` or ``2^-24``."""
    if not isinstance(text, str):
        return _as_float(text)
    cleaned = text.strip().replace(" ", "").replace("_", "")
    try:
        return float(cleaned)
    except ValueError:
        pass
    power = re.fullmatch(r"([+-]?)(?:(\d+(?:\.\d*)?)\*)?2(?:\*\*|\^)\(?([+-]?\d{1,5})\)?", cleaned)
    if power:
        factor = float(power.group(2)) if power.group(2) else 1.0
        exponent = max(min(int(power.group(3)), 5000), -5000)
        try:
            value = math.ldexp(factor, exponent)
        except OverflowError:
            value = math.inf
        return -value if power.group(1) == "-" else value
    raise ValueError(f"{text!r} is not a number. Type e.g. 0.1, 1e-8, 65519, -0.0, inf, nan or 2**-24.")


def explorer_table(x, formats=FORMATS):
    """One row per format: sign/exponent/mantissa bits, stored value, errors, kind, what happened to ``x``."""
    import pandas as pd

    rows = [decompose(x, get_format(fmt).dtype).as_dict() for fmt in formats]
    return pd.DataFrame(rows).set_index("format").drop(columns="x")


def _number(value: float) -> str:
    return repr(value) if not math.isfinite(value) or value == 0 else f"{value:.10g}"


def explorer_html(x, formats=FORMATS) -> str:
    """The explorer's picture of ``x``: coloured bits per format, stored value, error, what happened."""
    try:
        value = parse_number(x)
    except (TypeError, ValueError) as exc:
        return f"<div style='color:#c62828'>{html.escape(str(exc))}</div>"
    head = (
        f"<div style='margin:4px 0'>x = <code>{value!r}</code> &nbsp; "
        + " ".join(f"<span style='color:{c}'>■ {n}</span>" for n, c in _COLOURS.items())
        + "</div>"
    )
    rows = []
    for fmt in (get_format(f) for f in formats):
        d = decompose(value, fmt.dtype)
        rows.append(
            f"<tr><td><b>{fmt.name}</b></td><td>{bits_html(d)}</td><td><code>{d.value!r}</code></td>"
            f"<td>{_number(d.abs_error)}</td><td>{_number(d.rel_error)}</td><td>{d.kind}</td>"
            f"<td>{html.escape(d.note)}</td></tr>"
        )
    columns = (
        "format",
        "sign | exponent | mantissa",
        "stored value",
        "abs error",
        "rel error",
        "kind",
        "what happened",
    )
    header = "".join(f"<th style='text-align:left'>{h}</th>" for h in columns)
    return f"{head}<table><tr>{header}</tr>{''.join(rows)}</table>"


SLIDER_RANGE = (-150.0, 130.0)
SLIDER_STEP = 0.25


def slider_position(
    typed, step: float = SLIDER_STEP, low: float = SLIDER_RANGE[0], high: float = SLIDER_RANGE[1]
):
    """Where the explorer's ``log2 |x|`` slider goes for a typed number: ``log2|x|`` on the slider's grid.

    Rounded to a multiple of ``step`` and clamped to ``[low, high]``, so the slider never has to snap (a slider
    that snaps reports its new position back, and that echo used to overwrite the typed number: 65519 became
    2**16 = 65536). None for zero, infinities, NaN and text that is not a number: the slider stays where it is.
    """
    try:
        value = abs(parse_number(typed))
    except (TypeError, ValueError):
        return None
    if not (math.isfinite(value) and value > 0):
        return None
    return min(max(round(math.log2(value) / step) * step, low), high)


def typed_after_slide(
    position: float,
    typed,
    step: float = SLIDER_STEP,
    low: float = SLIDER_RANGE[0],
    high: float = SLIDER_RANGE[1],
):
    """The text box's new contents when the slider reports ``position``; None keeps what the learner typed.

    A position that is the typed number's own place on the slider (:func:`slider_position`, within half a step)
    is the slider following the box, not the learner moving it: the typed text stays. Any other position is a
    move: the box gets ``2**position`` with the sign that was typed.
    """
    own = slider_position(typed, step, low, high)
    if own is not None and abs(own - position) < step / 2:
        return None
    try:
        negative = math.copysign(1.0, parse_number(typed)) < 0
    except (TypeError, ValueError):
        negative = False
    magnitude = 2.0**position
    return repr(-magnitude if negative else magnitude)


def format_explorer(x: float | str = 0.1, formats=FORMATS):
    """A widget: type a number or drag log2|x|, see its bits, stored value and error in each format
    (FP32, FP16 and BF16 unless ``formats`` names others, e.g. lesson 11's ``FLOAT8_FORMATS``).

    The picture is :func:`explorer_html` of the text in the box; the slider follows the box
    (:func:`slider_position`) and moving it writes a new number into the box (:func:`typed_after_slide`), but
    never over a typed number whose place it is only showing.
    """
    import ipywidgets as widgets

    text = widgets.Text(
        value=str(x),
        description="x =",
        continuous_update=False,
        placeholder="0.1, 1e-8, 65519, -0.0, inf, nan, 2**-24",
    )
    slider = widgets.FloatSlider(
        value=0.0,
        min=SLIDER_RANGE[0],
        max=SLIDER_RANGE[1],
        step=SLIDER_STEP,
        description="log2 |x|",
        continuous_update=True,
        readout_format=".2f",
        layout=widgets.Layout(width="600px"),
    )
    out = widgets.HTML(value=explorer_html(text.value, formats))

    def follow_text(typed):
        position = slider_position(typed, slider.step, slider.min, slider.max)
        if position is not None:
            slider.value = position  # on_slider sees its own place and keeps the text

    def on_text(change):
        out.value = explorer_html(change["new"], formats)
        follow_text(change["new"])

    def on_slider(change):
        typed = typed_after_slide(change["new"], text.value, slider.step, slider.min, slider.max)
        if typed is not None:
            text.value = typed  # on_text redraws the picture

    text.observe(on_text, names="value")
    slider.observe(on_slider, names="value")
    follow_text(text.value)
    box = widgets.VBox([widgets.HBox([text, slider]), out])
    box.text, box.slider, box.output = text, slider, out  # handles for tests and for driving it from code
    return box
