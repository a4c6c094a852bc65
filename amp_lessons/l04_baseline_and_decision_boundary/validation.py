"""Lesson 04: judge an AMP trial against a fixed FP32 reference: criteria first, then scores, then decisions.

Why two levels. A low-precision run can have scores that are *numerically* close to the reference and
still change what the application does: when the top two scores of a sample are closer together than
the rounding error of FP16/BF16, the winner can swap. And the converse: a large numeric difference can
change nothing when the winner leads by a wide margin. So a comparison records, per sample,

- whether the trial's scores are finite,
- how far they are from the reference (``|trial - ref| <= atol + rtol * |ref|``, elementwise, the rule
  of ``torch.allclose``),
- the decision each side makes under an explicit tie rule, and whether it changed,
- the reference *margin* (top score minus runner-up), which says how close the sample is to a flip.

Why criteria first. Tolerances chosen after looking at a trial tend to be the trial's own worst case,
which makes every check pass by construction. A :class:`~amp_lessons.l04_baseline_and_decision_boundary.Criteria`
is immutable and has a fingerprint; you print it before the trial, and every report names the fingerprint
it was judged against, so a criterion changed afterwards is visible (and :func:`judge` refuses it when you
pass the recorded fingerprint). :func:`judge` is the one way to judge against a ``Criteria``;
:func:`compare` takes loose tolerances and builds one for you.

Decisions and ties (see :func:`decide`): the decision of a row is the index of its largest score, ties
going to the lowest index (what ``argmax`` does on CPU and CUDA). With ``tie_tolerance > 0`` the row
*abstains* (decision ``-1``, "escalate to a human") when its margin is strictly below the tolerance. A row
with any NaN or infinity also gives ``-1``: there is no trustworthy decision to take from it.
"""

from __future__ import annotations

import html
import math
from dataclasses import dataclass, field

import pandas as pd
import torch

from amp_lessons.core.environment import float32_matmul_settings
from amp_lessons.l04_baseline_and_decision_boundary.criteria import (
    Criteria,
    judge_quality,
    validate_tolerance,
)

ABSTAIN = -1

__all__ = [
    "ABSTAIN",
    "Baseline",
    "CriteriaChangedError",
    "NonFiniteReferenceError",
    "Report",
    "accuracy",
    "as_scores",
    "compare",
    "compare_regression",
    "decide",
    "judge",
    "margins",
    "record_baseline",
]


class NonFiniteReferenceError(ValueError):
    """The FP32 reference itself contains NaN/inf: nothing can be validated against it."""


class CriteriaChangedError(ValueError):
    """The criteria used to judge differ from the ones recorded before the trial."""


# ---------------------------------------------------------------------------------------------- inputs


def as_scores(scores, name: str = "scores", *, allow_empty: bool = True) -> torch.Tensor:
    """``scores`` as a float32 CPU tensor of shape ``[N, C]``, or a clear error saying what to pass.

    Low-precision scores (float16/bfloat16) convert to float32 exactly, so nothing computed from the
    returned tensor (differences, margins) adds rounding of its own.
    """
    if isinstance(scores, torch.Tensor):
        tensor = scores
    elif type(scores).__module__ == "numpy" and hasattr(scores, "dtype") and hasattr(scores, "shape"):
        tensor = torch.as_tensor(scores)
    else:
        raise TypeError(
            f"{name} must be a torch tensor of scores with shape [N, C] (one row per sample, one column per "
            f"class); got a {type(scores).__name__}. Pass the model's output tensor, e.g. `model(x)`."
        )
    if tensor.dtype == torch.bool or tensor.is_complex():
        raise TypeError(f"{name} has dtype {tensor.dtype}; scores must be real numbers (float or int).")
    if tensor.dim() != 2:
        hint = ""
        if tensor.dim() == 1:
            hint = (
                " For one score per sample use compare_regression, or add a class axis with "
                "`.unsqueeze(1)`; for a single sample use `.unsqueeze(0)`."
            )
        raise ValueError(f"{name} must have shape [N, C]; got shape {tuple(tensor.shape)}.{hint}")
    if tensor.shape[1] == 0:
        raise ValueError(
            f"{name} has shape {tuple(tensor.shape)}: there must be at least one class (C >= 1)."
        )
    if tensor.shape[0] == 0 and not allow_empty:
        raise ValueError(f"{name} has no rows (shape {tuple(tensor.shape)}): there is nothing to compare.")
    return tensor.detach().to("cpu", torch.float32)


