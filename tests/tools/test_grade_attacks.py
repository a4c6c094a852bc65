"""`python -m amp_lessons grade` against every attack class of issue 21, in one grading run.

The attacks (``tests/fixtures/grade_submissions/attacks.py``) are lesson 00's warm-up exercise left undone
plus cells that try to score anyway: patching the harness, ``CheckResult``, the reporter or a ``check_*``
name in the kernel; IPython input transformers; the environment switches; writing the verdict channel from
the answer function or a background thread (and forging protocol frames); executing ``solutions/``' cells
found through ``amp_lessons.__file__``; importing the checker; reading classmates' submissions through
/proc or relative paths; symlinked and broken submissions; processes that outlive grading and rewrite the
table or a classmate's file; the instructor's secrets from the environment and home; a 2 MB error message;
killing the grader; the network; lesson 07's check 07.1 (once judged in the kernel) forged there. Each must earn 0 points or a refusal, change no other learner's file or
row, and leak no secret; an honest learner and a classmate still pass.

Protections that need the bubblewrap sandbox (hidden files, no network, every process ended) are asserted
when ``sandbox.kind()`` is bubblewrap, which ``apt-get install bubblewrap`` gives; the judge's separation
(verdicts computed outside the kernel) holds with every sandbox and is asserted always.
"""

from __future__ import annotations

import csv
import json
import os
import time
from pathlib import Path

import graded_cells
import pytest

from amp_lessons.tools import cli
from amp_lessons.tools.grade import sandbox, table
from amp_lessons.tools.grade.worker import MESSAGE_LIMIT

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "grade_submissions"
SOURCE = FIXTURES / "source"
attacks = graded_cells.attacks()  # one module for both suites: they share its BUILDERS

SANDBOXED = sandbox.kind() == sandbox.BWRAP
needs_bwrap = pytest.mark.skipif(
    not SANDBOXED, reason="hiding files needs bubblewrap: apt-get install bubblewrap"
)
BROKEN = {
    "not_json": b"{ this is not json",
    "not_a_notebook": b'{"cells": "no", "nbformat": 4}',
    "binary": bytes(range(256)) * 4,
    "empty": b"",
}


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    """Every attack, two honest learners, broken and linked files, graded once (2 at a time)."""
    found = attacks.shared_run(tmp_path_factory, "grade_attacks", _grade_all)
    found["grades"] = Path(found["grades"])
    found["classmate"] = (Path(found["classmate"][0]), bytes.fromhex(found["classmate"][1]))
    return found


def _grade_all(base: Path) -> dict:
    base.mkdir()
    folder, home = base / "submissions", base / "instructor_home"
    home.mkdir()
    (home / ".secret_token").write_text(attacks.SECRET)
    grades = base / "out" / "grades.csv"
    classmate = attacks.write(folder, "honest").parent.rename(folder / "classmate") / attacks.NOTEBOOK
    values = {
        "CLASSMATE": classmate,
        "CLASSMATE_GLOB": f"{folder}/*/*.ipynb",
        "GRADES": grades,
        "SECRET_REVERSED": attacks.SECRET[::-1],
        "INSTRUCTOR_HOME": home,
    }
    attacks.write(folder, "honest", **values)
    for student in attacks.students():
        attacks.write_submission(folder, student, values)
    for name, data in BROKEN.items():
        (folder / name).mkdir()
        (folder / name / attacks.NOTEBOOK).write_bytes(data)
    (folder / "symlink").mkdir()
    (folder / "symlink" / attacks.NOTEBOOK).symlink_to(classmate)
    (folder / "fifo").mkdir()
    os.mkfifo(folder / "fifo" / attacks.NOTEBOOK)
    (folder / "folder" / attacks.NOTEBOOK).mkdir(parents=True)
    source = base / "source"
    source.mkdir()
    (source / attacks.NOTEBOOK).write_bytes((SOURCE / attacks.NOTEBOOK).read_bytes())
    for lesson in attacks.IN_KERNEL_ONCE:  # the checks that were judged in the kernel: forged there, 0 here
        (source / lesson).write_bytes((attacks.COURSE / "solutions" / lesson).read_bytes())
        attacks.write_lesson_forgery(folder / "forged_in_kernel", lesson)
    before = classmate.read_bytes()

    patch = pytest.MonkeyPatch()
    patch.setenv("HOME", str(home))
    patch.setenv("INSTRUCTOR_TOKEN", attacks.SECRET)
    patch.chdir(base)
    started = time.monotonic()
    try:
        code = cli.main(
            [
                "grade",
                "submissions",
                "--source",
                str(source),
                "--timeout",
                "30",
                "--jobs",
                "2",
                "--csv",
                str(grades),
            ]
        )
    finally:
        patch.undo()
    seconds = time.monotonic() - started
    time.sleep(2.0)  # a detached process would rewrite the table now
    with open(grades, newline="", encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle))
    return {
        "code": code,
        "rows": {Path(r["learner_file"]).parent.name: r for r in rows},
        "exercises": {f"{Path(r['learner_file']).parent.name} {r['exercise']}": r for r in rows},
        "grades": str(grades),
        "classmate": [str(classmate), before.hex()],
        "seconds": seconds,
    }


