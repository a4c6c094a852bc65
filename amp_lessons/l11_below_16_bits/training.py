"""Lesson 11: FP8 training with torchao's real API, validated against FP32 and BF16 runs.

``torchao.float8.convert_to_float8_training(model, config=Float8LinearConfig.from_recipe_name(name),
module_filter_fn=...)`` swaps each chosen ``nn.Linear`` for a ``Float8Linear``: its three matmuls (forward, grad
input, grad weight) cast their inputs to FP8 with a fresh scale each step and call ``torch._scaled_mm``. The
recipes differ in the scales: **tensorwise** (one per tensor), **rowwise** (one per row, E4M3 everywhere) and
**rowwise_with_gw_hp** (rowwise, but the grad-weight matmul stays in high precision: the weight gradient sums over
the whole batch, where FP8 costs the most). The weights, the optimizer and every other op stay in FP32 here.

The module filter keeps the layers FP8 cannot serve in high precision: the output layer (its logits are the
decisions) and any layer whose dimensions are not multiples of 16 (``torch._scaled_mm``'s requirement).

The same code runs on a CPU (``torch._scaled_mm`` has a CPU implementation, slow and only for correctness) and on
an SM89+ GPU (Ada, Hopper, Blackwell), where FP8 Tensor Cores make it fast. Speed cannot be learned on a CPU.
"""

from __future__ import annotations

import time
import warnings
from dataclasses import dataclass, field

import torch
import torch.nn as nn
import torch.nn.functional as F

from amp_lessons.core.optional_libraries import quiet_import, torchao_support

RECIPES = ("tensorwise", "rowwise", "rowwise_with_gw_hp")


class Fp8TaskNet(nn.Module):
    """A small classifier whose hidden layers FP8 can serve (16 -> 32 -> 32) and a 4-class output layer it cannot."""

    def __init__(self, in_features: int = 16, width: int = 32, classes: int = 4, seed: int = 0):
        super().__init__()
        generator_state = torch.random.get_rng_state()
        torch.manual_seed(seed)
        self.first = nn.Linear(in_features, width)
        self.hidden = nn.Linear(width, width)
        self.head = nn.Linear(width, classes)
        torch.random.set_rng_state(generator_state)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(F.gelu(self.hidden(F.gelu(self.first(x)))))


def task_data(n_train: int = 512, n_eval: int = 256, in_features: int = 16, classes: int = 4, seed: int = 0):
    """``(x_train, y_train, x_eval, y_eval)``: inputs with a few large features, labels from a fixed teacher."""
    g = torch.Generator().manual_seed(seed)
    teacher = torch.randn(in_features, classes, generator=g)
    spread = torch.ones(in_features)
    spread[:2] = 6.0  # two loud input features, as real data has

    def draw(n):
        x = torch.randn(n, in_features, generator=g) * spread
        return x, (torch.tanh(x / 3) @ teacher).argmax(dim=1)

    x_train, y_train = draw(n_train)
    x_eval, y_eval = draw(n_eval)
    return x_train, y_train, x_eval, y_eval


def fp8_module_filter(module: nn.Module, fqn: str) -> bool:
    """True for the layers to train in FP8: every ``nn.Linear`` but the output layer ``head``, and only where
    both dimensions are multiples of 16."""
    if not isinstance(module, nn.Linear) or fqn.endswith("head"):
        return False
    return module.in_features % 16 == 0 and module.out_features % 16 == 0


@dataclass
class Run:
    """One training run: its name, loss per step, final eval scores, which layers ran in FP8, time, or why not."""

    name: str
    losses: list = field(default_factory=list)
    eval_scores: torch.Tensor | None = None
    fp8_layers: list = field(default_factory=list)
    seconds: float = 0.0
    reason: str = ""

    @property
    def ran(self) -> bool:
        return self.eval_scores is not None

    @property
    def final_loss(self) -> float:
        return sum(self.losses[-5:]) / len(self.losses[-5:]) if self.losses else float("nan")