# --------------------------------------------------------------------------------------------- decisions


def margins(scores) -> torch.Tensor:
    """Top score minus runner-up per row (float32 ``[N]``).

    ``inf`` for a single class (there is no runner-up), ``nan`` for a row with any NaN or infinity.
    """
    scores = as_scores(scores)
    n, c = scores.shape
    if n == 0:
        return torch.zeros(0)
    finite = torch.isfinite(scores).all(dim=1)
    if c == 1:
        out = torch.full((n,), math.inf)
    else:
        top2 = torch.topk(torch.where(torch.isfinite(scores), scores, torch.zeros(())), 2, dim=1).values
        out = top2[:, 0] - top2[:, 1]
    return torch.where(finite, out, torch.full_like(out, math.nan))


def decide(scores, tie_tolerance: float = 0.0) -> torch.Tensor:
    """The application's decision per row, as a LongTensor ``[N]``.

    - the index of the largest score; an exact tie goes to the **lowest** index;
    - ``-1`` (abstain / escalate) when the margin is **strictly below** ``tie_tolerance``
      (so ``tie_tolerance=0`` never abstains on finite rows, and ``margin == tie_tolerance`` decides);
    - ``-1`` for a row with any NaN or infinity;
    - a single class always decides ``0`` (its margin is infinite); an empty batch gives an empty tensor.
    """
    tie_tolerance = validate_tolerance(tie_tolerance, "tie_tolerance")
    scores = as_scores(scores)
    n, c = scores.shape
    if n == 0:
        return torch.zeros(0, dtype=torch.long)
    finite = torch.isfinite(scores).all(dim=1)
    safe = torch.where(torch.isfinite(scores), scores, torch.zeros(()))
    top = safe.max(dim=1, keepdim=True).values
    index = torch.arange(c).expand(n, c)
    first = torch.where(safe == top, index, torch.full_like(index, c)).min(dim=1).values
    margin = margins(safe)
    abstain = (~finite) | (margin < tie_tolerance)
    return torch.where(abstain, torch.full_like(first, ABSTAIN), first)


def accuracy(decisions, labels) -> float:
    """Fraction of labelled rows (label >= 0) whose decision equals the label; abstaining counts as wrong."""
    decisions = torch.as_tensor(decisions).reshape(-1).long()
    labels = torch.as_tensor(labels).reshape(-1).long()
    if decisions.shape != labels.shape:
        raise ValueError(f"{decisions.numel()} decisions but {labels.numel()} labels: one label per sample.")
    scored = labels >= 0
    if int(scored.sum()) == 0:
        return math.nan
    return float((decisions[scored] == labels[scored]).float().mean())


# ---------------------------------------------------------------------------------------------- baseline


@dataclass
class Baseline:
    """The FP32 reference outputs: scores, decisions and margins per sample, and quality on the set.

    ``float32_settings`` records whether "FP32" really was FP32 when the reference was computed
    (:func:`amp_lessons.core.environment.float32_matmul_settings`, with the precision API the installed torch
    has). On NVIDIA GPUs since Ampere, ``torch.backends.cuda.matmul.fp32_precision = "tf32"`` (torch 2.9
    and later; the legacy switches are ``allow_tf32`` and ``set_float32_matmul_precision("high")``) lets
    float32 matmuls run in TF32, with about 1e-3 relative error instead of 1e-7; ``cudnn.conv`` does the same
    for convolutions and is ``"tf32"`` by default; on CPUs with BF16 instructions oneDNN's ``"bf16"`` (or the
    legacy ``"medium"``) runs float32 matmuls in BF16. A reference computed that way is not an FP32
    reference; the record says so next to the scores.
    """

    scores: torch.Tensor
    decisions: torch.Tensor
    margins: torch.Tensor
    quality: float
    table: pd.DataFrame
    float32_settings: dict = field(default_factory=dict)

    def __repr__(self) -> str:
        quality = "not judged (no labels)" if math.isnan(self.quality) else f"{self.quality:.1%}"
        return f"Baseline({len(self.table)} samples, all finite, quality {quality})"


