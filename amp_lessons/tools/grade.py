"""`python -m amp_lessons grade PATH...`: run learners' exercise notebooks and tabulate every check.

For a workshop: collect the learners' ``exercises/NN_*.ipynb`` (one folder per learner, or any layout),
then ``python -m amp_lessons grade submissions/``. Each notebook is

- read, never written: it runs as an in-memory copy, so the learner's file is left exactly as it was;
- run top to bottom in its own kernel (nbclient), in a scratch folder (files it writes never land next
  to the submissions), with a time limit for the whole notebook (``--timeout``, default 120 s): a notebook
  that hangs is stopped and says so, a kernel that crashes says so, a file that is not a notebook says
  so, and grading carries on with the next one;
- judged by its own check cells: each kernel gets a fresh temporary ``AMP_LESSONS_PROGRESS_FILE``, every
  check records its verdict there (``amp_lessons.record``), and the record is read back.

Which exercises a notebook *should* have comes from the matching solution notebook (the ``check_*``
calls in ``solutions/NN_*.ipynb``, found through the exercise's ``generated_from`` metadata or its
``NN_`` file-name prefix) plus the checks the notebook itself calls, each named by its checker's
``.exercise`` label. An exercise whose check never ran (deleted cell, an error earlier, a stop) is
reported as not attempted, so a missing row can never look like a pass.

The result is one row per (learner file, exercise): ``status`` is one of ``passed``, ``failed``,
``not done`` (the check ran on the untouched stub), ``not attempted``, ``checker error``, ``timed out``,
``kernel died`` or ``unreadable``. It is printed as a table and written as CSV (``--csv``, default
``grades.csv``).
"""

from __future__ import annotations

import contextlib
import functools
import json
import math
import multiprocessing
import os
import re
import subprocess
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from amp_lessons import record
from amp_lessons.checks import registry
from amp_lessons.checks.harness import FAILED, NOT_DONE, PASSED
from amp_lessons.tools.builder import cell_source, read_notebook
from amp_lessons.utils import repo_root

NOT_ATTEMPTED = "not attempted"
TIMED_OUT = "timed out"
KERNEL_DIED = "kernel died"
UNREADABLE = "unreadable"
NO_CHECKS = "no checks"
ERROR = "could not run"
WHOLE_NOTEBOOK = "(whole notebook)"
COLUMNS = ["learner_file", "exercise", "status", "passed", "message", "seconds"]

CHECK_CALL = re.compile(r"\b(check_\w+)\s*\(")
RESULT_TEXT = re.compile(r"^\[(PASS|FAIL|TODO)\] .*? — (?P<exercise>.+)$")


def _first_line(cell) -> str:
    lines = [line.strip() for line in cell_source(cell).splitlines() if line.strip()]
    return (lines[0][:50] + ("..." if len(lines[0]) > 50 else "")) if lines else ""


def find_notebooks(paths) -> list[Path]:
    """Every ``.ipynb`` in the given files and folders (folders searched recursively), in a stable order."""
    found = []
    for name in paths:
        path = Path(name)
        if path.is_dir():
            found += sorted(p for p in path.rglob("*.ipynb") if ".ipynb_checkpoints" not in p.parts)
        else:
            found.append(path)  # a missing or odd file still gets a row that says what is wrong
    return list(dict.fromkeys(found))


def _labels(check_names, checkers: dict[str, str]) -> list[str]:
    """The exercise labels of the known checkers among ``check_names``, each once, in order."""
    return list(dict.fromkeys(checkers[name] for name in check_names if checkers.get(name)))


def called_checks(notebook: dict) -> list[str]:
    """Names of the ``check_*`` functions a notebook calls, in order of first call."""
    sources = [cell_source(cell) for cell in notebook.get("cells", []) if cell.get("cell_type") == "code"]
    return list(dict.fromkeys(name for source in sources for name in CHECK_CALL.findall(source)))


def solution_for(path: Path, notebook: dict | None) -> Path | None:
    """The solution notebook of the lesson this exercise belongs to, if this installation has it."""
    solutions = repo_root() / "solutions"
    meta = ((notebook or {}).get("metadata") or {}).get("amp_lessons") or {}
    source = meta.get("generated_from") if isinstance(meta, dict) else None
    if isinstance(source, str) and (repo_root() / source).is_file():
        return repo_root() / source
    match = re.search(r"(?<!\d)(\d\d)_", path.name)
    if match and solutions.is_dir():
        candidates = sorted(solutions.glob(f"{match.group(1)}_*.ipynb"))
        if candidates:
            return candidates[0]
    return None


