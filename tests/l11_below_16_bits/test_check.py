"""Lesson 11 checker (11.1 quantize_blocks): the solution passes, the untouched exercise is "not done", correct
answers written unlike the solution pass, each known wrong answer is named by its own rule, junk never raises."""

import time

import pytest
import torch
from notebook_code import exercise, solution

from amp_lessons.checks.harness import NOT_DONE
from amp_lessons.l11_below_16_bits import check as l11
from amp_lessons.l11_below_16_bits.check import check_quantize_blocks

LESSON = "11_below_16_bits.ipynb"


def _reference():
    return solution(LESSON, "quantize_blocks")


def test_solution_passes(strict):
    assert check_quantize_blocks(_reference()).passed


def test_untouched_exercise_is_not_done():
    assert check_quantize_blocks(exercise(LESSON, "quantize_blocks")).status == NOT_DONE


def test_the_check_is_fast():
    started = time.perf_counter()
    check_quantize_blocks(_reference())
    assert time.perf_counter() - started < 2.0


# ------------------------------------------------------------------------------------ correct, other styles


def _reshape_amax(x, *, block, dtype=torch.float8_e4m3fn, power_of_two=False):
    rows, cols = x.shape
    if cols % block:
        raise ValueError("cols must be a multiple of block")
    top = torch.finfo(dtype).max
    g = x.reshape(rows, cols // block, block)
    amax = g.abs().amax(dim=2, keepdim=True)
    amax[amax == 0] = 1.0
    scale = amax / top
    if power_of_two:
        m, e = torch.frexp(scale)
        scale = torch.ldexp(torch.ones_like(scale), torch.where(m == 0.5, e - 1, e))
    q = torch.clamp(g / scale, -top, top).to(dtype).reshape(rows, cols)
    return q, scale.squeeze(2)


def _loops(x, *, block, dtype=torch.float8_e4m3fn, power_of_two=False):
    rows, cols = x.shape
    if cols % block != 0:
        raise ValueError(f"{cols} % {block} != 0")
    top = float(torch.finfo(dtype).max)
    q = torch.empty(rows, cols, dtype=dtype)
    scales = torch.empty(rows, cols // block, dtype=torch.float32)
    for r in range(rows):
        for b in range(cols // block):
            part = x[r, b * block : (b + 1) * block]
            amax = float(part.abs().max())
            if amax == 0:
                scale = 1.0
            elif power_of_two:
                scale = 1.0
                while amax / scale > top:
                    scale *= 2
                while amax / (scale / 2) <= top:
                    scale /= 2
            else:
                scale = float(torch.tensor(amax) / top)
            scales[r, b] = scale
            q[r, b * block : (b + 1) * block] = (part / scales[r, b]).clamp(-top, top).to(dtype)
    return q, scales


def _frexp(x, *, block, dtype=torch.float8_e4m3fn, power_of_two=False):
    if x.shape[1] % block:
        raise ValueError("bad block")
    top = torch.finfo(dtype).max
    blocks = x.view(x.shape[0], -1, block)
    amax = blocks.abs().max(dim=-1).values
    if power_of_two:
        ratio = torch.where(amax > 0, amax / top, torch.ones_like(amax))
        mantissa, exponent = torch.frexp(ratio)
        exponent = exponent - (mantissa == 0.5).int()
        scales = torch.ldexp(torch.ones_like(ratio), exponent)
        scales = torch.where(amax / scales > top, scales * 2, scales)
    else:
        scales = torch.where(amax > 0, amax / top, torch.ones_like(amax))
    q = torch.clamp(blocks / scales[..., None], min=-top, max=top).to(dtype)
    return q.view_as(x), scales


def _ldexp_inverse(x, *, block, dtype=torch.float8_e4m3fn, power_of_two=False):
    rows, cols = x.shape
    if cols % block:
        raise ValueError("width")
    top = torch.finfo(dtype).max
    blocks = torch.stack(x.split(block, dim=1), dim=1)  # [rows, blocks, block]
    amax = blocks.abs().amax(-1)
    safe = amax.masked_fill(amax == 0, 1.0)
    if power_of_two:
        k = torch.ceil(torch.log2(safe.double() / top))
        scales = torch.ldexp(torch.ones_like(safe), k.int())
        scales = torch.where(safe / (scales / 2) <= top, scales / 2, scales)
        scales = torch.where(safe / scales > top, scales * 2, scales)
    else:
        scales = (safe.double() / top).float()
    inverse = 1.0 / scales.double()
    q = (blocks.double() * inverse[..., None]).clamp(-top, top).float().to(dtype)
    return torch.cat(q.unbind(1), dim=1), scales


@pytest.mark.parametrize("answer", [_reshape_amax, _loops, _frexp, _ldexp_inverse], ids=lambda f: f.__name__)
def test_correct_answers_in_other_styles_pass(answer):
    result = check_quantize_blocks(answer)
    assert result.passed, result.message


# ----------------------------------------------------------------------------------------- wrong answers


def _variant(**changes):
    """The reference with one thing changed: ``scales`` and/or ``q`` recomputed by the given functions."""

    def quantize_blocks(x, *, block, dtype=torch.float8_e4m3fn, power_of_two=False):
        return changes["fn"](x, block=block, dtype=dtype, power_of_two=power_of_two)

    return quantize_blocks


def _with_scales(scale_fn, clamp=True, inverted=False):
    def answer(x, *, block, dtype=torch.float8_e4m3fn, power_of_two=False):
        rows, cols = x.shape
        if cols % block:
            raise ValueError("width")
        top = torch.finfo(dtype).max
        g = x.reshape(rows, cols // block, block)
        amax = g.abs().amax(-1)
        scales = scale_fn(x, g, amax, top, dtype, power_of_two).expand(rows, cols // block).contiguous()
        divisor = 1 / scales if inverted else scales
        scaled = g / divisor[..., None]
        if clamp:
            scaled = scaled.clamp(-top, top)
        return scaled.to(dtype).reshape(rows, cols), scales.float()

    return answer


def _safe(amax):
    return torch.where(amax > 0, amax, torch.ones_like(amax))


def _ceil_pow2(ratio):
    return torch.exp2(torch.ceil(torch.log2(ratio)))


def _right_scales(x, g, amax, top, dtype, p2):
    s = _safe(amax) / top
    if p2:
        s = _ceil_pow2(s)
        s = torch.where(_safe(amax) / s > top, s * 2, s)
        s = torch.where(_safe(amax) / (s / 2) <= top, s / 2, s)
    return s


WRONG = {
    "zero block gives NaN": _with_scales(
        lambda x, g, amax, top, d, p2: amax / top if not p2 else _ceil_pow2(amax / top)
    ),
    "scale inverted": _with_scales(lambda *a: 1 / _right_scales(*a), inverted=True),
    "per-tensor scale": _with_scales(
        lambda x, g, amax, top, d, p2: _right_scales(x, g, x.abs().max().reshape(1, 1), top, d, p2)
    ),
    "per-row scale": _with_scales(
        lambda x, g, amax, top, d, p2: _right_scales(x, g, x.abs().amax(1, keepdim=True), top, d, p2)
    ),
    "blocks along the wrong axis": _with_scales(
        lambda x, g, amax, top, d, p2: _right_scales(
            x, g, x.reshape(x.shape[0], g.shape[2], -1).abs().amax(1), top, d, p2
        )
    ),
    "the wrong format's maximum": _with_scales(
        lambda x, g, amax, top, d, p2: _right_scales(x, g, amax, 448.0, d, p2)
    ),
    "no saturation": _with_scales(
        lambda x, g, amax, top, d, p2: (
            _right_scales(x, g, amax, top, d, p2)
            if not p2
            else torch.exp2(torch.floor(torch.log2(_safe(amax))) - (math_emax(d)))
        ),
        clamp=False,
    ),
    "floor where ceil is needed": _with_scales(
        lambda x, g, amax, top, d, p2: (
            _right_scales(x, g, amax, top, d, p2)
            if not p2
            else torch.exp2(torch.floor(torch.log2(_safe(amax))) - (math_emax(d)))
        )
    ),
    "power of two one step too large": _with_scales(
        lambda x, g, amax, top, d, p2: (
            _right_scales(x, g, amax, top, d, p2)
            if not p2
            else torch.ldexp(torch.ones_like(amax), torch.frexp(_safe(amax) / top)[1])
        )
    ),
    "power of two without the format's maximum": _with_scales(
        lambda x, g, amax, top, d, p2: (
            _right_scales(x, g, amax, top, d, p2) if not p2 else _ceil_pow2(_safe(amax))
        )
    ),
    "power_of_two ignored": _with_scales(
        lambda x, g, amax, top, d, p2: _right_scales(x, g, amax, top, d, False)
    ),
}


def math_emax(dtype):
    return {torch.float8_e4m3fn: 8, torch.float8_e5m2: 15}[dtype]


def _q_not_divided(x, *, block, dtype=torch.float8_e4m3fn, power_of_two=False):
    q, scales = _reshape_amax(x, block=block, dtype=dtype, power_of_two=power_of_two)
    top = torch.finfo(dtype).max
    return x.clamp(-top, top).to(dtype), scales


WRONG["q not x / scale"] = _q_not_divided


@pytest.mark.parametrize("name", sorted(WRONG))
def test_each_wrong_answer_is_named(name):
    result = check_quantize_blocks(WRONG[name])
    assert not result.passed
    rule_ = next(r for r in l11.RULES if r.name == name)
    expected = rule_.message if isinstance(rule_.message, str) else None
    if expected is not None:
        assert expected in result.message, (name, result.message)
    else:
        assert "maximum of" in result.message or "power_of_two" in result.message, result.message


def test_every_rule_has_a_wrong_answer():
    named = set(WRONG) | {"a result that matches nothing known"}
    assert {r.name for r in l11.RULES} == named


def test_shape_mistakes_say_per_row_and_per_tensor():
    def per_row_shape(x, *, block, dtype=torch.float8_e4m3fn, power_of_two=False):
        q, s = _reshape_amax(x, block=x.shape[1], dtype=dtype, power_of_two=power_of_two)
        return q, s

    def one_scale(x, *, block, dtype=torch.float8_e4m3fn, power_of_two=False):
        top = torch.finfo(dtype).max
        s = x.abs().max() / top
        return (x / s).clamp(-top, top).to(dtype), s.reshape(1)

    assert "one scale per row" in check_quantize_blocks(per_row_shape).message
    assert "a single scale for the whole tensor" in check_quantize_blocks(one_scale).message


def test_no_value_error_is_named():
    def no_error(x, *, block, dtype=torch.float8_e4m3fn, power_of_two=False):
        if x.shape[1] % block:
            block = x.shape[1]
        return _reshape_amax(x, block=block, dtype=dtype, power_of_two=power_of_two)

    result = check_quantize_blocks(no_error)
    assert not result.passed and "must raise ValueError" in result.message


def test_wrong_dtypes_are_named():
    def float32_q(x, **kw):
        q, s = _reshape_amax(x, **kw)
        return q.float(), s

    def float64_scales(x, **kw):
        q, s = _reshape_amax(x, **kw)
        return q, s.double()

    assert "q has dtype torch.float32" in check_quantize_blocks(float32_q).message
    assert "float32 (one float32 scale" in check_quantize_blocks(float64_scales).message


@pytest.mark.parametrize(
    "junk",
    [
        None,
        "quantize",
        3,
        lambda x: x,
        lambda x, *, block, dtype=None, power_of_two=False: None,
        lambda x, *, block, dtype=None, power_of_two=False: (x, x),
        lambda *a, **k: 1 / 0,
    ],
)
def test_junk_never_raises(junk):
    result = check_quantize_blocks(junk)
    assert not result.passed and result.message
