"""Lesson 08: probes that record what a gradient-accumulation step does, micro-batch by micro-batch.

The checker of exercise 08.1 hands the learner's ``accumulate_step`` real objects (the numbers are torch's
own) that also write down what happens to them, in order, into one ``Log`` (lesson 03's, see
``amp_lessons.l03_autocast_and_gradscaler.probes``):

- the model records each forward pass: autocast on, in which dtype, the batch size, the parameters' dtypes,
  and whether the gradients accumulated so far were *erased* or *changed* since the last backward (a
  post-accumulate-grad hook keeps a copy of each gradient as backward leaves it, so ``zero_grad`` or
  clipping inside the micro-batch loop is seen however it is spelled);
- a probe on each micro-batch's output runs first in that micro-batch's backward: autocast still on? the
  gradient arriving at the output, which is ``scale / N`` times the unscaled, undivided one when the loss
  was scaled and divided by the number of micro-batches ``N``; old gradients in ``.grad`` at the first one?
- the loss function records each loss value; the optimizer and the GradScaler (lesson 03's recording ones)
  record every public call, with the gradient norm the optimizer is about to use.

It runs on the CPU with lesson 03's tiny classifier, so a whole check takes a fraction of a second. As in
lesson 03, FP16 comes with an enabled GradScaler and BF16 (FP32's range: no loss scaling needed) with a
disabled one, and one scenario hands the step micro-batches and parameters that *say* they live on a CUDA
device (lesson 03's ``CudaLabelled``), so the device a step chooses for autocast is observed, never read from
its source. ``Seen`` is lesson 03's, plus the facts only a loop of micro-batches has (where in the loop a call
came, the gradient reaching each micro-batch's output).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from amp_lessons.core.autocast_state import autocast_dtype, autocast_enabled
from amp_lessons.core.models import TinyClassifier, seeded_weights
from amp_lessons.l03_autocast_and_gradscaler import probes as step_probes
from amp_lessons.l03_autocast_and_gradscaler.probes import (
    DEVICE_TYPE,
    CudaLabelled,
    Log,
    RecordingScaler,
    RecordingSGD,
    arriving_gradient,
    close,
    grads_all_zero,
)

ROWS = 4  # samples per micro-batch


def events(log: Log, name: str) -> list:
    """Every event called ``name`` in ``log``, in order."""
    return [e for e in log.events if e["name"] == name]


def _same(now: torch.Tensor | None, kept: torch.Tensor) -> bool:
    """Equal values (NaN equals NaN: an overflowing micro-batch leaves NaN/inf gradients)."""
    if now is None or now.shape != kept.shape:
        return False
    return bool(((now == kept) | (now.isnan() & kept.isnan())).all())


class _OutputProbe(torch.autograd.Function):
    """Identity on one micro-batch's output; its backward runs first and sees the state backward starts in."""

    @staticmethod
    def forward(ctx, x, watched, index):
        ctx.watched, ctx.index = watched, index
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        watched = ctx.watched
        stale = watched.log.count("backward") == 0 and not grads_all_zero(watched.parameters())  # the first
        watched.log.add(
            "backward",
            index=ctx.index,
            autocast=autocast_enabled(DEVICE_TYPE),
            **arriving_gradient(grad),
            stale=stale,
        )
        return grad, None, None


