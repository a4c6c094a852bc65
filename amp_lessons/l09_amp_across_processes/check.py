"""Lesson 09's checker: ``synced_train_step``, an AMP step whose gradients the learner averages over ranks
by hand (no DDP wrapper), run for real on 2 gloo processes.

Why this exercise. DDP hides the one thing that must hold across ranks: every rank has the *same*
gradients before the GradScaler looks for inf/NaN, so every rank makes the same skip decision and the
replicas stay identical. As soon as people leave DDP (a model DDP cannot wrap, a hand-written
``all_reduce`` as in the PyTorch tutorials, sharded optimizers) they reach for lesson 03's step and put the
all-reduce somewhere: after ``unscale_`` (the inf check is then made on one rank's own gradients), after
clipping (each rank clips by its own norm), or they sum without dividing, or they log their own rank's
loss. Each of those trains *something* without an error, which is why it needs a checker.

How the check works. ``amp_lessons.l09_amp_across_processes.distributed.run_ranks`` starts 2 processes joined
by a gloo group (forked on Linux: about half a second in all; spawned elsewhere: a few seconds, each imports
torch). On each rank a tiny classifier takes 6 steps of the learner's function on its slice of a fixed batch;
rank 1's slices are larger in magnitude (so the ranks' own gradient norms differ), step 2 gives rank 1 a loss
that overflows once scaled (the other rank's is normal), and steps 3 and 5 clip. Each rank reports its
weights, its scale and the loss it returned after every step. The parent replays the same 6 steps for both
ranks in one process, combining the gradients the right way and in each known wrong way; a learner whose ranks
match the right replay passes, one that matches a wrong replay is told which, and ranks that disagree are told
at which step and how.

Where the ranks run. They must be forked from the process where the learner's function lives, so they are
started by ``spies.run_synced_ranks`` through ``harness.run_beside_learner``: in a notebook that is this
process, when a class is graded it is the learner's sandboxed kernel, and this checker (in the judge) gets
back plain data: each rank's status, printed output, weights, scales and returned losses. ``read_report``
checks its shape and types (anything else fails with a message), a learner's problem inside a rank comes
back as its message and becomes a failed result here, and the weights, scales and losses pass only when
they equal the replay this process computes itself.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field

import torch

from amp_lessons.checks.harness import (
    NOT_DONE,
    CheckResult,
    checker,
    failed,
    passed,
    run_beside_learner,
)
from amp_lessons.checks.mistakes import first_mistake, rule
from amp_lessons.core.display import scale_text
from amp_lessons.core.environment import dtype_name, one_cpu_thread, probe_autocast
from amp_lessons.l09_amp_across_processes.distributed import RankOutcome, RanksResult, start_method
from amp_lessons.l09_amp_across_processes.spies import (
    INIT_SCALE,
    PLAN,
    SPIKE_RANK,
    SPIKE_STEP,
    WORLD,
    flat_weights,
    fresh_replica,
    rank_batch,
    rank_loss_fn,
    rank_task,
    run_synced_ranks,
    spiked_loss,
)

TASK_TIMEOUT_S = 5.0  # 6 steps take a fraction of a second; forked ranks start in well under one,
START_TIMEOUT_S = {"fork": 6.0, "spawn": 13.0}  # spawned ones import torch first (the harness stops at 20 s)
COLLECTIVE_TIMEOUT_S = 4.0


# ------------------------------------------------------------------------------------------ the scenario
# (the model, the batches and the plan live in ``spies.py``: the ranks run them beside the learner's function)


@functools.lru_cache(maxsize=1)
def _dtype() -> torch.dtype:
    return torch.float16 if probe_autocast(torch.device("cpu"), torch.float16)[0] else torch.bfloat16


# -------------------------------------------------------------------------------- the replays (models)


def _combine(grads: list, how: str) -> list:
    """Each rank's gradients after combining them ``how``; grads[r] is rank r's list of tensors."""
    if how == "none":
        return grads
    if how == "rank0":
        return [[g.clone() for g in grads[0]] for _ in grads]
    total = [sum(parts) for parts in zip(*grads)]
    divisor = {"mean": WORLD, "sum": 1, "twice": WORLD * WORLD, "local_clip": WORLD}[how]
    return [[t / divisor for t in total] for _ in grads]


@functools.lru_cache(maxsize=8)
def replay(how: str, dtype: torch.dtype) -> dict:
    """Both ranks' weights, scales and losses after each step when the gradients are combined ``how``:
    "mean" (right), "sum", "twice" (divided by world twice), "rank0" (broadcast from rank 0), "none" (no
    all-reduce), "local_clip" (each rank unscales and clips its own gradients, then they are averaged)."""
    runs = [fresh_replica() for _ in range(WORLD)]
    out = {"params": [[] for _ in runs], "scale": [[] for _ in runs], "local": [[] for _ in runs], "mean": []}
    with one_cpu_thread():
        for step, max_norm in enumerate(PLAN):
            grads, losses = [], []
            for rank, (model, optimizer, scaler) in enumerate(runs):
                optimizer.zero_grad(set_to_none=True)
                inputs, targets = rank_batch(step, rank)
                with torch.autocast("cpu", dtype=dtype):
                    loss = rank_loss_fn(step, rank)(model(inputs), targets)
                scaler.scale(loss).backward()
                if how == "local_clip" and max_norm is not None:
                    scaler.unscale_(optimizer)
                    torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
                grads.append([p.grad for p in model.parameters()])
                losses.append(float(loss.detach()))
            for (model, optimizer, scaler), combined in zip(runs, _combine(grads, how)):
                for p, g in zip(model.parameters(), combined):
                    p.grad = g.clone()
                if max_norm is not None and how != "local_clip":
                    scaler.unscale_(optimizer)
                    torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
                scaler.step(optimizer)
                scaler.update()
            for rank, (model, _, scaler) in enumerate(runs):
                out["params"][rank].append(flat_weights(model))
                out["scale"][rank].append(scaler.get_scale())
                out["local"][rank].append(losses[rank])
            out["mean"].append(sum(losses) / WORLD)
    return out


# ------------------------------------------------------------------------------------- what was seen


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal up to the rounding of a different order of additions (a model cast to half still compares)."""
    if a.shape != b.shape:
        return False
    return bool(torch.allclose(a.float(), b.float(), rtol=1e-4, atol=1e-6, equal_nan=True))


