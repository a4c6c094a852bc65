"""Lesson 06 checkers: the learner's ``save_checkpoint`` / ``load_checkpoint``.

How the checks stay honest:
- everything happens in a fresh temporary folder (``tempfile.mkdtemp``), deleted afterwards, and with the
  current directory switched to another empty temporary folder during learner calls: the learner's own
  files are never touched, and a function that ignores ``path`` is caught writing somewhere else;
- the folder holds a few pre-existing files (notes, an older checkpoint, ``tmp.pt``) that a save must not
  modify or delete;
- atomicity is tested the way it matters: a second save runs while ``torch.save`` fails halfway (it writes
  part of the bytes, then raises "no space left on device"), a third while the process "dies" right before
  the final rename; the previous checkpoint must come out of both intact. Calls to ``torch.save`` and
  ``os.replace``/``os.rename`` are also recorded, to name *how* a write was not atomic (straight into
  ``path``, or a temporary file in another folder);
- 06.1's saves, recorder and faults run beside the learner's function (``spies.save_under_faults``: in this
  process in a notebook, in the learner's sandboxed kernel when a class is graded), which reports the folder
  listings with the files' bytes, the recorded calls and how each call ended. This module judges that report
  and trusts nothing in it that a correct atomic save could not have produced: the folder before the first
  save is its own :data:`SENTINELS`, each later "before" must be the previous "after", the checkpoint's bytes
  are loaded here (``weights_only=True``) and compared by value with copies of the state it handed over and
  the RNG state of the seed it chose, and after each fault ``path`` must hold those very bytes;
- resume is judged bitwise: a loop that draws random numbers from Python (shuffling), NumPy (input noise)
  and torch (dropout) runs 6 steps, saves, runs 6 more; fresh objects with different seeds load the copy of
  the file and run the same 6 steps; parameters and losses must be ``torch.equal``. Each part that did not
  come back (step, config, weights, optimizer state, GradScaler state, each RNG) is named separately;
- the learner's RNG states are put back after the check, so running it does not change their notebook.

What a check saw is judged by tables of small named rules (``amp_lessons.checks.mistakes``), in the order a
mistake would first show: the files a save touched, then how it wrote, then the interrupted save; what a
load brought back, then the resumed steps.
"""

from __future__ import annotations

import contextlib
import copy
import io
import os
import shutil
from dataclasses import dataclass, field, replace

import torch

from amp_lessons.checks.harness import (
    FAILED,
    NOT_DONE,
    CheckResult,
    LearnerProblem,
    as_number,
    call_learner,
    checker,
    describe_exception,
    failed,
    passed,
    run_beside_learner,
    stop,
)
from amp_lessons.checks.mistakes import first_mistake, name_mistake, rule
from amp_lessons.core.environment import seed_everything
from amp_lessons.l06_checkpoint_and_rollback.checkpoint import (
    capture_rng,
    load_error_line,
    preserved_rng,
    recorded_file_calls,
)
from amp_lessons.l06_checkpoint_and_rollback.resume import probe_config, probe_dtype, probe_run, probe_steps
from amp_lessons.l06_checkpoint_and_rollback.spies import (
    CHECKPOINT_NAME,
    TRIALS,
    save_under_faults,
    scratch_folder,
)

STEPS_BEFORE = 6
STEPS_AFTER = 6
SENTINELS = {
    "notes.txt": b"learner notes: do not touch\n",
    "older_run.pt": b"an older checkpoint the learner keeps\n" * 20,
    "tmp.pt": b"a learner file that happens to be called tmp.pt\n",
}


# The run a resume is judged on: amp_lessons.l06_checkpoint_and_rollback.resume's probe run (every step draws from Python's, NumPy's and
# torch's generators; a GradScaler whose scale grows within 6 steps).
_dtype, _config, _fresh, _run = probe_dtype, probe_config, probe_run, probe_steps


# ------------------------------------------------------------------------------------------- scaffolding


def _scratch():
    """A fresh folder holding :data:`SENTINELS` and an empty current directory (``spies.scratch_folder``)."""
    return scratch_folder(SENTINELS)


# ------------------------------------------------------------------------------------------------ 06.1


@dataclass(frozen=True)
class SaveSeen:
    """What one call of the learner's save did: the folder before and after it, what appeared in the current
    directory, the ``torch.save`` targets and ``os.replace``/``os.rename`` moves (absolute paths) it made,
    and, for the save that fails halfway, how it ended: ``"raised"`` the disk-full error, ``"returned"``
    normally, or raised some ``"other"`` error."""

    path: str
    before: dict
    after: dict
    in_cwd: list = field(default_factory=list)
    saves: list = field(default_factory=list)
    moves: list = field(default_factory=list)
    outcome: str = ""
    error: str = ""
    movers: list = field(default_factory=list)  # "os.replace" / "os.rename", one per move
    removes: list = field(default_factory=list)  # paths given to os.remove/os.unlink

    @property
    def name(self) -> str:
        return os.path.basename(self.path)

    @property
    def touched(self) -> list:
        """Files that were in the folder before the save (other than the checkpoint) and changed or went."""
        return [
            n for n, data in self.before.items() if n != self.name and self.after.get(n, b"<gone>") != data
        ]

    @property
    def new_files(self) -> list:
        return sorted(set(self.after) - set(self.before))

    @property
    def arrivals(self) -> list:
        return [(src, dst) for src, dst in self.moves if dst == os.path.abspath(self.path)]

    @property
    def arrived_by(self) -> str:
        """The function that moved the file onto ``path`` last ("os.replace" unless os.rename was seen)."""
        movers = [m for (_, dst), m in zip(self.moves, self.movers) if dst == os.path.abspath(self.path)]
        return movers[-1] if movers else "os.replace"


