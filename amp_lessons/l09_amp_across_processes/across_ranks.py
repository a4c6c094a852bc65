"""Lesson 09: the training recipe every rank runs (and this notebook runs as one process), and the
numbers the lesson reads from what the ranks report.

Why a DDP run can be compared with a single process at all. Every step draws one *global* batch of
``BATCH`` rows (the same rows on every rank: the order comes from a generator seeded with the step
number, not from a rank's own random state) and rank ``r`` takes the ``r``-th equal slice. Each rank's
loss is the mean over its slice, DDP averages the gradients over ranks, and the mean of equal-size slice
means *is* the mean over the whole batch. So two processes with 32 rows each compute the gradient one
process computes with 64 rows, up to the order of the additions.

Why the skip decision agrees across ranks. DDP all-reduces the gradients *during* ``backward`` (bucket
by bucket, from hooks), so by the time ``scaler.step`` looks for inf/NaN every rank holds the same
averaged gradients. One rank's overflow makes everybody's average non-finite (inf + x = inf), every
rank's scaler finds it, every rank skips and backs off the scale: the ranks stay identical. A check made
*before* the gradients are combined (``unscale_`` before a hand-written all-reduce) would let one rank
step and another skip: lesson 09's exercise.
"""

from __future__ import annotations

import contextlib
import os
import time

import pandas as pd
import torch
from torch import nn

from amp_lessons.core.display import scale_text
from amp_lessons.core.environment import dtype_name, one_cpu_thread, probe_autocast
from amp_lessons.core.models import SensorClassifier, seeded_weights, sensor_readings
from amp_lessons.l03_autocast_and_gradscaler.training import train_step

BATCH = 64  # global batch: each of 2 ranks takes 32 rows
STEPS = 60  # the run that is timed, compared with the reference, and checkpointed
SAVE_STEP = 30  # where the checkpoint is written (and the resumed run starts)
LR = 1e-3
HIDDEN = 128
TRAIN_ROWS = 1024
READING_SCALE = 1.0  # normalised readings: FP16 gradients fit at the scaler's initial 2**16
SPIKE_STEPS = 7  # the short run that shows the skip decision
SPIKE_STEP = 3  # ... in which one rank's batch has a reading that overflows FP16
SPIKE_RANK = 1
SPIKE_VALUE = 3.0e5  # > 65504, the largest float16: becomes inf when autocast casts the input


def rank_device(world: int = 2) -> torch.device:
    """Where the ranks run: one GPU each when there are ``world`` GPUs (NCCL), otherwise the CPU (gloo).
    A single GPU cannot host two NCCL ranks, so a one-GPU machine runs the ranks on its CPU."""
    wants_cpu = os.environ.get("AMP_LESSONS_DEVICE", "").strip() == "cpu"
    if not wants_cpu and torch.cuda.is_available() and torch.cuda.device_count() >= world:
        return torch.device("cuda", 0)
    return torch.device("cpu")


def amp_dtype(device: torch.device) -> torch.dtype:
    """float16 where autocast supports it on ``device`` (it needs the GradScaler), else bfloat16."""
    return torch.float16 if probe_autocast(device, torch.float16)[0] else torch.bfloat16


def make_model(seed: int = 0, device="cpu") -> nn.Module:
    """Lesson 06's sensor classifier without dropout (no random numbers in the step), head kept in FP32."""
    with seeded_weights(seed):
        return SensorClassifier(in_features=16, hidden=HIDDEN, dropout=0.0, fp32_regions=("head",)).to(device)


def make_optimizer(model: nn.Module) -> torch.optim.Optimizer:
    return torch.optim.AdamW(model.parameters(), lr=LR)


def make_scaler(device: torch.device, dtype, enabled: bool | None = None) -> torch.amp.GradScaler:
    """One scaler per run, created once; by default disabled (a no-op) for FP32 and for bfloat16, which has
    float32's range and needs no loss scaling (``enabled=True`` keeps it on, to show its skip decision).

    ``growth_interval=20``: the scale doubles after every 20 clean steps, so at the checkpoint (step 30) it
    is 2**17, not the 2**16 a fresh scaler starts with: the scaler state visibly matters for the resume.
    """
    enabled = dtype == torch.float16 if enabled is None else enabled
    return torch.amp.GradScaler(device.type, init_scale=2.0**16, growth_interval=20, enabled=enabled)


