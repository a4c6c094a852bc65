"""Lesson 06: put a checkpoint back into a live run, safely, and prove the resume is bit for bit.

:func:`load_checkpoint` reads a file written by :func:`amp_lessons.l06_checkpoint_and_rollback.save_checkpoint` and
validates every part against the model, optimizer and scaler *before* anything is applied (shapes, dtypes,
optimizer class, a finite scale, well-formed RNG states); if applying fails halfway the previous state is
put back: a failed load changes nothing. A load under a different precision policy (another autocast
dtype, other FP32 regions) is a *change* of the experiment, not a continuation: it is refused unless asked
for, and then reported as a change.

:func:`bitwise_report` is the proof that a resume is a continuation: two runs compared with
``torch.equal`` (no tolerance), part by part.
"""

from __future__ import annotations

import copy
import functools
import math
import os
import random
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
import torch

from amp_lessons.core.environment import dtype_name, probe_autocast
from amp_lessons.core.models import SensorClassifier, sensor_readings
from amp_lessons.l03_autocast_and_gradscaler.training import train_step
from amp_lessons.l06_checkpoint_and_rollback.checkpoint import (
    PARTS,
    SECTIONS,
    CheckpointError,
    capture_rng,
    config_changes,
    normalize_config,
    read_checkpoint,
    restore_rng,
    validate_run_objects,
)

__all__ = [
    "Resumed",
    "bitwise_report",
    "bitwise_summary",
    "load_checkpoint",
    "probe_config",
    "probe_dtype",
    "probe_run",
    "probe_steps",
]


def _tensor_of(value, numel: int) -> bool:
    return isinstance(value, torch.Tensor) and value.numel() == numel


def _validate_rng(rng) -> list[str]:
    """The shapes :func:`~amp_lessons.l06_checkpoint_and_rollback.checkpoint.capture_rng` writes, checked before any state is set."""
    problems = []
    if not isinstance(rng, Mapping):
        return [f"'rng' is a {type(rng).__name__}, not a dict of generator states"]
    py = rng.get("python")
    if not (
        isinstance(py, Mapping)
        and _tensor_of(py.get("internal"), 625)
        and isinstance(py.get("version"), int)
        and (py.get("gauss") is None or isinstance(py.get("gauss"), float))
    ):
        problems.append("rng['python'] is missing or malformed (expected version, 625 ints, gauss)")
    npy = rng.get("numpy")
    if not (
        isinstance(npy, Mapping)
        and _tensor_of(npy.get("keys"), 624)
        and all(k in npy for k in ("kind", "pos", "has_gauss", "cached_gaussian"))
    ):
        problems.append(
            "rng['numpy'] is missing or malformed (expected kind, 624 keys, pos, has_gauss, cached_gaussian)"
        )
    cpu = rng.get("torch")
    if not (_tensor_of(cpu, torch.get_rng_state().numel()) and cpu.dtype == torch.uint8):
        problems.append(
            "rng['torch'] is missing or is not a CPU generator state (a uint8 tensor of the right size)"
        )
    cuda = rng.get("cuda", [])
    if not (
        isinstance(cuda, (list, tuple))
        and all(isinstance(s, torch.Tensor) and s.dtype == torch.uint8 for s in cuda)
    ):
        problems.append("rng['cuda'] must be a list of uint8 tensors (one per GPU)")
    return problems


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
            problems.append(
                f"model: {key} has shape {_shape(value)} in the checkpoint, {_shape(tensor)} in this model"
            )
        elif value.dtype != tensor.dtype:
            problems.append(f"model: {key} is {value.dtype} in the checkpoint, {tensor.dtype} in this model")
        elif value.is_floating_point() and not bool(torch.isfinite(value).all()):
            problems.append(f"model: {key} contains NaN/inf: this is not a good checkpoint to resume from")
    return problems