def _touched_message(s: SaveSeen) -> str:
    touched = s.touched
    gone = [n for n in touched if n not in s.after]
    return (
        f"save_checkpoint {'removed' if gone else 'modified'} "
        f"{touched}, file(s) that were already in the folder"
        + (
            " (a fixed temporary name such as tmp.pt overwrites any file of that name)"
            if "tmp.pt" in touched
            else ""
        )
        + ". A checkpoint save must touch only its own file: give the temporary file a fresh unique name "
        "(tempfile.mkstemp(dir=folder) or NamedTemporaryFile(dir=folder, "
        "delete=False)) and delete nothing else."
    )


def _no_file_message(s: SaveSeen) -> str:
    hint = ""
    if s.new_files:
        hint = f" It created {s.new_files} instead: use the `path` argument as the file name."
    return f"After save_checkpoint(path, ...) there is no file at `path`.{hint}"


def _temporary_folder(s: SaveSeen) -> str:
    return os.path.dirname(s.arrivals[-1][0])


def _wrote_into_the_current_directory_message(s: SaveSeen) -> str:
    return (
        f"save_checkpoint wrote {s.in_cwd} into the current working directory. Write only at `path` (and a "
        "temporary file in the same folder): the current directory holds the learner's own files."
    )


@rule("wrote into the current directory", _wrote_into_the_current_directory_message)
def wrote_into_the_current_directory(s: SaveSeen) -> bool:
    return bool(s.in_cwd)


@rule("touched other files", _touched_message)
def touched_other_files(s: SaveSeen) -> bool:
    return bool(s.touched)


@rule("no file at path", _no_file_message)
def no_file_at_path(s: SaveSeen) -> bool:
    return s.name not in s.after


def _left_a_file_next_to_the_checkpoint_message(s: SaveSeen) -> str:
    return (
        f"save_checkpoint left {sorted(set(s.new_files) - {s.name})} next to the checkpoint. The temporary "
        "file should *become* the checkpoint (os.replace moves it), so nothing else is left behind."
    )


@rule("left a file next to the checkpoint", _left_a_file_next_to_the_checkpoint_message)
def left_a_file_next_to_the_checkpoint(s: SaveSeen) -> bool:
    return bool(set(s.new_files) - {s.name})


@rule(
    "never called torch.save",
    "save_checkpoint never called torch.save. Write the payload with torch.save "
    "(that is what torch.load(weights_only=True) reads back).",
)
def never_called_torch_save(s: SaveSeen) -> bool:
    return not s.saves


@rule(
    "torch.save straight into path",
    "Not atomic: torch.save wrote straight into `path`. If that write is interrupted (disk full, job "
    "killed), the previous checkpoint is already destroyed and only a truncated file is left. Write "
    "to a temporary file in the same folder, then os.replace(temporary, path).",
)
def torch_save_straight_into_path(s: SaveSeen) -> bool:
    return os.path.abspath(s.path) in s.saves


@rule(
    "not moved into place by os.replace",
    "The checkpoint did not arrive at `path` through os.replace (or os.rename). Copying a finished "
    "temporary file onto `path` is not atomic either: a copy can stop halfway. Finish with "
    "os.replace(temporary, path), a single atomic rename.",
)
def not_moved_into_place_by_os_replace(s: SaveSeen) -> bool:
    return not s.arrivals


def _temporary_file_in_another_folder_message(s: SaveSeen) -> str:
    return (
        f"The temporary file was written in {_temporary_folder(s)}, not next to the checkpoint. "
        "os.replace is only atomic within one file system (across file systems it fails or copies): "
        "create the temporary file in os.path.dirname(path)."
    )


@rule("temporary file in another folder", _temporary_file_in_another_folder_message)
def temporary_file_in_another_folder(s: SaveSeen) -> bool:
    """Outside the checkpoint's folder (a folder the save made inside it, e.g. TemporaryDirectory(dir=folder),
    is on the same file system: os.replace from there is atomic too)."""
    folder = os.path.dirname(os.path.abspath(s.path))
    return os.path.commonpath([_temporary_folder(s), folder]) != folder


# The first save: what it did to the files, then how it wrote. Every rule reads ``SaveSeen``.
SAVE_MISTAKES = (
    wrote_into_the_current_directory,
    touched_other_files,
    no_file_at_path,
    left_a_file_next_to_the_checkpoint,
    never_called_torch_save,
    torch_save_straight_into_path,
    not_moved_into_place_by_os_replace,
    temporary_file_in_another_folder,
)


@rule(
    "NumPy objects",
    " NumPy's RNG state (np.random.get_state()) holds a NumPy array: convert it, e.g. "
    "`keys.tolist()` or `torch.from_numpy(keys.astype('int64'))`.",
)
def numpy_objects_in_the_file(detail: str) -> bool:
    return "numpy" in detail.lower()


@rule("a TorchVersion", " torch.__version__ is a TorchVersion object: store str(torch.__version__).")
def a_torch_version_in_the_file(detail: str) -> bool:
    return "TorchVersion" in detail


@rule(
    "whole objects",
    " Save state_dict()s and plain values, not whole objects (the model, optimizer or scaler themselves).",
)
def whole_objects_in_the_file(detail: str) -> bool:
    return "GLOBAL" in detail


# Why torch.load(weights_only=True) refused the file, read from the first line of its error.
WEIGHTS_ONLY_HINTS = (
    numpy_objects_in_the_file,
    a_torch_version_in_the_file,
    whole_objects_in_the_file,
)


def _weights_only_problem(data: bytes):
    """Why torch.load(weights_only=True) refuses the checkpoint's bytes (loaded here, in the checker's own
    process, never with weights_only=False), or None."""
    try:
        torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    except Exception as exc:
        detail = load_error_line(exc)
        hint = name_mistake(WEIGHTS_ONLY_HINTS, detail) or ""
        return failed(
            f"torch.load(path, weights_only=True) refuses your checkpoint ({detail}). Since torch "
            "2.6 that is torch.load's default, and it is the safe way to load: keep the payload to "
            f"dicts, lists, tensors, numbers and strings.{hint}"
        )
    return None


def _raised_another_error_message(s: SaveSeen) -> str:
    return (
        f"When torch.save failed halfway, save_checkpoint raised a different error: {s.error}. Let the "
        "original error propagate (after removing the temporary file)."
    )


