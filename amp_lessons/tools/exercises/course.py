"""The course's source notebooks as nbgrader sees them: solution cells, locked graded check cells, lessons.

``solutions/NN_topic.ipynb`` is the single source of every exercise. Its cells carry nbgrader's cell metadata
(``metadata.nbgrader``, schema version 3), so the same notebooks serve two graders:

- **nbgrader** (``nbgrader generate_assignment`` / ``autograde``): a *solution cell* holds the
  ``### BEGIN SOLUTION`` region; a *check cell* (``from amp_lessons.checks import check_x; check_x(fn)``) is
  a locked, graded cell worth :data:`POINTS` points. nbgrader restores locked cells from its copy of the
  source before it runs a submission, and scores a graded cell by whether it raised (the harness turns a check
  that did not pass into an ``AssertionError`` while nbgrader runs a notebook, see
  ``checks.harness.strict_mode``).
- **``python -m amp_lessons grade``**: :func:`restore_check_cells` does what nbgrader's autograde does with
  the same metadata (check cells come from the source, never from the learner's copy; deleted ones are put
  back after the cell that preceded them in the source), without a gradebook.

Grade ids are ``answer_<function>`` for a solution cell and the check function's name (``check_stored_value``)
for a check cell: stable, readable in nbgrader's formgrader, and unique within a notebook.

Two nbgrader assignments: ``mixed_precision`` (``course/source/mixed_precision`` links to ``solutions/``: every
check graded) and ``mixed_precision_core`` (``course/source/mixed_precision_core``, written by the builder with
:func:`core_source`): the lessons with a core-track exercise, where only the checks of the exercises that lesson
00's core-track column names are graded, so a 3-hour room is graded out of its own checks.
"""

from __future__ import annotations

import copy
import hashlib
import re
from pathlib import Path

BEGIN = "### BEGIN SOLUTION"
END = "### END SOLUTION"
SCHEMA_VERSION = 3
POINTS = 1
CHECK_CALL = re.compile(r"\b(check_\w+)\s*\(")
FUNCTION = re.compile(r"^def (\w+)\s*\(", re.M)
GRADE_ID = re.compile(r"^[a-zA-Z0-9_\-]+$")
LESSON_NAME = re.compile(r"^(\d\d)_\w+$")


def cell_source(cell: dict) -> str:
    source = cell.get("source", "")
    return "".join(source) if isinstance(source, list) else source


def nbgrader_metadata(cell: dict) -> dict:
    """The cell's ``metadata.nbgrader`` (an empty dict when it has none or it is not a dict)."""
    metadata = cell.get("metadata") if isinstance(cell, dict) else None
    found = metadata.get("nbgrader") if isinstance(metadata, dict) else None
    return found if isinstance(found, dict) else {}


def is_solution(cell: dict) -> bool:
    return nbgrader_metadata(cell).get("solution") is True


def is_graded(cell: dict) -> bool:
    return nbgrader_metadata(cell).get("grade") is True


def is_locked(cell: dict) -> bool:
    """nbgrader's rule: a solution cell is never locked, a graded non-solution cell always is."""
    meta = nbgrader_metadata(cell)
    if meta.get("solution") is True:
        return False
    return meta.get("grade") is True or meta.get("locked") is True


def grade_id(cell: dict) -> str | None:
    value = nbgrader_metadata(cell).get("grade_id")
    return value if isinstance(value, str) and value else None


def called_checks(source: str, known: dict) -> list[str]:
    """The known ``check_*`` functions a piece of the course's own source calls, in order."""
    return list(dict.fromkeys(name for name in CHECK_CALL.findall(source) if name in known))


def solution_metadata(identifier: str) -> dict:
    return {
        "grade": False,
        "grade_id": identifier,
        "locked": False,
        "schema_version": SCHEMA_VERSION,
        "solution": True,
        "task": False,
    }


def check_metadata(identifier: str, points: float = POINTS) -> dict:
    return {
        "grade": True,
        "grade_id": identifier,
        "locked": True,
        "points": points,
        "schema_version": SCHEMA_VERSION,
        "solution": False,
        "task": False,
    }


