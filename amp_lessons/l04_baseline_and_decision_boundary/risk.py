"""Lesson 04: which samples are close enough to a flip to be *at risk*, as a table, a plot and a slider.

If every score may move by up to ``d``, the gap between the top two moves by at most ``2 d``: a sample whose
reference margin is at least ``2 d`` cannot change decision, one below it might. These views take the table
of a :func:`~amp_lessons.l04_baseline_and_decision_boundary.compare` / :func:`~amp_lessons.l04_baseline_and_decision_boundary.judge` report and show, for a
tolerance you choose, which samples are at risk, which actually changed, and whether any changed *outside*
the at-risk zone (a sign that some score moved by more than the tolerance you assumed).

Widget logic lives in plain functions (:func:`risk_view`, :func:`risk_summary`) that tests call without a
browser; :func:`tolerance_explorer` only wires them to ipywidgets. Tables are shown with
:func:`amp_lessons.core.display.short_table` (the rows that matter first, the rest behind a toggle).
"""

from __future__ import annotations

import math

import pandas as pd

from amp_lessons.core.display import short_table
from amp_lessons.l04_baseline_and_decision_boundary.criteria import validate_tolerance
from amp_lessons.l04_baseline_and_decision_boundary.validation import Report

__all__ = ["FLOOR", "at_risk", "margin_plot", "risk_summary", "risk_view", "tolerance_explorer"]

FLOOR = 1e-12  # where zeros are drawn on the log axes


def at_risk(table: pd.DataFrame, tolerance: float) -> pd.DataFrame:
    """Rows whose decision *could* change if every score may move by up to ``tolerance``.

    If each score moves by at most ``d``, the gap between the top two moves by at most ``2 d``, so a sample
    whose reference margin is at least ``2 * tolerance`` cannot flip; below that it is *at risk*. The result
    adds ``at risk`` and ``outside tolerance`` (observed max |diff| > tolerance) columns to ``table``
    (a :func:`compare` table) and keeps only the at-risk rows, smallest margin first.
    """
    tolerance = validate_tolerance(tolerance, "tolerance")
    needed = {"reference margin", "max abs diff", "decision changed"}
    if not isinstance(table, pd.DataFrame) or not needed <= set(table.columns):
        raise TypeError("at_risk expects the .table of a compare()/judge() report.")
    out = table.copy()
    out["at risk"] = out["reference margin"] < 2 * tolerance
    out["outside tolerance"] = out["max abs diff"] > tolerance
    return out[out["at risk"]].sort_values("reference margin")


def risk_summary(table: pd.DataFrame, tolerance: float) -> pd.DataFrame:
    """Per category: samples, at risk (margin < 2 x tolerance), changed, and changed while *not* at risk.

    The last column is 0 whenever every observed |diff| is within ``tolerance``: a flip outside the at-risk
    zone means some score moved by more than the tolerance you assumed.
    """
    tolerance = validate_tolerance(tolerance, "tolerance")
    risky = set(at_risk(table, tolerance).index)
    frame = table.assign(
        **{
            "at risk": [i in risky for i in table.index],
            "changed but not at risk": [
                bool(c) and i not in risky for i, c in zip(table.index, table["decision changed"])
            ],
        }
    )
    key = "category" if "category" in frame else frame.index.map(lambda _: "all")
    grouped = frame.groupby(key, sort=False)
    return pd.DataFrame(
        {
            "samples": grouped.size(),
            "at risk": grouped["at risk"].sum().astype(int),
            "decision changed": grouped["decision changed"].sum().astype(int),
            "changed but not at risk": grouped["changed but not at risk"].sum().astype(int),
        }
    )