@rule("raised another error", _raised_another_error_message)
def raised_another_error(s: SaveSeen) -> bool:
    return s.outcome == "other"


@rule(
    "deleted the previous checkpoint",
    "When torch.save failed halfway, the previous checkpoint at `path` was deleted: a save must not "
    "remove the old file before the new one is complete (os.replace does both at once).",
)
def deleted_the_previous_checkpoint(s: SaveSeen) -> bool:
    return s.name not in s.after


def _overwrote_the_previous_checkpoint_message(s: SaveSeen) -> str:
    return (
        f"Not atomic: when torch.save failed halfway, the previous checkpoint at `path` was overwritten by "
        f"{len(s.after[s.name])} bytes of a half-written file. Write to a temporary file in the same folder, "
        "then os.replace(temporary, path)."
    )


@rule("overwrote the previous checkpoint", _overwrote_the_previous_checkpoint_message)
def overwrote_the_previous_checkpoint(s: SaveSeen) -> bool:
    return s.after[s.name] != s.before[s.name]


def _left_the_temporary_file_message(s: SaveSeen) -> str:
    return (
        f"When torch.save failed halfway, save_checkpoint left {s.new_files} behind. Remove the temporary "
        "file when the write fails (in `except`/`finally`), then re-raise the error."
    )


@rule("left the temporary file", _left_the_temporary_file_message)
def left_the_temporary_file(s: SaveSeen) -> bool:
    return bool(s.new_files)


@rule(
    "hid the failed write",
    "save_checkpoint hid a failed write: torch.save raised 'No space left on device' but your "
    "function returned normally. Let the error propagate, so the training loop knows this checkpoint "
    "was not written.",
)
def hid_the_failed_write(s: SaveSeen) -> bool:
    return s.outcome == "returned"


# The save that fails halfway: the previous checkpoint must survive, and the error must reach the caller.
INTERRUPTED_SAVE_MISTAKES = (
    raised_another_error,
    deleted_the_previous_checkpoint,
    overwrote_the_previous_checkpoint,
    left_the_temporary_file,
    hid_the_failed_write,
)


def _removed_the_old_checkpoint_before_the_rename_message(s: SaveSeen) -> str:
    return (
        "A crash between two calls leaves no checkpoint: when the save was stopped right before its final "
        "rename, `path` was already gone, because your save removes the old checkpoint first"
        + (" (os.remove(path))" if os.path.abspath(s.path) in s.removes else "")
        + " and renames the new file into place after. os.replace(temporary, path) swaps the new file in "
        "with one atomic call that overwrites the old one: do not remove `path` yourself."
    )


@rule("removed the old checkpoint before the rename", _removed_the_old_checkpoint_before_the_rename_message)
def removed_the_old_checkpoint_before_the_rename(s: SaveSeen) -> bool:
    return s.name not in s.after


@rule(
    "changed the old checkpoint before the rename",
    "When the save was stopped right before its final rename, the previous checkpoint at `path` had "
    "already been changed. Nothing may touch `path` until the single os.replace(temporary, path) "
    "that puts the finished file there.",
)
def changed_the_old_checkpoint_before_the_rename(s: SaveSeen) -> bool:
    return s.after[s.name] != s.before[s.name]


@rule(
    "hid the failed rename",
    "save_checkpoint hid a failed rename: os.replace was interrupted, but your function returned "
    "normally (a bare `except:` catches even the end of the process). Let the error propagate (after "
    "removing the temporary file), so the loop knows this checkpoint was not written.",
)
def hid_the_failed_rename(s: SaveSeen) -> bool:
    return s.outcome == "returned"


# The save stopped right before its final rename (the process dies there): the old checkpoint must survive.
CRASH_BEFORE_MOVE_MISTAKES = (
    removed_the_old_checkpoint_before_the_rename,
    changed_the_old_checkpoint_before_the_rename,
    hid_the_failed_rename,
)


# ------------------------------------------------------------- 06.1: what the file holds, judged by value

ADAM_RESTARTS = (
    " Without it AdamW restarts its moving averages (exp_avg, exp_avg_sq) and step count from "
    "zero, so the first steps after a resume are different (bias-corrected full-size steps) and "
    "the run diverges."
)


@dataclass(frozen=True)
class ContentSeen:
    """The saved file as torch.load reads it, next to what each part was when the save was called."""

    payload: object
    model: dict
    optimizer: dict
    scaler: dict
    config: dict
    rng: dict

    def holds(self, predicate) -> bool:
        return scan_payload(self.payload, predicate)

    def holds_ints(self, values) -> bool:
        """Some list, tuple or integer tensor in the file holds exactly these integers."""
        wanted = [int(v) for v in values]
        return self.holds(lambda item: _as_ints(item, len(wanted)) == wanted)


def _as_ints(item, length: int):
    """``item`` as a list of ``length`` Python ints (a list/tuple of ints or an integer tensor), else None."""
    if isinstance(item, torch.Tensor):
        if item.is_floating_point() or item.is_complex() or item.numel() != length:
            return None
        return [int(v) for v in item.flatten().tolist()]
    if isinstance(item, (list, tuple)) and len(item) == length and all(type(v) is int for v in item):
        return list(item)
    return None


def _is_config(item, config: dict) -> bool:
    if isinstance(item, str) and item.lstrip().startswith("{"):
        import json

        with contextlib.suppress(ValueError):
            item = json.loads(item)
    return isinstance(item, dict) and item == config


@rule(
    "the model's weights",
    "Your checkpoint does not hold the model's weights: no dict in the file equals model.state_dict() as it "
    "was when save_checkpoint was called. Save `model.state_dict()`, its tensors as they are.",
)
def no_model_weights(c: ContentSeen) -> bool:
    return not c.holds(lambda item: isinstance(item, dict) and same_state(item, c.model))