def proposed_metadata(cell: dict, known: dict, index: int) -> dict | None:
    """The nbgrader metadata a solution or check cell of a source notebook should carry (None: neither)."""
    if cell.get("cell_type") != "code":
        return None
    source = cell_source(cell)
    if BEGIN in source:
        names = FUNCTION.findall(source)
        return solution_metadata(f"answer_{names[0]}" if names else f"answer_cell_{index}")
    checks = called_checks(source, known)
    if checks:
        return check_metadata(checks[0])
    return None


def mark_cells(notebook: dict, known: dict) -> list[int]:
    """Give every solution and check cell that has no nbgrader metadata the metadata it should carry.

    Only ``metadata.nbgrader`` of such cells changes (ids are made unique within the notebook); cells that
    already carry nbgrader metadata are left exactly as they are. Returns the indices of the cells changed.
    """
    taken = {grade_id(cell) for cell in notebook.get("cells", [])} - {None}
    changed = []
    for index, cell in enumerate(notebook.get("cells", [])):
        if nbgrader_metadata(cell):
            continue
        wanted = proposed_metadata(cell, known, index)
        if wanted is None:
            continue
        identifier, number = wanted["grade_id"], 2
        while identifier in taken:
            identifier, number = f"{wanted['grade_id']}_{number}", number + 1
        wanted["grade_id"] = identifier
        taken.add(identifier)
        cell.setdefault("metadata", {})["nbgrader"] = wanted
        changed.append(index)
    return changed


def metadata_problems(notebook: dict, name: str, known: dict) -> list[str]:
    """Why this source notebook would not work as an nbgrader assignment (an empty list when it would)."""
    problems, seen = [], set()
    for index, cell in enumerate(notebook.get("cells", [])):
        where = f"{name}, cell {index}"
        meta = nbgrader_metadata(cell)
        identifier = grade_id(cell)
        if meta and (identifier is None or not GRADE_ID.match(identifier)):
            shown = meta.get("grade_id")
            problems.append(f"{where}: nbgrader grade_id {shown!r} is not letters, digits, _ or -")
        elif identifier is not None and identifier in seen:
            problems.append(f"{where}: grade_id {identifier!r} is used twice")
        seen.add(identifier)
        source = cell_source(cell) if cell.get("cell_type") == "code" else ""
        if BEGIN in source and not is_solution(cell):
            problems.append(f"{where}: a solution region in a cell without nbgrader solution metadata")
        if is_solution(cell) and cell.get("cell_type") == "code" and BEGIN not in source:
            problems.append(f"{where}: a solution cell without a '{BEGIN}' region (nbgrader would blank it)")
        if called_checks(source, known) and not (is_graded(cell) and is_locked(cell)):
            problems.append(f"{where}: a check cell must be a locked, graded nbgrader cell")
        if is_graded(cell) and not isinstance(meta.get("points"), (int, float)):
            problems.append(f"{where}: a graded cell needs a number of points")
    if problems:
        problems.append("run `python -m amp_lessons mark-solutions` to add the missing metadata")
    return problems


def checksum(cell: dict) -> str:
    """nbgrader's cell checksum (``nbgrader.utils.compute_checksum``), so released cells match nbgrader's."""
    digest = hashlib.md5()
    for part in (
        cell_source(cell),
        cell.get("cell_type", ""),
        str(is_graded(cell)),
        str(is_solution(cell)),
        str(is_locked(cell)),
        grade_id(cell) or "",
    ):
        digest.update(part.encode("utf-8"))
    if is_graded(cell):
        digest.update(str(float(nbgrader_metadata(cell)["points"])).encode("utf-8"))
    return digest.hexdigest()


def release_cell(cell: dict) -> dict:
    """What nbgrader's generate step does to a cell's metadata: lock it, then add its checksum and type."""
    meta = nbgrader_metadata(cell)
    if not meta:
        return cell
    cell = copy.deepcopy(cell)
    if is_solution(cell):
        cell["metadata"]["deletable"] = False
    elif is_locked(cell):
        cell["metadata"]["deletable"] = False
        cell["metadata"]["editable"] = False
    if is_graded(cell) or is_solution(cell) or is_locked(cell):
        cell["metadata"]["nbgrader"]["checksum"] = checksum(cell)
        cell["metadata"]["nbgrader"]["cell_type"] = cell.get("cell_type")
    return cell


# ------------------------------------------------------------------------------ which lesson is this file


