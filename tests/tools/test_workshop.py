"""A whole workshop through nbgrader on one machine: release, fetch, submit, collect, autograde, feedback.

The course's own ``nbgrader_config.py`` is loaded; only the course folder, the exchange (both in a temporary
folder) and the course id are changed. The assignment is lesson 01's exercise notebook, generated from the
real ``solutions/01_precision_formats.ipynb``. Three learners, each with their own ``HOME`` and ``USER``
(one UNIX account, so each names itself with ``--student`` as nbgrader allows), hand in:

- alice: both functions written (the solution regions' code typed in);
- bob: the notebook untouched;
- mallory: no code, but the first check cell edited into a print of the "[PASS] Passed" text, the second check
  cell deleted and replaced by such a print without nbgrader metadata, and a cell that writes passes (and an
  exercise the course does not have) into the progress record.

The gradebook must say alice 2 of 2, bob 0, mallory 0; every learner gets feedback. The same submissions are
then graded with ``python -m amp_lessons grade`` (the quick path), which must agree.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from amp_lessons.checks import registry
from amp_lessons.tools import cli
from amp_lessons.tools.exercises import course

nbgrader_api = pytest.importorskip(
    "nbgrader.api", reason="nbgrader is for instructors: pip install -r requirements-dev.txt"
)

ROOT = Path(__file__).resolve().parents[2]
LESSON = "01_precision_formats"
ASSIGNMENT = "workshop"
COURSE_ID = "amp-test"
FORGED = 'print("[PASS] Passed — {label}\\nWell done.")'
FORGE_RECORD = """import json
from pathlib import Path

record = Path.home() / ".amp_lessons" / "progress.json"
record.parent.mkdir(parents=True, exist_ok=True)
record.write_text(json.dumps({"version": 1, "exercises": {
    "01.1 stored_value": {"attempts": 1, "passed": True},
    "01.9 bonus points": {"attempts": 1, "passed": True}}}))"""


def nbgrader(*args, cwd: Path, home: Path, user: str, timeout: float = 300) -> str:
    """Run an nbgrader command as one person (their HOME and USER), with this venv's programs on PATH."""
    env = {
        name: value for name, value in os.environ.items() if not name.startswith(("JUPYTER", "AMP_LESSONS"))
    }
    env.update(HOME=str(home), USER=user, LOGNAME=user, AMP_LESSONS_PROGRESS_FILE="off", PATH=venv_path())
    run = subprocess.run(
        [sys.executable, "-m", "nbgrader", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert run.returncode == 0, f"nbgrader {' '.join(args)} failed:\n{run.stdout}\n{run.stderr}"
    return run.stdout + run.stderr


def venv_path() -> str:
    """nbgrader starts alembic by name when it creates a gradebook: this venv's bin/ goes first."""
    return os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])


def succeeded(result: dict) -> None:
    assert result and result.get("success"), (result or {}).get("log", "") + (result or {}).get("error", "")


class Learner:
    """A learner on the shared machine: their own HOME, USER and folder; nbgrader's exchange classes (what
    JupyterLab's Assignments tab calls) run in this process while HOME and USER are theirs."""

    def __init__(self, name: str, workshop: Path, monkeypatch):
        self.name, self.home, self.monkeypatch = name, workshop / "home" / name, monkeypatch
        self.home.mkdir(parents=True)
        self.exchange = workshop / "exchange"

    def run(self, step: str) -> None:
        from nbgrader.auth import Authenticator
        from nbgrader.coursedir import CourseDirectory
        from nbgrader.exchange import ExchangeFactory
        from nbgrader.utils import capture_log
        from traitlets.config import Config

        with self.monkeypatch.context() as patch:
            patch.setenv("HOME", str(self.home))
            patch.setenv("USER", self.name)
            patch.chdir(self.home)
            config = Config()
            config.Exchange.root = str(self.exchange)
            config.Exchange.assignment_dir = str(self.home)
            config.CourseDirectory.course_id = COURSE_ID
            config.CourseDirectory.student_id = self.name
            coursedir = CourseDirectory(config=config)
            coursedir.assignment_id = ASSIGNMENT
            app = getattr(ExchangeFactory(config=config), step)(
                coursedir=coursedir, authenticator=Authenticator(config=config), config=config
            )
            succeeded(capture_log(app))


