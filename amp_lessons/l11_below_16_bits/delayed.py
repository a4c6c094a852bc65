"""Lesson 11: delayed vs current scaling: an amax history, and the step a spike arrives.

*Current* (dynamic) scaling computes each tensor's amax at the moment it is cast: one extra reduction over the
tensor, and always the right scale. *Delayed* scaling (Transformer Engine's default, the FP8 sibling of lesson
03's GradScaler) takes the scale from the largest amax of the last ``history`` steps and records the current amax
only *after* the cast: no waiting for the reduction, but a value larger than anything in the history saturates at
the format's max on the step it arrives. For the next ``history`` steps the spike's amax then dominates the
scale, so the ordinary values sit lower in the format.

With several ranks the amax must be the maximum over every rank (an all-reduce): a tensor that is replicated or
sharded across ranks must be cast with *one* scale everywhere, or the ranks hold different FP8 copies of the same
numbers and the all-gathered weight (or the summed gradient) mixes scales.
"""

from __future__ import annotations

import torch

from amp_lessons.l11_below_16_bits.scaling import fp8_max


def activation_stream(
    steps: int = 40, *, spike_at: int = 30, spike: float = 40.0, size: int = 4096, seed: int = 0
):
    """``steps`` activation tensors with a slowly drifting amax, and one step whose few values are ``spike`` x."""
    g = torch.Generator().manual_seed(seed)
    stream = []
    for step in range(steps):
        x = torch.randn(size, generator=g) * (1.0 + 0.01 * step)
        if step == spike_at:
            x[:8] *= spike
        stream.append(x)
    return stream


def _cast_error(x: torch.Tensor, scale: float, dtype) -> tuple[float, float, float]:
    """(saturated share, relative error of the largest value, median relative error) of ``x / scale`` in FP8."""
    top = fp8_max(dtype)
    scaled = x / scale
    back = scaled.clamp(-top, top).to(dtype).float() * scale
    big = x.abs().argmax()
    relative = ((back - x).abs() / x.abs().clamp_min(1e-30))[x != 0]
    return (
        float((scaled.abs() > top).float().mean()),
        float((back[big] - x[big]).abs() / x[big].abs()),
        float(relative.median()),
    )


def delayed_vs_current(stream, *, history: int = 16, dtype=torch.float8_e4m3fn):
    """Per step: the scale each method uses, the share of values saturated, and the error of the largest value.

    Delayed: ``scale = max(amax history) / max`` with the history of the *previous* steps (the first step has no
    history and uses its own amax, as an initial calibration); current: ``scale = amax(x) / max``.
    """
    import pandas as pd

    top = fp8_max(dtype)
    amaxes: list[float] = []
    rows = []
    for step, x in enumerate(stream):
        amax = x.abs().max().item()
        delayed_scale = max(amaxes[-history:] or [amax]) / top
        current_scale = amax / top
        d_sat, d_big, d_med = _cast_error(x, delayed_scale, dtype)
        c_sat, c_big, c_med = _cast_error(x, current_scale, dtype)
        rows.append(
            {
                "step": step,
                "amax": amax,
                "delayed scale": delayed_scale,
                "current scale": current_scale,
                "delayed: saturated": d_sat,
                "delayed: error of the largest": d_big,
                "current: error of the largest": c_big,
                "delayed: median rel. error": d_med,
                "current: median rel. error": c_med,
            }
        )
        amaxes.append(amax)  # recorded after the cast: the history never sees the current step in time
    return pd.DataFrame(rows).set_index("step")


def rank_amaxes(world_size: int = 2, *, size: int = 4096, seed: int = 1, dtype=torch.float8_e4m3fn):
    """The amax each rank sees of its own shard, the all-reduced amax, and the scales: local vs shared."""
    import pandas as pd

    g = torch.Generator().manual_seed(seed)
    shards = [torch.randn(size, generator=g) * (1 + 3 * rank) for rank in range(world_size)]
    local = [s.abs().max().item() for s in shards]
    shared = max(local)  # torch.distributed.all_reduce(amax, op=ReduceOp.MAX) on real ranks
    top = fp8_max(dtype)
    return pd.DataFrame(
        {
            "rank": list(range(world_size)),
            "local amax": local,
            "local scale": [a / top for a in local],
            "all-reduced scale": [shared / top] * world_size,
        }
    ).set_index("rank")


def spike_figure(table, spike_at: int, ax=None):
    """The amax per step and the delayed scale's amax (scale x max), with the spike marked."""
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(8, 3.2))
    top = table["amax"] / table["current scale"]
    ax.plot(table.index, table["amax"], "o-", label="amax of this step (current scaling uses it)")
    ax.plot(table.index, table["delayed scale"] * top, "s--", label="amax the delayed scale covers (history)")
    ax.axvline(spike_at, color="#c62828", alpha=0.4, label="the spike")
    ax.set_yscale("log")
    ax.set_xlabel("step")
    ax.set_ylabel("amax (log)")
    ax.legend(fontsize=8)
    ax.set_title(
        "Delayed scaling learns of a spike one step too late, then remembers it for the whole history"
    )
    return ax
