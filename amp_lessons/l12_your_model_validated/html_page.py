"""Lesson 12: ``report.html`` as one self-contained page — the verdicts first, then the evidence.

Why this order: a reader asks "can we ship BF16?" first; the table answers it in one line per dtype, with its
reason. Everything below (criteria, the reference, each trial's evidence, the figures, speed, the environment)
is there to check that answer. No script, no stylesheet or image from elsewhere: it opens offline.
"""

from __future__ import annotations

import html

__all__ = ["render"]

STYLE = """
body{font-family:system-ui,sans-serif;max-width:1100px;margin:1em auto;padding:0 1em;color:#222}
table{border-collapse:collapse;margin:.4em 0}td,th{border:1px solid #ccc;padding:3px 8px;vertical-align:top}
th{background:#f3f3f3;text-align:left}h2{border-bottom:2px solid #6a1b9a;padding-bottom:2px}
img{max-width:100%;border:1px solid #eee}.muted{color:#666;font-size:90%}
"""

FIGURE_TEXT = {
    "margins": "Reference margin against the largest score change per sample (lesson 04). Samples left of the "
    "shaded zone's edge are at risk: they could flip while every score stays within the criteria.",
    "loss_curves": "Training loss per step from the same initial weights: each trial against FP32.",
    "scale_history": "GradScaler's loss scale per step; x marks a skipped update (lesson 05).",
    "speed": "Median time per step, the spread between repeats and the speed-up against FP32 (lesson 07).",
}


def _e(value) -> str:
    return html.escape("" if value is None else str(value))


def _pairs(rows) -> str:
    return "<table>" + "".join(f"<tr><th>{_e(k)}</th><td>{_e(v)}</td></tr>" for k, v in rows) + "</table>"


def _grid(header, rows) -> str:
    head = "".join(f"<th>{_e(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{_e(c)}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def _percent(value) -> str:
    return "n/a" if value is None else f"{value:.2%}"


def _dtype_section(name: str, entry: dict) -> str:
    parts = [
        f"<h3 id='dtype-{_e(name)}'>{_e(name)}: {_e(entry.get('verdict'))}</h3><p>{_e(entry.get('reason'))}</p>"
    ]
    if entry.get("error"):
        parts.append(f"<pre class='error'>{_e(entry['error'])}</pre>")
    inference = entry.get("inference")
    if inference:
        if inference.get("summary"):
            parts.append(_grid(["criterion", "reference", name, "verdict"], inference["summary"]))
        if inference.get("at_risk"):
            parts.append(
                f"<p>Samples closest to a flip ({inference.get('at_risk_count', 0)} at risk under the criteria):</p>"
            )
            parts.append(
                _grid(
                    ["sample", "row", "reference margin", "max |diff|", "at risk", "decision changed"],
                    [
                        [
                            r["sample"],
                            r["row"],
                            r["reference_margin"],
                            r["max_abs_diff"],
                            r["at_risk"],
                            r["decision_changed"],
                        ]
                        for r in inference["at_risk"]
                    ],
                )
            )
    nonfinite = entry.get("nonfinite")
    if nonfinite:
        parts.append(
            "<div class='nonfinite' style='background:#ffebee;border-left:6px solid #c62828;padding:6px'>"
            f"<b>{_e(nonfinite.get('headline'))}</b><br>{_e(nonfinite.get('explanation', ''))}</div>"
        )
    training = entry.get("training")
    if training:
        share = training.get("underflow_share") or {}
        parts.append(
            _pairs(
                [
                    ("training steps", training["steps"]),
                    (
                        "final loss (trial / FP32)",
                        f"{training['final_loss']} / {training['reference_final_loss']}",
                    ),
                    ("relative gap", _percent(training["final_loss_gap"])),
                    ("loss scaling", training["scaler"]),
                    ("skipped steps", f"{training['skipped_steps']}: {training['skip_verdict']}"),
                    ("gradients flushed to zero, unscaled", _percent(share.get("zero_unscaled"))),
                    (
                        f"gradients flushed to zero at scale {share.get('scale')}",
                        _percent(share.get("zero_scaled")),
                    ),
                ]
            )
        )
    return "".join(parts)


def _speed_section(speed) -> str:
    if not speed:
        return "<p>Not measured.</p>"
    if not speed.get("measured"):
        return f"<p>{_e(speed.get('note'))}</p>"
    rows = [
        [
            label,
            f"{v['median_s'] * 1e3:.3f}",
            f"{(v['q75_s'] - v['q25_s']) * 1e3:.3f}",
            v["repeats"],
            "" if v.get("speedup_vs_float32") is None else f"x{v['speedup_vs_float32']:.2f}",
            v.get("saved_activation_bytes"),
            v.get("peak_memory_bytes"),
        ]
        for label, v in speed["variants"].items()
    ]
    header = [
        "variant",
        "median ms",
        "IQR ms",
        "repeats",
        "speed-up",
        "saved for backward (bytes)",
        "GPU peak (bytes)",
    ]
    note = f"<p class='muted'>{_e(speed.get('memory_note'))}</p>" if speed.get("memory_note") else ""
    conclusion = "".join(f"<p>{_e(line)}</p>" for line in speed["conclusion"].splitlines())
    return (
        f"<p>{_e(speed['what'])}, timed after the numbers held.</p>" + _grid(header, rows) + note + conclusion
    )


def render(data: dict, images: dict, verdicts: str) -> str:
    criteria, reference, env, timing = (
        data["criteria"],
        data["reference"],
        data["environment"],
        data["timing"],
    )
    figures = "".join(
        f"<figure><img alt='{_e(name)}' data-figure='{_e(name)}' src='data:image/png;base64,{png}'>"
        f"<figcaption class='muted'>{_e(FIGURE_TEXT.get(name, name))}</figcaption></figure>"
        for name, png in images.items()
    )
    warnings = "".join(f"<li>{_e(w)}</li>" for w in data.get("warnings", []))
    sections = [
        f"<h1>Mixed-precision validation: {_e(data['recipe']['source'])}</h1>",
        f"<p class='muted'>{_e(data['created'])} · {_e(env.get('device'))} · torch {_e(env.get('torch'))} · "
        f"criteria {_e(criteria.get('fingerprint'))} · status {_e(data['status'])}</p>",
        "<h2>Verdicts</h2>",
        verdicts,
        f"<ul class='warnings'>{warnings}</ul>" if warnings else "",
        "<h2>Criteria (fixed before the trial)</h2>",
        _pairs(criteria.items()),
        "<h2>FP32 reference</h2>",
        _pairs(
            [(k, v) for k, v in reference.items() if k != "training_losses"]
            + [
                ("float32 settings", env.get("float32_settings")),
                ("reduced-precision float32 switches on", env.get("float32_reduced") or "none"),
            ]
        ),
        "<h2>Evidence per dtype</h2>",
        "".join(_dtype_section(name, entry) for name, entry in data["dtypes"].items()),
        "<h2>Figures</h2>",
        figures or "<p>No figures.</p>",
        "<h2>Speed and memory (accepted dtypes only)</h2>",
        _speed_section(data.get("speed")),
        "<h2>Environment and run</h2>",
        _pairs(list(env.items()) + list(data["settings"].items()) + list(timing.items())),
    ]
    return (
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'><title>amp validate report</title>"
        f"<style>{STYLE}</style></head><body>{''.join(sections)}</body></html>\n"
    )