def record_baseline(
    scores, *, labels=None, ids=None, categories=None, tie_tolerance: float = 0.0
) -> Baseline:
    """Record the FP32 reference and the float32 matmul settings it was computed under (see
    :class:`Baseline`); stop with :class:`NonFiniteReferenceError` when any score is NaN/inf."""
    tensor = as_scores(scores, "reference", allow_empty=False)
    if isinstance(scores, torch.Tensor) and scores.dtype != torch.float32:
        raise ValueError(f"The reference must be computed in float32 (outside autocast); got {scores.dtype}.")
    bad = (~torch.isfinite(tensor).all(dim=1)).nonzero().reshape(-1).tolist()
    if bad:
        names = _names(ids, tensor.shape[0])
        raise NonFiniteReferenceError(
            f"The FP32 reference has non-finite scores in {len(bad)} sample(s): "
            f"{[names[i] for i in bad][:10]}. "
            "Nothing can be validated against it: fix the model, the weights or the inputs (they must give "
            "finite FP32 outputs) before running any AMP trial."
        )
    decisions, reference_margins = decide(tensor, tie_tolerance), margins(tensor)
    table = _frame(ids, categories, tensor.shape[0])
    table["reference decision"] = decisions.tolist()
    table["reference margin"] = reference_margins.tolist()
    table["max |score|"] = tensor.abs().max(dim=1).values.tolist()
    quality = math.nan
    if labels is not None:
        labels_t = torch.as_tensor(labels).reshape(-1).long()
        table["label"] = labels_t.tolist()
        quality = accuracy(decisions, labels_t)
    return Baseline(tensor, decisions, reference_margins, quality, table, float32_matmul_settings())


# ------------------------------------------------------------------------------------------------ report


@dataclass
class Report:
    """The outcome of a comparison: ``passed``, the per-sample ``table``, a ``summary`` and the reasons."""

    passed: bool
    table: pd.DataFrame
    summary: pd.DataFrame
    criteria: Criteria
    reasons: list = field(default_factory=list)
    label: str = "AMP trial"

    @property
    def fingerprint(self) -> str:
        """The fingerprint of the criteria this report was judged against."""
        return self.criteria.fingerprint

    def _problems(self) -> dict:
        t = self.table
        problems = {
            "non-finite": ~t["finite"].astype(bool),
            "out of tolerance": ~t["within tolerance"].astype(bool),
        }
        if "decision changed" in t:
            problems["decision changed"] = t["decision changed"].astype(bool)
        return problems

    def flagged(self) -> pd.DataFrame:
        """Only the rows that are non-finite, out of tolerance or changed decision."""
        mask = pd.Series(False, index=self.table.index)
        for rows in self._problems().values():
            mask |= rows
        return self.table[mask]

    def counts(self) -> dict:
        """How many samples, and how many of them have each problem."""
        return {"samples": len(self.table), **{k: int(v.sum()) for k, v in self._problems().items()}}

    def headline(self) -> str:
        verdict = "PASSED" if self.passed else "FAILED"
        counts = ", ".join(f"{k}: {v}" for k, v in self.counts().items())
        return f"{self.label}: {verdict} against criteria {self.fingerprint} ({counts})"

    def __str__(self) -> str:
        lines = [self.headline()]
        lines += [f"  - {r}" for r in self.reasons]
        lines.append(self.summary.to_string(index=False))
        return "\n".join(lines)

    def __repr__(self) -> str:
        return str(self)

    def _repr_html_(self) -> str:
        colour = "#2e7d32" if self.passed else "#c62828"
        reasons = "".join(f"<li>{html.escape(r)}</li>" for r in self.reasons)
        return (
            f"<div style='border-left:6px solid {colour};padding:4px 10px'>"
            f"<b>{html.escape(self.headline())}</b>"
            f"<ul style='margin:2px 0'>{reasons}</ul>{self.summary.to_html(index=False)}</div>"
        )


