"""Lesson 12: load a recipe (the learner's file that describes their model) and call it, with clear messages.

Why a recipe and not a config: a model, its data and its loss are code, so the recipe is a plain Python file
with a few functions the tool calls (``build_model``, ``evaluation_batches``, ``loss_fn``; optionally
``training_batches``, ``outputs_of``, ``optimizer``, ``task``, ``criteria``). Everything the tool learns about
the model it learns by calling them, so every call goes through :meth:`Recipe.call`: an exception raised in
the learner's code becomes a :class:`RecipeError` whose message shows the learner's own frames only (never the
tool's, which would hide the line to fix under lines the learner cannot change).
"""

from __future__ import annotations

import importlib.util
import itertools
import os
import sys
import sysconfig
import traceback
import types
from pathlib import Path

import torch

from amp_lessons.l04_baseline_and_decision_boundary.criteria import Criteria

REQUIRED = ("build_model", "evaluation_batches", "loss_fn")
OPTIONAL = ("training_batches", "outputs_of", "optimizer", "task", "criteria", "cpu_threads")
TASKS = ("classification", "regression")
PACKAGE_DIR = str(Path(__file__).resolve().parents[1])

CRITERIA_HOWTO = """Write the criteria into the recipe BEFORE the trial, from what the outputs are used for:

    from amp_lessons.l04_baseline_and_decision_boundary import Criteria

    criteria = Criteria(
        atol=0.05, rtol=0.01,          # how far a score may move: |trial - ref| <= atol + rtol * |ref|
        min_quality=0.95,              # accuracy the trial must keep (a fraction), or None
        allowed_decision_changes=0,    # how many samples may change their decision
        application="what the decisions are used for, in words",
    )

Then run the tool again. Criteria chosen after seeing a trial tend to be that trial's worst case."""

__all__ = ["CRITERIA_HOWTO", "Recipe", "RecipeError", "UsageError", "learner_frames", "load_recipe"]


class UsageError(Exception):
    """The recipe or the arguments cannot be used (exit code 2). The message says what to change.

    In a notebook it displays as its message alone (IPython's ``_render_traceback_``): the tool's own frames
    would only hide the line to fix."""

    exit_code = 2

    def _render_traceback_(self):
        return [
            f"{type(self).__name__}: {line}" if i == 0 else line
            for i, line in enumerate(str(self).splitlines())
        ]


class RecipeError(UsageError):
    """Something in the recipe is missing, raised an exception, or returned what the tool cannot use."""


def _library_dirs() -> tuple[str, ...]:
    paths = sysconfig.get_paths()
    found = {paths.get(key) for key in ("stdlib", "platstdlib", "purelib", "platlib")}
    return tuple(sorted(str(Path(p).resolve()) for p in found if p))


def learner_frames(error: BaseException) -> str:
    """The traceback of ``error`` keeping only the learner's frames (not this package's, torch's or Python's),
    then the exception line. Empty frames (an error raised straight from a library) still give the line."""
    libraries = _library_dirs() + (PACKAGE_DIR,)
    frames = [
        frame
        for frame in traceback.extract_tb(error.__traceback__)
        if not frame.filename.startswith("<frozen")
        and not os.path.abspath(frame.filename).startswith(libraries)
    ]
    lines = traceback.format_list(frames) if frames else []
    head = "Traceback (your code only):\n" if frames else ""
    return head + "".join(lines) + "".join(traceback.format_exception_only(type(error), error)).rstrip()


def _is_out_of_memory(error: BaseException) -> bool:
    oom = getattr(torch.cuda, "OutOfMemoryError", ())
    return isinstance(error, (MemoryError, oom)) or "out of memory" in str(error).lower()


