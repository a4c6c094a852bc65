"""Lesson 06: checkpoints that a mixed-precision run can resume from bit for bit (and roll back to).

What a resumed run needs is *everything the loop consumes*, not just the weights:

- the model's ``state_dict`` (weights and buffers);
- the optimizer's ``state_dict`` (Adam's moving averages and step counts: without them the first steps
  after a resume are full-size "bias-corrected" steps from zero, a visible kink in the loss);
- the GradScaler's ``state_dict`` (the current loss scale and its growth tracker: without them the
  scale restarts at its initial value, too high for a model whose scale had settled lower, and the
  scaler skips the next steps until it has backed off again);
- the step counter (schedules, logging, "skip these batches" lists are indexed by it);
- the RNG states of Python, NumPy, torch's CPU generator and every CUDA device (dropout masks and data
  shuffling draw from them: without them the resumed run sees different random numbers);
- the configuration: the autocast dtype and the regions kept in FP32. Resuming with a different precision
  policy is a *change* of the experiment, so :func:`amp_lessons.l06_checkpoint_and_rollback.load_checkpoint` reports it and
  refuses by default.

Writes are atomic: the payload goes to a temporary file in the same folder, is flushed to disk, then
``os.replace`` renames it over the old checkpoint. A rename within one file system is atomic, so a save that
is interrupted (disk full, killed job) leaves the previous checkpoint intact instead of a truncated file.

Reads are safe: the payload contains only plain data (dicts, lists, tensors, Python numbers, strings), so
it loads with ``torch.load(..., weights_only=True)`` on every torch from 2.4 (where the default was
``False``) to 2.6+ (where it became ``True``); nothing in the file can run code. A checksum of the payload
catches bytes changed inside tensor data, which the zip archive does not notice.

This module is the file: what goes in, how it is written and read. Putting a checkpoint back into a live
run (validating every part first) and proving the resume bit for bit is :mod:`amp_lessons.l06_checkpoint_and_rollback.resume`;
deciding *when* to roll back (the watchdog's triggers, incident files) is :mod:`amp_lessons.l06_checkpoint_and_rollback.rollback`.
"""

from __future__ import annotations

import contextlib
import copy
import errno
import hashlib
import io
import os
import pathlib
import random
import re
import sys
import zipfile
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
import torch

from amp_lessons.core.environment import dtype_name
from amp_lessons.core.files import atomic_write

FORMAT = "amp_lessons.l06_checkpoint_and_rollback.checkpoint"
VERSION = 1
PARTS = ("model", "optimizer", "scaler", "rng")
SECTIONS = ("format", "version", "step", "config", "model", "optimizer", "scaler", "rng")

__all__ = [
    "CheckpointError",
    "FileCalls",
    "PARTS",
    "SECTIONS",
    "SimulatedCrash",
    "SimulatedDiskFull",
    "atomic_torch_save",
    "capture_rng",
    "config_changes",
    "describe_checkpoint",
    "is_plain",
    "load_error_line",
    "normalize_config",
    "preserved_rng",
    "read_checkpoint",
    "recorded_file_calls",
    "restore_rng",
    "save_checkpoint",
    "simulated_crash_before_move",
    "simulated_failed_write",
    "state_fingerprint",
    "validate_run_objects",
    "write_payload",
]


class CheckpointError(ValueError):
    """A checkpoint that cannot be used as asked; the message names the file and the problem."""


# --------------------------------------------------------------------------------------------- config


def _dtype_name(dtype) -> str:
    if isinstance(dtype, torch.dtype):
        return dtype_name(dtype)
    if isinstance(dtype, str):
        name = dtype.replace("torch.", "").strip()
        if isinstance(getattr(torch, name, None), torch.dtype):
            return name
    raise ValueError(
        f"config['dtype'] must be a torch dtype such as torch.float16 (or its name); got {dtype!r}."
    )