def _matches(traj: list, model: list) -> bool:
    return all(_same(a, b) for a, b in zip(traj, model))


@dataclass
class Seen:
    """Both ranks' records, lined up by step, and the replays to compare them with."""

    params: list  # [rank][step] flat weights
    scales: list  # [rank][step]
    returned: list  # [rank][step] float, or the message saying what it was instead
    dtype: torch.dtype
    replays: dict = field(default_factory=dict)

    def replay(self, how: str) -> dict:
        if how not in self.replays:
            self.replays[how] = replay(how, self.dtype)
        return self.replays[how]

    def like(self, how: str) -> bool:
        """Do both ranks' weights follow the replay ``how`` at every step?"""
        model = self.replay(how)["params"]
        return all(_matches(self.params[rank], model[rank]) for rank in range(WORLD))

    def ranks_agree(self, step: int) -> bool:
        return _same(self.params[0][step], self.params[1][step])

    @property
    def first_disagreement(self):
        return next((step for step in range(len(PLAN)) if not self.ranks_agree(step)), None)

    @property
    def first_deviation(self):
        right = self.replay("mean")["params"]
        return next(
            (
                s
                for s in range(len(PLAN))
                if not all(_same(self.params[r][s], right[r][s]) for r in range(WORLD))
            ),
            None,
        )

    def skipped(self, rank: int, step: int) -> bool:
        before = INIT_SCALE if step == 0 else self.scales[rank][step - 1]
        return self.scales[rank][step] < before

    def finite(self, rank: int, step: int) -> bool:
        return bool(torch.isfinite(self.params[rank][step]).all())

    def spike_story(self) -> str:
        parts = []
        for rank in range(WORLD):
            before = self.scales[rank][SPIKE_STEP - 1]
            state = "skipped" if self.skipped(rank, SPIKE_STEP) else "stepped"
            weights = "" if self.finite(rank, SPIKE_STEP) else ", and its weights became NaN/inf"
            parts.append(
                f"rank {rank} {state} (scale {scale_text(before)} -> "
                f"{scale_text(self.scales[rank][SPIKE_STEP])}){weights}"
            )
        return "; ".join(parts)


