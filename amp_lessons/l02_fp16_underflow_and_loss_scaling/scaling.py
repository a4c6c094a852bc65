"""Lesson 02: where real gradients land on the FP16/BF16 number lines, and what loss scaling does to that.

The numerics in one paragraph. Casting an FP32 value to FP16 keeps it *normal* (full 11-bit precision)
only between 2^-14 and 65504. Below 2^-14 it becomes *subnormal*: still nonzero, but with fewer and fewer
significant bits, down to the smallest subnormal 2^-24. Below that it rounds to zero (round to nearest:
values above 2^-25 round *up* to 2^-24, values at or below 2^-25 round to 0). Above 65504 it rounds to
inf (values below 65520 still round *down* to 65504). BF16 has FP32's exponent range (normal from 2^-126,
subnormal down to 2^-133, max about 3.4e38) and only 8 bits of precision, so gradients never under- or
overflow in BF16, they only get coarser.

Loss scaling multiplies the loss by ``scale`` before ``backward()``; by the chain rule every gradient is
multiplied by ``scale`` as well, which shifts the whole magnitude histogram right by log2(scale) octaves:
what was below 2^-24 moves into FP16's range, and what was near the top moves past 65504.

Everything here classifies by *casting* (``(values * scale).to(dtype)``), never by comparing with a
threshold, so rounding at both ends is exactly what the hardware does.
"""

from __future__ import annotations

import math
import numbers

import torch
from torch import nn

from amp_lessons.core.environment import dtype_name
from amp_lessons.l01_precision_formats.formats import FloatFormat, get_format

LOW_PRECISION = (torch.float16, torch.bfloat16)
CATEGORIES = ("zero", "subnormal", "normal", "inf")


def _check_dtype(dtype) -> torch.dtype:
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise TypeError(f"dtype must be a floating-point torch dtype such as torch.float16, not {dtype!r}")
    return dtype


def _check_scale(scale) -> float:
    if (
        isinstance(scale, bool)
        or not isinstance(scale, (int, float))
        or not math.isfinite(scale)
        or scale <= 0
    ):
        raise ValueError(f"scale must be a positive, finite number such as 2.0**16, not {scale!r}")
    return float(scale)


def limits(dtype: torch.dtype) -> FloatFormat:
    """The thresholds that matter for gradients (``smallest_subnormal``, ``smallest_normal``, ``max``, and
    their ``log2()``) of float16, bfloat16 or float32: the course's
    :class:`~amp_lessons.l01_precision_formats.formats.FloatFormat`."""
    return get_format(_check_dtype(dtype))


def flat_values(values) -> torch.Tensor:
    """One 1-D FP32 tensor from a tensor, or a list/dict of tensors (e.g. all gradients of a model)."""
    if isinstance(values, dict):
        values = list(values.values())
    if isinstance(values, torch.Tensor):
        values = [values]
    if not isinstance(values, (list, tuple)) or not all(isinstance(v, torch.Tensor) for v in values):
        raise TypeError("expected a tensor, or a list or dict of tensors (e.g. the gradients you captured)")
    if not values:
        return torch.zeros(0)
    devices = {v.device for v in values}
    device = values[0].device if len(devices) == 1 else torch.device("cpu")
    return torch.cat([v.detach().reshape(-1).to(device=device, dtype=torch.float32) for v in values])


def classify(values, dtype: torch.dtype = torch.float16, scale: float = 1.0) -> dict:
    """Count what casting ``values * scale`` to ``dtype`` does to every nonzero, finite FP32 value.

    Returns a dict of counts: ``nonzero`` (the values considered), ``zero`` (underflow: nonzero in FP32,
    exactly 0 after the cast), ``subnormal`` (nonzero but below the smallest normal: precision lost),
    ``normal``, ``inf`` (overflow), and ``skipped`` (values that were already zero, inf or NaN before
    the cast, which loss scaling cannot change). The multiplication happens in FP32, before the cast,
    as it does when the loss is scaled before ``backward()``.
    """
    dtype, scale = _check_dtype(dtype), _check_scale(scale)
    flat = flat_values(values)
    keep = torch.isfinite(flat) & (flat != 0)
    cast = (flat[keep] * scale).to(dtype)
    magnitude = cast.abs()
    zero = int((cast == 0).sum())
    inf = int(torch.isinf(cast).sum())
    subnormal = int(((magnitude > 0) & (magnitude < torch.finfo(dtype).smallest_normal)).sum())
    nonzero = int(keep.sum())
    return {
        "nonzero": nonzero,
        "zero": zero,
        "subnormal": subnormal,
        "normal": nonzero - zero - inf - subnormal,
        "inf": inf,
        "skipped": flat.numel() - nonzero,
    }


def _as_fractions(counts: dict) -> dict:
    total = counts["nonzero"]
    return {key: (counts[key] / total if total else 0.0) for key in CATEGORIES}