@rule(
    "the optimizer state",
    "Your checkpoint holds no optimizer state equal to optimizer.state_dict() at save time: save "
    "`optimizer.state_dict()`." + ADAM_RESTARTS,
)
def no_optimizer_state(c: ContentSeen) -> bool:
    return not c.holds(
        lambda item: _has_optimizer_state(item) and same_state(item["state"], c.optimizer["state"])
    )


@rule(
    "the GradScaler state",
    "Your checkpoint holds no GradScaler state equal to scaler.state_dict() at save time (the scale, the "
    "growth tracker). Without it a resumed FP16 run starts again from init_scale: it overflows and skips "
    "steps until the scale has backed off again, and grows on another schedule. Save `scaler.state_dict()`.",
)
def no_scaler_state(c: ContentSeen) -> bool:
    return not c.holds(lambda item: _has_scaler_state(item) and same_state(item, c.scaler))


@rule(
    "the config",
    "Your checkpoint does not hold the run's config (no dict in the file equals the config passed in): save "
    "`dict(config)`, so a resume can tell it continues the same run.",
)
def no_config(c: ContentSeen) -> bool:
    return not c.holds(lambda item: _is_config(item, c.config))


@rule(
    "Python's RNG state",
    "Your checkpoint does not hold Python's RNG state (random.getstate() at save time): a resumed run would "
    "shuffle its data in another order than the uninterrupted one. Save it as plain data, e.g. "
    "`version, internal, gauss = random.getstate()` -> `[version, list(internal), gauss]`.",
)
def no_python_rng(c: ContentSeen) -> bool:
    return not c.holds_ints(c.rng["python"]["internal"].tolist())


@rule(
    "NumPy's RNG state",
    "Your checkpoint does not hold NumPy's RNG state (np.random.get_state() at save time): a resumed run would "
    "draw other augmentation noise. Save its parts as plain data (the keys array as `keys.tolist()`).",
)
def no_numpy_rng(c: ContentSeen) -> bool:
    return not c.holds_ints(c.rng["numpy"]["keys"].tolist())


@rule(
    "torch's RNG state",
    "Your checkpoint does not hold torch's RNG state (torch.get_rng_state() at save time): a resumed run "
    "would draw other dropout masks. Save `torch.get_rng_state()` (and on a GPU "
    "`torch.cuda.get_rng_state_all()`).",
)
def no_torch_rng(c: ContentSeen) -> bool:
    return not c.holds_ints(c.rng["torch"].tolist())


@rule(
    "the CUDA RNG states",
    "Your checkpoint does not hold the CUDA generators' states (torch.cuda.get_rng_state_all() at save "
    "time): on this GPU a resumed run would draw other random numbers. Save them too.",
)
def no_cuda_rng(c: ContentSeen) -> bool:
    return not all(c.holds_ints(state.tolist()) for state in c.rng["cuda"])


# Each part a resume needs, in the order a message names it; every missing part is listed.
CONTENT_MISTAKES = (
    no_model_weights,
    no_optimizer_state,
    no_scaler_state,
    no_config,
    no_python_rng,
    no_numpy_rng,
    no_torch_rng,
    no_cuda_rng,
)


def _content_problem(data: bytes, expected: dict):
    """The first part the saved bytes lack (by value), with every other missing part named; None if complete.

    ``expected`` is what the checker handed over, snapshotted before the save ran (see
    :func:`_what_the_file_must_hold`); the bytes are loaded here with ``weights_only=True``."""
    payload = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    content = ContentSeen(payload, **expected)
    missing = [mistake for mistake in CONTENT_MISTAKES if mistake.matches(content)]
    if not missing:
        return None
    text = missing[0].text(content)
    if len(missing) > 1:
        text += f" Also missing: {', '.join(mistake.name for mistake in missing[1:])}."
    return failed(text)


# The save's RNG seed: spies.save_under_faults seeds every generator with it right before the first save, so the
# checker knows the state the file must hold without asking the learner's process.
SAVE_SEED = 606
SAVE_STEPS = 3

_UNREADABLE = (
    "The check could not read the report of what your save_checkpoint did ({what}). The report is made by the "
    "course's own code next to your function (amp_lessons.l06_checkpoint_and_rollback.spies); something in "
    "your notebook changed it, or the course's modules. Restart the kernel, run your cells without changing "
    "amp_lessons, then run this check again."
)


def _unreadable(what: str):
    stop(_UNREADABLE.format(what=what))


def _text(value, what: str) -> str:
    if type(value) is not str:
        _unreadable(f"{what} is not a text")
    return value


def _texts(value, what: str, none_allowed: bool = False) -> list:
    if type(value) not in (list, tuple):
        _unreadable(f"{what} is not a list")
    return [item if item is None and none_allowed else _text(item, f"an entry of {what}") for item in value]


def _file_bytes(value, what: str):
    """A file of a reported listing: a one-dimensional uint8 tensor back to bytes (None stays a folder)."""
    if value is None:
        return None
    if not isinstance(value, torch.Tensor) or value.dtype != torch.uint8 or value.dim() != 1:
        _unreadable(f"{what} is not a file's bytes")
    return bytes(value.as_subclass(torch.Tensor).detach().cpu().contiguous().numpy().tobytes())


def _files(value, what: str) -> dict:
    if type(value) is not dict:
        _unreadable(f"{what} is not a folder listing")
    return {
        _text(name, f"a name in {what}"): _file_bytes(data, f"{what}[{name!r}]")
        for name, data in value.items()
    }


def _problem(value):
    """The learner's code stopped the check in their process (not done, an error, a wrong signature): the
    same result here. Never a pass: a report can only take points away."""
    if value is None:
        return None
    if type(value) is not dict:
        _unreadable("a problem is not a dict")
    status, message = value.get("status"), _text(value.get("message"), "a problem's message")
    return CheckResult(False, message, NOT_DONE if status == NOT_DONE else FAILED)


