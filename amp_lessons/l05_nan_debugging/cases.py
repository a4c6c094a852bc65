"""Lesson 05: what the exercise checks run a learner's code on — small broken models, and a pretend GPU.

Two kinds of test bed, kept apart from the checker so that each stays small:

- ``finder_cases()``: small deterministic models whose float16 overflow is certain (values between 65504 and
  float32's range, so they are finite without autocast), each with the name of the first module whose output
  is non-finite; plus ``RaisingModel``, whose forward always fails after a first layer ran, to see whether a
  finder removes its hooks when the forward raises.
- ``pretend_gpu()``: runs code as if every tensor were on a CUDA GPU, on any machine. A fix written as
  ``torch.autocast("cpu", enabled=False)`` behaves exactly like the right one when the tensors are on the CPU,
  and leaves CUDA's autocast on when they are on a GPU. Only a run with GPU tensors tells the two apart, and
  a laptop has none: so, for the duration of one call, tensors *report* ``cuda`` as their device, and autocast
  is entered for the device type the code names with the two types swapped — the code's ``"cuda"`` drives
  the (real) CPU autocast the check switched on, its ``"cpu"`` drives CUDA's, which touches no CPU tensor.
  The arithmetic still runs on the CPU, so what the code computes is real; only the names are swapped.
  ``watch_autocast()`` records every autocast the code enters (device type, enabled, dtype) without swapping.
"""

from __future__ import annotations

import contextlib
import functools
import warnings
from collections import OrderedDict
from typing import NamedTuple

import torch
from torch import nn
from torch.amp import autocast_mode

from amp_lessons.core.models import TextureNet, texture_batch

# --------------------------------------------------------------------------------------------------
# 05.1: models a first-non-finite finder is run on
# --------------------------------------------------------------------------------------------------


def _nested():
    """The overflow is inside a block: the answer is 'block.fc2', not the block."""
    block = nn.Sequential(OrderedDict(fc1=nn.Linear(4, 8), relu=nn.ReLU(), fc2=nn.Linear(8, 8)))
    return nn.Sequential(OrderedDict(block=block, out=nn.Linear(8, 2)))


class DefinedBackwards(nn.Module):
    """`late` is defined first but runs second: definition order is not execution order."""

    def __init__(self):
        super().__init__()
        self.late = nn.Linear(8, 2)
        self.early = nn.Linear(4, 8)

    def forward(self, x):
        return self.late(torch.relu(self.early(x)))


class InlineMatmul(nn.Module):
    """The overflow happens in the container's own code; the first non-finite module *output* is `b`'s."""

    def __init__(self):
        super().__init__()
        self.a = nn.Linear(4, 8)
        self.mix = nn.Parameter(torch.full((8, 8), 2000.0))
        self.b = nn.Linear(8, 2)

    def forward(self, x):
        return self.b(torch.relu(self.a(x)) @ self.mix)


class GainBlock(nn.Module):
    """A container whose own forward code overflows *after* its only layer: the layer's output is finite, the
    block's is not (a finder that hooks leaf modules only never sees it)."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 8)
        self.gain = 3000.0

    def forward(self, x):
        return self.fc(x) * self.gain


def _gain_model():
    return nn.Sequential(OrderedDict(block=GainBlock(), act=nn.ReLU(), out=nn.Linear(8, 2)))


class PlantedError(RuntimeError):
    """The error ``RaisingModel`` raises (its own class, so a check never mistakes it for a learner's bug)."""


class _Fails(nn.Module):
    def forward(self, x):
        raise PlantedError("planted by the check: this layer always fails")


class RaisingModel(nn.Sequential):
    """A first layer that runs (so hooks have fired), then a layer whose forward raises ``PlantedError``."""

    def __init__(self):
        super().__init__(OrderedDict(first=nn.Linear(4, 8), fails=_Fails()))


def finder_cases():
    """(label, model, inputs, expected answer); every overflow is float16-only (finite in float32).

    The model with a nested block starts in eval mode (the others in training mode): a finder must leave
    each model in the mode it came in.
    """

    def build(seed, factory):
        torch.manual_seed(seed)
        return factory()

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(5)
        big = torch.randn(6, 4) * 40
        quiet = torch.randn(6, 4)
        poisoned = quiet.clone()
        poisoned[2, 1] = float("nan")
        signs = torch.sign(torch.randn(8, 4))

        sequential = build(
            1, lambda: nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 2))
        )
        nested = build(2, _nested).eval()
        backwards = build(3, DefinedBackwards)
        inf_then_nan = build(4, lambda: nn.Sequential(nn.Linear(4, 8), nn.Linear(8, 4), nn.Linear(4, 2)))
        inline = build(5, InlineMatmul)
        calm = build(6, lambda: nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2)))
        gained = build(7, _gain_model)
        with torch.no_grad():
            sequential[2].weight.fill_(2000.0)
            nested.block.fc2.weight.fill_(2000.0)
            backwards.early.weight.copy_(signs * 800.0)
            inf_then_nan[0].weight.copy_(signs * 800.0)
            inf_then_nan[1].weight.copy_(torch.tensor([1.0, -1.0]).repeat(4, 4))
            inline.mix.fill_(2000.0)
    return [
        ("a Sequential whose 3rd layer overflows", sequential, big, "2"),
        ("a model with a nested block", nested, big, "block.fc2"),
        ("a model whose layers are defined in a different order than they run", backwards, big, "early"),
        ("a layer that gives +-inf, followed by one that turns it into NaN", inf_then_nan, big, "0"),
        ("a container whose own inline matmul overflows", inline, big, "b"),
        ("a model that stays finite", calm, quiet, None),
        ("a batch that already holds a NaN", calm, poisoned, "0"),
        ("a container whose own forward overflows after its (finite) layer", gained, big, "block"),
    ]


