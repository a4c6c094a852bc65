"""A whole workshop through nbgrader, with the commands the instructor guide writes, as it writes them.

``docs/instructor_guide.md`` marks four bash blocks with ``<!-- workshop: NAME -->``: ``set-up-once`` (the
instructor: the exchange, both assignments generated, one released, ``doctor --instructor``), ``learner`` (a
learner on their own account: ``learner-config``, fetch, submit, fetch feedback), ``shared-account`` (one account
shared by several learners, each in a folder of their own with ``learner-config --student``) and ``step-by-step``
(collect, autograde, feedback, export). This test runs each block's lines with bash, unchanged, except that:

- the machine is a temporary folder: the exchange is ``$AMP_LESSONS_EXCHANGE`` (which the guide's commands and
  the course's ``nbgrader_config.py`` read) in it, each person has their own ``HOME``, and the instructor's course
  folder holds a ``nbgrader_config.py`` that loads the course's own and moves only ``CourseDirectory.root`` to a
  course whose assignments hold lesson 01 alone (so it stays fast) and ``.venv``, a link to this Python's venv;
- ``sudo`` is a shell function that runs its command as the test's account;
- a second learner on the shared account runs the shared-account block with her name for ``alice``.

Three learners hand in: alice and bob share one account (``--student``), mallory has her own (she hands in under
the account's name, as nbgrader does). alice writes both functions, bob hands in the untouched notebook, mallory
edits the first check cell into a print of the "[PASS] Passed" text, deletes the second and puts such a print
without nbgrader metadata in its place, and writes passes into her progress record. The gradebook must say alice
2 of 2, bob 0, mallory 0, three students; everyone gets feedback. The same submissions are then graded with
``python -m amp_lessons grade`` (the quick path), which must agree.
"""

from __future__ import annotations

import json
import os
import pwd
import re
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
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
GUIDE = ROOT / "docs" / "instructor_guide.md"
LESSON = "01_precision_formats"
ASSIGNMENT = course.FULL_ASSIGNMENT
FORGED = 'print("[PASS] Passed — {label}\\nWell done.")'
FORGE_RECORD = """import json
from pathlib import Path

record = Path.home() / ".amp_lessons" / "progress.json"
record.parent.mkdir(parents=True, exist_ok=True)
record.write_text(json.dumps({"version": 1, "exercises": {
    "01.1 stored_value": {"attempts": 1, "passed": True},
    "01.9 bonus points": {"attempts": 1, "passed": True}}}))"""
ACCOUNT = pwd.getpwuid(os.getuid()).pw_name  # the name nbgrader gives a learner on her own account


def guide_block(name: str) -> list[str]:
    """The lines of the guide's bash block marked ``<!-- workshop: NAME -->`` (comments and all)."""
    text = GUIDE.read_text(encoding="utf-8")
    marker = f"<!-- workshop: {name} -->"
    assert marker in text, f"docs/instructor_guide.md has no block marked {marker}"
    block = re.match(r"\s*```bash\n(.*?)```", text.split(marker, 1)[1], re.S)
    assert block, f"no bash block right after {marker}"
    return [
        line for line in block.group(1).splitlines() if line.strip() and not line.lstrip().startswith("#")
    ]


def split_at(lines: list[str], command: str) -> tuple[list[str], list[str]]:
    """(the lines up to and including the first one that runs ``command``, the rest)."""
    index = next(i for i, line in enumerate(lines) if line.split("#")[0].split()[:2] == command.split())
    return lines[: index + 1], lines[index + 1 :]


