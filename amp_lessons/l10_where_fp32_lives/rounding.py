"""Lesson 10: rounding an update into BF16 — to nearest, stochastically, or with a Kahan compensation.

Why: a BF16 number keeps 8 significant bits, so the spacing between neighbours near ``w`` is about ``|w| / 128``. An
update smaller than half that spacing rounds back to ``w``: with round-to-nearest it is *lost*, every step, however
many steps there are. Two fixes keep the weights in BF16 and still keep the small updates:

- **stochastic rounding** picks one of the two BF16 neighbours of ``x`` at random, the nearer one more often, with
  probability proportional to closeness, so that the *expected* result is ``x`` exactly: small updates survive on
  average (but each step adds rounding noise of up to one spacing);
- **Kahan summation** keeps a second BF16 tensor, the compensation, holding what the last rounding dropped, and adds
  it back into the next update: nothing is lost, and nothing random is added (it costs 2 more bytes per weight).

``stochastic_round`` here is the package's own, used by the training runs; exercise 10.1 asks you to write it.
"""

from __future__ import annotations

import torch

__all__ = [
    "accumulate",
    "bf16_neighbours",
    "kahan_add",
    "nearest_add",
    "rounding_means",
    "stochastic_add",
    "stochastic_round",
]

_LOW_BITS = 1 << 16  # the 16 float32 mantissa bits bfloat16 drops
_KEEP = -_LOW_BITS  # 0xFFFF0000 as an int32 mask


def stochastic_round(x: torch.Tensor, *, generator: torch.Generator) -> torch.Tensor:
    """Round float32 ``x`` to bfloat16 at random, up with probability (x - lower) / spacing; inf/NaN unchanged.

    A bfloat16 is the top 16 bits of a float32. Adding a uniform random integer in [0, 2^16) to the 16 dropped
    bits and then dropping them carries into the kept bits with exactly the probability that the dropped bits
    make up — for negative numbers too (the bits are sign and magnitude), and for subnormals.
    """
    x = x.float()
    noise = torch.randint(0, _LOW_BITS, x.shape, generator=generator, dtype=torch.int32, device=x.device)
    rounded = ((x.view(torch.int32) + noise) & _KEEP).view(torch.float32)
    return torch.where(torch.isfinite(x), rounded, x).to(torch.bfloat16)


def bf16_neighbours(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The bfloat16 values just below and just above float32 ``x`` (both ``x`` when ``x`` is one), as float32.

    Above the largest finite bfloat16 the upper neighbour is inf. NaN gives NaN for both.
    """
    x = x.float()
    toward_zero = (x.view(torch.int32) & _KEEP).view(torch.float32)
    away = (toward_zero.view(torch.int32) + _LOW_BITS).view(torch.float32)  # one bfloat16 step further out
    exact = toward_zero == x
    lower = torch.where(exact | (x > 0), toward_zero, away)
    upper = torch.where(exact | (x < 0), toward_zero, away)
    nan = torch.isnan(x)
    return torch.where(nan, x, lower), torch.where(nan, x, upper)


def nearest_add(
    weight: torch.Tensor, update: torch.Tensor, compensation=None, generator=None
) -> torch.Tensor:
    """``weight + update`` computed in float32 and rounded to nearest into the weight's dtype (pure BF16)."""
    return (weight.float() + update).to(weight.dtype)


def stochastic_add(weight, update, compensation=None, *, generator) -> torch.Tensor:
    """``weight + update`` computed in float32 and rounded stochastically into bfloat16."""
    return stochastic_round(weight.float() + update, generator=generator)


def kahan_add(
    weight: torch.Tensor, update: torch.Tensor, compensation: torch.Tensor, generator=None
) -> torch.Tensor:
    """``weight + update`` with Kahan compensation: what the rounding drops is kept in ``compensation`` (updated
    in place) and added to the next update."""
    wanted = update + compensation.float()  # this step's update plus what earlier roundings dropped
    new = (weight.float() + wanted).to(weight.dtype)
    compensation.copy_(wanted - (new.float() - weight.float()))  # what the rounding dropped this time
    return new


def rounding_means(values, *, draws: int = 10_000, seed: int = 0):
    """For each value: its bfloat16 neighbours, round-to-nearest, and the mean of ``draws`` stochastic roundings."""
    import pandas as pd

    x = torch.tensor(values, dtype=torch.float32)
    lower, upper = bf16_neighbours(x)
    many = stochastic_round(x.expand(draws, -1).contiguous(), generator=torch.Generator().manual_seed(seed))
    rows = []
    for i, value in enumerate(x.tolist()):
        spacing = (upper[i] - lower[i]).item()
        rows.append(
            {
                "x (float32)": value,
                "lower BF16": lower[i].item(),
                "upper BF16": upper[i].item(),
                "P(up) = (x - lower) / spacing": (value - lower[i].item()) / spacing if spacing else 0.0,
                "round to nearest": x[i].to(torch.bfloat16).item(),
                f"share up in {draws} draws": (many[:, i].float() == upper[i]).float().mean().item(),
                f"mean of {draws} draws": many[:, i].double().mean().item(),
            }
        )
    return pd.DataFrame(rows)


def accumulate(start: float, step: float, count: int, *, trials: int = 200, seed: int = 0) -> dict:
    """Add ``step`` to ``start`` ``count`` times in bfloat16, ``trials`` times over, with each rounding method.

    Returns ``{method: float64 tensor of the ``trials`` final values}`` next to ``"exact"``: round-to-nearest
    loses every step smaller than half a spacing, stochastic rounding is right on average but spreads, Kahan
    summation stays within a spacing of the exact sum.
    """
    generator = torch.Generator().manual_seed(seed)
    update = torch.full((trials,), step, dtype=torch.float32)
    weights = {
        name: torch.full((trials,), start, dtype=torch.bfloat16)
        for name in ("nearest", "stochastic", "kahan")
    }
    compensation = torch.zeros(trials, dtype=torch.bfloat16)
    for _ in range(count):
        weights["nearest"] = nearest_add(weights["nearest"], update)
        weights["stochastic"] = stochastic_add(weights["stochastic"], update, generator=generator)
        weights["kahan"] = kahan_add(weights["kahan"], update, compensation)
    exact = torch.full((trials,), start + step * count, dtype=torch.float64)
    return {"exact": exact, **{name: w.double() for name, w in weights.items()}}
