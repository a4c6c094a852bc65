"""Lesson 07's recorder that runs *around the learner's code*: it must be importable where that code runs.

When a class is graded, the learner's function runs in a sandboxed kernel that cannot import checkers
(``check.py`` holds the reference computations). 07.1's simulated device (``check.FakeDevice``) stays with
the checker: its ``step``, ``sync`` and ``clock`` are called back on the checker's side, so the fake clock the
learner's times are compared with is never in the learner's process. What must run where the learner's code
runs is the recording of what it does with the step's result (a torch op, a ``print``, a
``torch.cuda.synchronize()``): :class:`TimingSpy`, a torch function mode that the checker switches on around
the call and that travels to the kernel with it (see ``amp_lessons.tools.grade.judge``). It records nothing
itself: each event is reported to the device's ``diagnostic``/``cuda_synchronize``. It judges nothing.
"""

from __future__ import annotations

import contextlib
import io

import torch
from torch.overrides import TorchFunctionMode

_OPEN: dict = {}  # id(spy) -> what its __enter__ switched on (kept off the spy: only its reporters travel)


class _PrintRecorder(io.StringIO):
    def __init__(self, diagnostic):
        super().__init__()
        self.diagnostic = diagnostic

    def write(self, text):
        if text.strip():
            self.diagnostic("print")
        return super().write(text)


@contextlib.contextmanager
def _patched_cuda_synchronize(cuda_synchronize):
    original = torch.cuda.synchronize
    torch.cuda.synchronize = cuda_synchronize
    try:
        yield
    finally:
        torch.cuda.synchronize = original


class TimingSpy(TorchFunctionMode):
    """Around the learner's ``time_step``: ``torch.cuda.synchronize`` goes to the device's, printed text and
    every torch operation the learner's code runs are reported as diagnostics (the fake step itself runs
    none)."""

    def __init__(self, diagnostic, cuda_synchronize):
        super().__init__()
        self.diagnostic, self.cuda_synchronize = diagnostic, cuda_synchronize

    def __enter__(self):
        stack = contextlib.ExitStack()
        stack.enter_context(_patched_cuda_synchronize(self.cuda_synchronize))
        stack.enter_context(contextlib.redirect_stdout(_PrintRecorder(self.diagnostic)))
        _OPEN[id(self)] = stack
        try:
            return super().__enter__()
        except BaseException:
            _OPEN.pop(id(self)).close()
            raise

    def __exit__(self, *exc):
        try:
            return super().__exit__(*exc)
        finally:
            stack = _OPEN.pop(id(self), None)
            if stack is not None:
                stack.close()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", str(func))
        self.diagnostic(name)
        return func(*args, **(kwargs or {}))