def source_notebooks(folder: Path) -> dict[str, Path]:
    """``{"01_precision_formats": path}`` for every ``NN_topic.ipynb`` in the source folder."""
    if not folder.is_dir():
        return {}
    return {path.stem: path for path in sorted(folder.glob("*.ipynb")) if LESSON_NAME.match(path.stem)}


def lesson_source(path: Path, notebook: dict | None, sources: dict[str, Path]) -> Path | None:
    """The source notebook of the lesson a learner's file belongs to, or None when that cannot be told.

    In order: the ``amp_lessons.generated_from`` metadata the builder writes; a file name that contains a
    lesson's full name (``alice_01_precision_formats.ipynb``); a file name that *starts* with a lesson's
    number (``01_mine.ipynb``). A number elsewhere in the name (``backup 06_12 lesson01.ipynb``) is not a
    lesson number.
    """
    meta = ((notebook or {}).get("metadata") or {}).get("amp_lessons") if isinstance(notebook, dict) else None
    generated = meta.get("generated_from") if isinstance(meta, dict) else None
    if isinstance(generated, str) and Path(generated).stem in sources:
        return sources[Path(generated).stem]
    stem = Path(path).stem
    named = [name for name in sources if name in stem]
    if len(named) == 1:
        return sources[named[0]]
    match = re.match(r"(\d\d)_", stem)
    if match:
        numbered = [name for name in sources if name.startswith(match.group(0))]
        if len(numbered) == 1:
            return sources[numbered[0]]
    return None


# --------------------------------------------------------------------------- restore the course's checks


def graded_cells(source: dict) -> list[tuple[int, str]]:
    """``(index, grade_id)`` of every graded cell of a source notebook, in order."""
    return [
        (index, grade_id(cell))
        for index, cell in enumerate(source.get("cells", []))
        if is_graded(cell) and grade_id(cell)
    ]


def _fresh(cell: dict) -> dict:
    cell = copy.deepcopy(cell)
    if cell.get("cell_type") == "code":
        cell["outputs"], cell["execution_count"] = [], None
    return cell


def restore_check_cells(learner: dict, source: dict) -> tuple[dict, dict[int, str]]:
    """The notebook to run: the learner's cells, with every graded cell taken from the source.

    A learner's cell that carries a graded cell's ``grade_id`` is replaced by the source's cell (source text
    and metadata); another copy of it is dropped; a graded cell the learner deleted (or stripped of its
    metadata) is inserted after the cell that precedes it in the source, as nbgrader's autograde does.
    Cells the learner added stay. Returns the notebook and ``{cell index: grade_id}`` of the restored cells.
    """
    source_cells = source.get("cells", [])
    graded = {identifier: source_cells[index] for index, identifier in graded_cells(source)}
    cells, placed = [], set()
    for cell in learner.get("cells", []):
        identifier = grade_id(cell) if isinstance(cell, dict) else None
        if identifier in graded:
            if identifier not in placed:
                cells.append(_fresh(graded[identifier]))
                placed.add(identifier)
            continue
        cells.append(cell)
    for index, identifier in graded_cells(source):
        if identifier in placed:
            continue
        position = len(cells)
        for earlier in reversed(source_cells[:index]):
            previous = grade_id(earlier)
            found = [
                i for i, cell in enumerate(cells) if isinstance(cell, dict) and grade_id(cell) == previous
            ]
            if previous and found:
                position = found[0] + 1
                break
        cells.insert(position, _fresh(graded[identifier]))
        placed.add(identifier)
    notebook = dict(learner)
    notebook["cells"] = cells
    restored = {
        index: grade_id(cell)
        for index, cell in enumerate(cells)
        if isinstance(cell, dict) and grade_id(cell) in graded and is_graded(cell)
    }
    return notebook, restored


# ------------------------------------------------------------------- the core track's own assignment

FULL_ASSIGNMENT = "mixed_precision"
CORE_ASSIGNMENT = "mixed_precision_core"
LESSON_ZERO = "00_start_here.ipynb"
EXERCISE_NUMBERS = re.compile(r"\bexercises?\s+((?:\d\d\.\d+(?:\s*(?:,|and|&)\s*)?)+)", re.I)
EXERCISE_NUMBER = re.compile(r"\d\d\.\d+")
TRACK_MARKER = re.compile(r"\*Track:\s*(core|full)\*", re.I)
NOT_IN_CORE = f"# Full course only: not graded in the core-track assignment ({CORE_ASSIGNMENT}).\n"