def _convert(model: nn.Module, recipe: str) -> list:
    """Swap the filtered layers for torchao's Float8Linear with ``recipe``; the names of the swapped layers."""
    with quiet_import():
        from torchao.float8 import Float8LinearConfig, convert_to_float8_training

    config = Float8LinearConfig.from_recipe_name(recipe)
    convert_to_float8_training(model, config=config, module_filter_fn=fp8_module_filter)
    return [name for name, m in model.named_modules() if type(m).__name__ == "Float8Linear"]


def train_run(kind: str, data, *, steps: int = 60, batch: int = 128, lr: float = 1e-2, device="cpu") -> Run:
    """Train :class:`Fp8TaskNet` from the same seed: ``kind`` is ``"fp32"``, ``"bf16"`` (autocast) or a torchao
    recipe name. Every run sees the same batches in the same order. Never raises for a missing capability: the
    run's ``reason`` says why it did not run (torchao missing, a GPU without FP8 matmuls)."""
    device = torch.device(device)
    run = Run(kind)
    model = Fp8TaskNet().to(device)
    if kind in RECIPES:
        support = torchao_support()
        if not support.available:
            run.reason = support.reason
            return run
        run.fp8_layers = _convert(model, kind)
    x_train, y_train, x_eval, _ = (t.to(device) for t in data)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=kind == "bf16")
    started = time.perf_counter()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torchao notes about kernels it cannot use here
            for step in range(steps):
                rows = torch.arange(step * batch, (step + 1) * batch, device=device) % len(x_train)
                with autocast:
                    loss = F.cross_entropy(model(x_train[rows]).float(), y_train[rows])
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                optimizer.step()
                run.losses.append(loss.item())
            with torch.no_grad(), autocast:
                run.eval_scores = model(x_eval).float().cpu()
    except RuntimeError as error:  # e.g. torch._scaled_mm on a GPU older than SM89
        run.reason = f"{type(error).__name__}: {str(error).splitlines()[0][:200]}"
        run.eval_scores = None
    run.seconds = time.perf_counter() - started
    return run


def loss_curves_figure(runs, ax=None):
    """Training loss per step of every run that ran, FP32 solid black."""
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(8, 3.6))
    for run in runs:
        if not run.losses:
            continue
        style = {"color": "black", "lw": 2.2} if run.name == "fp32" else {"lw": 1.3, "alpha": 0.85}
        ax.plot(range(1, len(run.losses) + 1), run.losses, label=run.name, **style)
    ax.set_yscale("log")
    ax.set_xlabel("step")
    ax.set_ylabel("training loss (log)")
    ax.legend()
    ax.set_title("The same model, data and seed: FP32, BF16 autocast and three torchao FP8 recipes")
    return ax


def verdict_table(runs, reports, reference: str = "fp32", second: str = "bf16"):
    """One row per run: final loss, verdict against FP32 (lesson 04's judge), decisions changed vs FP32 and vs
    BF16, largest score difference."""
    import pandas as pd

    by_name = {run.name: run for run in runs}
    second_decisions = (
        by_name[second].eval_scores.argmax(dim=1) if by_name.get(second) and by_name[second].ran else None
    )
    rows = []
    for run in runs:
        if not run.ran:
            rows.append(
                {"run": run.name, "final loss": None, "verdict vs FP32": f"not run: {run.reason[:80]}"}
            )
            continue
        report = reports.get(run.name)
        decisions = run.eval_scores.argmax(dim=1)
        rows.append(
            {
                "run": run.name,
                "FP8 layers": ", ".join(run.fp8_layers) or "-",
                "final loss": round(run.final_loss, 4),
                "verdict vs FP32": "reference"
                if run.name == reference
                else ("PASSED" if report.passed else "FAILED"),
                "decisions changed vs FP32": int(
                    (decisions != by_name[reference].eval_scores.argmax(dim=1)).sum()
                ),
                "decisions changed vs BF16": (
                    int((decisions != second_decisions).sum()) if second_decisions is not None else None
                ),
                "max |score - FP32|": round(
                    float((run.eval_scores - by_name[reference].eval_scores).abs().max()), 4
                ),
                "seconds": round(run.seconds, 2),
            }
        )
    return pd.DataFrame(rows).set_index("run")


