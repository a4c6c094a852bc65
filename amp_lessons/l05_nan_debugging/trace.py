"""Lesson 05: a trace of every torch op a piece of code ran, and its replay by someone who trusts nothing in it.

05.2 asks which op of a learner's forward ran in which precision. When a class is graded the forward runs in a
sandboxed kernel, and what comes back from there is a claim of the learner's code: a log saying "the Gram
product ran in float32" costs nothing to write. So the kernel sends back a *trace* instead, and the checker
*replays* it:

- :class:`OpTrace` (a torch function mode, run where the learner's code runs) records every op that returns a
  tensor: the function, its arguments (tensors as references, everything else as values), the grad mode and
  CPU autocast state it ran under, the values of its tensor inputs just BEFORE it ran (so an in-place op is
  seen with what it changed) and of its outputs just after, and which inputs it changed in place. A tensor
  that no recorded op produced is a *leaf*: the forward's ``x``, one of the model's parameters, or something
  the trace cannot account for.
- :func:`replay` (run by the checker) runs the same ops itself, on ITS OWN ``x`` and parameters, under the
  recorded states, and checks each recorded value against what it computed. Everything the checker then
  judges (which dtype each op produced, the logits, the gradients) is its own computation; the recorded values
  only confirm that the trace is what really ran. A trace is a program, and a made-up one could carry numbers
  typed in for the check's own batch, so the checker also runs the same ops (``verify=False``) on a model and
  a batch the learner's code never saw. A made-up trace therefore passes only if it is a real computation
  from ``x`` and the parameters with the right precisions: the right answer.

Only functions of torch's own namespaces that torch lets a mode see (``torch.overrides``), a few tensor
factories and tensor attributes can be named; nothing that reads or writes files, registers hooks, runs a
backward pass or changes torch's global settings. A name the checker cannot run is a :class:`TraceProblem`.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
from typing import NamedTuple

import torch
from torch.overrides import TorchFunctionMode

from amp_lessons.core.autocast_state import autocast_dtype, autocast_enabled
from amp_lessons.core.environment import dtype_name

# Where a traced function may come from, by the name the trace gives it.
NAMESPACES = {
    "torch": torch,
    "torch.nn.functional": torch.nn.functional,
    "torch.linalg": torch.linalg,
    "torch.special": torch.special,
    "torch.fft": torch.fft,
}
# Tensor factories a forward may call (no tensor argument, so torch.overrides does not list them).
FACTORIES = frozenset(
    {"tensor", "as_tensor", "scalar_tensor", "zeros", "ones", "full", "empty", "arange", "linspace", "eye"}
)
# Operator methods (a + b, h @ h, gram /= n, gram[i] = ...): the only names with underscores allowed.
_BINARY = "add sub mul matmul truediv div floordiv mod pow and or xor lshift rshift".split()
OPERATORS = frozenset(
    [f"__{name}__" for name in _BINARY]
    + [f"__r{name}__" for name in _BINARY]
    + [f"__i{name}__" for name in _BINARY]
    + [f"__{name}__" for name in "neg pos abs invert getitem setitem eq ne lt le gt ge".split()]
)
# Words that mark a function the checker must never run for a learner, whatever namespace it comes from.
REFUSED_WORDS = (
    "file",
    "save",
    "load",
    "storage",
    "share_memory",
    "shared",
    "pin_memory",
    "pinned",
    "register",
    "backward",
    "hook",
    "set_",
    "numpy",
    "cuda",
    "tolist",
    "retain",
    "requires_grad",
    "record",
    "compile",
    "seed",
    "rng",
    "print",
    "deterministic",
    "thread",
    "default",
    "import",
    "warn",
)


class TraceProblem(Exception):
    """The trace cannot be followed: an op the checker cannot run, a tensor of unknown origin, a value that
    differs from the checker's own computation. The message says which, for the learner."""


