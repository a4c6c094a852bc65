"""The exercise builder: solution regions become stubs inside function bodies; stale files are found."""

import json
import textwrap

import pytest

from amp_lessons.tools import builder

SOLUTION_CELL = textwrap.dedent(
    '''
    def add(a, b):
        """Add."""
        ### BEGIN SOLUTION
        return a + b
        ### END SOLUTION
    '''
).strip()


def make_notebook(*sources):
    return {
        "cells": [
            {"cell_type": "code", "source": s, "outputs": [{"output_type": "stream", "name": "stdout", "text": "x"}],
             "execution_count": 3, "metadata": {"scrolled": True}}
            for s in sources
        ],
        "metadata": {"kernelspec": {"name": "other"}},
        "nbformat": 4,
        "nbformat_minor": 5,
    }


def test_region_becomes_stub_that_runs():
    source = builder.strip_solutions(SOLUTION_CELL)
    assert "return a + b" not in source and builder.STUB in source
    namespace = {}
    exec(source, namespace)  # the cell still defines the function
    with pytest.raises(NotImplementedError):
        namespace["add"](1, 2)


@pytest.mark.parametrize(
    "bad, message",
    [
        ("### BEGIN SOLUTION\nx = 1\n### END SOLUTION", "inside a function body"),
        ("def f():\n    ### BEGIN SOLUTION\n    return 1", "never closed"),
        ("def f():\n    return 1\n    ### END SOLUTION", "without a matching"),
    ],
)
def test_bad_regions_are_refused(bad, message):
    with pytest.raises(builder.BuildError, match=message):
        builder.strip_solutions(bad)


def test_exercise_is_clean_and_marked():
    exercise = builder.build_exercise(make_notebook("import math", SOLUTION_CELL), "x.ipynb")
    assert all(c["outputs"] == [] and c["execution_count"] is None for c in exercise["cells"])
    assert exercise["metadata"]["kernelspec"]["name"] == "python3"
    assert exercise["metadata"]["amp_lessons"]["generated_from"] == "solutions/x.ipynb"


def test_notebook_without_region_is_refused():
    with pytest.raises(builder.BuildError, match="give the answers away"):
        builder.build_exercise(make_notebook("x = 1"), "x.ipynb")


def test_build_and_stale_check(tmp_path):
    (tmp_path / "solutions").mkdir()
    (tmp_path / "exercises").mkdir()
    (tmp_path / "solutions" / "01_demo.ipynb").write_text(json.dumps(make_notebook(SOLUTION_CELL)))
    assert builder.stale_exercises(tmp_path) == ["missing: exercises/01_demo.ipynb"]
    assert [p.name for p in builder.build(tmp_path)] == ["01_demo.ipynb"]
    assert builder.stale_exercises(tmp_path) == []
    assert builder.build(tmp_path) == []  # nothing changed, nothing written
    (tmp_path / "exercises" / "01_demo.ipynb").write_text("{}")
    (tmp_path / "exercises" / "99_orphan.ipynb").write_text("{}")
    assert builder.stale_exercises(tmp_path) == [
        "out of date: exercises/01_demo.ipynb",
        "no solution notebook for: exercises/99_orphan.ipynb",
    ]