@functools.lru_cache(maxsize=1)
def _initial_weights() -> torch.Tensor:
    return flat_weights(fresh_replica()[0])


def _never_moved(seen: Seen) -> list:
    """Ranks whose weights are still the initial ones after every step (scaler.step never applied there)."""
    return [r for r in range(WORLD) if all(torch.equal(p, _initial_weights()) for p in seen.params[r])]


def _never_updated_message(seen: Seen) -> str:
    return (
        f"{' and '.join(f'rank {r}' for r in _never_moved(seen))} never changed its weights in {len(PLAN)} "
        "steps: scaler.step(optimizer) was never applied there. Every rank holds its own replica and must "
        "call scaler.step(optimizer) and scaler.update() itself (not only rank 0, not only when the loss "
        "looks finite): the all-reduce makes the gradients equal, the step makes the replicas move."
    )


@rule("weights never updated", _never_updated_message)
def weights_never_updated(seen: Seen) -> bool:
    return bool(_never_moved(seen))


@rule(
    "gradients never combined",
    "The ranks drift apart from the first step: after step 0 rank 0's and rank 1's weights already "
    "differ, so each rank trained on its own slice only. Average the gradients over ranks after "
    "backward: for every parameter, dist.all_reduce(p.grad, op=dist.ReduceOp.SUM), then divide by "
    "dist.get_world_size(). (DDP does exactly this inside backward.)",
)
def gradients_never_combined(seen: Seen) -> bool:
    return not seen.ranks_agree(0)


def _local_skip_message(seen: Seen) -> str:
    return (
        f"Different skip decisions at step {SPIKE_STEP}, where only rank {SPIKE_RANK}'s scaled loss "
        f"overflowed: {seen.spike_story()}. The inf/NaN check ran before the gradients were combined — "
        "scaler.unscale_(optimizer) records its found-inf verdict when it is called, so calling it before "
        "the all-reduce lets each rank judge its own gradients, and the all-reduce then spreads the inf to "
        "a rank that has already decided to step. All-reduce first; then unscale_, clip and scaler.step, "
        "so every rank sees the same averaged gradients and skips together."
    )


@rule("skip decision made on one rank's gradients", _local_skip_message)
def skip_decided_on_own_gradients(seen: Seen) -> bool:
    step = SPIKE_STEP
    decisions = {seen.skipped(rank, step) for rank in range(WORLD)}
    finite = {seen.finite(rank, step) for rank in range(WORLD)}
    return len(decisions) > 1 or len(finite) > 1


def _disagreement_message(seen: Seen) -> str:
    return (
        f"The ranks' weights differ after step {seen.first_disagreement} (the replicas must stay identical: "
        "every rank has to apply the same averaged gradients). Is every parameter's gradient all-reduced on "
        "every rank, and nothing done on one rank only (e.g. under `if rank == 0`)?"
    )


@rule("ranks disagree", _disagreement_message)
def ranks_disagree(seen: Seen) -> bool:
    return seen.first_disagreement is not None


# What the ranks' records show on their own (checked first).
RANK_RULES = (
    weights_never_updated,
    gradients_never_combined,
    skip_decided_on_own_gradients,
    ranks_disagree,
)


