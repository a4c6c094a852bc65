"""Lesson 10 checker (10.1 stochastic_round): the solution passes (also in strict mode), the untouched exercise is
"not done yet", correct answers written unlike the solution pass, each known wrong answer is named by its own rule
(one test per rule, and a test that every rule has one), junk never raises, and the check answers in under 2 s."""

import math
import time

import numpy as np
import pytest
import torch
from notebook_code import exercise, solution

from amp_lessons.checks.harness import NOT_DONE
from amp_lessons.l10_where_fp32_lives import check
from amp_lessons.l10_where_fp32_lives.check import RULES, check_stochastic_round

NOTEBOOK = "10_where_fp32_lives.ipynb"


def reference():
    return solution(NOTEBOOK, "stochastic_round")


def test_the_solution_passes():
    result = check_stochastic_round(reference())
    assert result.passed, result.message


def test_the_solution_passes_in_strict_mode(strict):
    assert check_stochastic_round(reference()).passed


def test_the_untouched_exercise_is_not_done():
    result = check_stochastic_round(exercise(NOTEBOOK, "stochastic_round"))
    assert result.status == NOT_DONE, result.message


def test_the_check_answers_in_under_two_seconds():
    start = time.perf_counter()
    check_stochastic_round(reference())
    assert time.perf_counter() - start < 2.0


def test_the_check_leaves_the_global_rng_as_it_found_it():
    state = torch.get_rng_state()
    check_stochastic_round(reference())
    assert torch.equal(torch.get_rng_state(), state)


# ------------------------------------------------------------------------------ correct answers, other styles


def sr_int16_halves(x, *, generator):
    """Bits again, but as two int16 halves: the upper half becomes the bfloat16 directly (a .view, no cast)."""
    x = x.float()
    bits = x.view(torch.int32).to(torch.int64) + torch.randint(0, 65536, x.shape, generator=generator)
    upper = ((bits >> 16) & 0xFFFF).to(torch.int32)
    upper = torch.where(upper >= 32768, upper - 65536, upper).to(torch.int16)
    rounded = upper.view(torch.bfloat16)
    return torch.where(torch.isfinite(x), rounded, x.to(torch.bfloat16))


def sr_nextafter(x, *, generator):
    """Round to nearest, find the other neighbour with nextafter, and choose with a uniform draw."""
    x = x.float()
    nearest = x.to(torch.bfloat16).float()
    toward = torch.where(nearest > x, torch.tensor(-math.inf), torch.tensor(math.inf))
    other = torch.nextafter(nearest.to(torch.bfloat16), toward.to(torch.bfloat16)).float()
    lower, upper = torch.minimum(nearest, other), torch.maximum(nearest, other)
    exact = nearest == x
    chance = ((x.double() - lower.double()) / (upper.double() - lower.double())).nan_to_num(0.0)
    u = torch.rand(x.shape, generator=generator, dtype=torch.float64)
    out = torch.where(u < chance, upper, lower)
    out = torch.where(exact | ~torch.isfinite(x), x, out)
    big = x.abs() > torch.finfo(torch.bfloat16).max  # nearest is inf there: keep the largest finite value
    out = torch.where(
        big & torch.isfinite(x), torch.copysign(torch.tensor(torch.finfo(torch.bfloat16).max), x), out
    )
    return out.to(torch.bfloat16)


def sr_float64(x, *, generator):
    """Float64 arithmetic: the spacing from frexp's exponent (clamped for subnormals), floor to the lower one."""
    x64 = x.double()
    _, exponent = torch.frexp(x64.abs())
    spacing = torch.ldexp(torch.ones_like(x64), (exponent - 1).clamp_min(-126) - 7)
    lower = torch.floor(x64 / spacing) * spacing
    chance = (x64 - lower) / spacing
    u = torch.rand(x.shape, generator=generator, dtype=torch.float64)
    out = torch.where(u < chance, lower + spacing, lower)
    out = torch.where(x64 == 0, x64, out)  # keeps -0.0
    out = torch.where(torch.isfinite(x64), out, x64)
    return out.float().to(torch.bfloat16)  # every value is a bfloat16 value already (or above max: inf)