def is_plain(value) -> bool:
    """True for None, numbers, strings, booleans and lists/dicts of those: what weights_only=True loads."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return True
    if isinstance(value, (list, tuple)):
        return all(is_plain(v) for v in value)
    if isinstance(value, Mapping):
        return all(isinstance(k, str) and is_plain(v) for k, v in value.items())
    return False


def _digest(value) -> str:
    """SHA-256 over the structure and every byte of ``value``.

    Dicts are fed by sorted key, tensors by dtype, shape and bytes.

    torch.save's zip archive does not notice flipped bytes inside tensor data (they load as wrong numbers),
    so a checkpoint carries this digest of its own payload and a load recomputes it.
    """
    digest = hashlib.sha256()

    def feed(item):
        if isinstance(item, torch.Tensor):
            flat = item.detach().cpu().contiguous().reshape(-1)
            digest.update(f"T{item.dtype}{tuple(item.shape)}".encode())
            digest.update(flat.view(torch.uint8).numpy().tobytes() if flat.numel() else b"")
        elif isinstance(item, Mapping):
            digest.update(b"{")
            for key in sorted(item, key=repr):
                digest.update(repr(key).encode())
                feed(item[key])
            digest.update(b"}")
        elif isinstance(item, (list, tuple)):
            digest.update(b"[")
            for element in item:
                feed(element)
            digest.update(b"]")
        else:
            digest.update(repr(item).encode())

    feed(value)
    return digest.hexdigest()


def normalize_config(config) -> dict:
    """The run's configuration as plain data: ``dtype`` as a name, ``fp32_regions`` as a sorted list.

    Plain data keeps the checkpoint loadable with ``weights_only=True`` and makes two configurations
    comparable with ``==``. Other keys (learning rate, max_norm, ...) must be numbers, strings, booleans,
    None, or lists/dicts of those.
    """
    if not isinstance(config, Mapping):
        raise TypeError(
            f"config must be a dict such as {{'dtype': 'float16', 'fp32_regions': ['head']}}; "
            f"got {type(config).__name__}."
        )
    if "dtype" not in config:
        raise ValueError("config needs a 'dtype' entry (the autocast dtype of the run, e.g. 'float16').")
    plain = {}
    for key, value in config.items():
        if not isinstance(key, str):
            raise TypeError(f"config keys must be strings; got {key!r}.")
        if key == "dtype":
            plain[key] = _dtype_name(value)
        elif key == "fp32_regions":
            if isinstance(value, str) or not isinstance(value, (list, tuple, set, frozenset)):
                raise TypeError(f"config['fp32_regions'] must be a list of region names; got {value!r}.")
            plain[key] = sorted(str(v) for v in value)
        elif is_plain(value):
            plain[key] = copy.deepcopy(list(value) if isinstance(value, tuple) else value)
        else:
            raise TypeError(
                f"config[{key!r}] is a {type(value).__name__}; keep the config to numbers, strings, "
                "booleans, None and lists/dicts of those, so the checkpoint stays loadable with "
                "weights_only=True."
            )
    plain.setdefault("fp32_regions", [])
    return plain


def config_changes(saved, current) -> list[str]:
    """Human-readable differences between two configurations (empty when they are the same)."""
    saved, current = normalize_config(saved), normalize_config(current)
    changes = []
    for key in sorted(set(saved) | set(current)):
        before, after = saved.get(key, "(absent)"), current.get(key, "(absent)")
        if before != after:
            changes.append(f"{key}: {before} -> {after}")
    return changes


# ------------------------------------------------------------------------------------------------ RNG


def capture_rng() -> dict:
    """The RNG states of Python, NumPy, torch CPU and every CUDA device, as plain data and tensors.

    NumPy's state holds a NumPy array and Python's a long tuple of ints: both become int64 tensors, so
    the checkpoint needs no pickled NumPy objects (``weights_only=True`` refuses those).
    """
    version, internal, gauss = random.getstate()
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    state = {
        "python": {
            "version": int(version),
            "internal": torch.tensor(internal, dtype=torch.int64),
            "gauss": gauss,
        },
        "numpy": {
            "kind": str(kind),
            "keys": torch.from_numpy(np.asarray(keys, dtype=np.int64).copy()),
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "cached_gaussian": float(cached),
        },
        "torch": torch.get_rng_state(),
        "cuda": [],
    }
    if torch.cuda.is_available():
        state["cuda"] = [s.cpu() for s in torch.cuda.get_rng_state_all()]
    return state


def restore_rng(state: dict) -> list[str]:
    """Put back the generator states from :func:`capture_rng`; returns notes (e.g. CUDA states not set)."""
    notes = []
    py = state["python"]
    random.setstate((py["version"], tuple(int(v) for v in py["internal"].tolist()), py["gauss"]))
    npy = state["numpy"]
    np.random.set_state(
        (
            npy["kind"],
            npy["keys"].numpy().astype(np.uint32),
            int(npy["pos"]),
            int(npy["has_gauss"]),
            float(npy["cached_gaussian"]),
        )
    )
    torch.set_rng_state(state["torch"].cpu())
    cuda = list(state.get("cuda") or [])
    if cuda:
        if not torch.cuda.is_available():
            notes.append(
                f"the checkpoint has {len(cuda)} CUDA RNG state(s) but no GPU is visible here: not restored"
            )
        elif len(cuda) != torch.cuda.device_count():
            notes.append(
                f"the checkpoint has {len(cuda)} CUDA RNG state(s) but {torch.cuda.device_count()} "
                "GPU(s) are visible: CUDA RNG not restored, GPU random numbers will differ"
            )
        else:
            torch.cuda.set_rng_state_all([s.cpu() for s in cuda])
    elif torch.cuda.is_available():
        notes.append("the checkpoint was saved without a GPU: CUDA RNG states not restored")
    return notes


# ----------------------------------------------------------------------------------------------- save


def atomic_torch_save(payload, path) -> str:
    """``torch.save`` through :func:`amp_lessons.core.files.atomic_write`: the old file survives any failure."""
    return atomic_write(path, lambda handle: torch.save(payload, handle))


def write_payload(payload: dict, path) -> str:
    """Add the checksum of ``payload`` (see :func:`_digest`) and save it atomically; returns the path.

    Every file this course writes (checkpoints, lesson 06's incidents) goes through here, so
    :func:`read_checkpoint` can verify any of them."""
    payload = dict(payload)
    payload["checksum"] = _digest(payload)
    return atomic_torch_save(payload, path)


def validate_run_objects(model, optimizer, scaler) -> None:
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model must be a torch.nn.Module; got {type(model).__name__}.")
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(f"optimizer must be a torch.optim.Optimizer; got {type(optimizer).__name__}.")
    if not all(hasattr(scaler, name) for name in ("state_dict", "load_state_dict", "is_enabled")):
        raise TypeError(f"scaler must be a torch.amp.GradScaler; got {type(scaler).__name__}.")


def save_checkpoint(path, model, optimizer, scaler, step: int, config) -> str:
    """Atomically save everything the loop consumes (see the module docstring); returns the absolute path.

    ``step`` is the number of the next step to run (the count of steps done). ``config`` holds at least the
    autocast ``dtype`` and the ``fp32_regions``.
    """
    validate_run_objects(model, optimizer, scaler)
    if isinstance(step, bool) or not isinstance(step, (int, np.integer)) or step < 0:
        raise TypeError(f"step must be a non-negative integer (the number of steps done); got {step!r}.")
    payload = {
        "format": FORMAT,
        "version": VERSION,
        "step": int(step),
        "config": normalize_config(config),
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "scaler": scaler.state_dict(),
        "rng": capture_rng(),
        "torch_version": str(torch.__version__),
    }
    return write_payload(payload, path)


# ----------------------------------------------------------------------------------------------- read


def load_error_line(exc: BaseException) -> str:
    """The informative line of a torch.load error: for a weights_only refusal, the object it refused.

    torch's message opens with a hint to retry with ``weights_only=False`` (which would run whatever the file
    asks for); the useful part is the refused GLOBAL further down, worded differently by torch version:
    "Unsupported global: GLOBAL torch.nn.modules.linear.Linear was not an allowed global by default" (a class
    the allow-list lacks) or "Trying to load unsupported GLOBAL posix.system whose module posix is blocked"
    (torch 2.14, a blocked module). This returns that part (the refused name and, when given, the reason),
    never the hint.
    """
    text = str(exc)
    match = re.search(r"(Unsupported global: )?GLOBAL [\w.]+( whose module [\w.]+ is blocked)?", text)
    if match:
        return match.group(0) if match.group(1) else "unsupported " + match.group(0)
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    informative = [
        line
        for line in lines
        if "weights_only" not in line
        and "trust" not in line
        and not line.startswith("Check the documentation")
    ]
    chosen = (informative or lines or [type(exc).__name__])[0]
    return chosen.split("WeightsUnpickler error: ", 1)[-1]


def read_checkpoint(path, expect_format: str = FORMAT) -> dict:
    """Load a checkpoint file as plain data (``weights_only=True``).

    Raises :class:`CheckpointError` naming the problem: missing, empty, not a zip archive, truncated, unsafe
    objects, another format or version, or a checksum that does not match."""
    path = os.fspath(path)
    if not os.path.exists(path):
        raise CheckpointError(f"No checkpoint at {path}: the file does not exist.")
    if os.path.isdir(path):
        raise CheckpointError(f"{path} is a folder, not a checkpoint file.")
    size = os.path.getsize(path)
    if size == 0:
        raise CheckpointError(
            f"{path} is empty (0 bytes): a save was interrupted before writing anything. "
            "Use the previous checkpoint."
        )
    with open(path, "rb") as handle:
        head = handle.read(4)
    if head[:2] != b"PK":
        raise CheckpointError(
            f"{path} is not a torch.save file (it starts with {head!r}, not a zip archive "
            "header): corrupt, or a different kind of file."
        )
    if not zipfile.is_zipfile(path):
        raise CheckpointError(
            f"{path} is truncated ({size} bytes, the end of the archive is missing): an "
            "interrupted, non-atomic save leaves exactly this. Use the previous "
            "checkpoint."
        )
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:
        first = load_error_line(exc)
        if "weights_only" in str(exc).lower() or "unsupported global" in str(exc).lower():
            raise CheckpointError(
                f"{path} contains objects that are not plain data, so torch.load(weights_only=True) refuses "
                f"it ({first}). A course checkpoint holds only dicts, lists, tensors and numbers; unpickling "
                "anything else could run code from the file."
            ) from None
        raise CheckpointError(
            f"{path} is corrupt: torch.load failed with {type(exc).__name__}: {first}"
        ) from None
    if not isinstance(payload, Mapping) or payload.get("format") != expect_format:
        found = sorted(map(str, payload))[:8] if isinstance(payload, Mapping) else type(payload).__name__
        raise CheckpointError(
            f"{path} is not a file written by amp_lessons ({expect_format}); it holds {found}."
        )
    if payload.get("version") != VERSION:
        raise CheckpointError(
            f"{path} has format version {payload.get('version')!r}; this course reads version {VERSION}."
        )
    payload = dict(payload)
    checksum = payload.pop("checksum", None)
    if checksum != _digest(payload):
        raise CheckpointError(
            f"{path} is corrupt: its contents do not match the checksum written with them "
            "(bytes changed on disk or in transfer)."
            if checksum
            else f"{path} has no checksum, so its integrity cannot be verified."
        )
    return payload


def describe_checkpoint(path):
    """A table of what a checkpoint holds: one row per section, with a short description and its size."""
    import pandas as pd

    payload = read_checkpoint(path)

    def nbytes(value) -> int:
        if isinstance(value, torch.Tensor):
            return value.numel() * value.element_size()
        if isinstance(value, Mapping):
            return sum(nbytes(v) for v in value.values())
        if isinstance(value, (list, tuple)):
            return sum(nbytes(v) for v in value)
        return 8

    model, optimizer, scaler, rng = payload["model"], payload["optimizer"], payload["scaler"], payload["rng"]
    moments = sorted({k for state in optimizer["state"].values() for k in state})
    rows = [
        ("step", f"{payload['step']} (steps done; the next step to run)", nbytes(payload["step"])),
        ("config", ", ".join(f"{k}={v}" for k, v in payload["config"].items()), 0),
        ("model", f"{len(model)} tensors, {sum(t.numel() for t in model.values())} numbers", nbytes(model)),
        (
            "optimizer",
            f"{len(optimizer['state'])} parameter states with {moments}; hyperparameters of "
            f"{len(optimizer['param_groups'])} group(s)",
            nbytes(optimizer),
        ),
        (
            "scaler",
            (
                f"scale={scaler['scale']}, growth tracker={scaler['_growth_tracker']}"
                if scaler
                else "disabled scaler (no state)"
            ),
            nbytes(scaler),
        ),
        ("rng", f"python, numpy, torch CPU, {len(rng['cuda'])} CUDA device(s)", nbytes(rng)),
    ]
    table = pd.DataFrame(rows, columns=["section", "contents", "bytes"]).set_index("section")
    table.attrs["file bytes"] = os.path.getsize(path)
    return table


def state_fingerprint(model, optimizer, scaler) -> str:
    """A short hash of model, optimizer and scaler state: equal before and after means nothing changed."""
    return _digest([model.state_dict(), optimizer.state_dict(), scaler.state_dict()])[:12]


# ------------------------------------------------------------------------- failure injection, observation


@contextlib.contextmanager
def preserved_rng():
    """Run a block without changing the global random streams: every generator's state is put back after."""
    state = capture_rng()
    try:
        yield
    finally:
        restore_rng(state)