@rule(
    "summed, not averaged",
    "The ranks agree, but every update is 2x too large: you summed the gradients over ranks without "
    "dividing by the world size. The loss is a mean over each rank's rows, so the gradient of the "
    "whole batch is the mean of the ranks' gradients. With Adam this can hide (it is scale-invariant), "
    "but clipping thresholds and SGD steps then mean world_size times what you think. Divide by "
    "dist.get_world_size() after the SUM (or use ReduceOp.AVG where the backend supports it).",
)
def summed_not_averaged(seen: Seen) -> bool:
    return seen.like("sum")


@rule(
    "averaged twice",
    "The ranks agree, but every update is half as large as it should be: the gradients were divided by "
    "the world size twice (e.g. ReduceOp.AVG followed by a division, or the loss divided by the world "
    "size before backward *and* the sum divided again). Divide once.",
)
def averaged_twice(seen: Seen) -> bool:
    return seen.like("twice")


@rule(
    "only rank 0's gradients",
    "The ranks agree, but they follow rank 0's gradients only: rank 1's data never reaches the update "
    f"(at step {SPIKE_STEP}, where rank 1's loss overflowed, nobody skipped). dist.broadcast copies one "
    "rank's tensor to all; dist.all_reduce(..., op=ReduceOp.SUM) adds every rank's. Use all_reduce and "
    "divide by the world size.",
)
def only_rank0_gradients(seen: Seen) -> bool:
    return seen.like("rank0")


@rule(
    "clipped each rank's own gradients",
    "The skip decision is right, but at the clipping steps (3 and 5) each rank clipped its *own* "
    "gradients by its own norm before they were averaged: rank 1's larger gradients were scaled down "
    "by a different factor than rank 0's, so the average is not the clipped batch gradient. Clip after "
    "the all-reduce: all-reduce, then scaler.unscale_, then clip_grad_norm_ — the norm is then the "
    "norm of the batch gradient, the same on every rank.",
)
def clipped_own_gradients(seen: Seen) -> bool:
    return seen.like("local_clip")


def _overflow_not_skipped_message(seen: Seen) -> str:
    return (
        f"At step {SPIKE_STEP} rank {SPIKE_RANK}'s scaled loss overflowed, but no rank skipped the step "
        f"({seen.spike_story()}). The GradScaler must see the inf in the averaged gradients: do not replace "
        "non-finite values (nan_to_num, clamping) and let scaler.step(optimizer) decide."
    )


@rule("overflow not skipped", _overflow_not_skipped_message)
def overflow_not_skipped(seen: Seen) -> bool:
    return not any(seen.skipped(r, SPIKE_STEP) for r in range(WORLD))


def _wrong_update_message(seen: Seen) -> str:
    return (
        f"The ranks agree with each other, but from step {seen.first_deviation} on their weights differ "
        "from one AMP step on the averaged gradients (zero_grad, autocast over forward and loss, "
        "scaler.scale(loss).backward(), all-reduce and divide, unscale_ and clip when max_norm is given, "
        "scaler.step, scaler.update). Compare your order with lesson 03's train_step."
    )


@rule("wrong update", _wrong_update_message)
def wrong_update(seen: Seen) -> bool:
    return seen.first_deviation is not None


# The ranks agree with each other: what their common weights show (the known wrong replays first).
TRAJECTORY_RULES = (
    summed_not_averaged,
    averaged_twice,
    only_rank0_gradients,
    clipped_own_gradients,
    overflow_not_skipped,
    wrong_update,
)


def _loss_close(value, expected: float) -> bool:
    return isinstance(value, float) and math.isclose(value, expected, rel_tol=1e-4, abs_tol=1e-6)


def _loss_is(seen: Seen, expected) -> bool:
    """Does every returned value equal ``expected(rank, step)`` (over the steps without the spike)?"""
    steps = [s for s in range(len(PLAN)) if s != SPIKE_STEP]
    return all(_loss_close(seen.returned[r][s], expected(r, s)) for r in range(WORLD) for s in steps)


def _returned_text(seen: Seen, step: int = 0) -> str:
    return ", ".join(f"rank {r}: {seen.returned[r][step]:.6g}" for r in range(WORLD))


