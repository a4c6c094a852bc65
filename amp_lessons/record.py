"""Core: the learner's local record of which exercises they finished (the checks write it, `progress` reads it).

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
import sys
import time
from pathlib import Path

from amp_lessons.utils import atomic_write

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
    text = json.dumps(data, indent=1, sort_keys=True)
    atomic_write(path, lambda handle: handle.write(text.encode("utf-8")))


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
