"""Lesson 06: checkpoints that a mixed-precision run can resume from bit for bit, and roll back to when it goes wrong.

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
  policy is a *change* of the experiment, so :func:`load_checkpoint` reports it and refuses by default.

Writes are atomic: the payload goes to a temporary file in the same folder, is flushed to disk, then
``os.replace`` renames it over the old checkpoint. A rename within one file system is atomic, so a save that
is interrupted (disk full, killed job) leaves the previous checkpoint intact instead of a truncated file.

Loads are safe: the payload contains only plain data (dicts, lists, tensors, Python numbers, strings), so
it loads with ``torch.load(..., weights_only=True)`` on every torch from 2.4 (where the default was
``False``) to 2.6+ (where it became ``True``); nothing in the file can run code. Every part is validated
against the model, optimizer and scaler *before* anything is applied, and if applying fails halfway the
previous state is put back: a failed load changes nothing.

Rollback: :class:`Watchdog` turns "this run has gone wrong" into explicit triggers (non-finite loss or
outputs, quality below the lesson-04 :class:`~amp_lessons.validation.Criteria`, the scaler skipping many
steps in a row, i.e. no updates happening), and :func:`save_incident` stores the batch, step and reason
that triggered it for later debugging (lesson 05's tools).
"""

from __future__ import annotations

import contextlib
import copy
import errno
import io
import math
import os
import random
import zipfile
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
import torch

from amp_lessons.environment import dtype_name
from amp_lessons.utils import atomic_write, step_was_skipped
from amp_lessons.validation import judge_quality

FORMAT = "amp_lessons.checkpoint"
INCIDENT_FORMAT = "amp_lessons.incident"
VERSION = 1
PARTS = ("model", "optimizer", "scaler", "rng")
SECTIONS = ("format", "version", "step", "config", "model", "optimizer", "scaler", "rng")

