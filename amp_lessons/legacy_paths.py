"""The import paths of the flat layout (before lesson packages), kept working for one release.

Until the removal date in CHANGELOG.md, ``from amp_lessons.validation import compare`` (and every other old
path, in an exercise copy a learner already holds) still works: this module's finder hands out the module at
its new home and warns once, with a ``DeprecationWarning`` that names the new path. It is installed by
``amp_lessons/__init__.py``; nothing else in the package imports an old path (a test checks).
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import types
import warnings

REMOVAL = "2027-06-01"
L01, L02, L03 = "l01_precision_formats", "l02_fp16_underflow_and_loss_scaling", "l03_autocast_and_gradscaler"
L04, L05, L06 = "l04_baseline_and_decision_boundary", "l05_nan_debugging", "l06_checkpoint_and_rollback"
L07, L08, L09 = "l07_measuring_gains", "l08_amp_in_your_training_loop", "l09_amp_across_processes"

# {old module (under amp_lessons.): new module (under amp_lessons.)}
MOVED = {
    "environment": "core.environment",
    "models": "core.models",
    "data": "core.data",
    "quiz": "core.quiz",
    "record": "core.record",
    "autocast_state": "core.autocast_state",
    "formats": f"{L01}.formats",
    "scaling": f"{L02}.scaling",
    "autocast_policy": f"{L03}.autocast_policy",
    "training": f"{L03}.training",
    "scaler_sim": f"{L03}.scaler_sim",
    "step_probes": f"{L03}.probes",
    "validation": f"{L04}.validation",
    "criteria": f"{L04}.criteria",
    "risk": f"{L04}.risk",
    "debugging": f"{L05}.debugging",
    "nonfinite_report": f"{L05}.nonfinite_report",
    "skipped_updates": f"{L05}.skipped_updates",
    "debugging_cases": f"{L05}.cases",
    "checkpoint": f"{L06}.checkpoint",
    "resume": f"{L06}.resume",
    "rollback": f"{L06}.rollback",
    "benchmark": f"{L07}.benchmark",
    "memory": f"{L07}.memory",
    "training_loop": f"{L08}.training_loop",
    "loop_numerics": f"{L08}.loop_numerics",
    "accumulation_probes": f"{L08}.probes",
    "distributed": f"{L09}.distributed",
    "across_ranks": f"{L09}.across_ranks",
    "workers": f"{L09}.workers",
    "workers.amp_ranks": f"{L09}.workers.amp_ranks",
    "workers.probe": f"{L09}.workers.probe",
    "checks.l00_start": "l00_start_here.check",
    "checks.l01_formats": f"{L01}.check",
    "checks.l02_scaling": f"{L02}.check",
    "checks.l03_training": f"{L03}.check",
    "checks.l04_validation": f"{L04}.check",
    "checks.l05_debugging": f"{L05}.check",
    "checks.l06_checkpoint": f"{L06}.check",
    "checks.l07_benchmark": f"{L07}.check",
    "checks.l08_training_loop": f"{L08}.check",
    "checks.l09_distributed": f"{L09}.check",
    "tools.builder": "tools.exercises.builder",
    "tools.course": "tools.exercises.course",
    "tools.grade_worker": "tools.grade.worker",
    "tools.sandbox": "tools.grade.sandbox",
    "tools.table": "tools.grade.table",
}
# ``amp_lessons.utils`` was split by job: {name: its new module}
UTILS = {
    "atomic_write": "core.files",
    "repo_root": "core.files",
    "scale_text": "core.display",
    "tagged_processes": "core.processes",
    "step_was_skipped": f"{L03}.training",
}


def _warn(old: str, new: str) -> None:
    warnings.warn(
        f"amp_lessons.{old} has moved to {new}; the old path stops working on {REMOVAL} (see CHANGELOG.md).",
        DeprecationWarning,
        stacklevel=3,
    )


def _utils_module() -> types.ModuleType:
    module = types.ModuleType("amp_lessons.utils", "Moved: see amp_lessons.legacy_paths.UTILS.")
    for name, home in UTILS.items():
        setattr(module, name, getattr(importlib.import_module(f"amp_lessons.{home}"), name))
    return module


class _OldPathLoader(importlib.abc.Loader):
    def create_module(self, spec):
        return None  # a throw-away module; exec_module puts the real one in its place

    def exec_module(self, module) -> None:
        old = module.__name__[len("amp_lessons.") :]
        if old == "utils":
            _warn(old, "amp_lessons.core.files / core.display / core.processes")
            real = _utils_module()
        else:
            new = f"amp_lessons.{MOVED[old]}"
            _warn(old, new)
            real = importlib.import_module(new)
        sys.modules[module.__name__] = real


class OldPathFinder(importlib.abc.MetaPathFinder):
    """Finds ``amp_lessons.<old path>`` only; every other import goes on as usual."""

    def find_spec(self, fullname, path=None, target=None):
        if not fullname.startswith("amp_lessons."):
            return None
        old = fullname[len("amp_lessons.") :]
        if old not in MOVED and old != "utils":
            return None
        return importlib.util.spec_from_loader(fullname, _OldPathLoader())


def install() -> None:
    if not any(isinstance(finder, OldPathFinder) for finder in sys.meta_path):
        sys.meta_path.insert(0, OldPathFinder())  # before the path finder: old submodules resolve here too