def sr_dither(x, *, generator):
    """Dither: add a uniform number over one spacing of [lower, upper], centred, then round to nearest."""
    x = x.float()
    lower = (x.view(torch.int32) & -65536).view(torch.float32)  # toward zero
    away = (lower.view(torch.int32) + 65536).view(torch.float32)
    spacing = (away.double() - lower.double()).abs()
    u = torch.rand(x.shape, generator=generator, dtype=torch.float64) - 0.5
    # the neighbour toward zero is "lower" in magnitude; dither in magnitude and copy the sign back
    magnitude = lower.double().abs() + (x.double().abs() - lower.double().abs() + u * spacing).clamp_min(0)
    bottom, top = lower.double().abs(), away.double().abs()
    chosen = torch.where(magnitude >= (bottom + top) / 2, top, bottom)
    chosen = torch.where(x.view(torch.int32) & 0xFFFF == 0, x.double().abs(), chosen)
    out = torch.copysign(chosen, x.double()).float()
    return torch.where(torch.isfinite(x), out, x).to(torch.bfloat16)


def sr_numpy(x, *, generator):
    """NumPy on the uint32 bits, with the random integers still drawn from the torch generator."""
    noise = torch.randint(0, 1 << 16, x.shape, generator=generator).numpy().astype(np.uint32)
    array = x.float().numpy()
    bits = array.view(np.uint32)
    kept = ((bits.astype(np.uint64) + noise) & np.uint64(0xFFFF0000)).astype(np.uint32).view(np.float32)
    kept = np.where(np.isfinite(array), kept, array)
    return torch.from_numpy(np.array(kept, dtype=np.float32)).reshape(x.shape).to(torch.bfloat16)


@pytest.mark.parametrize("answer", [sr_int16_halves, sr_nextafter, sr_float64, sr_dither, sr_numpy])
def test_correct_answers_in_other_styles_pass(answer):
    result = check_stochastic_round(answer)
    assert result.passed, f"{answer.__name__}: {result.message}"


# -------------------------------------------------------------------------------- known wrong answers, by rule


def bits_rounding(noise_high=1 << 16, keep_nonfinite=True, in_place=False):
    def stochastic_round(x, *, generator):
        bits = x.view(torch.int32)
        noise = torch.randint(0, noise_high, x.shape, generator=generator, dtype=torch.int32)
        if in_place:
            bits += noise
            rounded = (bits & -65536).view(torch.float32)
        else:
            rounded = ((bits + noise) & -65536).view(torch.float32)
        if keep_nonfinite:
            rounded = torch.where(torch.isfinite(x), rounded, x)
        return rounded.to(torch.bfloat16)

    return stochastic_round


def returns_float32(x, *, generator):
    return reference()(x, generator=generator).float()


def flattens(x, *, generator):
    return reference()(x, generator=generator).reshape(-1)


def plain_cast(x, *, generator):
    return x.to(torch.bfloat16)


def truncated(x, *, generator):
    chopped = (x.view(torch.int32) & -65536).view(torch.float32)
    return torch.where(torch.isfinite(x), chopped, x).to(torch.bfloat16)


def floor_value(x, *, generator):
    return (x.double() - 0.5 * (x.double().abs() * 2.0**-8)).clamp(min=-3.3e38).float().to(torch.bfloat16)


def _neighbours(x):
    from amp_lessons.l10_where_fp32_lives.rounding import bf16_neighbours

    return bf16_neighbours(x)


def always_lower(x, *, generator):
    lower, _ = _neighbours(x)
    return torch.where(torch.isfinite(x), lower, x).to(torch.bfloat16)


def always_upper(x, *, generator):
    _, upper = _neighbours(x)
    return torch.where(torch.isfinite(x), upper, x).to(torch.bfloat16)