# --------------------------------------------------------------------------------------------------
# Naming a function, and finding it again (the kernel names, the checker finds)
# --------------------------------------------------------------------------------------------------
@functools.lru_cache(maxsize=1)
def _overridable() -> frozenset:
    functions = set()
    for listed in torch.overrides.get_overridable_functions().values():
        functions.update(listed)
    return frozenset(functions)


def _getter(name: str):
    """The descriptor of tensor attribute ``name`` (``h.mT``, ``h.data``), or None."""
    try:
        descriptor = inspect.getattr_static(torch.Tensor, name)
    except AttributeError:
        return None
    return descriptor if type(descriptor).__name__ in ("getset_descriptor", "property") else None


def _refused(name: str) -> bool:
    if name.startswith("_") and name not in OPERATORS:
        return True
    return any(word in name for word in REFUSED_WORDS)


def resolve(spec) -> object:
    """The function a trace names (``["method", "float"]``, ``["getter", "mT"]``, ``["torch", "einsum"]``), or
    None when it is not one the checker runs for a learner."""
    if not (isinstance(spec, (list, tuple)) and len(spec) == 2 and all(isinstance(s, str) for s in spec)):
        return None
    kind, name = spec
    if not name.isidentifier() or _refused(name):
        return None
    if kind == "getter":
        descriptor = _getter(name)
        return None if descriptor is None else descriptor.__get__
    if kind == "method":
        func = inspect.getattr_static(torch.Tensor, name, None)
        func = getattr(torch.Tensor, name, None) if func is not None else None
        return func if func in _overridable() else None
    namespace = NAMESPACES.get(kind)
    func = getattr(namespace, name, None) if namespace is not None else None
    if func is None or isinstance(func, type) or not callable(func):
        return None
    if func in _overridable() or (kind == "torch" and name in FACTORIES):
        return func
    return None


def _same_function(func, found) -> bool:
    if found is None:
        return False
    if getattr(found, "__name__", "") == "__get__":
        return getattr(func, "__self__", None) is getattr(found, "__self__", False)
    return func is found


def function_spec(func) -> list:
    """How the trace names ``func`` so that :func:`resolve` finds the very same function; ``["unknown", name]``
    when it cannot (the replay then stops there)."""
    name = getattr(func, "__name__", None)
    if not isinstance(name, str):
        return ["unknown", repr(func)[:80]]
    if name == "__get__":
        attribute = getattr(getattr(func, "__self__", None), "__name__", "")
        spec = ["getter", str(attribute)]
        return spec if _same_function(func, resolve(spec)) else ["unknown", f"the attribute .{attribute}"]
    for kind in ("method", *NAMESPACES):
        spec = [kind, name]
        if _same_function(func, resolve(spec)):
            return spec
    return ["unknown", name]


def op_name(spec) -> str:
    """What a learner calls the op: ``h.float()``, ``torch.einsum``, ``F.linear``."""
    kind, name = (list(spec) + ["", ""])[:2]
    if kind == "method":
        return f"Tensor.{name}"
    if kind == "getter":
        return f"the attribute .{name}"
    if kind == "unknown":
        return str(name)
    return f"{kind}.{name}"


# --------------------------------------------------------------------------------------------------
# Recording (where the learner's code runs)
# --------------------------------------------------------------------------------------------------
def _grad_state() -> str:
    if torch.is_inference_mode_enabled():
        return "inference"
    return "on" if torch.is_grad_enabled() else "off"


