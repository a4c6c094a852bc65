"""Lesson 04: acceptance criteria for an AMP trial, written down before the trial and fingerprinted.

Why criteria first. Tolerances chosen after looking at a trial tend to be the trial's own worst case,
which makes every check pass by construction. :class:`Criteria` is immutable and has a fingerprint; you
print it before the trial, and every report names the fingerprint it was judged against, so a criterion
changed afterwards is visible (and :func:`amp_lessons.l04_baseline_and_decision_boundary.judge` refuses it when you pass the
recorded fingerprint). Lesson 06's rollback watchdog reads ``min_quality`` from the same object.

Kept apart from :mod:`amp_lessons.l04_baseline_and_decision_boundary.validation` (which re-exports :class:`Criteria` and
:func:`judge_quality`): the criteria are plain data and need neither pandas nor the comparison machinery.
"""

from __future__ import annotations

import hashlib
import html
import json
import math
import numbers
from dataclasses import asdict, dataclass

TIE_RULES = ("lowest_index", "abstain")
NONFINITE_POLICIES = ("fail", "allow")

__all__ = ["NONFINITE_POLICIES", "TIE_RULES", "Criteria", "judge_quality", "validate_tolerance"]


def validate_tolerance(value, name: str) -> float:
    """``value`` as a float, or a clear error: tolerances are finite numbers >= 0 (a bool is not a number)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a number (a float such as 1e-3); got {type(value).__name__}.")
    value = float(value)
    if math.isnan(value) or value < 0 or math.isinf(value):
        raise ValueError(f"{name} must be a finite number >= 0; got {value}.")
    return value


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
        object.__setattr__(self, "atol", validate_tolerance(self.atol, "atol"))
        object.__setattr__(self, "rtol", validate_tolerance(self.rtol, "rtol"))
        object.__setattr__(self, "tie_tolerance", validate_tolerance(self.tie_tolerance, "tie_tolerance"))
        if self.min_quality is not None:
            quality = validate_tolerance(self.min_quality, "min_quality")
            if quality > 1:
                raise ValueError(
                    f"min_quality is a fraction between 0 and 1 (e.g. 0.9 for 90 %); got {quality}."
                )
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
            raise ValueError(
                "tie_rule='abstain' needs tie_tolerance > 0 (the margin below which to abstain)."
            )
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
            (
                "minimum quality",
                "not judged" if self.min_quality is None else f"{self.min_quality:.1%} accuracy",
            ),
            (
                "non-finite outputs",
                {"fail": "any NaN/inf fails the trial", "allow": "flagged, do not fail"}[self.nonfinite],
            ),
            (
                "tie rule",
                "exact ties -> lowest index"
                if self.tie_rule == "lowest_index"
                else f"margin < {self.tie_tolerance:g} -> abstain (-1, escalate)",
            ),
            ("allowed decision changes", str(self.allowed_decision_changes)),
            ("fingerprint", self.fingerprint),
        ]

    def __str__(self) -> str:
        rows = self.rows()
        width = max(len(k) for k, _ in rows)
        lines = [f"  {k.ljust(width)} : {v}" for k, v in rows]
        return "\n".join(["Criteria (fixed before the trial)"] + lines)

    def _repr_html_(self) -> str:
        body = "".join(
            f"<tr><th style='text-align:left;padding:2px 10px'>{html.escape(k)}</th>"
            f"<td style='text-align:left;padding:2px 10px'><code>{html.escape(v)}</code></td></tr>"
            for k, v in self.rows()
        )
        return (
            f"<div style='border:2px solid #6a1b9a;border-radius:6px;padding:6px;max-width:900px'>"
            f"<b>Criteria (fixed before the trial)</b><table>{body}</table></div>"
        )


def judge_quality(quality, criteria: Criteria) -> tuple[bool, str]:
    """``(ok, message)``: does ``quality`` (a fraction) meet ``criteria.min_quality``? NaN never does."""
    if not isinstance(criteria, Criteria):
        raise TypeError(
            f"criteria must be an amp_lessons.l04_baseline_and_decision_boundary.Criteria; got {type(criteria).__name__}."
        )
    if criteria.min_quality is None:
        return True, "no minimum quality in these criteria"
    try:
        value = float(quality)
    except (TypeError, ValueError):
        raise TypeError(
            f"quality must be a number (a fraction such as 0.93); got {type(quality).__name__}."
        ) from None
    if math.isnan(value):
        return False, f"quality is NaN (non-finite outputs?); the criteria need >= {criteria.min_quality:.1%}"
    if value >= criteria.min_quality:
        return True, f"quality {value:.1%} >= {criteria.min_quality:.1%} [criteria {criteria.fingerprint}]"
    return False, (
        f"quality {value:.1%} is below the minimum {criteria.min_quality:.1%} "
        f"[criteria {criteria.fingerprint}]"
    )