def one_random_number(x, *, generator):
    lower, upper = _neighbours(x)
    u = torch.rand((), generator=generator)
    chance = ((x - lower) / (upper - lower)).nan_to_num(0.0)
    out = torch.where(u < chance, upper, lower)
    return torch.where(torch.isfinite(x), out, x).to(torch.bfloat16)


def global_random(x, *, generator):
    lower, upper = _neighbours(x)
    u = torch.rand(x.shape)  # the global RNG, not the generator
    chance = ((x.double() - lower.double()) / (upper.double() - lower.double())).nan_to_num(0.0)
    out = torch.where(u < chance, upper, lower)
    return torch.where(torch.isfinite(x), out, x).to(torch.bfloat16)


def own_generator(x, *, generator):
    mine = torch.Generator().manual_seed(0)
    return reference()(x, generator=mine)


def dither_then_nearest(x, *, generator):
    """Noise over [0, spacing) added, then rounded to nearest: exact values move, others overshoot."""
    spacing = (x.abs().double() * 2.0**-7).float()
    u = torch.rand(x.shape, generator=generator)
    return torch.where(torch.isfinite(x), x + u * spacing, x).to(torch.bfloat16)


def adds_instead_of_choosing(x, *, generator):
    """lower + spacing * up: right everywhere, except that -0.0 + 0.0 is +0.0."""
    lower, upper = _neighbours(x)
    chance = ((x.double() - lower.double()) / (upper.double() - lower.double())).nan_to_num(0.0)
    up = torch.rand(x.shape, generator=generator, dtype=torch.float64) < chance
    out = lower + (upper - lower).nan_to_num(0.0) * up
    return torch.where(torch.isfinite(x) & (x.abs() <= 3.38e38), out, x).to(torch.bfloat16)


def spacing_from_unclamped_exponent(x, *, generator):
    """Float64 arithmetic without clamping the exponent at -126: subnormals get spacings that do not exist."""
    x64 = x.double()
    _, exponent = torch.frexp(x64.abs())
    spacing = torch.ldexp(torch.ones_like(x64), exponent - 1 - 7)
    lower = torch.floor(x64 / spacing) * spacing
    chance = (x64 - lower) / spacing
    u = torch.rand(x.shape, generator=generator, dtype=torch.float64)
    out = torch.where(u < chance, lower + spacing, lower)
    out = torch.where(x64 == 0, x64, out)
    out = torch.where(torch.isfinite(x64), out, x64)
    return out.float().to(torch.bfloat16)


def noise_toward_zero_for_negatives(x, *, generator):
    """Noise added to the value (not the magnitude), then truncated toward zero: negatives go wrong."""
    x = x.float()
    _, upper = _neighbours(x.abs())
    lower = (x.abs().view(torch.int32) & -65536).view(torch.float32)
    spacing = upper - lower
    noisy = x + torch.rand(x.shape, generator=generator) * spacing
    out = (noisy.view(torch.int32) & -65536).view(torch.float32)
    out = torch.where(spacing == 0, x, out)
    return torch.where(torch.isfinite(x), out, x).to(torch.bfloat16)


def chance_reversed(x, *, generator):
    lower, upper = _neighbours(x)
    chance = ((x.double() - lower.double()) / (upper.double() - lower.double())).nan_to_num(0.0)
    u = torch.rand(x.shape, generator=generator, dtype=torch.float64)
    out = torch.where(u > chance, upper, lower)
    out = torch.where(lower == upper, x, out)
    return torch.where(torch.isfinite(x), out, x).to(torch.bfloat16)


def arithmetic_on_inf(x, *, generator):
    """The float64 style with no special case for inf: the spacing around inf is NaN."""
    x64 = x.double()
    _, exponent = torch.frexp(x64.abs())
    spacing = torch.ldexp(torch.ones_like(x64), (exponent - 1).clamp_min(-126) - 7)
    lower = torch.floor(x64 / spacing) * spacing
    chance = (x64 - lower) / spacing
    u = torch.rand(x.shape, generator=generator, dtype=torch.float64)
    out = torch.where(u < chance, lower + spacing, lower)
    out = torch.where(x64 == 0, x64, out)
    out = torch.where(torch.isinf(x64), (x64 - x64) * 0, out)  # what the arithmetic gives there: NaN
    out = torch.where(torch.isnan(x64), x64, out)
    return out.float().to(torch.bfloat16)


