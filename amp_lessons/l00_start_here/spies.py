"""Lesson 00's recorder that runs *around the learner's code*: it must be importable where that code runs.

When a class is graded, the learner's function runs in a sandboxed kernel that cannot import checkers
(``check.py`` holds the reference computations); a recorder a checker has switched on while it calls the
learner's function travels to that kernel with the call and its record comes back (see
``amp_lessons.tools.grade.judge``). So it lives here, not in ``check.py``. It judges nothing.
"""

from __future__ import annotations

from torch.overrides import TorchFunctionMode

from amp_lessons.core.autocast_state import MATMUL_LIKE, autocast_dtype, autocast_enabled


class AutocastAtMatmul(TorchFunctionMode):
    """At every matmul-like call: was CPU autocast on, was CUDA autocast on (or asked for), in which dtype."""

    def __init__(self, caught: list):
        super().__init__()
        self.caught = caught  # the warnings of the call so far ("CUDA is not available" = CUDA was asked for)
        self.seen: list[dict] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if getattr(func, "__name__", "") in MATMUL_LIKE:
            asked = any("cuda" in str(w.message).lower() for w in self.caught)
            self.seen.append(
                {
                    "cpu": autocast_enabled("cpu"),
                    "cuda": autocast_enabled("cuda") or asked,
                    "cuda_dtype": autocast_dtype("cuda"),
                }
            )
        return func(*args, **(kwargs or {}))