def _names(ids, n: int) -> list:
    return list(ids) if ids is not None else list(range(n))


def _frame(ids, categories, n: int) -> pd.DataFrame:
    table = pd.DataFrame(index=range(n))
    if ids is not None:
        ids = list(ids)
        if len(ids) != n:
            raise ValueError(f"{len(ids)} ids for {n} samples: give one id per row.")
        table["id"] = ids
    if categories is not None:
        categories = list(categories)
        if len(categories) != n:
            raise ValueError(f"{len(categories)} categories for {n} samples: give one category per row.")
        table["category"] = categories
    return table


def _abs_diff(trial: torch.Tensor, reference: torch.Tensor) -> torch.Tensor:
    """``|trial - reference|`` elementwise, with NaN counted as ``inf``: it is never within a tolerance."""
    diff = (trial - reference).abs()
    return torch.where(torch.isnan(diff), torch.full_like(diff, math.inf), diff)


def _fmt(value: float) -> str:
    return "n/a" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:.4g}"


def compare(
    reference,
    trial,
    *,
    atol,
    rtol,
    tie_tolerance: float = 0.0,
    allowed_decision_changes: int = 0,
    nonfinite: str = "fail",
    labels=None,
    ids=None,
    categories=None,
    label: str = "AMP trial",
    criteria=None,
) -> Report:
    """Compare ``[N, C]`` trial scores with the FP32 reference, sample by sample, under loose tolerances.

    A row is flagged when the trial is non-finite, when any score is outside ``atol + rtol * |ref|``, or
    when the decision (tie rule: lowest index, or abstain below ``tie_tolerance``) differs from the
    reference's. The report fails on any non-finite row (unless ``nonfinite="allow"``), any row out of
    tolerance, or more than ``allowed_decision_changes`` changed decisions — a decision change fails
    the report even when every score is within tolerance. With ``labels`` (``-1`` = unlabelled) the
    quality on the set is shown too.

    The keywords build a :class:`Criteria`, so the report still names a fingerprint. To judge against
    criteria written *before* the trial, call :func:`judge`: that is the one way to pass a ``Criteria``.
    ``criteria=`` here raises ``TypeError`` instead of quietly choosing between it and the keywords.
    """
    if criteria is not None:
        raise TypeError(
            "compare() takes loose tolerances (atol=..., rtol=..., tie_tolerance=...), not criteria=: "
            "with both, one set would be silently ignored. To judge against a Criteria, call "
            "judge(reference, trial, criteria, labels=..., ...) instead."
        )
    criteria = Criteria(
        atol=atol,
        rtol=rtol,
        nonfinite=nonfinite,
        allowed_decision_changes=allowed_decision_changes,
        tie_rule="abstain" if validate_tolerance(tie_tolerance, "tie_tolerance") > 0 else "lowest_index",
        tie_tolerance=tie_tolerance,
    )
    return _judge_scores(
        reference, trial, criteria, labels=labels, ids=ids, categories=categories, label=label
    )


def judge(
    reference,
    trial,
    criteria: Criteria,
    *,
    recorded_fingerprint: str | None = None,
    labels=None,
    ids=None,
    categories=None,
    label: str = "AMP trial",
) -> Report:
    """Compare under ``criteria`` (see :func:`compare`; ``min_quality`` is judged here when labels are given).

    With ``recorded_fingerprint`` (printed before the trial), refuse criteria that were changed since —
    e.g. a tolerance widened after seeing a hard case."""
    if not isinstance(criteria, Criteria):
        raise TypeError(
            f"criteria must be an amp_lessons.l04_baseline_and_decision_boundary.Criteria; got {type(criteria).__name__}."
        )
    if recorded_fingerprint is not None and recorded_fingerprint != criteria.fingerprint:
        raise CriteriaChangedError(
            f"These criteria have fingerprint {criteria.fingerprint}, but the criteria recorded before the "
            f"trial were {recorded_fingerprint}. Criteria are fixed before the trial; changing them after "
            "seeing the results fits the test to the result. Write new criteria, record their fingerprint, "
            "and run a fresh trial (on new samples if the old ones informed the change)."
        )
    return _judge_scores(
        reference, trial, criteria, labels=labels, ids=ids, categories=categories, label=label
    )


