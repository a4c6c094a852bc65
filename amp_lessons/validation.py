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
which makes every check pass by construction. :class:`Criteria` is immutable and has a fingerprint; you
print it before the trial, and every report names the fingerprint it was judged against, so a criterion
changed afterwards is visible (and :func:`judge` refuses it when you pass the recorded fingerprint).

Decisions and ties (see :func:`decide`): the decision of a row is the index of its largest score, ties
going to the lowest index (what ``argmax`` does on CPU and CUDA). With ``tie_tolerance > 0`` the row
*abstains* (decision ``-1``, "escalate to a human") when its margin is strictly below the tolerance. A row
with any NaN or infinity also gives ``-1``: there is no trustworthy decision to take from it.
"""

from __future__ import annotations

import hashlib
import html
import json
import math
import numbers
from dataclasses import asdict, dataclass, field

import pandas as pd
import torch

ABSTAIN = -1
TIE_RULES = ("lowest_index", "abstain")
NONFINITE_POLICIES = ("fail", "allow")

__all__ = [
    "ABSTAIN",
    "Baseline",
    "CriteriaChangedError",
    "Criteria",
    "NonFiniteReferenceError",
    "Report",
    "accuracy",
    "as_scores",
    "compare",
    "compare_regression",
    "decide",
    "judge",
    "judge_quality",
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
            hint = (" For one score per sample use compare_regression, or add a class axis with "
                    "`.unsqueeze(1)`; for a single sample use `.unsqueeze(0)`.")
        raise ValueError(f"{name} must have shape [N, C]; got shape {tuple(tensor.shape)}.{hint}")
    if tensor.shape[1] == 0:
        raise ValueError(f"{name} has shape {tuple(tensor.shape)}: there must be at least one class (C >= 1).")
    if tensor.shape[0] == 0 and not allow_empty:
        raise ValueError(f"{name} has no rows (shape {tuple(tensor.shape)}): there is nothing to compare.")
    return tensor.detach().to("cpu", torch.float32)


def _check_tolerance(value, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a number (a float such as 1e-3); got {type(value).__name__}.")
    value = float(value)
    if math.isnan(value) or value < 0 or math.isinf(value):
        raise ValueError(f"{name} must be a finite number >= 0; got {value}.")
    return value


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
    tie_tolerance = _check_tolerance(tie_tolerance, "tie_tolerance")
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


# ---------------------------------------------------------------------------------------------- criteria


@dataclass(frozen=True)
class Criteria:
    """Acceptance criteria for an AMP trial, written down **before** the trial. Immutable.

    - ``atol``, ``rtol``: a trial score passes when ``|trial - ref| <= atol + rtol * |ref|``;
    - ``min_quality``: minimum quality (accuracy on the labelled rows of the fixed set), or None;
    - ``nonfinite``: ``"fail"`` (any NaN/inf in the trial fails it) or ``"allow"`` (flagged, not failing);
    - ``tie_rule``: ``"lowest_index"`` (exact ties go to the lowest index; ``tie_tolerance`` must be 0) or
      ``"abstain"`` (margin strictly below ``tie_tolerance`` gives -1, escalate);
    - ``allowed_decision_changes``: how many samples may change decision and still pass (usually 0);
    - ``application``: what the outputs are used for, in words (part of the fingerprint).
    """

    atol: float
    rtol: float
    min_quality: float | None = None
    nonfinite: str = "fail"
    tie_rule: str = "lowest_index"
    tie_tolerance: float = 0.0
    allowed_decision_changes: int = 0
    application: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "atol", _check_tolerance(self.atol, "atol"))
        object.__setattr__(self, "rtol", _check_tolerance(self.rtol, "rtol"))
        object.__setattr__(self, "tie_tolerance", _check_tolerance(self.tie_tolerance, "tie_tolerance"))
        if self.min_quality is not None:
            quality = _check_tolerance(self.min_quality, "min_quality")
            if quality > 1:
                raise ValueError(f"min_quality is a fraction between 0 and 1 (e.g. 0.9 for 90 %); got {quality}.")
            object.__setattr__(self, "min_quality", quality)
        if self.nonfinite not in NONFINITE_POLICIES:
            raise ValueError(f"nonfinite must be one of {NONFINITE_POLICIES}; got {self.nonfinite!r}.")
        if self.tie_rule not in TIE_RULES:
            raise ValueError(f"tie_rule must be one of {TIE_RULES}; got {self.tie_rule!r}.")
        if self.tie_rule == "lowest_index" and self.tie_tolerance != 0:
            raise ValueError(
                "tie_rule='lowest_index' settles exact ties only, so tie_tolerance must be 0. To escalate "
                "near-ties, use tie_rule='abstain' with tie_tolerance > 0."
            )
        if self.tie_rule == "abstain" and self.tie_tolerance == 0:
            raise ValueError("tie_rule='abstain' needs tie_tolerance > 0 (the margin below which to abstain).")
        allowed = self.allowed_decision_changes
        if isinstance(allowed, bool) or not isinstance(allowed, int) or allowed < 0:
            raise ValueError(f"allowed_decision_changes must be an integer >= 0; got {allowed!r}.")
        if not isinstance(self.application, str):
            raise TypeError("application must be a string describing what the outputs are used for.")

    @property
    def fingerprint(self) -> str:
        """12 hex digits of SHA-256 over every field: any change, however small, gives a new fingerprint."""
        payload = json.dumps({k: repr(v) for k, v in asdict(self).items()}, sort_keys=True)
        return hashlib.sha256(payload.encode("utf-8")).hexdigest()[:12]

    def quality_ok(self, quality: float) -> bool:
        """True when ``quality`` meets ``min_quality`` (always True when no minimum was set)."""
        return judge_quality(quality, self)[0]

    def rows(self) -> list[tuple[str, str]]:
        return [
            ("application", self.application or "(not stated)"),
            ("numeric tolerance", f"|trial - ref| <= {self.atol:g} + {self.rtol:g} * |ref|, every score"),
            ("minimum quality", "not judged" if self.min_quality is None else f"{self.min_quality:.1%} accuracy"),
            ("non-finite outputs", {"fail": "any NaN/inf fails the trial", "allow": "flagged, do not fail"}[self.nonfinite]),
            ("tie rule", "exact ties -> lowest index" if self.tie_rule == "lowest_index"
             else f"margin < {self.tie_tolerance:g} -> abstain (-1, escalate)"),
            ("allowed decision changes", str(self.allowed_decision_changes)),
            ("fingerprint", self.fingerprint),
        ]

    def __str__(self) -> str:
        rows = self.rows()
        width = max(len(k) for k, _ in rows)
        return "\n".join(["Criteria (fixed before the trial)"] + [f"  {k.ljust(width)} : {v}" for k, v in rows])

    def _repr_html_(self) -> str:
        body = "".join(
            f"<tr><th style='text-align:left;padding:2px 10px'>{html.escape(k)}</th>"
            f"<td style='text-align:left;padding:2px 10px'><code>{html.escape(v)}</code></td></tr>"
            for k, v in self.rows()
        )
        return (f"<div style='border:2px solid #6a1b9a;border-radius:6px;padding:6px;max-width:900px'>"
                f"<b>Criteria (fixed before the trial)</b><table>{body}</table></div>")


def judge_quality(quality, criteria: Criteria) -> tuple[bool, str]:
    """``(ok, message)``: does ``quality`` (a fraction) meet ``criteria.min_quality``? NaN never does."""
    if not isinstance(criteria, Criteria):
        raise TypeError(f"criteria must be an amp_lessons.validation.Criteria; got {type(criteria).__name__}.")
    if criteria.min_quality is None:
        return True, "no minimum quality in these criteria"
    try:
        value = float(quality)
    except (TypeError, ValueError):
        raise TypeError(f"quality must be a number (a fraction such as 0.93); got {type(quality).__name__}.") from None
    if math.isnan(value):
        return False, f"quality is NaN (non-finite outputs?); the criteria need >= {criteria.min_quality:.1%}"
    if value >= criteria.min_quality:
        return True, f"quality {value:.1%} >= {criteria.min_quality:.1%} [criteria {criteria.fingerprint}]"
    return False, f"quality {value:.1%} is below the minimum {criteria.min_quality:.1%} [criteria {criteria.fingerprint}]"


# ---------------------------------------------------------------------------------------------- baseline


@dataclass
class Baseline:
    """The FP32 reference outputs: scores, decisions and margins per sample, and quality on the set."""

    scores: torch.Tensor
    decisions: torch.Tensor
    margins: torch.Tensor
    quality: float
    table: pd.DataFrame

    def __repr__(self) -> str:
        quality = "not judged (no labels)" if math.isnan(self.quality) else f"{self.quality:.1%}"
        return f"Baseline({len(self.table)} samples, all finite, quality {quality})"


def record_baseline(scores, *, labels=None, ids=None, categories=None, tie_tolerance: float = 0.0) -> Baseline:
    """Record the FP32 reference; stop with :class:`NonFiniteReferenceError` when any score is NaN/inf."""
    tensor = as_scores(scores, "reference", allow_empty=False)
    if isinstance(scores, torch.Tensor) and scores.dtype != torch.float32:
        raise ValueError(f"The reference must be computed in float32 (outside autocast); got {scores.dtype}.")
    bad = (~torch.isfinite(tensor).all(dim=1)).nonzero().reshape(-1).tolist()
    if bad:
        names = _names(ids, tensor.shape[0])
        raise NonFiniteReferenceError(
            f"The FP32 reference has non-finite scores in {len(bad)} sample(s): {[names[i] for i in bad][:10]}. "
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
    return Baseline(tensor, decisions, reference_margins, quality, table)


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
        problems = {"non-finite": ~t["finite"].astype(bool), "out of tolerance": ~t["within tolerance"].astype(bool)}
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
        return (f"<div style='border-left:6px solid {colour};padding:4px 10px'><b>{html.escape(self.headline())}</b>"
                f"<ul style='margin:2px 0'>{reasons}</ul>{self.summary.to_html(index=False)}</div>")


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


def compare(reference, trial, *, atol, rtol, tie_tolerance: float = 0.0, allowed_decision_changes: int = 0,
            nonfinite: str = "fail", labels=None, ids=None, categories=None, criteria: Criteria | None = None,
            label: str = "AMP trial") -> Report:
    """Compare ``[N, C]`` trial scores with the FP32 reference, sample by sample.

    A row is flagged when the trial is non-finite, when any score is outside ``atol + rtol * |ref|``, or
    when the decision (tie rule: lowest index, or abstain below ``tie_tolerance``) differs from the
    reference's. The report fails on any non-finite row (unless ``nonfinite="allow"``), any row out of
    tolerance, or more than ``allowed_decision_changes`` changed decisions — a decision change fails
    the report even when every score is within tolerance. With ``labels`` (``-1`` = unlabelled) the
    quality on the set is shown too (and judged when ``criteria`` has a ``min_quality``).

    Prefer :func:`judge` with a :class:`Criteria` written before the trial; ``compare`` with loose
    keywords builds the same criteria object, so its report still names a fingerprint.
    """
    if criteria is None:
        criteria = Criteria(
            atol=atol, rtol=rtol, nonfinite=nonfinite, allowed_decision_changes=allowed_decision_changes,
            tie_rule="abstain" if _check_tolerance(tie_tolerance, "tie_tolerance") > 0 else "lowest_index",
            tie_tolerance=tie_tolerance,
        )
    ref = as_scores(reference, "reference")
    tri = as_scores(trial, "trial")
    if ref.shape != tri.shape:
        raise ValueError(
            f"reference has shape {tuple(ref.shape)} but trial has shape {tuple(tri.shape)}: compare the same "
            "samples, in the same order, with the same classes (run the trial on exactly the reference inputs)."
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
            raise ValueError(f"{labels_t.numel()} labels for {n} samples: give one label per row (-1 = unlabelled).")

    tol = criteria.tie_tolerance
    finite = torch.isfinite(tri).all(dim=1)
    diff = _abs_diff(tri, ref)
    within = (diff <= criteria.atol + criteria.rtol * ref.abs()).all(dim=1)
    max_diff = diff.max(dim=1).values
    ref_decision = decide(ref, tol)
    tri_decision = decide(tri, tol)
    changed = ref_decision != tri_decision

    table = _frame(ids, categories, n)
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
    flags = []
    for f, w, c in zip(finite.tolist(), within.tolist(), changed.tolist()):
        problems = [text for bad, text in ((not f, "non-finite"), (not w, "out of tolerance"), (c, "decision changed")) if bad]
        flags.append(", ".join(problems) or "ok")
    table["flag"] = flags

    reasons, rows = [], []
    n_nonfinite = int((~finite).sum())
    finite_ok = n_nonfinite == 0 or criteria.nonfinite == "allow"
    rows.append(("finite outputs", f"{n}/{n} finite", f"{n - n_nonfinite}/{n} finite",
                 ("pass" if n_nonfinite == 0 else "allowed") if finite_ok else "FAIL"))
    if not finite_ok:
        reasons.append(f"{n_nonfinite} sample(s) have NaN/inf scores and the criteria fail any non-finite output")
    n_out = int((~within).sum())
    worst = float(max_diff.max()) if n else 0.0
    rows.append(("numeric difference", "exact (it is the reference)",
                 f"max |diff| {_fmt(worst)}; {n_out} of {n} outside {criteria.atol:g} + {criteria.rtol:g}*|ref|",
                 "pass" if n_out == 0 else "FAIL"))
    if n_out:
        reasons.append(f"{n_out} sample(s) have scores outside |trial - ref| <= {criteria.atol:g} + {criteria.rtol:g} * |ref|")
    n_changed = int(changed.sum())
    n_abstain_ref = int((ref_decision == ABSTAIN).sum())
    decisions_ok = n_changed <= criteria.allowed_decision_changes
    rows.append(("application decision", f"{n} decided ({n_abstain_ref} abstain)",
                 f"{n_changed} changed (allowed: {criteria.allowed_decision_changes})", "pass" if decisions_ok else "FAIL"))
    if not decisions_ok:
        reasons.append(f"{n_changed} sample(s) changed decision; the criteria allow {criteria.allowed_decision_changes}")
    quality_ok = True
    if labels_t is not None:
        ref_q, tri_q = accuracy(ref_decision, labels_t), accuracy(tri_decision, labels_t)
        if criteria.min_quality is None:
            verdict = "not judged"
        else:
            quality_ok, message = judge_quality(tri_q, criteria)
            verdict = "pass" if quality_ok else "FAIL"
            if not quality_ok:
                reasons.append(message)
        rows.append(("quality on the fixed set", _pct(ref_q), _pct(tri_q), verdict))
    elif criteria.min_quality is not None:
        quality_ok = False
        reasons.append("the criteria set a minimum quality, but no labels were given to measure it")
        rows.append(("quality on the fixed set", "no labels", "no labels", "FAIL"))
    summary = pd.DataFrame(rows, columns=["criterion", "reference", label, "verdict"])
    passed = bool(finite_ok and n_out == 0 and decisions_ok and quality_ok)
    return Report(passed, table, summary, criteria, reasons, label)


def _pct(value: float) -> str:
    return "n/a" if math.isnan(value) else f"{value:.1%}"


def judge(reference, trial, criteria: Criteria, *, recorded_fingerprint: str | None = None, labels=None, ids=None,
          categories=None, label: str = "AMP trial") -> Report:
    """:func:`compare` under ``criteria``; with ``recorded_fingerprint`` (printed before the trial), refuse
    criteria that were changed since — e.g. a tolerance widened after seeing a hard case."""
    if not isinstance(criteria, Criteria):
        raise TypeError(f"criteria must be an amp_lessons.validation.Criteria; got {type(criteria).__name__}.")
    if recorded_fingerprint is not None and recorded_fingerprint != criteria.fingerprint:
        raise CriteriaChangedError(
            f"These criteria have fingerprint {criteria.fingerprint}, but the criteria recorded before the trial "
            f"were {recorded_fingerprint}. Criteria are fixed before the trial; changing them after seeing the "
            "results fits the test to the result. Write new criteria, record their fingerprint, and run a fresh "
            "trial (on new samples if the old ones informed the change)."
        )
    return compare(reference, trial, atol=criteria.atol, rtol=criteria.rtol, tie_tolerance=criteria.tie_tolerance,
                   allowed_decision_changes=criteria.allowed_decision_changes, nonfinite=criteria.nonfinite,
                   labels=labels, ids=ids, categories=categories, criteria=criteria, label=label)


# -------------------------------------------------------------------------------------------- regression


def compare_regression(reference, trial, targets, *, atol, rtol, ids=None, categories=None,
                       label: str = "AMP trial") -> Report:
    """Compare one-value-per-sample predictions: the useful outputs are the **errors** and the **extremes**.

    Per sample: finite, |trial - ref| within ``atol + rtol * |ref|``, the error ``pred - target`` on both
    sides. Summary: the worst absolute error and which sample has the largest prediction (the "extreme"
    an application would act on, e.g. the peak load), reference vs trial.
    """
    ref = as_scores(_column(reference, "reference"), "reference")
    tri = as_scores(_column(trial, "trial"), "trial")
    tgt = as_scores(_column(targets, "targets"), "targets")
    if not (ref.shape == tri.shape == tgt.shape):
        raise ValueError(f"reference {tuple(ref.shape[:1])}, trial {tuple(tri.shape[:1])} and targets "
                         f"{tuple(tgt.shape[:1])} must have the same number of samples.")
    if not torch.isfinite(ref).all():
        raise NonFiniteReferenceError("The reference predictions contain NaN/inf; record a finite FP32 baseline first.")
    atol, rtol = _check_tolerance(atol, "atol"), _check_tolerance(rtol, "rtol")
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
        ("numeric difference", "exact (it is the reference)",
         f"max |diff| {_fmt(float(diff.max()) if n else 0.0)}; {n_out} outside {atol:g} + {rtol:g}*|ref|",
         "pass" if n_out == 0 else "FAIL"),
        ("worst |error| vs target", _fmt(float(ref_err.max()) if n else 0.0),
         _fmt(float(tri_err.max()) if n else 0.0), "info"),
    ]
    reasons = []
    if n_bad:
        reasons.append(f"{n_bad} prediction(s) are NaN/inf")
    if n_out:
        reasons.append(f"{n_out} prediction(s) outside {atol:g} + {rtol:g} * |ref|")
    for what, sign in (("largest", 1.0), ("smallest", -1.0)):
        if not n:
            break
        ref_at = _extreme(ref * sign, torch.ones_like(finite))
        tri_at = _extreme(tri * sign, finite)
        same = ref_at == tri_at
        ref_text = f"{names[ref_at[0]]} = {_fmt(float(ref[ref_at[0]]))}"
        tri_text = ("none (all non-finite)" if not tri_at else
                    f"{' = '.join(str(names[i]) for i in tri_at)} = {_fmt(float(tri[tri_at[0]]))}")
        if len(tri_at) > 1:
            tri_text += " (tie)"
        rows.append((f"{what} prediction (extreme)", ref_text, tri_text, "pass" if same else "FAIL"))
        if not same:
            where = "is now a tie between " + ", ".join(str(names[i]) for i in tri_at) if len(tri_at) > 1 else \
                f"moved from {names[ref_at[0]]} to {', '.join(str(names[i]) for i in tri_at) or 'nowhere'}"
            reasons.append(f"the {what} prediction {where}")
    table["flag"] = ["ok" if (f and w) else ("non-finite" if not f else "out of tolerance")
                     for f, w in zip(finite.tolist(), within.tolist())]
    summary = pd.DataFrame(rows, columns=["criterion", "reference", label, "verdict"])
    criteria = Criteria(atol=atol, rtol=rtol, application="regression: errors and extremes")
    return Report(not reasons, table, summary, criteria, reasons, label)


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
        raise ValueError(f"{name} must have one value per sample, shape [N] or [N, 1]; got {tuple(values.shape)}.")
    return values


# ------------------------------------------------------------------------------------ margins at risk: plot + widget

FLOOR = 1e-12  # where zeros are drawn on the log axes


def at_risk(table: pd.DataFrame, tolerance: float) -> pd.DataFrame:
    """Rows whose decision *could* change if every score may move by up to ``tolerance``.

    If each score moves by at most ``d``, the gap between the top two moves by at most ``2 d``, so a sample
    whose reference margin is at least ``2 * tolerance`` cannot flip; below that it is *at risk*. The result
    adds ``at risk`` and ``outside tolerance`` (observed max |diff| > tolerance) columns to ``table``
    (a :func:`compare` table) and keeps only the at-risk rows, smallest margin first.
    """
    tolerance = _check_tolerance(tolerance, "tolerance")
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
    tolerance = _check_tolerance(tolerance, "tolerance")
    risky = set(at_risk(table, tolerance).index)
    frame = table.assign(**{
        "at risk": [i in risky for i in table.index],
        "changed but not at risk": [bool(c) and i not in risky for i, c in zip(table.index, table["decision changed"])],
    })
    key = "category" if "category" in frame else frame.index.map(lambda _: "all")
    grouped = frame.groupby(key, sort=False)
    return pd.DataFrame({
        "samples": grouped.size(),
        "at risk": grouped["at risk"].sum().astype(int),
        "decision changed": grouped["decision changed"].sum().astype(int),
        "changed but not at risk": grouped["changed but not at risk"].sum().astype(int),
    })


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
    ax.plot([lo, hi], [lo / 2, hi / 2], "--", color="grey", lw=1, label="diff = margin / 2 (flip possible above)")
    if tolerance is not None and tolerance > 0:
        ax.axvspan(lo, 2 * tolerance, color="#ffcc80", alpha=0.35, label=f"at risk: margin < 2 x {tolerance:.2g}")
        ax.axhline(tolerance, color="#ef6c00", lw=1, label=f"tolerance {tolerance:.2g}")
    groups = (
        ("kept decision", ~changed & finite, "o", "#1565c0"),
        ("decision changed", changed & finite, "o", "#c62828"),
        ("non-finite trial", ~finite, "X", "#c62828"),
    )
    for name, mask, marker, colour in groups:
        if mask.any():
            ax.scatter(margin[mask], [d for d, m in zip(diff, mask) if m], marker=marker, s=46, color=colour,
                       edgecolor="black", linewidth=0.4, label=f"{name} ({int(mask.sum())})", zorder=3)
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
    columns = [c for c in ("id", "category", "reference margin", "max abs diff", "outside tolerance",
                           "decision changed") if c in report.table or c == "outside tolerance"]
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
    slider = widgets.FloatLogSlider(value=tolerance, base=10, min=-8, max=3, step=0.25, description="tolerance",
                                    readout_format=".1e", continuous_update=False)

    def show(name, tol):
        fig, table = risk_view(reports[name], tol)
        display(fig)
        summary = risk_summary(reports[name].table, tol)
        print(f"{len(table)} sample(s) at risk (margin < 2 x {tol:.2g}); "
              f"{int(summary['changed but not at risk'].sum())} changed decision outside the at-risk zone.")
        display(table)

    out = widgets.interactive_output(show, {"name": trial, "tol": slider})
    return widgets.VBox([widgets.HBox([trial, slider]), out])
