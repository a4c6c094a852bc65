"""`python -m amp_lessons learner-config`: the nbgrader settings a learner needs (course id, exchange, a name)."""

import sys

import pytest

from amp_lessons.tools import cli, learner_config

COURSE_ID = "mixed-precision-validated"


@pytest.fixture
def learner(tmp_path, monkeypatch):
    """A learner's account: HOME in tmp_path, the exchange moved there, the terminal in HOME."""
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("JUPYTER_CONFIG_DIR", raising=False)
    monkeypatch.delenv("AMP_LESSONS_COURSE_ID", raising=False)
    monkeypatch.setenv("AMP_LESSONS_EXCHANGE", str(tmp_path / "exchange"))
    monkeypatch.chdir(home)
    return home


def test_own_account_writes_the_users_jupyter_config(learner, tmp_path, capsys):
    assert cli.main(["learner-config"]) == 0
    path = learner / ".jupyter" / "nbgrader_config.py"
    assert learner_config.read_learner_config(path) == {
        "course_id": COURSE_ID,
        "exchange": str(tmp_path / "exchange"),
    }
    out = capsys.readouterr().out
    assert f"wrote {path}" in out and "nbgrader fetch_assignment mixed_precision" in out
    assert cli.main(["learner-config"]) == 0, "the same file again is fine"


def test_a_shared_account_names_the_learner_in_their_folder(learner, tmp_path):
    folder = learner / "alice"
    folder.mkdir()
    import os

    os.chdir(folder)
    assert cli.main(["learner-config", "--student", "alice"]) == 0
    found = learner_config.read_learner_config(folder / "nbgrader_config.py")
    assert found["student_id"] == "alice" and found["course_id"] == COURSE_ID
    assert not (learner / ".jupyter").exists(), "another learner of the same account is not named alice"


@pytest.mark.parametrize("name", ["a*b", "a+b", "../x", "", "-x"])
def test_names_nbgrader_cannot_use_are_refused(learner, name):
    assert cli.main(["learner-config", f"--student={name}"]) == 2


def test_other_settings_are_kept_unless_forced(learner, capsys):
    path = learner / ".jupyter" / "nbgrader_config.py"
    path.parent.mkdir()
    path.write_text("c = get_config()\nc.Exchange.root = '/somewhere/else'\n")
    assert cli.main(["learner-config"]) == 1
    assert "add --force" in capsys.readouterr().err and "somewhere" in path.read_text()
    assert cli.main(["learner-config", "--force"]) == 0 and "somewhere" not in path.read_text()


def test_sys_prefix_print_and_explicit_values(learner, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(sys, "prefix", str(tmp_path / "venv"))
    assert cli.main(["learner-config", "--sys-prefix", "--course-id", "other", "--exchange", "/x"]) == 0
    written = tmp_path / "venv" / "etc" / "jupyter" / "nbgrader_config.py"
    assert learner_config.read_learner_config(written) == {"course_id": "other", "exchange": "/x"}
    assert cli.main(["learner-config", "--sys-prefix", "--student", "alice"]) == 2
    capsys.readouterr()
    assert cli.main(["learner-config", "--print"]) == 0
    assert f"c.CourseDirectory.course_id = {COURSE_ID!r}" in capsys.readouterr().out


def test_the_file_is_what_nbgrader_reads(learner, tmp_path):
    """nbgrader's own config loading (what fetch_assignment and submit do) finds course id, exchange and name."""
    pytest.importorskip("nbgrader", reason="nbgrader is for instructors: pip install -r requirements-dev.txt")
    from nbgrader.apps.submitapp import SubmitApp

    (learner / "nbgrader_config.py").write_text(learner_config.render("c-1", "/ex", "bob"))
    app = SubmitApp()
    app.load_config_file()
    assert app.config.CourseDirectory.course_id == "c-1" and app.config.Exchange.root == "/ex"
    assert app.config.CourseDirectory.student_id == "bob"


def test_the_defaults_are_what_the_course_config_sets(monkeypatch):
    """learner-config does not run the course's nbgrader_config.py (it imports nbgrader); both must agree."""
    pytest.importorskip("nbgrader", reason="the course's nbgrader_config.py imports nbgrader")
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    for course_id, exchange in ((None, None), ("other-course", "/srv/exchange")):
        for name, value in (("AMP_LESSONS_COURSE_ID", course_id), ("AMP_LESSONS_EXCHANGE", exchange)):
            if value is None:
                monkeypatch.delenv(name, raising=False)
            else:
                monkeypatch.setenv(name, value)
        settings = learner_config.course_settings(root)
        assert (settings.course_id, settings.exchange) == learner_config.learner_defaults()
