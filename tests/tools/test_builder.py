"""The exercise builder: solution regions become stubs inside function bodies; stale files are found; the
result is what nbgrader's generate step makes of the same solution notebooks (nbgrader metadata included)."""

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from amp_lessons.checks import registry
from amp_lessons.tools.exercises import builder, course

ROOT = Path(__file__).resolve().parents[2]
KNOWN = {"check_add": "99.1 add"}

SOLUTION_CELL = textwrap.dedent(
    '''
    def add(a, b):
        """Add."""
        ### BEGIN SOLUTION
        return a + b
        ### END SOLUTION
    '''
).strip()


def make_notebook(*sources):
    return {
        "cells": [
            {
                "cell_type": "code",
                "source": s,
                "execution_count": 3,
                "metadata": {"scrolled": True},
                "outputs": [{"output_type": "stream", "name": "stdout", "text": "x"}],
            }
            for s in sources
        ],
        "metadata": {"kernelspec": {"name": "other"}},
        "nbformat": 4,
        "nbformat_minor": 5,
    }


def test_region_becomes_stub_that_runs():
    source = builder.strip_solutions(SOLUTION_CELL)
    assert "return a + b" not in source and builder.STUB in source
    namespace = {}
    exec(source, namespace)  # the cell still defines the function
    with pytest.raises(NotImplementedError):
        namespace["add"](1, 2)


@pytest.mark.parametrize(
    "bad, message",
    [
        ("### BEGIN SOLUTION\nx = 1\n### END SOLUTION", "inside a function body"),
        ("def f():\n    ### BEGIN SOLUTION\n    return 1", "never closed"),
        ("def f():\n    return 1\n    ### END SOLUTION", "without a matching"),
    ],
)
def test_bad_regions_are_refused(bad, message):
    with pytest.raises(builder.BuildError, match=message):
        builder.strip_solutions(bad)


def test_exercise_is_clean_and_marked():
    solution = make_notebook("import math", SOLUTION_CELL, "check_add(add)")
    exercise = builder.build_exercise(solution, "x.ipynb", KNOWN)
    assert all(c["outputs"] == [] and c["execution_count"] is None for c in exercise["cells"])
    assert exercise["metadata"]["kernelspec"]["name"] == "python3"
    assert exercise["metadata"]["amp_lessons"]["generated_from"] == "solutions/x.ipynb"
    plain, solution, check = exercise["cells"]
    assert "nbgrader" not in plain["metadata"]
    assert solution["metadata"]["nbgrader"]["solution"] and solution["metadata"]["deletable"] is False
    assert "editable" not in solution["metadata"], "the learner writes in the solution cell"
    assert check["metadata"]["nbgrader"]["grade_id"] == "check_add"
    assert check["metadata"]["nbgrader"]["points"] == 1
    assert check["metadata"]["editable"] is False and check["metadata"]["deletable"] is False
    assert check["metadata"]["nbgrader"]["checksum"] == course.checksum(check)


def test_notebook_without_region_is_refused():
    with pytest.raises(builder.BuildError, match="give the answers away"):
        builder.build_exercise(make_notebook("x = 1"), "x.ipynb", KNOWN)


def test_metadata_that_contradicts_itself_is_refused():
    notebook = make_notebook(SOLUTION_CELL, "check_add(add)")
    course.mark_cells(notebook, KNOWN)
    notebook["cells"][1]["metadata"]["nbgrader"]["grade_id"] = "answer_add"  # the solution cell's id
    with pytest.raises(builder.BuildError, match="used twice"):
        builder.build_exercise(notebook, "x.ipynb", KNOWN)
    notebook["cells"][1]["metadata"]["nbgrader"].update(grade_id="check add", locked=False, grade=False)
    with pytest.raises(builder.BuildError, match="letters, digits") as error:
        builder.build_exercise(notebook, "x.ipynb", KNOWN)
    assert "must be a locked, graded" in str(error.value) and "mark-solutions" in str(error.value)


def test_mark_cells_changes_only_unmarked_solution_and_check_cells():
    notebook = make_notebook("import math", SOLUTION_CELL, "check_add(add)", "check_add(add)  # again")
    notebook["cells"][3]["metadata"]["nbgrader"] = course.check_metadata("kept_as_it_was", points=2)
    assert course.mark_cells(notebook, KNOWN) == [1, 2]
    ids = [course.grade_id(c) for c in notebook["cells"]]
    assert ids == [None, "answer_add", "check_add", "kept_as_it_was"]
    assert notebook["cells"][1]["metadata"]["scrolled"] is True, "other metadata untouched"
    assert course.mark_cells(notebook, KNOWN) == []


