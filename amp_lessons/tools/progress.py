"""What one learner has done, per exercise, read from their record: ``python -m amp_lessons progress`` in a
terminal, and :func:`show_progress` at the end of each lesson (and in lesson 00) as a small widget.

The exercise list comes from the checker registry's declared labels, read without importing torch or any
checker (see ``amp_lessons.checks.registry``); the record itself is ``amp_lessons.core.record``. The widget's
logic is plain functions (:func:`lesson_rows`, :func:`counts`, :func:`progress_html`), so tests need no browser.
"""

from __future__ import annotations

import html
import re

from amp_lessons.checks import registry
from amp_lessons.core.record import load, progress_path, repair_entry

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
        hints = int(entry.get("hints", 0)) if entry else 0
        if not entry or (entry["attempts"] == 0 and not entry.get("passed")):  # no check yet (hints maybe)
            rows.append(
                {
                    "exercise": label,
                    "state": NOT_STARTED_STATE,
                    "attempts": 0,
                    "hints": hints,
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
                "hints": hints,
                "last_status": str(entry.get("last_status", "")),
                "last_message": str(entry.get("last_message", "")),
                "last_attempt": str(entry.get("last_attempt", "") or ""),
                "first_passed": str(entry.get("first_passed", "") or ""),
            }
        )
    return rows


def _hints_note(row: dict) -> str:
    hints = row.get("hints", 0)
    return f"; {hints} hint{'s' if hints != 1 else ''}" if hints else ""


def format_summary(rows: list, width: int = 110) -> str:
    """The rows of :func:`summarize` as text for a terminal; an attempt's last message on the line below."""
    if not rows:
        return "No exercises known and none recorded."
    name_width = min(60, max(len(r["exercise"]) for r in rows))
    lines = []
    for row in rows:
        label = row["exercise"]
        label = label if len(label) <= name_width else label[: name_width - 3] + "..."
        hints = _hints_note(row)
        if row["state"] == PASSED_STATE:
            note = f" ({hints[2:]})" if hints else ""
            lines.append(f"{label:<{name_width}}  passed {row['first_passed']}{note}".rstrip())
        elif row["state"] == ATTEMPTED_STATE:
            attempts = f"{row['attempts']} attempt{'s' if row['attempts'] != 1 else ''}"
            lines.append(f"{label:<{name_width}}  attempted ({attempts}, last: {row['last_status']}{hints})")
            message = row["last_message"]
            if message:
                room = max(40, width - 6)
                lines.append(f"      {message if len(message) <= room else message[: room - 3] + '...'}")
        else:
            note = f" ({hints[2:]} seen)" if hints else ""
            lines.append(f"{label:<{name_width}}  not started{note}")
    lines.append("")
    lines.append(counts_line(counts(rows)))
    return "\n".join(lines)


# ------------------------------------------------------------------------------ where the learner is


def counts(rows: list) -> dict:
    """``{"exercises", "passed", "attempted", "not started", "hints"}`` over ``rows``."""
    passed = sum(r["state"] == PASSED_STATE for r in rows)
    attempted = sum(r["state"] == ATTEMPTED_STATE for r in rows)
    return {
        "exercises": len(rows),
        "passed": passed,
        "attempted": attempted,
        "not started": len(rows) - passed - attempted,
        "hints": sum(int(r.get("hints", 0)) for r in rows),
    }


def counts_line(numbers: dict) -> str:
    line = (
        f"{numbers['passed']} of {numbers['exercises']} exercises passed, {numbers['attempted']} attempted, "
        f"{numbers['not started']} not started"
    )
    hints = numbers["hints"]
    return line + (f"; {hints} hint{'s' if hints != 1 else ''} used." if hints else ".")


def lesson_rows(lesson: str | None = None, data: dict | None = None) -> list:
    """The rows of :func:`summarize` for lesson ``lesson`` ("01"), or for the whole course when None."""
    rows = summarize(data)
    if lesson is None:
        return rows
    return [row for row in rows if row["exercise"][:2] == str(lesson)[:2]]


STATE_MARKS = {PASSED_STATE: "✅ passed", ATTEMPTED_STATE: "✏️ attempted", NOT_STARTED_STATE: "· not started"}


def progress_html(rows: list, title: str, where: str = "") -> str:
    """A small table: one line per exercise (state, checks, hints), the totals above it."""
    body = "".join(
        "<tr>"
        f"<td style='padding:1px 8px'>{html.escape(row['exercise'])}</td>"
        f"<td style='padding:1px 8px'>{STATE_MARKS[row['state']]}</td>"
        f"<td style='padding:1px 8px;text-align:right'>{row['attempts']}</td>"
        f"<td style='padding:1px 8px;text-align:right'>{row.get('hints', 0)}</td>"
        "</tr>"
        for row in rows
    )
    head = "<tr><th>exercise</th><th>state</th><th>checks run</th><th>hints used</th></tr>"
    note = f"<div style='color:#666;font-size:85%'>{html.escape(where)}</div>" if where else ""
    return (
        "<div class='amp-progress' style='border-left:6px solid #6a1b9a;padding:6px 12px;margin:4px 0'>"
        f"<b>{html.escape(title)}</b>: {html.escape(counts_line(counts(rows)))}"
        f"<table style='margin-top:4px'>{head}{body}</table>{note}</div>"
    )


class ProgressView:
    """This learner's progress, as a widget with a Refresh button (a text table where there is no front end)."""

    def __init__(self, lesson: str | None = None):
        self.lesson = None if lesson is None else str(lesson)[:2]

    @property
    def title(self) -> str:
        return "Your progress" + (
            f" on lesson {self.lesson}'s exercises" if self.lesson else " in the course"
        )

    def where(self) -> str:
        path = progress_path()
        return f"record: {path}" if path else "recording is switched off (AMP_LESSONS_PROGRESS_FILE=off)"

    def rows(self) -> list:
        return lesson_rows(self.lesson)

    def __str__(self) -> str:
        rows = self.rows()
        if not rows:
            return f"{self.title}: this lesson has no exercises."
        return f"{self.title}\n{format_summary(rows)}\n{self.where()}"

    def __repr__(self) -> str:
        return str(self)

    def html(self) -> str:
        return progress_html(self.rows(), self.title, self.where())

    def widget(self):
        import ipywidgets as widgets

        shown = widgets.HTML(self.html())
        refresh = widgets.Button(description="Refresh", icon="refresh")
        refresh.add_class("amp-progress-refresh")

        def on_refresh(_button):
            shown.value = self.html()

        refresh.on_click(on_refresh)
        return widgets.VBox([shown, refresh])

    def _repr_mimebundle_(self, include=None, exclude=None):
        bundle = {"text/plain": str(self)}
        try:
            bundle.update(self.widget()._repr_mimebundle_() or {})
            bundle["text/plain"] = str(self)
        except Exception:  # no ipywidgets or no kernel: the text table is the view
            pass
        return bundle


def show_progress(lesson: str | None = None) -> ProgressView:
    """``show_progress("01")`` as a cell's last line: lesson 01's exercises; ``show_progress()``: the course."""
    return ProgressView(lesson)