class Recipe:
    """A loaded recipe: its functions, checked for presence, and a way to call them with clear errors."""

    def __init__(self, namespace, source: str):
        self.namespace = namespace
        self.source = source
        missing = [name for name in REQUIRED if not callable(getattr(namespace, name, None))]
        if missing:
            raise RecipeError(
                f"The recipe {source} has no {', '.join(f'`{m}()`' for m in missing)}. A recipe defines "
                "build_model() (a fresh FP32 nn.Module), evaluation_batches() (the fixed evaluation set: an "
                "iterable of (inputs, targets)) and loss_fn(outputs, targets); docs/validate.md has a complete "
                "example."
            )
        for name in ("training_batches", "outputs_of", "optimizer"):
            value = getattr(namespace, name, None)
            if value is not None and not callable(value):
                raise RecipeError(f"`{name}` in {source} must be a function; got {type(value).__name__}.")
        self.task = getattr(namespace, "task", "classification")
        if self.task not in TASKS:
            raise RecipeError(f"`task` in {source} must be one of {TASKS}; got {self.task!r}.")
        self.criteria = getattr(namespace, "criteria", None)
        if self.criteria is not None and not isinstance(self.criteria, Criteria):
            raise RecipeError(
                f"`criteria` in {source} must be an amp_lessons.l04_baseline_and_decision_boundary.Criteria; "
                f"got {type(self.criteria).__name__}.\n\n{CRITERIA_HOWTO}"
            )
        threads = getattr(namespace, "cpu_threads", None)
        if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int) or threads < 1):
            raise RecipeError(f"`cpu_threads` in {source} must be a whole number >= 1; got {threads!r}.")
        self.cpu_threads = threads

    def has(self, name: str) -> bool:
        return callable(getattr(self.namespace, name, None))

    @property
    def functions(self) -> list[str]:
        return [name for name in REQUIRED + OPTIONAL if getattr(self.namespace, name, None) is not None]

    def call(self, name: str, *args, what: str | None = None):
        """Call the recipe's ``name`` (``what`` words the call); its exceptions become a RecipeError."""
        try:
            return getattr(self.namespace, name)(*args)
        except (KeyboardInterrupt, UsageError):
            raise
        except Exception as error:  # the learner's code: any exception is reported, never re-raised
            raise self.error_from(error, what or f"`{name}()`") from None

    def error_from(self, error: BaseException, what: str) -> RecipeError:
        if _is_out_of_memory(error):
            return RecipeError(
                f"The model does not fit: {what} ran out of memory ({type(error).__name__}: "
                f"{str(error).splitlines()[0][:200]}). Use smaller batches in evaluation_batches() and "
                "training_batches(), a smaller model, or another device (--device cpu)."
            )
        return RecipeError(f"{what} in {self.source} raised an exception:\n{learner_frames(error)}")

    def outputs(self, model, inputs):
        """``outputs_of(model, inputs)`` when the recipe has it, else ``model(inputs)``."""
        if self.has("outputs_of"):
            return self.call("outputs_of", model, inputs, what="`outputs_of(model, inputs)`")
        try:
            return model(inputs)
        except (KeyboardInterrupt, UsageError):
            raise
        except Exception as error:
            raise self.error_from(error, "the model's forward, `model(inputs)`,") from None

    def batches(self, name: str, limit: int | None = None) -> list:
        """The first ``limit`` (all when None) ``(inputs, targets)`` pairs of ``name()``, checked and listed."""
        iterable = self.call(name)
        try:
            iterator = iter(iterable)
        except TypeError:
            raise RecipeError(
                f"`{name}()` in {self.source} must return an iterable of (inputs, targets) pairs "
                f"(a list, a generator, a DataLoader); it returned a {type(iterable).__name__}."
            ) from None
        try:
            items = list(itertools.islice(iterator, limit))
        except (KeyboardInterrupt, UsageError):
            raise
        except Exception as error:
            raise self.error_from(error, f"iterating over `{name}()`") from None
        for index, item in enumerate(items):
            if not (isinstance(item, (tuple, list)) and len(item) == 2):
                raise RecipeError(
                    f"`{name}()` in {self.source} must yield (inputs, targets) pairs; item {index} is a "
                    f"{type(item).__name__}"
                    + (f" of length {len(item)}" if isinstance(item, (tuple, list)) else "")
                    + "."
                )
        return items


def load_recipe(recipe) -> Recipe:
    """A :class:`Recipe` from a path to a ``.py`` file, a module, or any object (or dict) with the functions."""
    if isinstance(recipe, (str, os.PathLike)):
        return Recipe(_import_file(Path(recipe)), str(recipe))
    if isinstance(recipe, dict):
        return Recipe(types.SimpleNamespace(**recipe), "the recipe dict")
    if isinstance(recipe, types.ModuleType):
        return Recipe(recipe, getattr(recipe, "__file__", None) or f"module {recipe.__name__}")
    if recipe is None:
        raise UsageError("No recipe: pass the path of a recipe file (docs/validate.md shows one).")
    return Recipe(recipe, f"the recipe {type(recipe).__name__}")


def _import_file(path: Path):
    if not path.exists():
        raise UsageError(
            f"The recipe {path} does not exist (looked in {Path.cwd()}). Pass the path of a .py file that "
            "defines build_model(), evaluation_batches() and loss_fn(outputs, targets)."
        )
    if path.is_dir() or path.suffix != ".py":
        raise UsageError(f"The recipe must be a Python file ending in .py; got {path}.")
    name = f"amp_validate_recipe_{abs(hash(str(path.resolve())))}"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except KeyboardInterrupt:
        raise
    except Exception as error:  # the learner's file: report its frames, never ours
        sys.modules.pop(name, None)
        raise RecipeError(
            f"Importing the recipe {path} raised an exception:\n{learner_frames(error)}"
        ) from None
    return module
