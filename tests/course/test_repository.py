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
