"""`python -m amp_lessons doctor`: one line per missing piece with the command that fixes it, no traceback.

The first two tests moved here from tests/test_quiz_progress_env.py (same names) when the probes became
``probe_*`` (``check_*`` names the exercise checkers).
"""

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from amp_lessons.core import environment
from amp_lessons.tools import doctor
from amp_lessons.tools.doctor import probe_torch, probe_widgets, run_doctor

ROOT = Path(__file__).resolve().parents[2]

# nbgrader 0.9.6 needs Python 3.11 (requirements-dev.txt): on older Pythons make test-min has no nbgrader
needs_nbgrader = pytest.mark.skipif(
    importlib.util.find_spec("nbgrader") is None, reason="nbgrader is not installed (it needs Python 3.11+)"
)


def test_torch_version_parsing_and_doctor_checks():
    assert environment.torch_version_tuple("2.14.1+cu130") == (2, 14)
    assert environment.torch_version_tuple("2.4.0a0") == (2, 4)
    assert doctor.version_tuple("2.14.1+cu130") == (2, 14) and doctor.version_tuple("2.4.0a0") == (2, 4)
    assert not probe_torch("2.3.1").ok and probe_torch("2.4.0").ok
    assert probe_widgets("8.1.5", "3.0.13", "4.2.0").ok
    bad = probe_widgets("7.8.0", "3.0.13", "4.2.0")
    assert not bad.ok and f"{doctor.PYTHON} -m pip install" in bad.next_step
    assert not probe_widgets(None, "3.0.1", "4.0.0").ok


def test_doctor_reports_ready_here():
    lines = []
    code = run_doctor(out=lines.append)
    text = "\n".join(lines)
    assert code == 0, text
    assert "READY" in text and "Environment card" in text
    assert "the notebooks' kernel can import amp_lessons" in text


def test_no_probe_is_named_like_a_checker():
    assert not [name for name in vars(doctor) if name.startswith("check_")]


def test_a_missing_python3_kernel_is_not_ready(monkeypatch):
    monkeypatch.setattr(doctor, "kernel_python", lambda: (None, "no kernel named python3 is installed"))
    lines = []
    assert run_doctor(out=lines.append) == 1
    text = "\n".join(lines)
    assert "[FAIL] the python3 kernel is installed: no kernel named python3 is installed" in text
    assert f"next step: {doctor.PYTHON} -m ipykernel install --sys-prefix" in text
    assert text.splitlines()[-1].startswith("NOT READY")


def test_a_probe_that_breaks_is_one_line(monkeypatch):
    def broken():
        raise RuntimeError("the kernel spec folder is unreadable")

    monkeypatch.setattr(doctor, "probe_kernel_spec", broken)
    lines = []
    assert run_doctor(out=lines.append) == 1
    text = "\n".join(lines)
    assert "could not be checked (RuntimeError: the kernel spec folder is unreadable)" in text
    assert "Traceback" not in text