def _validate_optimizer(payload, optimizer) -> list[str]:
    saved = payload.get("optimizer")
    if not (
        isinstance(saved, Mapping)
        and isinstance(saved.get("state"), Mapping)
        and isinstance(saved.get("param_groups"), list)
    ):
        return ["the 'optimizer' section is missing or not an optimizer state_dict"]
    groups = optimizer.param_groups
    if len(saved["param_groups"]) != len(groups):
        return [
            f"optimizer: {len(saved['param_groups'])} param group(s) in the checkpoint, {len(groups)} here"
        ]
    problems, params = [], []
    for index, (old, new) in enumerate(zip(saved["param_groups"], groups)):
        if not isinstance(old, Mapping) or not isinstance(old.get("params"), list):
            return [f"optimizer: param group {index} is malformed"]
        if len(old["params"]) != len(new["params"]):
            problems.append(
                f"optimizer: group {index} has {len(old['params'])} parameters in the "
                f"checkpoint, {len(new['params'])} here"
            )
        # Newer torch versions add hyperparameters (defaults fill them in on load), so only keys this
        # optimizer does not know at all point to a different optimizer class.
        foreign = sorted(set(old) - set(new))
        if foreign:
            problems.append(
                f"optimizer: group {index} has hyperparameters {foreign} that this "
                f"{type(optimizer).__name__} does not have: the checkpoint is from a different optimizer"
            )
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
                problems.append(
                    f"optimizer: state {name!r} of parameter {param_id} has shape "
                    f"{_shape(value)}, the parameter {_shape(param)}"
                )
            elif (
                isinstance(value, torch.Tensor)
                and value.is_floating_point()
                and not bool(torch.isfinite(value).all())
            ):
                problems.append(f"optimizer: state {name!r} of parameter {param_id} contains NaN/inf")
    return problems


def _validate_scaler(payload, scaler) -> list[str]:
    saved = payload.get("scaler")
    if not isinstance(saved, Mapping):
        return ["the 'scaler' section is missing or not a GradScaler state_dict"]
    if not scaler.is_enabled():
        return []
    if not saved:
        return [
            "scaler: the checkpoint was saved with a disabled GradScaler (no scale in it), but this "
            "scaler is enabled: the precision policy differs (e.g. bfloat16 then, float16 now)"
        ]
    needed = ("scale", "growth_factor", "backoff_factor", "growth_interval", "_growth_tracker")
    missing = [k for k in needed if k not in saved]
    if missing:
        return [f"scaler: the state lacks {missing}"]
    scale = saved["scale"]
    if (
        isinstance(scale, bool)
        or not isinstance(scale, (int, float))
        or not math.isfinite(scale)
        or scale <= 0
    ):
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
            head = (
                f"Loaded step {self.step} from {self.path} as a CHANGE, not a continuation:\n  "
                + "\n  ".join(self.changes)
                + "\n  Judge the changed run against the reference again (lesson 04) before trusting it."
            )
        elif not self.compared:
            head = (
                f"Loaded step {self.step} from {self.path} ({policy}); the current config was not given, "
                "so this load does not claim to be a continuation."
            )
        else:
            head = f"Resumed at step {self.step} from {self.path}: same config ({policy})."
        skipped = [p for p in PARTS if p not in self.parts]
        if skipped:
            head += f"\n  NOT restored (on request): {', '.join(skipped)}."
        return head + "".join(f"\n  note: {n}" for n in self.notes)

    __repr__ = __str__


def load_checkpoint(
    path, model, optimizer, scaler, *, config=None, allow_policy_change: bool = False, parts=PARTS
) -> Resumed:
    """Validate the checkpoint at ``path`` against these objects, then restore it into them.

    - Everything is checked before anything is applied; a problem raises :class:`CheckpointError` that names
      it, and model, optimizer, scaler and RNG are left exactly as they were.
    - ``config``: the configuration the run is *about to use*. When it differs from the saved one the load is
      a precision-policy change: refused unless ``allow_policy_change=True``, and then reported as a change.
    - ``parts``: which of ``("model", "optimizer", "scaler", "rng")`` to restore (the lesson leaves one out on
      purpose to show what breaks; a real resume restores all of them).
    """
    validate_run_objects(model, optimizer, scaler)
    unknown = [p for p in parts if p not in PARTS]
    if unknown or isinstance(parts, str):
        raise ValueError(f"parts must be a subset of {PARTS}; got {parts!r}.")
    payload = read_checkpoint(path)
    problems, saved_config = _payload_problems(payload, parts, model, optimizer, scaler)
    if problems:
        shown = problems[:8] + ([f"... and {len(problems) - 8} more"] if len(problems) > 8 else [])
        raise CheckpointError(
            f"{path} does not match this run; nothing was changed:\n  - " + "\n  - ".join(shown)
        )
    changes = config_changes(saved_config, config) if config is not None else []
    if changes and not allow_policy_change:
        raise CheckpointError(
            f"{path} was saved with a different configuration; nothing was changed:\n  - "
            + "\n  - ".join(changes)
            + "\nResuming would not continue the same run. If you mean to change the precision policy, "
            "pass allow_policy_change=True: the load is then reported as a change, and the new run must be "
            "judged against the reference again."
        )
    notes = _restore_or_roll_back(path, payload, parts, model, optimizer, scaler)
    restored = tuple(p for p in PARTS if p in parts)
    return Resumed(
        os.fspath(path), int(payload["step"]), saved_config, changes, config is not None, restored, notes
    )


