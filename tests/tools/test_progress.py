"""`python -m amp_lessons progress` and the record it reads: each known exercise as passed / attempted (last
message) / not started; concurrent checks lose no attempt; malformed entries are repaired or set aside."""

import json
import re
import subprocess
import sys

from amp_lessons.core import record
from amp_lessons.l00_start_here.check import check_autocast_matmul
from amp_lessons.tools import cli, progress

WARM_UP = check_autocast_matmul.exercise


def test_known_exercises_come_from_the_checkers_in_lesson_order():
    known = progress.known_exercises()
    assert WARM_UP in known
    assert known == sorted(known, key=progress.exercise_sort_key)
    labels = sorted(["01.10 b", "01.2 a", "00 z", "02.1 c"], key=progress.exercise_sort_key)
    assert labels == ["00 z", "01.2 a", "01.10 b", "02.1 c"]


def test_summarize_states(private_progress):
    record.record("00 a", False, "failed", "You used the wrong dtype.\nsecond line")
    record.record("00 a", True, "passed", "Well done.")
    record.record("00 b", False, "not done", "Not done yet: still raises NotImplementedError.")
    record.record("99 retired", False, "failed", "from an older course version")
    rows = {r["exercise"]: r for r in progress.summarize(known=["00 a", "00 b", "00 c"])}
    assert list(rows) == ["00 a", "00 b", "00 c", "99 retired"]
    assert rows["00 a"]["state"] == "passed" and rows["00 a"]["attempts"] == 2
    assert rows["00 a"]["first_passed"]
    assert rows["00 b"]["state"] == "attempted" and rows["00 b"]["last_status"] == "not done"
    assert rows["00 c"]["state"] == "not started" and rows["00 c"]["attempts"] == 0
    assert rows["99 retired"]["state"] == "attempted"
    text = progress.format_summary(list(rows.values()))
    assert re.search(
        r"^00 b +attempted \(1 attempt, last: not done\)\n +Not done yet: still raises", text, re.M
    )
    assert re.search(r"^00 c +not started$", text, re.M)
    assert text.endswith("1 of 4 exercises passed, 2 attempted, 1 not started.")


def test_progress_command_lists_every_known_exercise(private_progress, capsys):
    check_autocast_matmul(lambda a, b, dtype: a @ b)  # forgets autocast: recorded as a failed attempt
    assert cli.main(["progress"]) == 0
    out = capsys.readouterr().out
    assert f"Progress record: {private_progress}" in out
    lines = out.splitlines()
    index = next(i for i, line in enumerate(lines) if line.startswith(WARM_UP))
    assert lines[index].endswith("attempted (1 attempt, last: failed)")
    assert lines[index + 1].strip().startswith("For dtype=torch.bfloat16 the result is still float32")
    assert any("not started" in line for line in out.splitlines())  # the other lessons' exercises

    check_autocast_matmul(_autocast_matmul)
    cli.main(["progress"])
    line = next(line for line in capsys.readouterr().out.splitlines() if line.startswith(WARM_UP))
    assert "passed 20" in line  # passed <timestamp>


def _autocast_matmul(a, b, dtype):
    import torch

    with torch.autocast(device_type=a.device.type, dtype=dtype):
        return a @ b


def test_corrupt_record_is_reported_and_set_aside(private_progress, capsys):
    private_progress.write_text('{"version": 1, "exercises": {"00 a": {"att')  # a half-written file
    assert cli.main(["progress"]) == 0
    out = capsys.readouterr().out
    assert "warning: The progress record" in out and "could not be read" in out and "moved it to" in out
    assert not private_progress.exists()
    assert any(p.name.startswith("progress.json.corrupt-") for p in private_progress.parent.iterdir())
    assert "0 of" in out and "exercises passed" in out
    record.record(WARM_UP, True, "passed", "ok")  # and recording carries on in a fresh file
    assert json.loads(private_progress.read_text())["exercises"][WARM_UP]["passed"]


def test_another_learners_record_and_switched_off(tmp_path, monkeypatch, capsys):
    other = tmp_path / "alice.json"
    record.record(WARM_UP, True, "passed", "ok", path=other)
    assert cli.main(["progress", "--file", str(other)]) == 0
    assert f"Progress record: {other}" in capsys.readouterr().out
    monkeypatch.setenv("AMP_LESSONS_PROGRESS_FILE", "off")
    assert cli.main(["progress"]) == 0
    assert "switched off" in capsys.readouterr().out


def test_module_entry_point(private_progress):
    run = subprocess.run(
        [sys.executable, "-m", "amp_lessons", "progress"], capture_output=True, text=True, timeout=120
    )
    assert run.returncode == 0, run.stderr
    assert "nothing recorded yet" in run.stdout and WARM_UP in run.stdout


RECORD_MANY = """
import sys
from pathlib import Path
from amp_lessons.core import record

path, who = Path(sys.argv[1]), sys.argv[2]
for attempt in range(25):
    passed = attempt == 24 and who == "b"
    record.record("00 shared", passed, "passed" if passed else "failed", who, path=path)
    record.record(f"00 only {who}", False, "failed", str(attempt), path=path)
"""


