"""Lesson 06's saves under watch: what runs *beside the learner's* ``save_checkpoint``, where that code runs.

06.1 tests atomicity by what happens to the files: the learner's save runs in a scratch folder while its file
calls are recorded (``torch.save`` targets, renames, removes), then again while ``torch.save`` fails halfway
(a full disk), then while the process "dies" right before the final rename. Recorders and faults must be
switched on in the process where the learner's function lives. When a class is graded that is a sandboxed
kernel, which cannot import checkers (``check.py`` holds the rules and the expected content), so this module
does only the watching: :func:`save_under_faults` makes the folder, calls the save three times and reports
what it saw as plain data (file names and bytes, recorded calls, how each call ended). It judges nothing and
knows no expected value: the checker turns the report into its ``SaveSeen`` records, applies its rules, and
loads the reported checkpoint bytes itself to compare them with the state it handed over.

In a notebook (self-study) the checker calls :func:`save_under_faults` directly: the same report, the same
rules, the same messages.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile

import torch

from amp_lessons.checks.harness import (
    NOT_DONE,
    CheckTimeout,
    LearnerProblem,
    call_learner,
    describe_exception,
    not_done,
)
from amp_lessons.core.environment import seed_everything
from amp_lessons.l06_checkpoint_and_rollback.checkpoint import (
    SimulatedCrash,
    SimulatedDiskFull,
    preserved_rng,
    recorded_file_calls,
    simulated_crash_before_move,
    simulated_failed_write,
)

CHECKPOINT_NAME = "run.ckpt"

# The three calls, in this order: a save that works, a save whose torch.save fails halfway (disk full), a save
# stopped right before its final rename. The checker reads the report's trials by these names.
TRIALS = ("save", "failed write", "crash before rename")


@contextlib.contextmanager
def scratch_folder(files: dict):
    """A fresh folder holding ``files`` (name -> bytes), and an empty current directory; both go afterwards.

    The learner's own files are never touched, and a function that ignores ``path`` is caught writing into
    the current directory instead.
    """
    folder = tempfile.mkdtemp(prefix="amp_lessons_check06_")
    elsewhere = tempfile.mkdtemp(prefix="amp_lessons_check06_cwd_")
    previous = os.getcwd()
    for name, data in files.items():
        with open(os.path.join(folder, name), "wb") as handle:
            handle.write(data)
    try:
        os.chdir(elsewhere)
        yield folder, elsewhere
    finally:
        os.chdir(previous)
        shutil.rmtree(folder, ignore_errors=True)
        shutil.rmtree(elsewhere, ignore_errors=True)


def listing(folder: str) -> dict:
    """Every entry of ``folder``: name -> its bytes (None for a folder); empty when ``folder`` is gone."""
    out = {}
    if not os.path.isdir(folder):
        return out
    for name in sorted(os.listdir(folder)):
        full = os.path.join(folder, name)
        if os.path.isfile(full):
            with open(full, "rb") as handle:
                out[name] = handle.read()
        else:
            out[name] = None
    return out


def _as_data(files: dict) -> dict:
    """A listing as plain data for the trip back: each file's bytes as a one-dimensional uint8 tensor."""
    return {name: None if data is None else _bytes_as_tensor(data) for name, data in files.items()}


def _bytes_as_tensor(data: bytes) -> torch.Tensor:
    if not data:
        return torch.zeros(0, dtype=torch.uint8)
    return torch.frombuffer(bytearray(data), dtype=torch.uint8)


def _ending(run, error_type) -> dict:
    """Run ``run()`` (one call of the learner's save under a fault): how it ended, as ``SaveSeen`` reads it.

    ``"raised"`` the fault's own error (also when it is the cause or context of another error), ``"returned"``
    normally, or ``"other"`` with the error described. NotImplementedError and a stopped check are not endings
    of the save: they stop the check.
    """
    try:
        run()
    except NotImplementedError:
        raise
    except (KeyboardInterrupt, SystemExit, CheckTimeout):
        raise
    except BaseException as exc:
        seen, link = set(), exc
        while link is not None and id(link) not in seen:
            if isinstance(link, error_type):
                return {"outcome": "raised", "error": ""}
            seen.add(id(link))
            link = link.__cause__ or link.__context__
        return {"outcome": "other", "error": describe_exception(exc)}
    return {"outcome": "returned", "error": ""}


def _trial(save_checkpoint, name, folder, cwd, arguments, seed) -> dict:
    """One call of the learner's save, under the recorder and (after the first) under its fault."""
    before = listing(folder)
    ending = {"outcome": "", "error": ""}
    problem = None
    with recorded_file_calls() as calls:
        try:
            if name == "save":
                seed_everything(seed)  # the RNG state the file must hold, known to the checker
                call_learner(save_checkpoint, *arguments)
            else:
                fault, error_type = {
                    "failed write": (simulated_failed_write, SimulatedDiskFull),
                    "crash before rename": (simulated_crash_before_move, SimulatedCrash),
                }[name]

                def run():
                    with fault():
                        save_checkpoint(*arguments)

                ending = _ending(run, error_type)
        except NotImplementedError:
            problem = {"status": NOT_DONE, "message": not_done("`save_checkpoint`").message}
        except LearnerProblem as stopped:
            problem = {"status": stopped.result.status, "message": stopped.result.message}
    return {
        "name": name,
        "before": _as_data(before),
        "after": _as_data(listing(folder)),
        "in_cwd": sorted(os.listdir(cwd)) if os.path.isdir(cwd) else [],
        "saves": list(calls.saves),
        "moves": [list(move) for move in calls.moves],
        "movers": list(calls.movers),
        "removes": list(calls.removes),
        "problem": problem,
        **ending,
    }


def save_under_faults(
    save_checkpoint, model, optimizer, scaler, config: dict, files: dict, seed: int
) -> dict:
    """Call the learner's ``save_checkpoint`` three times in a scratch folder holding ``files`` and report it.

    1. ``save_checkpoint(path, model, optimizer, scaler, 3, config)`` with every random generator seeded with
       ``seed`` just before (so the checker knows the RNG state the file must hold);
    2. the same with step 4 while ``torch.save`` writes half its bytes and fails like a full disk;
    3. the same while every rename fails before doing anything, as if the process died there.

    Returns ``{"folder", "path", "trials"}``; each trial holds the folder before and after the call (file
    bytes as uint8 tensors), what appeared in the current directory, the recorded ``torch.save`` targets,
    moves (and which function made each), removes, how the call ended and, when the learner's code stopped
    the check (not done, an error, a wrong signature), that ``problem``. The trials stop at the first problem.
    The random generators and the current directory come back as they were.
    """
    with preserved_rng(), scratch_folder(files) as (folder, cwd):
        path = os.path.join(folder, CHECKPOINT_NAME)
        trials = []
        for name, step in zip(TRIALS, (3, 4, 4)):
            arguments = (path, model, optimizer, scaler, step, dict(config))
            trial = _trial(save_checkpoint, name, folder, cwd, arguments, seed)
            trials.append(trial)
            if trial["problem"] is not None:
                break
        return {"folder": folder, "path": path, "trials": trials}


__all__ = ["CHECKPOINT_NAME", "TRIALS", "listing", "save_under_faults", "scratch_folder"]