def _scaled_batch_loss(seen: Seen, rank: int, step: int) -> float:
    """The batch loss times the scale rank ``rank`` used at ``step`` (what scaler.scale(loss) holds)."""
    scale = INIT_SCALE if step == 0 else seen.scales[rank][step - 1]
    return seen.replay("mean")["mean"][step] * scale


def _own_loss_message(seen: Seen) -> str:
    return (
        f"The weights are right, but each rank returned the loss of its own slice ({_returned_text(seen)} at "
        f"step 0; the batch loss is {seen.replay('mean')['mean'][0]:.6g}). A log written by rank 0 then "
        "shows half of the data, and ranks disagree about the number. All-reduce a detached copy of the "
        "loss (SUM) and divide by the world size."
    )


@rule("returned its own rank's loss", _own_loss_message)
def returned_own_rank_loss(seen: Seen) -> bool:
    return _loss_is(seen, lambda r, s: seen.replay("mean")["local"][r][s])


def _scaled_loss_message(seen: Seen) -> str:
    return (
        f"The weights are right, but the returned loss ({_returned_text(seen)} at step 0) is the *scaled* "
        f"loss, {scale_text(INIT_SCALE)} times the batch loss ({seen.replay('mean')['mean'][0]:.6g}): "
        "scaler.scale(loss) is only for backward. Average the unscaled loss (loss.detach()) over ranks."
    )


@rule("returned the scaled loss", _scaled_loss_message)
def returned_scaled_loss(seen: Seen) -> bool:
    return _loss_is(seen, functools.partial(_scaled_batch_loss, seen))


def _summed_loss_message(seen: Seen) -> str:
    return (
        f"The weights are right, but the returned loss ({_returned_text(seen)} at step 0) is the sum over "
        f"ranks, {WORLD}x the batch loss ({seen.replay('mean')['mean'][0]:.6g}). Divide by the world size."
    )


@rule("returned the summed loss", _summed_loss_message)
def returned_summed_loss(seen: Seen) -> bool:
    return _loss_is(seen, lambda r, s: WORLD * seen.replay("mean")["mean"][s])


# The weights are right: what the returned loss is instead of the batch loss.
LOSS_RULES = (
    returned_own_rank_loss,
    returned_scaled_loss,
    returned_summed_loss,
)


# ------------------------------------------------------------------------------- the ranks' report, read


STATUSES = ("ok", "error", "timeout", "not started", "crashed")
METHODS = ("fork", "spawn", "forkserver")
TEXT_LIMIT = 8000  # a rank's printed output and errors are cut at 4,000 characters each where they start


class UnreadableReport(Exception):
    """The ranks' report is not what ``spies.run_synced_ranks`` sends (the course code was changed where the
    ranks ran): the check says so and fails, it never guesses."""


def _text(value, what: str) -> str:
    if type(value) is not str:
        raise UnreadableReport(f"{what} is a {type(value).__name__}, not a string")
    return value[:TEXT_LIMIT]


def _real(value, what: str) -> float:
    if type(value) not in (int, float):  # (not a bool: type() is exact)
        raise UnreadableReport(f"{what} is a {type(value).__name__}, not a number")
    try:
        return float(value)
    except OverflowError:  # an int too large for a float
        raise UnreadableReport(f"{what} is too large a number") from None


def _weights(value, what: str) -> torch.Tensor:
    """A rank's flat weights after a step: a plain CPU float tensor of the model's size, copied."""
    size = _initial_weights().numel()
    if type(value) not in (torch.Tensor, torch.nn.Parameter):
        raise UnreadableReport(f"{what} is a {type(value).__name__}, not a tensor")
    tensor = value.detach()
    if (
        type(tensor) is not torch.Tensor
        or tensor.layout != torch.strided
        or tensor.device.type != "cpu"
        or not tensor.is_floating_point()
        or tuple(tensor.shape) != (size,)
    ):
        raise UnreadableReport(f"{what} is not a flat vector of the model's {size} weights")
    return tensor.clone()