__all__ = [
    "CheckpointError",
    "PARTS",
    "Resumed",
    "Trigger",
    "Watchdog",
    "atomic_torch_save",
    "bitwise_report",
    "capture_rng",
    "describe_checkpoint",
    "load_checkpoint",
    "load_incident",
    "normalize_config",
    "read_checkpoint",
    "restore_rng",
    "save_checkpoint",
    "save_incident",
    "simulated_failed_write",
    "state_fingerprint",
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
    raise ValueError(f"config['dtype'] must be a torch dtype such as torch.float16 (or its name); got {dtype!r}.")


def _is_plain(value) -> bool:
    if value is None or isinstance(value, (bool, int, float, str)):
        return True
    if isinstance(value, (list, tuple)):
        return all(_is_plain(v) for v in value)
    if isinstance(value, Mapping):
        return all(isinstance(k, str) and _is_plain(v) for k, v in value.items())
    return False


def _digest(value) -> str:
    """SHA-256 over the structure and every byte of ``value`` (dicts by sorted key, tensors by dtype, shape, bytes).

    torch.save's zip archive does not notice flipped bytes inside tensor data (they load as wrong numbers),
    so a checkpoint carries this digest of its own payload and a load recomputes it.
    """
    import hashlib

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
            f"config must be a dict such as {{'dtype': 'float16', 'fp32_regions': ['head']}}; got {type(config).__name__}."
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
        elif _is_plain(value):
            plain[key] = copy.deepcopy(list(value) if isinstance(value, tuple) else value)
        else:
            raise TypeError(
                f"config[{key!r}] is a {type(value).__name__}; keep the config to numbers, strings, booleans, None "
                "and lists/dicts of those, so the checkpoint stays loadable with weights_only=True."
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
        "python": {"version": int(version), "internal": torch.tensor(internal, dtype=torch.int64), "gauss": gauss},
        "numpy": {"kind": str(kind), "keys": torch.from_numpy(np.asarray(keys, dtype=np.int64).copy()),
                  "pos": int(pos), "has_gauss": int(has_gauss), "cached_gaussian": float(cached)},
        "torch": torch.get_rng_state(),
        "cuda": [],
    }
    if torch.cuda.is_available():
        state["cuda"] = [s.cpu() for s in torch.cuda.get_rng_state_all()]
    return state


def _validate_rng(rng) -> list[str]:
    problems = []
    if not isinstance(rng, Mapping):
        return [f"'rng' is a {type(rng).__name__}, not a dict of generator states"]
    py = rng.get("python")
    if not (isinstance(py, Mapping) and isinstance(py.get("internal"), torch.Tensor) and py["internal"].numel() == 625
            and isinstance(py.get("version"), int) and (py.get("gauss") is None or isinstance(py.get("gauss"), float))):
        problems.append("rng['python'] is missing or malformed (expected version, 625 ints, gauss)")
    npy = rng.get("numpy")
    if not (isinstance(npy, Mapping) and isinstance(npy.get("keys"), torch.Tensor) and npy["keys"].numel() == 624
            and all(k in npy for k in ("kind", "pos", "has_gauss", "cached_gaussian"))):
        problems.append("rng['numpy'] is missing or malformed (expected kind, 624 keys, pos, has_gauss, cached_gaussian)")
    cpu = rng.get("torch")
    if not (isinstance(cpu, torch.Tensor) and cpu.dtype == torch.uint8 and cpu.numel() == torch.get_rng_state().numel()):
        problems.append("rng['torch'] is missing or is not a CPU generator state (a uint8 tensor of the right size)")
    cuda = rng.get("cuda", [])
    if not (isinstance(cuda, (list, tuple)) and all(isinstance(s, torch.Tensor) and s.dtype == torch.uint8 for s in cuda)):
        problems.append("rng['cuda'] must be a list of uint8 tensors (one per GPU)")
    return problems


def restore_rng(state: dict) -> list[str]:
    """Put back the generator states from :func:`capture_rng`; returns notes (e.g. CUDA states not applied)."""
    notes = []
    py = state["python"]
    random.setstate((py["version"], tuple(int(v) for v in py["internal"].tolist()), py["gauss"]))
    npy = state["numpy"]
    np.random.set_state((npy["kind"], npy["keys"].numpy().astype(np.uint32), int(npy["pos"]),
                         int(npy["has_gauss"]), float(npy["cached_gaussian"])))
    torch.set_rng_state(state["torch"].cpu())
    cuda = list(state.get("cuda") or [])
    if cuda:
        if not torch.cuda.is_available():
            notes.append(f"the checkpoint has {len(cuda)} CUDA RNG state(s) but no GPU is visible here: not restored")
        elif len(cuda) != torch.cuda.device_count():
            notes.append(f"the checkpoint has {len(cuda)} CUDA RNG state(s) but {torch.cuda.device_count()} GPU(s) "
                         "are visible: CUDA RNG not restored, GPU random numbers will differ")
        else:
            torch.cuda.set_rng_state_all([s.cpu() for s in cuda])
    elif torch.cuda.is_available():
        notes.append("the checkpoint was saved without a GPU: CUDA RNG states not restored")
    return notes


# ----------------------------------------------------------------------------------------------- save


def atomic_torch_save(payload, path) -> str:
    """``torch.save`` through :func:`amp_lessons.utils.atomic_write`: the old checkpoint survives any failure."""
    return atomic_write(path, lambda handle: torch.save(payload, handle))


def _check_objects(model, optimizer, scaler) -> None:
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model must be a torch.nn.Module; got {type(model).__name__}.")
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(f"optimizer must be a torch.optim.Optimizer; got {type(optimizer).__name__}.")
    if not (hasattr(scaler, "state_dict") and hasattr(scaler, "load_state_dict") and hasattr(scaler, "is_enabled")):
        raise TypeError(f"scaler must be a torch.amp.GradScaler; got {type(scaler).__name__}.")


def save_checkpoint(path, model, optimizer, scaler, step: int, config) -> str:
    """Atomically save everything the loop consumes (see the module docstring); returns the absolute path.

    ``step`` is the number of the next step to run (the count of steps done). ``config`` holds at least the
    autocast ``dtype`` and the ``fp32_regions``.
    """
    _check_objects(model, optimizer, scaler)
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
    payload["checksum"] = _digest(payload)
    return atomic_torch_save(payload, path)


# ----------------------------------------------------------------------------------------------- read


def _first_line(exc: BaseException) -> str:
    """The informative line of a torch.load error (for weights_only refusals: the offending global)."""
    text = str(exc)
    marker = text.find("Unsupported global")
    if marker >= 0:
        return text[marker:].splitlines()[0].split(" was not")[0]
    return (text.strip().splitlines() or [type(exc).__name__])[0]


def read_checkpoint(path, expect_format: str = FORMAT) -> dict:
    """Load a checkpoint file as plain data (``weights_only=True``), or raise :class:`CheckpointError` naming the problem."""
    path = os.fspath(path)
    if not os.path.exists(path):
        raise CheckpointError(f"No checkpoint at {path}: the file does not exist.")
    if os.path.isdir(path):
        raise CheckpointError(f"{path} is a folder, not a checkpoint file.")
    size = os.path.getsize(path)
    if size == 0:
        raise CheckpointError(f"{path} is empty (0 bytes): a save was interrupted before writing anything. "
                              "Use the previous checkpoint.")
    with open(path, "rb") as handle:
        head = handle.read(4)
    if head[:2] != b"PK":
        raise CheckpointError(f"{path} is not a torch.save file (it starts with {head!r}, not a zip archive "
                              "header): corrupt, or a different kind of file.")
    if not zipfile.is_zipfile(path):
        raise CheckpointError(f"{path} is truncated ({size} bytes, the end of the archive is missing): an "
                              "interrupted, non-atomic save leaves exactly this. Use the previous checkpoint.")
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:
        first = _first_line(exc)
        if "weights_only" in str(exc).lower() or "unsupported global" in str(exc).lower():
            raise CheckpointError(
                f"{path} contains objects that are not plain data, so torch.load(weights_only=True) refuses it "
                f"({first}). A course checkpoint holds only dicts, lists, tensors and numbers; unpickling "
                "anything else could run code from the file."
            ) from None
        raise CheckpointError(f"{path} is corrupt: torch.load failed with {type(exc).__name__}: {first}") from None
    if not isinstance(payload, Mapping) or payload.get("format") != expect_format:
        found = sorted(map(str, payload))[:8] if isinstance(payload, Mapping) else type(payload).__name__
        raise CheckpointError(f"{path} is not a file written by amp_lessons ({expect_format}); it holds {found}.")
    if payload.get("version") != VERSION:
        raise CheckpointError(f"{path} has format version {payload.get('version')!r}; this course reads version {VERSION}.")
    payload = dict(payload)
    checksum = payload.pop("checksum", None)
    if checksum != _digest(payload):
        raise CheckpointError(f"{path} is corrupt: its contents do not match the checksum written with them "
                              "(bytes changed on disk or in transfer)." if checksum else
                              f"{path} has no checksum, so its integrity cannot be verified.")
    return payload


def _shape(t) -> str:
    return "x".join(map(str, t.shape)) or "scalar"


def _validate_model(payload, model) -> list[str]:
    saved = payload.get("model")
    if not isinstance(saved, Mapping):
        return ["the 'model' section is missing or not a state_dict"]
    current = model.state_dict()
    problems = []
    missing = [k for k in current if k not in saved]
    unexpected = [k for k in saved if k not in current]
    if missing:
        problems.append(f"model: the checkpoint lacks {missing[:5]}{' ...' if len(missing) > 5 else ''}")
    if unexpected:
        problems.append(f"model: the checkpoint has entries this model does not: {unexpected[:5]}")
    for key, tensor in current.items():
        if key not in saved:
            continue  # reported as missing above
        value = saved[key]
        if not isinstance(value, torch.Tensor):
            problems.append(f"model: {key} is a {type(value).__name__}, not a tensor")
        elif value.shape != tensor.shape:
            problems.append(f"model: {key} has shape {_shape(value)} in the checkpoint, {_shape(tensor)} in this model")
        elif value.dtype != tensor.dtype:
            problems.append(f"model: {key} is {value.dtype} in the checkpoint, {tensor.dtype} in this model")
        elif value.is_floating_point() and not bool(torch.isfinite(value).all()):
            problems.append(f"model: {key} contains NaN/inf: this is not a good checkpoint to resume from")
    return problems


def _validate_optimizer(payload, optimizer) -> list[str]:
    saved = payload.get("optimizer")
    if not (isinstance(saved, Mapping) and isinstance(saved.get("state"), Mapping)
            and isinstance(saved.get("param_groups"), list)):
        return ["the 'optimizer' section is missing or not an optimizer state_dict"]
    groups = optimizer.param_groups
    if len(saved["param_groups"]) != len(groups):
        return [f"optimizer: {len(saved['param_groups'])} param group(s) in the checkpoint, {len(groups)} here"]
    problems, params = [], []
    for index, (old, new) in enumerate(zip(saved["param_groups"], groups)):
        if not isinstance(old, Mapping) or not isinstance(old.get("params"), list):
            return [f"optimizer: param group {index} is malformed"]
        if len(old["params"]) != len(new["params"]):
            problems.append(f"optimizer: group {index} has {len(old['params'])} parameters in the checkpoint, "
                            f"{len(new['params'])} here")
        # Newer torch versions add hyperparameters (defaults fill them in on load), so only keys this
        # optimizer does not know at all point to a different optimizer class.
        foreign = sorted(set(old) - set(new))
        if foreign:
            problems.append(f"optimizer: group {index} has hyperparameters {foreign} that this "
                            f"{type(optimizer).__name__} does not have: the checkpoint is from a different optimizer")
        params.extend(zip(old["params"], new["params"]))
    if problems:
        return problems
    by_id = dict(params)
    for param_id, state in saved["state"].items():
        if param_id not in by_id or not isinstance(state, Mapping):
            problems.append(f"optimizer: state for unknown parameter {param_id!r}")
            continue
        param = by_id[param_id]
        for name, value in state.items():
            if isinstance(value, torch.Tensor) and value.dim() > 0 and value.shape != param.shape:
                problems.append(f"optimizer: state {name!r} of parameter {param_id} has shape {_shape(value)}, "
                                f"the parameter {_shape(param)}")
            elif isinstance(value, torch.Tensor) and value.is_floating_point() and not bool(torch.isfinite(value).all()):
                problems.append(f"optimizer: state {name!r} of parameter {param_id} contains NaN/inf")
    return problems


def _validate_scaler(payload, scaler) -> list[str]:
    saved = payload.get("scaler")
    if not isinstance(saved, Mapping):
        return ["the 'scaler' section is missing or not a GradScaler state_dict"]
    if not scaler.is_enabled():
        return []
    if not saved:
        return ["scaler: the checkpoint was saved with a disabled GradScaler (no scale in it), but this scaler is "
                "enabled: the precision policy differs (e.g. bfloat16 then, float16 now)"]
    needed = ("scale", "growth_factor", "backoff_factor", "growth_interval", "_growth_tracker")
    missing = [k for k in needed if k not in saved]
    if missing:
        return [f"scaler: the state lacks {missing}"]
    scale = saved["scale"]
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not math.isfinite(scale) or scale <= 0:
        return [f"scaler: the saved scale {scale!r} is not a finite positive number"]
    return []


@dataclass
class Resumed:
    """What :func:`load_checkpoint` restored. Unpacks as ``step, config = load_checkpoint(...)``."""

    path: str
    step: int
    config: dict
    changes: list = field(default_factory=list)
    compared: bool = False
    parts: tuple = PARTS
    notes: list = field(default_factory=list)

    @property
    def is_continuation(self) -> bool:
        """True only when the current config was given, matches the saved one, and every part was restored."""
        return self.compared and not self.changes and tuple(self.parts) == PARTS

    def __iter__(self):
        return iter((self.step, self.config))

    def __str__(self) -> str:
        policy = f"dtype {self.config.get('dtype')}, FP32 regions {self.config.get('fp32_regions') or 'none'}"
        if self.changes:
            head = (f"Loaded step {self.step} from {self.path} as a CHANGE, not a continuation:\n  "
                    + "\n  ".join(self.changes)
                    + "\n  Judge the changed run against the reference again (lesson 04) before trusting it.")
        elif not self.compared:
            head = (f"Loaded step {self.step} from {self.path} ({policy}); the current config was not given, "
                    "so this load does not claim to be a continuation.")
        else:
            head = f"Resumed at step {self.step} from {self.path}: same config ({policy})."
        skipped = [p for p in PARTS if p not in self.parts]
        if skipped:
            head += f"\n  NOT restored (on request): {', '.join(skipped)}."
        return head + "".join(f"\n  note: {n}" for n in self.notes)

    __repr__ = __str__


def load_checkpoint(path, model, optimizer, scaler, *, config=None, allow_policy_change: bool = False,
                    parts=PARTS) -> Resumed:
    """Validate the checkpoint at ``path`` against these objects, then restore it into them.

    - Everything is checked before anything is applied; a problem raises :class:`CheckpointError` that names
      it, and model, optimizer, scaler and RNG are left exactly as they were.
    - ``config``: the configuration the run is *about to use*. When it differs from the saved one the load is
      a precision-policy change: refused unless ``allow_policy_change=True``, and then reported as a change.
    - ``parts``: which of ``("model", "optimizer", "scaler", "rng")`` to restore (the lesson leaves one out on
      purpose to show what breaks; a real resume restores all of them).
    """
    _check_objects(model, optimizer, scaler)
    unknown = [p for p in parts if p not in PARTS]
    if unknown or isinstance(parts, str):
        raise ValueError(f"parts must be a subset of {PARTS}; got {parts!r}.")
    payload = read_checkpoint(path)
    problems = []
    for section in SECTIONS:
        if section not in payload:
            problems.append(f"the '{section}' section is missing")
    step = payload.get("step")
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        problems.append(f"the step counter is {step!r}, not a non-negative integer")
    try:
        saved_config = normalize_config(payload.get("config"))
    except (TypeError, ValueError) as exc:
        problems.append(f"the config is unusable ({exc})")
        saved_config = {}
    if not problems:
        if "model" in parts:
            problems += _validate_model(payload, model)
        if "optimizer" in parts:
            problems += _validate_optimizer(payload, optimizer)
        if "scaler" in parts:
            problems += _validate_scaler(payload, scaler)
        if "rng" in parts:
            problems += _validate_rng(payload.get("rng"))
    if problems:
        shown = problems[:8] + ([f"... and {len(problems) - 8} more"] if len(problems) > 8 else [])
        raise CheckpointError(f"{path} does not match this run; nothing was changed:\n  - " + "\n  - ".join(shown))
    changes = config_changes(saved_config, config) if config is not None else []
    if changes and not allow_policy_change:
        raise CheckpointError(
            f"{path} was saved with a different configuration; nothing was changed:\n  - " + "\n  - ".join(changes)
            + "\nResuming would not continue the same run. If you mean to change the precision policy, pass "
              "allow_policy_change=True: the load is then reported as a change, and the new run must be judged "
              "against the reference again."
        )
    backup = (copy.deepcopy(model.state_dict()), copy.deepcopy(optimizer.state_dict()), copy.deepcopy(scaler.state_dict()),
              capture_rng())
    notes = []
    try:
        if "model" in parts:
            model.load_state_dict(payload["model"])
        if "optimizer" in parts:
            optimizer.load_state_dict(payload["optimizer"])
        if "scaler" in parts:
            if scaler.is_enabled():
                scaler.load_state_dict(payload["scaler"])
            elif payload["scaler"]:
                notes.append("this GradScaler is disabled: the saved scale was not applied")
        if "rng" in parts:
            notes += restore_rng(payload["rng"])
    except Exception as exc:
        model.load_state_dict(backup[0])
        optimizer.load_state_dict(backup[1])
        if scaler.is_enabled() and backup[2]:
            scaler.load_state_dict(backup[2])
        restore_rng(backup[3])
        raise CheckpointError(f"{path}: restoring failed ({type(exc).__name__}: {exc}); the previous state was put back.") from None
    return Resumed(os.fspath(path), int(step), saved_config, changes, config is not None, tuple(p for p in PARTS if p in parts), notes)


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
        ("optimizer", f"{len(optimizer['state'])} parameter states with {moments}; hyperparameters of "
                      f"{len(optimizer['param_groups'])} group(s)", nbytes(optimizer)),
        ("scaler", (f"scale={scaler['scale']}, growth tracker={scaler['_growth_tracker']}" if scaler
                    else "disabled scaler (no state)"), nbytes(scaler)),
        ("rng", f"python, numpy, torch CPU, {len(rng['cuda'])} CUDA device(s)", nbytes(rng)),
    ]
    table = pd.DataFrame(rows, columns=["section", "contents", "bytes"]).set_index("section")
    table.attrs["file bytes"] = os.path.getsize(path)
    return table