# ------------------------------------------------------------------------------------ step time on a GPU


def fp8_matmuls_here(device) -> str:
    """Empty when this device has FP8 Tensor Cores (CUDA SM89+); else the reason it does not."""
    device = torch.device(device)
    if device.type != "cuda":
        return f"no CUDA GPU here ({device.type}): FP8 speed needs an SM89+ GPU (Ada, Hopper, Blackwell)"
    major, minor = torch.cuda.get_device_capability(device)
    if (major, minor) < (8, 9):
        return f"this GPU is SM{major}{minor}: FP8 matmuls need SM89 or newer"
    return ""


def fp8_step_times(device, *, width: int = 4096, tokens: int = 8192, layers: int = 4, repeats: int = 20):
    """Training-step time and peak memory of a ``layers`` x Linear(width, width) stack, BF16 autocast vs the same
    model with torchao's tensorwise and rowwise FP8 (eager, no torch.compile). A DataFrame, or a string saying why
    it cannot be measured here."""
    reason = fp8_matmuls_here(device) or (torchao_support().reason if not torchao_support().available else "")
    if reason:
        return reason
    from amp_lessons.l07_measuring_gains.benchmark import measure, results_table

    device = torch.device(device)
    x = torch.randn(tokens, width, device=device)
    results = []
    for kind in ("bf16",) + RECIPES[:2]:
        model = nn.Sequential(*[nn.Linear(width, width, bias=False) for _ in range(layers)]).to(device)
        if kind in RECIPES:
            with quiet_import():
                from torchao.float8 import Float8LinearConfig, convert_to_float8_training
            convert_to_float8_training(model, config=Float8LinearConfig.from_recipe_name(kind))
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)

        def step(model=model, optimizer=optimizer):
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = model(x).float().pow(2).mean()
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            return loss.detach()

        label = "BF16 autocast" if kind == "bf16" else f"FP8 {kind} + BF16 autocast"
        results.append(measure(step, device=device, warmup=3, repeats=repeats, label=label, max_seconds=20))
        del model, optimizer
        torch.cuda.empty_cache()
    return results_table(results)


def model_tensors(data, *, steps: int = 30, device="cpu") -> dict:
    """Real tensors of :class:`Fp8TaskNet` after ``steps`` FP32 training steps: each Linear's weight, its input
    activation, the gradient of its output and its weight gradient, from one forward + backward on a batch."""
    device = torch.device(device)
    model = Fp8TaskNet().to(device)
    x_train, y_train = data[0].to(device), data[1].to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for step in range(steps):
        rows = torch.arange(step * 128, (step + 1) * 128, device=device) % len(x_train)
        optimizer.zero_grad(set_to_none=True)
        F.cross_entropy(model(x_train[rows]), y_train[rows]).backward()
        optimizer.step()
    seen = {}
    hooks = []

    def record(module, inputs, output, name):
        seen[f"{name}: activation"] = inputs[0].detach()
        output.register_hook(lambda grad: seen.__setitem__(f"{name}: output gradient", grad.detach()))

    for name in ("first", "hidden"):
        hooks.append(getattr(model, name).register_forward_hook(lambda m, i, o, n=name: record(m, i, o, n)))
    optimizer.zero_grad(set_to_none=True)
    F.cross_entropy(model(x_train[:128]), y_train[:128]).backward()
    for hook in hooks:
        hook.remove()
    tensors = {}
    for name in ("first", "hidden"):
        layer = getattr(model, name)
        tensors[f"{name}: weight"] = layer.weight.detach().cpu()
        tensors[f"{name}: activation"] = seen[f"{name}: activation"].cpu()
        tensors[f"{name}: output gradient"] = seen[f"{name}: output gradient"].cpu()
        tensors[f"{name}: weight gradient"] = layer.weight.grad.detach().cpu()
    return tensors