class OpTrace(TorchFunctionMode):
    """Records every torch op that returns a tensor (or changes one in place), for :func:`replay`.

    ``leaf_roles`` names the tensors a replay supplies itself (``{id(x): "x", id(weight): "param:..."}``);
    keep them alive while tracing. Read :meth:`as_data` afterwards: plain lists, dicts, strings, numbers and
    tensors (every tensor a copy, never one of the caller's).
    """

    def __init__(self, leaf_roles: dict):
        super().__init__()
        self.leaf_roles = dict(leaf_roles)
        self.ref_of: dict[int, int] = {}  # id(tensor) -> the reference of its current value
        self.alive: list = []  # every tensor seen, so that no id is reused while tracing
        self.leaves: list = []  # [ref, role, value]
        self.ops: list = []

    # -- references --------------------------------------------------------------------------------
    def _new_ref(self, tensor) -> int:
        ref = len(self.alive)
        self.alive.append(tensor)
        self.ref_of[id(tensor)] = ref
        return ref

    def _input_ref(self, tensor) -> int:
        ref = self.ref_of.get(id(tensor))
        if ref is None:
            ref = self._new_ref(tensor)
            role = self.leaf_roles.get(id(tensor), "other")
            self.leaves.append([ref, role, _copy(tensor)])
        return ref

    # -- values ------------------------------------------------------------------------------------
    def encode(self, value, seen: list, depth: int = 0):
        """``value`` as plain data; each tensor as ``{"tensor": ref}`` (appended to ``seen``)."""
        if depth > 12:
            return {"unknown": "nested too deep"}
        if isinstance(value, torch.Tensor):
            ref = self._input_ref(value)
            seen.append((ref, value))
            return {"tensor": ref}
        return _encode_constant(value, lambda item: self.encode(item, seen, depth + 1))

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        inputs: list = []
        known, leaves = len(self.alive), len(self.leaves)
        encoded_args = self.encode(list(args), inputs)
        encoded_kwargs = self.encode(dict(kwargs), inputs)
        before = {ref: (tensor, _version(tensor), _copy(tensor)) for ref, tensor in inputs}
        grad, autocast = _grad_state(), [autocast_enabled("cpu"), dtype_name(autocast_dtype("cpu"))]
        result = func(*args, **kwargs)
        changed = [ref for ref, (tensor, version, _) in before.items() if _version(tensor) != version]
        if not _holds_tensor(result) and not changed:  # h.shape, h.size(1), h.item(): nothing to replay
            self._forget(known, leaves)
            return result
        mutated = []
        for ref in changed:
            tensor = before[ref][0]
            mutated.append([ref, self._new_ref(tensor), _copy(tensor)])
        outputs: list = []
        encoded_result = self._encode_result(result, outputs)
        self.ops.append(
            {
                "fn": function_spec(func),
                "args": encoded_args,
                "kwargs": encoded_kwargs,
                "inputs": [[ref, value] for ref, (_, _, value) in before.items()],
                "grad": grad,
                "autocast": autocast,
                "result": encoded_result,
                "outputs": outputs,
                "mutated": mutated,
            }
        )
        return result

    def _forget(self, known: int, leaves: int) -> None:
        """Drop the leaves an op that is not recorded introduced (a tensor only asked for its shape)."""
        for tensor in self.alive[known:]:
            del self.ref_of[id(tensor)]
        del self.alive[known:], self.leaves[leaves:]

    def _encode_result(self, result, outputs: list, depth: int = 0):
        """The op's result, each tensor as a reference: a new one (its value in ``outputs``), or the one it
        already has when the op returned a tensor it was given (``h.float()`` of a float32 ``h``, ``gram /=
        n``, whose new value is in ``mutated``)."""
        if isinstance(result, torch.Tensor):
            ref = self.ref_of.get(id(result))
            if ref is None:
                ref = self._new_ref(result)
                outputs.append([ref, _copy(result)])
            return {"tensor": ref}
        if isinstance(result, (tuple, list)) and depth < 3:
            return {"tuple": [self._encode_result(item, outputs, depth + 1) for item in result]}
        return _encode_constant(result, lambda item: {"unknown": type(item).__name__})

    def reference(self, value):
        """The reference of a tensor the traced code returned, or None when no recorded op produced it."""
        if not isinstance(value, torch.Tensor):
            return None
        return self.ref_of.get(id(value))

    def as_data(self) -> dict:
        return {"leaves": self.leaves, "ops": self.ops}