class Person:
    """Someone at the machine: their HOME, and the folder their terminal is in."""

    def __init__(self, name: str, machine: Path, home: Path | None = None):
        self.name, self.machine = name, machine
        self.home = home or machine / "home" / name
        self.home.mkdir(parents=True, exist_ok=True)
        self.cwd = self.home

    def env(self) -> dict:
        env = {
            name: value
            for name, value in os.environ.items()
            if not name.startswith(("JUPYTER", "AMP_LESSONS", "VIRTUAL_ENV", "PYTHON"))
        }
        env.update(
            HOME=str(self.home),
            USER=ACCOUNT,
            LOGNAME=ACCOUNT,
            AMP_LESSONS_PROGRESS_FILE="off",
            AMP_LESSONS_EXCHANGE=str(self.machine / "exchange"),
            PATH=os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]),
        )
        return env

    def run(self, lines: list[str], timeout: float = 300) -> str:
        """Run the guide's lines in bash, in this person's terminal; the terminal's folder is kept."""
        script = 'sudo() { "$@"; }\nset -e\n' + "\n".join(lines) + '\npwd > "$WORKSHOP_CWD"\n'
        where = self.machine / f".cwd-{self.name}"
        env = dict(self.env(), WORKSHOP_CWD=str(where))
        run = subprocess.run(
            ["bash", "-c", script], cwd=self.cwd, env=env, capture_output=True, text=True, timeout=timeout
        )
        text = run.stdout + run.stderr
        assert run.returncode == 0, f"{self.name} ran:\n" + "\n".join(lines) + f"\n\nand got:\n{text}"
        self.cwd = Path(where.read_text().strip())
        return text


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
    """The machine: a course folder whose assignments hold lesson 01 alone; no exchange yet."""
    instructor = tmp_path / "instructor"
    for assignment, source in (
        (course.FULL_ASSIGNMENT, ROOT / "solutions"),
        (course.CORE_ASSIGNMENT, ROOT / "course" / "source" / course.CORE_ASSIGNMENT),
    ):
        folder = instructor / "course" / "source" / assignment
        folder.mkdir(parents=True)
        shutil.copy(source / f"{LESSON}.ipynb", folder)
    (instructor / ".venv").symlink_to(Path(sys.executable).parent.parent)
    (instructor / "nbgrader_config.py").write_text(
        f"c = get_config()  # noqa: F821\n"
        f"load_subconfig({str(ROOT / 'nbgrader_config.py')!r})  # noqa: F821  (the course's own settings)\n"
        f"c.CourseDirectory.root = {str(instructor / 'course')!r}\n"
    )
    return tmp_path


def instructor_api(instructor: Path):
    """nbgrader's own API (what the formgrader calls) with the course folder's nbgrader_config.py."""
    from nbgrader.apps import NbGraderAPI
    from traitlets.config.loader import PyFileConfigLoader

    config = PyFileConfigLoader("nbgrader_config.py", path=str(instructor)).load_config()
    return NbGraderAPI(config=config)


def check_labels() -> dict:
    solution = json.loads((ROOT / "solutions" / f"{LESSON}.ipynb").read_text(encoding="utf-8"))
    known = registry.declared_checks()
    return {
        course.grade_id(cell): known[course.called_checks(course.cell_source(cell), known)[0]]
        for cell in solution["cells"]
        if course.is_graded(cell)
    }


def learners_work(machine: Path, timed) -> dict:
    """Three learners fetch, work and submit with the guide's commands: {student id: Person}."""
    learner, shared = guide_block("learner"), guide_block("shared-account")
    fetch_own, rest_own = split_at(learner, "nbgrader fetch_assignment")
    submit_own, feedback = split_at(rest_own, "nbgrader submit")
    fetch_shared, submit_shared = split_at(shared, "nbgrader fetch_assignment")
    shared_home = machine / "home" / "student"
    alice = Person("alice", machine, shared_home)
    bob = Person("bob", machine, shared_home)
    mallory = Person("mallory", machine)
    solution = json.loads((ROOT / "solutions" / f"{LESSON}.ipynb").read_text(encoding="utf-8"))
    work = {"alice": lambda nb: answer(nb, solution), "bob": lambda nb: nb}
    work["mallory"] = lambda nb: forge(nb, check_labels())

    def shared_learner(person):
        person.run([line.replace("alice", person.name) for line in fetch_shared])
        assert (person.cwd / "nbgrader_config.py").is_file()
        edit(person, work[person.name])
        person.run([line.replace("alice", person.name) for line in submit_shared])

    def own_account():
        mallory.run(fetch_own)
        assert (mallory.home / ".jupyter" / "nbgrader_config.py").is_file()
        edit(mallory, work["mallory"])
        mallory.run(submit_own)

    with ThreadPoolExecutor(2) as pool:  # alice and bob one after the other: they share one account
        done = [pool.submit(lambda: [shared_learner(alice), shared_learner(bob)]), pool.submit(own_account)]
        [future.result() for future in done]
    timed("three learners configured, fetched and submitted")
    return {"alice": alice, "bob": bob, ACCOUNT: mallory}, feedback