def bitwise_report(reference, resumed, reference_losses, resumed_losses):
    """Compare two runs bit for bit: ``reference``/``resumed`` are ``(model, optimizer, scaler)`` triples.

    One row per model parameter/buffer, then the optimizer state, the GradScaler state and the losses, each with
    ``torch.equal`` (bitwise, no tolerance) and the largest absolute difference. Losses are ``{step: loss}``
    dicts or lists in step order.
    """
    import pandas as pd

    (model_a, optimizer_a, scaler_a), (model_b, optimizer_b, scaler_b) = reference, resumed
    rows = []

    def row(what, a, b):
        a, b = a.detach().cpu(), b.detach().cpu()
        same = a.shape == b.shape and a.dtype == b.dtype and torch.equal(a, b)
        if a.shape != b.shape:
            diff = math.nan
        elif a.is_floating_point():
            diff = float((a.double() - b.double()).abs().max()) if a.numel() else 0.0
        else:
            diff = float((a.long() - b.long()).abs().max()) if a.numel() else 0.0
        rows.append((what, _shape(a), same, diff))

    state_b = model_b.state_dict()
    for name, tensor in model_a.state_dict().items():
        row(f"model: {name}", tensor, state_b[name])
    opt_a, opt_b = optimizer_a.state_dict()["state"], optimizer_b.state_dict()["state"]
    keys = sorted({key for state in list(opt_a.values()) + list(opt_b.values()) for key in state})
    for key in keys:  # one row per kind of optimizer state (e.g. exp_avg), over all parameters
        pairs = [(opt_a.get(i, {}).get(key), opt_b.get(i, {}).get(key)) for i in sorted(set(opt_a) | set(opt_b))]
        complete = all(isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) for a, b in pairs)
        if complete and all(a.shape == b.shape for a, b in pairs):
            flat_a = torch.cat([a.detach().cpu().double().reshape(-1) for a, _ in pairs])
            flat_b = torch.cat([b.detach().cpu().double().reshape(-1) for _, b in pairs])
            same = all(a.dtype == b.dtype and torch.equal(a.cpu(), b.cpu()) for a, b in pairs)
            diff = float((flat_a - flat_b).abs().max()) if flat_a.numel() else 0.0
            rows.append((f"optimizer: {key}", f"{len(pairs)} tensors", same, diff))
        else:
            rows.append((f"optimizer: {key}", "missing on one side", False, math.nan))
    scale_a, scale_b = scaler_a.state_dict(), scaler_b.state_dict()
    rows.append(("GradScaler state", f"scale {scale_a.get('scale')} vs {scale_b.get('scale')}", scale_a == scale_b,
                 abs(scale_a.get("scale", 0) - scale_b.get("scale", 0))))

    def as_list(losses):
        return [losses[k] for k in sorted(losses)] if isinstance(losses, Mapping) else list(losses)

    la, lb = as_list(reference_losses), as_list(resumed_losses)
    if len(la) == len(lb) and la:
        row(f"losses ({len(la)} steps)", torch.stack([torch.as_tensor(v).float() for v in la]),
            torch.stack([torch.as_tensor(v).float() for v in lb]))
    else:
        rows.append(("losses", f"{len(la)} vs {len(lb)} steps", False, math.nan))
    return pd.DataFrame(rows, columns=["compared", "shape", "torch.equal", "max |difference|"])


