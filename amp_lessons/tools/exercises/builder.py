"""Generate exercises/ from solutions/: the solution notebooks are the single source.

Each solution notebook is an nbgrader source notebook (see ``amp_lessons.tools.exercises.course``): its solution cells
and locked, graded check cells carry nbgrader's cell metadata. This builder is a thin layer over that
metadata and produces what ``nbgrader generate_assignment`` produces from the same notebook (a test runs
nbgrader and compares), so a learner who clones the repository and one who fetches the instructor's nbgrader
release get the same exercise. A solution region sits inside a function body::

    def stored_value(x, dtype):
        \"\"\"...\"\"\"
        ### BEGIN SOLUTION
        ...
        ### END SOLUTION

and becomes ``raise NotImplementedError("...")`` at the same indentation (nbgrader's ``ClearSolutions`` with
the course's ``code_stub``, set in ``nbgrader_config.py``), so the exercise notebook still runs top to bottom
and its check cells report "not done yet" instead of crashing. Check cells become read-only and undeletable,
solution cells undeletable, and each carries nbgrader's checksum. Outputs and execution counts are cleared. A
region outside a function body is refused, because its stub would stop the notebook run.
"""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path

from amp_lessons.checks import registry
from amp_lessons.core.files import repo_root
from amp_lessons.tools.exercises import course
from amp_lessons.tools.exercises.course import BEGIN, END, cell_source

STUB = 'raise NotImplementedError("Exercise: replace this line with your code")'
KERNELSPEC = {"display_name": "Python 3 (ipykernel)", "language": "python", "name": "python3"}
KEPT_CELL_METADATA = ("tags", "editable", "deletable", "nbgrader")


class BuildError(ValueError):
    """A solution notebook that cannot be turned into an exercise; the message names file and cell."""


def strip_solutions(source: str, where: str = "cell") -> str:
    """Replace every solution region in ``source`` by a NotImplementedError stub."""
    out, inside, indent = [], False, ""
    for number, line in enumerate(source.split("\n"), start=1):
        marker = line.strip()
        if marker == BEGIN:
            if inside:
                raise BuildError(f"{where}, line {number}: '{BEGIN}' inside another solution region")
            indent = line[: len(line) - len(line.lstrip())]
            if not indent:
                raise BuildError(
                    f"{where}, line {number}: a solution region must be inside a function body (indented); "
                    "a stub at the top level would stop the exercise notebook"
                )
            out.append(f"{indent}{STUB}")
            inside = True
        elif marker == END:
            if not inside:
                raise BuildError(f"{where}, line {number}: '{END}' without a matching '{BEGIN}'")
            inside = False
        elif not inside:
            out.append(line)
    if inside:
        raise BuildError(f"{where}: '{BEGIN}' is never closed with '{END}'")
    return "\n".join(out)


def clean_cell(cell: dict) -> dict:
    cell = dict(cell)
    cell.pop("id", None)
    if cell.get("cell_type") == "code":
        cell["outputs"] = []
        cell["execution_count"] = None
    metadata = {k: v for k, v in cell.get("metadata", {}).items() if k in KEPT_CELL_METADATA}
    cell["metadata"] = metadata
    return cell


def clean_notebook(notebook: dict) -> dict:
    """Outputs, execution counts and run metadata removed; kernelspec python3."""
    cells = [clean_cell(c) for c in notebook.get("cells", [])]
    metadata = {k: v for k, v in notebook.get("metadata", {}).items() if k in ("amp_lessons",)}
    metadata["kernelspec"] = dict(KERNELSPEC)
    metadata["language_info"] = {"name": "python"}
    return {"cells": cells, "metadata": metadata, "nbformat": 4, "nbformat_minor": 4}


def dumps(notebook: dict) -> str:
    return json.dumps(notebook, indent=1, ensure_ascii=False, sort_keys=True) + "\n"


def read_notebook(path: Path) -> dict:
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise BuildError(f"{path}: not a readable notebook ({exc})") from None


def build_exercise(solution: dict, name: str, known_checks: dict | None = None) -> dict:
    """The exercise notebook for one solution notebook (as a dict).

    ``known_checks`` (``{check function name: exercise label}``, default: the course's checkers) tells which
    cells are check cells. A solution or check cell without nbgrader metadata gets, in this in-memory copy,
    what ``mark-solutions`` would give it (``build-exercises --check`` reports the solution notebook as
    needing it, because nbgrader reads the solution notebooks themselves); metadata that contradicts itself
    is refused.
    """
    known_checks = registry.declared_checks() if known_checks is None else known_checks
    solution = copy.deepcopy(solution)
    course.mark_cells(solution, known_checks)
    problems = course.metadata_problems(solution, name, known_checks)
    if problems:
        raise BuildError("; ".join(problems))
    notebook = clean_notebook(solution)
    found = 0
    for index, cell in enumerate(notebook["cells"]):
        source = cell_source(cell)
        if cell["cell_type"] == "code" and course.is_solution(cell):
            found += 1
            cell["source"] = strip_solutions(source, where=f"{name}, cell {index}")
        notebook["cells"][index] = course.release_cell(cell)
    if not found:
        raise BuildError(f"{name}: no '{BEGIN}' region, so the exercise would give the answers away")
    notebook["metadata"]["amp_lessons"] = {
        "generated_from": f"solutions/{name}",
        "note": "Generated by `python -m amp_lessons build-exercises`; edit the solution notebook instead.",
    }
    return notebook


def exercise_name(solution_path: Path) -> str:
    return re.sub(r"_solution(?=\.ipynb$)", "", solution_path.name)