def _trials(report) -> tuple:
    """The report's ``(path, trials)``, each trial checked to be made of the data a real report holds."""
    if type(report) is not dict or type(report.get("trials")) not in (list, tuple):
        _unreadable("it is not the dict save_under_faults returns")
    path = _text(report.get("path"), "the checkpoint's path")
    folder = _text(report.get("folder"), "the scratch folder")
    if not os.path.isabs(folder) or path != os.path.join(folder, CHECKPOINT_NAME):
        _unreadable("the checkpoint's path is not run.ckpt in the scratch folder")
    trials = list(report["trials"])
    if not trials or len(trials) > len(TRIALS):
        _unreadable(f"{len(trials)} trials instead of up to {len(TRIALS)}")
    read = []
    for index, trial in enumerate(trials):
        if type(trial) is not dict or trial.get("name") != TRIALS[index]:
            _unreadable(f"trial {index + 1} is not the {TRIALS[index]!r} trial")
        moves = trial.get("moves")
        if type(moves) not in (list, tuple) or not all(
            type(m) in (list, tuple) and len(m) == 2 for m in moves
        ):
            _unreadable("the recorded moves are not (source, destination) pairs")
        entry = {
            "before": _files(trial.get("before"), "the folder before the save"),
            "after": _files(trial.get("after"), "the folder after the save"),
            "in_cwd": _texts(trial.get("in_cwd"), "the current directory"),
            "saves": _texts(trial.get("saves"), "the torch.save targets", none_allowed=True),
            "moves": [tuple(_texts(move, "a move")) for move in moves],
            "movers": _texts(trial.get("movers"), "the movers"),
            "removes": _texts(trial.get("removes"), "the removes", none_allowed=True),
            "outcome": _text(trial.get("outcome"), "the outcome"),
            "error": _text(trial.get("error"), "the error"),
            "problem": _problem(trial.get("problem")),
        }
        if len(entry["movers"]) != len(entry["moves"]):
            _unreadable("one mover per move")
        expected_outcomes = ("",) if index == 0 else ("raised", "returned", "other")
        if entry["problem"] is None and entry["outcome"] not in expected_outcomes:
            _unreadable(f"the {TRIALS[index]!r} trial ended with {entry['outcome']!r}")
        if entry["problem"] is not None and index != len(trials) - 1:
            _unreadable("trials went on after the check was stopped")
        read.append(entry)
    return path, read


def _what_the_file_must_hold(model, optimizer, scaler, config: dict) -> dict:
    """The parts of a complete checkpoint as they are when the save is called (copies: whatever the save does
    to the objects, or whatever a graded run sends back for them, does not move what is expected), and the
    RNG state every generator has right after ``seed_everything(SAVE_SEED)``."""
    with preserved_rng():
        seed_everything(SAVE_SEED)
        rng = capture_rng()
    return {
        "model": _params(model),
        "optimizer": copy.deepcopy(optimizer.state_dict()),
        "scaler": dict(scaler.state_dict()),
        "config": dict(config),
        "rng": rng,
    }


@checker("06.1 save_checkpoint: atomic, complete file")
def check_save_checkpoint(save_checkpoint):
    """``save_checkpoint(path, model, optimizer, scaler, step, config)``: atomic, only its own file.

    The saves run beside the learner's function (``spies.save_under_faults``: in this process in a notebook,
    in the learner's sandboxed kernel when a class is graded); here the report becomes ``SaveSeen`` records
    for the rule tables. The report is a claim of the learner's process, so nothing in it is taken on trust
    that a correct atomic save would not produce: the folder before the first save is the checker's own
    :data:`SENTINELS`, each later "before" must be the previous "after", and the checkpoint's bytes are loaded
    here and compared with the state the checker handed over; after each fault they must be those very bytes.
    """
    with preserved_rng():
        seed_everything(SAVE_SEED)
        model, optimizer, scaler = _fresh(0)
        _run(model, optimizer, scaler, SAVE_STEPS)
        expected = _what_the_file_must_hold(model, optimizer, scaler, _config())
        report = run_beside_learner(
            save_checkpoint,
            save_under_faults,
            model,
            optimizer,
            scaler,
            _config(),
            dict(SENTINELS),
            SAVE_SEED,
        )
    path, trials = _trials(report)
    first = trials[0]
    if first["before"] != SENTINELS:
        _unreadable("the folder did not hold the check's files before the first save")
    if first["problem"] is not None:
        return first["problem"]
    seen = SaveSeen(
        path,
        SENTINELS,
        first["after"],
        first["in_cwd"],
        first["saves"],
        first["moves"],
        movers=first["movers"],
    )
    mistake = first_mistake(SAVE_MISTAKES, seen)
    if mistake:
        return failed(mistake.text(seen))
    saved = seen.after[seen.name]
    if saved is None:
        return failed(
            "After save_checkpoint(path, ...) `path` is a folder, not a file: write the checkpoint file itself "
            "at `path` (a temporary file next to it, then os.replace(temporary, path))."
        )
    problem = _weights_only_problem(saved)
    if problem is not None:
        return problem
    complete = _content_problem(saved, expected)

    # Two failures: torch.save writes part of the bytes, then fails like a full disk; the process dies right
    # before the final rename. The previous checkpoint must come out of both intact.
    previous = seen.after
    for trial, rules in zip(trials[1:], (INTERRUPTED_SAVE_MISTAKES, CRASH_BEFORE_MOVE_MISTAKES)):
        if trial["before"] != previous:
            _unreadable("the folder before a save is not the folder after the one before")
        if trial["problem"] is not None:
            return trial["problem"]
        interrupted = SaveSeen(
            path,
            previous,
            trial["after"],
            trial["in_cwd"],
            outcome=trial["outcome"],
            error=trial["error"],
            removes=trial["removes"],
        )
        mistake = first_mistake(rules, interrupted) or first_mistake(_ANY_SAVE_MISTAKES, interrupted)
        if mistake:
            return failed(mistake.text(interrupted))
        previous = interrupted.after
    if len(trials) != len(TRIALS):
        _unreadable(f"{len(trials)} trials instead of {len(TRIALS)}")
    if complete is not None:
        return complete
    return passed(_save_passed_message(seen.arrived_by))


