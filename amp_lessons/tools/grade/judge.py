"""The judge: runs the course's checkers on its own side, calling the learner's functions in the sandbox.

The learner's notebook runs in a sandboxed kernel (``kernel``, started by ``sandbox.kernel_command``). The
judge sends it each of the learner's cells; a graded check cell is never sent. In its place the judge reads
the *course's* check cell (``check_x(fn, ...)``), asks the kernel for each function named there and calls the
real checker here, with each learner function replaced by a :class:`RemoteFunction`. The harness's
``call_learner`` calls it like any function: the arguments go to the kernel (pickled), the learner's function
runs there, and what comes back is plain data (``codec``): the result and the new state of every object the
call changed (a model's weights and grads, an optimizer's or scaler's state, a spy's log), applied to the
judge's own objects before the checker goes on. Reference values, the checker's code and the verdict exist
only in the judge; a learner can change what their function returns, never what it is compared with.

A call also carries the caller's torch state: grad mode, default dtype, autocast, the active torch function
modes (the checkers' op recorders, which must be importable in the kernel: a checker's own module is not),
the RNG states (the learner's code draws the numbers it would draw in a notebook) and the warnings log.
A checker's own function that the learner's code must call (a fake device's ``step``, a hook) is called back
on the judge's side.
"""

from __future__ import annotations

import ast
import contextlib
import inspect
import io
import os
import random
import select
import signal
import subprocess
import time

from amp_lessons.tools.grade import codec

CALL_GRACE_S = 5.0  # how long the judge waits past the check's budget for the kernel's answer


class KernelGone(Exception):
    """The kernel died, was killed, timed out or broke the protocol: nothing more can run in it."""

    def __init__(self, why: str, status: str = "kernel died"):
        super().__init__(why)
        self.why, self.status = why, status


class _Pipe:
    """Reads from the kernel's stdout with a deadline."""

    def __init__(self, stream):
        self.stream, self.deadline = stream, None

    def read(self, size: int) -> bytes:
        while True:
            wait = None if self.deadline is None else self.deadline - time.monotonic()
            if wait is not None and wait <= 0:
                raise TimeoutError
            ready, _, _ = select.select([self.stream], [], [], wait)
            if ready:
                return os.read(self.stream.fileno(), size)


class Kernel:
    """The sandboxed learner process, driven over its stdin/stdout."""

    def __init__(self, command: list, env: dict, cwd: str, on_start=None, preexec=None):
        self.process = subprocess.Popen(
            command,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env=env,
            cwd=cwd,
            start_new_session=True,
            preexec_fn=preexec,
        )
        if on_start:
            on_start(self.process.pid)
        self.pipe, self.broken = _Pipe(self.process.stdout), ""
        self.ready = False

    def wait_ready(self, seconds: float = 120.0) -> None:
        """Wait for the kernel's first message (it imports torch and IPython meanwhile)."""
        if not self.ready:
            header, _ = self.receive(time.monotonic() + seconds)
            if header.get("op") != "ready":
                raise KernelGone("the kernel did not start")
            self.ready = True

    def receive(self, deadline: float | None):
        self.pipe.deadline = deadline
        try:
            return codec.receive(self.pipe)
        except TimeoutError:
            raise KernelGone("timed out", "timed out") from None
        except (codec.ChannelClosed, OSError, ValueError) as exc:
            self.broken = str(exc)
            raise KernelGone(f"the kernel died ({exc})") from None

    def send(self, header: dict, payload: bytes = b"") -> None:
        self.wait_ready()
        if self.broken:
            raise KernelGone(f"the kernel died ({self.broken})")
        try:
            codec.send(self.process.stdin, header, payload)
        except (OSError, ValueError) as exc:
            self.broken = str(exc)
            raise KernelGone("the kernel died") from None

    def run_cell(self, source: str, deadline: float) -> str:
        self.send({"op": "cell", "source": source})
        header, _ = self.receive(deadline)
        return str(header.get("error", ""))[:2000]

    def lookup(self, name: str) -> dict:
        self.send({"op": "lookup", "name": name})
        header, _ = self.receive(time.monotonic() + 30)
        return header

    def stop(self) -> None:
        with contextlib.suppress(OSError):
            os.killpg(self.process.pid, signal.SIGKILL)
        with contextlib.suppress(OSError):
            self.process.kill()
        with contextlib.suppress(Exception):
            self.process.wait(timeout=10)