def _payload_problems(payload, parts, model, optimizer, scaler) -> tuple[list[str], dict]:
    """Everything wrong with ``payload`` for these objects (empty when it fits), and its saved config."""
    problems = [f"the '{section}' section is missing" for section in SECTIONS if section not in payload]
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
    return problems, saved_config


def _restore_or_roll_back(path, payload, parts, model, optimizer, scaler) -> list[str]:
    """Apply the validated ``parts``; if anything fails halfway, put the previous state back and raise."""
    backup = (
        copy.deepcopy(model.state_dict()),
        copy.deepcopy(optimizer.state_dict()),
        copy.deepcopy(scaler.state_dict()),
        capture_rng(),
    )
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
        raise CheckpointError(
            f"{path}: restoring failed ({type(exc).__name__}: {exc}); the previous state was put back."
        ) from None
    return notes


def bitwise_report(reference, resumed, reference_losses, resumed_losses):
    """Compare two runs bit for bit: ``reference``/``resumed`` are ``(model, optimizer, scaler)`` triples.

    One row per model parameter/buffer, then the optimizer state, the GradScaler state and the losses, each
    with ``torch.equal`` (bitwise, no tolerance) and the largest absolute difference. Losses are
    ``{step: loss}`` dicts or lists in step order.
    """
    import pandas as pd

    (model_a, optimizer_a, scaler_a), (model_b, optimizer_b, scaler_b) = reference, resumed
    state_b = model_b.state_dict()
    rows = [
        _tensor_row(f"model: {name}", tensor, state_b[name]) for name, tensor in model_a.state_dict().items()
    ]
    rows += _optimizer_rows(optimizer_a.state_dict()["state"], optimizer_b.state_dict()["state"])
    scale_a, scale_b = scaler_a.state_dict(), scaler_b.state_dict()
    rows.append(
        (
            "GradScaler state",
            f"scale {scale_a.get('scale')} vs {scale_b.get('scale')}",
            scale_a == scale_b,
            abs(scale_a.get("scale", 0) - scale_b.get("scale", 0)),
        )
    )
    la, lb = _in_step_order(reference_losses), _in_step_order(resumed_losses)
    if len(la) == len(lb) and la:
        stacked = [torch.stack([torch.as_tensor(v).float() for v in losses]) for losses in (la, lb)]
        rows.append(_tensor_row(f"losses ({len(la)} steps)", *stacked))
    else:
        rows.append(("losses", f"{len(la)} vs {len(lb)} steps", False, math.nan))
    return pd.DataFrame(rows, columns=["compared", "shape", "torch.equal", "max |difference|"])


def bitwise_summary(report):
    """:func:`bitwise_report` in at most one row per part: model, each kind of optimizer state, GradScaler,
    losses. ``torch.equal`` is True for a part only when it holds for every row of that part."""
    import pandas as pd

    part = report["compared"].str.split(":").str[0]
    grouped = report.groupby(part, sort=False)

    def label(name, rows) -> str:
        if len(rows) == 1:
            return rows["compared"].iloc[0]
        items = rows["compared"].str.split(": ", n=1).str[1]
        return f"{name}: {len(rows)} tensors" if name == "model" else f"{name}: {', '.join(items)}"

    return pd.DataFrame(
        {
            "compared": [label(name, rows) for name, rows in grouped],
            "torch.equal": grouped["torch.equal"].all().tolist(),
            "max |difference|": grouped["max |difference|"].max().tolist(),
        }
    )


