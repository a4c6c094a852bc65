"""Lesson 11's checker: exercise 11.1, ``quantize_blocks`` (block scaling, E8M0-style power-of-two scales).

The check runs the learner's function on fixed cases (both FP8 formats, both scale rules, an all-zero block,
blocks of very different sizes in one row, several shapes, a width that is not a multiple of the block) and judges
behaviour only: the shapes and dtypes, one finite positive scale per block, the reconstruction ``q * scale`` within
the format's rounding, nothing NaN/inf, and the scale rule. When a case fails, a table of named rules (most specific
first) compares the learner's scales with the scales known wrong answers would produce.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from amp_lessons.checks.harness import call_learner, checker, passed, stop
from amp_lessons.checks.mistakes import first_mistake, rule
from amp_lessons.l11_below_16_bits.scaling import block_scales, fp8_max

E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2
OTHER = {E4M3: E5M2, E5M2: E4M3}


def _name(dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _matrix(rows: int, cols: int, seed: int) -> torch.Tensor:
    """Values whose size changes from block to block by up to 2^12: every block needs its own scale."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, cols, generator=g)
    return x * torch.exp2(torch.randint(-6, 7, (rows, cols // 4), generator=g).float()).repeat_interleave(
        4, dim=1
    )


def _cases():
    x = _matrix(6, 64, 0)
    x[1, 16:32] = 0.0  # one all-zero block of 16
    edge = torch.tensor([448.0, -56.0, 1.0, 2.0, -3.0, 0.5, 7.0, 9.0]) * 2**-3
    x[4, :16] = edge.repeat(2)  # a block whose amax / 448 is exactly 2^-3: the smallest fitting scale is 2^-3
    y = _matrix(4, 96, 1)
    return [
        ("E4M3FN, block 16", x, 16, E4M3, False),
        ("E5M2, block 16", x, 16, E5M2, False),
        (
            "E5M2, block 32, power_of_two",
            y,
            32,
            E5M2,
            True,
        ),  # before E4M3: an unsaturated E5M2 cast gives inf
        ("E4M3FN, block 16, power_of_two", x, 16, E4M3, True),
        ("E4M3FN, block 32", y, 32, E4M3, False),
        ("E4M3FN, block 8, power_of_two", _matrix(3, 24, 2), 8, E4M3, True),
    ]


@dataclass
class Seen:
    """What one case showed: the inputs and the learner's ``(q, scales)`` (float32 copies for the rules)."""

    label: str
    x: torch.Tensor
    block: int
    dtype: torch.dtype
    power_of_two: bool
    q: torch.Tensor | None = None
    scales: torch.Tensor | None = None
    problem: str = ""

    @property
    def rows(self) -> int:
        return self.x.shape[0]

    @property
    def blocks(self) -> int:
        return self.x.shape[1] // self.block

    def amax(self, width=None, strided=False) -> torch.Tensor:
        width = width or self.block
        if strided:  # element j of every block grouped together: blocks along the wrong axis
            return self.x.reshape(self.rows, width, -1).abs().amax(dim=1)
        return self.x.reshape(self.rows, -1, width).abs().amax(dim=2)

    def expected(self, dtype=None, rule=None) -> torch.Tensor:
        rule = rule or ("ceil" if self.power_of_two else "amax")
        return block_scales(self.amax(), dtype or self.dtype, rule)

    def scales_like(self, other: torch.Tensor, rtol: float = 1e-4) -> bool:
        """The learner's scales equal ``other`` (broadcast to one per block) where the block is not all zero."""
        if self.scales is None:
            return False
        target = (
            other.float().expand(self.rows, self.blocks) if other.numel() > 1 else other.float().reshape(1, 1)
        )
        mine = (
            self.scales.float().reshape(-1, self.blocks) if self.scales.numel() % self.blocks == 0 else None
        )
        if mine is None or mine.shape[0] != self.rows:
            mine = self.scales.float().reshape(-1)[:1].reshape(1, 1) if self.scales.numel() == 1 else None
        if mine is None:
            return False
        mine, target = torch.broadcast_tensors(mine, target.expand_as(torch.empty(self.rows, self.blocks)))
        live = self.amax() > 0
        return bool(torch.isclose(mine[live], target[live], rtol=rtol, atol=0).all())


def _is_power_of_two(t: torch.Tensor) -> torch.Tensor:
    mantissa, _ = torch.frexp(t.float())
    return mantissa.abs() == 0.5


# --------------------------------------------------------------------------------------------------- rules


@rule(
    "zero block gives NaN",
    "An all-zero block got a scale of 0, NaN or inf (or NaN in q): its amax is 0, so `amax / max` is 0 and "
    "`x / 0` is NaN. Give an all-zero block a finite positive scale (1.0 is fine) and zeros in q, e.g. "
    "`torch.where(amax == 0, torch.ones_like(amax), amax)` before dividing.",
)
def zero_block_nan(seen) -> bool:
    zero = seen.amax() == 0
    mine = seen.scales.float().reshape(seen.rows, seen.blocks)
    bad_scale = ~torch.isfinite(mine[zero]) | (mine[zero] <= 0)
    return bool(zero.any()) and (bool(bad_scale.any()) or bool(torch.isnan(seen.q.float()).any()))


@rule(
    "scale inverted",
    "Your scales are max / amax, the inverse of the contract's: the contract's scale is the number q is "
    "multiplied by to get x back (`x ~ q.float() * scale`, so scale = amax / max and q = x / scale). (torchao "
    "stores the inverse, the factor x is multiplied by before the cast: check which convention an API uses.)",
)
def scale_inverted(seen) -> bool:
    return seen.scales_like(1.0 / seen.expected())


@rule(
    "per-tensor scale",
    "All your scales are the same number, amax of the whole tensor / max: that is one scale per tensor. The "
    "contract wants one scale per block of `block` consecutive elements of a row, `scales` of shape "
    "[rows, cols // block]: reshape to [rows, cols // block, block] and take the amax over the last dimension.",
)
def per_tensor(seen) -> bool:
    whole = seen.x.abs().max().reshape(1, 1)
    rule_ = "ceil" if seen.power_of_two else "amax"
    return seen.scales_like(block_scales(whole, seen.dtype, rule_))


@rule(
    "per-row scale",
    "Each row got one scale (its amax / max), repeated over its blocks: that is per-row scaling. The contract "
    "wants one scale per block of `block` consecutive elements, so a block of small values gets a small "
    "scale of its own: take the amax over each block, not over the row.",
)
def per_row(seen) -> bool:
    rule_ = "ceil" if seen.power_of_two else "amax"
    return seen.scales_like(block_scales(seen.x.abs().amax(dim=1, keepdim=True), seen.dtype, rule_))


@rule(
    "blocks along the wrong axis",
    "Your scales fit blocks made of every (cols // block)-th element (or of columns), not of `block` "
    "CONSECUTIVE elements of a row: `x.reshape(rows, block, cols // block)` groups strided elements. Use "
    "`x.reshape(rows, cols // block, block)` and the amax over the last dimension.",
)
def wrong_axis(seen) -> bool:
    rule_ = "ceil" if seen.power_of_two else "amax"
    return seen.scales_like(block_scales(seen.amax(strided=True), seen.dtype, rule_))


@rule(
    "no saturation",
    "q holds NaN or inf although x is finite: a value of x / scale beyond the format's max was cast as it is, and "
    "a cast turns that into NaN (E4M3FN on some builds) or inf (E5M2). Clamp x / scale to [-max, max] before "
    "`.to(dtype)`, and check that the scale makes the block's amax fit.",
)
def no_saturation(seen) -> bool:
    return not bool(torch.isfinite(seen.q.float()).all())


@rule(
    "the wrong format's maximum",
    lambda seen: (
        f"Your scales are amax / {fp8_max(OTHER[seen.dtype]):g}, the maximum of {_name(OTHER[seen.dtype])}, for "
        f"dtype={_name(seen.dtype)}, whose largest finite value is {fp8_max(seen.dtype):g}: take the maximum of "
        "the dtype you are given, `torch.finfo(dtype).max`."
    ),
)
def wrong_format_max(seen) -> bool:
    rule_ = "ceil" if seen.power_of_two else "amax"
    return seen.scales_like(seen.expected(OTHER[seen.dtype], rule_))


@rule(
    "floor where ceil is needed",
    "Some power-of-two scales are half what they should be: 2^floor(...) instead of the SMALLEST power of two "
    "with amax / scale <= max, so the block's largest elements do not fit (that is the OCP MX floor rule, which "
    "lets them saturate). Round the exponent up: the scale is 2^ceil(log2(amax / max)).",
)
def floor_not_ceil(seen) -> bool:
    mine = seen.scales.float().reshape(seen.rows, seen.blocks)
    want = seen.expected()
    live = seen.amax() > 0
    floor_like = torch.isclose(mine, want / 2, rtol=1e-6) | torch.isclose(mine, want, rtol=1e-6)
    return seen.power_of_two and bool(floor_like[live].all()) and bool((mine[live] < want[live]).any())


@rule(
    "power of two one step too large",
    "Some power-of-two scales are twice the smallest one that fits: for a block whose amax / max is exactly a "
    "power of two (or just below one), the smallest fitting scale is that power itself. `frexp` returns a "
    "mantissa in [0.5, 1): 2^exponent is one step too many when the mantissa is exactly 0.5.",
)
def one_step_too_large(seen) -> bool:
    mine = seen.scales.float().reshape(seen.rows, seen.blocks)
    want = seen.expected()
    live = seen.amax() > 0
    close = torch.isclose(mine, want * 2, rtol=1e-6) | torch.isclose(mine, want, rtol=1e-6)
    return seen.power_of_two and bool(close[live].all()) and bool((mine[live] > want[live]).any())


@rule(
    "power of two without the format's maximum",
    "Your power-of-two scales make each block's amax land near 1, not near the format's max: 2^ceil(log2(amax)) "
    "ignores that FP8 reaches 448 (E4M3FN) or 57344 (E5M2), so q uses only the bottom of the format and small "
    "values fall to zero. Divide by the format's max first: 2^ceil(log2(amax / max)).",
)
def pow2_ignores_max(seen) -> bool:
    return seen.power_of_two and seen.scales_like(torch.exp2(torch.ceil(torch.log2(seen.amax()))), 1e-6)


@rule(
    "power_of_two ignored",
    lambda seen: (
        "With power_of_two=True every scale must be a power of two (an E8M0 scale), but yours are amax / max."
        if seen.power_of_two
        else "With power_of_two=False the block's largest magnitude must map to the format's max (scale = amax / "
        "max), but your scales are powers of two: use power_of_two only when it is asked for."
    ),
)
def pow2_flag_ignored(seen) -> bool:
    other = block_scales(seen.amax(), seen.dtype, "amax" if seen.power_of_two else "ceil")
    return seen.scales_like(other, 1e-5)


@rule(
    "q not x / scale",
    "Your scales look right, but q.float() * scale does not give x back within the format's rounding: q must "
    "be x / scale (each element divided by its own block's scale), clamped to [-max, max], cast to dtype.",
)
def q_not_divided(seen) -> bool:
    return seen.scales_like(seen.expected(), 1e-5)


@rule(
    "a result that matches nothing known",
    "Your result does not match the contract, and it matches no known mistake: print scales for a small x "
    "(say 2 rows of 8 with block=4) and compare with amax / max per block of consecutive elements.",
)
def matches_nothing_known(seen) -> bool:
    return True


RULES = (
    zero_block_nan,
    scale_inverted,
    per_tensor,
    per_row,
    wrong_axis,
    wrong_format_max,
    no_saturation,
    floor_not_ceil,
    one_step_too_large,
    pow2_ignores_max,
    pow2_flag_ignored,
    q_not_divided,
    matches_nothing_known,
)


# ----------------------------------------------------------------------------------------------- judging


def _shape_problem(seen, result) -> str:
    """A message when the result is not a pair of tensors of the contract's shapes and dtypes, else ''."""
    where = f"For x of shape {list(seen.x.shape)}, block={seen.block}, dtype={_name(seen.dtype)}"
    if not (isinstance(result, (tuple, list)) and len(result) == 2):
        return f"{where}: return a pair `(q, scales)`, not {type(result).__name__}."
    q, scales = result
    if not (isinstance(q, torch.Tensor) and isinstance(scales, torch.Tensor)):
        return (
            f"{where}: both q and scales must be tensors (got {type(q).__name__}, {type(scales).__name__})."
        )
    if q.dtype != seen.dtype:
        return f"{where}: q has dtype {q.dtype}; it must be {seen.dtype} (`.to(dtype)` after the clamp)."
    if tuple(q.shape) != tuple(seen.x.shape):
        return f"{where}: q has shape {list(q.shape)}; it must have x's shape {list(seen.x.shape)}."
    if scales.dtype != torch.float32:
        return f"{where}: scales have dtype {scales.dtype}; the contract says float32 (one float32 scale per block)."
    return ""


def _scale_shape_ok(seen) -> bool:
    return tuple(seen.scales.shape) == (seen.rows, seen.blocks)


def _right(seen) -> bool:
    """Right: the contract's scale per block (exactly, for powers of two), finite q, reconstruction in bounds."""
    if not _scale_shape_ok(seen) or not torch.isfinite(seen.q.float()).all():
        return False
    mine = seen.scales.float()
    want = seen.expected()
    live = seen.amax() > 0
    if not (torch.isfinite(mine).all() and (mine > 0).all()):
        return False
    if seen.power_of_two:
        ok = bool(torch.equal(mine[live], want[live]))
    else:
        ok = bool(torch.isclose(mine[live], want[live], rtol=1e-5, atol=0).all())
    back = seen.q.float() * mine.repeat_interleave(seen.block, dim=1)
    info = torch.finfo(seen.dtype)
    spacing = info.tiny * info.eps  # smallest subnormal
    bound = (
        seen.x.abs() * info.eps / 2 * 1.001 + mine.repeat_interleave(seen.block, dim=1) * spacing / 2 * 1.001
    )
    return (
        ok
        and bool(((back - seen.x).abs() <= bound).all())
        and bool((seen.q.float()[~live.repeat_interleave(seen.block, dim=1)] == 0).all())
    )


def _diagnose(seen) -> str:
    if not _scale_shape_ok(seen):
        shape = list(seen.scales.shape)
        if seen.scales.numel() == 1:
            return (
                f"{seen.label}: scales has shape {shape}, a single scale for the whole tensor; the contract wants "
                f"one scale per block of {seen.block} consecutive elements of a row: shape [{seen.rows}, {seen.blocks}]."
            )
        if seen.scales.numel() == seen.rows:
            return (
                f"{seen.label}: scales has shape {shape}, one scale per row; the contract wants one per block of "
                f"{seen.block} consecutive elements of a row: shape [{seen.rows}, {seen.blocks}]."
            )
        return f"{seen.label}: scales has shape {shape}; the contract wants [rows, cols // block] = [{seen.rows}, {seen.blocks}]."
    return f"{seen.label}: " + first_mistake(RULES, seen).text(seen)


@checker("11.1 quantize_blocks")
def check_quantize_blocks(quantize_blocks):
    """Exercise 11.1: ``quantize_blocks(x, *, block, dtype=torch.float8_e4m3fn, power_of_two=False) -> (q, scales)``."""
    for label, x, block, dtype, power_of_two in _cases():
        seen = Seen(label, x, block, dtype, power_of_two)
        result = call_learner(
            quantize_blocks,
            x.clone(),
            block=block,
            dtype=dtype,
            power_of_two=power_of_two,
            what="`quantize_blocks`",
        )
        problem = _shape_problem(seen, result)
        if problem:
            stop(problem)
        seen.q, seen.scales = result[0].detach().cpu(), result[1].detach().cpu()
        if not _right(seen):
            stop(_diagnose(seen))
    _check_value_error(quantize_blocks)
    return passed(
        "quantize_blocks scales each block of consecutive elements on its own: E4M3FN and E5M2, amax -> max and "
        "power-of-two (E8M0-style) scales, an all-zero block without NaN, nothing saturated to NaN, and a width "
        "that does not divide raises ValueError."
    )


def _check_value_error(quantize_blocks) -> None:
    x = torch.ones(2, 40)
    try:
        quantize_blocks(x, block=16)
    except ValueError:
        return
    except Exception as error:
        stop(
            f"For x of shape [2, 40] and block=16 (40 % 16 != 0) raise ValueError; you raised {type(error).__name__}."
        )
    stop(
        "For x of shape [2, 40] and block=16 (40 is not a multiple of 16) quantize_blocks must raise ValueError "
        "(`if cols % block: raise ValueError(...)`); it returned a result instead."
    )
