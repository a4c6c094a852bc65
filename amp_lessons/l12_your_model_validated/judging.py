"""Lesson 12: judge each autocast dtype — inference at two levels, the training trial, one verdict sentence.

Why these rules (each is a lesson of the course, applied to the learner's model):

- **inference** is lesson 04's ``judge`` under the recipe's criteria (scores within ``atol + rtol * |ref|``,
  decisions under the tie rule, quality on the labelled rows) or ``compare_regression`` (errors and extremes);
  the samples *at risk* are those whose reference margin is below twice what the criteria let a score move
  (``2 * (atol + rtol * |score|)``): they could flip while every score stays within tolerance;
- **training** passes when every loss is finite, GradScaler's skips read as calibration or probing and not as
  a persistent failure (lesson 05's ``skip_verdict``), and the trial's final loss stays within the training
  tolerance of FP32's (the mean of the last quarter of the steps, relative);
- **the verdict** is accepted only when both pass; its reason is the first thing that failed, or the numbers
  that held, in one sentence.
"""

from __future__ import annotations

import math

import torch

from amp_lessons.l02_fp16_underflow_and_loss_scaling.scaling import fractions
from amp_lessons.l04_baseline_and_decision_boundary.validation import compare_regression, judge
from amp_lessons.l05_nan_debugging.nonfinite_report import NonFiniteReport
from amp_lessons.l05_nan_debugging.skipped_updates import scale_history_table, skip_verdict

TRAINING_TOLERANCE = 0.1  # the trial's final loss may differ from FP32's by 10 % (relative) by default
AT_RISK_SHOWN = 10

__all__ = [
    "AT_RISK_SHOWN",
    "TRAINING_TOLERANCE",
    "judge_inference",
    "judge_training",
    "localised_summary",
    "underflow_share",
    "verdict",
]


