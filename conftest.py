"""Quiet lessons: during the nbval run of the lessons (``pytest --nbval-lax notebooks``), a cell that writes
to stderr fails, unless its cell metadata carries the tag ``shows-warning`` (the lesson shows that warning on
purpose and says what it means).

A learner should meet no unexplained red text: an expected warning is caught and summarised where it
happens (lesson 08's ``torch.compile`` messages, for example), never left to print. The check rides on the run
``make test`` already does, so no notebook runs twice; tests/course/test_quiet_lessons.py tests it.
"""

from __future__ import annotations

from pathlib import Path

import pytest

QUIET_FOLDERS = ("notebooks",)  # the lessons; exercises and solutions print what the learner's code prints
WARNING_TAG = "shows-warning"


def stderr_text(outputs) -> str:
    """What a cell's outputs wrote to stderr ('' when nothing)."""
    return "".join(
        out.get("text", "")
        for out in outputs or []
        if out.get("output_type") == "stream" and out.get("name") == "stderr"
    )


def unexpected_stderr(outputs, tags) -> str:
    """The stderr text a cell must not have written ('' when it wrote none, or when it is tagged)."""
    if WARNING_TAG in (tags or []):
        return ""
    return stderr_text(outputs).strip()


def _in_a_quiet_folder(path) -> bool:
    return Path(str(path)).resolve().parent.name in QUIET_FOLDERS


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    result = yield
    cell = getattr(item, "cell", None)
    if cell is None or not hasattr(item, "test_outputs") or not _in_a_quiet_folder(item.fspath):
        return result
    text = unexpected_stderr(item.test_outputs, cell.get("metadata", {}).get("tags", []))
    if text:
        shown = text if len(text) <= 1500 else text[:1500] + "\n..."
        raise AssertionError(
            f"This lesson cell wrote to stderr, which a learner sees as a red warning:\n{shown}\n\n"
            "Catch an expected warning and say in one line what it means, or, if the lesson shows it on "
            f"purpose, add the tag {WARNING_TAG!r} to the cell's metadata."
        )
    return result
