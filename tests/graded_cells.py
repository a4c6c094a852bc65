"""Grading a lesson's graded cells through the real judge and sandbox, for the tests of checks that run code
beside the learner's (05.2, 06.1, 09.1) and for the attack suites.

A submission here is a lesson's notebook cut to its nbgrader cells (stubs and checks: the lesson's other cells
only cost grading time), with one cell of the test's own (an answer, a forgery) put before a check.
"""

from __future__ import annotations

import csv
import importlib.util
import json
import sys
from pathlib import Path

import pytest

from amp_lessons.tools import cli

COURSE = Path(__file__).resolve().parents[1]


def graded_cells(notebook: str, cell_source: str | None = None, before: str | None = None) -> dict:
    """``notebook`` (a path in the course, e.g. ``exercises/06_checkpoint_and_rollback.ipynb``) cut to its graded
    cells, with ``cell_source`` in a cell just before the check cell whose ``grade_id`` is ``before`` (by
    default the first check)."""
    nb = json.loads((COURSE / notebook).read_text(encoding="utf-8"))
    nb["cells"] = [c for c in nb["cells"] if "nbgrader" in c.get("metadata", {})]
    if cell_source is not None:
        at = next(
            i
            for i, c in enumerate(nb["cells"])
            if c["metadata"]["nbgrader"].get("grade")
            and before in (None, c["metadata"]["nbgrader"].get("grade_id"))
        )
        cell = {
            "cell_type": "code",
            "execution_count": None,
            "metadata": {},
            "outputs": [],
            "source": cell_source,
        }
        nb["cells"].insert(at, cell)
    return nb


def grade_submissions(base: Path, lesson: str, learners: dict, exercise_prefix: str) -> dict:
    """Grade ``{learner: notebook}`` as ``base/submissions/<learner>/<lesson>`` (``grade --jobs 2``); the row of
    the exercise whose label starts with ``exercise_prefix``, by learner."""
    for learner, nb in learners.items():
        (base / "submissions" / learner).mkdir(parents=True)
        (base / "submissions" / learner / lesson).write_text(json.dumps(nb, indent=1), encoding="utf-8")
    grades = base / "grades.csv"
    patch = pytest.MonkeyPatch()
    patch.chdir(base)
    try:
        cli.main(["grade", "submissions", "--timeout", "60", "--jobs", "2", "--csv", str(grades)])
    finally:
        patch.undo()
    with open(grades, newline="", encoding="utf-8") as handle:
        rows = [r for r in csv.DictReader(handle) if r["exercise"].startswith(exercise_prefix)]
    return {Path(r["learner_file"]).parent.name: r for r in rows}


def attacks():
    """``tests/fixtures/grade_submissions/attacks.py``, loaded once per process: both attack suites share its
    builders and grading runs, and the per-check tests its forgeries."""
    module = sys.modules.get("grade_attacks")
    if module is None:
        path = COURSE / "tests" / "fixtures" / "grade_submissions" / "attacks.py"
        spec = importlib.util.spec_from_file_location("grade_attacks", path)
        module = importlib.util.module_from_spec(spec)
        sys.modules["grade_attacks"] = module
        spec.loader.exec_module(module)
    return module