def planned_exercises(root: Path | None = None) -> dict[Path, str]:
    """exercise path -> its text, for every notebook in solutions/."""
    root = root or repo_root()
    planned = {}
    for path in sorted((root / "solutions").glob("*.ipynb")):
        exercise = build_exercise(read_notebook(path), path.name)
        planned[root / "exercises" / exercise_name(path)] = dumps(exercise)
    return planned


def stale_exercises(root: Path | None = None) -> list[str]:
    """Human-readable problems: missing, out-of-date and orphaned exercise notebooks."""
    root = root or repo_root()
    problems = _differences(root, planned_exercises(root), root / "exercises", "no solution notebook for")
    problems += stale_core_sources(root)
    known_checks = registry.declared_checks()
    for path in sorted((root / "solutions").glob("*.ipynb")):
        if course.mark_cells(read_notebook(path), known_checks):
            problems.append(
                f"nbgrader metadata missing in: {path.relative_to(root)} "
                "(run `python -m amp_lessons mark-solutions`)"
            )
    return problems


def build(root: Path | None = None) -> list[Path]:
    """Write every exercise notebook whose text changed; return the paths written."""
    root = root or repo_root()
    (root / "exercises").mkdir(exist_ok=True)
    written = []
    for path, text in planned_exercises(root).items():
        if not path.exists() or path.read_text(encoding="utf-8") != text:
            path.write_text(text, encoding="utf-8")
            written.append(path)
    return written + build_core_sources(root)


# ------------------------------------------------------------- course/source/mixed_precision_core


def core_folder(root: Path) -> Path:
    return root / "course" / "source" / course.CORE_ASSIGNMENT


def planned_core_sources(root: Path | None = None, known_checks: dict | None = None) -> dict[Path, str]:
    """core source path -> its text: the core-track assignment, one notebook per lesson with a core exercise.

    The core exercises are the ones lesson 00's lesson map names in its core-track column (read when this
    runs, so a new lesson's row counts at once). Without lesson 00 (a course folder under test) there is no
    core assignment. An exercise that lesson 00 names but no checker has is refused.
    """
    root = root or repo_root()
    lesson_zero = root / "notebooks" / course.LESSON_ZERO
    if not lesson_zero.exists():
        return {}
    known_checks = registry.declared_checks() if known_checks is None else known_checks
    core, unknown = course.core_checks(read_notebook(lesson_zero), known_checks)
    if unknown:
        raise BuildError(
            f"notebooks/{course.LESSON_ZERO} puts exercise(s) {', '.join(unknown)} in the core track, "
            "but no lesson's check.py has a checker with that number"
        )
    planned = {}
    for path in sorted((root / "solutions").glob("*.ipynb")):
        notebook = course.core_source(read_notebook(path), path.name, core, known_checks)
        if notebook is not None:
            planned[core_folder(root) / exercise_name(path)] = dumps(notebook)
    return planned


def _differences(root: Path, planned: dict, folder: Path, orphan: str) -> list[str]:
    """How ``folder``'s notebooks differ from ``planned`` ({path: text}): missing, out of date, or ``orphan``."""
    problems = []
    for path, text in planned.items():
        if not path.exists():
            problems.append(f"missing: {path.relative_to(root)}")
        elif path.read_text(encoding="utf-8") != text:
            problems.append(f"out of date: {path.relative_to(root)}")
    for path in sorted(folder.glob("*.ipynb")):
        if path not in planned:
            problems.append(f"{orphan}: {path.relative_to(root)}")
    return problems


def stale_core_sources(root: Path) -> list[str]:
    return _differences(root, planned_core_sources(root), core_folder(root), "no core exercise in")


def build_core_sources(root: Path) -> list[Path]:
    """Write the core-track assignment's source notebooks; remove those of lessons without a core exercise."""
    planned = planned_core_sources(root)
    if planned:
        core_folder(root).mkdir(parents=True, exist_ok=True)
    written = []
    for path, text in planned.items():
        if not path.exists() or path.read_text(encoding="utf-8") != text:
            path.write_text(text, encoding="utf-8")
            written.append(path)
    for path in sorted(core_folder(root).glob("*.ipynb")):
        if path not in planned:
            path.unlink()
            written.append(path)
    return written


def mark_solutions(root: Path | None = None, known_checks: dict | None = None) -> list:
    """Add nbgrader metadata to every solution cell and check cell in solutions/ that lacks it.

    Only ``metadata.nbgrader`` of those cells changes: each file is read right before it is written (other
    people may be editing other notebooks), written in the same format (``indent=1``, keys sorted, a final
    newline), and left alone when nothing is missing. Returns ``(path, changed cell indices)`` per file
    written.
    """
    root = root or repo_root()
    known_checks = registry.declared_checks() if known_checks is None else known_checks
    written = []
    for path in sorted((root / "solutions").glob("*.ipynb")):
        text = path.read_text(encoding="utf-8")
        marked, changed = marked_text(text, known_checks, path.name)
        if changed:
            path.write_text(marked, encoding="utf-8")
            written.append((path, changed))
    return written


def marked_text(text: str, known_checks: dict, name: str = "notebook") -> tuple[str, list[int]]:
    """``text`` (a notebook's JSON) with the missing nbgrader metadata added, in the same format, and the
    cells changed. A file with sorted keys stays sorted; otherwise the keys keep their order."""
    try:
        notebook = json.loads(text)
    except ValueError as exc:
        raise BuildError(f"{name}: not a readable notebook ({exc})") from None
    sort_keys = json.dumps(notebook, indent=1, ensure_ascii=False, sort_keys=True) + "\n" == text
    changed = course.mark_cells(notebook, known_checks)
    return json.dumps(notebook, indent=1, ensure_ascii=False, sort_keys=sort_keys) + "\n", changed