# ------------------------------------------------------------------------------------ the learner's functions


class _Shown:
    """A default value as the learner wrote it (only its repr is needed: messages print the signature)."""

    def __init__(self, text: str):
        self.text = text

    def __repr__(self) -> str:
        return self.text


def _signature(described):
    if not isinstance(described, list):
        return None
    try:
        return inspect.Signature(
            [
                inspect.Parameter(
                    str(name),
                    inspect._ParameterKind(int(kind)),
                    default=inspect.Parameter.empty if default is None else _Shown(str(default)),
                )
                for name, kind, default in described
            ]
        )
    except (TypeError, ValueError):
        return None


def _active_modes() -> list:
    import torch

    with contextlib.suppress(Exception):
        return list(torch.overrides._get_current_function_mode_stack())
    return []


def _warnings_log():
    import warnings

    log = getattr(getattr(warnings, "_showwarnmsg_impl", None), "__self__", None)
    return log if isinstance(log, list) else None


def _callback_reducer(judge_callbacks: dict):
    """Pickle a checker's own function (one the kernel cannot import) as a call back to the judge."""

    def reduce(obj):
        if isinstance(obj, RemoteFunction):  # the learner's own function, passed back to the kernel
            from amp_lessons.tools.grade import kernel

            return kernel.function_by_handle, (obj._handle,)
        function = isinstance(obj, (type(reduce), type(print), type(_Shown.__repr__))) or inspect.ismethod(
            obj
        )
        module = getattr(obj, "__module__", "") or ""
        owner = getattr(getattr(obj, "__self__", None), "__class__", None)
        local = "<" in (
            getattr(obj, "__qualname__", "") or ""
        )  # a lambda or a nested function: no import path
        checker = module.endswith(".check") or getattr(owner, "__module__", "").endswith(".check")
        if function and (checker or local):
            token = judge_callbacks.setdefault(id(obj), (len(judge_callbacks) + 1, obj))[0]
            from amp_lessons.tools.grade import kernel

            return kernel.judge_callback, (token, str(getattr(obj, "__name__", "callback")))
        return NotImplemented

    return reduce


