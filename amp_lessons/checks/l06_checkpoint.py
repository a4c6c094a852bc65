"""Lesson 06 checkers: the learner's ``save_checkpoint`` / ``load_checkpoint``.

How the checks stay honest:
- everything happens in a fresh temporary folder (``tempfile.mkdtemp``), deleted afterwards, and with the
  current directory switched to another empty temporary folder during learner calls: the learner's own
  files are never touched, and a function that ignores ``path`` is caught writing somewhere else;
- the folder holds a few pre-existing files (notes, an older checkpoint, ``tmp.pt``) that a save must not
  modify or delete;
- atomicity is tested the way it matters: a second save runs while ``torch.save`` fails halfway (it writes
  part of the bytes, then raises "no space left on device"); the previous checkpoint must come out intact.
  Calls to ``torch.save`` and ``os.replace``/``os.rename`` are also recorded, to name *how* a write was not
  atomic (straight into ``path``, or a temporary file in another folder);
- resume is judged bitwise: a loop that draws random numbers from Python (shuffling), NumPy (input noise)
  and torch (dropout) runs 6 steps, saves, runs 6 more; fresh objects with different seeds load the copy of
  the file and run the same 6 steps; parameters and losses must be ``torch.equal``. Each part that did not
  come back (step, config, weights, optimizer state, GradScaler state, each RNG) is named separately;
- the learner's RNG states are put back after the check, so running it does not change their notebook.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import os
import random
import shutil
import tempfile

import numpy as np
import torch

from amp_lessons.checkpoint import (
    SimulatedDiskFull,
    _first_line,
    capture_rng,
    restore_rng,
    simulated_failed_write,
)
from amp_lessons.checks.harness import call_learner, checker, describe_exception, failed, not_done, passed
from amp_lessons.environment import dtype_name, probe_autocast, seed_everything
from amp_lessons.models import SensorClassifier, sensor_readings

STEPS_BEFORE = 6
STEPS_AFTER = 6
BATCH = 32
SENTINELS = {
    "notes.txt": b"learner notes: do not touch\n",
    "older_run.pt": b"an older checkpoint the learner keeps\n" * 20,
    "tmp.pt": b"a learner file that happens to be called tmp.pt\n",
}


# ----------------------------------------------------------------------------------------- the training


@functools.lru_cache(maxsize=1)
def _dtype() -> torch.dtype:
    return torch.float16 if probe_autocast(torch.device("cpu"), torch.float16)[0] else torch.bfloat16


def _config() -> dict:
    return {"dtype": dtype_name(_dtype()), "fp32_regions": ["head"], "max_norm": 1.0, "lr": 0.003}


def _fresh(seed: int):
    """Model, optimizer and scaler as a run would create them (different ``seed``s give different weights)."""
    torch.manual_seed(seed)
    model = SensorClassifier(in_features=8, hidden=16, dropout=0.3)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.003)
    # growth_interval=4: within 6 steps the scale grows once and the tracker reads 2, so a scaler that was
    # not restored (scale 1024, tracker 0) is told apart from one that was.
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10, growth_interval=4)
    return model, optimizer, scaler


@functools.lru_cache(maxsize=1)
def _data():
    return sensor_readings(128, seed=5, in_features=8, scale=1.0)


def _run(model, optimizer, scaler, steps: int) -> list:
    """Train ``steps`` steps; every step draws from Python's, NumPy's and torch's RNG."""
    from amp_lessons.training import train_step

    readings, labels = _data()
    losses = []
    for _ in range(steps):
        order = list(range(len(readings)))
        random.shuffle(order)  # Python RNG: data order
        index = torch.tensor(order[:BATCH])
        noise = torch.from_numpy(np.random.normal(0.0, 0.05, size=(BATCH, readings.shape[1])).astype(np.float32))
        inputs = readings[index] + noise  # NumPy RNG: augmentation; dropout inside the model: torch RNG
        losses.append(train_step(model, optimizer, scaler, torch.nn.functional.cross_entropy, inputs, labels[index],
                                 dtype=_dtype(), max_norm=1.0))
    return losses


# ------------------------------------------------------------------------------------------- scaffolding


@contextlib.contextmanager
def _scratch():
    """A fresh folder with the learner-like files in it, and an empty current directory; both removed after."""
    folder = tempfile.mkdtemp(prefix="amp_lessons_check06_")
    elsewhere = tempfile.mkdtemp(prefix="amp_lessons_check06_cwd_")
    previous = os.getcwd()
    for name, data in SENTINELS.items():
        with open(os.path.join(folder, name), "wb") as handle:
            handle.write(data)
    try:
        os.chdir(elsewhere)
        yield folder, elsewhere
    finally:
        os.chdir(previous)
        shutil.rmtree(folder, ignore_errors=True)
        shutil.rmtree(elsewhere, ignore_errors=True)