def _paired_scores(reference, trial, labels):
    """Reference and trial as float32 ``[N, C]`` of the same shape, a finite reference, and labels ``[N]``."""
    ref = as_scores(reference, "reference")
    tri = as_scores(trial, "trial")
    if ref.shape != tri.shape:
        raise ValueError(
            f"reference has shape {tuple(ref.shape)} but trial has shape {tuple(tri.shape)}: compare the "
            "same samples, in the same order, with the same classes (run the trial on exactly the reference "
            "inputs)."
        )
    n = ref.shape[0]
    bad_ref = (~torch.isfinite(ref).all(dim=1)).nonzero().reshape(-1).tolist()
    if bad_ref:
        raise NonFiniteReferenceError(
            f"The reference has non-finite scores in rows {bad_ref[:10]}; a reference must be finite. "
            "Record a finite FP32 baseline first (see record_baseline)."
        )
    labels_t = None
    if labels is not None:
        labels_t = torch.as_tensor(labels).reshape(-1).long()
        if labels_t.numel() != n:
            raise ValueError(
                f"{labels_t.numel()} labels for {n} samples: give one label per row (-1 = unlabelled)."
            )
    return ref, tri, labels_t


def _judge_scores(reference, trial, criteria: Criteria, *, labels, ids, categories, label: str) -> Report:
    """The comparison behind :func:`compare` and :func:`judge`: one table row per sample, one summary row
    per level (finite, numeric, decision, quality), each level judged by its own small function."""
    ref, tri, labels_t = _paired_scores(reference, trial, labels)
    finite = torch.isfinite(tri).all(dim=1)
    diff = _abs_diff(tri, ref)
    within = (diff <= criteria.atol + criteria.rtol * ref.abs()).all(dim=1)
    max_diff = diff.max(dim=1).values
    ref_decision = decide(ref, criteria.tie_tolerance)
    tri_decision = decide(tri, criteria.tie_tolerance)
    changed = ref_decision != tri_decision

    table = _frame(ids, categories, ref.shape[0])
    table["finite"] = finite.tolist()
    table["max abs diff"] = max_diff.tolist()
    table["within tolerance"] = within.tolist()
    table["reference decision"] = ref_decision.tolist()
    table["trial decision"] = tri_decision.tolist()
    table["decision changed"] = changed.tolist()
    table["reference margin"] = margins(ref).tolist()
    table["trial margin"] = margins(tri).tolist()
    if labels_t is not None:
        table["label"] = labels_t.tolist()
    table["flag"] = [_flag(f, w, c) for f, w, c in zip(finite.tolist(), within.tolist(), changed.tolist())]

    levels = [
        _finite_level(finite, criteria),
        _numeric_level(within, max_diff, criteria),
        _decision_level(ref_decision, changed, criteria),
        _quality_level(ref_decision, tri_decision, labels_t, criteria),
    ]
    rows = [row for row, _, _ in levels if row is not None]
    reasons = [reason for _, reason, _ in levels if reason]
    summary = pd.DataFrame(rows, columns=["criterion", "reference", label, "verdict"])
    return Report(all(ok for _, _, ok in levels), table, summary, criteria, reasons, label)


def _flag(finite: bool, within: bool, changed: bool) -> str:
    problems = [
        text
        for bad, text in (
            (not finite, "non-finite"),
            (not within, "out of tolerance"),
            (changed, "decision changed"),
        )
        if bad
    ]
    return ", ".join(problems) or "ok"


# Each level returns (summary row or None, reason it fails or None, ok).