@dataclass
class FileCalls:
    """What a block of code did with checkpoint files (filled by :func:`recorded_file_calls`)."""

    saves: list = field(default_factory=list)  # torch.save targets: absolute paths (None: an unnamed buffer)
    moves: list = field(default_factory=list)  # (source, destination) of every rename, absolute
    loads: list = field(default_factory=list)  # the keyword arguments of each torch.load call
    movers: list = field(default_factory=list)  # per move: "os.replace", "os.rename" or "a rename" (unknown)
    removes: list = field(default_factory=list)  # absolute paths given to os.remove/os.unlink
    calling: str = ""  # the os function being called right now, so a move knows who made it


def _absolute(target):
    """The absolute path a call was given: a path, or the ``.name`` of an open file; None otherwise."""
    if not isinstance(target, (str, bytes, os.PathLike)):
        target = getattr(target, "name", None)
        if not isinstance(target, str):
            return None
    return os.path.abspath(os.fsdecode(target))


# Renames and removes are seen through Python's audit events ("os.rename" for os.rename, os.replace, pathlib
# and shutil.move; "os.remove" for os.remove and os.unlink), however the code reached the function (a
# `from os import replace` binds the function itself, which no attribute patch reaches). The hook is added
# once and does nothing unless a block below has put a listener on _LISTENERS.
_LISTENERS: list = []
_HOOKED = []