# Also true of the interrupted saves: the current directory stays empty and the other files stay as they were.
_ANY_SAVE_MISTAKES = (wrote_into_the_current_directory, touched_other_files)


def _save_passed_message(mover: str) -> str:
    """The pass message, naming the call that really moved the file (os.replace, os.rename, or a rename)."""
    how = "the checkpoint arrives by os.replace from a temporary file next to it"
    if mover not in ("os.replace", "os.rename"):  # a function imported by name: the audit event says rename
        how = (
            "the checkpoint arrives by one rename (os.replace or os.rename) from a temporary file next to it"
        )
    elif mover == "os.rename":
        how = (
            "the checkpoint arrives by os.rename (shutil.move and Path.rename call it) from a temporary "
            "file next to it; on Linux and macOS that replaces the old file atomically too, but on "
            "Windows os.rename refuses to overwrite an existing file, so os.replace is the portable call"
        )
    return (
        f"Atomic and tidy: {how}, an interrupted save leaves the previous checkpoint byte for byte intact "
        "and no stray file, nothing else in the folder is touched, and torch.load(weights_only=True) "
        "accepts the file. (The check worked in a temporary folder it has deleted.)"
    )


# ------------------------------------------------------------------------------------------------ 06.2


def _as_step(value):
    """The step the learner returned as an int, or None when it is not a whole number.

    What counts as a number is :func:`~amp_lessons.checks.harness.as_number`'s rule (a one-element tensor,
    a NumPy scalar, an int or a float; not a bool or a string); its message is not used, because
    "step counter lost" says better what went wrong.
    """
    try:
        number = as_number(value, "load_checkpoint returned the step")
    except LearnerProblem:
        return None
    return int(number) if number.is_integer() else None


def _short(value) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _params(model) -> dict:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


# Reading the learner's file and state (06.2).
def scan_payload(payload, predicate) -> bool:
    """Does any dict/list/tuple inside ``payload`` satisfy ``predicate``? (A learner's file can nest its parts
    under any keys: the checker asks "is an optimizer state_dict in there at all", not where.)"""
    stack, seen = [payload], 0
    while stack and seen < 100000:
        item = stack.pop()
        seen += 1
        try:
            if predicate(item):
                return True
        except Exception:
            pass
        if isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, (list, tuple)):
            stack.extend(item)
    return False


def read_any_payload(path):
    """The file as torch.load reads it, safely first and then not (only to see what it holds); None when
    neither works."""
    for weights_only in (True, False):
        try:
            return torch.load(path, map_location="cpu", weights_only=weights_only)
        except Exception:
            continue
    return None


def same_state(a, b) -> bool:
    """Bitwise equality of nested states (tensors by dtype, shape and ``torch.equal``; no tolerance: a resume
    is a continuation only when nothing changed at all)."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return (
            isinstance(a, torch.Tensor)
            and isinstance(b, torch.Tensor)
            and a.shape == b.shape
            and a.dtype == b.dtype
            and torch.equal(a.cpu(), b.cpu())
        )
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same_state(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(same_state(x, y) for x, y in zip(a, b))
    return a == b


RNG_NAMES = {
    "python": "Python's `random` (random.getstate / random.setstate)",
    "numpy": "NumPy's global generator (np.random.get_state / np.random.set_state)",
    "torch": "torch's CPU generator (torch.get_rng_state / torch.set_rng_state)",
    "cuda": "the CUDA generators (torch.cuda.get_rng_state_all / set_rng_state_all)",
}


@dataclass(frozen=True)
class ResumeSeen:
    """A save after 6 steps loaded into fresh objects: what was saved, what came back, what the file holds;
    then (for the second table) the next 6 steps of the uninterrupted and the resumed run."""

    config: dict
    saved: dict  # params, optimizer, scaler, rng at save time
    result: object  # what load_checkpoint returned
    params: dict  # the fresh model's state after the load
    optimizer_state: dict
    scaler: dict
    fresh_scaler: dict
    rng: dict  # capture_rng() right after the load
    payload: object = None  # the file as torch.load reads it (None when it cannot)
    loads: list = field(default_factory=list)  # torch.load keyword arguments of the learner's load
    reference_losses: list = field(default_factory=list)
    resumed_losses: list = field(default_factory=list)
    reference_params: dict = field(default_factory=dict)
    final_params: dict = field(default_factory=dict)
    optimizer_has_the_parameters: bool = True  # after the load, the optimizer holds the model's own tensors

    def in_file(self, predicate) -> bool:
        return self.payload is not None and scan_payload(self.payload, predicate)

    @property
    def lost_generators(self) -> list:
        return [RNG_NAMES[key] for key in RNG_NAMES if not same_state(self.rng[key], self.saved["rng"][key])]

    @property
    def divergence(self):
        """The first resumed step whose loss differs from the uninterrupted run's, or None."""
        pairs = enumerate(zip(self.reference_losses, self.resumed_losses))
        return next((index for index, (a, b) in pairs if not torch.equal(a, b)), None)

    @property
    def weights_only(self) -> list:
        return [kwargs.get("weights_only", "missing") for kwargs in self.loads]


def _has_optimizer_state(item) -> bool:
    return isinstance(item, dict) and "param_groups" in item and "state" in item


def _has_scaler_state(item) -> bool:
    return isinstance(item, dict) and "_growth_tracker" in item


def _optimizer_lost(s: ResumeSeen) -> bool:
    return not same_state(s.optimizer_state, s.saved["optimizer"]["state"])


def _not_the_pair_step_config_message(s: ResumeSeen) -> str:
    return (
        f"load_checkpoint returned {_short(s.result)}; it must return the pair (step, config) so the "
        "loop knows where to continue and with which precision policy."
    )


@rule("not the pair (step, config)", _not_the_pair_step_config_message)
def not_the_pair_step_config(s: ResumeSeen) -> bool:
    return not isinstance(s.result, (tuple, list)) or len(s.result) != 2