def dtype_cases():
    """(label, model, inputs, dtype, expected): the dtype argument decides the answer. The first case's float16
    overflow, run with dtype=bfloat16 (float32's range): nothing overflows, so the answer is None."""
    label, model, inputs, _ = finder_cases()[0]
    return [(f"{label}, run with dtype=bfloat16", model, inputs, torch.bfloat16, None)]


def tolerating_planted_error(fn):
    """``fn`` with ``PlantedError`` (the raising model's own error) turned into a return value of None:
    raising it is right for a finder, any other error is still the learner's."""

    @functools.wraps(fn)
    def call(*args):
        try:
            return fn(*args)
        except PlantedError:
            return None

    return call


def training_flags(model: nn.Module) -> tuple:
    """Every module's ``training`` flag, in ``modules()`` order (to see whether a call changed a mode)."""
    return tuple(module.training for module in model.modules())


def mode_change(before: tuple, after: tuple) -> str:
    """ "eval" when a module left training mode between two ``training_flags``, "train" when one entered it."""
    if any(was and not now for was, now in zip(before, after)):
        return "eval"
    return "train" if before != after else ""


# --------------------------------------------------------------------------------------------------
# 05.1: the answer and the known wrong approaches, replayed on the same cases
# --------------------------------------------------------------------------------------------------


def outputs_in_finish_order(model, inputs, dtype, *, autocast=True, top_only=False):
    """[(name, output)] in the order modules finished their forward (for the answer and wrong approaches)."""
    seen = []
    children = {id(m) for m in model.children()}
    handles = []
    for name, module in model.named_modules():
        if top_only and id(module) not in children:
            continue
        handles.append(module.register_forward_hook(lambda m, a, out, name=name: seen.append((name, out))))
    try:
        with torch.no_grad(), torch.autocast(device_type=inputs.device.type, dtype=dtype, enabled=autocast):
            model(inputs)
    finally:
        for handle in handles:
            handle.remove()
    return seen


def first_name(pairs, test=lambda t: not bool(torch.isfinite(t).all())):
    """The first name in ``pairs`` whose output is a tensor that passes ``test`` (default: non-finite)."""
    return next((name for name, out in pairs if isinstance(out, torch.Tensor) and test(out)), None)


def without_autocast(model, inputs, dtype):
    return first_name(outputs_in_finish_order(model, inputs, dtype, autocast=False))


def last_nonfinite(model, inputs, dtype):
    """The last non-finite output of a submodule (the model itself, '', is handled on its own)."""
    pairs = outputs_in_finish_order(model, inputs, dtype)
    return first_name([(name, out) for name, out in reversed(pairs) if name])


def nan_only(model, inputs, dtype):
    pairs = outputs_in_finish_order(model, inputs, dtype)
    return first_name(pairs, test=lambda t: bool(torch.isnan(t).any()))


def inf_only(model, inputs, dtype):
    pairs = outputs_in_finish_order(model, inputs, dtype)
    return first_name(pairs, test=lambda t: bool(torch.isinf(t).any()))