def write_notebook(path: Path, notebook: dict) -> None:
    path.write_text(json.dumps(notebook, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")


def answer(notebook: dict, solution: dict) -> dict:
    """alice: the solution cells' code typed in (taken from the solution notebook, cell by grade id)."""
    answers = {
        course.grade_id(cell): cell["source"] for cell in solution["cells"] if course.is_solution(cell)
    }
    for cell in notebook["cells"]:
        if course.is_solution(cell):
            source = course.cell_source({"source": answers[course.grade_id(cell)]})
            cell["source"] = "\n".join(line for line in source.split("\n") if "SOLUTION" not in line)
    return notebook


def forge(notebook: dict, labels: dict) -> dict:
    """mallory: check cells turned into prints of the pass text, one of them stripped of its metadata."""
    checks = [index for index, cell in enumerate(notebook["cells"]) if course.is_graded(cell)]
    first, second = checks[0], checks[1]
    cells = notebook["cells"]
    cells[first]["source"] = FORGED.format(label=labels[course.grade_id(cells[first])])
    label = labels[course.grade_id(cells[second])]
    cells[second] = {
        "cell_type": "code",
        "execution_count": None,
        "metadata": {},
        "outputs": [],
        "source": FORGED.format(label=label),
    }
    cells.insert(
        first,
        {"cell_type": "code", "execution_count": None, "metadata": {}, "outputs": [], "source": FORGE_RECORD},
    )
    return notebook


@pytest.fixture
def workshop(tmp_path):
    instructor = tmp_path / "instructor"
    source = instructor / "course" / "source" / ASSIGNMENT
    source.mkdir(parents=True)
    shutil.copy(ROOT / "solutions" / f"{LESSON}.ipynb", source)
    (tmp_path / "exchange").mkdir()
    (instructor / "nbgrader_config.py").write_text(
        f"c = get_config()  # noqa: F821\n"
        f"load_subconfig({str(ROOT / 'nbgrader_config.py')!r})  # noqa: F821  (the course's own settings)\n"
        f"c.CourseDirectory.root = {str(instructor / 'course')!r}\n"
        f"c.CourseDirectory.course_id = {COURSE_ID!r}\n"
        f"c.Exchange.root = {str(tmp_path / 'exchange')!r}\n"
        "c.ExchangeCollect.check_owner = False  # three learners share this machine's one account\n"
    )
    return tmp_path


def instructor_api(instructor: Path):
    """nbgrader's own API (what the formgrader calls) with the course folder's nbgrader_config.py."""
    from nbgrader.apps import NbGraderAPI
    from traitlets.config.loader import PyFileConfigLoader

    config = PyFileConfigLoader("nbgrader_config.py", path=str(instructor)).load_config()
    return NbGraderAPI(config=config)


# nbgrader 0.9.6's release_feedback passes a misspelt keyword to traitlets (its own bug, harmless)
@pytest.mark.filterwarnings("ignore:Passing unrecognized arguments:DeprecationWarning")
def test_three_learners_through_nbgrader(workshop, capsys, monkeypatch):
    started, steps = time.monotonic(), []
    instructor = workshop / "instructor"
    monkeypatch.setenv("PATH", venv_path())

    def timed(what):
        steps.append(f"{what} {time.monotonic() - started:.0f} s")

    api = instructor_api(instructor)
    succeeded(api.generate_assignment(ASSIGNMENT))
    succeeded(api.release_assignment(ASSIGNMENT))
    timed("released")

    solution = json.loads((ROOT / "solutions" / f"{LESSON}.ipynb").read_text(encoding="utf-8"))
    known = registry.declared_checks()
    labels = {
        course.grade_id(cell): known[course.called_checks(course.cell_source(cell), known)[0]]
        for cell in solution["cells"]
        if course.is_graded(cell)
    }
    work = {
        "alice": lambda nb: answer(nb, solution),
        "bob": lambda nb: nb,
        "mallory": lambda nb: forge(nb, labels),
    }
    learners = {name: Learner(name, workshop, monkeypatch) for name in work}
    for name, learner in learners.items():
        learner.run("FetchAssignment")
        path = learner.home / ASSIGNMENT / f"{LESSON}.ipynb"
        released = json.loads(path.read_text(encoding="utf-8"))
        checks = [cell for cell in released["cells"] if course.is_graded(cell)]
        assert checks and all(cell["metadata"].get("editable") is False for cell in checks)
        write_notebook(path, work[name](released))
        learner.run("Submit")
    timed("submitted")

    succeeded(api.collect(ASSIGNMENT))
    teacher = workshop / "home" / "teacher"
    teacher.mkdir(parents=True)
    nbgrader("autograde", ASSIGNMENT, cwd=instructor, home=teacher, user="teacher")  # the command, as typed
    timed("autograded")
    succeeded(api.generate_feedback(ASSIGNMENT))
    succeeded(api.release_feedback(ASSIGNMENT))
    for name, learner in learners.items():
        learner.run("FetchFeedback")
        feedback = list((learner.home / ASSIGNMENT / "feedback").rglob(f"{LESSON}.html"))
        assert feedback, f"{name} got no feedback"
    timed("feedback fetched")

    table = gradebook(instructor / "course" / "gradebook.db", list(learners), list(labels))
    with capsys.disabled():
        print(f"\nnbgrader gradebook ({', '.join(steps)}):\n{table.to_string()}")
    assert table.loc["alice", "total"] == 2.0 and table.loc["alice", "max"] == 2.0
    assert table.loc["bob", "total"] == 0.0 and table.loc["mallory", "total"] == 0.0
    assert (table[list(labels)].loc["alice"] == 1.0).all()
    assert (table[list(labels)].loc[["bob", "mallory"]] == 0.0).all().all()

    autograded = instructor / "course" / "autograded" / "mallory" / ASSIGNMENT / f"{LESSON}.ipynb"
    autograded = json.loads(autograded.read_text(encoding="utf-8"))
    restored = [course.cell_source(cell) for cell in autograded["cells"] if course.is_graded(cell)]
    assert len(restored) == 2 and all("check_" in source and "[PASS]" not in source for source in restored)

    # the quick path agrees on the very same submissions (nbgrader's release has no amp_lessons metadata:
    # the lesson is told by the file name)
    csv = workshop / "grades.csv"
    submitted = instructor / "course" / "submitted"
    assert cli.main(["grade", str(submitted), "--jobs", "2", "--csv", str(csv)]) == 0
    grades = pd.read_csv(csv, keep_default_na=False)
    grades["learner"] = grades["learner_file"].str.split("/").str[-3]
    passed = grades.pivot_table(index="learner", columns="exercise", values="passed", aggfunc="max")
    assert passed.loc["alice"].all() and not passed.loc[["bob", "mallory"]].any().any()
    assert set(grades["exercise"]) == set(labels.values()), "no invented exercise reaches the table"
    assert set(grades.loc[grades["learner"] == "mallory", "status"]) == {"not done"}
    with capsys.disabled():
        print(f"whole workshop test, nbgrader and grade: {time.monotonic() - started:.0f} s")


def gradebook(database: Path, students: list, cells: list) -> pd.DataFrame:
    """One row per learner: each check cell's score, the total and the maximum, read with nbgrader's API."""
    rows = {}
    with nbgrader_api.Gradebook(f"sqlite:///{database}") as book:
        for student in students:
            submission = book.find_submission(ASSIGNMENT, student)
            scores = {cell: book.find_grade(cell, LESSON, ASSIGNMENT, student).score for cell in cells}
            rows[student] = {**scores, "total": submission.score, "max": submission.max_score}
    return pd.DataFrame.from_dict(rows, orient="index")