def fractions(values, dtype: torch.dtype = torch.float16, scale: float = 1.0) -> dict:
    """``classify`` as fractions of the nonzero finite values (all 0.0 when there are none)."""
    return _as_fractions(classify(values, dtype, scale))


def scale_table(groups: dict, exponent: int, dtypes=LOW_PRECISION):
    """The table the slider redraws: one row per (gradient group, format) at ``scale = 2**exponent``.

    Columns are fractions of the group's nonzero FP32 values: ``zero`` (lost to underflow),
    ``subnormal`` (kept with reduced precision), ``normal``, ``inf`` (lost to overflow), and
    ``step skipped`` — whether a GradScaler would skip this step because at least one value overflowed.
    """
    import pandas as pd

    exponent = _check_exponent(exponent)
    rows = []
    for group, values in _check_groups(groups).items():
        for dtype in dtypes:
            counts = classify(values, dtype, 2.0**exponent)
            row = {
                "gradients": group,
                "format": dtype_name(dtype),
                "scale": f"2^{exponent}",
                "values": counts["nonzero"],
            }
            row.update(_as_fractions(counts))
            row["step skipped"] = counts["inf"] > 0
            rows.append(row)
    return pd.DataFrame(rows)


def scale_sweep(groups: dict, exponents=(0, 8, 16, 24), dtype: torch.dtype = torch.float16):
    """Underflow / subnormal / overflow fractions for each group at each ``2**exponent`` (one dtype)."""
    import pandas as pd

    frames = [scale_table(groups, e, dtypes=(dtype,)) for e in exponents]
    return pd.concat(frames, ignore_index=True)


def style_table(table):
    """Percent formatting for display (the DataFrame itself keeps plain fractions for code and tests)."""
    columns = [c for c in CATEGORIES if c in table.columns]
    return table.style.format({c: "{:.2%}" for c in columns}).hide(axis="index")


def _check_exponent(exponent) -> int:
    whole = isinstance(exponent, numbers.Integral) or (isinstance(exponent, float) and exponent.is_integer())
    if isinstance(exponent, bool) or not whole:
        raise TypeError(f"exponent must be an integer (the scale is 2**exponent), not {exponent!r}")
    exponent = int(exponent)
    if not -64 <= exponent <= 64:
        raise ValueError(f"exponent {exponent} is outside -64..64; loss scales live around 2^0..2^32")
    return exponent


def _check_groups(groups) -> dict:
    if isinstance(groups, torch.Tensor):
        return {"gradients": groups}
    if not isinstance(groups, dict) or not groups:
        raise TypeError(
            "expected a dict such as {'parameter gradients': tensor, 'activation gradients': tensor}"
        )
    return {str(k): flat_values(v) for k, v in groups.items()}


def log_uniform(n: int, low: float, high: float, seed: int, signed: bool = True) -> torch.Tensor:
    """``n`` FP32 magnitudes spread evenly in log2 between 2^low and 2^high (random signs), like gradients."""
    generator = torch.Generator().manual_seed(seed)
    exponents = torch.rand(n, generator=generator, dtype=torch.float64) * (high - low) + low
    values = torch.exp2(exponents)
    if signed:
        signs = torch.randint(0, 2, (n,), generator=generator, dtype=torch.float64) * 2 - 1
        values = values * signs
    return values.float()


# ----------------------------------------------------------------------------- capturing gradients


def parameter_gradients(model: nn.Module) -> dict:
    """name -> a detached copy of ``param.grad`` for every parameter that has one."""
    return {name: p.grad.detach().clone() for name, p in model.named_parameters() if p.grad is not None}


class ActivationGradients:
    """Record the gradient of the loss with respect to the *output* of every module of the given types.

    Use as a context manager around the forward *and* backward pass::

        with ActivationGradients(model) as recorder:
            loss = loss_fn(model(x), y)
            loss.backward()
        recorder.grads   # {"layers.0": tensor, ...}, each in the dtype autograd produced

    A forward hook attaches a tensor hook to each output; autograd calls it with the gradient as it
    flows back. Under ``torch.autocast(dtype=torch.float16)`` a Linear's output is FP16, so the gradient
    recorded for it is FP16 too: these are the values that really underflow, not a model of them.
    """

    def __init__(self, model: nn.Module, types=(nn.Linear,)):
        if not isinstance(model, nn.Module):
            raise TypeError(f"ActivationGradients needs an nn.Module, not {type(model).__name__}")
        self.modules = {name: m for name, m in model.named_modules() if isinstance(m, types)}
        if not self.modules:
            raise ValueError(
                f"the model has no submodules of type {types}; pass types=... to choose what to hook"
            )
        self.grads: dict = {}
        self._handles: list = []

    def _forward_hook(self, name):
        def hook(module, inputs, output):
            if isinstance(output, torch.Tensor) and output.requires_grad:
                output.register_hook(lambda grad: self.grads.__setitem__(name, grad.detach().clone()))

        return hook

    def __enter__(self):
        self.grads = {}
        self._handles = [
            m.register_forward_hook(self._forward_hook(name)) for name, m in self.modules.items()
        ]
        return self

    def __exit__(self, *exc):
        for handle in self._handles:
            handle.remove()
        self._handles = []
        return False