def margin_plot(report: Report, tolerance: float | None = None, ax=None, title: str | None = None):
    """Reference margin (x) against the largest score difference (y), both log scale; flips in red.

    The dashed diagonal is ``diff = margin / 2``: below it a sample cannot flip (the top two scores would
    have to move by more than half the margin each). With ``tolerance``, the at-risk zone
    ``margin < 2 * tolerance`` is shaded. Zeros are drawn at 1e-12; non-finite trial rows at the top, as x.
    """
    import matplotlib.pyplot as plt

    if not isinstance(report, Report) or "reference margin" not in report.table:
        raise TypeError("margin_plot expects a report from compare() or judge().")
    t = report.table
    margin = t["reference margin"].clip(lower=FLOOR).to_numpy(dtype=float)
    diff = t["max abs diff"].to_numpy(dtype=float)
    finite_diff = diff[~pd.isna(diff) & (diff != float("inf"))]
    top = max(float(finite_diff.max()) if finite_diff.size else 1.0, 1.0) * 30
    diff = [top if not math.isfinite(d) else max(d, FLOOR) for d in diff]
    changed = t["decision changed"].to_numpy(dtype=bool)
    finite = t["finite"].to_numpy(dtype=bool)
    if ax is None:
        fig, ax = plt.subplots(figsize=(7.5, 4.6))
    else:
        fig = ax.figure
    lo = FLOOR / 3
    hi = max(float(max(margin)), top) * 3
    ax.plot(
        [lo, hi], [lo / 2, hi / 2], "--", color="grey", lw=1, label="diff = margin / 2 (flip possible above)"
    )
    if tolerance is not None and tolerance > 0:
        ax.axvspan(
            lo, 2 * tolerance, color="#ffcc80", alpha=0.35, label=f"at risk: margin < 2 x {tolerance:.2g}"
        )
        ax.axhline(tolerance, color="#ef6c00", lw=1, label=f"tolerance {tolerance:.2g}")
    groups = (
        ("kept decision", ~changed & finite, "o", "#1565c0"),
        ("decision changed", changed & finite, "o", "#c62828"),
        ("non-finite trial", ~finite, "X", "#c62828"),
    )
    for name, mask, marker, colour in groups:
        if mask.any():
            ax.scatter(
                margin[mask],
                [d for d, m in zip(diff, mask) if m],
                marker=marker,
                s=46,
                color=colour,
                edgecolor="black",
                linewidth=0.4,
                label=f"{name} ({int(mask.sum())})",
                zorder=3,
            )
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(lo, hi)
    ax.set_ylim(lo, top * 3)
    ax.set_xlabel("reference margin (top score - runner-up), FP32; zeros drawn at 1e-12")
    ax.set_ylabel("largest |trial - reference| in the row")
    ax.set_title(title or f"{report.label}: how close to a flip, how far it moved")
    ax.legend(fontsize=8, loc="upper left")
    ax.grid(True, which="major", alpha=0.3)
    return fig


def risk_view(report: Report, tolerance: float):
    """The widget's logic: ``(figure, at-risk table)`` for one report and one tolerance."""
    import matplotlib.pyplot as plt

    fig = margin_plot(report, tolerance)
    plt.close(fig)
    columns = [
        c
        for c in (
            "id",
            "category",
            "reference margin",
            "max abs diff",
            "outside tolerance",
            "decision changed",
        )
        if c in report.table or c == "outside tolerance"
    ]
    return fig, at_risk(report.table, tolerance)[columns]


def tolerance_explorer(reports: dict, tolerance: float = 1e-2):
    """A slider for the tolerance and a menu of trials; redraws the margin plot and the at-risk table.

    ``reports`` maps a name (e.g. ``"float16"``) to a report from :func:`compare` / :func:`judge`.
    """
    import ipywidgets as widgets
    from IPython.display import display

    if isinstance(reports, Report):
        reports = {reports.label: reports}
    if not reports or not all(isinstance(r, Report) for r in reports.values()):
        raise TypeError("tolerance_explorer expects a dict of name -> report from compare() or judge().")
    trial = widgets.Dropdown(options=list(reports), description="trial")
    slider = widgets.FloatLogSlider(
        value=tolerance,
        base=10,
        min=-8,
        max=3,
        step=0.25,
        description="tolerance",
        readout_format=".1e",
        continuous_update=False,
    )

    def show(name, tol):
        fig, table = risk_view(reports[name], tol)
        display(fig)
        summary = risk_summary(reports[name].table, tol)
        print(
            f"{len(table)} sample(s) at risk (margin < 2 x {tol:.2g}); "
            f"{int(summary['changed but not at risk'].sum())} changed decision outside the at-risk zone."
        )
        display(short_table(table, title="all at-risk samples, smallest margin first"))

    out = widgets.interactive_output(show, {"name": trial, "tol": slider})
    return widgets.VBox([widgets.HBox([trial, slider]), out])
