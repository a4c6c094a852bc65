"""Lesson 08: AMP in a real training loop: gradient accumulation, several losses or optimizers with one
GradScaler, and a switchboard that tells autocast problems from scaling problems.

Why accumulation has its own rules. ``N`` micro-batches of ``B`` samples stand in for one batch of ``N * B``:
the gradient of the mean loss over the whole batch is the sum over micro-batches of ``grad(loss_k) / N``. So

- every micro-batch's loss is divided by ``N`` (or its gradients add up to ``N`` times the batch gradient);
- every micro-batch's loss is scaled with the *same* scale (``scaler.scale``), so the gradients in ``.grad``
  add up in one unit and one ``unscale_`` divides them all correctly;
- ``unscale_``, clipping, ``scaler.step`` and ``scaler.update`` happen once per optimizer step, after the
  last micro-batch: clipping must see the whole batch's gradient, ``update`` may change the scale (which
  would mix units in ``.grad``), and ``step`` inside the loop is ``N`` small optimizer steps, not one.

The same bookkeeping holds for several losses and optimizers: one ``scale`` per loss (or one for their
sum), one ``unscale_``/``step`` per optimizer, one ``update`` per iteration, one scaler for all of them.
"""

from __future__ import annotations

import contextlib
import math

import torch
import torch.nn.functional as F
from torch import nn

from amp_lessons.core.models import TinyClassifier, seeded_weights
from amp_lessons.l03_autocast_and_gradscaler.training import total_grad_norm, train_step

# ------------------------------------------------------------------------------------ gradient accumulation


def split_batch(inputs, targets, parts: int) -> list:
    """``parts`` equal ``(inputs, targets)`` micro-batches of one batch (its size must divide evenly)."""
    if isinstance(parts, bool) or not isinstance(parts, int) or parts < 1:
        raise ValueError(f"parts must be a whole number >= 1, got {parts!r}")
    if len(inputs) % parts or len(inputs) != len(targets):
        raise ValueError(f"a batch of {len(inputs)} samples does not split into {parts} equal micro-batches")
    return list(zip(inputs.chunk(parts), targets.chunk(parts)))


def accumulate_step(model, optimizer, scaler, loss_fn, micro_batches, *, dtype=torch.float16, max_norm=None):
    """One optimizer step from several equal micro-batches; returns the batch loss (unscaled, detached).

    Why this order: each micro-batch runs forward and loss under autocast and its loss, divided by the
    number of micro-batches, is scaled and backpropagated at once (its activations can then be freed); the
    gradients add up in ``.grad``, all at the same scale. Only then, once: ``unscale_`` (so clipping sees
    true values), clip, ``scaler.step`` (skips the update if any micro-batch overflowed), ``scaler.update``.
    """
    count = len(micro_batches)
    optimizer.zero_grad(set_to_none=True)
    losses = []
    for inputs, targets in micro_batches:
        with torch.autocast(device_type=inputs.device.type, dtype=dtype):
            loss = loss_fn(model(inputs), targets)
        scaler.scale(loss / count).backward()
        losses.append(loss.detach())
    if max_norm is not None:
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    scaler.step(optimizer)
    scaler.update()
    return torch.stack(losses).mean()


def _micro_loss(model, loss_fn, inputs, targets, dtype):
    with torch.autocast(device_type=inputs.device.type, dtype=dtype):
        return loss_fn(model(inputs), targets)


def _clip_if(model, max_norm) -> None:
    if max_norm is not None:
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)


def _unscale_and_clip(model, optimizer, scaler, max_norm) -> None:
    """The right order, once: unscale_ (only when clipping), then clip."""
    if max_norm is not None:
        scaler.unscale_(optimizer)
    _clip_if(model, max_norm)


def loss_not_divided(model, optimizer, scaler, loss_fn, micro_batches, *, dtype, max_norm):
    """WRONG: every micro-batch's loss enters with weight 1, so the gradient is N times the batch gradient."""
    optimizer.zero_grad()
    losses = []
    for inputs, targets in micro_batches:
        loss = _micro_loss(model, loss_fn, inputs, targets, dtype)
        scaler.scale(loss).backward()
        losses.append(loss.detach())
    _unscale_and_clip(model, optimizer, scaler, max_norm)
    scaler.step(optimizer)
    scaler.update()
    return torch.stack(losses).mean()