def capture_gradients(model: nn.Module, inputs, targets, loss_fn, *, scale: float = 1.0) -> dict:
    """One FP32 forward/backward of ``loss_fn(model(inputs), targets) * scale``; returns the two groups.

    ``{"parameter gradients": 1-D FP32 tensor, "activation gradients": 1-D FP32 tensor}`` (flattened,
    concatenated over layers). The model's ``.grad`` fields are cleared before and left filled after.
    """
    scale = _check_scale(scale)
    model.zero_grad(set_to_none=True)
    with ActivationGradients(model) as recorder:
        loss = loss_fn(model(inputs), targets)
        (loss * scale).backward()
    return {
        "parameter gradients": flat_values(parameter_gradients(model)),
        "activation gradients": flat_values(recorder.grads),
    }


def per_layer_medians(model: nn.Module):
    """median log2 |weight.grad| per Linear layer, input side first (shows the per-layer shrink)."""
    import pandas as pd

    rows = []
    for name, module in model.named_modules():
        if isinstance(module, nn.Linear) and module.weight.grad is not None:
            g = module.weight.grad.detach().float().abs()
            g = g[g > 0]
            median = float(g.log2().median()) if g.numel() else float("nan")
            rows.append({"layer": name, "median log2 |weight grad|": round(median, 1)})
    table = pd.DataFrame(rows)
    if len(table):
        table["change vs previous layer (octaves)"] = table["median log2 |weight grad|"].diff().round(1)
    return table


# ----------------------------------------------------------------------------- plots and the slider

_ZONES = {"zero": "#e57373", "subnormal": "#ffb74d", "normal": "#81c784", "inf": "#e57373"}


def _log2_magnitudes(values, scale: float):
    import numpy as np

    flat = flat_values(values).cpu()
    flat = flat[torch.isfinite(flat) & (flat != 0)].double() * scale
    return np.log2(flat.abs().numpy())


def plot_magnitudes(
    groups: dict,
    exponent: int = 0,
    ax=None,
    dtype: torch.dtype = torch.float16,
    range_map: bool = True,
    xlim=None,
):
    """Histogram of log2 |gradient * 2**exponent| per group, on FP16's zones; optionally with a range map.

    The top strip (``range_map=True``) puts the gradients' range next to FP16's and BF16's whole
    ranges (2^-133 .. 2^128 for BF16), which would squash the histogram if drawn on the same axis.
    ``xlim`` fixes the log2 axis (``plot_sweep`` uses one axis for all panels so the shift shows).
    Returns the figure; the caller displays or closes it.
    """
    import matplotlib.pyplot as plt
    import numpy as np

    exponent = _check_exponent(exponent)
    groups = _check_groups(groups)
    scale = 2.0**exponent
    data = {name: _log2_magnitudes(v, scale) for name, v in groups.items()}
    own_figure = ax is None
    if own_figure:
        if range_map:
            fig, (top, ax) = plt.subplots(2, 1, figsize=(9, 5.2), height_ratios=(1, 3.2))
            _draw_range_map(top, data)
        else:
            fig, ax = plt.subplots(figsize=(9, 3.6))
    else:
        fig = ax.figure
    info = limits(dtype)
    low, normal, high = info.log2()
    finite = [d for d in data.values() if d.size]
    lo = min([math.floor(low) - 6] + [math.floor(d.min()) for d in finite])
    hi = max([math.ceil(high) + 3] + [math.ceil(d.max()) + 1 for d in finite])
    if xlim is not None:
        lo, hi = int(math.floor(xlim[0])), int(math.ceil(xlim[1]))
    ax.axvspan(lo, low - 1, color=_ZONES["zero"], alpha=0.25, lw=0)  # below 2^-25 rounds to 0
    ax.axvspan(low - 1, normal, color=_ZONES["subnormal"], alpha=0.25, lw=0)
    ax.axvspan(normal, high, color=_ZONES["normal"], alpha=0.18, lw=0)
    ax.axvspan(high, hi, color=_ZONES["inf"], alpha=0.25, lw=0)
    edges = np.arange(lo, hi + 1)
    for name, d in data.items():
        ax.hist(d, bins=edges, histtype="step", lw=2, label=f"{name} ({d.size:,} nonzero)")
    ax.set_yscale("log")
    ax.set_xlim(lo, hi)
    labels = (
        (low, f"smallest subnormal {info.smallest_subnormal:.3g}"),
        (normal, f"smallest normal {info.smallest_normal:.3g}"),
        (high, f"max {info.max:.6g}"),
    )
    for position, text in labels:
        ax.axvline(position, color="k", ls="--", lw=1)
        ax.text(
            position,
            0.03,
            text + " ",
            rotation=90,
            va="bottom",
            ha="right",
            fontsize=7,
            transform=ax.get_xaxis_transform(),
        )
    ax.set_xlabel(f"log2 |gradient × 2^{exponent}|   (1-octave bins)")
    ax.set_ylabel("count")
    ax.set_title(
        f"Scale 2^{exponent}: red → 0 or inf in {dtype_name(dtype)}, orange → subnormal, green → normal",
        fontsize=10,
    )
    ax.legend(loc="upper right", fontsize=8, framealpha=0.9)
    if own_figure:  # a caller that passed ``ax`` lays out its own figure, once
        fig.tight_layout()
    return fig


