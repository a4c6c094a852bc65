"""Check 06.1 graded through the real judge and sandbox (``python -m amp_lessons grade``), in one grading run.

The saves run in the learner's sandboxed kernel under the recorder and the injected faults
(``spies.save_under_faults``); the checker judges their report in the judge, and loads the checkpoint's bytes
there: the solution passes, the untouched exercise is "not done", a correct atomic save written unlike the
reference passes, and a notebook that patches the harness, the check name and the spies in its kernel (faults
silenced, the recorder claiming a temporary file and an os.replace) scores nothing with a save straight into
`path`; neither does one that replaces the whole report.
"""

from __future__ import annotations

import pytest
from graded_cells import grade_submissions, graded_cells

LESSON = "06_checkpoint_and_rollback.ipynb"
CHECK = "06.1 save_checkpoint: atomic, complete file"

PAYLOAD = """
def _payload(model, optimizer, scaler, step, config):
    import random
    import numpy as np
    import torch
    version, internal, gauss = random.getstate()
    return {"step": step, "config": dict(config), "model": model.state_dict(),
            "optimizer": optimizer.state_dict(), "scaler": scaler.state_dict(),
            "rng": {"python": [version, list(internal), gauss], "numpy": np.random.get_state()[1].tolist(),
                    "torch": torch.get_rng_state()}}
"""

# Patch everything the kernel can reach: the check's name, the harness, the faults (silenced) and the recorder
# (it claims a temporary file moved by os.replace); then save straight into `path`.
FORGED = (
    """import contextlib
import os
import amp_lessons.checks as checks
import amp_lessons.checks.harness as h
import amp_lessons.l06_checkpoint_and_rollback.checkpoint as checkpoint
import amp_lessons.l06_checkpoint_and_rollback.spies as spies
checks.check_save_checkpoint = lambda fn: h.passed("forged")
h.failed = h.not_done = lambda *a, **k: h.passed("forged")
h.CheckResult.__bool__ = lambda self: True
@contextlib.contextmanager
def no_fault():
    yield
spies.simulated_failed_write = spies.simulated_crash_before_move = no_fault
checkpoint.simulated_failed_write = checkpoint.simulated_crash_before_move = no_fault
LAST_PATH = []
@contextlib.contextmanager
def atomic_looking_calls():
    calls = checkpoint.FileCalls()
    yield calls
    if LAST_PATH:
        temporary = os.path.join(os.path.dirname(LAST_PATH[0]), "tmp1234")
        calls.saves.append(temporary)
        calls.moves.append((temporary, LAST_PATH[0]))
        calls.movers.append("os.replace")
spies.recorded_file_calls = atomic_looking_calls
"""
    + PAYLOAD
    + """
def save_checkpoint(path, model, optimizer, scaler, step, config):
    import torch
    LAST_PATH[:] = [path]
    torch.save(_payload(model, optimizer, scaler, step, config), path)"""
)

# The same save, and the helper the judge names replaced by one that returns a made-up report.
FORGED_REPORT = (
    FORGED
    + """
spies.save_under_faults = lambda fn, *args, **kwargs: {"folder": "/tmp/x", "path": "/tmp/x/run.ckpt", "trials": []}"""
)

# Right, but not the reference's code: the bytes made in memory, written to a fixed-suffix temporary file,
# flushed and fsynced, then os.replace.
UNLIKE_REFERENCE = (
    PAYLOAD
    + """
def save_checkpoint(path, model, optimizer, scaler, step, config):
    import io
    import os
    import torch
    buffer = io.BytesIO()
    torch.save(_payload(model, optimizer, scaler, step, config), buffer)
    temporary = path + ".tmp"
    try:
        with open(temporary, "wb") as handle:
            handle.write(buffer.getvalue())
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, path)
    except BaseException:
        if os.path.exists(temporary):
            os.remove(temporary)
        raise"""
)


@pytest.fixture(scope="module")
def rows(tmp_path_factory):
    learners = {
        "solution": graded_cells(f"solutions/{LESSON}"),
        "untouched": graded_cells(f"exercises/{LESSON}"),
        "forged": graded_cells(f"exercises/{LESSON}", FORGED),
        "forged_report": graded_cells(f"exercises/{LESSON}", FORGED_REPORT),
        "unlike_reference": graded_cells(f"exercises/{LESSON}", UNLIKE_REFERENCE),
    }
    return grade_submissions(tmp_path_factory.mktemp("l06_graded"), LESSON, learners, CHECK)


def test_the_solution_passes_when_graded(rows):
    assert rows["solution"]["status"] == "passed", rows["solution"]
    assert "Atomic and tidy" in rows["solution"]["message"]


def test_the_untouched_exercise_is_not_done_when_graded(rows):
    assert rows["untouched"]["status"] == "not done", rows["untouched"]


def test_a_correct_save_unlike_the_reference_passes_when_graded(rows):
    assert rows["unlike_reference"]["status"] == "passed", rows["unlike_reference"]


@pytest.mark.parametrize(
    "learner,words",
    [
        ("forged", "the previous checkpoint at `path` was overwritten"),
        ("forged_report", "could not read the report"),
    ],
)
def test_patching_the_kernel_scores_nothing(rows, learner, words):
    found = rows[learner]
    assert found["passed"] == "False" and found["status"] == "failed", found
    assert "forged" not in found["message"] and words in found["message"], found
