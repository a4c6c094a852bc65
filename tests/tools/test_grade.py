"""`python -m amp_lessons grade`: check cells from the course's source, verdicts through the grader's channel,
one worker per notebook, rows written as they finish, escaped output.

``tests/fixtures/grade_submissions/`` (written by its ``make_fixtures.py``) holds a one-exercise course
(``source/00_warm_up.ipynb``: lesson 00's warm-up ``check_autocast_matmul`` with nbgrader metadata) and
submissions made from its exercise, one folder per case: correct, untouched, wrong, hanging, crashing, an
error before the check, two forgeries (the check cell edited into a print of the pass text; the check cell
deleted, a print without metadata and writes to the progress record and the results file in its place) and a
notebook that kills its grading process. Tests grade them with ``--source`` so they do not depend on lessons
in progress. Every attack class of issue 21 is in test_grade_attacks.py (and, through nbgrader,
test_nbgrader_attacks.py).
"""

from __future__ import annotations

import csv
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

import amp_lessons.checks.harness as harness
from amp_lessons.core import record
from amp_lessons.l00_start_here.check import check_autocast_matmul
from amp_lessons.tools import cli
from amp_lessons.tools.exercises import course
from amp_lessons.tools.grade import codec, grade, judge, sandbox, table
from amp_lessons.tools.grade import worker as grade_worker

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "grade_submissions"
SOURCE = FIXTURES / "source"
WARM_UP = check_autocast_matmul.exercise
TIMEOUT = 20  # seconds per notebook: the hanging one costs exactly this
NOTEBOOK = "00_warm_up.ipynb"


@pytest.fixture
def submissions(tmp_path, monkeypatch):
    folder = tmp_path / "submissions"
    shutil.copytree(FIXTURES / "learners", folder)
    text = (folder / "correct" / NOTEBOOK).read_text(encoding="utf-8")
    (folder / "corrupt").mkdir()
    cut = text.index("check_autocast_matmul")
    (folder / "corrupt" / NOTEBOOK).write_text(text[:cut], encoding="utf-8")  # cut off mid-save
    (folder / "correct" / ".ipynb_checkpoints").mkdir()
    (folder / "correct" / ".ipynb_checkpoints" / "00_warm_up-checkpoint.ipynb").write_text(text)  # ignored
    monkeypatch.chdir(tmp_path)
    return folder


def read_rows(path: Path) -> list[dict]:
    with open(path, newline="", encoding="utf-8") as handle:
        return list(csv.DictReader(handle))


def by_case(rows) -> dict:
    return {Path(r["learner_file"]).parent.name: r for r in rows}


