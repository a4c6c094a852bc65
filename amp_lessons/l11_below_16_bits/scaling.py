"""Lesson 11: scaled FP8: one scale per tensor, row, block or MX block, and what each one loses.

FP8 has so few bits that a tensor is never cast as it is: it is divided by a **scale** first, chosen so that its
largest magnitude (its *amax*) lands at the format's largest finite value (448 for E4M3FN, 57344 for E5M2), and the
scale travels with the 8-bit values (``x ~ q * scale``). One scale serves every value it covers, so the values far
below that amax fall into the format's coarse bottom binades or to zero. The finer the granularity (a scale per
tensor, per row, per block of 128 or of 32 elements), the closer each scale fits its values, at the price of more
scales to store and to apply.

The power-of-two scales of the OCP MX formats are stored in E8M0 (one byte): ``2^k``. Two rules pick ``k``:

- **ceil** (this lesson's exercise): the smallest power of two for which the block fits, ``amax / scale <= max``
  — no element saturates, at most a factor of two of range is wasted;
- **floor** (the OCP MX spec, torchao's default ``ScaleCalculationMode.FLOOR``): ``k = floor(log2 amax) - emax`` (8
  for E4M3), so ``amax / scale`` lies in ``[256, 512)``: the block's largest elements (above 448) saturate.

Everything here is plain torch and runs the same on a CPU and a GPU.
"""

from __future__ import annotations

import math

import torch

RULES = ("amax", "ceil", "floor")
GRANULARITIES = {
    "per tensor": None,
    "per row": "row",
    "1x128 blocks": 128,
    "MX: 1x32 blocks, E8M0 scales": 32,
}


def fp8_max(dtype) -> float:
    """The largest finite value of an 8-bit format (``torch.finfo(dtype).max``): 448, 57344."""
    return float(torch.finfo(dtype).max)


def _emax(dtype) -> int:
    """The exponent of the format's largest power of two: 8 for E4M3FN (256), 15 for E5M2."""
    return math.frexp(fp8_max(dtype))[1] - 1


def block_scales(amax: torch.Tensor, dtype, rule: str = "amax") -> torch.Tensor:
    """float32 scales for blocks whose largest magnitudes are ``amax`` (any shape), by ``rule``.

    ``amax``: the amax maps to the format's max; ``ceil``: the smallest power of two with ``amax / scale <= max``
    (exactly, with ``frexp``); ``floor``: OCP MX's ``2^(floor(log2 amax) - emax)``. An all-zero block gets scale 1.
    """
    if rule not in RULES:
        raise ValueError(f"rule must be one of {RULES}; got {rule!r}")
    amax = amax.float()
    top = fp8_max(dtype)
    zero = amax == 0
    safe = torch.where(zero, torch.ones_like(amax), amax)
    if rule == "amax":
        scale = safe / top
    elif rule == "ceil":
        mantissa, exponent = torch.frexp(safe / top)  # safe/top = m * 2^e, m in [0.5, 1)
        scale = torch.ldexp(torch.ones_like(safe), exponent - (mantissa == 0.5).int())
        scale = torch.where(safe / scale > top, scale * 2, scale)  # the division rounded: one step up
    else:
        _, exponent = torch.frexp(safe)  # floor(log2 amax) = exponent - 1
        scale = torch.ldexp(torch.ones_like(safe), exponent - 1 - _emax(dtype))
    return torch.where(zero, torch.ones_like(scale), scale)


