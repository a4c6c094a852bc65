"""Every exercise checker, by label: filled by the ``@checker`` decorator as each lesson module loads.

Two ways to ask "which exercises exist?":
- ``checkers()``: the loaded checker functions (``amp_lessons.checks`` imports every lesson module, so after
  that import this is complete);
- ``declared_checks()``/``declared_labels()``: the names and labels written in the lesson modules'
  ``@checker("...")`` lines, read from their source without importing them, so
  ``python -m amp_lessons progress`` lists exercises without loading torch. A test keeps the two equal.

A lesson's checker module is any ``lNN_<topic>.py`` file in this folder: adding one needs no other edit.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

LESSON_MODULE = re.compile(r"^l\d\d_\w+$")
_CHECKERS: dict = {}


def register(label: str, check) -> None:
    """Remember ``check`` under its exercise label (two checkers with one label are a course bug)."""
    known = _CHECKERS.get(label)
    if known is not None and known.__qualname__ != check.__qualname__:
        raise ValueError(f"Two checkers share the exercise label {label!r}: "
                         f"{known.__qualname__} and {check.__qualname__}.")
    _CHECKERS[label] = check


def checkers() -> dict:
    """``{exercise label: check function}`` for every lesson module imported so far."""
    return dict(_CHECKERS)


def lesson_module_names() -> list:
    """The lesson checker modules in this folder (``l00_start``, ``l01_formats``, ...), in lesson order."""
    folder = Path(__file__).resolve().parent
    return sorted(path.stem for path in folder.glob("l*.py") if LESSON_MODULE.match(path.stem))


def declared_checks() -> dict:
    """``{check function name: exercise label}`` from the lesson modules' ``@checker("...")`` lines.

    Read from source, without importing the modules (and so without importing torch).
    """
    folder = Path(__file__).resolve().parent
    found = {}
    for name in lesson_module_names():
        tree = ast.parse((folder / f"{name}.py").read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for decorator in node.decorator_list:
                if (isinstance(decorator, ast.Call) and getattr(decorator.func, "id", "") == "checker"
                        and decorator.args and isinstance(decorator.args[0], ast.Constant)):
                    found[node.name] = decorator.args[0].value
    return found


def declared_labels() -> list:
    """Every exercise label the lesson modules declare, read from source (no imports)."""
    return list(declared_checks().values())