def _record(value, what: str) -> dict:
    if type(value) is not dict:
        raise UnreadableReport(f"{what} is a {type(value).__name__}, not a record")
    returned = value.get("returned")
    return {
        "returned": returned[:TEXT_LIMIT] if type(returned) is str else _real(returned, f"{what}'s loss"),
        "params": _weights(value.get("params"), f"{what}'s weights"),
        "scale": _real(value.get("scale"), f"{what}'s scale"),
    }


def _rank_value(value, what: str) -> dict:
    """What a rank that finished sent: its records, and the learner's problem as a result that never passes."""
    if type(value) is not dict or type(value.get("records")) is not list:
        raise UnreadableReport(f"{what} sent no list of records")
    if len(value["records"]) > len(PLAN):
        raise UnreadableReport(f"{what} sent {len(value['records'])} records for {len(PLAN)} steps")
    records = [_record(record, f"{what}, step {step}") for step, record in enumerate(value["records"])]
    if "problem" in value:  # the learner's function raised, was a stub or could not be called
        message = _text(value["problem"], f"{what}'s problem")
        if value.get("status") == NOT_DONE:
            return {"problem": CheckResult(False, message, NOT_DONE), "records": records}
        return {"problem": failed(message), "records": records}
    if len(records) != len(PLAN):
        raise UnreadableReport(f"{what} sent {len(records)} records for {len(PLAN)} steps")
    return {"records": records}


def _outcome(value, rank: int) -> RankOutcome:
    what = f"rank {rank}"
    if type(value) is not dict or type(value.get("rank")) is not int or value["rank"] != rank:
        raise UnreadableReport(f"{what}'s entry is not rank {rank}'s")
    status = value.get("status")
    if type(status) is not str or status not in STATUSES:
        raise UnreadableReport(f"{what}'s status is not one a rank ends with")
    return RankOutcome(
        rank,
        status,
        _rank_value(value.get("value"), what) if status == "ok" else None,
        _text(value.get("error"), f"{what}'s error"),
        _text(value.get("output"), f"{what}'s output"),
        _real(value.get("seconds"), f"{what}'s time"),
    )


def read_report(report) -> RanksResult:
    """The ranks' report (plain data from ``spies.run_synced_ranks``, wherever it ran) as the
    :class:`RanksResult` the rules read; raises :class:`UnreadableReport` on anything else.

    When a class is graded the report comes from the learner's kernel, so it is a *claim*: reading it only
    makes sure it has the shape, types and sizes the rules need (junk fails with a message, it never
    crashes the checker); the rules then accept the weights only where they equal the replay this process
    computes itself."""
    if type(report) is not dict:
        raise UnreadableReport(f"it is a {type(report).__name__}, not a dict")
    ranks = report.get("ranks")
    if type(ranks) is not list or len(ranks) != WORLD:
        raise UnreadableReport(f"it does not hold one entry for each of the {WORLD} ranks")
    outcomes = [_outcome(value, rank) for rank, value in enumerate(ranks)]
    method = report.get("method")
    if type(method) is not str or method not in METHODS:
        raise UnreadableReport("it does not say how the ranks were started")
    seconds = _real(report.get("seconds"), "its time")
    if not 0 <= seconds < 1e6:
        raise UnreadableReport("its time is not a duration")
    return RanksResult(outcomes, seconds, method)


def run_the_ranks(synced_train_step, dtype: torch.dtype) -> RanksResult:
    """Run the learner's step on the 2 gloo ranks, started where the learner's function lives (this process
    in a notebook, the sandboxed kernel when graded), and read back what they report."""
    method = start_method()
    report = run_beside_learner(
        synced_train_step,
        run_synced_ranks,
        dtype,
        timeout_s=TASK_TIMEOUT_S,
        start_timeout_s=START_TIMEOUT_S.get(method, 13.0),
        collective_timeout_s=COLLECTIVE_TIMEOUT_S,
        method=method,
    )
    return read_report(report)


def _unreadable_message(why: UnreadableReport) -> str:
    return (
        f"The 2 ranks' report could not be read ({why}): it is not what this check's ranks send. Was lesson "
        "09's course code (amp_lessons.l09_amp_across_processes) changed in this kernel? Restart the kernel, "
        "run your cells again, then this check."
    )


