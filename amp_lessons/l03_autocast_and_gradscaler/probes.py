"""Lesson 03: probes that record what a training step does, call by call, so a mistake can be *seen*.

The checker of lesson 03 hands the learner's ``train_step`` a model, a loss function, an optimizer and a
GradScaler that are all real (the numbers are torch's own) but also write down what happens to them:

- the model records, at every forward, whether autocast was on, in which dtype, and the parameters' dtypes
  (``.half()`` on the model shows up here);
- a probe on the model output runs first in backward, so it sees the state backward *starts* in: autocast
  still on? gradients of an earlier step still in ``.grad``? by how much was the loss scaled?
- the optimizer and the scaler record each public call in order, with the gradient norm the optimizer is
  about to use (clipping before ``unscale_``, when the true norm exceeds ``max_norm``, shows up as a norm
  ``scale`` times too small).

Each probe records *before* doing the real work, so the record survives an error in the learner's code.
``CallRecord`` keeps what one call did; ``Seen`` puts the learner's call next to the reference call from the
same state and offers the facts the checker's rules read (the norm the optimizer used, how much the loss was
scaled, which parameter differs).

One scenario hands the step data that *says* it lives on a CUDA device (``CudaLabelled``: a CPU tensor whose
``.device`` and ``.is_cuda`` report CUDA; the model's parameters say the same). The arithmetic still runs on
the CPU, but a step that takes its device type from the data now asks for CUDA autocast, and one that
hard-codes ``"cpu"`` switches on CPU autocast: the device a step chooses is observed, not read from its
source.
"""

from __future__ import annotations

import contextlib
import math
import warnings
from dataclasses import dataclass, field
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from amp_lessons.core.autocast_state import autocast_dtype, autocast_enabled, switch_autocast_off
from amp_lessons.core.cuda_labelled import (  # noqa: F401  (CudaLabelledParameter: the probes' API)
    CudaLabelled,
    CudaLabelledParameter,
    label_as_cuda,
)
from amp_lessons.core.models import TinyClassifier, seeded_weights
from amp_lessons.l03_autocast_and_gradscaler.training import total_grad_norm

DEVICE_TYPE = "cpu"  # the probes run on the CPU, whatever the learner's machine has


def grad_norm(parameters) -> float:
    """Total 2-norm of the gradients (missing gradients count as zero); inf/NaN stay visible."""
    return float(total_grad_norm(parameters))


def grads_all_zero(parameters) -> bool:
    return all(p.grad is None or not bool(p.grad.detach().ne(0).any()) for p in parameters)


class Log:
    """What happened during one call of a training step, in order."""

    def __init__(self):
        self.events: list = []
        self.inside_scaler_step = False  # optimizer.step() called by scaler.step() vs. by the learner

    def add(self, name: str, **info) -> dict:
        event = {"name": name, **info}
        self.events.append(event)
        return event

    def names(self) -> list:
        return [e["name"] for e in self.events]

    def first(self, name: str):
        return next((e for e in self.events if e["name"] == name), None)

    def count(self, name: str) -> int:
        return sum(1 for e in self.events if e["name"] == name)

    def between(self, name: str, start: str, end: str) -> bool:
        """True when ``name`` happens after the first ``start`` and before the first ``end`` (or the end)."""
        names = self.names()
        if start not in names:
            return False
        stop = names.index(end) if end in names else len(names)
        return name in names[names.index(start) : stop]

    def after_last(self, first: str, then: str) -> bool:
        """True when an event ``first`` happens after the last ``then``."""
        names = self.names()
        if first not in names or then not in names:
            return False
        last_then = len(names) - 1 - names[::-1].index(then)
        return any(i > last_then for i, n in enumerate(names) if n == first)


def arriving_gradient(grad: torch.Tensor) -> dict:
    """What backward brings to a model output: is it finite, its largest magnitude (inf when it is not)."""
    g = grad.detach().float()
    finite = bool(torch.isfinite(g).all())
    return {"finite": finite, "grad_absmax": float(g.abs().max()) if finite else float("inf")}


