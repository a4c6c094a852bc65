"""Lesson 10: one small training task, run with every design, so their losses can be compared with the FP32 run.

Why this task: the course's 2-D sector classification (the labels of lesson 04's data), learnt by a bias-free MLP with
a 64x64 hidden layer, full batch, Adam with a cosine learning-rate decay. It trains in well under a second, the
FP32 loss keeps falling for hundreds of steps — and as the learning rate decays, more and more Adam updates drop
below half a BF16 spacing of their weight, so a run that stores its weights in BF16 with round-to-nearest stops
learning while the others carry on. Every run starts from the same weights and sees the same data; only how the
numbers are stored differs. The trained weights are judged in an FP32 forward on 512 held-out points, so what is
judged is the training, not the inference precision.
"""

from __future__ import annotations

import contextlib
import copy
import math
import time
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from amp_lessons.core import data
from amp_lessons.core.environment import one_cpu_thread
from amp_lessons.core.models import SectorClassifier, seeded_weights
from amp_lessons.l10_where_fp32_lives.designs import Design, LowPrecisionAdam

STEPS = 300
LR = 1e-3
HIDDEN = 64
TRAIN_POINTS = 1024
EVAL_POINTS = 512

__all__ = [
    "EVAL_POINTS",
    "LR",
    "STEPS",
    "Run",
    "lost_plot",
    "loss_plot",
    "set_lr",
    "task",
    "train",
    "train_design",
]


@dataclass
class Run:
    """One training run: the loss and the share of lost updates per step, held-out logits, timings."""

    name: str
    losses: list = field(default_factory=list)
    lost: list = field(default_factory=list)
    eval_logits: torch.Tensor | None = None
    seconds: float = 0.0
    first_step_seconds: float = 0.0
    model: torch.nn.Module | None = None
    optimizer: torch.optim.Optimizer | None = None

    @property
    def final_loss(self) -> float:
        return self.losses[-1]


def task(device="cpu") -> dict:
    """The data: ``x``/``y`` to train on (1024 points), ``x_eval``/``y_eval`` held out (512), on ``device``."""
    generator = torch.Generator().manual_seed(10)
    x = torch.randn(TRAIN_POINTS + EVAL_POINTS, 2, generator=generator)
    y = data.true_class(x)
    keep = y >= 0
    x, y = x[keep], y[keep]
    split = TRAIN_POINTS
    return {
        "x": x[:split].to(device),
        "y": y[:split].to(device),
        "x_eval": x[split:].to(device),
        "y_eval": y[split:].to(device),
    }


def new_model(device="cpu") -> torch.nn.Module:
    with seeded_weights(0):  # the same starting weights for every run
        return SectorClassifier(hidden=HIDDEN).to(device)


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    """Set the learning rate of every group (torchao's optimizers keep it as a tensor: fill it, do not replace it)."""
    for group in optimizer.param_groups:
        if isinstance(group["lr"], torch.Tensor):
            group["lr"].fill_(lr)
        else:
            group["lr"] = lr


def train(
    name, make_optimizer, *, parameters=torch.float32, autocast=False, steps=STEPS, lr=LR, device="cpu"
):
    """Train a fresh model whose parameters are ``parameters``, with ``make_optimizer(params, lr)``; return a Run."""
    batch = task(device)
    model = new_model(device).to(parameters)
    optimizer = make_optimizer(model.parameters(), lr)
    run = Run(name, model=model, optimizer=optimizer)
    device_type = torch.device(device).type
    x = batch["x"].to(parameters)
    with one_cpu_thread():  # tiny tensors: one CPU thread is fastest and steadiest (GPU work is unaffected)
        _steps(
            run,
            model,
            optimizer,
            x,
            batch["y"],
            autocast=autocast,
            steps=steps,
            lr=lr,
            device_type=device_type,
        )
    with torch.no_grad():  # the trained weights, judged in an FP32 forward
        run.eval_logits = copy.deepcopy(model).float()(batch["x_eval"]).cpu()
    return run