class WatchedModel(nn.Module):
    """A TinyClassifier whose forward records autocast, dtype, batch size and what happened to ``.grad``."""

    def __init__(self, log: Log, seed: int, cuda_labelled: bool = False):
        super().__init__()
        with seeded_weights(seed):
            self.core = TinyClassifier()
        if cuda_labelled:  # before the hooks: labelling replaces the parameters
            step_probes.label_as_cuda(self.core)
        self.log = log
        self.accumulated: dict = {}  # parameter name -> its .grad as the last backward left it
        for name, parameter in self.core.named_parameters():
            parameter.register_post_accumulate_grad_hook(lambda p, n=name: self._keep(n, p))

    def _keep(self, name, parameter) -> None:
        self.accumulated[name] = parameter.grad.detach().clone()

    def grads_since_backward(self) -> tuple[bool, bool]:
        """(erased, changed): were the gradients zeroed, or modified, since the last accumulation?"""
        if not self.accumulated:
            return False, False
        current = dict(self.core.named_parameters())
        now = {name: current[name].grad for name in self.accumulated}
        changed = any(not _same(now[name], kept) for name, kept in self.accumulated.items())
        all_zero = all(g is None or not bool(g.ne(0).any()) for g in now.values())
        had_some = any(bool(g.ne(0).any()) for g in self.accumulated.values())
        return all_zero and had_some, changed

    def forward(self, x):
        erased, changed = self.grads_since_backward()
        index = self.log.count("forward")
        self.log.add(
            "forward",
            index=index,
            autocast=autocast_enabled(DEVICE_TYPE),
            autocast_cuda=autocast_enabled("cuda"),
            dtype=autocast_dtype(DEVICE_TYPE),
            param_dtypes={p.dtype for p in self.parameters()},
            rows=int(x.shape[0]) if x.dim() else 0,
            erased=erased,
            changed=changed,
        )
        return _OutputProbe.apply(self.core(x), self, index)


class WatchedLoss:
    """Cross-entropy that records whether autocast was on, the outputs' dtype (see
    ``step_probes.WatchedLoss``) and the loss value."""

    def __init__(self, log: Log):
        self.log = log

    def __call__(self, outputs, targets):
        loss = F.cross_entropy(outputs, targets)
        self.log.add(
            "loss",
            autocast=autocast_enabled(DEVICE_TYPE),
            input_dtype=getattr(outputs, "dtype", None),
            value=float(loss.detach().float()),
        )
        return loss


# ----------------------------------------------------------------------------------------------- scenarios
# Six situations an accumulation step must get right, those of lesson 03 with micro-batches; the checker runs
# the learner's step and the reference from identical states in each. FP16 comes with an enabled GradScaler;
# BF16, which has FP32's range and needs no loss scaling, with a disabled one (every scaler call passes
# straight through, so the same step code runs).


@dataclass(frozen=True)
class Scenario(step_probes.Scenario):
    parts: int = 4  # micro-batches per step


SCENARIOS = (
    Scenario(
        "a normal FP16 step of 4 micro-batches (max_norm=None, old gradients left in .grad)",
        torch.float16,
        None,
        2.0**10,
        stale_grads=True,
        seed=1,
    ),
    Scenario(
        "an FP16 step of 4 micro-batches whose gradient norm is above max_norm=0.05",
        torch.float16,
        0.05,
        2.0**10,
        seed=2,
    ),
    Scenario(
        "an FP16 step of 2 micro-batches that overflows (init_scale=2**40, max_norm=1.0)",
        torch.float16,
        1.0,
        2.0**40,
        parts=2,
        seed=3,
    ),
    Scenario(
        "two consecutive FP16 steps of 3 micro-batches (growth_interval=1, max_norm=1.0)",
        torch.float16,
        1.0,
        2.0**8,
        parts=3,
        growth_interval=1,
        steps=2,
        seed=4,
    ),
    Scenario(
        "a BF16 step of 4 micro-batches with a disabled GradScaler "
        "(BF16 needs no loss scaling), max_norm=0.05",
        torch.bfloat16,
        0.05,
        1.0,
        seed=2,
        scaler_enabled=False,
    ),
    Scenario(
        "a BF16 step of 2 micro-batches on a CUDA device (inputs.device.type == 'cuda', scaler disabled)",
        torch.bfloat16,
        None,
        1.0,
        parts=2,
        seed=5,
        scaler_enabled=False,
        cuda_labelled=True,
    ),
)


