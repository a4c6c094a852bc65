"""Lesson 03: probes that record what a training step does, call by call, so a mistake can be *seen*.

The checker of lesson 03 hands the learner's ``train_step`` a model, a loss function, an optimizer and a
GradScaler that are all real (the numbers are torch's own) but also write down what happens to them:

- the model records, at every forward, whether autocast was on, in which dtype, and the parameters' dtypes
  (``.half()`` on the model shows up here);
- a probe on the model output runs first in backward, so it sees the state backward *starts* in: autocast
  still on? gradients of an earlier step still in ``.grad``? by how much was the loss scaled?
- the optimizer and the scaler record each public call in order, with the gradient norm the optimizer is
  about to use (clipping before ``unscale_`` shows up as a norm ``scale`` times too small).

Each probe records *before* doing the real work, so the record survives an error in the learner's code.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from amp_lessons.autocast_state import autocast_dtype, autocast_enabled
from amp_lessons.models import TinyClassifier, seeded_weights
from amp_lessons.training import total_grad_norm

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
        return name in names[names.index(start):stop]

    def after_last(self, first: str, then: str) -> bool:
        """True when an event ``first`` happens after the last ``then``."""
        names = self.names()
        if first not in names or then not in names:
            return False
        last_then = len(names) - 1 - names[::-1].index(then)
        return any(i > last_then for i, n in enumerate(names) if n == first)


class _OutputProbe(torch.autograd.Function):
    """Identity on the model output; its backward runs first, so it sees the state backward starts in."""

    @staticmethod
    def forward(ctx, x, watched):
        ctx.watched = watched
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        watched = ctx.watched
        g = grad.detach().float()
        finite = bool(torch.isfinite(g).all())
        watched.log.add(
            "backward",
            autocast=autocast_enabled(DEVICE_TYPE),
            grad_absmax=float(g.abs().max()) if finite else float("inf"),
            finite=finite,
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
    """Cross-entropy that records whether autocast was on when the loss was computed."""

    def __init__(self, log: Log):
        self.log = log

    def __call__(self, outputs, targets):
        self.log.add("loss", autocast=autocast_enabled(DEVICE_TYPE))
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
        self._log.add("optimizer.step", via_scaler=self._log.inside_scaler_step)
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
        since_update = names[len(names) - names[::-1].index("update"):] if "update" in names else names
        unscaled = "unscale_" in since_update
        scale = float(self._scale) if self._scale is not None else float("nan")
        params = self._params(optimizer)
        self._log.add("scaler.step", unscaled=unscaled, norm=grad_norm(params), scale=scale,
                      all_zero=grads_all_zero(params))
        self._log.inside_scaler_step = True
        try:
            return super().step(optimizer, *args, **kwargs)
        finally:
            self._log.inside_scaler_step = False

    def update(self, new_scale=None):
        self._log.add("update")
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
# Four situations a training step must get right; the checker runs the learner's step and the reference step
# from identical states in each.


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


SCENARIOS = (
    Scenario("a normal FP16 step (max_norm=None, old gradients left in .grad)", torch.float16, None, 2.0**10,
             stale_grads=True, seed=1),
    Scenario("a BF16 step whose unscaled gradient norm is above max_norm=0.05", torch.bfloat16, 0.05,
             2.0**10, seed=2),
    Scenario("an FP16 step that overflows (init_scale=2**40, max_norm=1.0)", torch.float16, 1.0, 2.0**40,
             seed=3),
    Scenario("two consecutive FP16 steps (growth_interval=1, max_norm=1.0)", torch.float16, 1.0, 2.0**8,
             growth_interval=1, steps=2, seed=4),
)


class ProbedRun:
    """One training run (model, optimizer, scaler, data) whose every part records into the same ``Log``."""

    def __init__(self, scenario: Scenario):
        self.scenario = scenario
        self.log = Log()
        self.model = WatchedModel(self.log, seed=scenario.seed)
        self.optimizer = RecordingSGD(self.model.parameters(), self.log, lr=0.1)
        self.scaler = RecordingScaler(self.log, init_scale=scenario.init_scale,
                                      growth_interval=scenario.growth_interval)
        self.loss_fn = WatchedLoss(self.log)
        g = torch.Generator().manual_seed(100 + scenario.seed)
        self.batches = [(torch.randn(8, 6, generator=g) * 2, torch.randint(0, 4, (8,), generator=g))
                        for _ in range(scenario.steps)]
        if scenario.stale_grads:
            for p in self.model.parameters():
                p.grad = torch.randn(p.shape, generator=g)

    def new_log(self) -> Log:
        """A fresh record for the next call, shared by every probe of the run."""
        self.log = self.model.log = self.loss_fn.log = self.optimizer._log = self.scaler._log = Log()
        return self.log
