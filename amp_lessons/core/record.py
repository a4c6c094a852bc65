"""Core: the learner's record of which exercises they finished (the checks write it, `progress` reads it).

The record is a human-readable JSON file that counts attempts per exercise::

    {"version": 1, "exercises": {"01.1 stored_value": {"attempts": 3, "passed": true, "first_passed": "...",
                                                      "last_attempt": "...", "last_status": "passed",
                                                      "last_message": "...", "hints": 2}}}

``hints`` is how far up the exercise's hint ladder the learner went (``amp_lessons.core.hints``, 0 to 3); an
exercise with hints but no check yet has ``"attempts": 0``.

Every check adds an attempt. Three things keep that from losing anything:

- **A lock around each read-modify-write** (``filelock``, the lock file is ``<record>.lock``): two kernels
  that check at the same moment take turns, so neither overwrites the other's attempt. The operating system
  releases the lock when a process dies, so a killed kernel never leaves the record locked.
- **Atomic writes** (a temporary file in the same folder, then ``os.replace``): a kernel killed mid-write
  never leaves half a record.
- **Repair instead of crash**: an entry with wrong types (``"attempts": "many"``, ``"passed": "yes"``) is
  repaired when the meaning is clear (``"3"`` attempts -> 3) and otherwise moved, whole, to the record's
  ``set_aside`` list with the reason, and a warning says so; an unreadable file is moved to
  ``<name>.corrupt-<time>`` and a fresh record starts. A broken progress file must never break a lesson.

Where it lives: ``AMP_LESSONS_PROGRESS_FILE`` if set (``off`` disables recording), else
``<course folder>/.amp_lessons/progress.json`` (the clone the package was installed from, or the course folder
above the kernel's working folder), so two clones on one machine keep two records; the folder ignores itself
in git (it holds a ``.gitignore`` of ``*``). Only without any course folder (a plain ``pip install``, run
outside a clone) is it ``~/.amp_lessons/progress.json``.

The grader's channel is here too (:func:`report_to_grader`): ``python -m amp_lessons grade`` names a file in
``AMP_LESSONS_RESULTS_FILE`` and reads each check's verdict from it, never from printed text or this record.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from pathlib import Path

from amp_lessons.core.files import atomic_write, repo_root

VERSION = 1
RESULTS_FILE_VARIABLE = "AMP_LESSONS_RESULTS_FILE"
LOCK_TIMEOUT = 30.0  # seconds; a check that cannot get the lock reports "progress not saved" and carries on
TEXT_FIELDS = ("last_status", "last_message", "last_attempt", "first_passed")
RECORD_FOLDER = ".amp_lessons"
PROGRESS_FILE_VARIABLE = "AMP_LESSONS_PROGRESS_FILE"


def is_course_folder(folder: Path) -> bool:
    """A clone of the course: it has the lessons and the package side by side."""
    return (folder / "notebooks" / "00_start_here.ipynb").is_file() and (folder / "amp_lessons").is_dir()


def course_folder(start: Path | None = None) -> Path | None:
    """The course folder whose record this kernel writes, or None outside any clone.

    First the clone the package itself lives in (``pip install -e .``); else the nearest course folder at or
    above ``start`` (default: the working folder, which is the notebook's folder in Jupyter).
    """
    package_clone = repo_root()
    if is_course_folder(package_clone):
        return package_clone
    here = Path(start or Path.cwd()).resolve()
    for folder in (here, *here.parents):
        if is_course_folder(folder):
            return folder
    return None


def default_progress_path(start: Path | None = None) -> Path:
    """``<course folder>/.amp_lessons/progress.json``, or ``~/.amp_lessons/progress.json`` outside a clone."""
    folder = course_folder(start)
    return (folder if folder is not None else Path.home()) / RECORD_FOLDER / "progress.json"


def progress_path() -> Path | None:
    configured = os.environ.get(PROGRESS_FILE_VARIABLE)
    if configured is not None:
        if configured.strip().lower() in ("", "off", "none", "0"):
            return None
        return Path(configured).expanduser()
    return default_progress_path()


def _make_folder(path: Path) -> None:
    """Create the record's folder; a new ``.amp_lessons`` folder gets a ``.gitignore`` so git never lists it."""
    folder = path.parent
    if folder.is_dir():
        return
    folder.mkdir(parents=True, exist_ok=True)
    if folder.name == RECORD_FOLDER:
        with contextlib.suppress(OSError):
            (folder / ".gitignore").write_text("# the learner's own progress record: never committed\n*\n")


def _empty() -> dict:
    return {"version": VERSION, "exercises": {}}


@contextlib.contextmanager
def locked(path: Path):
    """Hold ``<path>.lock`` (an OS file lock, released if the process dies) for one read-modify-write."""
    from filelock import FileLock  # installed with torch; imported here so `doctor` runs where it is missing

    _make_folder(path)
    with FileLock(f"{path}.lock", timeout=LOCK_TIMEOUT):
        yield


def _warn(warn, message: str) -> None:
    (warn or (lambda m: print(m, file=sys.stderr)))(message)


def _whole_number(value):
    """A count of attempts from a JSON value, or None when it is not clearly one (bools are not counts)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int) and value >= 0:
        return value
    if isinstance(value, float) and value.is_integer() and value >= 0:
        return int(value)
    if isinstance(value, str) and value.strip().isdigit():
        return int(value.strip())
    return None


def repair_entry(entry) -> tuple[dict | None, str]:
    """``(repaired entry, "")``, or ``(None, reason)`` when the entry must be set aside.

    An attempt count that is clearly a count is made an int; text fields that are not text become text; a
    ``passed`` that is not ``true``/``false`` (or an entry that is not an object) is never guessed at.
    """
    if not isinstance(entry, dict):
        return None, f"it is a {type(entry).__name__}, not an object"
    if not isinstance(entry.get("passed", False), bool):
        return None, f"'passed' is {entry.get('passed')!r}, not true or false"
    attempts = _whole_number(entry.get("attempts", 0))
    if attempts is None:
        return None, f"'attempts' is {entry.get('attempts')!r}, not a count"
    repaired = dict(entry)
    repaired["attempts"] = attempts
    if "hints" in entry:  # a convenience count: one that is not a count is dropped, never the entry with it
        repaired["hints"] = min(_whole_number(entry["hints"]) or 0, 99)
    repaired["passed"] = entry.get("passed", False)
    for name in TEXT_FIELDS:
        value = repaired.get(name)
        if value is not None and not isinstance(value, str):
            repaired[name] = json.dumps(value)[:300]
    return repaired, ""


def _repair(data: dict, path: Path, warn) -> dict:
    """Repair or set aside each malformed entry; the set-aside ones stay in the file under ``set_aside``."""
    set_aside = data.get("set_aside") if isinstance(data.get("set_aside"), list) else []
    exercises = {}
    for label, entry in data["exercises"].items():
        repaired, reason = repair_entry(entry)
        if repaired is None:
            set_aside.append(
                {
                    "exercise": label,
                    "entry": entry,
                    "reason": reason,
                    "when": time.strftime("%Y-%m-%dT%H:%M:%S"),
                }
            )
            _warn(
                warn,
                f"The progress record {path} had a malformed entry for {label!r} ({reason}); it was "
                "set aside under 'set_aside' in the same file and that exercise starts again from 0.",
            )
            continue
        exercises[label] = repaired
    data = dict(data)
    data["exercises"] = exercises
    if set_aside:
        data["set_aside"] = set_aside
    return data


def _read(path: Path, warn) -> dict:
    if not path.exists():
        return _empty()
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(data, dict) or not isinstance(data.get("exercises"), dict):
            raise ValueError("it does not have the expected {'exercises': {...}} layout")
    except (OSError, ValueError) as exc:
        aside = path.with_name(f"{path.name}.corrupt-{time.strftime('%Y%m%d-%H%M%S')}")
        try:
            os.replace(path, aside)
            where = f"moved it to {aside}"
        except OSError:
            where = "could not move it aside"
        _warn(warn, f"The progress record {path} could not be read ({exc}); {where} and started a fresh one.")
        return _empty()
    return _repair(data, path, warn)


def load(path: Path | None = None, *, warn=None) -> dict:
    """Read the record; a missing file is an empty record, a corrupt one is set aside and reported.

    Malformed entries are repaired or left out of the returned record (with a warning); the file itself is
    rewritten only by the next :func:`record`, which keeps the set-aside entries in it.
    """
    path = path or progress_path()
    if path is None or not path.exists():
        return _empty()
    try:
        with locked(path):
            return _read(path, warn)
    except OSError:  # a record in a read-only folder (collected from a learner), or the lock timed out
        return _read(path, warn)


def save(data: dict, path: Path | None = None) -> None:
    """Write atomically: the old record stays intact until the new one is complete on disk."""
    path = path or progress_path()
    if path is None:
        return
    _make_folder(path)
    text = json.dumps(data, indent=1, sort_keys=True)
    atomic_write(path, lambda handle: handle.write(text.encode("utf-8")))


def record(
    exercise: str, passed: bool, status: str, message: str, path: Path | None = None, *, warn=None
) -> None:
    """Add one check attempt to the record (under the lock, so concurrent checks each keep theirs)."""
    path = path or progress_path()
    if path is None or not exercise:
        return
    with locked(path):
        data = _read(path, warn)
        now = time.strftime("%Y-%m-%dT%H:%M:%S")
        entry = data["exercises"].setdefault(exercise, {"attempts": 0, "passed": False, "first_passed": None})
        entry["attempts"] = entry["attempts"] + 1
        entry["last_attempt"] = now
        entry["last_status"] = status
        entry["last_message"] = message.splitlines()[0][:300] if message else ""
        if passed:
            entry["passed"] = True
            entry["first_passed"] = entry.get("first_passed") or now
        save(data, path)


def record_hint(exercise: str, level: int, path: Path | None = None, *, warn=None) -> None:
    """Note that the learner has seen hint ``level`` of ``exercise`` (the record keeps the highest level)."""
    path = path or progress_path()
    if path is None or not exercise:
        return
    with locked(path):
        data = _read(path, warn)
        entry = data["exercises"].setdefault(exercise, {"attempts": 0, "passed": False, "first_passed": None})
        entry["hints"] = max(int(entry.get("hints", 0) or 0), int(level))
        save(data, path)


def report_to_grader(exercise: str, passed: bool, status: str, message: str) -> None:
    """Append one verdict as a JSON line to ``$AMP_LESSONS_RESULTS_FILE``, which only the grader sets."""
    path = os.environ.get(RESULTS_FILE_VARIABLE)
    if not path:
        return
    line = json.dumps({"exercise": exercise, "passed": bool(passed), "status": status, "message": message})
    with open(path, "a", encoding="utf-8") as handle:
        handle.write(line + "\n")
