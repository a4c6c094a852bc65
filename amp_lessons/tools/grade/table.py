"""The grade table: safe text for terminals and spreadsheets, and a CSV that is always complete on disk.

Messages carry learner-controlled text (exception messages, file names). Before it reaches a terminal or a
spreadsheet, :func:`safe_text` removes ANSI colour/cursor sequences and writes every other control or
bidirectional-formatting character as a visible escape (``\\x07``, ``\\u202e``); :func:`csv_cell` also puts a
``'`` before a cell that a spreadsheet would run as a formula (``=HYPERLINK(...)``, ``+``, ``-``, ``@``).

:func:`write_csv` replaces the file atomically (a temporary file, then a rename), so a crash while writing
leaves the previous complete table, never half of one.
"""

from __future__ import annotations

import csv
import io
import os
import re
import unicodedata
from pathlib import Path

from amp_lessons.core.files import atomic_write

COLUMNS = ["learner_file", "exercise", "status", "passed", "message", "seconds"]
ANSI = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b[@-Z\\-_]")
FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


class OutputError(ValueError):
    """The table cannot be written where asked; said before any notebook is graded."""


def _visible(char: str) -> str:
    if char in "\n\r\t":
        return " "
    if unicodedata.category(char) in ("Cc", "Cf", "Co", "Cs") or char in ("\u2028", "\u2029"):
        code = ord(char)
        return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"
    return char


def safe_text(value) -> str:
    """``value`` as one line of plain text: no terminal escape sequences, control characters made visible."""
    text = ANSI.sub("", str(value))
    return "".join(_visible(char) for char in text)


def csv_cell(value):
    """A CSV cell a spreadsheet shows as text: :func:`safe_text`, and a ``'`` before a formula-like start."""
    if isinstance(value, (bool, int, float)):
        return value
    text = safe_text(value)
    text = f"'{text}" if text.startswith(FORMULA_START) else text
    return text if len(text) <= CELL_LIMIT else text[: CELL_LIMIT - 40] + " ... [cut by the grader]"


def csv_text(rows) -> str:
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=COLUMNS, extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow({name: csv_cell(row.get(name, "")) for name in COLUMNS})
    return out.getvalue()


def write_csv(path: Path, rows) -> None:
    """Replace ``path`` with the table, atomically."""
    data = csv_text(rows).encode("utf-8")
    atomic_write(path, lambda handle: handle.write(data))


def prepare_output(path: Path, rows) -> Path:
    """Check that the table can be written at ``path`` by writing ``rows`` there now; ``OutputError`` if not.

    A folder is created when missing; an existing folder, or a place that cannot be written, is refused.
    """
    path = Path(path).expanduser().absolute()
    if path.is_dir():
        raise OutputError(f"--csv {path} is a folder; give a file name, e.g. {path / 'grades.csv'}")
    if path.suffix.lower() == ".ipynb":
        raise OutputError(f"--csv {path} names a notebook; give a .csv file name")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.exists() and not os.access(path, os.W_OK):
            raise PermissionError(f"{path} is read-only")
        write_csv(path, rows)
    except OSError as exc:
        raise OutputError(f"cannot write the table to {path}: {exc}") from None
    return path


def summary(rows, whole_notebook: str) -> str:
    """The table for a terminal (messages shortened, the CSV keeps them whole) and a count per learner."""
    if not rows:
        return "No notebooks graded."
    header = ["learner file", "exercise", "status", "passed", "message"]
    body = []
    for r in rows:
        message = safe_text(r["message"])
        body.append(
            [
                safe_text(r["learner_file"]),
                safe_text(r["exercise"]),
                safe_text(r["status"]),
                "yes" if r["passed"] else "no",
                message if len(message) <= 90 else message[:87] + "...",
            ]
        )
    widths = [max(len(row[i]) for row in [header, *body]) for i in range(len(header))]
    lines = [
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip() for row in [header, *body]
    ]
    lines[1:1] = ["  ".join("-" * width for width in widths)]
    lines += ["", "Per learner file:"]
    groups: dict[str, list] = {}
    for r in rows:
        groups.setdefault(r["learner_file"], []).append(r)
    for learner, group in groups.items():
        graded = [r for r in group if r["exercise"] != whole_notebook]
        counts: dict[str, int] = {}
        for r in group:
            counts[r["status"]] = counts.get(r["status"], 0) + 1
        detail = ", ".join(f"{count} {safe_text(status)}" for status, count in counts.items())
        seconds = max(float(r["seconds"]) for r in group)
        passed = sum(bool(r["passed"]) for r in graded)
        lines.append(f"  {safe_text(learner)}: {passed} of {len(graded)} passed ({detail}; {seconds:.1f} s)")
    return "\n".join(lines)


# ------------------------------------------------------------------------------- one row per learner