def _draw_range_map(ax, data: dict) -> None:
    rows = []
    for dtype in LOW_PRECISION:
        sub, normal, top = limits(dtype).log2()
        rows.append((f"{dtype_name(dtype)} subnormal", sub, normal, _ZONES["subnormal"]))
        rows.append((f"{dtype_name(dtype)} normal", normal, top, _ZONES["normal"]))
    for name, d in data.items():
        if d.size:
            rows.append((name, float(d.min()), float(d.max()), "#5c6bc0"))
    for i, (label, start, stop, colour) in enumerate(rows):
        ax.barh(i, stop - start, left=start, color=colour, height=0.7)
        ax.text(stop + 2, i, label, va="center", fontsize=7)
    ax.set_yticks([])
    ax.set_xlim(-140, 175)
    ax.invert_yaxis()
    ax.set_title("Whole ranges on one log2 axis: BF16 covers every gradient; FP16 only a slice", fontsize=10)


def plot_sweep(groups: dict, exponents=(0, 8, 16, 24), dtype: torch.dtype = torch.float16):
    """One histogram panel per loss scale on a shared log2 axis, so the histogram visibly moves right
    past FP16's fixed zones as the scale grows (returns the figure)."""
    import matplotlib.pyplot as plt

    groups = _check_groups(groups)
    exponents = [_check_exponent(e) for e in exponents]
    magnitudes = [_log2_magnitudes(v, 1.0) for v in groups.values()]
    magnitudes = [m for m in magnitudes if m.size]
    low, _, high = limits(dtype).log2()
    lo = min([low - 4] + [float(m.min()) + min(exponents) for m in magnitudes])
    hi = max([high + 3] + [float(m.max()) + max(exponents) + 1 for m in magnitudes])
    columns = 2 if len(exponents) > 1 else 1
    rows = math.ceil(len(exponents) / columns)
    fig, axes = plt.subplots(rows, columns, figsize=(11, 2.9 * rows + 0.4), squeeze=False, sharey=True)
    for ax, exponent in zip(axes.flat, exponents):
        plot_magnitudes(groups, exponent, ax=ax, dtype=dtype, range_map=False, xlim=(lo, hi))
        counts = {name: fractions(values, dtype, 2.0**exponent) for name, values in groups.items()}
        lost = "; ".join(
            f"{name.split()[0]}: {c['zero']:.2%} → 0, {c['inf']:.2%} → inf" for name, c in counts.items()
        )
        ax.set_title(f"scale 2^{exponent}   ({lost})", fontsize=8.5)
        ax.get_legend().remove()
    for ax in list(axes.flat)[len(exponents) :]:
        ax.set_visible(False)
    handles, labels = axes.flat[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="upper center", ncol=len(labels), fontsize=9, frameon=False)
    fig.tight_layout(rect=(0, 0, 1, 0.95))
    return fig


def scale_view(groups: dict, exponent: int):
    """The slider's logic: (figure, table) for ``scale = 2**exponent``. Tests call this without a browser."""
    figure = plot_magnitudes(groups, exponent)
    return figure, scale_table(groups, exponent)


def scale_explorer(groups: dict, exponent: int = 0, max_exponent: int = 32):
    """A slider for log2(scale) that redraws the histogram and the table (ipywidgets)."""
    import ipywidgets as widgets
    import matplotlib.pyplot as plt
    from IPython.display import display

    groups = _check_groups(groups)
    slider = widgets.IntSlider(
        value=exponent, min=0, max=max_exponent, step=1, description="log2(scale)", continuous_update=False
    )

    def redraw(exponent):
        figure, table = scale_view(groups, exponent)
        display(figure)
        plt.close(figure)
        display(style_table(table))

    output = widgets.interactive_output(redraw, {"exponent": slider})
    return widgets.VBox([slider, output])
