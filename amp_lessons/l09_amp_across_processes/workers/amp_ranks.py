"""Lesson 09: what each rank does when torchrun starts ``python -m amp_lessons.l09_amp_across_processes.workers.amp_ranks``.

One launch runs every section the lesson shows, because starting processes is the expensive part (each
rank imports torch): ``spike`` (DDP + GradScaler, one rank's batch overflows), ``checkpoint`` (a timed DDP
run written with ``torch.distributed.checkpoint`` halfway, then resumed into fresh objects) and ``fsdp``
(FSDP2's ``MixedPrecisionPolicy``: gradient error and bytes per rank; skipped before torch 2.6, whose
public ``fully_shard`` it needs). Each rank saves plain data with ``amp_lessons.l09_amp_across_processes.distributed.save_rank``.

Backend: NCCL when there is one GPU per rank, otherwise gloo on the CPU (it runs on any laptop).
"""

from __future__ import annotations

import argparse
import datetime
import os
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from amp_lessons.core.environment import dtype_name, torch_version_tuple
from amp_lessons.l09_amp_across_processes import across_ranks as recipe
from amp_lessons.l09_amp_across_processes.distributed import report_failure, save_rank, start_rank


class Context:
    """Who this rank is and what it runs on."""

    def __init__(self, out_dir: str):
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.backend = dist.get_backend()
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))  # the GPU on this machine; RANK counts all
        self.device = torch.device(f"cuda:{local_rank}" if self.backend == "nccl" else "cpu")
        self.dtype = recipe.amp_dtype(self.device)
        self.out_dir = out_dir

    def say(self, text: str) -> None:
        print(f"[rank {self.rank}] {text}", flush=True)


def choose_backend(world: int) -> str:
    return "nccl" if recipe.rank_device(world).type == "cuda" else "gloo"


def wrap_ddp(model, ctx: Context) -> DistributedDataParallel:
    ids = [ctx.device.index] if ctx.device.type == "cuda" else None
    return DistributedDataParallel(model, device_ids=ids)


def weights_vs_rank0(model) -> float:
    """Largest difference between this rank's weights and rank 0's (0.0: identical replicas)."""
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    reference = flat.clone()
    dist.broadcast(reference, src=0)
    diff = (flat - reference).abs()
    same = (flat == reference) | (flat.isnan() & reference.isnan())
    return float(torch.where(same, torch.zeros_like(diff), diff).max())


# ------------------------------------------------------------------------------------------ spike (DDP)


def spike_section(ctx: Context) -> dict:
    """A few DDP steps; in one of them one rank's batch holds a reading that overflows FP16.

    A communication hook records whether this rank's *own* gradients were finite before DDP averaged
    them; after backward the averaged gradients are checked again. Then the scaler decides.
    """
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    model = wrap_ddp(recipe.make_model(0, ctx.device), ctx)
    own_finite = []

    def recording_hook(state, bucket):
        own_finite.append(bool(torch.isfinite(bucket.buffer()).all()))
        return default_hooks.allreduce_hook(None, bucket)  # the default: average over ranks

    model.register_comm_hook(None, recording_hook)
    optimizer = recipe.make_optimizer(model)
    scaler = recipe.make_scaler(ctx.device, ctx.dtype, enabled=True)  # on even for bfloat16: its decision
    records = []

    def after_step(step, seen):
        grads = [p.grad for p in model.parameters() if p.grad is not None]
        records.append(
            {
                "step": step,
                "loss": float(seen["loss"]),
                "local_finite": all(own_finite),
                "averaged_finite": all(bool(torch.isfinite(g).all()) for g in grads),
                "scale_before": seen["scale_before"],
                "scale_after": seen["scale_after"],
                "skipped": seen["scale_before"] is not None and seen["scale_after"] < seen["scale_before"],
                "weights_vs_rank0": weights_vs_rank0(model),
            }
        )
        own_finite.clear()

    recipe.run_steps(
        model,
        optimizer,
        scaler,
        range(recipe.SPIKE_STEPS),
        rank=ctx.rank,
        world=ctx.world,
        dtype=ctx.dtype,
        data=recipe.training_set(ctx.device),
        spike_step=recipe.SPIKE_STEP,
        after_step=after_step,
    )
    return {"records": records, "spike_step": recipe.SPIKE_STEP, "spike_rank": recipe.SPIKE_RANK}