@contextlib.contextmanager
def _preserved_rng():
    """The learner's Python/NumPy/torch RNG states are the same after the check as before it."""
    state = capture_rng()
    try:
        yield
    finally:
        restore_rng(state)


class _Spy:
    """Records torch.save targets, os.replace/os.rename calls and torch.load keyword arguments."""

    def __init__(self):
        self.saves, self.moves, self.loads = [], [], []

    @contextlib.contextmanager
    def watching(self):
        real = {"save": torch.save, "load": torch.load, "replace": os.replace, "rename": os.rename,
                "serialization.save": torch.serialization.save, "serialization.load": torch.serialization.load}

        def save(obj, f, *args, **kwargs):
            self.saves.append(f)
            return real["save"](obj, f, *args, **kwargs)

        def load(f, *args, **kwargs):
            self.loads.append(dict(kwargs))
            return real["load"](f, *args, **kwargs)

        def move(kind):
            def record_move(src, dst, *args, **kwargs):
                self.moves.append((os.fspath(src), os.fspath(dst)))
                return real[kind](src, dst, *args, **kwargs)

            return record_move

        torch.save = torch.serialization.save = save
        torch.load = torch.serialization.load = load
        os.replace, os.rename = move("replace"), move("rename")
        try:
            yield self
        finally:
            torch.save, torch.serialization.save = real["save"], real["serialization.save"]
            torch.load, torch.serialization.load = real["load"], real["serialization.load"]
            os.replace, os.rename = real["replace"], real["rename"]


def _same_file(a, b) -> bool:
    try:
        return os.path.abspath(os.fspath(a)) == os.path.abspath(os.fspath(b))
    except TypeError:
        return False


def _target_name(f):
    """The path torch.save wrote to: a path argument, or the ``.name`` of an open file."""
    if isinstance(f, (str, bytes, os.PathLike)):
        return os.fsdecode(f)
    name = getattr(f, "name", None)
    return name if isinstance(name, str) else None


def _listing(folder: str) -> dict:
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


def _save_problem_from_files(folder, cwd, path, before: dict):
    """Name what a save did to the folder and the current directory (or None when it looks right)."""
    name = os.path.basename(path)
    strays_cwd = sorted(os.listdir(cwd))
    if strays_cwd:
        return failed(f"save_checkpoint wrote {strays_cwd} into the current working directory. Write only at "
                      "`path` (and a temporary file in the same folder): the current directory holds the "
                      "learner's own files.")
    after = _listing(folder)
    changed = [n for n, data in before.items() if n != name and after.get(n, b"<gone>") != data]
    if changed:
        gone = [n for n in changed if n not in after]
        return failed(
            f"save_checkpoint {'removed' if gone else 'modified'} {changed}, file(s) that were already in the folder"
            + (" (a fixed temporary name such as tmp.pt overwrites any file of that name)" if "tmp.pt" in changed else "")
            + ". A checkpoint save must touch only its own file: give the temporary file a fresh unique name "
            "(tempfile.mkstemp(dir=folder) or NamedTemporaryFile(dir=folder, delete=False)) and delete nothing else."
        )
    if name not in after:
        new = sorted(set(after) - set(before))
        hint = f" It created {new} instead: use the `path` argument as the file name." if new else ""
        return failed(f"After save_checkpoint(path, ...) there is no file at `path`.{hint}")
    strays = sorted(set(after) - set(before) - {name})
    if strays:
        return failed(f"save_checkpoint left {strays} next to the checkpoint. The temporary file should *become* "
                      "the checkpoint (os.replace moves it), so nothing else is left behind.")
    return None


def _call_failing_save(save_checkpoint, args):
    """Call the learner's save while torch.save fails halfway; returns 'raised', 'returned' or a CheckResult."""
    try:
        with simulated_failed_write():
            save_checkpoint(*args)
    except NotImplementedError:
        return not_done("`save_checkpoint`")
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException as exc:
        seen, link = set(), exc
        while link is not None and id(link) not in seen:
            if isinstance(link, SimulatedDiskFull):
                return "raised"
            seen.add(id(link))
            link = link.__cause__ or link.__context__
        return failed(f"When torch.save failed halfway, save_checkpoint raised a different error: "
                      f"{describe_exception(exc)}. Let the original error propagate (after removing the temporary file).")
    return "returned"