def test_grade_a_folder_of_submissions(submissions, tmp_path, capsys, private_progress, monkeypatch):
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    before = {p: p.read_bytes() for p in submissions.rglob("*.ipynb")}
    out = tmp_path / "out" / "grades.csv"
    shutil.copytree(SOURCE, tmp_path / "source")  # named relative to the cwd: the worker runs elsewhere

    code = cli.main(
        [
            "grade",
            "submissions",
            "--source",
            "source",
            "--timeout",
            str(TIMEOUT),
            "--jobs",
            "2",
            "--csv",
            str(out),
        ]
    )

    assert code == 0
    printed = capsys.readouterr().out
    rows = read_rows(out)
    assert list(rows[0]) == grade.COLUMNS
    cases = by_case(rows)
    assert len(rows) == len(cases) == 10, "one row per notebook (one exercise each), checkpoints skipped"
    assert all(r["learner_file"].startswith("submissions/") for r in rows)

    def check(case, status, *words, exercise=WARM_UP):
        found = cases[case]
        assert (found["status"], found["exercise"]) == (status, exercise), found
        assert found["passed"] == str(status == grade.PASSED), found
        for word in words:
            assert word in found["message"], found

    check("correct", "passed", "chosen by autocast")
    check("untouched", "not done", "NotImplementedError")
    check("wrong", "failed", "casts by hand")
    check("hanging", "timed out", f"stopped after {TIMEOUT} s in cell 2", "before this check ran")
    check("crashing", "kernel died", "kernel died in cell 2", "before this check ran")
    check("error_before_check", "not attempted", "NameError", "first error: cell 2", "RuntimeError")
    check("corrupt", "unreadable", "not valid JSON")
    # forged: the course's check cell runs on the untouched stub whatever the learner printed or recorded
    check("forged_print", "not done", "NotImplementedError")
    check("forged_unmarked", "not done", "NotImplementedError")
    if sandbox.kind() == sandbox.PLAIN:  # the kernel's parent is the grading process: it can kill it
        check("kills_parent", "grader killed", "stopped its grading process", "in cell 2")
    else:  # in its own process namespace the kernel's kill reaches nothing of the grader's
        check("kills_parent", "passed", "chosen by autocast")
    assert float(cases["hanging"]["seconds"]) < TIMEOUT + 15, "the hanging notebook was not stopped in time"
    assert {r["exercise"] for r in rows} == {WARM_UP}, "an exercise label the course does not have is no row"

    # the learners' files are exactly as they were, and nothing was written next to them
    assert {p: p.read_bytes() for p in submissions.rglob("*.ipynb")} == before
    # grading kernels never touch the instructor's record (they record nowhere)
    assert not private_progress.exists()
    assert list(scratch.iterdir()) == [], "grading left temporary folders behind"

    assert "Per learner file:" in printed and f"Wrote {out}" in printed
    assert "submissions/correct/00_warm_up.ipynb: 1 of 1 passed" in printed
    assert "submissions/hanging/00_warm_up.ipynb: 0 of 1 passed (timed out)" in printed
    assert f"SHA-256 {table.fingerprint(out)}  grades.csv" in printed
    assert cli.main(["grade", "--verify", str(out)]) == 0
    learners = {r["learner"]: r for r in read_rows(table.learners_path(out))}
    assert learners["correct"]["passed"] == "1" and learners["untouched"]["passed"] == "0"


SPY = r"""import json, os, subprocess, sys
found = {"env": dict(os.environ), "parent": ""}
try:
    with open(f"/proc/{os.getppid()}/environ", "rb") as handle:
        found["parent"] = handle.read().decode(errors="replace")
except OSError as exc:
    found["parent"] = f"refused: {exc}"
with open(SPY_FILE, "w") as handle:
    json.dump(found, handle)
# a process that leaves the kernel's process group and keeps writing (it could rewrite the grades later)
LOOP = "import time\nwhile True:\n    open(LATE_FILE, 'w').write(repr(time.time()))\n    time.sleep(0.2)"
subprocess.Popen([sys.executable, "-c", LOOP], start_new_session=True)
"""


def test_a_notebook_cannot_read_secrets_or_outlive_its_grading(tmp_path, monkeypatch):
    """The weakest sandbox (a process group, where neither bubblewrap nor unshare works): the kernel still
    gets a minimal environment and the processes it started, even detached ones, are ended. (With
    bubblewrap the spy could not even write its file: see test_grade_attacks.py.)"""
    monkeypatch.setenv("INSTRUCTOR_SECRET", "hunter2")
    monkeypatch.setenv(sandbox.SANDBOX_VARIABLE, sandbox.PLAIN)
    correct = json.loads((FIXTURES / "learners" / "correct" / NOTEBOOK).read_text(encoding="utf-8"))
    spy_file, late_file = tmp_path / "spy.json", tmp_path / "late.txt"
    code = SPY.replace("SPY_FILE", repr(str(spy_file))).replace("LATE_FILE", repr(str(late_file)))
    correct["cells"].insert(
        1, {"cell_type": "code", "metadata": {}, "outputs": [], "execution_count": None, "source": code}
    )
    (tmp_path / "spy").mkdir()
    (tmp_path / "spy" / NOTEBOOK).write_text(json.dumps(correct))

    rows = grade.grade([tmp_path / "spy"], timeout=TIMEOUT, sources=SOURCE)

    assert [(r["status"], r["passed"]) for r in rows] == [("passed", True)]
    found = json.loads(spy_file.read_text())
    assert "INSTRUCTOR_SECRET" not in found["env"], "the kernel got the instructor's environment"
    assert found["env"]["HOME"] != os.environ["HOME"] and "AMP_LESSONS_RESULTS_FILE" not in found["env"]
    assert "hunter2" not in found["parent"], "the worker (the kernel's parent) carried the secret"
    assert late_file.exists(), "the detached process never ran"
    last = late_file.read_text()
    time.sleep(1.5)
    assert late_file.read_text() == last, "a process the notebook started outlived its grading"