def _steps(run, model, optimizer, x, y, *, autocast, steps, lr, device_type):
    start = time.perf_counter()
    for step in range(1, steps + 1):
        set_lr(optimizer, lr * 0.5 * (1 + math.cos(math.pi * (step - 1) / steps)))
        optimizer.zero_grad(set_to_none=True)
        region = torch.autocast(device_type, dtype=torch.bfloat16) if autocast else contextlib.nullcontext()
        with region:
            logits = model(x)
        loss = F.cross_entropy(logits.float(), y)  # the loss in FP32, whatever the logits' dtype
        loss.backward()
        optimizer.step()
        run.losses.append(loss.item())
        run.lost.append(getattr(optimizer, "lost_fraction", math.nan))
        if step == 1:
            run.first_step_seconds = time.perf_counter() - start
    run.seconds = time.perf_counter() - start


def train_design(design: Design, *, device="cpu", **kwargs) -> Run:
    """``train`` with ``LowPrecisionAdam`` set up the way ``design`` stores its numbers."""

    def make(params, lr):
        return LowPrecisionAdam(params, lr=lr, rounding=design.rounding)

    return train(
        design.name, make, parameters=design.parameters, autocast=design.autocast, device=device, **kwargs
    )


def loss_plot(runs, *, ax=None, reference: str = "FP32", title="training loss"):
    """Every run's loss per step on log axes; the FP32 reference drawn thick and black."""
    import matplotlib.pyplot as plt

    ax = ax or plt.gca()
    for run in runs:
        if run.name == reference:
            ax.plot(run.losses, color="black", linewidth=3, label=run.name, zorder=1)
        else:
            ax.plot(run.losses, linewidth=1.4, label=run.name, zorder=2)
    ax.set_yscale("log")
    ax.set_xlabel("step")
    ax.set_ylabel("cross-entropy (log scale)")
    ax.set_title(title)
    ax.legend(fontsize=8)
    return ax


def lost_plot(runs, *, ax=None, lr=LR, steps=STEPS):
    """The share of non-zero updates that left the stored weight unchanged, per step, with the learning rate."""
    import matplotlib.pyplot as plt

    ax = ax or plt.gca()
    for run in runs:
        ax.plot([100 * v for v in run.lost], label=run.name)
    ax.set_xlabel("step")
    ax.set_ylabel("% of updates lost to rounding")
    ax.set_ylim(0, 100)
    twin = ax.twinx()
    twin.plot(
        [lr * 0.5 * (1 + math.cos(math.pi * s / steps)) for s in range(steps)], color="grey", linestyle=":"
    )
    twin.set_ylabel("learning rate (dotted)")
    ax.legend(fontsize=8, loc="center left")
    return ax


def verdicts(runs, reference: Run, criteria, *, recorded_fingerprint: str, labels):
    """Judge every run's held-out logits against the FP32 reference run with lesson 04's ``judge``: one row each."""
    import pandas as pd

    from amp_lessons.l04_baseline_and_decision_boundary.validation import accuracy, decide, judge

    rows = []
    for run in runs:
        report = judge(
            reference.eval_logits,
            run.eval_logits,
            criteria,
            recorded_fingerprint=recorded_fingerprint,
            labels=labels,
            label=run.name,
        )
        rows.append(
            {
                "design": run.name,
                "final loss": round(run.final_loss, 4),
                "vs FP32": f"{run.final_loss / reference.final_loss - 1:+.1%}",
                "max |logit diff|": round(float(report.table["max abs diff"].max()), 3),
                "decisions changed": report.counts()["decision changed"],
                "accuracy": round(accuracy(decide(run.eval_logits), labels), 4),
                "verdict": "PASSED" if report.passed else "FAILED",
            }
        )
    return pd.DataFrame(rows)