def inf_replaced(x, *, generator):
    rounded = reference()(x, generator=generator)
    return torch.where(torch.isinf(x), torch.zeros_like(rounded), rounded)


def off_by_a_whole_spacing(x, *, generator):
    """Noise over [0, 2^17): two spacings, so a value can come out two neighbours away."""
    return bits_rounding(noise_high=1 << 17)(x, generator=generator)


WRONG = {
    "wrong dtype": (returns_float32, "it must return torch.bfloat16"),
    "wrong shape": (flattens, "wrong shape"),
    "modified the input": (bits_rounding(in_place=True), "changed x itself"),
    "inf became NaN": (arithmetic_on_inf, "±inf came back as NaN"),
    "inf not kept": (inf_replaced, "must come back as the same infinity"),
    "NaN not kept": (bits_rounding(keep_nonfinite=False), "did not come back as NaN"),
    "round to nearest": (plain_cast, "rounded to NEAREST"),
    "truncation": (truncated, "truncated"),
    "always the lower neighbour": (always_lower, "LOWER neighbour"),
    "always the upper neighbour": (always_upper, "UPPER neighbour"),
    "one random number for the whole tensor": (one_random_number, "ONE random number"),
    "global RNG instead of the generator": (global_random, "seeded alike gave different results"),
    "ignores the generator": (own_generator, "DIFFERENT seeds gave identical results"),
    "exact values changed": (adds_instead_of_choosing, "came back changed"),
    "subnormals": (spacing_from_unclamped_exponent, "Only the subnormal values"),
    "biased for negatives": (noise_toward_zero_for_negatives, "negative ones do not"),
    "probability reversed": (chance_reversed, "NEARER neighbour comes out less often"),
    "not a neighbour": (off_by_a_whole_spacing, "not one of its two BF16 neighbours"),
    "biased": (bits_rounding(noise_high=1 << 15), "Biased:"),
}


def test_every_rule_has_a_wrong_answer_here():
    assert sorted(rule.name for rule in RULES) == sorted(WRONG)
    assert len(WRONG) >= 8


@pytest.mark.parametrize("name", list(WRONG))
def test_each_wrong_answer_is_named_by_its_rule(name):
    answer, words = WRONG[name]
    result = check_stochastic_round(answer)
    assert not result.passed
    assert words in result.message, f"{name}: {result.message}"
    seen = check.observe(answer)
    from amp_lessons.checks.mistakes import first_mistake

    assert first_mistake(RULES, seen).name == name


@pytest.mark.parametrize("answer", [floor_value, dither_then_nearest])
def test_rounding_a_shifted_value_to_nearest_fails(answer):
    """Rounding a shifted value to nearest is not stochastic rounding: it fails, with a message."""
    result = check_stochastic_round(answer)
    assert not result.passed and result.message


# -------------------------------------------------------------------------------------------------- junk


def raises_value_error(x, *, generator):
    raise ValueError("boom")


def returns_nan(x, *, generator):
    return torch.full_like(x, math.nan).to(torch.bfloat16)


@pytest.mark.parametrize(
    "junk, words",
    [
        (None, "Expected a function"),
        ("stochastic_round", "Expected a function"),
        (lambda x: x, "signature"),
        (lambda x, *, generator: None, "not a tensor"),
        (lambda x, *, generator: [1.0], "not a tensor"),
        (raises_value_error, "ValueError: boom"),
        (returns_nan, ""),
        (lambda x, *, generator: torch.zeros(3, dtype=torch.bfloat16), "wrong shape"),
        (lambda x, *, generator: x.to(torch.int32), "int32"),
    ],
)
def test_junk_never_raises(junk, words):
    result = check_stochastic_round(junk)
    assert not result.passed and words in result.message, result.message