# ------------------------------------------------------------------------------ checkpoint (DDP + DCP)


def dcp_state(model, optimizer, scaler, step: int) -> dict:
    """Everything the loop consumes, as torch.distributed.checkpoint wants it (plain, per-rank views)."""
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model_state, optimizer_state = get_state_dict(model, optimizer)
    return {"model": model_state, "optimizer": optimizer_state, "scaler": scaler.state_dict(), "step": step}


def load_dcp(path: str, model, optimizer, scaler) -> int:
    """Load a DCP checkpoint into these objects (each rank reads what it needs); returns the step."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import set_state_dict

    state = dcp_state(model, optimizer, scaler, step=-1)
    dcp.load(state, checkpoint_id=path)
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"])
    scaler.load_state_dict(state["scaler"])
    return int(state["step"])


def fresh_run(ctx: Context, seed: int):
    model = wrap_ddp(recipe.make_model(seed, ctx.device), ctx)
    return model, recipe.make_optimizer(model), recipe.make_scaler(ctx.device, ctx.dtype)


def checkpoint_section(ctx: Context) -> dict:
    """Train STEPS steps (timed), saving a DCP checkpoint at SAVE_STEP; then fresh objects load it and
    train SAVE_STEP..STEPS again. The two halves must give bitwise-equal losses."""
    import torch.distributed.checkpoint as dcp

    data = recipe.training_set(ctx.device)
    path = os.path.join(ctx.out_dir, f"checkpoint_step{recipe.SAVE_STEP}")
    model, optimizer, scaler = fresh_run(ctx, seed=0)
    kw = {"rank": ctx.rank, "world": ctx.world, "dtype": ctx.dtype, "data": data}
    first = recipe.run_steps(model, optimizer, scaler, range(recipe.SAVE_STEP), **kw)
    started = time.perf_counter()
    dcp.save(dcp_state(model, optimizer, scaler, recipe.SAVE_STEP), checkpoint_id=path)
    save_seconds = time.perf_counter() - started
    saved_scaler = dict(scaler.state_dict())
    second = recipe.run_steps(model, optimizer, scaler, range(recipe.SAVE_STEP, recipe.STEPS), **kw)
    final_scores = recipe.scores(model.module, recipe.held_out(ctx.device)[0], ctx.dtype)
    final_weights = [p.detach().cpu().clone() for p in model.parameters()]

    model2, optimizer2, scaler2 = fresh_run(ctx, seed=7)  # other weights, a scaler at its initial scale
    fresh_scale = scaler2.get_scale() if scaler2.is_enabled() else None
    step = load_dcp(path, model2, optimizer2, scaler2)
    loaded_scaler = dict(scaler2.state_dict())
    resumed = recipe.run_steps(model2, optimizer2, scaler2, range(step, recipe.STEPS), **kw)
    same_weights = all(torch.equal(a, b.detach().cpu()) for a, b in zip(final_weights, model2.parameters()))
    dist.barrier()
    files = []
    if ctx.rank == 0:
        files = [(name, os.path.getsize(os.path.join(path, name))) for name in sorted(os.listdir(path))]
    return {
        "seconds": first["seconds"] + second["seconds"],
        "losses": first["losses"] + second["losses"],
        "skipped": first["skipped"] + second["skipped"],
        "scores": final_scores,
        "resumed_steps": list(range(step, recipe.STEPS)),
        "uninterrupted": second["losses"],
        "resumed": resumed["losses"],
        "weights_equal": same_weights,
        "save_seconds": save_seconds,
        "saved_scaler": saved_scaler,
        "loaded_scaler": loaded_scaler,
        "fresh_scale": fresh_scale,
        "files": files,
        "path": path,
    }


# ------------------------------------------------------------------------------------------------ FSDP2


def fsdp_api():
    """(fully_shard, MixedPrecisionPolicy) from torch.distributed.fsdp (public since torch 2.6), or None."""
    if torch_version_tuple() < (2, 6):
        return None
    try:
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    except ImportError:
        return None
    return fully_shard, MixedPrecisionPolicy


POLICIES = (
    ("FP32 (no policy)", None, None),
    ("BF16 reduce only", torch.float32, torch.bfloat16),
    ("BF16 params, FP32 reduce", torch.bfloat16, torch.float32),
    ("BF16 params, BF16 reduce", torch.bfloat16, torch.bfloat16),
)


def wide_mlp(device) -> torch.nn.Sequential:
    """An MLP with ~0.8 M parameters (3 MiB in FP32): big enough for bytes per rank to mean something."""
    from amp_lessons.core.models import seeded_weights

    nn = torch.nn
    with seeded_weights(11):
        return nn.Sequential(
            nn.Linear(256, 512),
            nn.GELU(),
            nn.Linear(512, 512),
            nn.GELU(),
            nn.Linear(512, 512),
            nn.GELU(),
            nn.Linear(512, 10),
        ).to(device)


def fsdp_batch(device):
    generator = torch.Generator().manual_seed(12)
    inputs = torch.randn(recipe.BATCH, 256, generator=generator)
    targets = torch.randint(0, 10, (recipe.BATCH,), generator=generator)
    return inputs.to(device), targets.to(device)


def local_bytes(tensors) -> int:
    total = 0
    for t in tensors:
        if isinstance(t, torch.Tensor):
            t = t.to_local() if hasattr(t, "to_local") else t
            total += t.numel() * t.element_size()
    return total


def shard(model, api, param_dtype, reduce_dtype):
    fully_shard, MixedPrecisionPolicy = api
    policy = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=reduce_dtype)
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, mp_policy=policy)
    fully_shard(model, mp_policy=policy)
    return model


def fsdp_policy(ctx: Context, api, policy, reference: list) -> dict:
    """One forward/backward/AdamW step under ``policy``: the full (gathered) gradient's error, and bytes."""
    name, param_dtype, reduce_dtype = policy
    inputs, targets = fsdp_batch(ctx.device)
    rows = inputs.chunk(ctx.world)[ctx.rank], targets.chunk(ctx.world)[ctx.rank]
    if ctx.device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(ctx.device)
    model = shard(wide_mlp(ctx.device), api, param_dtype, reduce_dtype)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    loss = torch.nn.functional.cross_entropy(model(rows[0]).float(), rows[1])
    loss.backward()
    grads = [p.grad.full_tensor().float() for p in model.parameters()]  # gathers the shards (a collective)
    error = torch.cat([(g - r).reshape(-1) for g, r in zip(grads, reference)])
    norm = torch.cat([r.reshape(-1) for r in reference]).norm()
    optimizer.step()
    compute = param_dtype or torch.float32
    unsharded = max(sum(p.numel() for p in layer.parameters()) for layer in model if list(layer.parameters()))
    entry = {
        "policy": name,
        "param_dtype": dtype_name(compute),
        "reduce_dtype": dtype_name(reduce_dtype or compute),
        "rel_error": float(error.norm() / norm),
        "max_abs_error": float(error.abs().max()),
        "param_bytes": local_bytes(model.parameters()),
        "grad_bytes": local_bytes(p.grad for p in model.parameters()),
        "optimizer_bytes": local_bytes(v for s in optimizer.state.values() for v in s.values()),
        "unsharded_bytes": unsharded * torch.empty((), dtype=compute).element_size(),
    }
    if ctx.device.type == "cuda":
        entry["cuda_peak_bytes"] = torch.cuda.max_memory_allocated(ctx.device)
    return entry