def zero_grad_inside_loop(model, optimizer, scaler, loss_fn, micro_batches, *, dtype, max_norm):
    """WRONG: zero_grad at the top of every micro-batch erases the ones before: only the last one counts."""
    losses = []
    for inputs, targets in micro_batches:
        optimizer.zero_grad()
        loss = _micro_loss(model, loss_fn, inputs, targets, dtype)
        scaler.scale(loss / len(micro_batches)).backward()
        losses.append(loss.detach())
    _unscale_and_clip(model, optimizer, scaler, max_norm)
    scaler.step(optimizer)
    scaler.update()
    return torch.stack(losses).mean()


def step_inside_loop(model, optimizer, scaler, loss_fn, micro_batches, *, dtype, max_norm):
    """WRONG: unscale_, clip, step and update for every micro-batch: N small optimizer steps, not one."""
    losses = []
    for inputs, targets in micro_batches:
        optimizer.zero_grad()
        loss = _micro_loss(model, loss_fn, inputs, targets, dtype)
        scaler.scale(loss / len(micro_batches)).backward()
        _unscale_and_clip(model, optimizer, scaler, max_norm)
        scaler.step(optimizer)
        scaler.update()
        losses.append(loss.detach())
    return torch.stack(losses).mean()


def clip_inside_loop(model, optimizer, scaler, loss_fn, micro_batches, *, dtype, max_norm):
    """WRONG: clipping the partial (and still scaled) sum after every micro-batch."""
    optimizer.zero_grad()
    losses = []
    for inputs, targets in micro_batches:
        loss = _micro_loss(model, loss_fn, inputs, targets, dtype)
        scaler.scale(loss / len(micro_batches)).backward()
        _clip_if(model, max_norm)
        losses.append(loss.detach())
    scaler.step(optimizer)
    scaler.update()
    return torch.stack(losses).mean()


def clip_before_unscale(model, optimizer, scaler, loss_fn, micro_batches, *, dtype, max_norm):
    """WRONG: accumulation right, but the clip sees gradients that are still ``scale`` times too large."""
    optimizer.zero_grad()
    losses = []
    for inputs, targets in micro_batches:
        loss = _micro_loss(model, loss_fn, inputs, targets, dtype)
        scaler.scale(loss / len(micro_batches)).backward()
        losses.append(loss.detach())
    _clip_if(model, max_norm)
    scaler.step(optimizer)
    scaler.update()
    return torch.stack(losses).mean()


def unscale_inside_loop(model, optimizer, scaler, loss_fn, micro_batches, *, dtype, max_norm):
    """WRONG: ``unscale_`` after every micro-batch (torch refuses the second one before ``update``)."""
    optimizer.zero_grad()
    losses = []
    for inputs, targets in micro_batches:
        loss = _micro_loss(model, loss_fn, inputs, targets, dtype)
        scaler.scale(loss / len(micro_batches)).backward()
        scaler.unscale_(optimizer)
        losses.append(loss.detach())
    _clip_if(model, max_norm)
    scaler.step(optimizer)
    scaler.update()
    return torch.stack(losses).mean()


def update_inside_loop(model, optimizer, scaler, loss_fn, micro_batches, *, dtype, max_norm):
    """WRONG: ``scaler.update()`` after every micro-batch, one ``step`` at the end (torch refuses it)."""
    optimizer.zero_grad()
    losses = []
    for inputs, targets in micro_batches:
        loss = _micro_loss(model, loss_fn, inputs, targets, dtype)
        scaler.scale(loss / len(micro_batches)).backward()
        scaler.update()
        losses.append(loss.detach())
    _unscale_and_clip(model, optimizer, scaler, max_norm)
    scaler.step(optimizer)
    return torch.stack(losses).mean()


WRONG_PLACEMENTS = {
    "loss not divided by N": loss_not_divided,
    "zero_grad inside the loop": zero_grad_inside_loop,
    "unscale_/clip/step/update inside the loop": step_inside_loop,
    "clip inside the loop (before unscale_)": clip_inside_loop,
    "clip after the loop, before unscale_": clip_before_unscale,
    "unscale_ inside the loop": unscale_inside_loop,
    "update inside the loop": update_inside_loop,
}


def accumulation_problem(seed: int = 0, batch: int = 32, device="cpu"):
    """A fixed classification batch for :class:`TinyClassifier`: ``(inputs, targets)``, inputs of std 2."""
    generator = torch.Generator().manual_seed(seed)
    inputs = torch.randn(batch, 6, generator=generator) * 2
    targets = torch.randint(0, 4, (batch,), generator=generator)
    return inputs.to(device), targets.to(device)


