"""Lesson 06: decide when a run must roll back to its last good checkpoint, and keep the case that caused it.

A checkpoint you can resume from is half of a recovery; the other half is noticing, automatically, that the
run has gone wrong. :class:`Watchdog` turns that into explicit triggers, each with the evidence:

- **non-finite**: the loss (or the outputs) contains NaN/inf. GradScaler already skipped that update, but
  something in the data or the model is broken, and the scale was cut;
- **quality below criteria**: an evaluation falls below the lesson-04
  :class:`~amp_lessons.l04_baseline_and_decision_boundary.Criteria` (``min_quality``), written down before the run;
- **no updates**: the scaler skipped many steps in a row, so the weights are not being updated at all.

:func:`save_incident` stores the batch, step and reason that triggered a rollback as a small file that loads
with ``weights_only=True`` (same format rules and checksum as a checkpoint), for later debugging with
lesson 05's tools.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

import torch

from amp_lessons.l03_autocast_and_gradscaler.training import step_was_skipped
from amp_lessons.l04_baseline_and_decision_boundary.criteria import judge_quality
from amp_lessons.l06_checkpoint_and_rollback.checkpoint import (
    VERSION,
    is_plain,
    normalize_config,
    read_checkpoint,
    write_payload,
)

INCIDENT_FORMAT = "amp_lessons.incident"
NONFINITE = "non-finite"
LOW_QUALITY = "quality below criteria"
NO_UPDATES = "no updates"

__all__ = [
    "INCIDENT_FORMAT",
    "LOW_QUALITY",
    "NONFINITE",
    "NO_UPDATES",
    "Trigger",
    "Watchdog",
    "load_incident",
    "save_incident",
]


@dataclass
class Trigger:
    """Why a run must roll back: the step it happened at, one of the reasons above, and the evidence."""

    step: int
    reason: str
    detail: str

    def __str__(self) -> str:
        return f"step {self.step}: {self.reason} — {self.detail}"


class Watchdog:
    """Decides after each step (and each evaluation) whether the run must roll back to its last good state.

    Triggers:
    - **non-finite**: the loss (or the outputs, when given) contains NaN/inf. GradScaler already skipped that
      update, but something in the data or the model is broken, and the scale was cut;
    - **quality below criteria**: an evaluation falls below ``criteria.min_quality`` (a lesson-04
      :class:`~amp_lessons.l04_baseline_and_decision_boundary.Criteria`) or below a plain ``min_quality``;
    - **no updates**: the scaler skipped ``max_skipped_in_a_row`` steps in a row. A skip shows as the scale
      going *down* after ``scaler.update()`` (it backs off exactly when it found inf/NaN gradients). A few
      skips at the start of a run are normal (the scale backs off to fit). A sudden overflow, such as a loss
      multiplied by 1e4, costs a streak of about log2(factor) halvings and then heals by itself; a fault that
      no scale fixes (a gradient that is NaN at any scale) never ends its streak. Set the limit above the
      halvings a legitimate overflow needs, or the watchdog rolls back runs that would have recovered (lesson
      06, section 7b).
    """

    def __init__(self, *, criteria=None, min_quality: float | None = None, max_skipped_in_a_row: int = 6):
        if criteria is not None and min_quality is not None:
            raise ValueError("Give either criteria (lesson 04's Criteria) or min_quality, not both.")
        if criteria is not None and not hasattr(criteria, "min_quality"):
            raise TypeError(
                f"criteria must be an amp_lessons.l04_baseline_and_decision_boundary.Criteria; got {type(criteria).__name__}."
            )
        if min_quality is not None and not (isinstance(min_quality, (int, float)) and 0 <= min_quality <= 1):
            raise ValueError(f"min_quality is a fraction between 0 and 1; got {min_quality!r}.")
        limit = max_skipped_in_a_row
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            raise ValueError(f"max_skipped_in_a_row must be a positive integer; got {limit!r}.")
        self.criteria = criteria
        self.min_quality = min_quality
        self.max_skipped_in_a_row = max_skipped_in_a_row
        self.skipped_in_a_row = 0

    def reset(self) -> None:
        """Forget the skip streak (call it after a rollback)."""
        self.skipped_in_a_row = 0

    def after_step(
        self,
        step: int,
        loss,
        *,
        scale_before: float | None = None,
        scale_after: float | None = None,
        outputs=None,
    ) -> Trigger | None:
        """Check one finished step; returns a :class:`Trigger` or None."""
        for name, value in (("loss", loss), ("outputs", outputs)):
            if value is None:
                continue
            tensor = torch.as_tensor(value).detach()
            bad = int((~torch.isfinite(tensor)).sum()) if tensor.is_floating_point() else 0
            if bad:
                shown = (
                    f" (loss = {float(tensor.reshape(-1)[0])})"
                    if name == "loss" and tensor.numel() == 1
                    else ""
                )
                return Trigger(step, NONFINITE, f"the {name} has {bad} NaN/inf value(s)" + shown)
        if scale_before is not None and scale_after is not None:
            if step_was_skipped(scale_before, scale_after):
                self.skipped_in_a_row += 1
            else:
                self.skipped_in_a_row = 0
            if self.skipped_in_a_row >= self.max_skipped_in_a_row:
                return Trigger(
                    step,
                    NO_UPDATES,
                    f"the scaler skipped {self.skipped_in_a_row} steps in a row (scale now "
                    f"{scale_after:g}): the weights are not being updated",
                )
        return None

    def after_evaluation(self, step: int, quality: float) -> Trigger | None:
        """Check a quality measurement (e.g. accuracy on a fixed validation set) against the criteria."""
        if self.criteria is not None:
            ok, message = judge_quality(quality, self.criteria)
            return None if ok else Trigger(step, LOW_QUALITY, message)
        if self.min_quality is not None:
            value = float(quality)
            if math.isnan(value) or value < self.min_quality:
                return Trigger(
                    step, LOW_QUALITY, f"quality {value:.1%} is below the minimum {self.min_quality:.1%}"
                )
        return None


def save_incident(folder, trigger: Trigger, inputs, targets, *, config=None, extra=None) -> str:
    """Store the case that triggered a rollback (batch, step, reason) as a small weights_only-loadable file.

    Returns the path, ``incident_step<step>_<reason>.pt`` in ``folder``. Reload it with :func:`load_incident`
    and replay the batch with lesson 05's tools.
    """
    if not isinstance(trigger, Trigger):
        raise TypeError(f"trigger must be a Trigger from Watchdog; got {type(trigger).__name__}.")
    extra = dict(extra or {})
    if not is_plain({k: v for k, v in extra.items() if not isinstance(v, torch.Tensor)}):
        raise TypeError("extra may hold tensors, numbers, strings, booleans, None and lists/dicts of those.")
    payload = {
        "format": INCIDENT_FORMAT,
        "version": VERSION,
        "step": int(trigger.step),
        "reason": trigger.reason,
        "detail": trigger.detail,
        "inputs": torch.as_tensor(inputs).detach().cpu().clone(),
        "targets": torch.as_tensor(targets).detach().cpu().clone(),
        "config": normalize_config(config) if config is not None else {},
        "extra": {
            k: (v.detach().cpu().clone() if isinstance(v, torch.Tensor) else v) for k, v in extra.items()
        },
        "torch_version": str(torch.__version__),
    }
    slug = "".join(ch if ch.isalnum() else "-" for ch in trigger.reason).strip("-")
    name = f"incident_step{trigger.step:06d}_{slug}.pt"
    return write_payload(payload, os.path.join(os.fspath(folder), name))


def load_incident(path) -> dict:
    """Read back an incident written by :func:`save_incident` (plain data, ``weights_only=True``)."""
    return read_checkpoint(path, expect_format=INCIDENT_FORMAT)
