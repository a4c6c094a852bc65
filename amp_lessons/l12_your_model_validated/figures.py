"""Lesson 12: the report's figures, drawn with the earlier lessons' plots and embedded as base64 PNGs.

Why PNGs inside the HTML: the report must open offline, attached to a ticket or a CI artifact, with no
folder of images next to it. Figures are drawn on matplotlib ``Figure`` objects (the Agg canvas), never shown,
so a notebook that calls ``validate`` gets no stray inline figures and its backend is left alone.
"""

from __future__ import annotations

import base64
import io
import math

__all__ = ["loss_figure", "margins_figure", "scale_figure", "speed_figure", "start_warming", "to_png"]


def _warm() -> None:
    import matplotlib.figure  # noqa: F401
    from matplotlib.backends import backend_agg  # noqa: F401

    import amp_lessons.l04_baseline_and_decision_boundary.risk  # noqa: F401


def start_warming():
    """Import matplotlib in a background thread while the model runs (a second or more on a cold start), so the
    report's figures do not wait for it; returns the thread (``join`` it before drawing)."""
    import threading

    thread = threading.Thread(target=_warm, name="amp-validate-warm-matplotlib", daemon=True)
    thread.start()
    return thread


def _figure(width: float, height: float, columns: int = 1):
    from matplotlib.figure import Figure

    figure = Figure(figsize=(width, height), dpi=72)
    axes = figure.subplots(1, columns, squeeze=False)[0]
    return figure, list(axes)


def to_png(figure) -> str:
    """The figure as a base64-encoded PNG (for ``<img src="data:image/png;base64,...">``)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    FigureCanvasAgg(figure)
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png")
    return base64.b64encode(buffer.getvalue()).decode("ascii")


def margins_figure(reports: dict, data: dict):
    """Lesson 04's margin plot per dtype: how close each sample was to a flip, how far its scores moved."""
    from amp_lessons.l04_baseline_and_decision_boundary.risk import margin_plot

    usable = {name: r for name, r in reports.items() if "reference margin" in r.table}
    if not usable:
        return None
    criteria = data["criteria"]
    tolerance = criteria["atol"] + criteria["rtol"] * (data["reference"].get("max_abs_score") or 0.0)
    figure, axes = _figure(6.5 * len(usable), 4.2, len(usable))
    for ax, (name, report) in zip(axes, usable.items()):
        margin_plot(report, tolerance if tolerance > 0 else None, ax=ax, title=f"{name}: margin vs movement")
    figure.tight_layout()
    return figure


def loss_figure(data: dict):
    """The training loss per step, FP32 against each trial (non-finite losses marked at the top)."""
    reference = data["reference"].get("training_losses")
    trials = {n: e["training"]["losses"] for n, e in data["dtypes"].items() if e.get("training")}
    if not reference:
        return None
    figure, (ax,) = _figure(7.5, 3.6)
    ax.plot(range(1, len(reference) + 1), reference, color="black", lw=2, label="float32 (reference)")
    finite = [v for v in reference if math.isfinite(v)]
    top = max(finite) * 1.5 if finite else 1.0
    for name, losses in trials.items():
        steps = range(1, len(losses) + 1)
        ax.plot(steps, [v if math.isfinite(v) else float("nan") for v in losses], lw=1.5, label=name)
        bad = [s for s, v in zip(steps, losses) if not math.isfinite(v)]
        if bad:
            ax.plot(bad, [top] * len(bad), "x", color="#c62828", label=f"{name}: non-finite loss")
    ax.set_xlabel("training step")
    ax.set_ylabel("loss")
    ax.set_title("training trial from the same initial weights: loss per step")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    figure.tight_layout()
    return figure


def scale_figure(training: dict):
    """GradScaler's scale per step (log2), skipped updates marked: lesson 05's reading of skips."""
    from amp_lessons.l03_autocast_and_gradscaler.training import step_was_skipped

    histories = {name: run.scales for name, run in training.items() if run.scales and len(run.scales) > 1}
    if not histories:
        return None
    figure, axes = _figure(5.0 * len(histories), 3.2, len(histories))
    for ax, (name, scales) in zip(axes, histories.items()):
        logs = [math.log2(s) if s > 0 else float("nan") for s in scales]
        ax.plot(range(len(scales)), logs, color="#1e88e5")
        skips = [i for i in range(1, len(scales)) if step_was_skipped(scales[i - 1], scales[i])]
        ax.plot(skips, [logs[i] for i in skips], "x", color="#e53935", label="skipped update")
        ax.set_title(f"{name}: {len(skips)} skipped of {len(scales) - 1}", fontsize=10)
        ax.set_xlabel("step")
        ax.set_ylabel("log2(loss scale)")
        ax.legend(fontsize=8)
    figure.tight_layout()
    return figure


def speed_figure(measurements):
    """Lesson 07's bar chart: median step time per variant, the spread, the speed-up against FP32."""
    from amp_lessons.l07_measuring_gains.benchmark import plot_times

    if not measurements:
        return None
    figure, (ax,) = _figure(6.0, 3.6)
    plot_times(measurements, baseline="float32", ax=ax)
    figure.tight_layout()
    return figure