def _fresh(seed: int, device, init_scale: float):
    with seeded_weights(seed):
        model = TinyClassifier().to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    updates = []
    optimizer.register_step_post_hook(lambda *args: updates.append(1))
    scaler = torch.amp.GradScaler(torch.device(device).type, init_scale=init_scale)
    return model, optimizer, scaler, updates


def _update_of(step, micro_batches, *, dtype, max_norm, seed, device, init_scale):
    """(parameter update as one vector, real optimizer updates, error text or '') of one call of ``step``."""
    model, optimizer, scaler, updates = _fresh(seed, device, init_scale)
    before = torch.cat([p.detach().reshape(-1).clone() for p in model.parameters()])
    error = ""
    try:
        step(model, optimizer, scaler, F.cross_entropy, micro_batches, dtype=dtype, max_norm=max_norm)
    except Exception as exc:  # torch refuses some placements outright: that is a result too
        error = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    after = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    return (after - before).float().cpu(), len(updates), error


def true_gradient_norm(inputs, targets, *, seed: int = 0) -> float:
    """The FP32 gradient norm of the batch's mean loss at the fresh model (to pick a max_norm that binds)."""
    with seeded_weights(seed):
        model = TinyClassifier().to(inputs.device)
    F.cross_entropy(model(inputs), targets).backward()
    return float(total_grad_norm(model.parameters()))


def placement_errors(
    inputs,
    targets,
    *,
    parts: int = 4,
    dtype=torch.float16,
    max_norms=(None, 0.1),
    seed: int = 0,
    init_scale: float = 2.0**12,
):
    """How far each accumulation placement's parameter update is from the full-batch step's, in numbers.

    For each ``max_norm`` every placement starts from the same weights and scale; the error is
    ``|update - full-batch update| / |full-batch update|`` (the full-batch update is one lesson-03 step on
    the whole batch, under the same autocast dtype). Returns a DataFrame, one row per placement.
    """
    import pandas as pd

    device = inputs.device
    micro = split_batch(inputs, targets, parts)
    placements = {"right: accumulate_step": accumulate_step, **WRONG_PLACEMENTS}
    rows = {name: {"placement": name} for name in placements}
    for max_norm in max_norms:
        label = "no clipping" if max_norm is None else f"max_norm={max_norm:g}"
        full, _, _ = _update_of(
            lambda m, o, s, f, mb, **kw: train_step(m, o, s, f, inputs, targets, **kw),
            micro,
            dtype=dtype,
            max_norm=max_norm,
            seed=seed,
            device=device,
            init_scale=init_scale,
        )
        for name, step in placements.items():
            update, count, error = _update_of(
                step, micro, dtype=dtype, max_norm=max_norm, seed=seed, device=device, init_scale=init_scale
            )
            relative = float((update - full).norm() / full.norm()) if not error else math.nan
            rows[name][f"update error, {label}"] = relative
            rows[name][f"optimizer updates, {label}"] = count
            rows[name]["torch says"] = error or rows[name].get("torch says", "")
    return pd.DataFrame(list(rows.values())).set_index("placement")


def plot_placement_errors(table, ax=None, floor: float = 1e-6):
    """Bar chart (log scale) of the update error per placement and clipping setting; refused ones labelled.

    The dotted line is the right placement's own error: rounding, the level every other bar is compared with.
    """
    import matplotlib.pyplot as plt

    columns = [c for c in table.columns if c.startswith("update error")]
    if ax is None:
        _, ax = plt.subplots(figsize=(9, 3.8))
    width = 0.8 / max(len(columns), 1)
    for i, column in enumerate(columns):
        values = [max(v, floor) if math.isfinite(v) else 0.0 for v in table[column]]
        ax.barh(
            [k + i * width for k in range(len(table))],
            values,
            height=width,
            label=column.replace("update error, ", ""),
        )
    for k, refused in enumerate(table.get("torch says", [""] * len(table))):
        if refused:
            ax.annotate(
                "torch refuses it",
                (floor, k + width * (len(columns) - 1) / 2),
                xytext=(4, 0),
                textcoords="offset points",
                va="center",
                fontsize=8,
                color="#c62828",
            )
    ax.set_yticks([k + width * (len(columns) - 1) / 2 for k in range(len(table))], list(table.index))
    ax.invert_yaxis()
    ax.set_xscale("log")
    ax.set_xlim(left=floor)
    rounding = table[columns[0]].iloc[0]
    if math.isfinite(rounding) and rounding > floor:
        ax.axvline(rounding, color="grey", linewidth=0.8, linestyle=":", label="rounding (right placement)")
    ax.set_xlabel("|update - full-batch update| / |full-batch update|  (log scale)")
    ax.set_title("Where each call goes, and what it does to one accumulated step")
    ax.legend(fontsize=8, loc="lower right")
    return ax