def training_set(device="cpu"):
    readings, labels = sensor_readings(TRAIN_ROWS, seed=1, scale=READING_SCALE)
    return readings.to(device), labels.to(device)


def held_out(device="cpu"):
    readings, labels = sensor_readings(256, seed=2, scale=READING_SCALE)
    return readings.to(device), labels.to(device)


def step_rows(step: int, rank: int = 0, world: int = 1) -> torch.Tensor:
    """The rows of the training set that ``rank`` uses in ``step``: its slice of the step's global batch.

    The global batch depends on the step number only, so every rank (and a resumed run) agrees on it
    without sharing random state; with ``world=1`` it is the whole global batch.
    """
    order = torch.randperm(TRAIN_ROWS, generator=torch.Generator().manual_seed(1000 + step))[:BATCH]
    return order.chunk(world)[rank]


def spike_inputs(inputs: torch.Tensor, dtype) -> torch.Tensor:
    """One reading that overflows the autocast dtype: 3e5 for float16; inf where only bfloat16 is
    available (bfloat16 has float32's range, so nothing finite overflows it)."""
    spiked = inputs.clone()
    spiked[0, 0] = SPIKE_VALUE if dtype == torch.float16 else float("inf")
    return spiked


def fp32_step(model, optimizer, loss_fn, inputs, targets):
    optimizer.zero_grad(set_to_none=True)
    loss = loss_fn(model(inputs), targets)
    loss.backward()
    optimizer.step()
    return loss.detach()


def run_steps(
    model,
    optimizer,
    scaler,
    steps,
    *,
    rank: int = 0,
    world: int = 1,
    dtype=None,
    data=None,
    spike_step: int | None = None,
    after_step=None,
) -> dict:
    """Train ``steps`` (an iterable of step numbers) on this rank's slices; ``dtype=None`` is FP32.

    Returns ``losses`` (one detached tensor per step), ``seconds`` per step, the ``scale`` after each
    step and the steps the scaler ``skipped``. ``after_step(step, record)`` sees each step's record.
    """
    readings, labels = data if data is not None else training_set(next(model.parameters()).device)
    loss_fn = nn.functional.cross_entropy
    out = {"steps": [], "losses": [], "seconds": [], "scale": [], "skipped": []}
    for step in steps:
        rows = step_rows(step, rank, world)
        inputs, targets = readings[rows], labels[rows]
        if step == spike_step and rank == SPIKE_RANK % world:
            inputs = spike_inputs(inputs, dtype)
        scale_before = scaler.get_scale() if scaler is not None and scaler.is_enabled() else None
        started = time.perf_counter()
        if dtype is None:
            loss = fp32_step(model, optimizer, loss_fn, inputs, targets)
        else:
            loss = train_step(model, optimizer, scaler, loss_fn, inputs, targets, dtype=dtype)
        out["seconds"].append(time.perf_counter() - started)
        scale_after = scaler.get_scale() if scale_before is not None else None
        out["steps"].append(step)
        out["losses"].append(loss)
        out["scale"].append(scale_after)
        if scale_before is not None and scale_after < scale_before:
            out["skipped"].append(step)
        if after_step is not None:
            after_step(step, {"loss": loss, "scale_before": scale_before, "scale_after": scale_after})
    return out


def scores(model: nn.Module, inputs: torch.Tensor, dtype=None) -> torch.Tensor:
    """``[N, C]`` float32 scores on ``inputs``, under autocast in ``dtype`` (None: FP32), in eval mode."""
    model.eval()
    policy = contextlib.nullcontext() if dtype is None else torch.autocast(inputs.device.type, dtype=dtype)
    with torch.no_grad(), policy:
        out = model(inputs).float()
    model.train()
    return out.cpu()


def single_process_run(device: torch.device, dtype=None, steps: int = STEPS) -> dict:
    """The same run in this one process on the whole global batch (FP32 with ``dtype=None``), one thread."""
    with one_cpu_thread():
        model = make_model(0, device)
        optimizer = make_optimizer(model)
        scaler = make_scaler(device, dtype)
        run = run_steps(model, optimizer, scaler, range(steps), dtype=dtype, data=training_set(device))
        run["scores"] = scores(model, held_out(device)[0], dtype)
    run["dtype"] = "float32" if dtype is None else dtype_name(dtype)
    return run