def _table_rows(text: str) -> list[list[str]]:
    return [
        [part.strip() for part in line.strip().strip("|").split("|")]
        for line in text.splitlines()
        if line.strip().startswith("|")
    ]


def core_column(lesson_zero: dict) -> dict[str, str]:
    """``{"01": "§1 Three fields, ...; exercise 01.1", ...}``: the core-track column of lesson 00's lesson map.

    The table is the markdown table whose header has a column named "core track ..."; its first column is the
    lesson number. An empty dict when lesson 00 has no such table.
    """
    for cell in lesson_zero.get("cells", []):
        if cell.get("cell_type") != "markdown":
            continue
        rows = _table_rows(cell_source(cell))
        if not rows:
            continue
        column = next((i for i, name in enumerate(rows[0]) if name.lower().startswith("core track")), None)
        if column is None:
            continue
        return {
            row[0]: row[column] for row in rows[2:] if len(row) > column and re.fullmatch(r"\d\d", row[0])
        }
    return {}


def core_exercise_numbers(lesson_zero: dict) -> list[str]:
    """The exercises lesson 00 puts in the core track (``["01.1", "02.1", ...]``), in lesson order.

    Read from the core-track column (``...; exercise 01.1``); a number that does not belong to its row's
    lesson is ignored (``§7 The 1.0000 vs 1.0003 example`` names no exercise).
    """
    numbers = []
    for lesson, text in core_column(lesson_zero).items():
        for group in EXERCISE_NUMBERS.findall(text):
            numbers += [n for n in EXERCISE_NUMBER.findall(group) if n.startswith(f"{lesson}.")]
    return list(dict.fromkeys(numbers))


def core_checks(lesson_zero: dict, known: dict) -> tuple[dict[str, str], list[str]]:
    """``({check function name: label}, [exercise numbers no checker has])`` for the core track.

    ``known`` is ``{check function name: exercise label}`` (``registry.declared_checks()``); a label starts
    with its exercise number (``"01.1 stored_value"``).
    """
    by_number = {label.split()[0]: name for name, label in known.items()}
    numbers = core_exercise_numbers(lesson_zero)
    found = {by_number[n]: known[by_number[n]] for n in numbers if n in by_number}
    return found, [n for n in numbers if n not in by_number]


def section_tracks(notebook: dict) -> dict[str, str | None]:
    """``{grade_id of a graded cell: "core" | "full" | None}``: the *Track:* marker of the nearest heading
    above it that carries one (None: no marker above it)."""
    track, found = None, {}
    for cell in notebook.get("cells", []):
        if cell.get("cell_type") == "markdown":
            marker = TRACK_MARKER.search(cell_source(cell))
            if marker and cell_source(cell).lstrip().startswith("#"):
                track = marker.group(1).lower()
        elif is_graded(cell) and grade_id(cell):
            found[grade_id(cell)] = track
    return found


def core_source(solution: dict, name: str, core: dict, known: dict) -> dict | None:
    """The core-track assignment's source notebook for one solution notebook (None: no core exercise in it).

    The lesson stays whole, so learners of the 3-hour room work the same notebook; only the check cells of
    core exercises stay graded (one point each). Every other check cell loses its nbgrader metadata, keeps
    its check (a learner may still run it) and says that it is not graded; solution cells stay solution
    cells (their stubs are generated as usual). So nbgrader's total is the number of core checks.
    """
    notebook = copy.deepcopy(solution)
    graded_core = 0
    for cell in notebook.get("cells", []):
        if not is_graded(cell):
            continue
        checks = called_checks(cell_source(cell), known)
        if checks and checks[0] in core:
            graded_core += 1
            continue
        del cell["metadata"]["nbgrader"]
        cell["source"] = NOT_IN_CORE + cell_source(cell)
    if not graded_core:
        return None
    notebook.setdefault("metadata", {})["amp_lessons"] = {
        "generated_from": f"solutions/{name}",
        "track": "core",
        "note": "Generated by `python -m amp_lessons build-exercises`; edit the solution notebook instead.",
    }
    return notebook