def test_two_processes_recording_at_once_keep_every_attempt(tmp_path):
    path = tmp_path / "progress.json"
    runs = [subprocess.Popen([sys.executable, "-c", RECORD_MANY, str(path), who]) for who in ("a", "b")]
    assert [run.wait(timeout=120) for run in runs] == [0, 0]
    exercises = json.loads(path.read_text())["exercises"]
    assert exercises["00 shared"]["attempts"] == 50, "an attempt was lost"
    assert exercises["00 shared"]["passed"] is True, "a pass recorded during another write was erased"
    assert exercises["00 only a"]["attempts"] == exercises["00 only b"]["attempts"] == 25


def test_malformed_entries_are_repaired_or_set_aside(private_progress, capsys):
    private_progress.write_text(
        json.dumps(
            {
                "version": 1,
                "exercises": {
                    "00 counted as text": {"attempts": "3", "passed": False, "last_message": ["not", "text"]},
                    "00 passed as text": {"attempts": 1, "passed": "yes"},
                    "00 not an object": [1, 2],
                    "00 fine": {"attempts": 2, "passed": True},
                },
            }
        )
    )
    warnings = []
    data = record.load(warn=warnings.append)
    assert data["exercises"]["00 counted as text"]["attempts"] == 3
    assert data["exercises"]["00 counted as text"]["last_message"] == '["not", "text"]'
    assert "00 passed as text" not in data["exercises"] and "00 not an object" not in data["exercises"]
    assert len(warnings) == 2 and all("set aside" in w for w in warnings)

    assert cli.main(["progress"]) == 0  # the summary shows the repaired record, with the warnings
    out = capsys.readouterr().out
    assert "warning: The progress record" in out and "'passed' is 'yes'" in out

    record.record("00 counted as text", True, "passed", "ok")  # recording goes on, keeping what was set aside
    saved = json.loads(private_progress.read_text())
    assert saved["exercises"]["00 counted as text"]["attempts"] == 4
    assert saved["exercises"]["00 fine"] == {"attempts": 2, "passed": True}
    assert {entry["exercise"] for entry in saved["set_aside"]} == {"00 passed as text", "00 not an object"}
    assert saved["set_aside"][0]["entry"] is not None and saved["set_aside"][0]["reason"]


def test_hints_are_listed_and_counted(private_progress):
    record.record_hint("00 a", 2)
    record.record("00 b", False, "failed", "wrong")
    record.record_hint("00 b", 1)
    record.record("00 c", True, "passed", "ok")
    record.record_hint("00 c", 3)
    rows = {r["exercise"]: r for r in progress.summarize(known=["00 a", "00 b", "00 c"])}
    assert rows["00 a"]["state"] == "not started" and rows["00 a"]["hints"] == 2  # hints, but no check yet
    assert rows["00 b"]["hints"] == 1 and rows["00 c"]["hints"] == 3
    text = progress.format_summary(list(rows.values()))
    assert re.search(r"^00 a +not started \(2 hints seen\)$", text, re.M)
    assert re.search(r"^00 b +attempted \(1 attempt, last: failed; 1 hint\)$", text, re.M)
    assert re.search(r"^00 c +passed \S+ \(3 hints\)$", text, re.M)
    assert text.endswith("1 of 3 exercises passed, 1 attempted, 1 not started; 6 hints used.")
    assert progress.counts(list(rows.values())) == {
        "exercises": 3,
        "passed": 1,
        "attempted": 1,
        "not started": 1,
        "hints": 6,
    }


def test_the_progress_view_of_one_lesson_and_of_the_course(private_progress):
    label = next(label for label in progress.known_exercises() if label.startswith("01.1"))
    record.record(label, False, "failed", "wrong")
    record.record_hint(label, 2)
    view = progress.show_progress("01")
    assert [r["exercise"][:2] for r in view.rows()] == ["01", "01"]
    text = str(view)
    assert text.startswith("Your progress on lesson 01's exercises")
    assert "0 of 2 exercises passed, 1 attempted, 1 not started; 2 hints used." in text
    assert f"record: {private_progress}" in text
    html = view.html()
    assert "amp-progress" in html and "✏️ attempted" in html and "hints used" in html
    course = progress.show_progress()
    assert course.title == "Your progress in the course" and len(course.rows()) == len(
        progress.known_exercises()
    )
    assert "this lesson has no exercises" in str(progress.show_progress("42"))


def test_the_progress_widget_refreshes_from_the_record(private_progress):
    bundle = progress.show_progress("02")._repr_mimebundle_()
    assert "application/vnd.jupyter.widget-view+json" in bundle and bundle["text/plain"].startswith("Your")
    form = progress.show_progress("02").widget()
    shown, refresh = form.children
    assert "0 of 2 exercises passed, 0 attempted, 2 not started." in shown.value
    label = next(label for label in progress.known_exercises() if label.startswith("02.1"))
    record.record(label, True, "passed", "ok")
    refresh.click()
    assert "1 of 2 exercises passed" in shown.value and "✅ passed" in shown.value


def test_switched_off_recording_says_so_in_the_view(monkeypatch):
    monkeypatch.setenv("AMP_LESSONS_PROGRESS_FILE", "off")
    assert "recording is switched off" in str(progress.show_progress("01"))