def state_fingerprint(model, optimizer, scaler) -> str:
    """A short hash of model, optimizer and scaler state: equal before and after means nothing changed."""
    return _digest([model.state_dict(), optimizer.state_dict(), scaler.state_dict()])[:12]


# ------------------------------------------------------------------------------------- failure injection


class SimulatedDiskFull(OSError):
    """The error :func:`simulated_failed_write` raises in the middle of a write."""


@contextlib.contextmanager
def simulated_failed_write(fraction: float = 0.5):
    """Inside this block ``torch.save`` writes the first ``fraction`` of its bytes, then fails like a full disk.

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
        raise SimulatedDiskFull(errno.ENOSPC, "No space left on device (simulated halfway through torch.save)")

    torch.save = torch.serialization.save = failing_save
    try:
        yield
    finally:
        torch.save, torch.serialization.save = real_save, real_serialization_save


# ------------------------------------------------------------------------------------------- rollback


NONFINITE = "non-finite"
LOW_QUALITY = "quality below criteria"
NO_UPDATES = "no updates"


@dataclass
class Trigger:
    """Why a run must roll back: the step it happened at, one of the reasons above, and the evidence."""

    step: int
    reason: str
    detail: str

    def __str__(self) -> str:
        return f"step {self.step}: {self.reason} — {self.detail}"


class Watchdog:
    """Decides after each step (and each evaluation) whether the run must roll back to its last good checkpoint.

    Triggers:
    - **non-finite**: the loss (or the outputs, when given) contains NaN/inf. GradScaler already skipped that
      update, but something in the data or the model is broken, and the scale was cut;
    - **quality below criteria**: an evaluation falls below ``criteria.min_quality`` (a lesson-04
      :class:`~amp_lessons.validation.Criteria`) or below a plain ``min_quality``;
    - **no updates**: the scaler skipped ``max_skipped_in_a_row`` steps in a row. A skip shows as the scale
      going *down* after ``scaler.update()`` (it backs off exactly when it found inf/NaN gradients). A few skips
      at the start of a run are normal (the scale backs off to fit); a long streak means training has stopped.
    """

    def __init__(self, *, criteria=None, min_quality: float | None = None, max_skipped_in_a_row: int = 6):
        if criteria is not None and min_quality is not None:
            raise ValueError("Give either criteria (lesson 04's Criteria) or min_quality, not both.")
        if criteria is not None and not hasattr(criteria, "min_quality"):
            raise TypeError(f"criteria must be an amp_lessons.validation.Criteria; got {type(criteria).__name__}.")
        if min_quality is not None and not (isinstance(min_quality, (int, float)) and 0 <= min_quality <= 1):
            raise ValueError(f"min_quality is a fraction between 0 and 1; got {min_quality!r}.")
        if isinstance(max_skipped_in_a_row, bool) or not isinstance(max_skipped_in_a_row, int) or max_skipped_in_a_row < 1:
            raise ValueError(f"max_skipped_in_a_row must be a positive integer; got {max_skipped_in_a_row!r}.")
        self.criteria = criteria
        self.min_quality = min_quality
        self.max_skipped_in_a_row = max_skipped_in_a_row
        self.skipped_in_a_row = 0

    def reset(self) -> None:
        """Forget the skip streak (call it after a rollback)."""
        self.skipped_in_a_row = 0

    def after_step(self, step: int, loss, *, scale_before: float | None = None, scale_after: float | None = None,
                   outputs=None) -> Trigger | None:
        """Check one finished step; returns a :class:`Trigger` or None."""
        for name, value in (("loss", loss), ("outputs", outputs)):
            if value is None:
                continue
            tensor = torch.as_tensor(value).detach()
            bad = int((~torch.isfinite(tensor)).sum()) if tensor.is_floating_point() else 0
            if bad:
                return Trigger(step, NONFINITE, f"the {name} has {bad} NaN/inf value(s)" + (
                    f" (loss = {float(tensor.reshape(-1)[0])})" if name == "loss" and tensor.numel() == 1 else ""))
        if scale_before is not None and scale_after is not None:
            if step_was_skipped(scale_before, scale_after):
                self.skipped_in_a_row += 1
            else:
                self.skipped_in_a_row = 0
            if self.skipped_in_a_row >= self.max_skipped_in_a_row:
                return Trigger(step, NO_UPDATES, f"the scaler skipped {self.skipped_in_a_row} steps in a row "
                                                 f"(scale now {scale_after:g}): the weights are not being updated")
        return None

    def after_evaluation(self, step: int, quality: float) -> Trigger | None:
        """Check a quality measurement (e.g. accuracy on a fixed validation set) against the criteria."""
        if self.criteria is not None:
            ok, message = judge_quality(quality, self.criteria)
            return None if ok else Trigger(step, LOW_QUALITY, message)
        if self.min_quality is not None:
            value = float(quality)
            if math.isnan(value) or value < self.min_quality:
                return Trigger(step, LOW_QUALITY, f"quality {value:.1%} is below the minimum {self.min_quality:.1%}")
        return None


def save_incident(folder, trigger: Trigger, inputs, targets, *, config=None, extra=None) -> str:
    """Store the case that triggered a rollback (batch, step, reason) as a small weights_only-loadable file.

    Returns the path, ``incident_step<step>_<reason>.pt`` in ``folder``. Reload it with :func:`load_incident`
    and replay the batch with lesson 05's tools.
    """
    if not isinstance(trigger, Trigger):
        raise TypeError(f"trigger must be a Trigger from Watchdog; got {type(trigger).__name__}.")
    extra = dict(extra or {})
    if not _is_plain({k: v for k, v in extra.items() if not isinstance(v, torch.Tensor)}):
        raise TypeError("extra may hold tensors, numbers, strings, booleans, None and lists/dicts of those.")
    payload = {
        "format": INCIDENT_FORMAT,
        "version": VERSION,
        "step": int(trigger.step),
        "reason": trigger.reason,
        "detail": trigger.detail,
        "inputs": torch.as_tensor(inputs).detach().cpu().clone(),
        "targets": torch.as_tensor(targets).detach().cpu().clone(),
        "config": normalize_config(config) if config is not None else {},
        "extra": {k: (v.detach().cpu().clone() if isinstance(v, torch.Tensor) else v) for k, v in extra.items()},
        "torch_version": str(torch.__version__),
    }
    payload["checksum"] = _digest(payload)
    slug = "".join(ch if ch.isalnum() else "-" for ch in trigger.reason).strip("-")
    return atomic_torch_save(payload, os.path.join(os.fspath(folder), f"incident_step{trigger.step:06d}_{slug}.pt"))


def load_incident(path) -> dict:
    """Read back an incident written by :func:`save_incident` (plain data, ``weights_only=True``)."""
    return read_checkpoint(path, expect_format=INCIDENT_FORMAT)