class _OutputProbe(torch.autograd.Function):
    """Identity on the model output; its backward runs first, so it sees the state backward starts in."""

    @staticmethod
    def forward(ctx, x, watched):
        ctx.watched = watched
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        watched = ctx.watched
        watched.log.add(
            "backward",
            autocast=autocast_enabled(DEVICE_TYPE),
            **arriving_gradient(grad),
            stale=not grads_all_zero(watched.parameters()),
        )
        return grad, None


class WatchedModel(nn.Module):
    """A TinyClassifier whose forward records the autocast state and the parameters' dtypes."""

    def __init__(self, log: Log, seed: int = 0):
        super().__init__()
        with seeded_weights(seed):
            self.core = TinyClassifier()
        self.log = log

    def forward(self, x):
        self.log.add(
            "forward",
            autocast=autocast_enabled(DEVICE_TYPE),
            autocast_cuda=autocast_enabled("cuda"),
            dtype=autocast_dtype(DEVICE_TYPE),
            param_dtypes={p.dtype for p in self.parameters()},
        )
        return _OutputProbe.apply(self.core(x), self)


class WatchedLoss:
    """Cross-entropy that records whether autocast was on, and the dtype of the outputs it was given.

    A loss computed after autocast on outputs cast to FP32 (``loss_fn(model(x).float(), y)``) is as precise as
    autocast's float32 policy would make it, so only a loss on low-precision outputs outside autocast is a
    mistake: the checkers need both facts.
    """

    def __init__(self, log: Log):
        self.log = log

    def __call__(self, outputs, targets):
        self.log.add(
            "loss", autocast=autocast_enabled(DEVICE_TYPE), input_dtype=getattr(outputs, "dtype", None)
        )
        return F.cross_entropy(outputs, targets)


class RecordingSGD(torch.optim.SGD):
    """SGD that records zero_grad() and step(), and whether step() came from scaler.step()."""

    def __init__(self, params, log: Log, lr: float = 0.1):
        super().__init__(params, lr=lr)
        self._log = log

    def zero_grad(self, set_to_none: bool = True):
        self._log.add("zero_grad")
        return super().zero_grad(set_to_none=set_to_none)

    def step(self, closure=None):
        params = [p for group in self.param_groups for p in group["params"]]
        self._log.add("optimizer.step", via_scaler=self._log.inside_scaler_step, norm=grad_norm(params))
        return super().step(closure)


class RecordingScaler(torch.amp.GradScaler):
    """A real GradScaler that records each public call (before doing it, so the record survives errors)."""

    def __init__(self, log: Log, **kwargs):
        super().__init__(DEVICE_TYPE, **kwargs)
        self._log = log

    def _params(self, optimizer):
        return [p for group in optimizer.param_groups for p in group["params"]]

    def scale(self, outputs):
        self._log.add("scale")
        return super().scale(outputs)

    def unscale_(self, optimizer):
        if self._log.inside_scaler_step:  # step() unscales by itself when the learner did not
            return super().unscale_(optimizer)
        self._log.add("unscale_", norm_before=grad_norm(self._params(optimizer)))
        return super().unscale_(optimizer)

    def step(self, optimizer, *args, **kwargs):
        names = self._log.names()
        since_update = names[len(names) - names[::-1].index("update") :] if "update" in names else names
        unscaled = "unscale_" in since_update or not self.is_enabled()
        scale = self.current_scale()
        params = self._params(optimizer)
        self._log.add(
            "scaler.step",
            unscaled=unscaled,
            norm=grad_norm(params),
            scale=scale,
            all_zero=grads_all_zero(params),
        )
        self._log.inside_scaler_step = True
        try:
            return super().step(optimizer, *args, **kwargs)
        finally:
            self._log.inside_scaler_step = False

    def update(self, new_scale=None):
        self._log.add("update")
        return super().update(new_scale)

    def current_scale(self) -> float:
        """The scale now: 1.0 for a disabled scaler, NaN before the first scale() of an enabled one."""
        if not self.is_enabled():
            return 1.0
        scale = getattr(self, "_scale", None)
        return float(scale) if scale is not None else float("nan")


