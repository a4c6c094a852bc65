"""Every exercise checker, by label: filled by the ``@checker`` decorator as each lesson's ``check.py`` loads.

Two ways to ask "which exercises exist?":
- ``checkers()``: the loaded checker functions (complete once every lesson's ``check.py`` is imported, see
  ``load_all``);
- ``declared_checks()``/``declared_labels()``: the names and labels written in the lessons' ``check.py``
  ``@checker("...")`` lines, read from their source without importing them, so
  ``python -m amp_lessons progress`` lists exercises without loading torch. A test keeps the two equal, and
  both equal to the table in ``amp_lessons.checks``.
"""

from __future__ import annotations

import ast
import re
from importlib import import_module
from pathlib import Path

LESSON_PACKAGE = re.compile(r"^l\d\d_\w+$")
PACKAGE_FOLDER = Path(__file__).resolve().parents[1]
_CHECKERS: dict = {}


def register(label: str, check) -> None:
    """Remember ``check`` under its exercise label (two checkers with one label are a course bug)."""
    known = _CHECKERS.get(label)
    if known is not None and known.__qualname__ != check.__qualname__:
        raise ValueError(
            f"Two checkers share the exercise label {label!r}: {known.__qualname__} and {check.__qualname__}."
        )
    _CHECKERS[label] = check


def checkers() -> dict:
    """``{exercise label: check function}`` for every lesson module imported so far."""
    return dict(_CHECKERS)


def check_files() -> list:
    """Every lesson's ``check.py`` (``amp_lessons/l00_start_here/check.py``, ...), in lesson order."""
    return sorted(
        path for path in PACKAGE_FOLDER.glob("l*/check.py") if LESSON_PACKAGE.match(path.parent.name)
    )


def check_module_names() -> list:
    """The lesson checker modules (``amp_lessons.l00_start_here.check``, ...), in lesson order."""
    return [f"amp_lessons.{path.parent.name}.check" for path in check_files()]


def load_all() -> dict:
    """Import every lesson's ``check.py`` and return ``checkers()``."""
    for name in check_module_names():
        import_module(name)
    return checkers()


def declared_checks() -> dict:
    """``{check function name: exercise label}`` from the lessons' ``@checker("...")`` lines.

    Read from source, without importing the modules (and so without importing torch).
    """
    found = {}
    for path in check_files():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for decorator in node.decorator_list:
                if (
                    isinstance(decorator, ast.Call)
                    and getattr(decorator.func, "id", "") == "checker"
                    and decorator.args
                    and isinstance(decorator.args[0], ast.Constant)
                ):
                    found[node.name] = decorator.args[0].value
    return found


def declared_labels() -> list:
    """Every exercise label the lesson modules declare, read from source (no imports)."""
    return list(declared_checks().values())
