"""Lesson 05: read skipped updates from GradScaler's scale history — how often, and the trend.

GradScaler lowers its scale exactly when it found inf/NaN gradients and skipped the optimizer step, and
raises it after ``growth_interval`` clean steps. So the list of scales over a run (``scaler.get_scale()``
before the first step and after each one) says which updates were skipped without any extra hook. A count
alone misleads: early skips while the scale falls are calibration, a rare skip after each growth is
probing, and only skipping most steps late in the run is a problem (go and find the first non-finite
value with ``amp_lessons.l05_nan_debugging.find_first_nonfinite``).
"""

from __future__ import annotations

import math

from amp_lessons.l03_autocast_and_gradscaler.training import step_was_skipped


def _reading(skips: list, start: int, stop: int, first_growth: int) -> str:
    """What the skips of steps ``start..stop`` mean: none, calibration, persistent or probing."""
    skipped = sum(skips[start : stop + 1])
    last_skip = max((i for i in range(start, stop + 1) if skips[i]), default=0)
    if skipped == 0:
        return "no skips"
    if start == 1 and last_skip < first_growth and not skips[stop]:
        return "calibration: initial scale too large"  # skips at the start, then clean steps
    if skipped / (stop - start + 1) >= 0.5:
        return "persistent: most updates skipped"
    return "probing: scale grew, then backed off"


def scale_history_table(scales, *, window: int):
    """Per window of steps: how many updates GradScaler skipped, how often it grew, and what that means.

    ``scales[0]`` is ``scaler.get_scale()`` before the first step and ``scales[i]`` the value after
    step ``i``. GradScaler lowers the scale exactly when it found inf/NaN gradients and skipped the
    optimizer step, and raises it after ``growth_interval`` clean steps — so a drop marks a skipped
    update (a scale that collapsed to 0 skips every step: 0 * inf is NaN). Reading: skips only in the
    first window while the scale falls is *calibration* (the initial scale was too large); an occasional
    skip after each growth is *probing*, healthy; skipping most steps is *persistent*: something
    overflows whatever the scale, go and find it.
    """
    import pandas as pd

    values = [float(s) for s in scales]
    if len(values) < 2:
        raise ValueError(
            "scale_history_table needs the scale before the first step and after at least one step."
        )
    if not isinstance(window, int) or window < 1:
        raise ValueError(f"window must be a positive int (steps per row), got {window!r}")
    steps = len(values) - 1
    rows = []
    skips = [False] + [step_was_skipped(values[i - 1], values[i]) for i in range(1, steps + 1)]
    first_growth = next((i for i in range(1, steps + 1) if values[i] > values[i - 1]), steps + 1)
    for start in range(1, steps + 1, window):
        stop = min(start + window - 1, steps)
        skipped = sum(skips[start : stop + 1])
        grown = sum(1 for i in range(start, stop + 1) if values[i] > values[i - 1])
        rate = skipped / (stop - start + 1)
        rows.append(
            {
                "steps": f"{start}-{stop}",
                "skipped": skipped,
                "skip rate": round(rate, 3),
                "scale grew": grown,
                "scale at end": values[stop],
                "reading": _reading(skips, start, stop, first_growth),
            }
        )
    return pd.DataFrame(rows)


def skip_verdict(table) -> str:
    """One sentence about a whole run, from ``scale_history_table``: trend matters more than the count."""
    if table is None or len(table) == 0:
        raise ValueError("skip_verdict needs a non-empty table from scale_history_table")
    late = table.iloc[len(table) // 2 :]
    total = int(table["skipped"].sum())
    if float(late["skip rate"].mean()) >= 0.5:
        return (
            f"PROBLEM: {total} skipped updates and still skipping most steps late in the run — something "
            "overflows at every scale. Find the first non-finite value."
        )
    end_scale = float(table["scale at end"].iloc[-1])
    if end_scale < 1:
        return (
            f"PROBLEM: the scale has fallen to {end_scale:.3g} ({total} skipped updates): even unscaled "
            "gradients overflow. Find the first non-finite value."
        )
    if total == 0:
        return "Healthy: no update was skipped."
    return (
        f"Healthy: {total} skipped updates — early calibration and occasional probing; late in the run "
        "the skip rate stays low and the scale does not keep falling."
    )


def plot_scale_history(histories: dict):
    """The loss scale over steps (log2 axis), one panel per run, skipped updates marked with x.

    One panel each, because a healthy run moves by a few powers of two while a broken one falls by
    hundreds: on a shared axis the healthy run's calibration and probing would be invisible.
    """
    import matplotlib.pyplot as plt

    if not isinstance(histories, dict) or not histories:
        raise TypeError(
            "plot_scale_history needs a dict {run name: list of scales (before step 1, after each step)}"
        )
    figure, axes = plt.subplots(1, len(histories), figsize=(4.5 * len(histories), 3.2), squeeze=False)
    for ax, (label, scales) in zip(axes[0], histories.items()):
        values = [float(s) for s in scales]
        logs = [math.log2(v) if v > 0 else float("nan") for v in values]
        ax.plot(range(len(values)), logs, color="#1e88e5")
        skips = [i for i in range(1, len(values)) if step_was_skipped(values[i - 1], values[i])]
        ax.plot(skips, [logs[i] for i in skips], "x", color="#e53935", markersize=6, label="skipped update")
        collapsed = next((i for i, v in enumerate(values) if v <= 0), None)
        if collapsed is not None:
            ax.annotate(
                f"scale reached 0 at step {collapsed}",
                xy=(collapsed, logs[collapsed - 1]),
                fontsize=8,
                xytext=(0.35, 0.85),
                textcoords="axes fraction",
                arrowprops={"arrowstyle": "->"},
            )
        ax.set_title(f"{label}: {len(skips)} skipped of {len(values) - 1}", fontsize=10)
        ax.set_xlabel("step")
        ax.set_ylabel("log2(loss scale)")
        ax.legend(fontsize=8, loc="best")
    figure.suptitle(
        "GradScaler's scale over a real run (x = update skipped: inf/NaN gradients found)", fontsize=11
    )
    figure.tight_layout()
    return figure
