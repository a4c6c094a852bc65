"""Lesson 12: the report — ``report.json`` (stable keys, docs/validate.md) and a self-contained ``report.html``.

Why two files: the JSON is for CI and scripts (the same numbers, under keys that do not change between runs),
the HTML for people (the verdict table first, then the evidence, every figure embedded as a PNG so it opens
offline and can be attached to a ticket). Both are written with ``atomic_write``: a reader never sees half a
report, and a report interrupted by Ctrl-C is a complete file that says it is incomplete.
"""

from __future__ import annotations

import html
import json
import math
import sys
import time
import warnings
from pathlib import Path

from amp_lessons.core.files import atomic_write
from amp_lessons.l12_your_model_validated import figures
from amp_lessons.l12_your_model_validated.judging import TRAINING_TOLERANCE
from amp_lessons.l12_your_model_validated.recipe import UsageError

SCHEMA = "amp-validate/1"
FILES = ("report.json", "report.html")

__all__ = [
    "FILES",
    "SCHEMA",
    "Progress",
    "criteria_entry",
    "not_run",
    "prepare_out",
    "report_figure",
    "reference_entry",
    "skeleton",
    "verdict_html",
    "verdict_text",
    "write",
]


class Progress:
    """One tqdm bar per phase (``tqdm.auto``: a widget in Jupyter, text on stderr in a terminal), or none."""

    def __init__(self, enabled: bool):
        self.enabled = bool(enabled)
        self.open = []

    def bar(self, description: str, total: int):
        if not self.enabled:
            return _NoBar()
        from tqdm.auto import tqdm

        bar = tqdm(
            total=total, desc=description, unit="step", leave=True, file=sys.stderr, dynamic_ncols=True
        )
        self.open.append(bar)
        return bar

    def note(self, text: str) -> None:
        if self.enabled:
            print(text, flush=True)

    def close_all(self) -> None:
        for bar in self.open:
            bar.close()
        self.open.clear()


class _NoBar:
    def update(self, *_):
        return None

    def close(self):
        return None


def prepare_out(out, recipe, force: bool) -> Path:
    """The report folder (created); an earlier report in it is an error unless ``force``."""
    if out is None:
        stem = Path(recipe.source).stem if recipe.source.endswith(".py") else "recipe"
        out = Path.cwd() / f"{stem}-report"
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out {out} is a file; give a folder for report.json and report.html.")
    existing = [name for name in FILES if (out / name).exists()]
    if existing and not force:
        raise UsageError(
            f"{out} already holds an earlier report ({', '.join(existing)}); it is never overwritten. Pass "
            "--force (force=True) to replace it, or choose another --out."
        )
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise UsageError(f"cannot create the report folder {out}: {error.strerror or error}") from None
    return out


def skeleton(recipe, device, seed: int, steps: int, max_seconds) -> dict:
    """The report's keys, present from the start, so a cut-short run still has every one of them."""
    return {
        "schema": SCHEMA,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "complete": False,
        "status": "running",
        "incomplete_reason": None,
        "recipe": {
            "source": recipe.source,
            "task": recipe.task,
            "functions": recipe.functions,
            "training": recipe.has("training_batches"),
        },
        "settings": {"device": str(device), "seed": seed, "steps": steps, "max_seconds": max_seconds},
        "environment": {},
        "criteria": {},
        "reference": {},
        "dtypes": {},
        "speed": None,
        "required": [],
        "exit_code": None,
        "warnings": [],
        "phases": [],
        "timing": {},
        "figures": [],
    }


def criteria_entry(criteria, training_tolerance) -> dict:
    tolerance = TRAINING_TOLERANCE if training_tolerance is None else float(training_tolerance)
    if not (math.isfinite(tolerance) and tolerance > 0):
        raise UsageError(
            f"training_tolerance must be a positive fraction (e.g. 0.1); got {training_tolerance!r}."
        )
    return {
        "fingerprint": criteria.fingerprint,
        "atol": criteria.atol,
        "rtol": criteria.rtol,
        "min_quality": criteria.min_quality,
        "nonfinite": criteria.nonfinite,
        "tie_rule": criteria.tie_rule,
        "tie_tolerance": criteria.tie_tolerance,
        "allowed_decision_changes": criteria.allowed_decision_changes,
        "application": criteria.application,
        "training_tolerance": tolerance,
    }


def reference_entry(evaluation, noise: float, criteria) -> dict:
    from amp_lessons.l04_baseline_and_decision_boundary.validation import accuracy, decide

    quality = None
    targets = evaluation.targets
    if evaluation.scores.dim() == 2 and targets is not None and not targets.is_floating_point():
        quality = accuracy(decide(evaluation.scores, criteria.tie_tolerance), targets)
        quality = None if math.isnan(quality) else quality
    return {
        "samples": int(evaluation.sample_of_row.max()) + 1,
        "rows": int(evaluation.scores.shape[0]),
        "classes": int(evaluation.scores.shape[1]) if evaluation.scores.dim() == 2 else None,
        "finite": True,
        "quality": quality,
        "noise_floor": noise,
        "deterministic": noise == 0,
        "max_abs_score": float(evaluation.scores.abs().max()),
        "training_losses": None,
    }


def not_run(name: str, reason: str) -> dict:
    return {
        "verdict": "not run",
        "reason": f"{name} was not run: {reason}",
        "inference": None,
        "training": None,
        "nonfinite": None,
        "speed": None,
        "error": None,
    }


