"""Lesson 11: accumulation inside an FP8 matmul — a *simulation* of a narrow accumulator, not the hardware.

An FP8 matmul multiplies 8-bit inputs, but each output is a sum of K products, and the running sum is held in an
accumulator. If that accumulator keeps fewer bits than FP32, a long sum *swamps*: once the partial sum is large,
each new product is smaller than half the accumulator's spacing and is rounded away. DeepSeek-V3's report
(arXiv:2412.19437, section 3.3.2) states that the FP8 GEMM accumulation on NVIDIA H800 (Hopper) GPUs keeps
around 14 bits, and that promoting the partial sums to FP32 registers every 128 elements (N_C = 128) fixes it.

This module does not run any GPU instruction: it rounds a running sum in float64 to ``bits`` significant bits
after every addition (round to nearest, ties to even), which is what an accumulator of that width would do, and
optionally adds the partial sum into an FP32 total every ``promote_every`` products.
"""

from __future__ import annotations

import math

import torch


def round_to_bits(value: torch.Tensor, bits: int, rounding: str = "nearest") -> torch.Tensor:
    """``value`` (float64) kept to ``bits`` significant bits: ``"nearest"`` (ties to even) or ``"truncate"``
    (toward zero, as an adder that aligns and drops the low bits; no exponent limit either way)."""
    mantissa, exponent = torch.frexp(value)  # value = m * 2^e, |m| in [0.5, 1)
    scaled = torch.ldexp(mantissa, torch.full_like(exponent, bits))
    kept = torch.round(scaled) if rounding == "nearest" else torch.trunc(scaled)
    return torch.ldexp(kept, exponent - bits)


def narrow_dot(
    a: torch.Tensor,
    b: torch.Tensor,
    *,
    bits: int = 14,
    promote_every: int | None = None,
    rounding: str = "nearest",
) -> torch.Tensor:
    """Row-wise dot products ``(a * b).sum(-1)`` with a simulated ``bits``-bit accumulator.

    ``a``, ``b``: [rows, K] (FP8 values in any float dtype; their products are exact in float64). With
    ``promote_every = N`` the narrow partial sum is added into a float32 total every N products and restarted.
    """
    products = a.double() * b.double()
    total = torch.zeros(products.shape[0], dtype=torch.float32)
    partial = torch.zeros(products.shape[0], dtype=torch.float64)
    for k in range(products.shape[1]):
        partial = round_to_bits(partial + products[:, k], bits, rounding)
        if promote_every and (k + 1) % promote_every == 0:
            total = total + partial.float()
            partial = torch.zeros_like(partial)
    return total.double() + partial


def accumulation_errors(
    k_values=(256, 1024, 4096),
    *,
    rows: int = 32,
    bits: int = 14,
    promote_every: int = 128,
    seed: int = 0,
    dtype=torch.float8_e4m3fn,
):
    """Largest relative error of FP8 dot products of length K against the exact sum, per simulated accumulator:
    ``bits`` bits rounding to nearest, ``bits`` bits truncating, truncating but promoted to FP32 every
    ``promote_every`` products, and plain FP32 accumulation of the same products."""
    import pandas as pd

    g = torch.Generator().manual_seed(seed)
    table = {}
    for k in k_values:
        a = (torch.rand(rows, k, generator=g) + 0.1).to(dtype)  # positive inputs: the sum grows with K
        b = (torch.rand(rows, k, generator=g) + 0.1).to(dtype)
        exact = (a.double() * b.double()).sum(-1)
        variants = {
            f"{bits} bits, round to nearest": narrow_dot(a, b, bits=bits),
            f"{bits} bits, truncating": narrow_dot(a, b, bits=bits, rounding="truncate"),
            f"{bits} bits truncating, promoted every {promote_every}": narrow_dot(
                a, b, bits=bits, rounding="truncate", promote_every=promote_every
            ),
            "FP32 accumulator": (a.float() * b.float()).cumsum(-1)[:, -1].double(),
        }
        table[k] = {name: ((v - exact).abs() / exact.abs()).max().item() for name, v in variants.items()}
    frame = pd.DataFrame(table).T
    frame.index.name = "K"
    return frame


def swamping_limit(bits: int = 14) -> str:
    """When a product stops counting: a product below half the accumulator's spacing at the sum's size."""
    return (
        f"a {bits}-bit accumulator holding a sum near 2^k has spacing 2^(k - {bits - 1}): a product below "
        f"2^(k - {bits}) (a relative size of {math.ldexp(1.0, -bits):.1e}) is rounded away"
    )