def _version(tensor) -> int:
    """How often ``tensor`` was changed in place (-1 for an inference tensor, which keeps no count)."""
    try:
        return int(tensor._version)
    except RuntimeError:
        return -1


def _copy(tensor):
    return tensor.detach().clone().as_subclass(torch.Tensor)


def _holds_tensor(value, depth: int = 0) -> bool:
    if isinstance(value, torch.Tensor):
        return True
    if isinstance(value, (tuple, list)) and depth < 3:
        return any(_holds_tensor(item, depth + 1) for item in value)
    return False


def _encode_constant(value, encode_item):
    """A non-tensor argument as plain data (its type tagged, so that the replay rebuilds exactly it)."""
    if value is None or isinstance(value, (bool, str)):
        return {"value": value}
    if type(value) is int:
        return {"int": value}
    if type(value) is float:
        return {"float": value.hex()}
    if isinstance(value, torch.dtype):
        return {"dtype": str(value).replace("torch.", "")}
    if isinstance(value, torch.device):
        return {"device": str(value)}
    if isinstance(value, torch.Size):
        return {"size": [int(n) for n in value]}
    if isinstance(value, torch.memory_format):
        return {"memory_format": str(value).replace("torch.", "")}
    if isinstance(value, torch.layout):
        return {"layout": str(value).replace("torch.", "")}
    if isinstance(value, slice):
        return {"slice": [encode_item(value.start), encode_item(value.stop), encode_item(value.step)]}
    if value is Ellipsis:
        return {"ellipsis": True}
    if type(value) in (list, tuple):
        return {type(value).__name__: [encode_item(item) for item in value]}
    if type(value) is dict and all(isinstance(key, str) for key in value):
        return {"dict": [[key, encode_item(item)] for key, item in value.items()]}
    return {"unknown": type(value).__name__}


# --------------------------------------------------------------------------------------------------
# Replaying (the checker's side: nothing recorded is trusted, everything judged is recomputed)
# --------------------------------------------------------------------------------------------------
_ATTRIBUTES = {"dtype": torch.dtype, "memory_format": torch.memory_format, "layout": torch.layout}


class ReplayedOp(NamedTuple):
    """One op as the checker ran it: the trace's name for it, the function, the checker's own arguments and
    result, and the grad mode and CPU autocast state (enabled, dtype) it ran under."""

    spec: list
    func: object
    args: list
    kwargs: dict
    result: object
    grad: str
    autocast: list


class Replay:
    """What :func:`replay` computed: every op it ran (``calls``, :class:`ReplayedOp`), the tensor of each
    reference, and the leaves it supplied."""

    def __init__(self):
        self.tensors: dict[int, torch.Tensor] = {}
        self.calls: list = []
        self.leaf_roles: dict[int, str] = {}


def _decode(data, tensors: dict, depth: int = 0):
    if depth > 14 or not isinstance(data, dict) or len(data) != 1:
        raise TraceProblem("an argument the check cannot read")
    ((kind, value),) = data.items()
    if kind == "tensor":
        if value not in tensors:
            raise TraceProblem("a tensor that no recorded op produced")
        return tensors[value]
    if kind == "value" and (value is None or isinstance(value, (bool, str))):
        return value
    if kind == "int" and type(value) is int:
        return value
    if kind == "float" and isinstance(value, str):
        return float.fromhex(value)
    if kind in _ATTRIBUTES and isinstance(value, str) and value.isidentifier():
        found = getattr(torch, value, None)
        if isinstance(found, _ATTRIBUTES[kind]):
            return found
    if kind == "device" and isinstance(value, str):
        return torch.device(value)
    if kind == "size" and isinstance(value, list):
        return torch.Size([int(n) for n in value])
    if kind == "slice" and isinstance(value, list) and len(value) == 3:
        return slice(*(_decode(item, tensors, depth + 1) for item in value))
    if kind == "ellipsis":
        return Ellipsis
    if kind in ("list", "tuple") and isinstance(value, list):
        items = [_decode(item, tensors, depth + 1) for item in value]
        return items if kind == "list" else tuple(items)
    if kind == "dict" and isinstance(value, list):
        return {str(key): _decode(item, tensors, depth + 1) for key, item in value}
    raise TraceProblem(
        f"an argument of a kind the check cannot rebuild ({str(kind)[:40]}: {str(value)[:40]})"
    )


