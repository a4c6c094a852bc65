"""05.2 graded through the real judge and sandbox: its facts come from a trace the judge replays itself.

One grading run (``python -m amp_lessons grade``, two at a time) of lesson 05's graded cells: the solution, the
untouched exercise, two right answers written unlike the solution, and two forgeries that patch the check's
name, the harness and the trace in the kernel. One silences the trace recorder and answers with an all-float32
forward cast to half at the end; the other replaces the kernel's tracing helper with one that sends the real
trace of a float32 forward, every op claimed to have run under float16 autocast and every recorded result cast
to float16. Both must score 0: the judge replays every op on its own ``x`` and parameters.
"""

from __future__ import annotations

import pytest
from graded_cells import grade_submissions, graded_cells

LESSON = "05_nan_debugging.ipynb"
CHECK_CELL = "check_texture_forward"

FORGERY_HEAD = """import torch
import amp_lessons.checks as checks
import amp_lessons.checks.harness as h
checks.check_texture_forward = lambda fn: h.passed("forged")
h.failed = h.not_done = lambda *a, **k: h.passed("forged")
"""
FLOAT32_FORWARD = """
def float32_forward(model, x):
    with torch.autocast(x.device.type, enabled=False):
        h = model.features(x.float())
        gram = h.transpose(1, 2) @ h / h.shape[1]
        return model.head(gram.flatten(1))
"""
CELLS = {
    "silenced_recorder": FORGERY_HEAD
    + """import amp_lessons.l05_nan_debugging.trace as trace
trace.OpTrace.__torch_function__ = lambda self, func, types, args=(), kwargs=None: func(*args, **(kwargs or {}))
"""
    + FLOAT32_FORWARD
    + """
def texture_forward(model, x):
    return float32_forward(model, x).half()""",
    "fabricated_trace": FORGERY_HEAD
    + """import amp_lessons.l05_nan_debugging.spies as spies
real_trace = spies.trace_texture_forward
"""
    + FLOAT32_FORWARD
    + """
def forged_trace(fn, model, x, *, autocast, gpu=False):
    report = real_trace(float32_forward, model, x, autocast=False)
    for op in report["trace"]["ops"]:  # claim float16 autocast, and float16 results, everywhere
        op["autocast"] = [True, "float16"]
        op["outputs"] = [[ref, value.half()] for ref, value in op["outputs"]]
    report["autocast_after"] = autocast or gpu
    report["result"]["value"] = report["result"]["value"].half()
    return report
spies.trace_texture_forward = forged_trace

def texture_forward(model, x):
    return float32_forward(model, x).half()""",
    # a trace that asks the judge to build a 20 GB tensor: the judge runs under the kernel's memory cap too
    "huge_op": """import torch
import amp_lessons.l05_nan_debugging.spies as spies
real_trace = spies.trace_texture_forward
def huge_trace(fn, model, x, *, autocast, gpu=False):
    report = real_trace(fn, model, x, autocast=autocast, gpu=gpu)
    huge = dict(report["trace"]["ops"][0], fn=["torch", "ones"], args={"list": [{"int": 5 * 10**9}]})
    huge.update(kwargs={"dict": []}, result={"tensor": 10**6}, outputs=[], inputs=[], mutated=[])
    report["trace"]["ops"].insert(0, huge)
    return report
spies.trace_texture_forward = huge_trace

def texture_forward(model, x):
    h = model.features(x)
    with torch.autocast(x.device.type, enabled=False):
        gram = h.float().transpose(1, 2) @ h.float() / h.shape[1]
    return model.head(gram.flatten(1))
""",
    "broken_helper": """import amp_lessons.l05_nan_debugging.spies as spies
spies.trace_texture_forward = lambda *args, **kwargs: {}["trace"]
""",
    "right_einsum_in_place": """import torch

def texture_forward(model, x):
    h = model.features(x)
    with torch.amp.autocast(device_type=x.device.type, enabled=False):
        gram = torch.einsum("btc,btd->bcd", h.float(), h.float())
        gram /= h.shape[1]
    return model.head(gram.flatten(1))""",
    "right_bmm_to_float32": """import torch

def texture_forward(model, x):
    h = model.features(x)
    with torch.autocast(x.device.type, enabled=False):
        h32 = h.to(torch.float32)
        gram = torch.bmm(h32.mT, h32)
    return model.head(gram.div(h.size(1)).reshape(x.shape[0], -1))""",
}


@pytest.fixture(scope="module")
def texture_rows(tmp_path_factory):
    notebooks = {
        "solution": graded_cells(f"solutions/{LESSON}"),
        "exercise": graded_cells(f"exercises/{LESSON}"),
        **{
            name: graded_cells(f"exercises/{LESSON}", cell, before=CHECK_CELL) for name, cell in CELLS.items()
        },
        # as the attack suite used to place it: before 05.1's check, so 05.2's stub (a later cell) is what is called
        "patched_stub": graded_cells(f"exercises/{LESSON}", CELLS["silenced_recorder"]),
    }
    return grade_submissions(tmp_path_factory.mktemp("graded_05_2"), LESSON, notebooks, "05.2")


def test_the_solution_and_right_answers_unlike_it_pass_when_graded(texture_rows):
    for name in ("solution", "right_einsum_in_place", "right_bmm_to_float32"):
        assert texture_rows[name]["status"] == "passed", texture_rows[name]


def test_the_untouched_exercise_is_not_done_when_graded(texture_rows):
    assert texture_rows["exercise"]["status"] == "not done", texture_rows["exercise"]


@pytest.mark.parametrize("forgery", ["silenced_recorder", "fabricated_trace"])
def test_forging_05_2_in_the_kernel_scores_nothing(texture_rows, forgery):
    row = texture_rows[forgery]
    assert row["status"] == "failed" and row["passed"] == "False", row
    assert "forged" not in row["message"]
    assert "could not follow" in row["message"], row["message"]


def test_a_stub_called_under_a_patched_harness_is_reported_in_the_checks_own_words(texture_rows):
    row = texture_rows["patched_stub"]
    assert row["status"] == "failed" and "forged" not in row["message"], row


def test_a_trace_cannot_make_the_judge_exhaust_memory(texture_rows):
    """A right forward's trace plus one op that needs 20 GB: the judge's memory cap makes that op fail, and
    the learner is told, instead of the grading machine running out of memory."""
    row = texture_rows["huge_op"]
    assert row["status"] == "failed" and "op 1 (torch.ones) raised" in row["message"], row["message"]


def test_course_code_broken_in_the_kernel_is_the_learners_failure_not_a_checker_error(texture_rows):
    row = texture_rows["broken_helper"]
    assert row["status"] == "failed" and "raised KeyError" in row["message"], row["message"]
    assert "Did a cell of your notebook change the course's code?" in row["message"]
