"""Lesson 10's rounding helpers: stochastic rounding is unbiased and picks only the two neighbours, Kahan keeps what
round-to-nearest drops, and the neighbours are right at the edges (negatives, powers of two, subnormals, max)."""

import math

import pytest
import torch

from amp_lessons.l10_where_fp32_lives.rounding import (
    accumulate,
    bf16_neighbours,
    kahan_add,
    nearest_add,
    rounding_means,
    stochastic_round,
)


@pytest.mark.parametrize(
    "x, lower, upper",
    [
        (1.003, 1.0, 1.0078125),
        (-1.003, -1.0078125, -1.0),
        (1.0, 1.0, 1.0),
        (1 - 0.3 * 2**-8, 1 - 2**-8, 1.0),
        (0.3 * 2.0**-133, 0.0, 2.0**-133),
        (3.3999e38, torch.finfo(torch.bfloat16).max, math.inf),
    ],
)
def test_neighbours(x, lower, upper):
    low, high = bf16_neighbours(torch.tensor([x]))
    assert low.item() == pytest.approx(lower, rel=1e-6) and high.item() == pytest.approx(upper, rel=1e-6)


def test_stochastic_round_is_unbiased_and_seeded():
    x = torch.full((20000,), 1.003)
    a = stochastic_round(x, generator=torch.Generator().manual_seed(0))
    b = stochastic_round(x, generator=torch.Generator().manual_seed(0))
    assert a.dtype == torch.bfloat16 and torch.equal(a, b)
    assert set(a.float().unique().tolist()) == {1.0, 1.0078125}
    assert a.double().mean().item() == pytest.approx(1.003, abs=3e-4)


def test_stochastic_round_keeps_specials_and_exact_values():
    x = torch.tensor([math.inf, -math.inf, math.nan, 1.0, -0.0])
    out = stochastic_round(x, generator=torch.Generator().manual_seed(0)).float()
    assert out[0] == math.inf and out[1] == -math.inf and out[2].isnan() and out[3] == 1.0
    assert math.copysign(1, out[4].item()) < 0


def test_kahan_keeps_what_nearest_loses():
    weight = torch.ones(4, dtype=torch.bfloat16)
    compensation = torch.zeros(4, dtype=torch.bfloat16)
    kahan, nearest = weight.clone(), weight.clone()
    for _ in range(1000):
        update = torch.full((4,), 1e-3)
        kahan = kahan_add(kahan, update, compensation)
        nearest = nearest_add(nearest, update)
    assert torch.equal(nearest, weight)  # every update lost
    assert kahan.double().mean().item() == pytest.approx(2.0, abs=0.02)


def test_accumulation_shows_the_spread_of_stochastic_rounding():
    sums = accumulate(1.0, 1e-4, 2000, trials=100)
    assert torch.equal(sums["nearest"], torch.ones(100, dtype=torch.float64))
    assert sums["stochastic"].mean().item() == pytest.approx(1.2, abs=0.02)
    assert sums["stochastic"].std().item() > 3 * (sums["kahan"] - 1.2).abs().max().item()


def test_rounding_means_table():
    table = rounding_means([1.003, -0.1], draws=4000)
    assert list(table["mean of 4000 draws"].round(3)) == [1.003, -0.1]
    assert list(table["round to nearest"].round(4)) == [1.0, -0.1001]
