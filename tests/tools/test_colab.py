"""The notebooks' first cell: it installs the course on Colab, and does nothing anywhere else.

Both are simulated: the cell's code runs here with and without a fake ``google.colab`` module in ``sys.modules``,
``subprocess.run`` replaced by a recorder, and the test asserts what the cell would have run.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import types
from pathlib import Path

import pytest

from amp_lessons.tools import colab

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = sorted(
    path
    for folder in ("notebooks", "solutions", "exercises")
    for path in (ROOT / folder).glob("[0-9][0-9]_*.ipynb")
)


def run_cell(monkeypatch, *, on_colab: bool, installed: bool = False) -> list:
    """Run the cell's source; the commands it passed to subprocess.run."""
    calls = []
    monkeypatch.setattr(subprocess, "run", lambda *args, **kwargs: calls.append((args, kwargs)))
    if on_colab:
        monkeypatch.setitem(sys.modules, "google", types.ModuleType("google"))
        monkeypatch.setitem(sys.modules, "google.colab", types.ModuleType("google.colab"))
    else:
        monkeypatch.delitem(sys.modules, "google.colab", raising=False)
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: (
            (object() if installed else None) if name == "amp_lessons" else real_find_spec(name, *a)
        ),
    )
    exec(compile(colab.cell_source(), "<colab cell>", "exec"), {"__name__": "__main__"})
    return calls


def test_off_colab_the_cell_runs_nothing(monkeypatch):
    assert run_cell(monkeypatch, on_colab=False) == []
    assert run_cell(monkeypatch, on_colab=False, installed=True) == []


def test_on_colab_the_cell_pip_installs_the_course_from_github(monkeypatch):
    calls = run_cell(monkeypatch, on_colab=True)
    assert len(calls) == 1
    (command,), kwargs = calls[0]
    assert command[:5] == [sys.executable, "-m", "pip", "install", "--quiet"]
    assert command[5] == f"amp_lessons @ git+https://github.com/{colab.REPOSITORY}@{colab.BRANCH}"
    assert kwargs == {"check": True}


def test_on_colab_a_second_run_installs_nothing(monkeypatch):
    assert run_cell(monkeypatch, on_colab=True, installed=True) == []


def test_the_requirement_names_the_package_pyproject_builds():
    pyproject = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    assert 'name = "amp_lessons"' in pyproject
    assert colab.requirement().startswith("amp_lessons @ git+https://github.com/")


def test_the_cell_is_clean_json_and_hidden_on_the_site():
    cell = colab.colab_cell()
    assert cell["outputs"] == [] and cell["execution_count"] is None
    assert "remove-cell" in cell["metadata"]["tags"]
    assert "".join(cell["source"]) == colab.cell_source()


def test_add_colab_cell_inserts_once_at_the_top(tmp_path):
    path = tmp_path / "nb.ipynb"
    first = {"cell_type": "markdown", "metadata": {}, "source": ["# Title"]}
    path.write_text(json.dumps({"cells": [first], "metadata": {}, "nbformat": 4, "nbformat_minor": 4}))
    assert colab.add_colab_cell(path) is True
    assert colab.add_colab_cell(path) is False
    cells = json.loads(path.read_text())["cells"]
    assert len(cells) == 2 and cells[1] == first and colab.has_colab_cell({"cells": cells})


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_every_notebook_starts_with_the_colab_cell(notebook):
    cells = json.loads(notebook.read_text(encoding="utf-8"))["cells"]
    assert "".join(cells[0]["source"]) == colab.cell_source(), (
        f"{notebook.name}: first cell is not the Colab cell"
    )
    assert cells[0]["outputs"] == [] and "remove-cell" in cells[0]["metadata"].get("tags", [])
    assert sum(colab.MARKER in "".join(c["source"]) for c in cells) == 1
