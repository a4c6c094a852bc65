"""Static forms of the course's widgets, for the web edition (``make site``; site/conf.py).

A web page has no kernel, so a slider there cannot redraw anything. While the site's build runs a notebook, its
kernel starts with ``site/kernel_startup.py`` (through ``PYTHONSTARTUP``), which calls :func:`install`. From then
on every widget this course shows also carries an HTML form for the page (the notebook's own outputs, in JupyterLab,
are unchanged, and nothing here runs outside the site's build):

- the four explorers (lessons 01-04) are drawn by their own plain functions — ``explorer_html``, ``scale_view``,
  ``simulate_scaler`` + ``scaler_figure``, ``risk_view`` — for a few fixed settings (:data:`SETTINGS`);
- a quiz shows its questions with each answer folded away (``<details>``);
- a Hint button shows its hints, each folded away; the progress view shows its table;
- every form says that the widget is live in JupyterLab.

The site's build drops the widget-view output (it needs a running kernel), so the page shows this HTML instead.
"""

from __future__ import annotations

import base64
import functools
import html
import importlib
import io
import os

LIVE_NOTE = (
    "<b>Interactive in JupyterLab.</b> This page was built without a kernel, so it shows {what}; open the "
    "notebook (Launch: Binder or Colab, or your own install) to use the controls."
)
# The four explorers: (module, function) -> the static form drawn from the same arguments.
EXPLORERS = {
    ("amp_lessons.l01_precision_formats.formats", "format_explorer"): "format_explorer_form",
    ("amp_lessons.l02_fp16_underflow_and_loss_scaling.scaling", "scale_explorer"): "scale_explorer_form",
    ("amp_lessons.l03_autocast_and_gradscaler.scaler_sim", "scaler_widget"): "scaler_widget_form",
    ("amp_lessons.l04_baseline_and_decision_boundary.risk", "tolerance_explorer"): "tolerance_explorer_form",
}
# The fixed settings each explorer is drawn for (besides the value the notebook gave it).
SETTINGS = {
    "format_explorer": ("65519", "1e-8"),
    "scale_explorer": (0, 24),
    "scaler_widget": (
        {},
        {"growth_interval": 500},
        {"kind": "every_k", "value": 25.0},
    ),
    "tolerance_explorer": (0.01, 100.0),
}
SCALER_DEFAULTS = {
    "init_exp": 16,
    "growth_factor": 2.0,
    "backoff_factor": 0.5,
    "growth_interval": 50,
    "kind": "threshold",
    "value": -3.0,
}


def frame(what: str, parts: list) -> str:
    """One static form: the note, then each ``(title, html)`` part (the first open, the rest folded)."""
    body = "".join(
        f"<details{' open' if i == 0 else ''}><summary>{html.escape(title)}</summary>{content}</details>"
        for i, (title, content) in enumerate(parts)
    )
    note = LIVE_NOTE.format(what=html.escape(what))
    return (
        "<div class='amp-static-form' style='border:1px dashed #90a4ae;border-radius:6px;padding:8px'>"
        f"<div class='amp-static-note' style='color:#455a64;margin-bottom:6px'>{note}</div>{body}</div>"
    )


def figure_html(figure) -> str:
    """A matplotlib figure as an inline PNG (and closed)."""
    import matplotlib.pyplot as plt

    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=80, bbox_inches="tight")
    plt.close(figure)
    data = base64.b64encode(buffer.getvalue()).decode("ascii")
    return f"<img alt='figure' style='max-width:100%' src='data:image/png;base64,{data}'/>"


def table_html(table, rows: int = 12) -> str:
    """A DataFrame (its first ``rows`` rows) or anything with ``_repr_html_``."""
    if hasattr(table, "head") and hasattr(table, "to_html"):
        extra = len(table) - rows
        more = f"<p>… and {extra} more rows in the notebook.</p>" if extra > 0 else ""
        return table.head(rows).to_html() + more
    return table._repr_html_()


def format_explorer_form(x=0.1) -> str:
    from amp_lessons.l01_precision_formats.formats import explorer_html

    values = list(dict.fromkeys([str(x), *SETTINGS["format_explorer"]]))
    parts = [(f"x = {value}", explorer_html(value)) for value in values]
    return frame("the explorer for x = " + ", ".join(values), parts)


def scale_explorer_form(groups, exponent: int = 0, max_exponent: int = 32) -> str:
    from amp_lessons.l02_fp16_underflow_and_loss_scaling.scaling import scale_view, style_table

    exponents = list(dict.fromkeys([exponent, *(e for e in SETTINGS["scale_explorer"] if e <= max_exponent)]))
    parts = []
    for e in exponents:
        figure, table = scale_view(groups, e)
        parts.append((f"log2(scale) = {e}", figure_html(figure) + style_table(table).to_html()))
    return frame("the slider at log2(scale) = " + ", ".join(map(str, exponents)), parts)