# ---------------------------------------------------------------------------------------------- the check


PEER_TROUBLE = ("closed by peer", "connection reset", "timed out", "timeout", "broken pipe")


def _collective_mismatch(result, problems) -> str | None:
    """Where a rank was when its partner stopped answering (None when nothing points at a collective)."""
    stuck = [
        f"rank {o.rank} was still running when the check stopped it"
        for o in result.outcomes
        if o.status == "timeout"
    ]
    stuck += [
        f"rank {o.rank} was stopped by gloo because the ranks' collectives did not match ({_gloo_words(o)})"
        for o in result.outcomes
        if o.status == "crashed" and "mismatch" in o.output.lower()
    ]
    for rank, problem in problems:
        if any(word in problem.message.lower() for word in PEER_TROUBLE):
            where = problem.message.rsplit("(at ", 1)[-1].rstrip(")") if "(at " in problem.message else ""
            stuck.append(
                f"rank {rank} was left alone in a collective"
                + (
                    f"; it noticed at {where}, but collectives are matched by their order, not their line: "
                    "the one that only some ranks call can come earlier"
                    if where
                    else ""
                )
            )
    return "; ".join(stuck) or None


def _gloo_words(outcome) -> str:
    """What gloo said about the mismatch, in whole sentences, and how the rank ended."""
    line = next((x for x in reversed(outcome.output.splitlines()) if "mismatch" in x.lower()), "")
    said = line.rsplit("] ", 1)[-1].strip()  # after "[enforce fail at .../pair.cc:464] "
    sentences = [part.strip() for part in said.split(". ") if part.strip()]
    words = next((x for x in sentences if "size" in x.lower() or "mismatch" in x.lower()), said)
    return f"gloo: '{words.rstrip('.')}.'; {outcome.error}" if words else outcome.error


def _outcome_problem(result):
    """A failed/not-done CheckResult when the ranks did not both finish normally, else None."""
    problems = [
        (o.rank, o.value["problem"])
        for o in result.outcomes
        if o.status == "ok" and isinstance(o.value, dict) and "problem" in o.value
    ]
    mismatch = _collective_mismatch(result, problems)
    if mismatch:
        return failed(
            f"The ranks did not run the same collectives: {mismatch}. A rank waits in a collective "
            "(all_reduce, broadcast, barrier) until every rank has joined it, so a collective that only some "
            "ranks call (under `if dist.get_rank() == 0`, or for a parameter whose .grad is None on one "
            "rank) hangs or fails. Call the same collectives in the same order on every rank. (The check "
            "stopped both processes.)"
        )
    if problems:
        return next((p for _, p in problems if p.status == NOT_DONE), problems[0][1])
    if result.ok:
        return None
    if any(o.status == "not started" for o in result.outcomes):
        return failed(
            f"The 2 processes did not start in time ({result.describe().replace(chr(10), '; ')}): each one "
            "joins a gloo group (and, where it is spawned, imports torch) first. This machine is busy or "
            "slow; nothing is wrong with your function yet. Run the check again."
        )
    errors = [
        o.error.strip().splitlines()[-1] for o in result.outcomes if o.status == "error" and o.error.strip()
    ]
    if any("avg" in e.lower() for e in errors):
        return failed(
            f"ReduceOp.AVG failed on the gloo backend of this torch ({errors[0]}). Use "
            "ReduceOp.SUM and divide by dist.get_world_size(): it works on every backend."
        )
    said = [
        o.output.strip().splitlines()[-1] for o in result.outcomes if o.status != "ok" and o.output.strip()
    ]
    return failed(
        f"A rank failed before it could report ({result.describe().replace(chr(10), '; ')})"
        + (f"; its last output: {said[0][:300]}" if said else "")
        + ". If nothing in your function explains it, please report this message."
    )