@rule(
    "(config, step) in the wrong order",
    "load_checkpoint returned (config, step): the pair is the other way round. Return "
    "(step, config), the order the training loop unpacks (`step, config = load_checkpoint(...)`).",
)
def config_and_step_swapped(s: ResumeSeen) -> bool:
    return isinstance(s.result[0], dict) and _as_step(s.result[1]) == STEPS_BEFORE


def _step_counter_lost_message(s: ResumeSeen) -> str:
    return (
        f"Step counter lost: load_checkpoint returned step {_short(s.result[0])}, but the checkpoint was "
        f"saved after {STEPS_BEFORE} steps. Save `step` in the payload and return it: schedules, logs and "
        "rollback decisions are indexed by it."
    )


@rule("step counter lost", _step_counter_lost_message)
def step_counter_lost(s: ResumeSeen) -> bool:
    return _as_step(s.result[0]) != STEPS_BEFORE


def _config_lost_message(s: ResumeSeen) -> str:
    return (
        f"The config came back as {_short(s.result[1])} instead of {s.config}. Save the config (dtype, FP32 "
        "regions, ...) and return it: it is how a resume tells "
        "a continuation from a change of precision policy."
    )


@rule("config lost", _config_lost_message)
def config_lost(s: ResumeSeen) -> bool:
    return not isinstance(s.result[1], dict) or s.result[1] != s.config


@rule(
    "weights not restored",
    "The model's weights were not restored: after load_checkpoint the fresh model still has its own "
    "parameters. Save model.state_dict() and call model.load_state_dict(...) on the model you are "
    "given (do not build a new one).",
)
def weights_not_restored(s: ResumeSeen) -> bool:
    return not all(same_state(s.params[k], s.saved["params"][k]) for k in s.saved["params"])


@rule(
    "optimizer lost the model's parameters",
    "After load_checkpoint the optimizer no longer holds the model's parameters: the model's "
    "parameter tensors were replaced (load_state_dict(..., assign=True), or new nn.Parameters), "
    "while the optimizer still updates the old ones, so the next step finds no gradients to apply. "
    "Copy the weights into the existing parameters: model.load_state_dict(state), no assign=True.",
)
def optimizer_lost_the_model_parameters(s: ResumeSeen) -> bool:
    return not s.optimizer_has_the_parameters


@rule(
    "optimizer state saved but not restored",
    "Optimizer state not restored: your file contains the optimizer's state_dict, but "
    "load_checkpoint does not call optimizer.load_state_dict(...)." + ADAM_RESTARTS,
)
def optimizer_state_saved_but_not_restored(s: ResumeSeen) -> bool:
    return _optimizer_lost(s) and s.in_file(_has_optimizer_state)


@rule(
    "optimizer state not saved",
    "Optimizer state not saved: the checkpoint has no optimizer.state_dict()." + ADAM_RESTARTS,
)
def optimizer_state_not_saved(s: ResumeSeen) -> bool:
    return _optimizer_lost(s)


def _only_part_of_the_gradscaler_state_message(s: ResumeSeen) -> str:
    return (
        f"Only part of the GradScaler state came back: the scale ({s.saved['scaler']['scale']}) is right but "
        f"the growth tracker is {s.scaler.get('_growth_tracker')} instead of "
        f"{s.saved['scaler']['_growth_tracker']}. Save scaler.state_dict() "
        "whole and load it with scaler.load_state_dict(...)."
    )


@rule("only part of the GradScaler state", _only_part_of_the_gradscaler_state_message)
def only_part_of_the_gradscaler_state(s: ResumeSeen) -> bool:
    return s.scaler != s.saved["scaler"] and s.scaler.get("scale") == s.saved["scaler"]["scale"]


def _gradscaler_state_saved_but_not_restored_message(s: ResumeSeen) -> str:
    return (
        f"GradScaler state saved but not restored: after load_checkpoint the scale is "
        f"{s.scaler.get('scale')} (a fresh scaler's initial value) instead of "
        f"{s.saved['scaler']['scale']}. Call scaler.load_state_dict(...) with the saved state."
    )


@rule("GradScaler state saved but not restored", _gradscaler_state_saved_but_not_restored_message)
def gradscaler_state_saved_but_not_restored(s: ResumeSeen) -> bool:
    return s.scaler != s.saved["scaler"] and s.in_file(_has_scaler_state)


def _gradscaler_state_not_saved_message(s: ResumeSeen) -> str:
    return (
        f"GradScaler state not saved: after load_checkpoint the scale is {s.scaler.get('scale')} "
        f"(fresh: {s.fresh_scaler.get('scale')}) instead of {s.saved['scaler']['scale']}, and the growth "
        "tracker restarted. In a float16 run whose scale had settled lower, the restarted scale overflows "
        "and the next steps are skipped; a higher settled scale is lost the other way. Save "
        "scaler.state_dict() and load it back."
    )


@rule("GradScaler state not saved", _gradscaler_state_not_saved_message)
def gradscaler_state_not_saved(s: ResumeSeen) -> bool:
    return s.scaler != s.saved["scaler"]


def _rng_not_restored_message(s: ResumeSeen) -> str:
    return (
        f"RNG not restored: after load_checkpoint the state of {'; '.join(s.lost_generators)} differs from "
        "the state at save time. The resumed run then draws different random numbers (dropout masks, "
        "shuffling, augmentation) and diverges from the uninterrupted one. Save each generator's state and "
        "set it back on load."
    )


@rule("RNG not restored", _rng_not_restored_message)
def rng_not_restored(s: ResumeSeen) -> bool:
    return bool(s.lost_generators)


# After the load, before any further step: what came back. Every rule reads ``ResumeSeen``.
RESTORE_MISTAKES = (
    not_the_pair_step_config,
    config_and_step_swapped,
    step_counter_lost,
    config_lost,
    weights_not_restored,
    optimizer_lost_the_model_parameters,
    optimizer_state_saved_but_not_restored,
    optimizer_state_not_saved,
    only_part_of_the_gradscaler_state,
    gradscaler_state_saved_but_not_restored,
    gradscaler_state_not_saved,
    rng_not_restored,
)