def test_doctor_in_an_empty_venv_says_what_to_install(tmp_path):
    """A venv with nothing in it (not even pip): each missing piece is a line with its fix, exit 1."""
    subprocess.run(
        [sys.executable, "-m", "venv", "--without-pip", str(tmp_path / "empty")], check=True, timeout=120
    )
    python = tmp_path / "empty" / ("Scripts" if os.name == "nt" else "bin") / "python"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
    env["PYTHONPATH"] = str(ROOT)  # the course folder: `python -m amp_lessons` finds it when run from there
    run = subprocess.run(
        [str(python), "-m", "amp_lessons", "doctor"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    text = run.stdout + run.stderr
    assert run.returncode == 1, text
    assert "Traceback" not in text
    for piece in (
        "pip",
        "numpy",
        "torch",
        "ipykernel",
        "the python3 kernel is installed",
        "widgets work in JupyterLab",
    ):
        assert f"[FAIL] {piece}" in text, piece
    assert f"next step: {python} -m ensurepip --upgrade" in text
    assert f"next step: {python} -m pip install 'torch>=2.4'" in text
    assert f"next step: {python} -m pip install 'numpy>=1.24'" in text
    assert text.strip().splitlines()[-1].startswith("NOT READY")


def test_module_can_be_imported_without_numpy_or_torch():
    code = "import sys; sys.modules['torch'] = sys.modules['numpy'] = None; import amp_lessons.tools.doctor"
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr


# ----------------------------------------------------------------------------- doctor --instructor


def make_course(tmp_path, monkeypatch, exchange_mode=0o1777, inbound_mode=0o2733, released=True):
    """A course folder (nbgrader_config.py loading the course's own, course/ moved here) and an exchange."""
    import json

    folder, exchange = tmp_path / "course-folder", tmp_path / "exchange"
    (folder / "course").mkdir(parents=True)
    (folder / "nbgrader_config.py").write_text(
        f"load_subconfig({str(ROOT / 'nbgrader_config.py')!r})  # noqa: F821\n"
        f"get_config().CourseDirectory.root = {str(folder / 'course')!r}  # noqa: F821\n"
    )
    monkeypatch.setenv("AMP_LESSONS_EXCHANGE", str(exchange))
    monkeypatch.delenv("AMP_LESSONS_COURSE_ID", raising=False)
    monkeypatch.setattr("shutil.which", lambda name: f"/venv/bin/{name}")
    from amp_lessons.tools import learner_config

    monkeypatch.setattr(learner_config, "user_config_path", lambda: tmp_path / "home" / "nbgrader_config.py")
    monkeypatch.setattr(
        learner_config, "sys_prefix_config_path", lambda: tmp_path / "prefix" / "nbgrader_config.py"
    )
    graded = {"cell_type": "code", "metadata": {"nbgrader": {"grade": True, "points": 1}}, "source": ""}
    for assignment in ("mixed_precision", "mixed_precision_core"):
        for kind in ("source", "release") if released else ("source",):
            (folder / "course" / kind / assignment).mkdir(parents=True)
            (folder / "course" / kind / assignment / "01_x.ipynb").write_text(
                json.dumps({"cells": [graded] * 2})
            )
    if exchange_mode is not None:
        exchange.mkdir()
        exchange.chmod(exchange_mode)
        course_folder = exchange / "mixed-precision-validated"
        (course_folder / "outbound" / "mixed_precision").mkdir(parents=True)
        (course_folder / "inbound").mkdir()
        (course_folder / "inbound").chmod(inbound_mode)
        (course_folder / "outbound").chmod(0o755)
    return folder, exchange


def instructor_doctor(folder):
    lines = []
    code = doctor.run_instructor_doctor(out=lines.append, folder=folder)
    return code, "\n".join(lines)


@needs_nbgrader
def test_instructor_doctor_is_ready_when_all_is_in_place(tmp_path, monkeypatch):
    folder, exchange = make_course(tmp_path, monkeypatch)
    code, text = instructor_doctor(folder)
    assert code == 0, text
    assert "[ok] nbgrader: 0.9" in text
    assert "[ok] assignment mixed_precision_core: 1 notebook, 2 points" in text
    assert f"[ok] the exchange folder: {exchange} (mode 1777)" in text
    assert "inbound 733, outbound 755; released: mixed_precision" in text
    assert "learners run `python -m amp_lessons learner-config --exchange " in text
    assert text.splitlines()[-1] == "READY"


@needs_nbgrader
def test_instructor_doctor_says_what_to_do_before_anything_exists(tmp_path, monkeypatch):
    folder, exchange = make_course(tmp_path, monkeypatch, exchange_mode=None, released=False)
    monkeypatch.setattr("shutil.which", lambda name: None)
    code, text = instructor_doctor(folder)
    assert code == 1 and "Traceback" not in text
    assert "[FAIL] nbgrader's helper programs are on PATH: alembic is not on PATH" in text
    assert "next step: source " in text
    assert (
        "[FAIL] assignment mixed_precision: 1 notebook, 2 points (one per graded check); not generated yet"
        in text
    )
    assert "next step: nbgrader generate_assignment mixed_precision --force" in text
    assert f"[FAIL] the exchange folder: {exchange} does not exist" in text
    assert f"next step: sudo install -d -m 1777 {exchange}" in text
    assert (
        "next step: nbgrader release_assignment mixed_precision  (a 3-hour room: mixed_precision_core)"
        in text
    )
    assert text.splitlines()[-1].startswith("NOT READY: 5 check(s) failed")


@needs_nbgrader
def test_instructor_doctor_names_wrong_permissions(tmp_path, monkeypatch):
    folder, exchange = make_course(tmp_path, monkeypatch, exchange_mode=0o777, inbound_mode=0o777)
    code, text = instructor_doctor(folder)
    assert code == 1
    assert "without the sticky bit any account can delete the course's folder" in text
    assert f"next step: sudo chmod +t {exchange}" in text
    assert "inbound should be mode 733 (hand in, not list): chmod 2733" in text
    exchange.chmod(0o755)
    assert f"{exchange} (mode 0755): learners cannot write to it" in instructor_doctor(folder)[1]


@needs_nbgrader
def test_instructor_doctor_finds_a_learner_config_that_disagrees(tmp_path, monkeypatch):
    from amp_lessons.tools import learner_config

    folder, _ = make_course(tmp_path, monkeypatch)
    stale = learner_config.sys_prefix_config_path()
    stale.parent.mkdir(parents=True)
    stale.write_text(learner_config.render("another-course", "/elsewhere"))
    code, text = instructor_doctor(folder)
    assert code == 1
    assert (
        f"[FAIL] the learners' nbgrader settings: {stale} sets course_id 'another-course', exchange '/elsewhere'"
        in text
    )
    assert "--sys-prefix --force" in text
    stale.write_text(learner_config.render("mixed-precision-validated", str(tmp_path / "exchange"), "alice"))
    assert "sets student_id 'alice'" in instructor_doctor(folder)[1], "one name for every account"


def test_instructor_doctor_without_nbgrader_or_config(tmp_path, monkeypatch):
    versions = {"nbgrader": None}
    monkeypatch.setattr(doctor, "installed_version", lambda name: versions.get(name, "1.0"))
    code, text = instructor_doctor(tmp_path)
    assert code == 1 and "Traceback" not in text
    assert "[FAIL] nbgrader: not installed for" in text and "next step: make instructor" in text
    assert f"[FAIL] the course's nbgrader settings: cannot read {tmp_path / 'nbgrader_config.py'}" in text
    versions["nbgrader"] = "0.8.5"
    assert (
        "[FAIL] nbgrader: 0.8.5 (the course is tested with >=0.9.6,<0.10)" in instructor_doctor(tmp_path)[1]
    )


def test_doctor_instructor_on_the_command_line():
    from amp_lessons.tools import cli

    args = cli.build_parser().parse_args(["doctor", "--instructor"])
    assert args.instructor and args.run is cli.cmd_doctor


def test_the_torchao_note_says_what_lessons_10_and_11_skip(monkeypatch):
    from amp_lessons.core import optional_libraries
    from amp_lessons.tools import doctor

    broken = optional_libraries.Support(
        "torchao", False, None, "torchao 0.18.0 does not import on torch 2.4.1"
    )
    monkeypatch.setattr(optional_libraries, "torchao_support", lambda: broken)
    note = doctor.torchao_note()
    assert "skip their torchao sections" in note and "does not import on torch 2.4.1" in note
    assert "pip install -U torch torchao" in note
    working = optional_libraries.Support("torchao", True, "0.18.0", "")
    monkeypatch.setattr(optional_libraries, "torchao_support", lambda: working)
    assert doctor.torchao_note().startswith("note: torchao 0.18.0 imports here")