def same_values(recorded, computed, *, exact: bool = False) -> bool:
    """Is the recorded tensor what the checker computed? Same dtype and shape, inf/NaN in the same places, and
    the finite entries equal up to a few units in the last place of the largest one.

    The slack only covers a sum taken in another order by another process (a different thread count splits
    a matrix product differently). It cannot make a wrong forward pass: everything the check judges is the
    checker's own computation; this comparison only confirms that the trace is what ran.
    """
    if not isinstance(recorded, torch.Tensor) or not isinstance(computed, torch.Tensor):
        return False
    computed = computed.detach()
    if recorded.dtype != computed.dtype or recorded.shape != computed.shape:
        return False
    if exact or not recorded.is_floating_point():
        return bool(torch.equal(recorded, computed)) or bool(
            recorded.is_floating_point()
            and torch.equal(recorded.isnan(), computed.isnan())
            and torch.equal(recorded.nan_to_num(0.0), computed.nan_to_num(0.0))
        )
    a, b = recorded.double(), computed.double()
    if not torch.equal(a.isnan(), b.isnan()) or not torch.equal(a.isinf(), b.isinf()):
        return False
    if not torch.equal(a[a.isinf()], b[b.isinf()]):
        return False
    finite = torch.isfinite(a)
    if not bool(finite.any()):
        return True
    scale = max(float(b[finite].abs().max()), float(torch.finfo(recorded.dtype).tiny))
    slack = 8 * float(torch.finfo(recorded.dtype).eps) * scale
    return bool(((a[finite] - b[finite]).abs() <= slack).all())


@contextlib.contextmanager
def _state(grad: str, autocast):
    if grad not in ("on", "off", "inference"):
        raise TraceProblem("a grad mode the check does not know")
    if not (isinstance(autocast, list) and len(autocast) == 2 and isinstance(autocast[0], bool)):
        raise TraceProblem("an autocast state the check cannot read")
    dtype = getattr(torch, str(autocast[1]), None)
    if not isinstance(dtype, torch.dtype):
        raise TraceProblem("an autocast dtype the check does not know")
    with contextlib.ExitStack() as stack:
        if grad == "inference":
            stack.enter_context(torch.inference_mode())
        else:
            stack.enter_context(torch.set_grad_enabled(grad == "on"))
        stack.enter_context(torch.autocast("cpu", dtype=dtype, enabled=autocast[0]))
        yield


def _bind_outputs(
    encoded, computed, outputs: dict, replay: Replay, where: str, verify: bool, depth=0
) -> None:
    if not isinstance(encoded, dict) or len(encoded) != 1:
        raise TraceProblem(f"{where}: a result the check cannot read")
    ((kind, value),) = encoded.items()
    if kind == "tensor":
        if not isinstance(computed, torch.Tensor):
            raise TraceProblem(f"{where} gave no tensor when the check ran it")
        if value in outputs:
            if verify and not same_values(outputs[value], computed):
                raise TraceProblem(f"{where} gave other values when the check ran it")
            replay.tensors[value] = computed
        elif replay.tensors.get(value) is not computed:
            raise TraceProblem(f"{where}: a result the check cannot place")
        return
    if kind == "tuple" and isinstance(value, list) and depth < 3:
        if not isinstance(computed, (tuple, list)) or len(computed) != len(value):
            raise TraceProblem(f"{where} gave another number of results when the check ran it")
        for item, got in zip(value, computed):
            _bind_outputs(item, got, outputs, replay, where, verify, depth + 1)
        return
    if _holds_tensor(computed):
        raise TraceProblem(f"{where} gave a tensor where the trace has none")