class ProbedRun:
    """One training run (model, optimizer, scaler, micro-batches); every part records into one ``Log``."""

    def __init__(self, scenario: Scenario):
        self.scenario = scenario
        self.log = Log()
        self.model = WatchedModel(self.log, seed=scenario.seed, cuda_labelled=scenario.cuda_labelled)
        self.optimizer = RecordingSGD(self.model.parameters(), self.log)
        self.scaler = RecordingScaler(
            self.log,
            init_scale=scenario.init_scale,
            growth_interval=scenario.growth_interval,
            enabled=scenario.scaler_enabled,
        )
        self.loss_fn = WatchedLoss(self.log)
        g = torch.Generator().manual_seed(200 + scenario.seed)
        self.batches = [
            [
                (torch.randn(ROWS, 6, generator=g) * 2, torch.randint(0, 4, (ROWS,), generator=g))
                for _ in range(scenario.parts)
            ]
            for _ in range(scenario.steps)
        ]
        if scenario.cuda_labelled:
            self.batches = [
                [(x.as_subclass(CudaLabelled), y.as_subclass(CudaLabelled)) for x, y in batch]
                for batch in self.batches
            ]
        if scenario.stale_grads:
            for p in self.model.parameters():
                p.grad = torch.randn(p.shape, generator=g)

    def new_log(self) -> Log:
        """A fresh record for the next call, shared by every probe of the run."""
        self.log = self.model.log = self.loss_fn.log = self.optimizer._log = self.scaler._log = Log()
        self.model.accumulated = {}
        return self.log

    def micro_batches(self, index: int) -> list:
        """Copies of call ``index``'s micro-batches (the learner may change what it is given)."""
        return [(x.clone(), y.clone()) for x, y in self.batches[index]]

    def step_arguments(self, index: int) -> tuple:
        """The positional arguments of call ``index``: the run's objects and copies of its micro-batches."""
        return self.model, self.optimizer, self.scaler, self.loss_fn, self.micro_batches(index)


# ------------------------------------------------------------------------------ what the checker reads


@dataclass
class Seen(step_probes.Seen):
    """Lesson 03's facts about one call next to the reference call, and those of a loop of micro-batches."""

    step_name: ClassVar[str] = "accumulate_step"

    @property
    def parts(self) -> int:
        return self.scenario.parts

    @property
    def scale(self) -> float:
        """The loss scale the step started with."""
        return self.got.scale_before

    def forwards(self) -> list:
        return events(self.log, "forward")

    @property
    def low_param_dtypes(self) -> set:
        """Parameter dtypes other than float32, seen in any forward pass or after the step."""
        low = {d for d in self.got.param_dtypes_after if d != torch.float32}
        for event in self.forwards():
            low |= {d for d in event["param_dtypes"] if d != torch.float32}
        return low

    def position(self, name: str, last: bool = False) -> int:
        """Index of the first (or last) event ``name``; -1 when there is none."""
        names = self.names
        if name not in names:
            return -1
        return len(names) - 1 - names[::-1].index(name) if last else names.index(name)

    def inside_loop(self, name: str) -> bool:
        """``name`` came before the last backward, or in a loop that an error cut short after a backward."""
        cut_short = bool(self.error) and self.log.count("backward") < self.parts
        before_last = 0 <= self.position(name) < self.position("backward", last=True)
        return before_last or (cut_short and 0 <= self.position("backward") < self.position(name))

    def between_backwards(self, name: str) -> bool:
        first, last = self.position("backward"), self.position("backward", last=True)
        return any(first < i < last for i, n in enumerate(self.names) if n == name)

    def output_gradient_ratio(self) -> float:
        """Gradient reaching each micro-batch's output / the reference's (median; NaN when not comparable)."""
        ref = {e["index"]: e for e in events(self.ref.log, "backward")}
        ratios = [
            e["grad_absmax"] / ref[e["index"]]["grad_absmax"]
            for e in events(self.log, "backward")
            if e["index"] in ref
            and e["finite"]
            and ref[e["index"]]["finite"]
            and ref[e["index"]]["grad_absmax"] > 0
        ]
        return sorted(ratios)[len(ratios) // 2] if ratios else math.nan

    def ratio_is(self, factor: float) -> bool:
        return close(self.output_gradient_ratio(), factor, 0.05)