def sharded_skip(ctx: Context, api) -> dict:
    """FSDP2 + float16 + GradScaler: after backward each rank holds only its *shard* of the gradients.
    Put an inf into rank 1's shard only (where an overflow would land) and see what each scaler decides."""
    inputs, targets = fsdp_batch(ctx.device)
    model = shard(wide_mlp(ctx.device), api, torch.float16, torch.float32)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    scaler = torch.amp.GradScaler(ctx.device.type, init_scale=2.0**10)
    rows = inputs.chunk(ctx.world)[ctx.rank], targets.chunk(ctx.world)[ctx.rank]
    scaler.scale(torch.nn.functional.cross_entropy(model(rows[0]).float(), rows[1])).backward()
    if ctx.rank == recipe.SPIKE_RANK:
        first = next(iter(model.parameters())).grad.to_local()
        first.view(-1)[0] = float("inf")
    own_finite = all(bool(torch.isfinite(p.grad.to_local()).all()) for p in model.parameters())
    before = scaler.get_scale()
    try:
        scaler.step(optimizer)
        scaler.update()
    except Exception as exc:  # a torch whose GradScaler cannot handle sharded gradients says so
        return {"error": f"{type(exc).__name__}: {str(exc).splitlines()[0]}", "own_finite": own_finite}
    return {
        "own_finite": own_finite,
        "scale_before": before,
        "scale_after": scaler.get_scale(),
        "skipped": scaler.get_scale() < before,
    }