def scaler_widget_form(iterations: int = 300) -> str:
    from amp_lessons.l03_autocast_and_gradscaler.scaler_sim import (
        make_pattern,
        scaler_figure,
        simulate_scaler,
    )

    parts = []
    for change in SETTINGS["scaler_widget"]:
        s = {**SCALER_DEFAULTS, **change}
        run = simulate_scaler(
            make_pattern(s["kind"], s["value"]),
            iterations=iterations,
            init_scale=2.0 ** s["init_exp"],
            growth_factor=s["growth_factor"],
            backoff_factor=s["backoff_factor"],
            growth_interval=s["growth_interval"],
        )
        title = ", ".join(f"{k}={v}" for k, v in s.items())
        parts.append((title, figure_html(scaler_figure(run))))
    return frame("the simulation for three fixed settings (the widget's defaults first)", parts)


def tolerance_explorer_form(reports, tolerance: float = 1e-2) -> str:
    from amp_lessons.l04_baseline_and_decision_boundary.risk import risk_view
    from amp_lessons.l04_baseline_and_decision_boundary.validation import Report

    if isinstance(reports, Report):
        reports = {reports.label: reports}
    tolerances = list(dict.fromkeys([tolerance, *SETTINGS["tolerance_explorer"]]))
    parts = []
    for name, report in reports.items():
        for tol in tolerances:
            figure, table = risk_view(report, tol)
            summary = f"<p>{len(table)} sample(s) at risk (margin &lt; 2 x {tol:.2g})</p>"
            parts.append(
                (f"trial {name}, tolerance {tol:.2g}", figure_html(figure) + summary + table_html(table))
            )
    return frame("each trial at the tolerances " + ", ".join(f"{t:.2g}" for t in tolerances), parts)


def quiz_form(quiz) -> str:
    """A quiz's questions with each answer (and why) folded away."""
    items = []
    for number, question in enumerate(quiz.questions, start=1):
        options = "".join(f"<li>{html.escape(str(option))}</li>" for option in question.options)
        answer = html.escape(question.answer_text())
        items.append(
            f"<div class='amp-static-question'><p><b>Q{number}.</b> {html.escape(question.prompt)}</p>"
            f"<ol>{options}</ol><details class='amp-static-answer'><summary>Show the answer</summary>"
            f"<p>{answer}</p></details></div>"
        )
    note = LIVE_NOTE.format(what="the questions with their answers folded away")
    return (
        f"<div class='amp-static-quiz' style='border:1px dashed #90a4ae;border-radius:6px;padding:8px'>"
        f"<h4 style='margin:4px 0'>Quiz — {html.escape(quiz.title)}</h4>"
        f"<div class='amp-static-note' style='color:#455a64'>{note}</div>{''.join(items)}</div>"
    )


def hint_form(button) -> str:
    ladder = button.ladder
    parts = [(f"Hint {i}", f"<p>{html.escape(text)}</p>") for i, text in enumerate(ladder.hints, start=1)]
    body = "".join(f"<details><summary>{html.escape(t)}</summary>{c}</details>" for t, c in parts)
    note = LIVE_NOTE.format(what=f"the {len(ladder.hints)} hints for {ladder.exercise}, each folded away")
    return f"<div class='amp-static-form'><div class='amp-static-note'>{note}</div>{body}</div>"


def progress_form(view) -> str:
    note = LIVE_NOTE.format(
        what="the table as the site's build saw it; yours fills in as you check exercises"
    )
    return f"<div class='amp-static-form'><div class='amp-static-note'>{note}</div>{view.html()}</div>"


def widget_form(widget):
    """The static form a widget carries (:func:`install` gives one to each explorer), or a note."""
    form = getattr(widget, "_amp_site_form", None)
    if form is not None:
        return form()
    return f"<div class='amp-static-note'>{LIVE_NOTE.format(what='no form of this control')}</div>"


def wrap_explorer(module_name: str, name: str, form) -> None:
    """Make ``module.name`` (and its lesson package's name for it) attach ``form`` to the widget it returns."""
    module = importlib.import_module(module_name)
    original = getattr(module, name)

    @functools.wraps(original)
    def explorer(*args, **kwargs):
        widget = original(*args, **kwargs)
        widget._amp_site_form = functools.partial(form, *args, **kwargs)
        return widget

    package = importlib.import_module(module_name.rpartition(".")[0])
    for target in (module, package):
        if getattr(target, name, None) is original:
            setattr(target, name, explorer)


def install(shell=None) -> None:
    """Register the static forms with this kernel's HTML formatter (site/kernel_startup.py calls it)."""
    os.environ.setdefault("TQDM_DISABLE", "1")  # a progress bar is a widget that only means something live
    if shell is None:
        from IPython import get_ipython

        shell = get_ipython()
    if shell is None:
        return
    import ipywidgets

    from amp_lessons.core.hints import HintButton
    from amp_lessons.core.quiz import Quiz
    from amp_lessons.tools.progress import ProgressView

    formatter = shell.display_formatter.formatters["text/html"]
    for kind, form in ((ipywidgets.Widget, widget_form), (Quiz, quiz_form), (HintButton, hint_form)):
        formatter.for_type(kind, form)
    formatter.for_type(ProgressView, progress_form)
    for (module_name, name), form_name in EXPLORERS.items():
        wrap_explorer(module_name, name, globals()[form_name])
