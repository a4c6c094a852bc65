"""nbgrader's autograde, with the course's ``nbgrader_config.py``, against every attack class of issue 21.

One course, one assignment (lesson 00's warm-up, from the grading fixtures), one ``nbgrader autograde`` run
over every attack of ``tests/fixtures/grade_submissions/attacks.py`` plus an honest learner, a classmate,
a symlinked and a broken submission, and lesson 07's exercise with a forged 07.1 (a check once judged in
the kernel) from one more learner. The instructor's environment and home hold a secret. Afterwards:
every attack scores 0 in the gradebook, the honest learners full marks; no autograded notebook and no
released feedback holds the secret; a pass is written as text and logged as nothing, a failure as an error
that shows the learner's message and no traceback into the course's harness; a detached process changed
neither the gradebook nor a classmate's submission.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import graded_cells
import pytest

from amp_lessons.tools.grade import sandbox

nbgrader_api = pytest.importorskip(
    "nbgrader.api", reason="nbgrader is for instructors: pip install -r requirements-dev.txt"
)

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures" / "grade_submissions"
attacks = graded_cells.attacks()  # one module for both suites: they share its BUILDERS
ASSIGNMENT = "warmup"
LESSON = "00_warm_up"
CELL = "check_autocast_matmul"
SANDBOXED = sandbox.kind() == sandbox.BWRAP


# nbgrader shares two more submissions, where only the score and the outputs are read (no table message):
# the secrets with the huge message, and the answers within reach (the reference module first: its wrong
# answer is replaced only by a later cell that found a right one, which would score). 11 warm-up submissions, not 18.
SHARED = {
    **attacks.SHARED,
    "secrets_and_huge": ["secrets", "huge_message"],
    "answers_in_reach": ["reference_implementation", "solutions_cells", "classmates_files"],
}
STUDENTS = attacks.students(SHARED)
STUDENT_OF = {kind: attacks.student_of(kind, SHARED) for kind in attacks.ATTACKS}


def _write(folder: Path, student: str, values: dict) -> Path:
    return attacks.write_submission(folder, student, values, SHARED)


def nbgrader(*args, cwd: Path, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "nbgrader", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


@pytest.fixture(scope="module")
def autograded(tmp_path_factory):
    found = attacks.shared_run(tmp_path_factory, "nbgrader_attacks", _autograde_all)
    found["course"] = Path(found["course"])
    found["classmate"] = (Path(found["classmate"][0]), bytes.fromhex(found["classmate"][1]))
    return found


def _autograde_all(base: Path) -> dict:
    base.mkdir()
    instructor, home = base / "instructor", base / "instructor_home"
    course = instructor / "course"
    (course / "source" / ASSIGNMENT).mkdir(parents=True)
    home.mkdir()
    (home / ".secret_token").write_text(attacks.SECRET)
    (course / "source" / ASSIGNMENT / f"{LESSON}.ipynb").write_bytes(
        (FIXTURES / "source" / f"{LESSON}.ipynb").read_bytes()
    )
    for lesson in attacks.IN_KERNEL_ONCE:  # a check once judged in the kernel, forged there: one learner
        (course / "source" / ASSIGNMENT / lesson).write_bytes((ROOT / "solutions" / lesson).read_bytes())
    (instructor / "nbgrader_config.py").write_text(
        "c = get_config()  # noqa: F821\n"
        f"load_subconfig({str(ROOT / 'nbgrader_config.py')!r})  # noqa: F821\n"
        f"c.CourseDirectory.root = {str(course)!r}\n"
        "c.CourseDirectory.course_id = 'attacks'\n"
        f"c.Exchange.root = {str(base / 'exchange')!r}\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JUPYTER", "AMP_LESSONS"))}
    env.update(HOME=str(home), INSTRUCTOR_TOKEN=attacks.SECRET, AMP_LESSONS_PROGRESS_FILE="off")
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    generated = nbgrader("generate_assignment", ASSIGNMENT, "--force", cwd=instructor, env=env)
    assert generated.returncode == 0, generated.stdout + generated.stderr

    submitted = course / "submitted"
    classmate = submitted / "classmate" / ASSIGNMENT / f"{LESSON}.ipynb"
    values = {
        "CLASSMATE": classmate,
        "CLASSMATE_GLOB": f"{submitted}/*/*/*.ipynb",
        "GRADES": course / "gradebook.db",
        "SECRET_REVERSED": attacks.SECRET[::-1],
        "INSTRUCTOR_HOME": home,
    }
    for kind in ["honest", *STUDENTS]:
        path = _write(base / "work", kind, values)
        target = submitted / kind / ASSIGNMENT / f"{LESSON}.ipynb"
        target.parent.mkdir(parents=True)
        target.write_bytes(path.read_bytes())
    for lesson in attacks.IN_KERNEL_ONCE:
        attacks.write_lesson_forgery(submitted / "forged_in_kernel" / ASSIGNMENT, lesson)
    classmate.parent.mkdir(parents=True)
    classmate.write_bytes((submitted / "honest" / ASSIGNMENT / f"{LESSON}.ipynb").read_bytes())
    (submitted / "symlink" / ASSIGNMENT).mkdir(parents=True)
    (submitted / "symlink" / ASSIGNMENT / f"{LESSON}.ipynb").symlink_to(classmate)
    (submitted / "broken" / ASSIGNMENT).mkdir(parents=True)
    (submitted / "broken" / ASSIGNMENT / f"{LESSON}.ipynb").write_text("{ not json")
    before = classmate.read_bytes()

    started = time.monotonic()
    run = nbgrader("autograde", ASSIGNMENT, "--create", cwd=instructor, env=env)
    seconds = time.monotonic() - started
    log = run.stdout + run.stderr
    feedback = nbgrader("generate_feedback", ASSIGNMENT, cwd=instructor, env=env)
    time.sleep(2.0)  # a detached process would rewrite the gradebook or a classmate's file now
    students = ["honest", "classmate", "symlink", "broken", *STUDENTS]
    scores = {}
    with nbgrader_api.Gradebook(f"sqlite:///{course / 'gradebook.db'}") as book:
        for student in students:
            try:
                scores[student] = book.find_grade(CELL, LESSON, ASSIGNMENT, student).score
            except nbgrader_api.MissingEntry:
                scores[student] = None  # nbgrader could not grade it at all
        forged = {
            cell.name: cell.score
            for lesson in attacks.IN_KERNEL_ONCE
            for cell in _grades_of(book, lesson, "forged_in_kernel")
        }
    return {
        "forged_in_kernel": forged,
        "scores": scores,
        "log": log,
        "feedback": feedback.stdout + feedback.stderr,
        "course": str(course),
        "classmate": [str(classmate), before.hex()],
        "seconds": seconds,
        "count": len(students) + len(attacks.IN_KERNEL_ONCE),
    }


def _grades_of(book, lesson: str, student: str) -> list:
    notebook = book.find_submission_notebook(Path(lesson).stem, ASSIGNMENT, student)
    return [grade for grade in notebook.grades]


def test_a_check_once_judged_in_the_kernel_cannot_be_forged_there(autograded):
    """The forged notebooks of 05.2, 06.1, 07.1 and 09.1 (the check name, the harness and what runs around the
    learner's code patched in the kernel, a wrong answer): 0 points for each of their checks."""
    checks = {"check_texture_forward", "check_save_checkpoint", "check_time_step", "check_synced_train_step"}
    assert checks <= set(autograded["forged_in_kernel"]), autograded["forged_in_kernel"]
    assert not any(autograded["forged_in_kernel"].values()), autograded["forged_in_kernel"]


def _autograded(course: Path, student: str) -> dict:
    return json.loads((course / "autograded" / student / ASSIGNMENT / f"{LESSON}.ipynb").read_text())


def _check_outputs(course: Path, student: str) -> list:
    cells = _autograded(course, student)["cells"]
    return [c["outputs"] for c in cells if c.get("metadata", {}).get("nbgrader", {}).get("grade_id") == CELL][
        0
    ]


def test_honest_learners_get_full_marks(autograded):
    assert autograded["scores"]["honest"] == 1.0 and autograded["scores"]["classmate"] == 1.0, autograded[
        "log"
    ]


@pytest.mark.parametrize("kind", list(attacks.ATTACKS))
def test_every_attack_scores_nothing_in_the_gradebook(autograded, kind):
    student = STUDENT_OF.get(kind, kind)
    assert not autograded["scores"][student], (kind, student, autograded["scores"][student])


def test_links_and_broken_files_score_nothing(autograded):
    assert not autograded["scores"]["symlink"]
    assert not autograded["scores"]["broken"]


def test_a_pass_is_text_and_a_failure_shows_the_learners_message(autograded):
    course = autograded["course"]
    [passed] = _check_outputs(course, "honest")
    assert passed["output_type"] == "stream" and "[PASS]" in "".join(passed["text"])
    [failed] = _check_outputs(course, STUDENT_OF["patch_harness"])
    assert failed["output_type"] == "error" and "Not done yet" in failed["evalue"]
    assert not any("harness.py" in line or "Traceback" in line for line in failed["traceback"])
    warnings = [line for line in autograded["log"].splitlines() if "WARNING" in line]
    assert not [line for line in warnings if "partial" in line.lower() or "could not" in line.lower()], (
        warnings
    )


def test_no_secret_reaches_autograded_notebooks_or_feedback(autograded):
    course = autograded["course"]
    for path in [*(course / "autograded").rglob("*.ipynb"), *(course / "feedback").rglob("*.html")]:
        assert attacks.SECRET not in path.read_text(errors="replace"), path
    assert list((course / "feedback").rglob("*.html")), autograded["feedback"]


@pytest.mark.skipif(not SANDBOXED, reason="ending detached processes for sure needs bubblewrap")
def test_nothing_outlives_autograde(autograded):
    classmate, before = autograded["classmate"]
    assert classmate.read_bytes() == before
    assert autograded["scores"]["honest"] == 1.0


def test_autograde_time(autograded, capsys):
    with capsys.disabled():
        print(f"\nnbgrader autograde: {autograded['count']} notebooks in {autograded['seconds']:.0f} s")


attacks.BUILDERS["nbgrader_attacks"] = (
    _autograde_all  # see attacks.shared_run: the other suite's worker may build it
)