def fsdp_section(ctx: Context) -> dict:
    api = fsdp_api()
    if api is None:
        return {
            "skipped": "FSDP2's public fully_shard/MixedPrecisionPolicy need torch 2.6 or newer; this is "
            f"torch {torch.__version__}. The section is skipped; the rest of the lesson runs."
        }
    inputs, targets = fsdp_batch(ctx.device)
    plain = wide_mlp(ctx.device)  # the FP32 reference: one process, the whole batch
    torch.nn.functional.cross_entropy(plain(inputs), targets).backward()
    reference = [p.grad.detach().clone() for p in plain.parameters()]
    replicated = sum(p.numel() for p in plain.parameters()) * 4
    policies = [fsdp_policy(ctx, api, policy, reference) for policy in POLICIES]
    return {
        "policies": policies,
        "ddp_bytes": {"params": replicated, "grads": replicated, "optimizer": 2 * replicated},
        "sharded_skip": sharded_skip(ctx, api),
    }


# ---------------------------------------------------------------------------------------------------- main

SECTIONS = {"spike": spike_section, "checkpoint": checkpoint_section, "fsdp": fsdp_section}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", required=True, help="folder for results, checkpoints and error reports")
    parser.add_argument("--sections", default=",".join(SECTIONS))
    parser.add_argument("--deadline", type=float, default=120.0, help="a rank still running after this exits")
    parser.add_argument("--collective-timeout", type=float, default=30.0)
    args = parser.parse_args(argv)
    start_rank(args.out, args.deadline)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    try:
        backend = choose_backend(world)
        if backend == "nccl":
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        dist.init_process_group(backend, timeout=datetime.timedelta(seconds=args.collective_timeout))
        ctx = Context(args.out)
        payload = {
            "rank": ctx.rank,
            "world_size": ctx.world,
            "backend": ctx.backend,
            "device": str(ctx.device),
            "dtype": dtype_name(ctx.dtype),
            "torch": str(torch.__version__),
            "seconds": {},
        }
        for name in [s for s in args.sections.split(",") if s]:
            started = time.perf_counter()
            payload[name] = SECTIONS[name](ctx)
            payload["seconds"][name] = time.perf_counter() - started
            ctx.say(f"{name}: done in {payload['seconds'][name]:.2f} s")
        save_rank(args.out, payload)
    except BaseException:
        report_failure(args.out)
        raise
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


if __name__ == "__main__":
    main()
