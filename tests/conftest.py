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