class UpdateCountingScaler(torch.amp.GradScaler):
    """A real GradScaler that counts its update() calls (the scheduler check hands it to the learner)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.updates = 0

    def update(self, new_scale=None):
        self.updates += 1
        return super().update(new_scale)


class CountingStepLR(torch.optim.lr_scheduler.StepLR):
    """StepLR that counts the learner's calls to step()."""

    def __init__(self, optimizer):
        self.calls = 0
        super().__init__(optimizer, step_size=1, gamma=0.9)
        self.calls = 0  # the constructor's own initial step does not count

    def step(self, *args, **kwargs):
        self.calls += 1
        return super().step(*args, **kwargs)


# ----------------------------------------------------------------------------------------------- scenarios
# Six situations a training step must get right; the checker runs the learner's step and the reference step
# from identical states in each. FP16 comes with an enabled GradScaler; BF16, which has FP32's range and needs
# no loss scaling, with a disabled one (``GradScaler(enabled=False)``: the same step code, and every scaler
# call passes straight through), as a training script would create it.


@dataclass(frozen=True)
class Scenario:
    title: str
    dtype: torch.dtype
    max_norm: float | None
    init_scale: float
    growth_interval: int = 2000
    steps: int = 1
    stale_grads: bool = False
    seed: int = 0
    scaler_enabled: bool = True
    cuda_labelled: bool = False  # the data and the parameters report a CUDA device (see CudaLabelled)


SCENARIOS = (
    Scenario(
        "a normal FP16 step (max_norm=None, old gradients left in .grad)",
        torch.float16,
        None,
        2.0**10,
        stale_grads=True,
        seed=1,
    ),
    Scenario(
        "an FP16 step whose unscaled gradient norm is above max_norm=0.05",
        torch.float16,
        0.05,
        2.0**10,
        seed=2,
    ),
    Scenario(
        "an FP16 step that overflows (init_scale=2**40, max_norm=1.0)", torch.float16, 1.0, 2.0**40, seed=3
    ),
    Scenario(
        "two consecutive FP16 steps (growth_interval=1, max_norm=1.0)",
        torch.float16,
        1.0,
        2.0**8,
        growth_interval=1,
        steps=2,
        seed=4,
    ),
    Scenario(
        "a BF16 step with a disabled GradScaler (BF16 needs no loss scaling), max_norm=0.05",
        torch.bfloat16,
        0.05,
        1.0,
        seed=2,
        scaler_enabled=False,
    ),
    Scenario(
        "a BF16 step on data on a CUDA device (inputs.device.type == 'cuda', scaler disabled)",
        torch.bfloat16,
        None,
        1.0,
        seed=5,
        scaler_enabled=False,
        cuda_labelled=True,
    ),
)


class ProbedRun:
    """One training run (model, optimizer, scaler, data) whose every part records into the same ``Log``."""

    def __init__(self, scenario: Scenario):
        self.scenario = scenario
        self.log = Log()
        self.model = WatchedModel(self.log, seed=scenario.seed)
        if scenario.cuda_labelled:
            label_as_cuda(self.model)
        self.optimizer = RecordingSGD(self.model.parameters(), self.log, lr=0.1)
        self.scaler = RecordingScaler(
            self.log,
            init_scale=scenario.init_scale,
            growth_interval=scenario.growth_interval,
            enabled=scenario.scaler_enabled,
        )
        self.loss_fn = WatchedLoss(self.log)
        g = torch.Generator().manual_seed(100 + scenario.seed)
        self.batches = [
            (torch.randn(8, 6, generator=g) * 2, torch.randint(0, 4, (8,), generator=g))
            for _ in range(scenario.steps)
        ]
        if scenario.cuda_labelled:
            self.batches = [
                (x.as_subclass(CudaLabelled), y.as_subclass(CudaLabelled)) for x, y in self.batches
            ]
        if scenario.stale_grads:
            for p in self.model.parameters():
                p.grad = torch.randn(p.shape, generator=g)

    def new_log(self) -> Log:
        """A fresh record for the next call, shared by every probe of the run."""
        self.log = self.model.log = self.loss_fn.log = self.optimizer._log = self.scaler._log = Log()
        return self.log

    def step_arguments(self, index: int) -> tuple:
        """The positional arguments of call ``index``: the run's objects and copies of its batch (the learner
        may change what it is given)."""
        inputs, targets = self.batches[index]
        return self.model, self.optimizer, self.scaler, self.loss_fn, inputs.clone(), targets.clone()