def _finite_level(finite: torch.Tensor, criteria: Criteria):
    n, n_nonfinite = finite.numel(), int((~finite).sum())
    ok = n_nonfinite == 0 or criteria.nonfinite == "allow"
    verdict = ("pass" if n_nonfinite == 0 else "allowed") if ok else "FAIL"
    row = ("finite outputs", f"{n}/{n} finite", f"{n - n_nonfinite}/{n} finite", verdict)
    reason = (
        None
        if ok
        else (f"{n_nonfinite} sample(s) have NaN/inf scores and the criteria fail any non-finite output")
    )
    return row, reason, ok


def _numeric_level(within: torch.Tensor, max_diff: torch.Tensor, criteria: Criteria):
    n, n_out = within.numel(), int((~within).sum())
    worst = float(max_diff.max()) if n else 0.0
    bound = f"{criteria.atol:g} + {criteria.rtol:g}*|ref|"
    row = (
        "numeric difference",
        "exact (it is the reference)",
        f"max |diff| {_fmt(worst)}; {n_out} of {n} outside {bound}",
        "pass" if n_out == 0 else "FAIL",
    )
    reason = None
    if n_out:
        reason = (
            f"{n_out} sample(s) have scores outside "
            f"|trial - ref| <= {criteria.atol:g} + {criteria.rtol:g} * |ref|"
        )
    return row, reason, n_out == 0


def _decision_level(ref_decision: torch.Tensor, changed: torch.Tensor, criteria: Criteria):
    n, n_changed = changed.numel(), int(changed.sum())
    allowed = criteria.allowed_decision_changes
    ok = n_changed <= allowed
    row = (
        "application decision",
        f"{n} decided ({int((ref_decision == ABSTAIN).sum())} abstain)",
        f"{n_changed} changed (allowed: {allowed})",
        "pass" if ok else "FAIL",
    )
    reason = None if ok else f"{n_changed} sample(s) changed decision; the criteria allow {allowed}"
    return row, reason, ok


def _quality_level(ref_decision, tri_decision, labels_t, criteria: Criteria):
    if labels_t is None:
        if criteria.min_quality is None:
            return None, None, True
        return (
            ("quality on the fixed set", "no labels", "no labels", "FAIL"),
            "the criteria set a minimum quality, but no labels were given to measure it",
            False,
        )
    ref_q, tri_q = accuracy(ref_decision, labels_t), accuracy(tri_decision, labels_t)
    if criteria.min_quality is None:
        return ("quality on the fixed set", _pct(ref_q), _pct(tri_q), "not judged"), None, True
    ok, message = judge_quality(tri_q, criteria)
    row = ("quality on the fixed set", _pct(ref_q), _pct(tri_q), "pass" if ok else "FAIL")
    return row, None if ok else message, ok


def _pct(value: float) -> str:
    return "n/a" if math.isnan(value) else f"{value:.1%}"


# -------------------------------------------------------------------------------------------- regression


