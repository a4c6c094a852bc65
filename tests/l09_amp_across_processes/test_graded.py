"""Check 09.1 graded through the real judge and sandbox (``python -m amp_lessons grade``), in one grading run.

The two gloo ranks are started in the learner's sandboxed kernel (``spies.run_synced_ranks``) and the
checker judges their report in the judge: the solution passes, the untouched exercise is "not done", a
correct step written unlike the reference passes, and a notebook that patches the harness and the check
name in its kernel, or the ranks' own report, scores nothing with a wrong step.
"""

from __future__ import annotations

import pytest
from graded_cells import attacks, grade_submissions, graded_cells

LESSON = "09_amp_across_processes.ipynb"

# Patch everything the kernel can reach, then answer with a step that never all-reduces (the attack suites' own).
FORGED = attacks().IN_KERNEL_ONCE[LESSON]

# The same wrong step, and every rank reports rank 0's records (so the ranks seem to agree).
FORGED_REPORT = (
    FORGED
    + """
import torch.distributed as dist
import amp_lessons.l09_amp_across_processes.spies as spies
real_task = spies.rank_task
def agreeing_task(rank, world, fn, dtype):
    shared = [real_task(rank, world, fn, dtype)]
    dist.broadcast_object_list(shared, src=0)
    return shared[0]
spies.rank_task = agreeing_task"""
)

# Right, but not the reference's code: one flat gradient vector, SUM, then a division.
UNLIKE_REFERENCE = """import torch
import torch.distributed as dist
def synced_train_step(model, optimizer, scaler, loss_fn, inputs, targets, *, dtype, max_norm):
    optimizer.zero_grad(set_to_none=True)
    with torch.autocast(device_type=inputs.device.type, dtype=dtype):
        loss = loss_fn(model(inputs), targets)
    scaler.scale(loss).backward()
    params = list(model.parameters())
    flat = torch.cat([p.grad.reshape(-1) for p in params])
    dist.all_reduce(flat, op=dist.ReduceOp.SUM)
    flat = flat / dist.get_world_size()
    for p, g in zip(params, flat.split([p.numel() for p in params])):
        p.grad.copy_(g.view_as(p))
    if max_norm is not None:
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(params, max_norm)
    scaler.step(optimizer)
    scaler.update()
    total = loss.detach().float().clone()
    dist.all_reduce(total)
    return total.item() / dist.get_world_size()"""


@pytest.fixture(scope="module")
def rows(tmp_path_factory):
    learners = {
        "solution": graded_cells(f"solutions/{LESSON}"),
        "untouched": graded_cells(f"exercises/{LESSON}"),
        "forged": graded_cells(f"exercises/{LESSON}", FORGED),
        "forged_report": graded_cells(f"exercises/{LESSON}", FORGED_REPORT),
        "unlike_reference": graded_cells(f"exercises/{LESSON}", UNLIKE_REFERENCE),
    }
    return grade_submissions(tmp_path_factory.mktemp("l09_graded"), LESSON, learners, "09.1")


def test_the_solution_passes_when_graded(rows):
    assert rows["solution"]["status"] == "passed", rows["solution"]
    assert "both ranks skipped" in rows["solution"]["message"]


def test_the_untouched_exercise_is_not_done_when_graded(rows):
    assert rows["untouched"]["status"] == "not done", rows["untouched"]


def test_a_correct_step_unlike_the_reference_passes_when_graded(rows):
    assert rows["unlike_reference"]["status"] == "passed", rows["unlike_reference"]


@pytest.mark.parametrize(
    "learner,words",
    [("forged", "drift apart from the first step"), ("forged_report", "rank 0's gradients only")],
)
def test_patching_the_kernel_scores_nothing(rows, learner, words):
    found = rows[learner]
    assert found["passed"] == "False" and found["status"] == "failed", found
    assert "forged" not in found["message"] and words in found["message"], found