def _dispatch(event: str, args: tuple) -> None:
    if _LISTENERS and event in ("os.rename", "os.remove"):
        for listener in reversed(list(_LISTENERS)):  # innermost block first: a simulated crash wins
            listener(event, args)


@contextlib.contextmanager
def _listening(listener):
    if not _HOOKED:
        sys.addaudithook(_dispatch)
        _HOOKED.append(True)
    _LISTENERS.append(listener)
    try:
        yield
    finally:
        _LISTENERS.remove(listener)


@contextlib.contextmanager
def _pathlib_through_os():
    """Python 3.9 and 3.10: make Path.replace/Path.rename call whatever os.replace/os.rename are now.

    Their pathlib keeps the os functions it saw at import (``pathlib._NormalAccessor``), so a patched
    ``os.replace`` never hears of ``Path.replace``; from Python 3.11 pathlib calls ``os.replace`` itself.
    """
    accessor = getattr(pathlib, "_NormalAccessor", None)
    if accessor is None:
        yield
        return
    saved = accessor.replace, accessor.rename
    accessor.replace = staticmethod(lambda src, dst, *args, **kwargs: os.replace(src, dst, *args, **kwargs))
    accessor.rename = staticmethod(lambda src, dst, *args, **kwargs: os.rename(src, dst, *args, **kwargs))
    try:
        yield
    finally:
        accessor.replace, accessor.rename = saved


