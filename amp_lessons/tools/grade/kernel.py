"""The learner's side of grading: ``python -m amp_lessons.tools.grade.kernel``, run inside the sandbox.

It runs the learner's cells (IPython's shell, so magics work) and, when the judge asks, calls one of the
learner's functions with the arguments the judge sent and sends back the result and what the call changed
(see ``codec``). It judges nothing: it never imports a checker and never sees a reference value, and whatever
it sends is only data the judge compares with its own computation. Its stdin/stdout are the channel to the
judge; the learner's code gets ``/dev/null`` for both (and stderr), so printed text reaches nobody.
"""

from __future__ import annotations

import contextlib
import inspect
import os
import random
import sys
import traceback
import warnings

from amp_lessons.tools.grade import codec

_FUNCTIONS: dict = {}
_CHANNEL: dict = {}


def register_function(fn) -> int:
    handle = len(_FUNCTIONS) + 1
    _FUNCTIONS[handle] = fn
    return handle


def function_by_handle(handle: int):
    return _FUNCTIONS[handle]


def _first_line(exc: BaseException) -> str:
    try:
        text = str(exc).strip().splitlines()
    except BaseException:  # noqa: BLE001
        text = []
    return text[0][:2000] if text else ""


def _error_text(exc: BaseException) -> str:
    value = " ".join(_first_line(exc).split())[:200]
    return f"{type(exc).__name__}: {value}"


def describe(exc: BaseException) -> dict:
    from amp_lessons.checks.harness import describe_exception

    try:
        description = describe_exception(exc)
    except BaseException:  # noqa: BLE001
        description = type(exc).__name__
    base = next((c.__name__ for c in type(exc).__mro__ if c.__module__ == "builtins"), "Exception")
    return {
        "raised": type(exc).__name__,
        "base": base,
        "module": str(getattr(type(exc), "__module__", "")),
        "qualname": str(getattr(type(exc), "__qualname__", "")),
        "message": _first_line(exc),
        "description": description,
    }


def _signature(fn):
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):
        return None
    return [
        [p.name, int(p.kind), None if p.default is inspect.Parameter.empty else repr(p.default)[:200]]
        for p in signature.parameters.values()
    ]


def lookup(shell, name: str) -> dict:
    namespace = shell.user_ns
    if name not in namespace:
        return {"kind": "missing"}
    value = namespace[name]
    if value is None:
        return {"kind": "none"}
    if not callable(value):
        return {"kind": "value", "type": type(value).__name__}
    return {
        "kind": "callable",
        "h": register_function(value),
        "name": str(getattr(value, "__name__", name))[:200],
        "signature": _signature(value),
    }


class JudgeCallback:
    """A checker's function that the learner's code calls (a fake device's ``step``, a hook): the call goes
    back to the judge, which runs it on its side and sends its result."""

    def __init__(self, token: int, name: str):
        self.token, self.__name__ = token, name

    def __call__(self, *args, **kwargs):
        import io

        import torch

        encoder = _CHANNEL["encoder"]
        with torch._C.DisableTorchFunction():  # the channel's own ops are not the learner's (07.1 counts ops)
            data = {"args": encoder.encode(list(args)), "kwargs": encoder.encode(dict(kwargs))}
            codec.send(_CHANNEL["out"], {"op": "callback", "token": self.token, **data}, encoder.payload())
            encoder.tensors = []
            header, payload = codec.receive(_CHANNEL["in"])
            if header.get("raised"):
                raise codec.exception_class(header)(header.get("message", ""))
            return torch.load(io.BytesIO(payload), weights_only=False)


def judge_callback(token: int, name: str) -> JudgeCallback:
    return JudgeCallback(token, name)


@contextlib.contextmanager
def _caller_state(extra: dict):
    """The torch state the checker called from: grad mode, default dtype, autocast, function modes, RNG,
    and a warnings log when the checker was recording warnings."""
    import torch

    from amp_lessons.checks.harness import kernel_left_as_found

    with contextlib.ExitStack() as stack:
        stack.enter_context(kernel_left_as_found())
        torch.set_grad_enabled(bool(extra.get("grad", True)))
        if isinstance(extra.get("default_dtype"), torch.dtype):
            torch.set_default_dtype(extra["default_dtype"])
        for device, dtype in extra.get("autocast", {}).items():
            stack.enter_context(torch.autocast(device_type=device, dtype=dtype))
        if extra.get("torch_rng") is not None:
            torch.set_rng_state(extra["torch_rng"])
        if extra.get("python_rng") is not None:
            random.setstate(extra["python_rng"])
        if extra.get("numpy_rng") is not None:
            import numpy

            numpy.random.set_state(extra["numpy_rng"])
        log = extra.get("warnings")
        if isinstance(log, list):
            stack.enter_context(warnings.catch_warnings())
            warnings.simplefilter("always")
            warnings._showwarnmsg_impl = log.append  # what catch_warnings(record=True) does
        for mode in extra.get("modes", []):
            stack.enter_context(mode)
        yield