def compare_regression(
    reference, trial, targets, *, atol, rtol, ids=None, categories=None, label: str = "AMP trial"
) -> Report:
    """Compare one-value-per-sample predictions: the useful outputs are the **errors** and the **extremes**.

    Per sample: finite, |trial - ref| within ``atol + rtol * |ref|``, the error ``pred - target`` on both
    sides. Summary: the worst absolute error and which sample has the largest prediction (the "extreme"
    an application would act on, e.g. the peak load), reference vs trial.
    """
    ref = as_scores(_column(reference, "reference"), "reference")
    tri = as_scores(_column(trial, "trial"), "trial")
    tgt = as_scores(_column(targets, "targets"), "targets")
    if not (ref.shape == tri.shape == tgt.shape):
        raise ValueError(
            f"reference {tuple(ref.shape[:1])}, trial {tuple(tri.shape[:1])} and targets "
            f"{tuple(tgt.shape[:1])} must have the same number of samples."
        )
    if not torch.isfinite(ref).all():
        raise NonFiniteReferenceError(
            "The reference predictions contain NaN/inf; record a finite FP32 baseline first."
        )
    atol, rtol = validate_tolerance(atol, "atol"), validate_tolerance(rtol, "rtol")
    ref, tri, tgt = ref[:, 0], tri[:, 0], tgt[:, 0]
    n = ref.numel()
    finite = torch.isfinite(tri)
    diff = _abs_diff(tri, ref)
    within = diff <= atol + rtol * ref.abs()
    table = _frame(ids, categories, n)
    table["reference"] = ref.tolist()
    table["trial"] = tri.tolist()
    table["finite"] = finite.tolist()
    table["abs diff"] = diff.tolist()
    table["within tolerance"] = within.tolist()
    table["reference error"] = (ref - tgt).tolist()
    table["trial error"] = (tri - tgt).tolist()
    names = _names(ids, n)
    ref_err, tri_err = (ref - tgt).abs(), _abs_diff(tri, tgt)
    n_out, n_bad = int((~within).sum()), int((~finite).sum())
    rows = [
        ("finite outputs", f"{n}/{n} finite", f"{n - n_bad}/{n} finite", "pass" if n_bad == 0 else "FAIL"),
        (
            "numeric difference",
            "exact (it is the reference)",
            f"max |diff| {_fmt(float(diff.max()) if n else 0.0)}; {n_out} outside {atol:g} + {rtol:g}*|ref|",
            "pass" if n_out == 0 else "FAIL",
        ),
        (
            "worst |error| vs target",
            _fmt(float(ref_err.max()) if n else 0.0),
            _fmt(float(tri_err.max()) if n else 0.0),
            "info",
        ),
    ]
    reasons = []
    if n_bad:
        reasons.append(f"{n_bad} prediction(s) are NaN/inf")
    if n_out:
        reasons.append(f"{n_out} prediction(s) outside {atol:g} + {rtol:g} * |ref|")
    for what, sign in (("largest", 1.0), ("smallest", -1.0)):
        if n:
            row, reason = _extreme_row(what, ref * sign, tri * sign, ref, tri, finite, names)
            rows.append(row)
            reasons += [reason] if reason else []
    table["flag"] = [
        "ok" if (f and w) else ("non-finite" if not f else "out of tolerance")
        for f, w in zip(finite.tolist(), within.tolist())
    ]
    summary = pd.DataFrame(rows, columns=["criterion", "reference", label, "verdict"])
    criteria = Criteria(atol=atol, rtol=rtol, application="regression: errors and extremes")
    return Report(not reasons, table, summary, criteria, reasons, label)


def _extreme_row(what: str, ref_key, tri_key, ref, tri, finite, names) -> tuple:
    """The summary row for the sample with the ``what`` ("largest"/"smallest") prediction, and the reason
    it fails when the trial picks a different sample (or a tie): an application acts on that extreme."""
    ref_at = _extreme(ref_key, torch.ones_like(finite))
    tri_at = _extreme(tri_key, finite)
    same = ref_at == tri_at
    ref_text = f"{names[ref_at[0]]} = {_fmt(float(ref[ref_at[0]]))}"
    tri_text = (
        "none (all non-finite)"
        if not tri_at
        else f"{' = '.join(str(names[i]) for i in tri_at)} = {_fmt(float(tri[tri_at[0]]))}"
    )
    if len(tri_at) > 1:
        tri_text += " (tie)"
    row = (f"{what} prediction (extreme)", ref_text, tri_text, "pass" if same else "FAIL")
    if same:
        return row, None
    tri_names = ", ".join(str(names[i]) for i in tri_at)
    if len(tri_at) > 1:
        where = "is now a tie between " + tri_names
    else:
        where = f"moved from {names[ref_at[0]]} to {tri_names or 'nowhere'}"
    return row, f"the {what} prediction {where}"


def _extreme(values: torch.Tensor, usable: torch.Tensor) -> list:
    """Indices of every usable sample that shares the largest value (a tie lists them all)."""
    if not bool(usable.any()):
        return []
    top = values[usable].max()
    return [i for i in range(values.numel()) if bool(usable[i]) and bool(values[i] == top)]


def _column(values, name: str):
    if isinstance(values, torch.Tensor) and values.dim() == 1:
        return values.unsqueeze(1)
    if isinstance(values, torch.Tensor) and values.dim() == 2 and values.shape[1] != 1:
        raise ValueError(
            f"{name} must have one value per sample, shape [N] or [N, 1]; got {tuple(values.shape)}."
        )
    return values