@contextlib.contextmanager
def recorded_file_calls():
    """Inside this block every torch.save target, rename (os.replace, os.rename, pathlib, shutil.move), remove
    (os.remove, os.unlink) and torch.load call is recorded.

    How a save reaches its file tells atomic from not: torch.save straight into the checkpoint's path is not;
    a temporary file in the same folder, then moved over the path by os.replace, is.
    """
    calls = FileCalls()
    real = (torch.save, torch.serialization.save, torch.load, torch.serialization.load, os.replace, os.rename)

    def save(obj, f, *args, **kwargs):
        calls.saves.append(_absolute(f))
        return real[0](obj, f, *args, **kwargs)

    def load(f, *args, **kwargs):
        calls.loads.append(dict(kwargs))
        return real[2](f, *args, **kwargs)

    def named(name, move):
        def named_move(src, dst, *args, **kwargs):
            calls.calling = name
            try:
                return move(src, dst, *args, **kwargs)
            finally:
                calls.calling = ""

        return named_move

    def listen(event, args):
        if event == "os.rename":
            calls.moves.append((_absolute(args[0]), _absolute(args[1])))
            calls.movers.append(calls.calling or "a rename")
        else:
            calls.removes.append(_absolute(args[0]))

    torch.save = torch.serialization.save = save
    torch.load = torch.serialization.load = load
    os.replace, os.rename = named("os.replace", real[4]), named("os.rename", real[5])
    try:
        with _listening(listen), _pathlib_through_os():
            yield calls
    finally:
        (
            torch.save,
            torch.serialization.save,
            torch.load,
            torch.serialization.load,
            os.replace,
            os.rename,
        ) = real