def beside_helper(named) -> object:
    """The course helper a ``run_beside`` call names: a function of a lesson's ``spies.py`` only (the modules
    the kernel may import; a checker's module is hidden from it and holds the reference values)."""
    import importlib
    import re

    module, name = (str(part) for part in named)
    if not re.fullmatch(r"amp_lessons\.l\d\d_[a-z0-9_]+\.spies", module) or not name.isidentifier():
        raise ValueError(f"not a course helper the kernel runs: {module}.{name}")
    return getattr(importlib.import_module(module), name)


def call(header: dict, payload: bytes) -> tuple[dict, bytes]:
    import torch

    from amp_lessons.checks.harness import CheckTimeout, time_budget

    fn = beside_helper(header["helper"]) if "helper" in header else _FUNCTIONS.get(header.get("h"))
    args, kwargs, extra, memo = codec.load_call(payload)
    encoder = codec.Encoder(memo, register_function)
    _CHANNEL["encoder"] = encoder
    reply: dict = {"op": "returned"}
    try:
        with _caller_state(extra), time_budget(float(header.get("budget", 20.0))):
            result = fn(*args, **kwargs)
        reply["result"] = encoder.encode(result)
    except CheckTimeout:
        reply["raised"] = "CheckTimeout"
    except BaseException as exc:  # noqa: BLE001  (the learner's error, sent as a description)
        reply.update(describe(exc))
    try:
        reply["states"] = encoder.states()
    except BaseException as exc:  # noqa: BLE001
        reply = {"op": "returned", **describe(exc), "states": {}}
    reply["torch_rng"] = encoder.encode(torch.get_rng_state())
    reply["python_rng"] = encoder.encode(random.getstate())
    if "numpy" in sys.modules:
        kind, keys, *rest = sys.modules["numpy"].random.get_state()
        # the keys as int64: torch.load(weights_only=True) on torch < 2.6 does not know a uint32 tensor
        reply["numpy_rng"] = encoder.encode([kind, keys.astype("int64"), *rest])
    return reply, encoder.payload()


def run_cell(shell, source: str) -> dict:
    result = shell.run_cell(source, store_history=False)
    error = result.error_before_exec or result.error_in_exec
    return {"op": "ran", "error": _error_text(error) if error is not None else ""}


def _open_channel():
    """The judge's pipes become private descriptors; fds 0, 1 and 2 go to /dev/null for the learner."""
    incoming = os.fdopen(os.dup(0), "rb", buffering=0)
    outgoing = os.fdopen(os.dup(1), "wb")
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    os.set_inheritable(incoming.fileno(), False)
    os.set_inheritable(outgoing.fileno(), False)
    return _Reader(incoming), outgoing


class _Reader:
    def __init__(self, raw):
        self.raw = raw

    def read(self, size: int) -> bytes:
        return self.raw.read(size)


def _loopback_up() -> None:
    """A new network namespace (the ``unshare`` sandbox) starts with its loopback interface down, and lesson
    09's gloo ranks talk over 127.0.0.1: bring it up. Where it is up already (bubblewrap, no sandbox) or
    cannot be changed (not Linux, no privilege), nothing happens."""
    siocgifflags, siocsifflags, iff_up = 0x8913, 0x8914, 0x1
    with contextlib.suppress(ImportError, OSError):
        import fcntl
        import socket
        import struct

        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            answer = fcntl.ioctl(probe, siocgifflags, struct.pack("16sH", b"lo", 0))
            flags = struct.unpack("16sH", answer[:18])[1]
            if not flags & iff_up:
                fcntl.ioctl(probe, siocsifflags, struct.pack("16sH", b"lo", flags | iff_up))


def main() -> int:
    _loopback_up()
    incoming, outgoing = _open_channel()
    _CHANNEL.update({"in": incoming, "out": outgoing})
    os.environ.setdefault("MPLBACKEND", "Agg")
    import torch  # noqa: F401  (every lesson imports it: while the judge loads its checkers)
    from IPython.core.interactiveshell import InteractiveShell

    shell = InteractiveShell.instance(colors="NoColor")
    codec.send(outgoing, {"op": "ready", "pid": os.getpid()})
    while True:
        try:
            header, payload = codec.receive(incoming)
        except codec.ChannelClosed:
            return 0
        op = header.get("op")
        try:
            if op == "cell":
                codec.send(outgoing, run_cell(shell, str(header.get("source", ""))))
            elif op == "lookup":
                codec.send(outgoing, {"op": "found", **lookup(shell, str(header.get("name", "")))})
            elif op == "call":
                reply, data = call(header, payload)
                codec.send(outgoing, reply, data)
            elif op == "bye":
                return 0
        except codec.ChannelClosed:
            return 0
        except BaseException:  # noqa: BLE001  (say what broke; the judge decides)
            codec.send(outgoing, {"op": "broken", "error": traceback.format_exc(limit=3)[-2000:]})


if __name__ == "__main__":  # run as the package module, so that pickled references find this very module
    from amp_lessons.tools.grade import kernel

    sys.exit(kernel.main())
