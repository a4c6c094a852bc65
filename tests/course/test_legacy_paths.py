"""Exercise copies learners already hold import the flat layout's paths: they keep working for one release, with a
DeprecationWarning that names the new path (amp_lessons/legacy_paths.py, removal date in CHANGELOG.md)."""

import importlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

from amp_lessons import legacy_paths

ROOT = Path(__file__).resolve().parents[2]


def test_every_old_path_is_the_new_module_and_warns():
    """One fresh interpreter imports every old path (a fresh one, so no new module is loaded beforehand)."""
    code = (
        "import importlib, json, warnings\n"
        "from amp_lessons import legacy_paths\n"
        "found = {}\n"
        "for old in sorted(legacy_paths.MOVED):\n"
        "    with warnings.catch_warnings(record=True) as seen:\n"
        "        warnings.simplefilter('always')\n"
        "        module = importlib.import_module('amp_lessons.' + old)\n"
        "    found[old] = [module.__name__, [str(w.message) for w in seen if w.category is DeprecationWarning]]\n"
        "print(json.dumps(found))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    found = json.loads(out)
    assert set(found) == set(legacy_paths.MOVED)
    for old, (name, warned) in found.items():
        new = f"amp_lessons.{legacy_paths.MOVED[old]}"
        assert name == new, old
        assert any(
            f"amp_lessons.{old} has moved to {new}" in w and legacy_paths.REMOVAL in w for w in warned
        ), old


def test_the_split_utils_module_still_offers_every_name():
    with pytest.warns(DeprecationWarning, match="amp_lessons.utils has moved"):
        sys.modules.pop("amp_lessons.utils", None)
        utils = importlib.import_module("amp_lessons.utils")
    from amp_lessons.core.files import atomic_write
    from amp_lessons.l03_autocast_and_gradscaler import step_was_skipped

    assert utils.atomic_write is atomic_write and utils.step_was_skipped is step_was_skipped
    assert set(legacy_paths.UTILS) <= set(dir(utils))


def test_an_old_exercise_cell_runs_as_written():
    """The import lines of the previous release's exercises, e.g. lesson 04's and lesson 05's."""
    code = (
        "from amp_lessons.validation import Criteria, compare, decide\n"
        "from amp_lessons.training import train_step\n"
        "from amp_lessons.quiz import lesson_quiz\n"
        "from amp_lessons import data\n"
        "from amp_lessons.checks import check_decide\n"
        "print(Criteria.__module__, compare.__module__, len(lesson_quiz('04')) > 0, callable(check_decide))\n"
    )
    run = subprocess.run(
        [sys.executable, "-W", "always::DeprecationWarning", "-c", code],
        capture_output=True,
        text=True,
        check=True,
    )
    assert run.stdout.split() == [
        "amp_lessons.l04_baseline_and_decision_boundary.criteria",
        "amp_lessons.l04_baseline_and_decision_boundary.validation",
        "True",
        "True",
    ]
    assert "amp_lessons.validation has moved" in run.stderr and "<string>:1" in run.stderr


def test_the_removal_date_is_in_the_changelog():
    assert legacy_paths.REMOVAL in (ROOT / "CHANGELOG.md").read_text(encoding="utf-8")