def test_mark_solutions_rewrites_only_what_lacks_metadata(tmp_path):
    (tmp_path / "solutions").mkdir()
    path = tmp_path / "solutions" / "01_demo.ipynb"
    path.write_text(builder.dumps(make_notebook(SOLUTION_CELL, "check_add(add)")))
    before = json.loads(path.read_text())
    marked = builder.mark_solutions(tmp_path, KNOWN)
    assert [(p.name, cells) for p, cells in marked] == [("01_demo.ipynb", [0, 1])]
    after = json.loads(path.read_text())
    for old, new in zip(before["cells"], after["cells"]):
        for key in set(new) | set(old):
            assert key == "metadata" or new.get(key) == old.get(key)
        assert {k: v for k, v in new["metadata"].items() if k != "nbgrader"} == old["metadata"]
    assert path.read_text().endswith("}\n") and builder.mark_solutions(tmp_path, KNOWN) == []


def test_build_and_stale_check(tmp_path, monkeypatch):
    monkeypatch.setattr(builder.registry, "declared_checks", lambda: KNOWN)
    (tmp_path / "solutions").mkdir()
    (tmp_path / "exercises").mkdir()
    (tmp_path / "solutions" / "01_demo.ipynb").write_text(json.dumps(make_notebook(SOLUTION_CELL)))
    assert builder.stale_exercises(tmp_path) == [
        "missing: exercises/01_demo.ipynb",
        "nbgrader metadata missing in: solutions/01_demo.ipynb (run `python -m amp_lessons mark-solutions`)",
    ]
    builder.mark_solutions(tmp_path, KNOWN)
    assert builder.stale_exercises(tmp_path) == ["missing: exercises/01_demo.ipynb"]
    assert [p.name for p in builder.build(tmp_path)] == ["01_demo.ipynb"]
    assert builder.stale_exercises(tmp_path) == []
    assert builder.build(tmp_path) == []  # nothing changed, nothing written
    (tmp_path / "exercises" / "01_demo.ipynb").write_text("{}")
    (tmp_path / "exercises" / "99_orphan.ipynb").write_text("{}")
    assert builder.stale_exercises(tmp_path) == [
        "out of date: exercises/01_demo.ipynb",
        "no solution notebook for: exercises/99_orphan.ipynb",
    ]