def seconds_per_step(seconds: list, skip_first: int = 2) -> float:
    """Median seconds per step after the first ``skip_first`` (warm-up: first calls allocate memory)."""
    kept = sorted(seconds[skip_first:] or seconds)
    return kept[len(kept) // 2] if kept else float("nan")


# ------------------------------------------------------------------------------------- what the ranks said


def spike_table(ranks: list) -> pd.DataFrame:
    """One row per step of the short overflow run; each cell shows every rank's value ("rank 0 / rank 1")."""

    def per_rank(records, key, show=str):
        return " / ".join(show(record[key]) for record in records)

    def yes_no(value):
        return "yes" if value else "no"

    rows = []
    for step_records in zip(*(payload["spike"]["records"] for payload in ranks)):
        rows.append(
            {
                "step": step_records[0]["step"],
                "loss on own rows": per_rank(step_records, "loss", lambda v: f"{v:.4f}"),
                "own grads finite": per_rank(step_records, "local_finite", yes_no),
                "averaged grads finite": per_rank(step_records, "averaged_finite", yes_no),
                "skipped": per_rank(step_records, "skipped", yes_no),
                "scale after": per_rank(step_records, "scale_after", scale_text),
                "max |weights - rank 0's|": max(record["weights_vs_rank0"] for record in step_records),
            }
        )
    order = " / ".join(f"rank {rank}" for rank in range(len(ranks)))
    return pd.DataFrame(rows).set_index("step").rename_axis(f"step ({order})")


def resume_table(ranks: list) -> pd.DataFrame:
    """Per step and rank: uninterrupted loss, resumed loss, and whether they are bitwise equal."""
    rows = []
    for rank, payload in enumerate(ranks):
        section = payload["checkpoint"]
        for step, a, b in zip(section["resumed_steps"], section["uninterrupted"], section["resumed"]):
            rows.append(
                {
                    "step": step,
                    "rank": rank,
                    "uninterrupted loss": float(a),
                    "resumed loss": float(b),
                    "torch.equal": bool(torch.equal(a, b)),
                }
            )
    return pd.DataFrame(rows).set_index(["step", "rank"])


def timing_table(single: dict, ranks: list) -> pd.DataFrame:
    """Seconds per step: one process with the whole batch vs each of the ranks with its slice."""
    rows = [
        {
            "run": f"1 process, {BATCH} rows per step",
            "where": "this notebook's process",
            "ms per step": 1000 * seconds_per_step(single["seconds"]),
        }
    ]
    for rank, payload in enumerate(ranks):
        run = payload["checkpoint"]
        rows.append(
            {
                "run": f"{len(ranks)} processes (DDP), {BATCH // len(ranks)} rows each",
                "where": f"rank {rank} ({payload['backend']})",
                "ms per step": 1000 * seconds_per_step(run["seconds"]),
            }
        )
    return pd.DataFrame(rows).set_index("run").round(3)


def fsdp_table(ranks: list) -> pd.DataFrame:
    """Per policy: gradient error against the FP32 reference and the bytes each rank holds."""
    rows = []
    for rank, payload in enumerate(ranks):
        for entry in payload["fsdp"].get("policies", []):
            rows.append(
                {
                    "policy": entry["policy"],
                    "rank": rank,
                    "param_dtype": entry["param_dtype"],
                    "reduce_dtype": entry["reduce_dtype"],
                    "gradient rel. error": entry["rel_error"],
                    "gradient max abs error": entry["max_abs_error"],
                    "params KiB": entry["param_bytes"] / 1024,
                    "grads KiB": entry["grad_bytes"] / 1024,
                    "AdamW state KiB": entry["optimizer_bytes"] / 1024,
                    "largest unsharded layer KiB": entry["unsharded_bytes"] / 1024,
                    "CUDA peak MiB": entry.get("cuda_peak_bytes", float("nan")) / 2**20,
                }
            )
    return pd.DataFrame(rows).set_index(["policy", "rank"])


def simulated_reduction_error(
    ranks_counts=(2, 4, 8, 16, 32, 64, 128), numel: int = 20000, seed: int = 0
) -> pd.DataFrame:
    """Relative error of averaging ``n`` ranks' bfloat16 gradients, reduced in bfloat16 vs in float32.

    Each rank's gradient is a shared signal plus its own noise (different data), already in bfloat16
    (computed with ``param_dtype=bfloat16``). A ring reduction adds one rank's contribution per hop; in
    bfloat16 every partial sum is rounded to 8 significant bits, in float32 to 24. The error is measured
    against the exact (float64) average of the same bfloat16 gradients: it is the reduction's own error.
    """
    generator = torch.Generator().manual_seed(seed)
    signal = torch.randn(numel, generator=generator, dtype=torch.float64)
    rows = []
    for count in ranks_counts:
        grads = signal + 2.0 * torch.randn(count, numel, generator=generator, dtype=torch.float64)
        grads = grads.to(torch.bfloat16)
        exact = grads.double().mean(dim=0)
        for reduce_dtype in (torch.bfloat16, torch.float32):
            partial = grads[0].to(reduce_dtype)
            for k in range(1, count):
                partial = (partial.float() + grads[k].float()).to(reduce_dtype)
            average = (partial.float() / count).to(reduce_dtype).double()
            error = float((average - exact).norm() / exact.norm())
            rows.append({"ranks": count, "reduce_dtype": dtype_name(reduce_dtype), "rel. error": error})
    return pd.DataFrame(rows).pivot(index="ranks", columns="reduce_dtype", values="rel. error")


def memory_table(ranks: list) -> pd.DataFrame:
    """KiB each rank holds: DDP (full replicas) against FSDP2 under each policy (local shards)."""
    rows = []
    for rank, payload in enumerate(ranks):
        section = payload["fsdp"]
        if "policies" not in section:
            continue
        ddp = section["ddp_bytes"]
        rows.append(
            {
                "setup": "DDP (every rank holds everything)",
                "rank": rank,
                "params": ddp["params"],
                "grads": ddp["grads"],
                "AdamW state": ddp["optimizer"],
                "unsharded layer (transient)": 0,
            }
        )
        for entry in section["policies"]:
            if entry["policy"] in ("FP32 (no policy)", "BF16 params, BF16 reduce"):
                rows.append(
                    {
                        "setup": f"FSDP2, {entry['policy']}",
                        "rank": rank,
                        "params": entry["param_bytes"],
                        "grads": entry["grad_bytes"],
                        "AdamW state": entry["optimizer_bytes"],
                        "unsharded layer (transient)": entry["unsharded_bytes"],
                    }
                )
    table = pd.DataFrame(rows).set_index(["setup", "rank"]) / 1024
    table["total KiB"] = table.sum(axis=1)
    return table.round(1)


def files_table(files: list) -> pd.DataFrame:
    return pd.DataFrame(files, columns=["file", "bytes"]).set_index("file")


def closing_numbers(single: dict, ranks: list, resume: pd.DataFrame, run_seconds: float) -> pd.DataFrame:
    """The lesson's measured numbers in one table (the closing note)."""
    timing = timing_table(single, ranks)["ms per step"]
    rows = [
        ("time per step, 1 process", f"{timing.iloc[0]:.2f} ms"),
        (f"time per step, {len(ranks)} processes (slowest rank)", f"{timing.iloc[1:].max():.2f} ms"),
    ]
    policies = {e["policy"]: e for e in ranks[0]["fsdp"].get("policies", [])}
    if policies:
        for name in ("BF16 params, FP32 reduce", "BF16 params, BF16 reduce", "BF16 reduce only"):
            rows.append((f"gradient rel. error, {name}", f"{policies[name]['rel_error']:.2e}"))
        memory = memory_table(ranks)["total KiB"]
        rows.append(("KiB per rank, DDP", f"{memory.xs('DDP (every rank holds everything)').max():.0f}"))
        fsdp_total = memory.xs("FSDP2, BF16 params, BF16 reduce").max()
        rows.append(("KiB per rank, FSDP2 (BF16 params)", f"{fsdp_total:.0f}"))
    else:
        rows.append(("FSDP2", ranks[0]["fsdp"].get("skipped", "skipped")))
    rows.append(("resumed losses bitwise equal", f"{int(resume['torch.equal'].sum())} of {len(resume)}"))
    rows.append(("one torchrun launch (all sections)", f"{run_seconds:.1f} s"))
    return pd.DataFrame(rows, columns=["measured here", "value"]).set_index("measured here")
