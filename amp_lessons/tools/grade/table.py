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
    return f"'{text}" if text.startswith(FORMULA_START) else text


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
