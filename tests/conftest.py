"""Shared test set-up: CPU-safe plotting, a private progress file, and notebook helpers."""

import os
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # plain pytest only; notebook kernels keep their inline backend

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))

import pytest  # noqa: E402


@pytest.fixture(autouse=True)
def private_progress(tmp_path, monkeypatch):
    """Checks record progress; keep each test's record in its own temporary file."""
    path = tmp_path / "progress.json"
    monkeypatch.setenv("AMP_LESSONS_PROGRESS_FILE", str(path))
    monkeypatch.delenv("AMP_LESSONS_STRICT", raising=False)
    return path


@pytest.fixture
def strict(monkeypatch):
    monkeypatch.setenv("AMP_LESSONS_STRICT", "1")


def pytest_report_header(config):
    import torch

    return (
        f"amp_lessons tests: torch {torch.__version__}, "
        f"device override {os.environ.get('AMP_LESSONS_DEVICE', '-')}"
    )


# The files whose tests take a minute or more each (grading runs, a hub, a site build, JupyterLab in a
# browser), longest first. They start the run: under pytest-xdist the two workers then share out the many
# short tests at the end instead of one worker finishing a long test alone while the other waits.
LONG_FIRST = (
    "tests/tools/test_grade_attacks.py",
    "tests/deploy/test_hub.py",
    "tests/tools/test_nbgrader_attacks.py",
    "tests/course/test_site.py",
    "tests/tools/test_workshop.py",
    "tests/course/test_browser.py",
)


def pytest_collection_modifyitems(session, config, items):
    def rank(item) -> int:
        path = Path(str(item.fspath)).resolve().relative_to(ROOT).as_posix()
        return LONG_FIRST.index(path) if path in LONG_FIRST else len(LONG_FIRST)

    items.sort(key=rank)  # stable: the order inside each file and among the other files is kept