def _tail_mean(values: list) -> float:
    tail = values[-max(1, len(values) // 4) :]
    finite = [v for v in tail if math.isfinite(v)]
    return sum(finite) / len(finite) if finite and len(finite) == len(tail) else math.nan


def judge_inference(reference, trial, criteria, label: str):
    """``(lesson 04 report, summary dict)`` for one dtype's evaluation pass against the FP32 reference."""
    if reference.scores.dim() == 1:
        report = compare_regression(
            reference.scores,
            trial.scores,
            reference.targets if reference.targets is not None else reference.scores,
            atol=criteria.atol,
            rtol=criteria.rtol,
            label=label,
        )
        diff = report.table["abs diff"]
        return report, {
            "passed": bool(report.passed),
            "reasons": list(report.reasons),
            "max_abs_diff": _number(diff.max()),
            "counts": {"samples": len(report.table), "non-finite": int((~report.table["finite"]).sum())},
            "at_risk": [],
        }
    labels = reference.targets if _are_labels(reference) else None
    report = judge(reference.scores, trial.scores, criteria, labels=labels, label=label)
    table = report.table
    allowed = criteria.atol + criteria.rtol * reference.scores.abs().max(dim=1).values
    at_risk = torch.tensor(table["reference margin"].to_numpy()) < 2 * allowed.double()
    order = table["reference margin"].sort_values().index[:AT_RISK_SHOWN]
    rows = [
        {
            "row": int(i),
            "sample": int(reference.sample_of_row[i]),
            "reference_margin": _number(table.at[i, "reference margin"]),
            "max_abs_diff": _number(table.at[i, "max abs diff"]),
            "decision_changed": bool(table.at[i, "decision changed"]),
            "at_risk": bool(at_risk[i]),
        }
        for i in order
    ]
    quality = None
    if labels is not None:
        decided = torch.tensor(table["trial decision"].to_numpy())
        quality = float((decided == labels).float().mean())
    return report, {
        "passed": bool(report.passed),
        "reasons": list(report.reasons),
        "max_abs_diff": _number(table["max abs diff"].max()),
        "quality": quality,
        "counts": report.counts(),
        "at_risk_count": int(at_risk.sum()),
        "at_risk": rows,
        "summary": report.summary.astype(str).values.tolist(),
    }


def _are_labels(evaluation) -> bool:
    targets = evaluation.targets
    return targets is not None and not targets.is_floating_point() and targets.dim() == 1


def _number(value):
    value = float(value)
    return value if math.isfinite(value) else None if math.isnan(value) else ("inf" if value > 0 else "-inf")


def underflow_share(gradients: dict | None, dtype, scale: float) -> dict | None:
    """Lesson 02: what casting the FP32 run's first gradients to ``dtype`` does, unscaled and at ``scale``."""
    if not gradients:
        return None
    plain, scaled = fractions(gradients, dtype, 1.0), fractions(gradients, dtype, scale)
    return {
        "scale": scale,
        "zero_unscaled": plain["zero"],
        "subnormal_unscaled": plain["subnormal"],
        "zero_scaled": scaled["zero"],
        "inf_scaled": scaled["inf"],
    }


def judge_training(reference_run, trial_run, tolerance: float) -> dict:
    """The training trial against the FP32 run: finite losses, skips that are not persistent, the final loss."""
    reasons = []
    if trial_run.nonfinite_steps:
        steps = trial_run.nonfinite_steps
        reasons.append(
            f"the loss was not finite at {len(steps)} of {len(trial_run.losses)} steps (first at step {steps[0]})"
        )
    skip_text, skipped = "no GradScaler in this trial", 0
    if trial_run.scales is not None and len(trial_run.scales) > 1:
        table = scale_history_table(trial_run.scales, window=max(1, (len(trial_run.scales) - 1) // 4))
        skip_text, skipped = skip_verdict(table), int(table["skipped"].sum())
        if skip_text.startswith("PROBLEM"):
            reasons.append(skip_text)
    reference, trial = _tail_mean(reference_run.losses), _tail_mean(trial_run.losses)
    gap = abs(trial - reference) / max(abs(reference), 1e-12) if math.isfinite(trial) else math.inf
    if math.isfinite(gap) and gap > tolerance:
        reasons.append(
            f"the final training loss {trial:.4g} differs from FP32's {reference:.4g} by {gap:.1%} "
            f"(the training tolerance is {tolerance:.0%})"
        )
    return {
        "passed": not reasons,
        "reasons": reasons,
        "steps": len(trial_run.losses),
        "losses": trial_run.losses,
        "final_loss": trial if math.isfinite(trial) else None,
        "reference_final_loss": reference,
        "final_loss_gap": gap if math.isfinite(gap) else None,
        "skipped_steps": skipped,
        "skip_verdict": skip_text,
        "scales": trial_run.scales,
        "scaler": trial_run.scaler_note,
        "nonfinite_steps": trial_run.nonfinite_steps,
        "complete": not trial_run.interrupted,
    }


def localised_summary(found) -> dict | None:
    """The finder's report as plain data: where the first non-finite value was, and why (lesson 05)."""
    if found is None:
        return None
    if not isinstance(found, NonFiniteReport):
        return {"found": False, "headline": str(found)}
    first = found.first
    if first is None:
        return {"found": False, "headline": found.headline()}
    return {
        "found": True,
        "stage": first.stage,
        "where": first.where,
        "module": first.name,
        "module_type": first.module,
        "dtype": first.dtype,
        "counts": first.counts(),
        "headline": found.headline(),
        "explanation": found.explanation(),
    }


def verdict(name: str, inference: dict, training: dict | None, nonfinite: dict | None, criteria) -> tuple:
    """``("accepted" | "rejected", one sentence)`` for dtype ``name``."""
    failed = list(inference["reasons"]) + (list(training["reasons"]) if training else [])
    if failed:
        where = ""
        if nonfinite and nonfinite.get("found"):
            where = f"; the first non-finite value is the {nonfinite['where']} in {nonfinite['dtype']}"
        return "rejected", f"{name} is rejected: {failed[0]}{where}."
    counts = inference["counts"]
    parts = [f"all {counts['samples']} rows within {criteria.atol:g} + {criteria.rtol:g}*|ref|"]
    if "decision changed" in counts:
        parts.append(
            f"{counts['decision changed']} decisions changed (allowed {criteria.allowed_decision_changes})"
        )
    if inference.get("quality") is not None and criteria.min_quality is not None:
        parts.append(f"quality {inference['quality']:.1%}")
    if training:
        gap = training["final_loss_gap"]
        parts.append(
            f"final training loss within {gap:.2%} of FP32 with {training['skipped_steps']} skipped steps"
        )
    return "accepted", f"{name} is accepted: " + ", ".join(parts) + "."
