"""The progress record belongs to one course folder (two clones never mix), unless a variable moves it."""

import json
from pathlib import Path

from amp_lessons.core import record
from amp_lessons.tools import cli

ROOT = Path(__file__).resolve().parents[2]


def make_course(folder: Path) -> Path:
    (folder / "notebooks").mkdir(parents=True)
    (folder / "notebooks" / "00_start_here.ipynb").write_text("{}")
    (folder / "amp_lessons").mkdir()
    return folder


def test_the_default_record_is_in_the_course_folder(monkeypatch):
    monkeypatch.delenv("AMP_LESSONS_PROGRESS_FILE")
    assert record.is_course_folder(ROOT)
    assert record.progress_path() == ROOT / ".amp_lessons" / "progress.json"
    assert record.default_progress_path() == record.progress_path()


def test_two_clones_keep_two_records(tmp_path, monkeypatch):
    monkeypatch.setattr(record, "repo_root", lambda: tmp_path / "site-packages")  # a non-editable install
    first, second = make_course(tmp_path / "clone-a"), make_course(tmp_path / "clone-b")
    a = record.default_progress_path(first / "exercises")
    b = record.default_progress_path(second / "notebooks")
    assert a == first / ".amp_lessons" / "progress.json" and b == second / ".amp_lessons" / "progress.json"
    record.record("00 x", True, "passed", "ok", path=a)
    assert not b.exists() and json.loads(a.read_text())["exercises"]["00 x"]["passed"]
    assert (first / ".amp_lessons" / ".gitignore").read_text().splitlines()[-1] == "*"  # git never lists it
    assert record.course_folder(tmp_path) is None
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert record.default_progress_path(tmp_path) == tmp_path / "home" / ".amp_lessons" / "progress.json"


def test_the_variable_still_moves_it_and_the_command_reads_the_same_default(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("AMP_LESSONS_PROGRESS_FILE", str(tmp_path / "mine.json"))
    assert record.progress_path() == tmp_path / "mine.json"
    monkeypatch.delenv("AMP_LESSONS_PROGRESS_FILE")
    monkeypatch.setattr(record, "repo_root", lambda: make_course(tmp_path / "clone"))
    assert cli.main(["progress"]) == 0
    assert (
        f"Progress record: {tmp_path / 'clone' / '.amp_lessons' / 'progress.json'}" in capsys.readouterr().out
    )


def test_a_hint_count_that_is_not_a_count_is_dropped_not_the_entry():
    repaired, reason = record.repair_entry({"attempts": 2, "passed": True, "hints": "lots"})
    assert reason == "" and repaired["hints"] == 0 and repaired["passed"] is True
    assert record.repair_entry({"attempts": 1, "passed": False, "hints": "2"})[0]["hints"] == 2
