"""Check 09.1 graded through the real judge and sandbox (``python -m amp_lessons grade``), in one grading run.

The two gloo ranks are started in the learner's sandboxed kernel (``spies.run_synced_ranks``) and the
checker judges their report in the judge: the solution passes, the untouched exercise is "not done", a
correct step written unlike the reference passes, and a notebook that patches the harness and the check
name in its kernel, or the ranks' own report, scores nothing with a wrong step.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from amp_lessons.tools import cli

COURSE = Path(__file__).resolve().parents[2]
LESSON = "09_amp_across_processes.ipynb"

# Patch everything the kernel can reach, then answer with a step that never all-reduces.
FORGED = """import torch
import amp_lessons.checks as checks
import amp_lessons.checks.harness as h
checks.check_synced_train_step = lambda fn: h.passed("forged")
h.failed = h.not_done = lambda *a, **k: h.passed("forged")
h.CheckResult.__bool__ = lambda self: True
def synced_train_step(model, optimizer, scaler, loss_fn, inputs, targets, *, dtype, max_norm):
    optimizer.zero_grad()
    with torch.autocast(inputs.device.type, dtype=dtype):
        loss = loss_fn(model(inputs), targets)
    scaler.scale(loss).backward()  # no all-reduce: each rank trains on its own slice
    if max_norm is not None:
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    scaler.step(optimizer)
    scaler.update()
    return loss.detach()"""

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


def graded_cells_with(cell_source: str) -> dict:
    """The untouched exercise cut to its graded cells, with ``cell_source`` in a cell before the check."""
    nb = json.loads((COURSE / "exercises" / LESSON).read_text(encoding="utf-8"))
    nb["cells"] = [c for c in nb["cells"] if "nbgrader" in c.get("metadata", {})]
    first = next(i for i, c in enumerate(nb["cells"]) if c["metadata"]["nbgrader"].get("grade"))
    cell = {
        "cell_type": "code",
        "execution_count": None,
        "metadata": {},
        "outputs": [],
        "source": cell_source,
    }
    nb["cells"].insert(first, cell)
    return nb


@pytest.fixture(scope="module")
def rows(tmp_path_factory):
    base = tmp_path_factory.mktemp("l09_graded")
    learners = {
        "solution": json.loads((COURSE / "solutions" / LESSON).read_text(encoding="utf-8")),
        "untouched": json.loads((COURSE / "exercises" / LESSON).read_text(encoding="utf-8")),
        "forged": graded_cells_with(FORGED),
        "forged_report": graded_cells_with(FORGED_REPORT),
        "unlike_reference": graded_cells_with(UNLIKE_REFERENCE),
    }
    for learner, nb in learners.items():
        (base / "submissions" / learner).mkdir(parents=True)
        (base / "submissions" / learner / LESSON).write_text(json.dumps(nb, indent=1), encoding="utf-8")
    grades = base / "grades.csv"
    patch = pytest.MonkeyPatch()
    patch.chdir(base)
    try:
        cli.main(["grade", "submissions", "--timeout", "60", "--jobs", "2", "--csv", str(grades)])
    finally:
        patch.undo()
    with open(grades, newline="", encoding="utf-8") as handle:
        return {Path(r["learner_file"]).parent.name: r for r in csv.DictReader(handle)}


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