def top_level_only(model, inputs, dtype):
    return first_name(outputs_in_finish_order(model, inputs, dtype, top_only=True))


def in_definition_order(model, inputs, dtype):
    """The first non-finite submodule output, scanning modules in the order they are defined."""
    outputs = dict(outputs_in_finish_order(model, inputs, dtype))
    in_order = [(name, outputs[name]) for name, _ in model.named_modules() if name and name in outputs]
    return first_name(in_order)


# --------------------------------------------------------------------------------------------------
# 05.2: TextureNet cases, a learner's forward as a module, and the ops that hide an overflow
# --------------------------------------------------------------------------------------------------
HIDING_OPS = frozenset(
    {
        "clamp",
        "clamp_",
        "clip",
        "clip_",
        "nan_to_num",
        "nan_to_num_",
        "where",
        "masked_fill",
        "masked_fill_",
        "clamp_max",
        "clamp_min",
        "minimum",
        "maximum",
        "hardtanh",
    }
)


class WithForward(nn.Module):
    """``inner`` whose forward is ``forward_fn(inner, x)`` (so a real training step runs through a learner's
    forward)."""

    def __init__(self, inner, forward_fn):
        super().__init__()
        self.inner = inner
        self.forward_fn = forward_fn

    def forward(self, x):
        return self.forward_fn(self.inner, x)


def texture_case(seed: int):
    """A ``TextureNet`` and a batch of 8 that overflows under float16 autocast: ``(model, x, y)``."""
    model = TextureNet(seed=seed)
    x, y = texture_batch(n=8, seed=seed)
    return model, x, y


# --------------------------------------------------------------------------------------------------
# Which autocast a piece of code enters, and a pretend GPU
# --------------------------------------------------------------------------------------------------
_SWAPPED = {"cuda": "cpu", "cpu": "cuda"}
_DEVICE_ATTRIBUTES = ("device", "is_cuda", "is_cpu")


class Autocast(NamedTuple):
    """One ``torch.autocast`` a piece of code entered: the device type it named, enabled, and its dtype (the
    one it ran in: the device's default when ``dtype_given`` is False)."""

    device_type: str
    enabled: bool
    dtype: torch.dtype | None = None
    dtype_given: bool = True


@contextlib.contextmanager
def watch_autocast(*, swap: bool = False):
    """Record an ``Autocast`` for every ``torch.autocast`` entered inside (the yielded list).

    Every spelling is the same class underneath (``torch.autocast``, ``torch.amp.autocast``,
    ``torch.cpu.amp.autocast``, ``torch.cuda.amp.autocast``), so one wrapper around its ``__init__`` sees them
    all. ``swap=True`` also swaps "cpu" and "cuda" (see ``pretend_gpu``).
    """
    original = autocast_mode.autocast.__init__
    entered = []

    def init(self, device_type, dtype=None, enabled=True, cache_enabled=None):
        named = str(device_type)
        if swap:
            device_type = _SWAPPED.get(device_type, device_type)
        original(self, device_type, dtype=dtype, enabled=enabled, cache_enabled=cache_enabled)
        entered.append(Autocast(named, bool(enabled), getattr(self, "fast_dtype", dtype), dtype is not None))

    autocast_mode.autocast.__init__ = init
    try:
        yield entered
    finally:
        autocast_mode.autocast.__init__ = original


@contextlib.contextmanager
def pretend_gpu():
    """Inside, every tensor reports ``cuda:0`` as its device and autocast's "cpu"/"cuda" are swapped.

    Yields the list of autocasts entered (as the code named them). Enter the outer autocast that stands for
    CUDA's *before* this block, as ``torch.autocast("cpu", ...)``. Everything is restored on exit, also when
    the code raises; warnings about CUDA being unavailable are silenced inside (they are the pretence's).
    """
    cuda = torch.device("cuda", 0)
    saved = {name: torch.Tensor.__dict__.get(name) for name in _DEVICE_ATTRIBUTES}
    torch.Tensor.device = property(lambda self: cuda)
    torch.Tensor.is_cuda = property(lambda self: True)
    torch.Tensor.is_cpu = property(lambda self: False)
    try:
        with warnings.catch_warnings(), watch_autocast(swap=True) as entered:
            warnings.simplefilter("ignore")
            yield entered
    finally:
        for name, value in saved.items():
            if value is None:
                delattr(torch.Tensor, name)
            else:
                setattr(torch.Tensor, name, value)