def expected_exercises(path: Path, notebook: dict | None, checkers: dict[str, str]) -> list[str]:
    """Exercise labels this notebook is graded on: its lesson's solution checks, then any it calls itself."""
    names = []
    solution = solution_for(path, notebook)
    if solution is not None:
        try:
            names += called_checks(read_notebook(solution))
        except ValueError:  # builder.BuildError: unreadable solution notebook
            pass
    if notebook is not None:
        names += called_checks(notebook)
    return _labels(names, checkers)


def _checks_in_raw_text(path: Path, checkers: dict[str, str]) -> list[str]:
    """For a damaged file: the exercises whose check calls can still be read in its raw text."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return []
    return _labels(CHECK_CALL.findall(text.replace("\\n", "\n")), checkers)  # JSON escapes newlines as \n


def results_from_outputs(notebook) -> dict:
    """Fallback when no progress record was written: read ``[PASS] Passed — label`` texts in the outputs."""
    found = {}
    for cell in notebook.get("cells", []):
        for output in cell.get("outputs", []) if cell.get("cell_type") == "code" else []:
            text = output.get("text") if output.get("output_type") == "stream" else (output.get("data") or {}).get("text/plain")
            text = "".join(text) if isinstance(text, list) else (text or "")
            lines = text.splitlines()
            for number, line in enumerate(lines):
                match = RESULT_TEXT.match(line.strip())
                if match:
                    mark = match.group(1)
                    status = {"PASS": PASSED, "TODO": NOT_DONE}.get(mark, FAILED)
                    message = lines[number + 1].strip() if number + 1 < len(lines) else ""
                    entry = found.setdefault(match.group("exercise").strip(), {"attempts": 0, "passed": False})
                    entry.update(attempts=entry["attempts"] + 1, last_status=status, last_message=message)
                    entry["passed"] = entry["passed"] or status == PASSED
    return found


class _Stopped(Exception):
    def __init__(self, status: str, message: str):
        super().__init__(message)
        self.status = status
        self.message = message


def execute(notebook, folder: Path, env: dict, timeout: float, kernel_name: str) -> tuple[str | None, str, str]:
    """Run an in-memory notebook; return (stop status or None, why it stopped, the first cell error)."""
    from nbclient import NotebookClient
    from nbclient.exceptions import CellTimeoutError, DeadKernelError

    client = NotebookClient(
        notebook,
        timeout=max(1, int(math.ceil(timeout))),
        kernel_name=kernel_name,
        allow_errors=True,
        startup_timeout=120,
        resources={"metadata": {"path": str(folder)}},
    )
    first_error, current = "", None
    try:
        # the kernel's own stderr only carries transport warnings; learners' output arrives through the kernel protocol
        with client.setup_kernel(env=env, stderr=subprocess.DEVNULL):
            deadline = time.monotonic() + timeout
            for index, cell in enumerate(notebook.cells):
                if cell.cell_type != "code":
                    continue
                current = (index, cell)
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise CellTimeoutError("the notebook's time is up")
                client.timeout = max(1, int(math.ceil(remaining)))
                try:
                    client.execute_cell(cell, index)
                except CellTimeoutError:
                    client.shutdown_kernel = "immediate"  # a busy kernel need not be asked politely
                    raise
                if not first_error:
                    for output in cell.get("outputs", []):
                        if output.get("output_type") == "error":
                            first_error = f"cell {index + 1} (`{_first_line(cell)}`) raised {output.get('ename')}: {str(output.get('evalue'))[:200]}"
                            break
    except CellTimeoutError:
        where = f" in cell {current[0] + 1} (`{_first_line(current[1])}`)" if current else ""
        return TIMED_OUT, f"stopped after {timeout:g} s{where}", first_error
    except DeadKernelError:
        where = f" in cell {current[0] + 1} (`{_first_line(current[1])}`)" if current else ""
        return KERNEL_DIED, f"the kernel died{where}", first_error
    except Exception as exc:  # kernel would not start, a malformed cell, ...
        text = str(exc).strip().splitlines()
        return ERROR, f"{type(exc).__name__}: {text[0][:200] if text else ''}", first_error
    return None, "", first_error


def _row(learner_file: str, exercise: str, status: str, message: str, seconds: float) -> dict:
    return {
        "learner_file": learner_file,
        "exercise": exercise,
        "status": status,
        "passed": status == PASSED,
        "message": message,
        "seconds": round(seconds, 1),
    }


def display_name(path: Path) -> str:
    try:
        relative = os.path.relpath(path)
    except ValueError:  # another drive on Windows
        return str(path)
    return str(path) if relative.startswith("..") else relative


def grade_notebook(path, timeout: float = 120.0, kernel_name: str = "python3", checkers: dict | None = None) -> list[dict]:
    """Grade one notebook: one row per exercise (see the module docstring for the statuses)."""
    import nbformat

    path = Path(path)
    name = display_name(path)
    started = time.monotonic()
    checkers = registry.declared_checks() if checkers is None else checkers
    try:
        text = path.read_text(encoding="utf-8")
        try:
            json.loads(text)
        except ValueError as exc:
            raise ValueError(f"not valid JSON: {exc}") from None
        notebook = nbformat.reads(text, as_version=4)
        if not isinstance(notebook.get("cells"), list):
            raise ValueError("it has no list of cells")
    except Exception as exc:  # missing, not text, not JSON, not a notebook
        reason = str(exc).strip().splitlines()
        reason = reason[0][:200] if reason else type(exc).__name__
        message = f"not a readable notebook ({reason}); ask the learner to save it again from JupyterLab"
        labels = expected_exercises(path, None, checkers) or _checks_in_raw_text(path, checkers) or [WHOLE_NOTEBOOK]
        return [_row(name, label, UNREADABLE, message, time.monotonic() - started) for label in labels]

    expected = expected_exercises(path, notebook, checkers)
    with tempfile.TemporaryDirectory(prefix="amp_lessons_grade_") as scratch:
        record_file = Path(scratch) / "progress.json"
        env = dict(os.environ)
        env["AMP_LESSONS_PROGRESS_FILE"] = str(record_file)
        env.pop("AMP_LESSONS_STRICT", None)  # grading wants every verdict recorded, not the first failure raised
        workdir = Path(scratch) / "work"  # files the notebook writes land here, not next to the submissions
        workdir.mkdir()
        stopped, why, first_error = execute(notebook, workdir, env, timeout, kernel_name)
        if record_file.exists():
            recorded = record.load(record_file, warn=lambda message: None)["exercises"]
        else:
            recorded = results_from_outputs(notebook)
    seconds = time.monotonic() - started

    rows = []
    for label in expected + [label for label in recorded if label not in expected]:
        entry = recorded.get(label)
        if entry:
            status = PASSED if entry.get("passed") else entry.get("last_status") or FAILED
            message = entry.get("last_message", "")
            if entry.get("passed") and entry.get("last_status") not in (None, PASSED):
                message = f"passed; a later attempt said: {message}"
            rows.append(_row(name, label, status, message, seconds))
        elif stopped:
            rows.append(_row(name, label, stopped, f"{why}, before this check ran", seconds))
        else:
            detail = f" ({first_error})" if first_error else " (is its check cell still there?)"
            rows.append(_row(name, label, NOT_ATTEMPTED, f"its check never ran{detail}", seconds))
    if not rows:
        status, message = (stopped, why) if stopped else (NO_CHECKS, "no exercise checks in this notebook")
        rows.append(_row(name, WHOLE_NOTEBOOK, status, message, seconds))
    return rows


def grade(paths, timeout: float = 120.0, kernel_name: str = "python3", jobs: int = 1, on_notebook=None):
    """Grade every notebook under ``paths``; a pandas DataFrame with one row per (learner file, exercise)."""
    import pandas as pd

    notebooks = find_notebooks(paths)
    checkers = registry.declared_checks()
    grade_one = functools.partial(grade_notebook, timeout=timeout, kernel_name=kernel_name, checkers=checkers)
    rows = []
    with contextlib.ExitStack() as stack:
        results = map(grade_one, notebooks)
        if jobs > 1 and len(notebooks) > 1:
            pool = stack.enter_context(ProcessPoolExecutor(max_workers=jobs, mp_context=multiprocessing.get_context("spawn")))
            results = pool.map(grade_one, notebooks)
        for path, result in zip(notebooks, results):
            rows += result
            if on_notebook:
                on_notebook(path, result)
    return pd.DataFrame(rows, columns=COLUMNS)


def summary(table) -> str:
    """The table for a terminal (messages shortened; the CSV keeps them whole) and a count per learner file."""
    if table.empty:
        return "No notebooks graded."
    header = ["learner file", "exercise", "status", "passed", "message"]
    body = [
        [str(r.learner_file), str(r.exercise), str(r.status), "yes" if r.passed else "no",
         r.message if len(r.message) <= 90 else r.message[:87] + "..."]
        for r in table.itertuples()
    ]
    widths = [max(len(row[i]) for row in [header, *body]) for i in range(len(header))]
    lines = ["  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip() for row in [header, *body]]
    lines[1:1] = ["  ".join("-" * width for width in widths)]
    lines += ["", "Per learner file:"]
    for learner, group in table.groupby("learner_file", sort=False):
        graded = group[group["exercise"] != WHOLE_NOTEBOOK]
        counts = group["status"].value_counts()
        detail = ", ".join(f"{count} {status}" for status, count in counts.items())
        lines.append(f"  {learner}: {int(graded['passed'].sum())} of {len(graded)} passed ({detail}; {group['seconds'].max():.1f} s)")
    return "\n".join(lines)
