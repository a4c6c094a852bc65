"""`python -m amp_lessons doctor`: one line per missing piece with the command that fixes it, no traceback.

The first two tests moved here from tests/test_quiz_progress_env.py (same names) when the probes became
``probe_*`` (``check_*`` names the exercise checkers).
"""

import os
import subprocess
import sys
from pathlib import Path

from amp_lessons.core import environment
from amp_lessons.tools import doctor
from amp_lessons.tools.doctor import probe_torch, probe_widgets, run_doctor

ROOT = Path(__file__).resolve().parents[2]


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