def test_killed_or_interrupted_grader_keeps_every_finished_row(submissions, tmp_path):
    """Ctrl-C, then a kill: the CSV holds the finished notebook's row and says the other was not graded."""
    folder = tmp_path / "two"
    for case in ("correct", "hanging"):
        shutil.copytree(submissions / case, folder / case)
    out = tmp_path / "grades.csv"
    command = [
        sys.executable,
        "-m",
        "amp_lessons",
        "grade",
        str(folder),
        "--source",
        str(SOURCE),
        "--timeout",
        "60",
        "--csv",
        str(out),
    ]
    for stop, code in ((signal.SIGINT, 130), (signal.SIGKILL, -signal.SIGKILL)):
        process = subprocess.Popen(command, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and not (
            out.exists() and "passed" in by_case(read_rows(out)).get("correct", {}).get("status", "")
        ):
            time.sleep(0.2)
        process.send_signal(stop)
        process.communicate(timeout=60)
        assert process.returncode == code
        cases = by_case(read_rows(out))
        assert cases["correct"]["status"] == "passed"
        assert cases["hanging"]["status"] == grade.NOT_GRADED
        assert "run grade again" in cases["hanging"]["message"]
        out.unlink()


def test_bad_output_path_is_refused_before_grading(submissions, tmp_path, capsys):
    (tmp_path / "folder.csv").mkdir()
    blocked = tmp_path / "file"
    blocked.write_text("x")
    for target, words in (
        (tmp_path / "folder.csv", "is a folder"),
        (blocked / "grades.csv", "cannot write"),
        (tmp_path / "x.ipynb", "names a notebook"),
    ):
        assert cli.main(["grade", "submissions", "--csv", str(target)]) == 2
        err = capsys.readouterr().err
        assert words in err and "Nothing was graded" in err
    assert not (tmp_path / "x.ipynb").exists()


def test_a_source_folder_without_course_notebooks_is_refused(submissions, tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    for folder in ("empty", "no-such-folder"):
        assert cli.main(["grade", "submissions", "--source", folder, "--csv", str(tmp_path / "g.csv")]) == 2
        assert "no course notebooks NN_topic.ipynb there" in capsys.readouterr().err
    assert not (tmp_path / "g.csv").exists()


def test_no_notebooks_is_an_error(tmp_path, capsys):
    assert cli.main(["grade", str(tmp_path), "--csv", str(tmp_path / "g.csv")]) == 2
    assert "No notebooks found" in capsys.readouterr().err
    assert not (tmp_path / "g.csv").exists()


def test_find_notebooks_skips_checkpoints_and_keeps_missing_files(submissions):
    found = grade.find_notebooks([submissions, submissions / "correct" / NOTEBOOK, "nowhere.ipynb"])
    names = [str(p) for p in found]
    assert not any("checkpoint" in name for name in names)
    assert names.count(str(submissions / "correct" / NOTEBOOK)) == 1 and names[-1] == "nowhere.ipynb"


def test_lesson_is_told_by_metadata_or_name_never_by_a_stray_number(tmp_path):
    sources = {
        "01_precision_formats": tmp_path / "01.ipynb",
        "06_checkpoint_and_rollback": tmp_path / "06.ipynb",
    }
    tell = course.lesson_source
    assert tell(Path("backup 06_12 lesson01.ipynb"), None, sources) is None
    generated = {"metadata": {"amp_lessons": {"generated_from": "solutions/01_precision_formats.ipynb"}}}
    assert tell(Path("backup 06_12 lesson01.ipynb"), generated, sources) == sources["01_precision_formats"]
    assert tell(Path("alice_01_precision_formats.ipynb"), None, sources) == sources["01_precision_formats"]
    assert tell(Path("06_mine.ipynb"), None, sources) == sources["06_checkpoint_and_rollback"]
    assert tell(Path("notes.ipynb"), None, sources) is None


def test_an_unknown_lesson_is_said_plainly(tmp_path):
    (tmp_path / "notes.ipynb").write_text(json.dumps({"cells": [], "metadata": {}, "nbformat": 4}))
    rows = grade.grade([tmp_path / "notes.ipynb"], sources=SOURCE)
    assert [(r["exercise"], r["status"]) for r in rows] == [(grade.WHOLE_NOTEBOOK, grade.UNKNOWN_LESSON)]
    assert "00_warm_up.ipynb" in rows[0]["message"]


def test_check_cells_are_restored_from_the_source():
    source = json.loads((SOURCE / NOTEBOOK).read_text(encoding="utf-8"))
    forged = json.loads((FIXTURES / "learners" / "forged_unmarked" / NOTEBOOK).read_text(encoding="utf-8"))
    runnable, restored = course.restore_check_cells(forged, source)
    [(index, identifier)] = restored.items()
    assert identifier == "check_autocast_matmul" and index == 2, "put back right after the solution cell"
    assert course.cell_source(runnable["cells"][index]) == course.cell_source(source["cells"][2])
    assert len(runnable["cells"]) == len(forged["cells"]) + 1, "the learner's own cells stay"
    edited = json.loads((FIXTURES / "learners" / "forged_print" / NOTEBOOK).read_text(encoding="utf-8"))
    runnable, restored = course.restore_check_cells(edited, source)
    assert "[PASS]" not in json.dumps(runnable) and list(restored) == [2]


def test_the_judge_runs_only_a_check_cell_it_understands():
    known = {"check_autocast_matmul": WARM_UP}
    source = "from amp_lessons.checks import check_autocast_matmul\n\ncheck_autocast_matmul(autocast_matmul)"
    assert judge.parse_check_cell(source, known) == [("check_autocast_matmul", ["autocast_matmul"])]
    for odd in ("check_autocast_matmul(autocast_matmul); import os", "check_autocast_matmul(f())", "x = 1"):
        with pytest.raises(ValueError):
            judge.parse_check_cell(odd, known)


def test_what_comes_back_from_the_kernel_is_read_as_data_only(tmp_path):
    """A pickle in the tensor payload is refused (weights_only); references, kinds and states are checked."""
    import io
    import pickle

    import torch

    marker = tmp_path / "ran"

    class Evil:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    with pytest.raises(codec.DecodeError):
        codec.Decoder({}, pickle.dumps([Evil()], protocol=2), None)
    assert not marker.exists()
    buffer = io.BytesIO()
    torch.save([torch.ones(2)], buffer)
    decoder = codec.Decoder({7: [1]}, buffer.getvalue(), None)
    assert decoder.decode({"t": "tensor", "i": 0}).tolist() == [1.0, 1.0]
    assert decoder.decode({"t": "ref", "i": 7}) == [1]
    for bad in (
        {"t": "ref", "i": 8},
        {"t": "tensor", "i": 3},
        {"t": "pickle", "v": ""},
        {"t": "atom", "v": 2},
    ):
        with pytest.raises(codec.DecodeError):
            decoder.decode(bad)
    with pytest.raises(codec.DecodeError):
        decoder.states({"99": {"t": "list", "v": []}})
    odd = decoder.decode({"t": "opaque", "type": "Forged", "repr": "[PASS]"})
    assert type(odd).__name__ == "Forged" and odd != True  # noqa: E712  (never equal to anything)


def test_state_changed_in_the_kernel_comes_back_to_the_judges_objects():
    """A model, optimizer and scaler sent to the kernel, stepped there, and the judge's own objects updated."""
    import torch

    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    payload, memo = codec.dump_call((model, optimizer), {}, {})
    (k_model, k_optimizer), _, _, k_memo = codec.load_call(payload)
    encoder = codec.Encoder(k_memo, lambda fn: 1)
    k_model(torch.ones(1, 3)).sum().backward()
    k_optimizer.step()
    states = encoder.states()
    decoder = codec.Decoder(memo, encoder.payload(), None)
    codec.apply_states(decoder.states(states))
    assert torch.equal(model.weight, k_model.weight) and torch.equal(model.weight.grad, k_model.weight.grad)
    assert optimizer.state[model.weight]["momentum_buffer"].shape == model.weight.shape


def test_the_harness_reports_to_the_grader_only_when_asked(tmp_path, monkeypatch):
    results = tmp_path / "results.jsonl"
    check_autocast_matmul(None)
    assert not results.exists()
    monkeypatch.setenv(record.RESULTS_FILE_VARIABLE, str(results))
    with harness.demonstration():
        check_autocast_matmul(None)  # a lesson's demonstration is never a verdict
    assert not results.exists()
    check_autocast_matmul(None)
    [line] = results.read_text().splitlines()
    assert json.loads(line)["exercise"] == WARM_UP and json.loads(line)["passed"] is False


def test_under_nbgrader_a_check_that_does_not_pass_raises(monkeypatch):
    monkeypatch.setenv("NBGRADER_EXECUTION", "autograde")
    assert harness.strict_mode() == "1"
    with pytest.raises(AssertionError):
        check_autocast_matmul(None)
    monkeypatch.setenv("AMP_LESSONS_STRICT", "")  # an explicit setting wins
    assert harness.strict_mode() == ""


def test_worker_statuses_match_the_harness():
    for name in ("PASSED", "FAILED", "NOT_DONE", "CHECKER_BUG"):
        assert getattr(grade_worker, name) == getattr(harness, name)


def test_cells_are_safe_for_terminals_and_spreadsheets():
    assert table.safe_text("\x1b[31mred\x1b[0m\x07 \u202eevil\nline") == "red\\x07 \\u202eevil line"
    assert table.csv_cell('=HYPERLINK("http://x","y")') == '\'=HYPERLINK("http://x","y")'
    assert table.csv_cell("-1 + 2") == "'-1 + 2" and table.csv_cell(1.5) == 1.5
    text = table.csv_text([grade_worker.row("=cmd|' /C calc'!A0", WARM_UP, "failed", "\x1b[2Jboom", 1.0)])
    assert "\x1b" not in text and "'=cmd" in text


def test_summary_text():
    rows = [
        grade_worker.row("a.ipynb", "00 x", "passed", "fine", 1.0),
        grade_worker.row("a.ipynb", "00 y", "failed", "m" * 200, 1.0),
        grade_worker.row("b.ipynb", grade.WHOLE_NOTEBOOK, "unreadable", "broken", 0.0),
    ]
    text = grade.summary(rows)
    assert "a.ipynb: 1 of 2 passed (1 passed, 1 failed; 1.0 s)" in text
    assert "b.ipynb: 0 of 0 passed (1 unreadable" in text


def test_checkers_carry_their_exercise_label():
    from amp_lessons.checks import registry

    known = registry.declared_checks()
    assert known["check_autocast_matmul"] == WARM_UP
    assert all(name.startswith("check_") for name in known)


def test_the_sandbox_keeps_every_folder_python_imports_from(tmp_path, monkeypatch):
    """A .pth file can put another environment's site-packages on sys.path (the hub's .venv-hub sees the
    course's .venv that way). Under /tmp, which bubblewrap replaces by an empty one, it must come back
    read-only, or the kernel cannot import torch (every notebook then "kernel died")."""
    from amp_lessons.tools.grade import sandbox

    other = tmp_path / "course" / ".venv" / "lib" / "site-packages"
    other.mkdir(parents=True)
    monkeypatch.setattr(sys, "path", [*sys.path, str(other)])
    assert other.resolve() in sandbox._python_folders()
    command = sandbox._bwrap(tmp_path / "scratch", [], ([], []))
    binds = {tuple(command[i : i + 3]) for i in range(len(command) - 2)}
    assert ("--ro-bind", str(other.resolve()), str(other.resolve())) in binds