class RemoteFunction:
    """The learner's function as the judge's checker sees it: calling it runs it in the kernel."""

    def __init__(self, kernel: Kernel, handle: int, name: str, signature=None):
        self._kernel, self._handle, self.__name__ = kernel, handle, name
        self.__qualname__ = name
        if signature is not None:
            self.__signature__ = signature

    def __call__(self, *args, **kwargs):
        return self._call({}, args, kwargs)

    def run_beside(self, helper, *args, **kwargs):
        """Call a course ``helper(learner_function, *args, **kwargs)`` in the kernel, beside this function.

        For a check whose learner code must run with things only a process of its own gives (two gloo ranks,
        faults injected into ``torch.save``): the helper drives the learner's function there and returns
        plain data that the checker judges here. Only a function of a lesson's ``spies.py`` (a module the
        kernel may import, holding no reference values) can be named (``kernel.beside_helper``).
        """
        target = {"helper": [helper.__module__, helper.__qualname__]}
        try:
            return self._call(target, (self, *args), kwargs)
        except codec.RemoteError as error:  # the course's helper raised in the learner's process
            from amp_lessons.checks.harness import LearnerProblem, failed

            raise LearnerProblem(
                failed(
                    f"The course code this check runs in your notebook's process ({helper.__module__}."
                    f"{helper.__qualname__}) raised {type(error).__name__}: {str(error)[:300]}. Did a cell "
                    "of your notebook change the course's code? The check judges only what that code reports "
                    "unchanged. If nothing in your notebook touches amp_lessons, this is a bug in the course: "
                    "please report it with this message."
                )
            ) from None

    def _call(self, target: dict, args: tuple, kwargs: dict):
        import torch

        kernel, callbacks = self._kernel, {}
        extra = {
            "grad": torch.is_grad_enabled(),
            "default_dtype": torch.get_default_dtype(),
            "autocast": _autocast_now(),
            "torch_rng": torch.get_rng_state(),
            "python_rng": random.getstate(),
            "numpy_rng": _numpy_rng(),
            "modes": _active_modes(),
            "warnings": _warnings_log(),
        }
        with torch._C.DisableTorchFunction():
            payload, memo = _dump(args, kwargs, extra, callbacks)
        budget = _budget_left()
        kernel.send({"op": "call", "h": self._handle, "budget": budget, **target}, payload)
        deadline = time.monotonic() + budget + CALL_GRACE_S
        header, data = self._answer(kernel, deadline, memo, callbacks)
        if header.get("op") != "returned":
            from amp_lessons.checks.harness import GradingProblem

            raise GradingProblem(
                f"the grading kernel could not take the call: {str(header.get('error'))[-300:]}"
            )
        with torch._C.DisableTorchFunction():
            decoder = codec.Decoder(memo, data, lambda handle, name: RemoteFunction(kernel, handle, name))
            states = decoder.states(header.get("states", {}))
            result = decoder.decode(header["result"]) if "result" in header else None
            codec.apply_states(states)
            _restore_rng(decoder, header)
        return _raise_or_return(header, result)

    def _answer(self, kernel: Kernel, deadline: float, memo: dict, callbacks: dict):
        from amp_lessons.checks.harness import CheckTimeout

        try:
            while True:
                header, data = kernel.receive(deadline)
                if header.get("op") != "callback":
                    return header, data
                _call_back(kernel, header, data, memo, callbacks)
        except KernelGone as gone:
            if gone.status == "timed out":
                kernel.broken = "it did not answer within the check's time budget"
                raise CheckTimeout() from None
            raise
        except CheckTimeout:  # the judge's own alarm: the kernel is still running the learner's code
            kernel.broken = "it was stopped at the check's time budget"
            raise


def _dump(args, kwargs, extra, callbacks):
    judge_callbacks: dict = {}
    reducer = _callback_reducer(judge_callbacks)
    payload, memo = codec.dump_call(args, kwargs, extra, reducer_override=reducer)
    callbacks.update({token: obj for token, obj in judge_callbacks.values()})
    return payload, memo


def _call_back(kernel: Kernel, header: dict, data: bytes, memo: dict, callbacks: dict) -> None:
    import torch

    fn = callbacks.get(header.get("token"))
    with torch._C.DisableTorchFunction():
        decoder = codec.Decoder(memo, data, lambda handle, name: RemoteFunction(kernel, handle, name))
        args, kwargs = decoder.decode(header["args"]), decoder.decode(header["kwargs"])
    try:
        result = fn(*args, **kwargs)
    except Exception as exc:  # noqa: BLE001  (raised in the learner's code, in the kernel)
        base = next((c.__name__ for c in type(exc).__mro__ if c.__module__ == "builtins"), "Exception")
        kind = type(exc)
        kernel.send(
            {
                "op": "callback_result",
                "raised": kind.__name__,
                "base": base,
                "module": kind.__module__,
                "qualname": kind.__qualname__,
                "message": str(exc)[:2000],
            }
        )
        return
    buffer = io.BytesIO()
    with torch._C.DisableTorchFunction():
        torch.save(result, buffer)
    kernel.send({"op": "callback_result"}, buffer.getvalue())


