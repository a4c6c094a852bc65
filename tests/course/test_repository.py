"""Repository conventions: clean notebooks, exercises generated from solutions, a lesson per exercise."""

import json

import pytest
from notebook_code import ROOT

from amp_lessons.tools.exercises import builder

NOTEBOOKS = sorted(
    p for folder in ("notebooks", "solutions", "exercises") for p in (ROOT / folder).glob("*.ipynb")
)


def test_there_are_notebooks():
    assert (ROOT / "notebooks" / "00_start_here.ipynb").exists()
    assert len(NOTEBOOKS) >= 3


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_notebook_is_committed_clean(path):
    notebook = json.loads(path.read_text(encoding="utf-8"))
    dirty = [
        i
        for i, cell in enumerate(notebook["cells"])
        if cell["cell_type"] == "code" and (cell.get("outputs") or cell.get("execution_count") is not None)
    ]
    assert not dirty, f"{path.name}: cells {dirty} have outputs; run `python -m amp_lessons clean {path}`"
    assert notebook["metadata"].get("kernelspec", {}).get("name") == "python3", (
        f"{path.name}: kernelspec must be python3"
    )


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_notebook_uses_current_amp_api(path):
    """torch.cuda.amp is deprecated: a notebook may name it only to say so (in a cell marked as such)."""
    for cell in json.loads(path.read_text(encoding="utf-8"))["cells"]:
        source = builder.cell_source(cell)
        if cell["cell_type"] == "code" and "torch.cuda.amp" in source:
            assert "deprecat" in source.lower(), (
                f"{path.name}: uses torch.cuda.amp without showing it is deprecated"
            )


def test_exercises_are_generated_from_solutions():
    problems = builder.stale_exercises()
    assert not problems, "exercises/ is stale; run `python -m amp_lessons build-exercises`:\n" + "\n".join(
        problems
    )


def test_every_lesson_with_exercises_has_a_lesson_notebook():
    lessons = {p.name[:2] for p in (ROOT / "notebooks").glob("*.ipynb")}
    for path in (ROOT / "solutions").glob("*.ipynb"):
        assert path.name[:2] in lessons, f"{path.name} has no lesson notebook in notebooks/"


def test_exercises_contain_no_solution_code():
    for path in (ROOT / "exercises").glob("*.ipynb"):
        text = path.read_text(encoding="utf-8")
        assert builder.BEGIN not in text and builder.END not in text, path.name


def test_every_environment_variable_is_in_the_contributors_table():
    import re

    sources = [
        *ROOT.joinpath("amp_lessons").rglob("*.py"),
        *ROOT.joinpath("tests").rglob("*.py"),
        ROOT / "nbgrader_config.py",
        ROOT / "Makefile",
    ]
    used = {
        name
        for path in sources
        for name in re.findall(r"AMP_LESSONS_[A-Z_]+[A-Z]", path.read_text(encoding="utf-8"))
    }
    table = (ROOT / "CONTRIBUTING.md").read_text(encoding="utf-8").split("## Environment variables", 1)[1]
    documented = set(re.findall(r"^\| `(AMP_LESSONS_[A-Z_]+)` \|", table, re.M))
    assert used - documented == set(), "add these to CONTRIBUTING.md's table"
    assert documented - used == set(), "CONTRIBUTING.md documents variables nothing reads"


def test_clean_check_changes_nothing_and_names_a_dirty_notebook(tmp_path, capsys):
    from amp_lessons.tools import cli

    dirty = tmp_path / "dirty.ipynb"
    notebook = json.loads((ROOT / "notebooks" / "00_start_here.ipynb").read_text(encoding="utf-8"))
    next(c for c in notebook["cells"] if c["cell_type"] == "code")["execution_count"] = 7
    dirty.write_text(json.dumps(notebook), encoding="utf-8")
    before = dirty.read_text(encoding="utf-8")
    assert cli.main(["clean", "--check", str(dirty), str(ROOT / "notebooks" / "00_start_here.ipynb")]) == 1
    assert dirty.read_text(encoding="utf-8") == before
    assert "dirty.ipynb" in capsys.readouterr().out and "00_start_here" not in capsys.readouterr().out


def test_make_lesson_names_a_missing_lesson():
    import subprocess

    run = subprocess.run(
        ["make", "-s", "-o", ".venv/.stamp-test", "lesson", "L=42"], cwd=ROOT, capture_output=True, text=True
    )
    assert run.returncode != 0 and "no lesson 42" in run.stdout + run.stderr