# ------------------------------------------------------------ what the checker reads: one call, two ways


def close(a: float, b: float, rtol: float) -> bool:
    """Relatively close, both finite (a non-finite number is never close to anything)."""
    if not (math.isfinite(a) and math.isfinite(b)):
        return False
    return abs(a - b) <= rtol * max(abs(a), abs(b), 1e-30)


@dataclass
class CallRecord:
    """Everything observed during one call of a training step."""

    log: Log
    returned: object = None
    problem: object = None  # the checker's LearnerProblem when the call failed
    warnings: list = field(default_factory=list)
    new_scalers: int = 0
    autocast_left_on: bool = False
    left_in_eval: bool = False  # a training step that calls model.eval() and leaves it there
    norm_after: float = 0.0
    scale_before: float = 0.0
    scale_after: float = float("nan")
    params_after: list = field(default_factory=list)
    param_dtypes_after: set = field(default_factory=set)


@contextlib.contextmanager
def recorded_call(run):
    """Around one call of a step on ``run`` (a ``ProbedRun``): yields a fresh ``CallRecord`` for the caller to
    fill in (``returned``, or ``problem`` when the learner's code failed).

    While the call runs, every GradScaler it creates is counted and torch's warnings are kept; afterwards an
    autocast the call left switched on is recorded and switched off, a model left in eval mode is recorded and
    put back in train mode, and the state the call left behind (the parameters, their dtypes and gradient
    norm, the loss scale) is recorded.
    """
    record = CallRecord(run.new_log(), scale_before=run.scaler.get_scale())
    original_init = torch.amp.GradScaler.__init__

    def counting_init(scaler_self, *args, **kwargs):
        record.new_scalers += 1
        original_init(scaler_self, *args, **kwargs)

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.amp.GradScaler.__init__ = counting_init
        try:
            yield record
        finally:
            torch.amp.GradScaler.__init__ = original_init
            record.autocast_left_on = autocast_enabled(DEVICE_TYPE) or autocast_enabled("cuda")
            if record.autocast_left_on:
                switch_autocast_off()
    record.warnings = [str(w.message) for w in caught]
    record.left_in_eval = not run.model.training
    run.model.train()
    params = list(run.model.parameters())
    record.norm_after = grad_norm(params)
    record.params_after = [p.detach().clone() for p in params]
    record.param_dtypes_after = {p.dtype for p in params}
    record.scale_after = run.scaler.current_scale()