class SimulatedDiskFull(OSError):
    """The error :func:`simulated_failed_write` raises in the middle of a write."""


@contextlib.contextmanager
def simulated_failed_write(fraction: float = 0.5):
    """Inside this block ``torch.save`` writes the first ``fraction`` of its bytes, then fails (disk full).

    That is what an interrupted save does (disk full, job killed, node lost). An atomic save survives it: the
    bytes went into a temporary file, and the old checkpoint was never opened.
    """
    real_save, real_serialization_save = torch.save, torch.serialization.save

    def failing_save(obj, f, *args, **kwargs):
        buffer = io.BytesIO()
        real_save(obj, buffer, *args, **kwargs)
        data = buffer.getvalue()[: max(1, int(len(buffer.getvalue()) * fraction))]
        if isinstance(f, (str, bytes, os.PathLike)):
            with open(f, "wb") as handle:
                handle.write(data)
        else:
            f.write(data)
        raise SimulatedDiskFull(
            errno.ENOSPC, "No space left on device (simulated halfway through torch.save)"
        )

    torch.save = torch.serialization.save = failing_save
    try:
        yield
    finally:
        torch.save, torch.serialization.save = real_save, real_serialization_save


class SimulatedCrash(BaseException):
    """What :func:`simulated_crash_before_move` raises where the process would have died.

    A BaseException, like the KeyboardInterrupt or SystemExit that end a process: ``finally`` blocks and
    ``except BaseException`` run, ``except OSError`` fallbacks (such as shutil.move's copy) do not.
    """


@contextlib.contextmanager
def simulated_crash_before_move():
    """Inside this block every rename (os.replace, os.rename, pathlib, shutil.move) fails before doing
    anything, as if the process died right before the final rename of a save.

    Whatever the save did before that moment stays done. With ``os.replace(temporary, path)`` that is nothing
    visible: the old checkpoint is still at ``path``. With ``os.remove(path)`` followed by
    ``os.rename(temporary, path)`` the old checkpoint is already gone and the new one never arrives: a crash
    between the two calls leaves no checkpoint at all.
    """

    def crash(event, args):
        if event == "os.rename":
            raise SimulatedCrash("process killed right before the rename (simulated)")

    with _listening(crash):
        yield
