"""Lesson 09's code that runs *beside the learner's step*: the two gloo ranks and the 6 steps each takes.

Why this is not in ``check.py``. The check runs the learner's ``synced_train_step`` on 2 processes joined by a
gloo group, forked from the process where that function lives. In a notebook that is the learner's kernel,
and the checker runs there too. When a class is graded, the learner's function lives in a sandboxed kernel
and the checker in the judge (``amp_lessons.tools.grade``), which the kernel's code never reaches: ranks
forked by the judge could not call the learner's function. So the checker asks for :func:`run_synced_ranks`
to be run beside the learner's function (``harness.run_beside_learner``): it starts the ranks there, each
runs the scenario below, and what they saw comes back as plain data (weights as tensors, scales, returned
losses, messages).

What is here is the *scenario* only (the model, the batches, the plan of the 6 steps), no reference value
and no verdict: the checker computes the right and the known wrong trajectories itself, in its own process,
from this same scenario, and accepts a report only when it equals the right one. A learner who changes this
module in their kernel changes the report, never what it is compared with.
"""

from __future__ import annotations

import functools

import torch
from torch import nn

from amp_lessons.checks.harness import NOT_DONE, LearnerProblem, as_number, call_learner
from amp_lessons.core.models import TinyClassifier, seeded_weights
from amp_lessons.l09_amp_across_processes.distributed import run_ranks

WORLD = 2
ROWS = 8  # rows per rank and step
SPIKE_STEP, SPIKE_RANK = 2, 1
PLAN = (None, None, None, 0.05, None, 0.05)  # max_norm per step: steps 3 and 5 clip
LOSS_SPIKE = 1e37  # finite, but times any loss scale >= 32 it overflows float32
INIT_SCALE = 2.0**10
NAME = "`synced_train_step`"


class MinimalSGD:
    """Plain SGD (``p -= lr * p.grad``, what ``torch.optim.SGD(lr=...)`` does without momentum) with the
    interface a training step uses: ``param_groups``, ``zero_grad``, ``step``; GradScaler accepts it.

    Why not ``torch.optim.SGD``: building the first torch.optim optimizer in a process imports
    ``torch._dynamo``, several seconds in each freshly spawned rank (macOS, Windows), which would eat the
    check's time budget before the learner's code even runs. SGD, not Adam, because a summed gradient
    must show up as a doubled step (Adam is scale-invariant and would hide it).
    """

    def __init__(self, params, lr: float):
        self.param_groups = [{"params": list(params), "lr": lr}]
        self.state = {}

    def zero_grad(self, set_to_none: bool = True) -> None:
        for group in self.param_groups:
            for p in group["params"]:
                if set_to_none:
                    p.grad = None
                elif p.grad is not None:
                    p.grad.detach_().zero_()

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    p.add_(p.grad, alpha=-group["lr"])


def fresh_replica():
    """One rank's model, optimizer and scaler, the same on every rank (and in the checker's replays)."""
    with seeded_weights(3):
        model = TinyClassifier(in_features=6, hidden=16, classes=4)
    optimizer = MinimalSGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu", init_scale=INIT_SCALE, growth_interval=3)
    return model, optimizer, scaler


def rank_batch(step: int, rank: int):
    """Rank ``rank``'s slice of step ``step``'s fixed batch."""
    generator = torch.Generator().manual_seed(500 + step)
    inputs = torch.randn(WORLD * ROWS, 6, generator=generator)
    targets = torch.randint(0, 4, (WORLD * ROWS,), generator=generator)
    inputs[ROWS:] *= 3.0  # rank 1's rows: larger gradients, so the ranks' own norms differ
    return inputs.chunk(WORLD)[rank].clone(), targets.chunk(WORLD)[rank].clone()


def spiked_loss(outputs, targets):
    """Rank 1's loss at the spike step: finite (about 1e37), inf once the scaler multiplies it."""
    return nn.functional.cross_entropy(outputs, targets) * LOSS_SPIKE


def rank_loss_fn(step: int, rank: int):
    """The loss function rank ``rank`` is given at step ``step``: the spiked one once, on rank 1."""
    return spiked_loss if (step == SPIKE_STEP and rank == SPIKE_RANK) else nn.functional.cross_entropy


def flat_weights(model) -> torch.Tensor:
    """All of a model's parameters as one flat vector (a copy)."""
    return torch.cat([p.detach().reshape(-1).clone() for p in model.parameters()])


def _returned(value):
    """The learner's return value as a float, or the message saying what it was instead."""
    try:
        return as_number(
            value,
            f"{NAME} returned",
            "return the loss averaged over ranks (a number or a one-element tensor)",
        )
    except LearnerProblem as problem:
        return problem.result.message


def warm_up(dtype: torch.dtype) -> None:
    """A first autocast step, so that what it sets up on first use is ready before the learner's steps are
    timed: run in each rank before it reports ready, and once in the parent before it forks."""
    model, optimizer, scaler = fresh_replica()
    with torch.autocast("cpu", dtype=dtype):
        loss = model(torch.zeros(2, 6)).float().sum()
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()


def rank_task(rank: int, world: int, fn, dtype) -> dict:
    """What each of the 2 processes runs: 6 steps of the learner's function, recording after each.

    A learner's problem (an exception, a wrong signature, a stub) stops this rank and comes back as its
    message and status: the checker, not this process, turns it into a failed result.
    """
    model, optimizer, scaler = fresh_replica()
    records = []
    for step, max_norm in enumerate(PLAN):
        inputs, targets = rank_batch(step, rank)
        try:
            value = call_learner(
                fn,
                model,
                optimizer,
                scaler,
                rank_loss_fn(step, rank),
                inputs,
                targets,
                dtype=dtype,
                max_norm=max_norm,
                what=NAME,
            )
        except LearnerProblem as problem:
            status = NOT_DONE if problem.result.status == NOT_DONE else "failed"
            return {"problem": problem.result.message, "status": status, "step": step, "records": records}
        records.append(
            {"returned": _returned(value), "params": flat_weights(model), "scale": float(scaler.get_scale())}
        )
    return {"records": records}


def run_synced_ranks(
    synced_train_step,
    dtype: torch.dtype,
    *,
    timeout_s: float,
    start_timeout_s: float,
    collective_timeout_s: float,
    method: str,
) -> dict:
    """Start the 2 gloo ranks here, run :func:`rank_task` on each, and report what happened as plain data:
    ``{"method", "seconds", "ranks": [{"rank", "status", "value", "error", "output", "seconds"}, ...]}``
    (each ``value`` as :func:`rank_task` returned it). The deadlines are the checker's."""
    if method == "fork":
        warm_up(dtype)  # forked ranks inherit what the first autocast step set up
    result = run_ranks(
        rank_task,
        synced_train_step,
        dtype,
        world_size=WORLD,
        timeout_s=timeout_s,
        start_timeout_s=start_timeout_s,
        collective_timeout_s=collective_timeout_s,
        prepare=functools.partial(warm_up, dtype),
        method=method,
    )
    return {
        "method": str(result.method),
        "seconds": float(result.seconds),
        "ranks": [
            {
                "rank": int(o.rank),
                "status": str(o.status),
                "value": o.value if o.status == "ok" else None,
                "error": str(o.error),
                "output": str(o.output),
                "seconds": float(o.seconds),
            }
            for o in result.outcomes
        ],
    }


__all__ = ["rank_task", "run_synced_ranks", "spiked_loss"]
