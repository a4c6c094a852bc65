"""06.1 judges a report, not a file it watched itself: a report changed anywhere a correct atomic save could not
have made it does not pass.

When a class is graded, ``spies.save_under_faults`` runs in the learner's kernel and whatever it returns is a
claim. These tests take the report the solution really produces and change one thing in it (what the
learner's process could send instead), then let the checker judge it: each change is caught, by the rule a
real save with that effect would meet or as an unreadable report; none passes.
"""

from __future__ import annotations

import io
import os
import random
import shutil

import pytest
import torch
from notebook_code import solution

from amp_lessons.l06_checkpoint_and_rollback import check as l06
from amp_lessons.l06_checkpoint_and_rollback import spies

LESSON = "06_checkpoint_and_rollback.ipynb"
SOLUTION = solution(LESSON, "save_checkpoint")


def _as_tensor(data: bytes) -> torch.Tensor:
    return torch.frombuffer(bytearray(data), dtype=torch.uint8)


def _bytes_of(payload) -> bytes:
    buffer = io.BytesIO()
    torch.save(payload, buffer)
    return buffer.getvalue()


def judged_with(monkeypatch, change):
    """The solution's real report, passed through ``change(report)`` before the checker reads it."""

    def changed_report(*args, **kwargs):
        report = spies.save_under_faults(*args, **kwargs)
        change(report)
        return report

    monkeypatch.setattr(l06, "save_under_faults", changed_report)
    return l06.check_save_checkpoint(SOLUTION)


def _checkpoint(report, trial=0, where="after"):
    return bytes(report["trials"][trial][where][spies.CHECKPOINT_NAME].numpy().tobytes())


def _set_checkpoint_everywhere(report, data: bytes):
    """The same bytes in every listing that holds the checkpoint: a consistent report of another file."""
    for index, trial in enumerate(report["trials"]):
        for where in ("before", "after"):
            if index == 0 and where == "before":
                continue
            trial[where][spies.CHECKPOINT_NAME] = _as_tensor(data)


def _payload_with(report, **changes):
    payload = torch.load(io.BytesIO(_checkpoint(report)), weights_only=True)
    payload.update(changes)
    return payload


def test_the_unchanged_report_passes(monkeypatch):
    assert judged_with(monkeypatch, lambda report: None).passed


def test_a_report_made_twice_is_the_same():
    """Seeded and fed the same state, two runs of the helper report the same checkpoint bytes."""
    model, optimizer, scaler = l06._fresh(0)
    reports = [
        spies.save_under_faults(SOLUTION, model, optimizer, scaler, l06._config(), dict(l06.SENTINELS), 7)
        for _ in range(2)
    ]
    assert _checkpoint(reports[0]) == _checkpoint(reports[1])
    assert [t["name"] for t in reports[0]["trials"]] == list(spies.TRIALS)


def _previous_overwritten(report):
    report["trials"][1]["after"][spies.CHECKPOINT_NAME] = _as_tensor(b"PK half a file")


def _sentinel_missing(report):
    del report["trials"][0]["before"]["notes.txt"]


def _chain_broken(report):
    report["trials"][1]["before"][spies.CHECKPOINT_NAME] = _as_tensor(b"another file")


def _zero_weights(report):
    payload = _payload_with(report)
    payload["model"] = {k: torch.zeros_like(v) for k, v in payload["model"].items()}
    _set_checkpoint_everywhere(report, _bytes_of(payload))


def _other_python_rng(report):
    random.seed(12345)
    version, internal, gauss = random.getstate()
    payload = _payload_with(report)
    payload["rng"] = dict(payload["rng"], python=[version, list(internal), gauss])
    _set_checkpoint_everywhere(report, _bytes_of(payload))


def _whole_object(report):
    unsafe = {"optimizer": torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1)}
    _set_checkpoint_everywhere(report, _bytes_of(unsafe))


def _a_trial_left_out(report):
    report["trials"].pop()


def _outcome_made_up(report):
    report["trials"][1]["outcome"] = "fine"


def _bytes_as_text(report):
    report["trials"][0]["after"]["notes.txt"] = "learner notes: do not touch\n"


def _problem_claiming_a_pass(report):
    report["trials"][0]["problem"] = {"status": "passed", "message": "all good"}
    del report["trials"][1:]


def _crash_hid(report):
    report["trials"][2]["outcome"] = "returned"


def _stray_file_after_the_fault(report):
    report["trials"][1]["after"]["run.ckpt.tmp"] = _as_tensor(b"half")
    report["trials"][2]["before"]["run.ckpt.tmp"] = _as_tensor(b"half")


def _a_note_changed_by_the_fault(report):
    report["trials"][2]["after"]["notes.txt"] = _as_tensor(b"changed")


def _moves_left_out(report):
    report["trials"][0]["moves"], report["trials"][0]["movers"] = [], []


@pytest.mark.parametrize(
    "change, words",
    [
        (_previous_overwritten, "the previous checkpoint at `path` was overwritten"),
        (_sentinel_missing, "could not read the report"),
        (_chain_broken, "could not read the report"),
        (_zero_weights, "does not hold the model's weights"),
        (_other_python_rng, "does not hold Python's RNG state"),
        (_whole_object, "torch.load(path, weights_only=True) refuses your checkpoint"),
        (_a_trial_left_out, "could not read the report"),
        (_outcome_made_up, "could not read the report"),
        (_bytes_as_text, "could not read the report"),
        (_problem_claiming_a_pass, "all good"),
        (_crash_hid, "hid a failed rename"),
        (_stray_file_after_the_fault, "left ['run.ckpt.tmp'] behind"),
        (_a_note_changed_by_the_fault, "modified ['notes.txt']"),
        (_moves_left_out, "did not arrive at `path` through os.replace"),
    ],
    ids=lambda value: getattr(value, "__name__", "")[1:] or None,
)
def test_a_changed_report_does_not_pass(monkeypatch, change, words):
    result = judged_with(monkeypatch, change)
    assert not result.passed and result.status == "failed", result.message
    assert words in result.message, result.message


def test_a_judged_save_leaves_the_given_objects_out_of_the_expected_content(monkeypatch):
    """What the file must hold is copied before the save runs: a save that changes the model it is given
    (or a graded run that sends other weights back for it) does not move the expectation."""

    def save_then_zero_the_model(path, model, optimizer, scaler, step, config):
        SOLUTION(path, model, optimizer, scaler, step, config)
        with torch.no_grad():
            for parameter in model.parameters():
                parameter.zero_()

    assert l06.check_save_checkpoint(save_then_zero_the_model).passed

    def zero_the_model_then_save(path, model, optimizer, scaler, step, config):
        with torch.no_grad():
            for parameter in model.parameters():
                parameter.zero_()
        SOLUTION(path, model, optimizer, scaler, step, config)

    result = l06.check_save_checkpoint(zero_the_model_then_save)
    assert "does not hold the model's weights" in result.message, result.message


def save_through_system_tmp_and_shutil_move(path, model, optimizer, scaler, step, config):
    """A class's mistake: the temporary file in /tmp, then shutil.move (a copy across file systems)."""
    import tempfile

    descriptor, temporary = tempfile.mkstemp(suffix=".pt")
    os.close(descriptor)
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": step}, temporary)
    shutil.move(temporary, path)


def test_a_temporary_file_in_system_tmp_moved_by_shutil_is_named():
    result = l06.check_save_checkpoint(save_through_system_tmp_and_shutil_move)
    assert result.status == "failed" and "not next to the checkpoint" in result.message, result.message