def _weights_only_problem(path):
    try:
        torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:
        detail = _first_line(exc)
        hint = ""
        if "numpy" in detail.lower():
            hint = (" NumPy's RNG state (np.random.get_state()) holds a NumPy array: convert it, e.g. "
                    "`keys.tolist()` or `torch.from_numpy(keys.astype('int64'))`.")
        elif "TorchVersion" in detail:
            hint = " torch.__version__ is a TorchVersion object: store str(torch.__version__)."
        elif "GLOBAL" in detail:
            hint = " Save state_dict()s and plain values, not whole objects (the model, optimizer or scaler themselves)."
        return failed(f"torch.load(path, weights_only=True) refuses your checkpoint ({detail}). Since torch 2.6 that "
                      "is torch.load's default, and it is the safe way to load: keep the payload to dicts, lists, "
                      f"tensors, numbers and strings.{hint}")
    return None


# ------------------------------------------------------------------------------------------------ 06.1


@checker("06.1 save_checkpoint: atomic, complete file")
def check_save_checkpoint(save_checkpoint):
    """``save_checkpoint(path, model, optimizer, scaler, step, config)`` writes atomically, only its own file."""
    with _preserved_rng(), _scratch() as (folder, cwd):
        model, optimizer, scaler = _fresh(0)
        _run(model, optimizer, scaler, 3)
        path = os.path.join(folder, "run.ckpt")
        before = _listing(folder)
        spy = _Spy()
        with spy.watching():
            call_learner(save_checkpoint, path, model, optimizer, scaler, 3, _config())
        problem = _save_problem_from_files(folder, cwd, path, before)
        if problem is not None:
            return problem
        if not spy.saves:
            return failed("save_checkpoint never called torch.save. Write the payload with torch.save "
                          "(that is what torch.load(weights_only=True) reads back).")
        if any(_same_file(_target_name(f), path) for f in spy.saves):
            return failed(
                "Not atomic: torch.save wrote straight into `path`. If that write is interrupted (disk full, job "
                "killed), the previous checkpoint is already destroyed and only a truncated file is left. Write to a "
                "temporary file in the same folder, then os.replace(temporary, path)."
            )
        arrivals = [(src, dst) for src, dst in spy.moves if _same_file(dst, path)]
        if not arrivals:
            return failed(
                "The checkpoint did not arrive at `path` through os.replace (or os.rename). Copying a finished "
                "temporary file onto `path` is not atomic either: a copy can stop halfway. Finish with "
                "os.replace(temporary, path), a single atomic rename."
            )
        source = arrivals[-1][0]
        if os.path.dirname(os.path.abspath(source)) != os.path.dirname(os.path.abspath(path)):
            return failed(
                f"The temporary file was written in {os.path.dirname(os.path.abspath(source))}, not next to the "
                "checkpoint. os.replace is only atomic within one file system (across file systems it fails or "
                "copies): create the temporary file in os.path.dirname(path)."
            )
        problem = _weights_only_problem(path)
        if problem is not None:
            return problem

        # The interrupted save: torch.save writes part of the bytes, then fails like a full disk.
        previous = _listing(folder)
        outcome = _call_failing_save(save_checkpoint, (path, model, optimizer, scaler, 4, _config()))
        if not isinstance(outcome, str):
            return outcome
        after = _listing(folder)
        name = os.path.basename(path)
        if name not in after:
            return failed("When torch.save failed halfway, the previous checkpoint at `path` was deleted: a save "
                          "must not remove the old file before the new one is complete (os.replace does both at once).")
        if after[name] != previous[name]:
            return failed(f"Not atomic: when torch.save failed halfway, the previous checkpoint at `path` was "
                          f"overwritten by {len(after[name])} bytes of a half-written file. Write to a temporary file "
                          "in the same folder, then os.replace(temporary, path).")
        leftovers = sorted(set(after) - set(previous))
        if leftovers:
            return failed(f"When torch.save failed halfway, save_checkpoint left {leftovers} behind. Remove the "
                          "temporary file when the write fails (in `except`/`finally`), then re-raise the error.")
        if outcome == "returned":
            return failed("save_checkpoint hid a failed write: torch.save raised 'No space left on device' but your "
                          "function returned normally. Let the error propagate, so the training loop knows this "
                          "checkpoint was not written.")
    return passed("Atomic and tidy: the checkpoint arrives by os.replace from a temporary file next to it, an "
                  "interrupted save leaves the previous checkpoint byte for byte intact and no stray file, nothing "
                  "else in the folder is touched, and torch.load(weights_only=True) accepts the file. (The check "
                  "worked in a temporary folder it has deleted.)")