# --------------------------------------------------------------------------------------------- writing


def _jsonable(value):
    if isinstance(value, float) and not math.isfinite(value):
        return None if math.isnan(value) else ("inf" if value > 0 else "-inf")
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return value


def write(run, *, figures: bool = True) -> dict:
    """Render the figures, then write report.html and report.json into ``run.out`` (atomically)."""
    data = run.data
    speed = data.get("speed") or {}
    measurements = speed.pop("measurements", None) if isinstance(speed, dict) else None
    for name, entry in data["dtypes"].items():
        if isinstance(speed, dict) and speed.get("variants", {}).get(name):
            entry["speed"] = speed["variants"][name]
    images = _figures(run, measurements) if figures else {}
    data["figures"] = list(images)
    total, runs_s = run.clock.total, run.clock.run_seconds
    data["timing"] = {
        "total_seconds": total,
        "run_seconds": runs_s,
        "bookkeeping_seconds": max(total - runs_s, 0.0),
        "bookkeeping_share": (max(total - runs_s, 0.0) / runs_s) if runs_s > 0 else None,
    }
    clean = _jsonable(data)
    html_path = atomic_write(run.out / "report.html", lambda h: h.write(page(clean, images).encode("utf-8")))
    json_path = atomic_write(
        run.out / "report.json",
        lambda h: h.write((json.dumps(clean, indent=1, sort_keys=True) + "\n").encode("utf-8")),
    )
    return {"json": json_path, "html": html_path}


def _figures(run, measurements) -> dict:
    """``{figure name: base64 PNG}``; a figure that cannot be drawn is left out, never stops the report."""
    makers = {
        "margins": lambda: figures.margins_figure(run.reports, run.data),
        "loss_curves": lambda: figures.loss_figure(run.data),
        "scale_history": lambda: figures.scale_figure(run.training),
        "speed": lambda: figures.speed_figure(measurements),
    }
    images = {}
    warming = getattr(run, "warming", None)
    if warming is not None:
        warming.join(timeout=60)
    for name, make in makers.items():
        try:
            # matplotlib's layout notes are not the learner's business; the filters stay as they are (with
            # "always", matplotlib would log the deprecation notes it reads its style files with on old pyparsing)
            with warnings.catch_warnings(record=True) as caught:
                figure = make()
                if figure is not None:
                    images[name] = figures.to_png(figure)
        except Exception as error:  # a report without one figure beats no report
            run.data["warnings"].append(f"figure {name} was not drawn: {type(error).__name__}: {error}")
            continue
        run.data["warnings"] += [
            f"figure {name}: {w.message}" for w in caught if "layout" not in str(w.message)
        ]
    return images


def report_figure(validation, name: str):
    """One of the report's figures (``"margins"``, ``"loss_curves"``, ``"scale_history"``, ``"speed"``) for a
    notebook, as an IPython Image of the very PNG embedded in report.html."""
    import base64
    import re

    from IPython.display import Image

    page_text = Path(validation.paths["html"]).read_text(encoding="utf-8")
    found = re.search(rf"data-figure='{re.escape(name)}' src='data:image/png;base64,([^']+)'", page_text)
    if found is None:
        raise ValueError(f"the report has no figure {name!r}; it has {validation.data['figures']}")
    return Image(data=base64.b64decode(found.group(1)), format="png")


# --------------------------------------------------------------------------------------------- views

VERDICT_COLOURS = {
    "accepted": "#2e7d32",
    "rejected": "#c62828",
    "not judged": "#ef6c00",
    "not run": "#757575",
}


def verdict_rows(data: dict) -> list:
    return [
        (name, entry.get("verdict", ""), entry.get("reason", "")) for name, entry in data["dtypes"].items()
    ]


def verdict_text(data: dict) -> str:
    rows = verdict_rows(data)
    width = max([5] + [len(name) for name, _, _ in rows])
    lines = [f"{'dtype'.ljust(width)}  {'verdict'.ljust(10)}  reason"]
    lines += [f"{name.ljust(width)}  {verdict.ljust(10)}  {reason}" for name, verdict, reason in rows]
    if not data.get("complete"):
        lines.append(f"INCOMPLETE: {data.get('incomplete_reason')}")
    return "\n".join(lines)


def verdict_html(data: dict) -> str:
    body = "".join(
        f"<tr><td><b>{html.escape(name)}</b></td><td style='color:{VERDICT_COLOURS.get(verdict, '#000')};"
        f"font-weight:bold'>{html.escape(verdict)}</td><td>{html.escape(reason)}</td></tr>"
        for name, verdict, reason in verdict_rows(data)
    )
    banner = ""
    if not data.get("complete"):
        banner = (
            "<p id='incomplete' style='background:#fff3e0;border-left:6px solid #ef6c00;padding:6px'>"
            f"<b>Incomplete report:</b> {html.escape(str(data.get('incomplete_reason')))}</p>"
        )
    return (
        f"{banner}<table class='verdicts' style='border-collapse:collapse'><tr><th>dtype</th><th>verdict</th>"
        f"<th style='text-align:left'>reason</th></tr>{body}</table>"
    )


def page(data: dict, images: dict) -> str:
    """The whole report.html: verdicts, criteria, reference, evidence per dtype, figures, speed, environment."""
    from amp_lessons.l12_your_model_validated.html_page import render

    return render(data, images, verdict_html(data))