def edit(person: Person, change) -> None:
    path = person.cwd / ASSIGNMENT / f"{LESSON}.ipynb"
    released = json.loads(path.read_text(encoding="utf-8"))
    checks = [cell for cell in released["cells"] if course.is_graded(cell)]
    assert checks and all(cell["metadata"].get("editable") is False for cell in checks)
    write_notebook(path, change(released))


# nbgrader 0.9.6's release_feedback passes a misspelt keyword to traitlets (its own bug, harmless)
@pytest.mark.filterwarnings("ignore:Passing unrecognized arguments:DeprecationWarning")
def test_the_guides_workshop_commands_as_written(workshop, capsys):
    started, steps = time.monotonic(), []
    instructor = workshop / "instructor"

    def timed(what):
        steps.append(f"{what}: {time.monotonic() - started:.0f} s")
        with capsys.disabled():
            print(f"\n  workshop: {steps[-1]}", end="")

    teacher = Person("teacher", workshop)
    teacher.cwd = instructor
    ready = teacher.run(guide_block("set-up-once"))
    assert "READY" in ready and "NOT READY" not in ready, ready
    assert (workshop / "exchange").stat().st_mode & 0o1777 == 0o1777
    assert f"assignment {course.CORE_ASSIGNMENT}: 1 notebook, 1 point" in ready, (
        "graded out of its core check"
    )
    timed("set up once")

    students, feedback = learners_work(workshop, timed)
    collected = teacher.run(guide_block("step-by-step"))
    assert "cheating attempt" in collected.lower(), (
        "one shared account: collect says the files are not alice's"
    )
    timed("collected, autograded, feedback released, exported")
    with ThreadPoolExecutor(3) as pool:
        list(pool.map(lambda person: person.run(feedback), students.values()))
    for name, person in students.items():
        assert list((person.cwd / ASSIGNMENT / "feedback").rglob(f"{LESSON}.html")), f"{name} got no feedback"
    timed("feedback fetched")

    labels = check_labels()
    table = gradebook(instructor / "course" / "gradebook.db", list(students), list(labels))
    with capsys.disabled():
        print(f"\nnbgrader gradebook:\n{table.to_string()}")
    assert table.loc["alice", "total"] == 2.0 and table.loc["alice", "max"] == 2.0
    assert table.loc["bob", "total"] == 0.0 and table.loc[ACCOUNT, "total"] == 0.0
    assert (table[list(labels)].loc["alice"] == 1.0).all()
    assert (table[list(labels)].loc[["bob", ACCOUNT]] == 0.0).all().all()
    exported = pd.read_csv(instructor / "grades.csv")
    exported = exported[exported["assignment"] == ASSIGNMENT].set_index("student_id")
    assert sorted(exported.index) == sorted(students), "two learners on one account are two students"
    assert exported.loc["alice", "score"] == 2.0 and (exported["max_score"] == 2.0).all()

    autograded = instructor / "course" / "autograded" / ACCOUNT / ASSIGNMENT / f"{LESSON}.ipynb"
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
    assert passed.loc["alice"].all() and not passed.loc[["bob", ACCOUNT]].any().any()
    assert set(grades["exercise"]) == set(labels.values()), "no invented exercise reaches the table"
    assert set(grades.loc[grades["learner"] == ACCOUNT, "status"]) == {"not done"}
    timed("graded again with python -m amp_lessons grade")
    with capsys.disabled():
        print(f"\nwhole workshop test, nbgrader and grade: {time.monotonic() - started:.0f} s")


def gradebook(database: Path, students: list, cells: list) -> pd.DataFrame:
    """One row per learner: each check cell's score, the total and the maximum, read with nbgrader's API."""
    rows = {}
    with nbgrader_api.Gradebook(f"sqlite:///{database}") as book:
        for student in students:
            submission = book.find_submission(ASSIGNMENT, student)
            scores = {cell: book.find_grade(cell, LESSON, ASSIGNMENT, student).score for cell in cells}
            rows[student] = {**scores, "total": submission.score, "max": submission.max_score}
    return pd.DataFrame.from_dict(rows, orient="index")