# ------------------------------------------------------------------------------------------------ 06.2


def _scan(payload, predicate) -> bool:
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


def _payload(path):
    for weights_only in (True, False):
        try:
            return torch.load(path, map_location="cpu", weights_only=weights_only)
        except Exception:
            continue
    return None


def _tensors_equal(a, b) -> bool:
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.shape == b.shape \
            and a.dtype == b.dtype and torch.equal(a.cpu(), b.cpu())
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_tensors_equal(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_tensors_equal(x, y) for x, y in zip(a, b))
    return a == b


def _rng_problem(expected: dict):
    now = capture_rng()
    names = {"python": "Python's `random` (random.getstate / random.setstate)",
             "numpy": "NumPy's global generator (np.random.get_state / np.random.set_state)",
             "torch": "torch's CPU generator (torch.get_rng_state / torch.set_rng_state)",
             "cuda": "the CUDA generators (torch.cuda.get_rng_state_all / set_rng_state_all)"}
    lost = [names[key] for key in ("python", "numpy", "torch", "cuda") if not _tensors_equal(now[key], expected[key])]
    if lost:
        return failed(
            f"RNG not restored: after load_checkpoint the state of {'; '.join(lost)} differs from the state at save "
            "time. The resumed run then draws different random numbers (dropout masks, shuffling, augmentation) "
            "and diverges from the uninterrupted one. Save each generator's state and set it back on load."
        )
    return None


def _as_step(value):
    if isinstance(value, bool):
        return None
    try:
        if isinstance(value, torch.Tensor) and value.numel() == 1:
            value = value.item()
        return int(value) if float(value) == int(value) else None
    except (TypeError, ValueError, OverflowError):
        return None


