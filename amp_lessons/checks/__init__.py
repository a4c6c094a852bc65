"""What a notebook imports to check an exercise: ``from amp_lessons.checks import check_...``.

This module offers the learner-facing ``check_*`` functions and the result type, nothing else. Each lesson's
checkers live in ``lNN_<topic>.py`` beside this file and the ``@checker`` decorator puts each check in
``registry``. Asking this module for a ``check_*`` name imports every lesson module once and hands out the
registered function, so adding an exercise needs no edit here; ``amp_lessons.checks.registry`` can still be
imported on its own without loading torch (which is why even ``CheckResult`` is handed out on request).
Writing a checker is for course authors: see ``harness`` and ``mistakes``.
"""

from importlib import import_module

from amp_lessons.checks import registry


def _all_checks() -> dict:
    """``{function name: check}`` for every lesson module (imported on the first call)."""
    for module_name in registry.lesson_module_names():
        import_module(f"{__name__}.{module_name}")
    return {check.__name__: check for check in registry.checkers().values()
            if check.__module__.startswith(f"{__name__}.l")}


def __getattr__(name):
    if name == "CheckResult":
        return import_module(f"{__name__}.harness").CheckResult
    if name == "__all__":
        return ["CheckResult", *sorted(_all_checks())]
    checks = _all_checks() if name.startswith("check_") else {}
    if name in checks:
        return checks[name]
    offered = ", ".join(sorted(_all_checks()))
    raise AttributeError(f"amp_lessons.checks has no {name!r}; the checks are {offered}.")


def __dir__():
    return ["CheckResult", *sorted(_all_checks())]
