"""`python -m amp_lessons grade`: learners' notebooks run headless, one row per exercise, files untouched.

The fixture folder ``tests/fixtures/grade_submissions/`` holds lesson 00's warm-up exercise
(``check_autocast_matmul``) answered five ways, so these tests do not depend on lessons in progress:
correct, untouched, wrong (casts by hand), hanging (an endless loop before the check), crashing (the
kernel exits) and an error before the check; a corrupt (truncated) notebook is added at test time
(ruff lints every committed ``.ipynb``, so a broken one cannot live in the repository).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pandas as pd
import pytest

from amp_lessons.checks.l00_start import check_autocast_matmul
from amp_lessons.tools import cli, grade

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "grade_submissions"
WARM_UP = check_autocast_matmul.exercise
TIMEOUT = 20  # seconds per notebook: the hanging one costs exactly this


@pytest.fixture
def submissions(tmp_path, monkeypatch):
    folder = tmp_path / "submissions"
    shutil.copytree(FIXTURES, folder)
    text = (folder / "correct.ipynb").read_text(encoding="utf-8")
    cut = text.index("from amp_lessons.checks import check_autocast_matmul")
    (folder / "corrupt.ipynb").write_text(text[:cut], encoding="utf-8")  # cut off mid-save, before its check
    (folder / ".ipynb_checkpoints").mkdir()
    (folder / ".ipynb_checkpoints" / "correct-checkpoint.ipynb").write_text(text, encoding="utf-8")  # ignored
    monkeypatch.chdir(tmp_path)
    return folder


def test_grade_a_folder_of_submissions(submissions, tmp_path, capsys, private_progress):
    before = {p.name: p.read_bytes() for p in submissions.glob("*.ipynb")}
    csv = tmp_path / "out" / "grades.csv"

    assert cli.main(["grade", "submissions", "--timeout", str(TIMEOUT), "--csv", str(csv)]) == 0

    printed = capsys.readouterr().out
    table = pd.read_csv(csv, keep_default_na=False)
    assert list(table.columns) == grade.COLUMNS
    rows = {Path(r.learner_file).name: r for r in table.itertuples()}
    assert sorted(rows) == sorted(before), "one row per notebook (one exercise each), checkpoints skipped"
    assert all(r.learner_file.startswith("submissions/") for r in table.itertuples())

    def check(name, status, *words, exercise=WARM_UP):
        row = rows[name]
        assert (row.status, row.exercise) == (status, exercise), row
        assert bool(row.passed) == (status == grade.PASSED), row
        for word in words:
            assert word in row.message, row

    check("correct.ipynb", "passed", "chosen by autocast")
    check("untouched.ipynb", "not done", "NotImplementedError")
    check("wrong.ipynb", "failed", "casts by hand")
    check("hanging.ipynb", "timed out", f"stopped after {TIMEOUT} s in cell 2", "before this check ran")
    check("crashing.ipynb", "kernel died", "kernel died in cell 2", "before this check ran")
    check("error_before_check.ipynb", "not attempted", "never ran", "RuntimeError")
    check("corrupt.ipynb", "unreadable", "not valid JSON", exercise=grade.WHOLE_NOTEBOOK)
    assert rows["hanging.ipynb"].seconds < TIMEOUT + 15, "the hanging notebook was not stopped in time"

    # the learners' files are exactly as they were, and nothing was written next to them
    assert {p.name: p.read_bytes() for p in submissions.glob("*.ipynb")} == before
    assert sorted(p.name for p in submissions.iterdir()) == sorted([*before, ".ipynb_checkpoints"])
    # grading kernels recorded into their own temporary files, not the instructor's record
    assert not private_progress.exists()

    assert "Per learner file:" in printed and f"Wrote {csv}" in printed
    assert "submissions/correct.ipynb: 1 of 1 passed" in printed
    assert "submissions/hanging.ipynb: 0 of 1 passed (timed out)" in printed


def test_no_notebooks_is_an_error(tmp_path, capsys):
    assert cli.main(["grade", str(tmp_path), "--csv", str(tmp_path / "g.csv")]) == 2
    assert "No notebooks found" in capsys.readouterr().err
    assert not (tmp_path / "g.csv").exists()


def test_find_notebooks_skips_checkpoints_and_keeps_missing_files(submissions):
    found = grade.find_notebooks([submissions, submissions / "correct.ipynb", "nowhere.ipynb"])
    names = [p.name for p in found]
    assert "correct-checkpoint.ipynb" not in names
    assert names.count("correct.ipynb") == 1 and names[-1] == "nowhere.ipynb"
    rows = grade.grade_notebook("nowhere.ipynb", checkers={})
    assert rows[0]["status"] == grade.UNREADABLE and "No such file" in rows[0]["message"]


def test_a_damaged_notebook_still_names_the_exercises_it_can(tmp_path):
    text = (FIXTURES / "correct.ipynb").read_text(encoding="utf-8")
    damaged = tmp_path / "damaged.ipynb"
    damaged.write_text(text[: text.rindex("check_autocast_matmul(") + 40], encoding="utf-8")
    rows = grade.grade_notebook(damaged)
    assert [(r["exercise"], r["status"], r["passed"]) for r in rows] == [(WARM_UP, grade.UNREADABLE, False)]
    assert "not valid JSON" in rows[0]["message"]


def _notebook(*sources, metadata=None):
    cells = [{"cell_type": "code", "source": s, "metadata": {}, "outputs": [], "execution_count": None} for s in sources]
    return {"cells": cells, "metadata": metadata or {}, "nbformat": 4, "nbformat_minor": 4}


def test_expected_exercises_come_from_the_solution_and_the_notebook(tmp_path, monkeypatch):
    (tmp_path / "solutions").mkdir()
    solution = _notebook("check_first(f)", "check_second(g)\ncheck_first(f)")
    (tmp_path / "solutions" / "42_topic.ipynb").write_text(json.dumps(solution))
    monkeypatch.setattr(grade, "repo_root", lambda: tmp_path)
    checkers = {"check_first": "42.1 first", "check_second": "42.2 second", "check_extra": "42.3 extra"}

    learner = _notebook("check_first(mine)")  # deleted the second check cell
    assert grade.expected_exercises(Path("alice_42_topic.ipynb"), learner, checkers) == ["42.1 first", "42.2 second"]
    by_metadata = _notebook(metadata={"amp_lessons": {"generated_from": "solutions/42_topic.ipynb"}})
    assert grade.expected_exercises(Path("renamed.ipynb"), by_metadata, checkers) == ["42.1 first", "42.2 second"]
    own = _notebook("check_extra(x)", "not_a_check(y)", "print(check_unknown)")
    assert grade.expected_exercises(Path("notes.ipynb"), own, checkers) == ["42.3 extra"]


def test_results_can_be_read_from_outputs():
    result = check_autocast_matmul(None)
    notebook = _notebook("check(x)", "print(check(y))")
    notebook["cells"][0]["outputs"] = [{"output_type": "execute_result", "data": {"text/plain": str(result)}}]
    notebook["cells"][1]["outputs"] = [{"output_type": "stream", "name": "stdout", "text": "[PASS] Passed — 01.1 x\nGood.\n"}]
    found = grade.results_from_outputs(notebook)
    assert found[WARM_UP]["last_status"] == "failed" and "got None" in found[WARM_UP]["last_message"]
    assert found["01.1 x"]["passed"] and found["01.1 x"]["last_message"] == "Good."


def test_checkers_carry_their_exercise_label():
    from amp_lessons.checks import registry

    known = registry.declared_checks()
    assert known["check_autocast_matmul"] == WARM_UP
    assert all(name.startswith("check_") for name in known)


def test_summary_text():
    table = pd.DataFrame([
        grade._row("a.ipynb", "00 x", "passed", "fine", 1.0),
        grade._row("a.ipynb", "00 y", "failed", "m" * 200, 1.0),
        grade._row("b.ipynb", grade.WHOLE_NOTEBOOK, "unreadable", "broken", 0.0),
    ], columns=grade.COLUMNS)
    text = grade.summary(table)
    assert "a.ipynb: 1 of 2 passed (1 passed, 1 failed; 1.0 s)" in text
    assert "b.ipynb: 0 of 0 passed (1 unreadable" in text
    assert "m" * 200 not in text and "..." in text
    assert grade.summary(table.iloc[0:0]) == "No notebooks graded."