def quantize_blockwise(x: torch.Tensor, block, dtype=torch.float8_e4m3fn, rule: str = "amax"):
    """``(q, scales)``: ``x`` [rows, cols] in ``dtype`` with one scale per ``block`` consecutive elements of a row.

    ``block`` is an int (``cols % block == 0``), ``"row"`` (one scale per row) or None (one for the tensor).
    ``q`` is ``x / scale`` saturated to +-max before the cast, so no build's cast can turn it into NaN.
    """
    rows, cols = x.shape
    width = cols if block == "row" else (rows * cols if block is None else int(block))
    if block is not None and block != "row" and cols % width:
        raise ValueError(f"cols = {cols} is not a multiple of block = {width}")
    groups = x.float().reshape(-1, width)
    scales = block_scales(groups.abs().amax(dim=1), dtype, rule)
    top = fp8_max(dtype)
    q = (groups / scales[:, None]).clamp(-top, top).to(dtype)
    shape = (1, 1) if block is None else (rows, 1 if block == "row" else cols // width)
    return q.reshape(rows, cols), scales.reshape(shape)


def dequantize_blockwise(q: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """``q.float() * scale``, each scale repeated over its block of consecutive elements of a row."""
    rows, cols = q.shape
    per_row = scales.reshape(rows, -1) if scales.numel() != 1 else scales.reshape(1, 1).expand(rows, 1)
    width = cols // per_row.shape[1]
    return q.float() * per_row.repeat_interleave(width, dim=1)


def sqnr_db(reference: torch.Tensor, approximation: torch.Tensor) -> float:
    """Signal-to-quantisation-noise ratio in dB: ``10 log10(sum x^2 / sum (x - x~)^2)`` (inf when exact)."""
    signal = reference.double().pow(2).sum().item()
    noise = (reference.double() - approximation.double()).pow(2).sum().item()
    return math.inf if noise == 0 else 10 * math.log10(signal / noise)


def scale_bytes(rows: int, cols: int, block, scale_dtype_bytes: int = 4) -> int:
    """Bytes the scales of one [rows, cols] tensor take (float32 scales: 4 bytes each, E8M0: 1)."""
    count = 1 if block is None else rows * (1 if block == "row" else cols // int(block))
    return count * scale_dtype_bytes


def outlier_activations(
    rows: int = 256,
    cols: int = 512,
    *,
    outlier_features: int = 6,
    gain: float = 60.0,
    seed: int = 0,
    device="cpu",
) -> torch.Tensor:
    """An activation matrix like a transformer's: Gaussian values, a few *feature columns* ~``gain`` times
    larger in every row (the outlier features of large language models) and a few louder rows (tokens)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, cols, generator=g)
    features = torch.randperm(cols, generator=g)[:outlier_features]
    x[:, features] *= gain
    loud_rows = torch.randperm(rows, generator=g)[: max(1, rows // 32)]
    x[loud_rows] *= 8.0
    return x.to(device)


def granularity_table(x: torch.Tensor, dtype=torch.float8_e4m3fn):
    """One row per granularity: SQNR (dB), the share of non-zero values flushed to zero and the share saturated,
    how many scales and how many bytes they cost (float32 scales; one E8M0 byte for MX), bits per element."""
    import pandas as pd

    rows = []
    for name, block in GRANULARITIES.items():
        for rule in ("floor", "ceil") if block == 32 else ("amax",):
            q, scales = quantize_blockwise(x, block, dtype, rule)
            label = name if rule != "ceil" else "MX, ceil rule (exercise 11.1)"
            rows.append(_granularity_row(label, x, q, scales, rule, dtype))
    table = pd.DataFrame(rows).set_index("granularity")
    table.attrs["shape"] = tuple(x.shape)
    return table


def _granularity_row(name, x, q, scales, rule, dtype) -> dict:
    back = dequantize_blockwise(q, scales)
    per_element = dequantize_blockwise(torch.ones_like(q, dtype=torch.float32), scales)
    nonzero = x != 0
    count = max(int(nonzero.sum()), 1)
    scale_size = 1 if rule in ("floor", "ceil") else 4
    return {
        "granularity": name,
        "scale rule": {"amax": "amax -> max", "floor": "2^k, OCP floor", "ceil": "2^k, ceil"}[rule],
        "SQNR (dB)": round(sqnr_db(x, back), 2),
        "flushed to zero": int(((back == 0) & nonzero).sum()) / count,
        "saturated": int((x.abs() / per_element > fp8_max(dtype)).sum()) / count,
        "scales": scales.numel(),
        "scale bytes": scales.numel() * scale_size,
        "scale bits per element": 8 * scales.numel() * scale_size / x.numel(),
    }


def granularity_figure(table, axes=None):
    """Two panels per granularity: SQNR (higher is better) and the share of values flushed to zero (log scale),
    each SQNR bar labelled with the bytes its scales cost."""
    import matplotlib.pyplot as plt

    if axes is None:
        _, axes = plt.subplots(1, 2, figsize=(11, 3.4), sharey=True)
    names = list(table.index)
    colours = ["#90a4ae", "#64b5f6", "#1e88e5", "#fb8c00", "#43a047"][: len(names)]
    values = table["SQNR (dB)"].tolist()
    bars = axes[0].barh(names, values, color=colours)
    for bar, value, cost in zip(bars, values, table["scale bytes"].tolist()):
        axes[0].text(
            bar.get_width() + 0.3,
            bar.get_y() + bar.get_height() / 2,
            f"{value:.1f} dB, {cost} B",
            va="center",
        )
    axes[0].invert_yaxis()
    axes[0].set_xlim(0, max(values) * 1.5)
    axes[0].set_xlabel("SQNR in dB (higher = closer to FP32)")
    flushed = [max(v, 1e-6) for v in table["flushed to zero"].tolist()]
    axes[1].barh(names, flushed, color=colours)
    axes[1].set_xscale("log")
    axes[1].set_xlabel("share of non-zero values flushed to 0 (log)")
    rows, cols = table.attrs.get("shape", ("?", "?"))
    plt.suptitle(f"E4M3FN: a {rows}x{cols} activation with outlier features, per scaling granularity")
    plt.tight_layout()
    return axes


# ------------------------------------------------------------------------------- lost values per scale choice


def lost_shares(tensors: dict, dtypes: dict):
    """Share of each tensor's non-zero values lost to zero or to saturation under three scale choices.

    ``tensors``: ``{name: tensor}``; ``dtypes``: ``{name: torch.float8_*}``. The choices: **no scale** (cast as it
    is), **one global scale** (the amax of *every* tensor together maps to the max: one number for the whole
    model) and **a scale per tensor** (each tensor's own amax -> max, what torchao's tensorwise recipe does).
    """
    import pandas as pd

    global_amax = max(t.abs().max().item() for t in tensors.values())
    rows = []
    for name, t in tensors.items():
        dtype = dtypes[name]
        top = fp8_max(dtype)
        amax = t.abs().max().item()
        for choice, scale in (
            ("no scale", 1.0),
            ("one global scale", global_amax / top),
            ("scale per tensor", amax / top),
        ):
            lost_zero, saturated = _lost(t.float(), scale, dtype)
            rows.append(
                {
                    "tensor": name,
                    "format": str(dtype).removeprefix("torch."),
                    "amax": amax,
                    "scale choice": choice,
                    "lost to zero": lost_zero,
                    "saturated": saturated,
                }
            )
    return pd.DataFrame(rows)


def _lost(t: torch.Tensor, scale: float, dtype) -> tuple[float, float]:
    """(share of non-zero values that become 0, share beyond the format's max) when ``t / scale`` is cast."""
    nonzero = t != 0
    scaled = t / scale
    top = fp8_max(dtype)
    stored = scaled.clamp(-top, top).to(dtype).float()
    count = max(int(nonzero.sum()), 1)
    return (
        int(((stored == 0) & nonzero).sum()) / count,
        int((scaled.abs() > top * (1 + 1e-6)).sum()) / count,
    )
