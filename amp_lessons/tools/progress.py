"""``python -m amp_lessons progress``: what one learner has done, per exercise, read from their record.

The exercise list comes from the checker registry's declared labels, read without importing torch or any
checker (see ``amp_lessons.checks.registry``); the record itself is ``amp_lessons.core.record``.
"""

from __future__ import annotations

import re

from amp_lessons.checks import registry
from amp_lessons.core.record import load, repair_entry

PASSED_STATE = "passed"
ATTEMPTED_STATE = "attempted"
NOT_STARTED_STATE = "not started"


def exercise_sort_key(label: str):
    """'01.2 x' before '01.10 y' before '02.1 z': numbers compare as numbers."""
    return [(0, int(part), "") if part.isdigit() else (1, 0, part) for part in re.split(r"(\d+)", label)]


def known_exercises() -> list:
    """Every exercise label the course's checkers know, in lesson order."""
    return sorted(registry.declared_labels(), key=exercise_sort_key)


def summarize(data: dict | None = None, known=None) -> list:
    """One row per exercise: ``state`` is passed / attempted / not started, with the last attempt's details.

    ``known`` (default: every checker's label) lists exercises even when they were never tried; exercises
    in the record but not known (an older course version) are listed too.
    """
    data = load() if data is None else data
    recorded = data.get("exercises", {}) if isinstance(data, dict) else {}
    known = list(known_exercises() if known is None else known)
    labels = known + sorted((label for label in recorded if label not in known), key=exercise_sort_key)
    rows = []
    for label in labels:
        entry, _ = repair_entry(recorded.get(label)) if label in recorded else (None, "")
        if not entry:
            rows.append(
                {
                    "exercise": label,
                    "state": NOT_STARTED_STATE,
                    "attempts": 0,
                    "last_status": "",
                    "last_message": "",
                    "last_attempt": "",
                    "first_passed": "",
                }
            )
            continue
        rows.append(
            {
                "exercise": label,
                "state": PASSED_STATE if entry.get("passed") else ATTEMPTED_STATE,
                "attempts": entry["attempts"],
                "last_status": str(entry.get("last_status", "")),
                "last_message": str(entry.get("last_message", "")),
                "last_attempt": str(entry.get("last_attempt", "") or ""),
                "first_passed": str(entry.get("first_passed", "") or ""),
            }
        )
    return rows


def format_summary(rows: list, width: int = 110) -> str:
    """The rows of :func:`summarize` as text for a terminal; an attempt's last message on the line below."""
    if not rows:
        return "No exercises known and none recorded."
    name_width = min(60, max(len(r["exercise"]) for r in rows))
    lines = []
    for row in rows:
        label = row["exercise"]
        label = label if len(label) <= name_width else label[: name_width - 3] + "..."
        if row["state"] == PASSED_STATE:
            lines.append(f"{label:<{name_width}}  passed {row['first_passed']}".rstrip())
        elif row["state"] == ATTEMPTED_STATE:
            attempts = f"{row['attempts']} attempt{'s' if row['attempts'] != 1 else ''}"
            lines.append(f"{label:<{name_width}}  attempted ({attempts}, last: {row['last_status']})")
            message = row["last_message"]
            if message:
                room = max(40, width - 6)
                lines.append(f"      {message if len(message) <= room else message[: room - 3] + '...'}")
        else:
            lines.append(f"{label:<{name_width}}  not started")
    passed = sum(r["state"] == PASSED_STATE for r in rows)
    attempted = sum(r["state"] == ATTEMPTED_STATE for r in rows)
    lines.append("")
    not_started = len(rows) - passed - attempted
    lines.append(
        f"{passed} of {len(rows)} exercises passed, {attempted} attempted, {not_started} not started."
    )
    return "\n".join(lines)