# ------------------------------------------------------------------- several losses, optimizers, one scaler


class TwoHeadNet(nn.Module):
    """A shared trunk and two heads: two losses whose gradients meet in the trunk (lesson 08)."""

    def __init__(self, seed: int = 0):
        super().__init__()
        with seeded_weights(seed):
            self.trunk = nn.Sequential(nn.Linear(6, 16), nn.ReLU())
            self.head_a = nn.Linear(16, 4)
            self.head_b = nn.Linear(16, 1)

    def forward(self, x):
        h = self.trunk(x)
        return self.head_a(h), self.head_b(h).squeeze(-1)


def two_losses(model, inputs, targets, dtype):
    """Classification loss of head A and regression loss of head B, both under autocast."""
    with torch.autocast(device_type=inputs.device.type, dtype=dtype):
        logits, value = model(inputs)
        loss_a = F.cross_entropy(logits, targets)
        loss_b = F.mse_loss(value, targets.float())
    return loss_a, loss_b


def two_optimizers(model):
    """One optimizer for the trunk and head A, another for head B (e.g. different learning rates)."""
    first = torch.optim.SGD(list(model.trunk.parameters()) + list(model.head_a.parameters()), lr=0.1)
    second = torch.optim.SGD(model.head_b.parameters(), lr=0.05)
    return first, second


def multi_loss_step(model, optimizers, scalers, inputs, targets, *, dtype, variant: str = "right"):
    """One iteration with two losses and two optimizers, in one of the ways the lesson compares.

    ``"right"``: one scaler, ``scale`` per loss, ``step`` per optimizer, one ``update``;
    ``"sum"``: one scaler, ``scale(loss_a + loss_b)`` (also right);
    ``"update per optimizer"``: ``update`` after each ``step`` (the second optimizer is unscaled with a
    scale that ``update`` may just have changed); ``"one scaler per loss"``: two scalers, so the trunk's
    gradient is a sum of two differently scaled parts that one ``unscale_`` cannot undo.
    """
    first, second = optimizers
    for optimizer in optimizers:
        optimizer.zero_grad(set_to_none=True)
    loss_a, loss_b = two_losses(model, inputs, targets, dtype)
    scaler = scalers[0]
    if variant == "sum":
        scaler.scale(loss_a + loss_b).backward()
    elif variant == "one scaler per loss":
        scalers[0].scale(loss_a).backward(retain_graph=True)
        scalers[1].scale(loss_b).backward()
    else:
        scaler.scale(loss_a).backward(retain_graph=True)  # both losses share the trunk's graph
        scaler.scale(loss_b).backward()
    if variant == "update per optimizer":
        scaler.step(first)
        scaler.update()
        scaler.step(second)
        scaler.update()
    elif variant == "one scaler per loss":
        for optimizer, own in zip(optimizers, scalers):
            own.step(optimizer)
            own.update()
    else:
        scaler.step(first)
        scaler.step(second)
        scaler.update()
    return loss_a.detach(), loss_b.detach()


VARIANTS = ("right", "sum", "update per optimizer", "one scaler per loss")