def replay(data, leaves: dict, *, verify: bool = True) -> Replay:
    """Run a trace's ops again, on the checker's own tensors, and check every recorded value on the way.

    ``leaves`` maps each role a trace may name (``"x"``, ``"param:head.weight"``) to the tensor the checker
    supplies for it; a leaf's recorded value must equal it exactly. ``verify=False`` compares no value: the
    same program run on other parameters (after a training step). Raises :class:`TraceProblem`.
    """
    if not isinstance(data, dict) or not isinstance(data.get("ops"), list):
        raise TraceProblem("no trace came back")
    done = Replay()
    for leaf in data.get("leaves", []) if isinstance(data.get("leaves"), list) else [None]:
        if not (isinstance(leaf, list) and len(leaf) == 3 and type(leaf[0]) is int and type(leaf[1]) is str):
            raise TraceProblem("a leaf the check cannot read")
        ref, role, value = leaf
        if role not in leaves:
            raise TraceProblem(
                "it used a tensor that is neither `x`, nor one of the model's parameters, nor the result of an "
                "op inside your function (a tensor made outside it, or by code the check does not see)"
            )
        mine = leaves[role]
        if verify and not same_values(value, mine, exact=True):
            raise TraceProblem(
                f"the tensor it used as {role.replace('param:', 'model.')} is not the check's own"
            )
        done.tensors[ref] = mine
        done.leaf_roles[ref] = role
    for number, op in enumerate(data["ops"], start=1):
        try:
            _replay_op(op, number, done, verify)
        except (TypeError, ValueError, KeyError, IndexError, AttributeError, RuntimeError) as exc:
            raise TraceProblem(f"op {number} cannot be read ({type(exc).__name__})") from None
    return done


def _replay_op(op, number: int, done: Replay, verify: bool) -> None:
    if not isinstance(op, dict):
        raise TraceProblem(f"op {number} cannot be read")
    spec = op.get("fn")
    where = f"op {number} ({op_name(spec) if isinstance(spec, (list, tuple)) else '?'})"
    func = resolve(spec)
    if func is None:
        raise TraceProblem(f"{where} is not an op the check can run again")
    args = _decode(op.get("args"), done.tensors)
    kwargs = _decode(op.get("kwargs"), done.tensors)
    if not isinstance(args, list) or not isinstance(kwargs, dict):
        raise TraceProblem(f"{where}: arguments the check cannot read")
    for entry in op.get("inputs", []):
        ref, value = entry
        if ref not in done.tensors or (verify and not same_values(value, done.tensors[ref])):
            raise TraceProblem(
                f"{where} was given a tensor whose values differ from what the check computed for it (was "
                "it changed by code the check does not see?)"
            )
    with _state(op.get("grad"), op.get("autocast")):
        try:
            computed = func(*args, **kwargs)
        except Exception as exc:  # noqa: BLE001  (the trace asked for something that does not run)
            raise TraceProblem(f"{where} raised {type(exc).__name__} when the check ran it") from None
    for entry in op.get("mutated", []):
        old, new, value = entry
        if old not in done.tensors or (verify and not same_values(value, done.tensors[old])):
            raise TraceProblem(f"{where} changed a tensor in place differently when the check ran it")
        done.tensors[new] = done.tensors[old]
    outputs = {}
    for entry in op.get("outputs", []):
        ref, value = entry
        outputs[ref] = value
    _bind_outputs(op.get("result"), computed, outputs, done, where, verify)
    done.calls.append(ReplayedOp(spec, func, args, kwargs, computed, op.get("grad"), op.get("autocast")))


def finite(tensor) -> bool:
    with torch.no_grad():
        return bool(torch.isfinite(tensor).all())