def generate_assignment(folder: Path, assignment: str) -> None:
    """``nbgrader generate_assignment`` with the course's nbgrader_config.py, its course root moved to ``folder``."""
    (folder / "nbgrader_config.py").write_text(
        f"load_subconfig({str(ROOT / 'nbgrader_config.py')!r})  # noqa: F821\n"
        f"get_config().CourseDirectory.root = {str(folder / 'course')!r}  # noqa: F821\n"
    )
    path = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])  # for alembic
    run = subprocess.run(
        [sys.executable, "-m", "nbgrader", "generate_assignment", assignment],
        cwd=folder,
        env=dict(os.environ, PATH=path),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stdout + run.stderr


def test_exercises_are_what_nbgrader_generates(tmp_path):
    """The course's nbgrader_config.py and every solution notebook through `nbgrader generate_assignment`."""
    pytest.importorskip("nbgrader", reason="nbgrader is for instructors: pip install -r requirements-dev.txt")
    source = tmp_path / "course" / "source" / "mixed_precision"
    shutil.copytree(ROOT / "solutions", source)
    generate_assignment(tmp_path, "mixed_precision")
    released = sorted((tmp_path / "course" / "release" / "mixed_precision").glob("*.ipynb"))
    assert [p.name for p in released] == sorted(p.name for p in (ROOT / "solutions").glob("*.ipynb"))
    for path in released:
        theirs = json.loads(path.read_text(encoding="utf-8"))
        ours = builder.build_exercise(builder.read_notebook(source / path.name), path.name)
        assert len(ours["cells"]) == len(theirs["cells"]), path.name
        for index, (mine, nbgrader) in enumerate(zip(ours["cells"], theirs["cells"])):
            where = f"{path.name}, cell {index}"
            assert builder.cell_source(mine) == builder.cell_source(nbgrader), where
            assert mine["metadata"] == nbgrader["metadata"] and set(mine) == set(nbgrader), where
        assert {k: v for k, v in ours["metadata"].items() if k != "amp_lessons"} == theirs["metadata"]


# ------------------------------------------------------------------- the core track's own assignment

LESSON_MAP = """## 4. The lesson map
| # | notebook | what it teaches | core track (3-hour workshop) | minutes |
|---|---|---|---|---|
| 00 | `00_start_here` | how | all | 10 |
| 98 | `98_demo` | x | §1 A, §7 The 1.0000 vs 1.0003 example; exercises 98.2 and 98.3, 97.1 | 25 |
| 99 | `99_demo` | y | §1 Timing — reading only | 15 |
"""


def lesson_zero(text=LESSON_MAP):
    return {"cells": [{"cell_type": "markdown", "metadata": {}, "source": text}]}


def test_core_exercises_come_from_lesson_zeros_core_column():
    assert course.core_exercise_numbers(lesson_zero()) == ["98.2", "98.3"], (
        "another lesson's number is not one"
    )
    known = {"check_a": "98.2 a", "check_b": "98.1 b"}
    assert course.core_checks(lesson_zero(), known) == ({"check_a": "98.2 a"}, ["98.3"])
    assert course.core_exercise_numbers(lesson_zero("no table here")) == []


def test_the_real_core_track_agrees_with_the_section_markers():
    """Lesson 00's column names the core checks; each check's nearest *Track:* marker (if any) agrees."""
    known = registry.declared_checks()
    zero = builder.read_notebook(ROOT / "notebooks" / course.LESSON_ZERO)
    core, unknown = course.core_checks(zero, known)
    assert core and not unknown
    disagree = []
    for path in sorted((ROOT / "solutions").glob("*.ipynb")):
        for check, track in course.section_tracks(builder.read_notebook(path)).items():
            wanted = "core" if check in core else "full"
            if track not in (None, wanted):
                disagree.append(f"{path.name}: {check} sits under *Track: {track}*, lesson 00 says {wanted}")
    assert not disagree, disagree


def test_core_source_grades_only_the_core_checks():
    known = {"check_add": "99.1 add", "check_sub": "99.2 sub"}
    sub = SOLUTION_CELL.replace("add", "sub").replace("a + b", "a - b")
    solution = make_notebook(SOLUTION_CELL, "check_add(add)", sub, "check_sub(sub)")
    course.mark_cells(solution, known)
    core = course.core_source(solution, "99_demo.ipynb", {"check_add": "99.1 add"}, known)
    graded = [course.grade_id(c) for c in core["cells"] if course.is_graded(c)]
    assert graded == ["check_add"]
    not_graded = core["cells"][3]
    assert "nbgrader" not in not_graded["metadata"] and "not graded in the core-track" in not_graded["source"]
    assert course.is_solution(core["cells"][2]), "its answer cell still becomes a stub"
    assert core["metadata"]["amp_lessons"]["track"] == "core"
    assert course.core_source(solution, "99_demo.ipynb", {}, known) is None


def test_core_sources_are_built_checked_and_pruned(tmp_path, monkeypatch):
    known = {"check_add": "98.2 add"}
    monkeypatch.setattr(builder.registry, "declared_checks", lambda: known)
    for folder in ("solutions", "exercises", "notebooks"):
        (tmp_path / folder).mkdir()
    (tmp_path / "notebooks" / course.LESSON_ZERO).write_text(
        json.dumps(lesson_zero(LESSON_MAP.replace(" and 98.3", "")))
    )
    solution = make_notebook(SOLUTION_CELL, "check_add(add)")
    course.mark_cells(solution, known)
    (tmp_path / "solutions" / "98_demo.ipynb").write_text(builder.dumps(solution))
    builder.build(tmp_path)
    core = tmp_path / "course" / "source" / course.CORE_ASSIGNMENT
    assert [p.name for p in core.glob("*.ipynb")] == ["98_demo.ipynb"]
    assert builder.stale_exercises(tmp_path) == []
    (core / "97_gone.ipynb").write_text("{}")
    (core / "98_demo.ipynb").write_text("{}")
    assert builder.stale_exercises(tmp_path) == [
        "out of date: course/source/mixed_precision_core/98_demo.ipynb",
        "no core exercise in: course/source/mixed_precision_core/97_gone.ipynb",
    ]
    builder.build(tmp_path)
    assert builder.stale_exercises(tmp_path) == [] and not (core / "97_gone.ipynb").exists()
    (tmp_path / "notebooks" / course.LESSON_ZERO).write_text(json.dumps(lesson_zero()))
    with pytest.raises(builder.BuildError, match="exercise\\(s\\) 98.3 in the core track"):
        builder.build(tmp_path)


def test_the_core_assignment_is_graded_out_of_the_core_checks(tmp_path):
    """nbgrader generates course/source/mixed_precision_core; its gradebook's maximum is one point per core check."""
    nbgrader_api = pytest.importorskip("nbgrader.api", reason="nbgrader is for instructors")
    shutil.copytree(
        ROOT / "course" / "source" / course.CORE_ASSIGNMENT, tmp_path / "course" / "source" / "core"
    )
    generate_assignment(tmp_path, "core")
    zero = builder.read_notebook(ROOT / "notebooks" / course.LESSON_ZERO)
    core, _ = course.core_checks(zero, registry.declared_checks())
    with nbgrader_api.Gradebook(f"sqlite:///{tmp_path / 'course' / 'gradebook.db'}") as book:
        assignment = book.find_assignment("core")
        assert assignment.max_score == len(core)
        graded = {cell.name for notebook in assignment.notebooks for cell in notebook.grade_cells}
    assert graded == set(core)
    released = tmp_path / "course" / "release" / "core"
    for notebook in released.glob("*.ipynb"):
        assert "### BEGIN SOLUTION" not in notebook.read_text(encoding="utf-8"), notebook.name