def _tensor_row(what: str, a: torch.Tensor, b: torch.Tensor) -> tuple:
    """``(what, shape, torch.equal, max |difference|)`` for two tensors (NaN when the shapes differ)."""
    a, b = a.detach().cpu(), b.detach().cpu()
    same = a.shape == b.shape and a.dtype == b.dtype and torch.equal(a, b)
    if a.shape != b.shape:
        diff = math.nan
    elif a.is_floating_point():
        diff = float((a.double() - b.double()).abs().max()) if a.numel() else 0.0
    else:
        diff = float((a.long() - b.long()).abs().max()) if a.numel() else 0.0
    return what, _shape(a), same, diff


def _optimizer_rows(opt_a: Mapping, opt_b: Mapping) -> list:
    """One row per kind of optimizer state (e.g. ``exp_avg``), over all parameters."""
    rows = []
    keys = sorted({key for state in list(opt_a.values()) + list(opt_b.values()) for key in state})
    for key in keys:
        pairs = [
            (opt_a.get(i, {}).get(key), opt_b.get(i, {}).get(key)) for i in sorted(set(opt_a) | set(opt_b))
        ]
        complete = all(isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) for a, b in pairs)
        if complete and all(a.shape == b.shape for a, b in pairs):
            flat_a = torch.cat([a.detach().cpu().double().reshape(-1) for a, _ in pairs])
            flat_b = torch.cat([b.detach().cpu().double().reshape(-1) for _, b in pairs])
            same = all(a.dtype == b.dtype and torch.equal(a.cpu(), b.cpu()) for a, b in pairs)
            diff = float((flat_a - flat_b).abs().max()) if flat_a.numel() else 0.0
            rows.append((f"optimizer: {key}", f"{len(pairs)} tensors", same, diff))
        else:
            rows.append((f"optimizer: {key}", "missing on one side", False, math.nan))
    return rows


def _in_step_order(losses) -> list:
    return [losses[k] for k in sorted(losses)] if isinstance(losses, Mapping) else list(losses)


# ------------------------------------------------------------------------ a run that consumes every generator

PROBE_BATCH = 32


@functools.lru_cache(maxsize=1)
def probe_dtype() -> torch.dtype:
    """float16 where CPU autocast runs it, else bfloat16: the probe run's autocast dtype."""
    return torch.float16 if probe_autocast(torch.device("cpu"), torch.float16)[0] else torch.bfloat16


def probe_config() -> dict:
    return {"dtype": dtype_name(probe_dtype()), "fp32_regions": ["head"], "max_norm": 1.0, "lr": 0.003}


def probe_run(seed: int):
    """Model, optimizer and scaler as a run would create them (different ``seed``s give different weights).

    A resume proof needs a run where every part matters within a few steps: dropout (torch's RNG), AdamW's
    moving averages, and a GradScaler with ``growth_interval=4``, so within 6 steps the scale grows once and
    the tracker reads 2: a scaler that was not restored (scale 1024, tracker 0) is told apart from one that
    was.
    """
    torch.manual_seed(seed)
    model = SensorClassifier(in_features=8, hidden=16, dropout=0.3)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.003)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10, growth_interval=4)
    return model, optimizer, scaler


@functools.lru_cache(maxsize=1)
def _probe_data():
    return sensor_readings(128, seed=5, in_features=8, scale=1.0)


def probe_steps(model, optimizer, scaler, steps: int) -> list:
    """Train ``steps`` steps of the probe run; every step draws from Python's, NumPy's and torch's RNG."""
    readings, labels = _probe_data()
    losses = []
    for _ in range(steps):
        order = list(range(len(readings)))
        random.shuffle(order)  # Python RNG: data order
        index = torch.tensor(order[:PROBE_BATCH])
        noise = np.random.normal(0.0, 0.05, size=(PROBE_BATCH, readings.shape[1])).astype(np.float32)
        inputs = readings[index] + torch.from_numpy(noise)  # NumPy RNG: augmentation; dropout: torch RNG
        losses.append(
            train_step(
                model,
                optimizer,
                scaler,
                torch.nn.functional.cross_entropy,
                inputs,
                labels[index],
                dtype=probe_dtype(),
                max_norm=1.0,
            )
        )
    return losses