def _numpy_rng():
    import sys

    return sys.modules["numpy"].random.get_state() if "numpy" in sys.modules else None


def _autocast_now() -> dict:
    from amp_lessons.core.autocast_state import autocast_dtype, autocast_enabled

    return {device: autocast_dtype(device) for device in ("cpu", "cuda") if autocast_enabled(device)}


def _budget_left() -> float:
    from amp_lessons.checks.harness import check_budget

    if hasattr(signal, "getitimer"):
        left = signal.getitimer(signal.ITIMER_REAL)[0]
        if left > 0:
            return left
    return check_budget()


def _restore_rng(decoder, header) -> None:
    import torch

    with contextlib.suppress(Exception):
        state = decoder.decode(header["torch_rng"])
        if isinstance(state, torch.Tensor) and state.dtype == torch.uint8:
            torch.set_rng_state(state)
    with contextlib.suppress(Exception):
        random.setstate(decoder.decode(header["python_rng"]))
    if header.get("numpy_rng") is not None:
        with contextlib.suppress(Exception):
            import numpy

            kind, keys, position, has_gauss, cached = decoder.decode(header["numpy_rng"])
            numpy.random.set_state(
                (
                    str(kind),
                    numpy.asarray(keys, dtype=numpy.uint32),
                    int(position),
                    int(has_gauss),
                    float(cached),
                )
            )


def _raise_or_return(header: dict, result):
    from amp_lessons.checks.harness import CheckTimeout

    raised = header.get("raised")
    if not raised:
        return result
    if raised == "CheckTimeout":
        raise CheckTimeout()
    if raised == "NotImplementedError" and header.get("base") == "NotImplementedError":
        raise NotImplementedError(str(header.get("message", "")))
    error = codec.exception_class(header)(str(header.get("message", ""))[:2000])
    error.remote_description = str(header.get("description", raised))[:4000]
    raise error


# --------------------------------------------------------------------------------------- a check cell


class NotAttempted(Exception):
    """The check cell would have raised before its check ran (e.g. the learner's function is missing)."""


def parse_check_cell(source: str, known: dict) -> list[tuple[str, list[str]]]:
    """``[(check name, [argument names])]`` of a course check cell (imports from amp_lessons.checks, calls).

    Anything else in a check cell is a course bug (``ValueError``): the judge runs only what it understands.
    """
    calls = []
    for node in ast.parse(source).body:
        if isinstance(node, ast.ImportFrom) and node.module == "amp_lessons.checks":
            continue
        call = node.value if isinstance(node, ast.Expr) else None
        if (
            isinstance(call, ast.Call)
            and isinstance(call.func, ast.Name)
            and call.func.id in known
            and not call.keywords
            and all(isinstance(arg, ast.Name) for arg in call.args)
        ):
            calls.append((call.func.id, [arg.id for arg in call.args]))
            continue
        raise ValueError(f"a check cell line the judge does not run: {ast.unparse(node)[:80]}")
    return calls


def learner_value(kernel: Kernel, name: str):
    found = kernel.lookup(name)
    kind = found.get("kind")
    if kind == "missing":
        raise NotAttempted(f"NameError: name '{name}' is not defined")
    if kind == "none":
        return None
    if kind == "value":
        return codec.opaque(str(found.get("type", "object")), f"<{found.get('type')}>")
    if kind != "callable":
        raise KernelGone("the kernel answered a lookup with nonsense")
    return RemoteFunction(
        kernel, int(found["h"]), str(found.get("name", name)), _signature(found.get("signature"))
    )


def judge_check_cell(kernel: Kernel, source: str, known: dict) -> list:
    """Run the course's check cell on the judge's side; the CheckResults of its checks, in order."""
    import amp_lessons.checks as checks

    results = []
    for name, arguments in parse_check_cell(source, known):
        values = [learner_value(kernel, argument) for argument in arguments]
        results.append(getattr(checks, name)(*values))
    return results