def _the_resumed_run_diverges_message(s: ResumeSeen) -> str:
    return (
        f"The resumed run diverges from the uninterrupted one at step {STEPS_BEFORE + s.divergence} (loss "
        f"{float(s.resumed_losses[s.divergence]):.6g} instead of "
        f"{float(s.reference_losses[s.divergence]):.6g}), although step, weights, optimizer, scaler and RNG "
        "looked restored. Does load_checkpoint change anything "
        "else (e.g. the model's train/eval mode, the learning rate)?"
    )


@rule("the resumed run diverges", _the_resumed_run_diverges_message)
def the_resumed_run_diverges(s: ResumeSeen) -> bool:
    return s.divergence is not None


def _the_parameters_differ_message(s: ResumeSeen) -> str:
    return (
        f"After {STEPS_AFTER} resumed steps the parameters {_different_params(s)} differ from the "
        "uninterrupted run (the losses matched). Something besides the listed state was not restored."
    )


@rule("the parameters differ", _the_parameters_differ_message)
def the_parameters_differ(s: ResumeSeen) -> bool:
    return bool(_different_params(s))


@rule(
    "weights_only=False",
    "load_checkpoint calls torch.load(..., weights_only=False). That unpickles arbitrary objects: a tampered "
    "checkpoint can run code when loaded. Keep the payload plain and load it with weights_only=True.",
)
def weights_only_false(s: ResumeSeen) -> bool:
    return any(value is False for value in s.weights_only)


@rule(
    "weights_only not given",
    "Everything resumed bit for bit, but torch.load is called without weights_only. Its default "
    "changed in torch 2.6 (False before, True since), so the same code loads differently on "
    "different installs: pass weights_only=True explicitly.",
)
def weights_only_not_given(s: ResumeSeen) -> bool:
    return "missing" in s.weights_only


# After 6 more steps on both runs, and how the learner called torch.load.
RUN_MISTAKES = (
    the_resumed_run_diverges,
    the_parameters_differ,
    weights_only_false,
    weights_only_not_given,
)


def _different_params(s: ResumeSeen) -> list:
    return [k for k in s.reference_params if not torch.equal(s.final_params[k], s.reference_params[k])]


def _load_into_a_fresh_run(load_checkpoint, path, folder, config, saved):
    """Load a copy of the file into fresh objects with other random states (a new process would have both);
    returns what came back as a :class:`ResumeSeen` and the resumed ``(model, optimizer, scaler)``."""
    copy_path = os.path.join(folder, "copied.ckpt")
    shutil.copyfile(path, copy_path)
    seed_everything(99)
    model, optimizer, scaler = _fresh(1)
    fresh_scaler = dict(scaler.state_dict())
    seed_everything(1234)
    with recorded_file_calls() as calls:
        result = call_learner(load_checkpoint, copy_path, model, optimizer, scaler)
    rng = capture_rng()
    held = {id(p) for group in optimizer.param_groups for p in group["params"]}
    try:  # an optimizer whose params the learner replaced may not even produce its state_dict
        optimizer_state = copy.deepcopy(optimizer.state_dict()["state"])
    except Exception:
        optimizer_state = None
    seen = ResumeSeen(
        config,
        saved,
        result,
        _params(model),
        optimizer_state,
        dict(scaler.state_dict()),
        fresh_scaler,
        rng,
        read_any_payload(copy_path),
        calls.loads,
        optimizer_has_the_parameters=held == {id(p) for p in model.parameters()},
    )
    return seen, (model, optimizer, scaler)


@checker("06.2 resume bit for bit")
def check_resume(save_checkpoint, load_checkpoint):
    """Save after 6 steps, load into fresh objects, run 6 more: the uninterrupted run, bit for bit."""
    with preserved_rng(), _scratch() as (folder, _):
        config = _config()
        seed_everything(11)
        model, optimizer, scaler = _fresh(0)
        _run(model, optimizer, scaler, STEPS_BEFORE)
        path = os.path.join(folder, "run.ckpt")
        saved = {
            "params": _params(model),
            "optimizer": copy.deepcopy(optimizer.state_dict()),
            "scaler": dict(scaler.state_dict()),
            "rng": capture_rng(),
        }
        call_learner(save_checkpoint, path, model, optimizer, scaler, STEPS_BEFORE, dict(config))
        if not os.path.isfile(path):
            return failed(
                "save_checkpoint(path, ...) did not create a file at `path`, so there is nothing "
                "to resume from. Use the `path` argument as the file name."
            )
        reference_losses = _run(model, optimizer, scaler, STEPS_AFTER)
        seen, resumed = _load_into_a_fresh_run(load_checkpoint, path, folder, config, saved)
        mistake = first_mistake(RESTORE_MISTAKES, seen)
        if mistake:
            return failed(mistake.text(seen))
        try:
            resumed_losses = _run(*resumed, STEPS_AFTER)
        except Exception as exc:  # the objects load_checkpoint left behind cannot train
            return failed(
                f"After load_checkpoint the next training step failed: {describe_exception(exc)}. "
                "load_checkpoint must leave the model, optimizer and scaler it was given ready to "
                "train, as they were at save time."
            )
        seen = replace(
            seen,
            reference_losses=reference_losses,
            resumed_losses=resumed_losses,
            reference_params=_params(model),
            final_params=_params(resumed[0]),
        )
        mistake = first_mistake(RUN_MISTAKES, seen)
        if mistake:
            return failed(mistake.text(seen))
    names = ", ".join(seen.reference_params)
    return passed(
        f"Bit for bit: after loading the step-{STEPS_BEFORE} checkpoint into fresh objects with different "
        f"random states, {STEPS_AFTER} more steps gave torch.equal losses and parameters ({names}) to the "
        f"uninterrupted run. Step, config, AdamW state, GradScaler state (scale "
        f"{saved['scaler']['scale']:g}, growth tracker {saved['scaler']['_growth_tracker']}) and the "
        "Python/NumPy/torch RNG states all round-tripped."
    )


__all__ = ["check_resume", "check_save_checkpoint"]