def test_checks_once_judged_in_the_kernel_cannot_be_forged_there(graded):
    """The checks whose learner code needs something around it in the kernel: 05.2's op trace, 06.1's
    injected faults, 07.1's recorders (its clock stays with the judge), 09.1's two gloo ranks. Patching the
    check name, the harness and what runs in the kernel, with a wrong answer, scores nothing."""
    forged = {k: r for k, r in graded["exercises"].items() if k.startswith("forged_in_kernel ")}
    assert {r["exercise"] for r in forged.values()} >= set(attacks.ONCE_IN_KERNEL_EXERCISES), forged
    for found in forged.values():
        assert found["passed"] == "False" and found["status"] != "passed", found
        assert "forged" not in found["message"]


def test_honest_learners_still_pass(graded):
    assert graded["code"] == 0
    for case in ("honest", "classmate"):
        assert graded["rows"][case]["status"] == "passed", graded["rows"][case]


@pytest.mark.parametrize("kind", list(attacks.ATTACKS))
def test_every_attack_scores_nothing(graded, kind):
    found = graded["rows"][attacks.student_of(kind)]
    assert found["passed"] == "False", found
    assert found["status"] != "passed"
    assert "forged" not in found["message"]


def test_the_judge_ran_the_real_check_on_the_stub(graded):
    """Patching the kernel's harness or check names, transformers and switches change nothing: the check
    ran in the judge on the learner's untouched stub."""
    for kind in (
        "patch_harness",
        "patch_check_name",
        "input_transformer",
        "env_switches",
        "verdict_from_answer",
    ):
        found = graded["rows"][attacks.student_of(kind)]
        assert found["status"] in ("not done", "failed"), found
    assert "raised an error: LearnerProblem" in graded["rows"]["verdict_from_answer"]["message"]


@needs_bwrap
def test_answers_and_classmates_are_out_of_reach(graded):
    for kind in ("solutions_cells", "classmates_files", "reference_implementation"):
        assert graded["rows"][kind]["status"] in ("not done", "failed", "not attempted"), graded["rows"][kind]
    assert graded["rows"]["solutions_cells"]["status"] == "not done"
    assert graded["rows"]["classmates_files"]["status"] == "not done"
    assert "was reachable" not in graded["rows"]["network"]["message"]


def test_links_and_broken_files_are_refused(graded):
    rows = graded["rows"]
    assert rows["symlink"]["status"] == "unreadable" and "symbolic link" in rows["symlink"]["message"]
    for case in ("fifo", "folder"):
        assert rows[case]["status"] == "unreadable" and "not a regular file" in rows[case]["message"]
    for case in BROKEN:
        assert rows[case]["status"] == "unreadable", rows[case]


def test_no_secret_in_any_output(graded):
    text = graded["grades"].read_text(encoding="utf-8") + table.learners_path(graded["grades"]).read_text()
    assert attacks.SECRET not in text
    assert "LEAK" in graded["rows"]["secrets"]["message"], "the attack's own message is what the table shows"


def test_a_huge_message_is_capped(graded):
    message = graded["rows"]["huge_message"]["message"]
    assert len(message) <= MESSAGE_LIMIT and "cut by the grader" in message
    assert max(len(v) for r in graded["rows"].values() for v in r.values()) <= table.CELL_LIMIT


@needs_bwrap
def test_nothing_outlives_grading_and_the_tables_are_sealed(graded):
    classmate, before = graded["classmate"]
    assert classmate.read_bytes() == before, "an attack changed a classmate's submission"
    assert cli.main(["grade", "--verify", str(graded["grades"])]) == 0, "the table changed after grading"
    assert graded["rows"]["classmate"]["status"] == "passed"


def test_killing_the_grader_costs_only_its_own_row(graded):
    rows = graded["rows"]
    assert rows[attacks.student_of("kill_grader")]["passed"] == "False"
    assert rows["honest"]["status"] == "passed" and len(rows) >= len(attacks.students()) + 8


def test_the_learners_table_has_a_row_and_total_per_learner(graded):
    with open(table.learners_path(graded["grades"]), newline="", encoding="utf-8") as handle:
        learners = {r["learner"]: r for r in csv.DictReader(handle)}
    assert learners["honest"]["passed"] == "1" and learners["honest"]["exercises"] == "1"
    assert learners[attacks.student_of("patch_harness")]["passed"] == "0"
    assert set(learners) >= {"honest", "classmate", *attacks.students()}


def test_verify_notices_a_changed_table(graded, tmp_path, capsys):
    copy = tmp_path / "grades.csv"
    copy.write_bytes(graded["grades"].read_bytes())
    (tmp_path / "grades_learners.csv").write_bytes(table.learners_path(graded["grades"]).read_bytes())
    (tmp_path / "grades.csv.sha256").write_bytes(Path(f"{graded['grades']}.sha256").read_bytes())
    assert cli.main(["grade", "--verify", str(copy)]) == 0
    copy.write_text(copy.read_text().replace("not done", "passed"))
    assert cli.main(["grade", "--verify", str(copy)]) == 1
    assert "changed after grading" in capsys.readouterr().err
    digest = table.fingerprint(graded["grades"])
    assert cli.main(["grade", "--verify", str(copy), "--sha256", digest]) == 1


def test_grading_time(graded, capsys):
    with capsys.disabled():
        count = len(graded["rows"])
        print(f"\ngrade: {count} notebooks in {graded['seconds']:.0f} s with --jobs 2 ({sandbox.kind()})")
    assert json.dumps(graded["rows"])  # the rows are plain data


attacks.BUILDERS["grade_attacks"] = (
    _grade_all  # see attacks.shared_run: the other suite's worker may build it
)