@checker("06.2 resume bit for bit")
def check_resume(save_checkpoint, load_checkpoint):
    """Save after 6 steps, load into fresh objects, run 6 more: identical to the uninterrupted run, bit for bit."""
    with _preserved_rng(), _scratch() as (folder, cwd):
        config = _config()
        seed_everything(11)
        model, optimizer, scaler = _fresh(0)
        _run(model, optimizer, scaler, STEPS_BEFORE)
        path = os.path.join(folder, "run.ckpt")
        saved = {
            "params": {k: v.detach().clone() for k, v in model.state_dict().items()},
            "optimizer": copy.deepcopy(optimizer.state_dict()),
            "scaler": dict(scaler.state_dict()),
            "rng": capture_rng(),
        }
        call_learner(save_checkpoint, path, model, optimizer, scaler, STEPS_BEFORE, dict(config))
        if not os.path.isfile(path):
            return failed("save_checkpoint(path, ...) did not create a file at `path`, so there is nothing to resume "
                          "from. Use the `path` argument as the file name.")
        reference_losses = _run(model, optimizer, scaler, STEPS_AFTER)
        reference_params = {k: v.detach().clone() for k, v in model.state_dict().items()}

        # A new process would have fresh objects and different random states: imitate that.
        copy_path = os.path.join(folder, "copied.ckpt")
        shutil.copyfile(path, copy_path)
        seed_everything(99)
        model2, optimizer2, scaler2 = _fresh(1)
        fresh_scaler = dict(scaler2.state_dict())
        seed_everything(1234)
        spy = _Spy()
        with spy.watching():
            result = call_learner(load_checkpoint, copy_path, model2, optimizer2, scaler2)
        if not isinstance(result, (tuple, list)) or len(result) != 2:
            return failed(f"load_checkpoint returned {_short(result)}; it must return the pair (step, config) so the "
                          "loop knows where to continue and with which precision policy.")
        step, loaded_config = result
        if _as_step(step) != STEPS_BEFORE:
            return failed(f"Step counter lost: load_checkpoint returned step {_short(step)}, but the checkpoint was saved "
                          f"after {STEPS_BEFORE} steps. Save `step` in the payload and return it: schedules, logs and "
                          "rollback decisions are indexed by it.")
        if not isinstance(loaded_config, dict) or loaded_config != config:
            return failed(f"The config came back as {_short(loaded_config)} instead of {config}. Save the config "
                          "(dtype, FP32 regions, ...) and return it: it is how a resume tells a continuation from a change "
                          "of precision policy.")
        payload = _payload(copy_path)
        params_now = model2.state_dict()
        if not all(_tensors_equal(params_now[k], saved["params"][k]) for k in saved["params"]):
            return failed("The model's weights were not restored: after load_checkpoint the fresh model still has its own "
                          "parameters. Save model.state_dict() and call model.load_state_dict(...) on the model you are "
                          "given (do not build a new one).")
        if not _tensors_equal(optimizer2.state_dict()["state"], saved["optimizer"]["state"]):
            in_file = payload is not None and _scan(payload, lambda x: isinstance(x, dict) and "param_groups" in x and "state" in x)
            return failed(
                "Optimizer state not " + ("restored: your file contains the optimizer's state_dict, but load_checkpoint "
                                          "does not call optimizer.load_state_dict(...)." if in_file else
                                          "saved: the checkpoint has no optimizer.state_dict().")
                + " Without it AdamW restarts its moving averages (exp_avg, exp_avg_sq) and step count from zero, so the "
                "first steps after a resume are different (bias-corrected full-size steps) and the run diverges."
            )
        scaler_now = dict(scaler2.state_dict())
        if scaler_now != saved["scaler"]:
            scale_saved = saved["scaler"]["scale"]
            in_file = payload is not None and _scan(payload, lambda x: isinstance(x, dict) and "_growth_tracker" in x)
            if scaler_now.get("scale") == scale_saved:
                return failed(f"Only part of the GradScaler state came back: the scale ({scale_saved}) is right but the "
                              f"growth tracker is {scaler_now.get('_growth_tracker')} instead of "
                              f"{saved['scaler']['_growth_tracker']}. Save scaler.state_dict() whole and load it with "
                              "scaler.load_state_dict(...).")
            if in_file:
                return failed(f"GradScaler state saved but not restored: after load_checkpoint the scale is "
                              f"{scaler_now.get('scale')} (a fresh scaler's initial value) instead of {scale_saved}. Call "
                              "scaler.load_state_dict(...) with the saved state.")
            return failed(
                f"GradScaler state not saved: after load_checkpoint the scale is {scaler_now.get('scale')} "
                f"(fresh: {fresh_scaler.get('scale')}) instead of {scale_saved}, and the growth tracker restarted. In a "
                "float16 run whose scale had settled lower, the restarted scale overflows and the next steps are "
                "skipped; a higher settled scale is lost the other way. Save scaler.state_dict() and load it back."
            )
        problem = _rng_problem(saved["rng"])
        if problem is not None:
            return problem
        resumed_losses = _run(model2, optimizer2, scaler2, STEPS_AFTER)
        for index, (a, b) in enumerate(zip(reference_losses, resumed_losses)):
            if not torch.equal(a, b):
                return failed(f"The resumed run diverges from the uninterrupted one at step {STEPS_BEFORE + index} "
                              f"(loss {float(b):.6g} instead of {float(a):.6g}), although step, weights, optimizer, "
                              "scaler and RNG looked restored. Does load_checkpoint change anything else (e.g. "
                              "the model's train/eval mode, the learning rate)?")
        final = model2.state_dict()
        different = [k for k in reference_params if not torch.equal(final[k], reference_params[k])]
        if different:
            return failed(f"After {STEPS_AFTER} resumed steps the parameters {different} differ from the uninterrupted "
                          "run (the losses matched). Something besides the listed state was not restored.")
        explicit = [kwargs.get("weights_only", "missing") for kwargs in spy.loads]
        if any(value is False for value in explicit):
            return failed("load_checkpoint calls torch.load(..., weights_only=False). That unpickles arbitrary objects: "
                          "a tampered checkpoint can run code when loaded. Keep the payload plain and load it with "
                          "weights_only=True.")
        if "missing" in explicit:
            return failed("Everything resumed bit for bit, but torch.load is called without weights_only. Its default "
                          "changed in torch 2.6 (False before, True since), so the same code loads differently on "
                          "different installs: pass weights_only=True explicitly.")
    names = ", ".join(reference_params)
    return passed(
        f"Bit for bit: after loading the step-{STEPS_BEFORE} checkpoint into fresh objects with different random "
        f"states, {STEPS_AFTER} more steps gave torch.equal losses and parameters ({names}) to the uninterrupted run. "
        f"Step, config, AdamW state, GradScaler state (scale {saved['scaler']['scale']:g}, growth tracker "
        f"{saved['scaler']['_growth_tracker']}) and the Python/NumPy/torch RNG states all round-tripped."
    )


def _short(value) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


__all__ = ["check_resume", "check_save_checkpoint"]