@dataclass
class Seen:
    """The facts every rule reads: the learner's call (``got``) next to the reference call (``ref``)."""

    ref: CallRecord
    got: CallRecord
    scenario: Scenario
    step_no: int = 0
    step_name: ClassVar[str] = "train_step"  # the learner's function, as messages name it

    @property
    def where(self) -> str:
        more = f", call {self.step_no + 1}" if self.scenario.steps > 1 else ""
        return f"In {self.scenario.title}{more}"

    @property
    def log(self) -> Log:
        return self.got.log

    @property
    def names(self) -> list:
        return self.got.log.names()

    @property
    def error(self) -> str:
        """The message of the learner's exception (or of its wrong signature), '' when it returned."""
        return self.got.problem.result.message if self.got.problem is not None else ""

    @property
    def lower(self) -> str:
        """The warnings and the error, in lower case: what torch said about the learner's calls."""
        return (" ".join(self.got.warnings) + " " + self.error).lower()

    def event(self, name: str):
        return self.got.log.first(name)

    def ref_event(self, name: str):
        return self.ref.log.first(name)

    @property
    def max_norm(self):
        return self.scenario.max_norm

    @property
    def scaling(self) -> bool:
        """The scaler of this scenario is enabled (FP16); a disabled one (BF16) passes every call through."""
        return self.scenario.scaler_enabled

    @property
    def autocast_expected(self) -> bool:
        """The reference step's forward pass ran under CPU autocast (not so on data on a CUDA device)."""
        return bool(self.ref_event("forward")["autocast"])

    @property
    def low_param_dtypes(self) -> set:
        """Parameter dtypes other than float32, seen during the forward pass or after the step."""
        forward = self.event("forward")
        dtypes = set(self.got.param_dtypes_after) | (forward["param_dtypes"] if forward else set())
        return {d for d in dtypes if d != torch.float32}

    @property
    def output_grads_finite(self) -> bool:
        """Both calls had a backward whose gradient at the model output is finite."""
        ref_backward, backward = self.ref_event("backward"), self.event("backward")
        return bool(ref_backward and ref_backward["finite"] and backward and backward["finite"])

    @property
    def output_grad_ratio(self) -> float:
        """The gradient at the model output over the unscaled one: how much the loss was really scaled."""
        unscaled = self.ref_event("backward")["grad_absmax"] / self.got.scale_before
        return self.event("backward")["grad_absmax"] / unscaled

    @property
    def scaler_step(self) -> dict:
        return self.event("scaler.step")

    @property
    def scale_used(self) -> float:
        """The loss scale of this step: the one scaler.step saw, else the one the step started with."""
        return self.scaler_step["scale"] if self.scaler_step else self.got.scale_before

    @property
    def norm_used(self) -> float:
        """The gradient norm the learner's optimizer used (scaler.step unscales when the learner has not)."""
        return _norm_used(self.got.log)

    @property
    def norm_expected(self) -> float:
        return _norm_used(self.ref.log)

    @property
    def norm_finite(self) -> bool:
        """An overflowing step is judged by what happened to the parameters and the scale, not by its norm."""
        return math.isfinite(self.norm_expected) and math.isfinite(self.norm_used)

    @property
    def clipped_wrong(self) -> bool:
        return self.norm_finite and not close(self.norm_used, self.norm_expected, 0.02)

    @property
    def clipped_scaled(self) -> bool:
        """The optimizer's norm is max_norm / scale: clip_grad_norm_ saw the still-scaled gradients."""
        if self.max_norm is None:
            return False
        return close(self.norm_used, self.max_norm / self.scale_used, 0.05)

    @property
    def unclipped_norm(self) -> float:
        """The true (unscaled) gradient norm before clipping, from the reference step."""
        ref_unscale = self.ref_event("unscale_")
        if not ref_unscale:
            return float("nan")
        return ref_unscale["norm_before"] / self.ref_event("scaler.step")["scale"]

    @property
    def first_param_difference(self):
        """(reference, learner's) parameter for the first parameter the two steps left different; or None."""
        for p_ref, p_got in zip(self.ref.params_after, self.got.params_after):
            if p_ref.shape != p_got.shape or not torch.allclose(
                p_ref, p_got, rtol=1e-3, atol=1e-5, equal_nan=True
            ):
                return p_ref, p_got
        return None

    @property
    def returned_number(self) -> float | None:
        """The learner's return value as a float, None when it is not one number."""
        value = self.got.returned
        if isinstance(value, torch.Tensor):
            return float(value.detach().float()) if value.numel() == 1 else None
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        return None


def _norm_used(log: Log) -> float:
    """The gradient norm the optimizer used: the norm at its first step(), else (a skipped step) the one
    scaler.step() saw, unscaled as step() would have unscaled it."""
    step = log.first("optimizer.step")
    if step is not None:
        return step["norm"]
    step = log.first("scaler.step")
    return step["norm"] if step["unscaled"] else step["norm"] / step["scale"]
