"""The learner's local record of which exercises they finished.

Every check writes its verdict here. The file is JSON, written atomically (a temporary file in the same
folder, then ``os.replace``), so a kernel killed mid-write never leaves half a record. A record that is
unreadable anyway (edited by hand, disk trouble) is moved aside to ``<name>.corrupt-<time>`` with a
warning and a fresh record starts: a broken progress file must never break a lesson.

Where it lives: ``AMP_LESSONS_PROGRESS_FILE`` if set (``off`` disables recording), else
``~/.amp_lessons/progress.json``.
"""

from __future__ import annotations

import json
import os
import re
import sys
import tempfile
import time
from pathlib import Path

VERSION = 1


def progress_path() -> Path | None:
    configured = os.environ.get("AMP_LESSONS_PROGRESS_FILE")
    if configured is not None:
        if configured.strip().lower() in ("", "off", "none", "0"):
            return None
        return Path(configured).expanduser()
    return Path.home() / ".amp_lessons" / "progress.json"


def _empty() -> dict:
    return {"version": VERSION, "exercises": {}}


def load(path: Path | None = None, *, warn=None) -> dict:
    """Read the record; a missing file is an empty record, a corrupt one is set aside and reported."""
    path = path or progress_path()
    if path is None or not path.exists():
        return _empty()
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(data, dict) or not isinstance(data.get("exercises"), dict):
            raise ValueError("it does not have the expected {'exercises': {...}} layout")
        return data
    except (OSError, ValueError) as exc:
        aside = path.with_name(f"{path.name}.corrupt-{time.strftime('%Y%m%d-%H%M%S')}")
        try:
            os.replace(path, aside)
            where = f"moved it to {aside}"
        except OSError:
            where = "could not move it aside"
        message = f"The progress record {path} could not be read ({exc}); {where} and started a fresh one."
        (warn or (lambda m: print(m, file=sys.stderr)))(message)
        return _empty()


def save(data: dict, path: Path | None = None) -> None:
    """Write atomically: the old record stays intact until the new one is complete on disk."""
    path = path or progress_path()
    if path is None:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=str(path.parent))
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as out:
            json.dump(data, out, indent=1, sort_keys=True)
            out.flush()
            os.fsync(out.fileno())
        os.replace(temp_name, path)
    except BaseException:
        if os.path.exists(temp_name):
            os.unlink(temp_name)
        raise


def record(exercise: str, passed: bool, status: str, message: str, path: Path | None = None) -> None:
    """Add one check attempt to the record."""
    path = path or progress_path()
    if path is None or not exercise:
        return
    data = load(path)
    now = time.strftime("%Y-%m-%dT%H:%M:%S")
    entry = data["exercises"].setdefault(exercise, {"attempts": 0, "passed": False, "first_passed": None})
    entry["attempts"] = int(entry.get("attempts", 0)) + 1
    entry["last_attempt"] = now
    entry["last_status"] = status
    entry["last_message"] = message.splitlines()[0][:300] if message else ""
    if passed:
        entry["passed"] = True
        entry["first_passed"] = entry.get("first_passed") or now
    save(data, path)


# ---------------------------------------------------------------------------- reading the record back

PASSED_STATE = "passed"
ATTEMPTED_STATE = "attempted"
NOT_STARTED_STATE = "not started"


def known_checkers() -> dict:
    """``{check function name: exercise label}`` for every checker ``amp_lessons.checks`` offers.

    Each function made with ``amp_lessons.harness.checker`` carries its label as ``.exercise``.
    """
    from amp_lessons import checks

    return {
        name: value.exercise
        for name, value in vars(checks).items()
        if callable(value) and isinstance(getattr(value, "exercise", None), str) and value.exercise
    }


def exercise_sort_key(label: str):
    """'01.2 x' before '01.10 y' before '02.1 z': numbers compare as numbers."""
    return [(0, int(part), "") if part.isdigit() else (1, 0, part) for part in re.split(r"(\d+)", label)]


def known_exercises() -> list:
    """Every exercise label the course's checkers know, in lesson order."""
    return sorted(set(known_checkers().values()), key=exercise_sort_key)


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
        entry = recorded.get(label) if isinstance(recorded.get(label), dict) else None
        if not entry:
            rows.append({"exercise": label, "state": NOT_STARTED_STATE, "attempts": 0, "last_status": "",
                         "last_message": "", "last_attempt": "", "first_passed": ""})
            continue
        rows.append({
            "exercise": label,
            "state": PASSED_STATE if entry.get("passed") else ATTEMPTED_STATE,
            "attempts": int(entry.get("attempts", 0) or 0),
            "last_status": str(entry.get("last_status", "")),
            "last_message": str(entry.get("last_message", "")),
            "last_attempt": str(entry.get("last_attempt", "") or ""),
            "first_passed": str(entry.get("first_passed", "") or ""),
        })
    return rows


def format_summary(rows: list, width: int = 110) -> str:
    """The rows of :func:`summarize` as text for a terminal; an attempt's last message goes on the line below."""
    if not rows:
        return "No exercises known and none recorded."
    name_width = min(60, max(len(r["exercise"]) for r in rows))
    lines = []
    for row in rows:
        label = row["exercise"] if len(row["exercise"]) <= name_width else row["exercise"][: name_width - 3] + "..."
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
    lines.append(f"{passed} of {len(rows)} exercises passed, {attempted} attempted, {len(rows) - passed - attempted} not started.")
    return "\n".join(lines)