CELL_LIMIT = 32767  # what a spreadsheet cell holds; messages are cut far earlier (worker.MESSAGE_LIMIT)
LEARNER_COLUMNS = ["learner", "passed", "exercises", "notebooks", "not graded"]


def learner_of(learner_file: str, roots=()) -> str:
    """The learner a file belongs to: the first folder under the graded folder that holds it
    (``submissions/alice/01.ipynb`` -> ``alice``; nbgrader's ``submitted/alice/<assignment>/...`` -> ``alice``),
    or the file's name when it lies directly in it."""
    path = Path(learner_file)
    for root in sorted((Path(r) for r in roots), key=lambda r: -len(r.parts)):
        for candidate in (path, path.absolute()):
            base = root if not candidate.is_absolute() else root.absolute()
            try:
                inside = candidate.relative_to(base)
            except ValueError:
                continue
            if len(inside.parts) > 1:
                return inside.parts[0]
            return inside.stem if inside.parts else path.stem
    return path.parent.name or path.stem


def learner_rows(rows, whole_notebook: str, roots=()) -> tuple[list[str], list[dict]]:
    """(columns, rows): per learner, the total passed out of the exercises graded, and one column per exercise
    (1 passed, 0 not; empty when that learner handed in no notebook with it)."""
    exercises = list(dict.fromkeys(r["exercise"] for r in rows if r["exercise"] != whole_notebook))
    learners: dict[str, dict] = {}
    for r in rows:
        name = learner_of(r["learner_file"], roots)
        entry = learners.setdefault(name, {"learner": name, "files": set(), "not graded": 0})
        entry["files"].add(r["learner_file"])
        if r["exercise"] == whole_notebook:
            entry["not graded"] += 1
            continue
        entry[r["exercise"]] = max(int(bool(r["passed"])), int(entry.get(r["exercise"], 0) or 0))
        if r["status"] == "not graded":
            entry["not graded"] += 1
    out = []
    for name in sorted(learners):
        entry = learners[name]
        graded = [e for e in exercises if e in entry]
        row = {"learner": name, "passed": sum(entry[e] for e in graded), "exercises": len(graded)}
        row.update({"notebooks": len(entry["files"]), "not graded": entry["not graded"]})
        row.update({e: entry.get(e, "") for e in exercises})
        out.append(row)
    return LEARNER_COLUMNS + exercises, out


def learners_path(csv_path: Path) -> Path:
    csv_path = Path(csv_path)
    return csv_path.with_name(f"{csv_path.stem}_learners{csv_path.suffix or '.csv'}")


def write_learners(csv_path: Path, rows, whole_notebook: str, roots=()) -> Path:
    columns, table_rows = learner_rows(rows, whole_notebook, roots)
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=columns, extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    for row in table_rows:
        writer.writerow({name: csv_cell(row.get(name, "")) for name in columns})
    target = learners_path(csv_path)
    data = out.getvalue().encode("utf-8")
    atomic_write(target, lambda handle: handle.write(data))
    return target


# ---------------------------------------------------------------------------------------- fingerprints


def fingerprint(path: Path) -> str:
    import hashlib

    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def seal_path(csv_path: Path) -> Path:
    return Path(f"{csv_path}.sha256")


def seal(csv_path: Path) -> list[str]:
    """Fingerprint the grade table and the learners table (``sha256sum`` format, also written next to them
    as ``CSV.sha256``); returns the lines, which the grader prints."""
    csv_path = Path(csv_path)
    files = [csv_path] + ([learners_path(csv_path)] if learners_path(csv_path).exists() else [])
    lines = [f"{fingerprint(path)}  {path.name}" for path in files]
    text = "".join(line + "\n" for line in lines).encode("utf-8")
    atomic_write(seal_path(csv_path), lambda handle: handle.write(text))
    return lines


def verify_fingerprints(csv_path: Path, expected: str | None = None) -> list[str]:
    """What no longer matches ([] when everything does). ``expected``: the grade table's fingerprint as
    printed (a copy of ``CSV.sha256`` next to the file could have been rewritten with it)."""
    csv_path = Path(csv_path)
    problems = []
    if expected:
        found = fingerprint(csv_path)
        if found != expected.strip().lower():
            problems.append(
                f"{csv_path}: SHA-256 {found} is not the {expected.strip()} you kept: it was changed"
            )
        return problems
    lines = seal_path(csv_path).read_text(encoding="utf-8").splitlines()
    for line in lines:
        digest, _, name = line.partition("  ")
        path = csv_path.with_name(name.strip())
        if not path.exists():
            problems.append(f"{path}: missing")
        elif fingerprint(path) != digest.strip():
            problems.append(f"{path}: its SHA-256 is not the one grading wrote: it was changed after grading")
    if not lines:
        problems.append(f"{seal_path(csv_path)} holds no fingerprints")
    return problems