def _seen(result, dtype) -> Seen | str:
    records = [o.value["records"] for o in result.outcomes]
    returned = [[r["returned"] for r in rank] for rank in records]
    junk = next((value for rank in returned for value in rank if isinstance(value, str)), None)
    if junk is not None:
        return junk
    return Seen(
        params=[[r["params"] for r in rank] for rank in records],
        scales=[[r["scale"] for r in rank] for rank in records],
        returned=returned,
        dtype=dtype,
    )


def _details(seen: Seen) -> list:
    lines = []
    for step, max_norm in enumerate(PLAN):
        what = "spike on rank 1" if step == SPIKE_STEP else (f"clip at {max_norm}" if max_norm else "plain")
        ranks = "; ".join(
            f"rank {r}: {'skipped' if seen.skipped(r, step) else 'stepped'}, "
            f"scale {scale_text(seen.scales[r][step])}"
            for r in range(WORLD)
        )
        lines.append(f"step {step} ({what}): {ranks}")
    return lines


def _first_wrong_scale(seen: Seen):
    """(rank, step) where the loss scale differs from the scale of a correct step, else None."""
    right = seen.replay("mean")["scale"]
    return next(
        ((r, s) for s in range(len(PLAN)) for r in range(WORLD) if seen.scales[r][s] != right[r][s]), None
    )


def _wrong_scale_message(seen: Seen) -> str:
    rank, step = _first_wrong_scale(seen)
    right = seen.replay("mean")["scale"][rank][step]
    return (
        f"The weights and the returned losses are right, but after step {step} rank {rank}'s loss scale is "
        f"{scale_text(seen.scales[rank][step])} instead of {scale_text(right)}. Let the GradScaler manage it: "
        "call scaler.update() once per step, after scaler.step(optimizer), with no new_scale, on every rank "
        "(it backs off after a skipped step and grows after growth_interval good ones)."
    )


@checker("09.1 synced AMP step")
def check_synced_train_step(synced_train_step):
    """Run the learner's step on 2 gloo processes for 6 steps; compare with the right and wrong replays."""
    dtype = _dtype()
    replay("mean", dtype)  # needed anyway; in a notebook the forked ranks also inherit what it set up
    try:
        result = run_the_ranks(synced_train_step, dtype)
    except UnreadableReport as why:
        return failed(_unreadable_message(why))
    problem = _outcome_problem(result)
    if problem is not None:
        return problem
    seen = _seen(result, dtype)
    if isinstance(seen, str):
        return failed(seen)
    for rules in (RANK_RULES, TRAJECTORY_RULES, LOSS_RULES):
        mistake = first_mistake(rules, seen)
        if mistake is not None:
            return failed(mistake.text(seen), _details(seen))
    right = seen.replay("mean")["mean"]
    wrong_loss = next(
        (
            (r, s)
            for r in range(WORLD)
            for s in range(len(PLAN))
            if s != SPIKE_STEP and not _loss_close(seen.returned[r][s], right[s])
        ),
        None,
    )
    if wrong_loss is not None:
        rank, step = wrong_loss
        return failed(
            f"The weights are right on both ranks, but at step {step} rank {rank} returned "
            f"{seen.returned[rank][step]:.6g} instead of the batch loss {right[step]:.6g} (the "
            "mean of the ranks' losses, the same number on every rank).",
            _details(seen),
        )
    if _first_wrong_scale(seen) is not None:
        return failed(_wrong_scale_message(seen), _details(seen))
    return passed(
        f"Both ranks stayed identical for {len(PLAN)} {dtype_name(dtype)} steps on 2 gloo processes, equal "
        f"to averaging the gradients before the scaler looks at them: at step {SPIKE_STEP}, where only rank "
        f"{SPIKE_RANK}'s scaled loss overflowed, both ranks skipped and backed off together; the clipping "
        f"steps used the norm of the batch gradient; every rank returned the batch loss. (Ranks ran with "
        f"{result.method} in {result.seconds:.1f} s.)",
        _details(seen),
    )


__all__ = ["check_synced_train_step", "rank_task", "read_report", "replay", "run_the_ranks", "spiked_loss"]