def multi_loss_errors(
    inputs,
    targets,
    *,
    dtype=torch.float16,
    seed: int = 0,
    growth_interval: int = 1,
    second_scale: float = 2.0**6,
):
    """Per variant of :func:`multi_loss_step`: the relative error of each part's update vs. an FP32 step.

    The reference is the same iteration without autocast or scaling. ``growth_interval=1`` makes the
    scaler grow its scale at the first ``update``, so an ``update`` between the two ``step`` calls changes
    the scale the second optimizer is unscaled with; the second scaler of "one scaler per loss" starts at
    ``second_scale`` (scalers drift apart like this after different overflow histories).
    """
    import pandas as pd

    device_type = inputs.device.type
    reference = _parts_update(inputs, targets, seed)
    rows = []
    for variant in VARIANTS:
        scalers = tuple(
            torch.amp.GradScaler(device_type, init_scale=scale, growth_interval=growth_interval)
            for scale in (2.0**10, second_scale)
        )
        got = _parts_update(inputs, targets, seed, dtype=dtype, variant=variant, scalers=scalers)
        row = {"variant": variant}
        for part, expected in reference.items():
            row[f"{part}: update error"] = float((got[part] - expected).norm() / expected.norm())
        used = scalers if variant == "one scaler per loss" else scalers[:1]
        row["scale(s) after"] = " / ".join(f"{scaler.get_scale():g}" for scaler in used)
        rows.append(row)
    return pd.DataFrame(rows).set_index("variant")


def _flat(module) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1).clone() for p in module.parameters()]).float().cpu()


def _parts_update(inputs, targets, seed, *, dtype=None, variant="right", scalers=()) -> dict:
    """Updates of trunk, head A and head B after one iteration (``dtype=None``: the FP32 reference)."""
    model = TwoHeadNet(seed).to(inputs.device)
    optimizers = two_optimizers(model)
    parts = {"trunk": model.trunk, "head A": model.head_a, "head B": model.head_b}
    before = {name: _flat(module) for name, module in parts.items()}
    if dtype is None:
        logits, value = model(inputs)
        (F.cross_entropy(logits, targets) + F.mse_loss(value, targets.float())).backward()
        for optimizer in optimizers:
            optimizer.step()
    else:
        multi_loss_step(model, optimizers, scalers, inputs, targets, dtype=dtype, variant=variant)
    return {name: _flat(module) - before[name] for name, module in parts.items()}


# ------------------------------------------------------------------ the switchboard: autocast x scaler


def toggle_runs(
    make_model,
    inputs,
    targets,
    loss_fn,
    *,
    dtype=torch.float16,
    steps: int = 3,
    lr: float = 0.05,
    watch=None,
    init_scale: float = 2.0**16,
):
    """Run ``steps`` training steps four times: autocast on/off x GradScaler on/off (``enabled=``).

    Same code, same starting weights, only the two switches differ; that is the point: a problem that
    follows the *autocast* switch is in the forward pass (an op's range or precision), one that follows the
    *scaler* switch is about gradient magnitudes (underflow without scaling, overflow with too large a scale).
    ``watch`` names a parameter (e.g. ``"layers.0.weight"``) whose share of exactly-zero gradients is
    reported. Returns a DataFrame, one row per combination.
    """
    import pandas as pd

    rows = []
    for use_autocast in (True, False):
        for use_scaler in (True, False):
            rows.append(
                _toggle_run(
                    make_model,
                    inputs,
                    targets,
                    loss_fn,
                    dtype,
                    steps,
                    lr,
                    watch,
                    init_scale,
                    use_autocast,
                    use_scaler,
                )
            )
    return pd.DataFrame(rows)


def _toggle_run(
    make_model, inputs, targets, loss_fn, dtype, steps, lr, watch, init_scale, use_autocast, use_scaler
) -> dict:
    device_type = inputs.device.type
    model = make_model().to(inputs.device)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    scaler = torch.amp.GradScaler(device_type, init_scale=init_scale, enabled=use_scaler)
    skipped, losses, zero_share = 0, [], math.nan
    watched = dict(model.named_parameters()).get(watch) if watch else None
    for _ in range(steps):
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast(device_type=device_type, dtype=dtype, enabled=use_autocast):
            loss = loss_fn(model(inputs), targets)
        scaler.scale(loss).backward()
        if watched is not None and watched.grad is not None:
            zero_share = float((watched.grad == 0).float().mean())
        scale_before = scaler.get_scale() if use_scaler else 1.0
        with contextlib.suppress(RuntimeError):
            scaler.step(optimizer)
        scaler.update()
        skipped += int(use_scaler and scaler.get_scale() < scale_before)
        losses.append(float(loss.detach().float()))
    row = {
        "autocast": "on" if use_autocast else "off",
        "GradScaler": "on" if use_scaler else "off",
        "loss finite": all(math.isfinite(v) for v in losses),
        "last loss": losses[-1],
        "skipped steps": skipped,
    }
    if watch:
        row[f"zero gradients in {watch}"] = zero_share
    return row
