"""Lesson 12: the course's validation protocol on any model, in order — ``validate(recipe)``.

The order is the course's, and it is the point:

1. **criteria first** (lesson 04): without ``criteria`` in the recipe the tool refuses to judge, and it records
   their fingerprint before any trial runs;
2. **the FP32 reference** (lessons 04 and 08): finite (else "fix FP32 first"), its quality, the float32
   precision settings torch ran it under, torch/device/seed; evaluated twice to measure the noise floor (a model
   left in training mode, or nondeterministic kernels, differ between two FP32 passes);
3. **each autocast dtype that works here**: inference judged at both levels with the samples at risk (lesson
   04), a short training trial from the same initial weights with a GradScaler for float16 (lesson 03): the loss
   curve against FP32, skipped steps and the scale history (lesson 05), the gradient underflow share (lesson
   02), and the first non-finite module and tensor when anything is not finite (lesson 05);
4. **speed and memory last, for accepted dtypes only** (lesson 07), measured honestly on this device;
5. a report (``report.json`` and a self-contained ``report.html``) written atomically, also when the run is
   cut short by ``max_seconds`` or Ctrl-C (then marked incomplete).
"""

from __future__ import annotations

import copy
import platform
from pathlib import Path

import torch
from torch import nn

from amp_lessons.core.environment import (
    AUTOCAST_DTYPES,
    dtype_name,
    float32_matmul_settings,
    pick_device,
    probe_autocast,
    reduced_matmul_switches,
    seed_everything,
)
from amp_lessons.l12_your_model_validated import figures, judging, report, runs, speed
from amp_lessons.l12_your_model_validated.recipe import CRITERIA_HOWTO, RecipeError, UsageError, load_recipe

DTYPE_NAMES = {
    "bf16": torch.bfloat16,
    "bfloat16": torch.bfloat16,
    "fp16": torch.float16,
    "float16": torch.float16,
}
DEFAULT_STEPS = 30

__all__ = ["DEFAULT_STEPS", "DTYPE_NAMES", "Validation", "parse_dtypes", "validate"]


def parse_dtypes(names, what: str = "--dtypes") -> list:
    """``["bf16", "float16"]`` -> ``[torch.bfloat16, torch.float16]``; a clear UsageError for anything else."""
    found = []
    for name in names or ():
        dtype = DTYPE_NAMES.get(str(name).strip().lower().replace("torch.", ""))
        if dtype is None:
            raise UsageError(f"{what} takes bf16/fp16 (or bfloat16/float16); got {name!r}.")
        if dtype not in found:
            found.append(dtype)
    return found


class _Run:
    """The state of one validation: what has been measured so far, so a cut-short run still reports it."""

    def __init__(self, recipe, out: Path, device, seed: int, steps: int, max_seconds, progress):
        self.recipe, self.out, self.device, self.seed, self.steps = recipe, out, device, seed, steps
        self.clock = runs.Clock()
        self.max_seconds = max_seconds
        self.bars = report.Progress(progress)
        self.data = report.skeleton(recipe, device, seed, steps, max_seconds)
        self.reports, self.training = {}, {}
        self.reference_run = None

    def expired(self) -> bool:
        return self.max_seconds is not None and self.clock.total > self.max_seconds

    def phase(self, name: str) -> None:
        if self.expired():
            raise _OutOfTime(name)
        self.data["phases"].append({"name": name, "started_at": round(self.clock.total, 3)})


class _OutOfTime(Exception):
    """The run reached ``max_seconds`` before ``phase``."""


def _environment(run: _Run, dtypes) -> dict:
    settings = float32_matmul_settings()
    return {
        "torch": torch.__version__,
        "python": platform.python_version(),
        "device": str(run.device),
        "device_name": torch.cuda.get_device_name(run.device)
        if run.device.type == "cuda"
        else platform.machine(),
        "cpu_threads": torch.get_num_threads(),
        "seed": run.seed,
        "float32_settings": {k: str(v) for k, v in settings.items()},
        "float32_reduced": reduced_matmul_switches(settings, run.device.type),
        "autocast": {dtype_name(d): list(probe_autocast(run.device, d)) for d in AUTOCAST_DTYPES},
        "dtypes_tried": [dtype_name(d) for d in dtypes],
    }


def _build(run: _Run):
    recipe = run.recipe
    seed_everything(run.seed)
    with run.clock.run(run.device):
        model = recipe.call("build_model")
    if not isinstance(model, nn.Module):
        raise RecipeError(
            f"build_model() must return a torch.nn.Module; it returned a {type(model).__name__}."
        )
    low = sorted(
        {
            dtype_name(p.dtype)
            for p in model.parameters()
            if p.is_floating_point() and p.dtype != torch.float32
        }
    )
    if low:
        raise RecipeError(
            f"build_model() returned a model with {', '.join(low)} parameters: return it in FP32 (no .half() or "
            ".to(torch.bfloat16)); autocast chooses the precision per op, the weights stay FP32."
        )
    try:
        return model.to(run.device)
    except Exception as error:
        raise recipe.error_from(error, f"moving the model to {run.device}") from None


def _reference(run: _Run, model, batches):
    """Two FP32 passes: the reference (finite, or stop) and the noise floor between them."""
    bar = run.bars.bar("FP32 reference", 2 * len(batches))
    seed_everything(run.seed)
    first = runs.evaluate(
        run.recipe, model, batches, run.device, None, run.clock, reference=True, tick=bar.update
    )
    bad = (~torch.isfinite(first.scores.reshape(first.scores.shape[0], -1)).all(dim=1)).nonzero().reshape(-1)
    if bad.numel():
        sample = int(first.sample_of_row[int(bad[0])])
        raise RecipeError(
            f"The reference is not finite at sample {sample}: fix FP32 first ({bad.numel()} non-finite row(s) "
            "in the FP32 outputs; nothing can be validated against them)."
        )
    seed_everything(run.seed + 1)
    second = runs.evaluate(
        run.recipe, model, batches, run.device, None, run.clock, reference=True, tick=bar.update
    )
    bar.close()
    noise = float((first.scores - second.scores).abs().max()) if first.scores.numel() else 0.0
    run.data["reference"] = report.reference_entry(first, noise, run.recipe.criteria)
    quality, minimum = run.data["reference"]["quality"], run.recipe.criteria.min_quality
    if quality is not None and minimum is not None and quality < minimum:
        raise RecipeError(
            f"The FP32 reference's quality is {quality:.1%}, below the criteria's minimum {minimum:.1%}: no trial "
            "can pass. Fix FP32 first (train the model further, check the labels), or correct min_quality now, "
            "before any trial has run."
        )
    if noise > 0:
        run.data["warnings"].append(
            f"Two FP32 passes over the same evaluation set differ by up to {noise:.3g}: the reference is not "
            "deterministic (dropout left on? nondeterministic kernels?). Differences of that size are FP32's "
            "own noise, not the precision's."
        )
    return first


def _trial(run: _Run, dtype, model, batches, reference, training_batches) -> None:
    """One dtype's trial. The FP32 runs worked, so an exception raised only under this autocast dtype is this
    dtype's failure (rejected, with the learner's frames in the report), not an unusable recipe."""
    name = dtype_name(dtype)
    try:
        _judge_dtype(run, dtype, model, batches, reference, training_batches)
    except RecipeError as error:
        entry = run.data["dtypes"].setdefault(name, report.not_run(name, ""))
        message = str(error)
        entry["verdict"] = "rejected"
        entry["reason"] = (
            f"{name} is rejected: the model raised an exception under autocast {name} (FP32 ran): {message.splitlines()[-1]}."
        )
        entry["error"] = message
        run.bars.close_all()


def _judge_dtype(run: _Run, dtype, model, batches, reference, training_batches) -> None:
    name = dtype_name(dtype)
    run.phase(f"{name} inference")
    bar = run.bars.bar(f"{name} inference", len(batches))
    evaluation = runs.evaluate(run.recipe, model, batches, run.device, dtype, run.clock, tick=bar.update)
    bar.close()
    lesson04, inference = judging.judge_inference(reference, evaluation, run.recipe.criteria, name)
    run.reports[name] = lesson04
    nonfinite = None
    if evaluation.nonfinite_batch is not None:
        inputs, targets = batches[evaluation.nonfinite_batch]
        found = runs.localise(
            run.recipe,
            model,
            runs.to_device(inputs, run.device),
            runs.to_device(targets, run.device),
            dtype,
            inference=True,
        )
        nonfinite = judging.localised_summary(found)
    entry = {"inference": inference, "training": None, "nonfinite": nonfinite, "speed": None, "error": None}
    run.data["dtypes"][name] = entry
    entry["verdict"], entry["reason"] = "not judged", "the run ended before this dtype's training trial"
    if training_batches:
        run.phase(f"{name} training")
        bar = run.bars.bar(f"{name} training", len(training_batches))
        trial = runs.train(
            run.recipe,
            copy.deepcopy(model),
            training_batches,
            run.device,
            dtype,
            run.seed,
            run.clock,
            tick=bar.update,
            deadline=run.expired,
        )
        bar.close()
        run.training[name] = trial
        entry["training"] = judging.judge_training(
            run.reference_run, trial, run.data["criteria"]["training_tolerance"]
        )
        scale = trial.scales[0] if trial.scales else 1.0
        entry["training"]["underflow_share"] = judging.underflow_share(
            run.reference_run.gradients, dtype, scale
        )
        if nonfinite is None and trial.localised is not None:
            entry["nonfinite"] = judging.localised_summary(trial.localised)
        if trial.interrupted:
            raise _OutOfTime(f"{name} training")
    entry["verdict"], entry["reason"] = judging.verdict(
        name, inference, entry["training"], entry["nonfinite"], run.recipe.criteria
    )


def _training_data(run: _Run, model) -> list:
    if not run.recipe.has("training_batches") or run.steps == 0:
        return []
    batches = run.recipe.batches("training_batches", run.steps)
    if not batches:
        raise RecipeError(
            "training_batches() gave no batches: return at least one (inputs, targets) pair, or "
            "leave training_batches out to judge inference only."
        )
    run.phase("FP32 training")
    bar = run.bars.bar("FP32 training", len(batches))
    run.reference_run = runs.train(
        run.recipe, copy.deepcopy(model), batches, run.device, None, run.seed, run.clock, tick=bar.update
    )
    bar.close()
    if run.reference_run.nonfinite_steps:
        step = run.reference_run.nonfinite_steps[0]
        raise RecipeError(
            f"The FP32 training run is not finite at step {step}: fix FP32 first (lower the "
            "learning rate in optimizer(params), check the data of that batch)."
        )
    run.data["reference"]["training_losses"] = run.reference_run.losses
    return batches


def _protocol(run: _Run, dtypes) -> None:
    """Every phase in order; the state in ``run`` is complete up to the phase that was cut short."""
    run.phase("build the model")
    model = _build(run)
    run.phase("FP32 reference")
    with run.clock.run(run.device):
        batches = run.recipe.batches("evaluation_batches")
    if not batches:
        raise RecipeError(
            "evaluation_batches() gave no batches: the evaluation set is empty. It must yield the "
            "fixed (inputs, targets) pairs the trial is judged on."
        )
    if not runs.same_batches(batches, run.recipe.batches("evaluation_batches")):
        raise RecipeError(
            "evaluation_batches() gave different data on its second call: it must return the same "
            "fixed evaluation set every time (no shuffling; seed any randomness inside it)."
        )
    reference = _reference(run, model, batches)
    training_batches = _training_data(run, model)
    for dtype in dtypes:
        _trial(run, dtype, model, batches, reference, training_batches)
    accepted = [d for d in dtypes if run.data["dtypes"][dtype_name(d)]["verdict"] == "accepted"]
    run.phase("speed and memory")
    run.data["speed"] = speed.measure_variants(
        run, model, accepted, training_batches or batches, bool(training_batches)
    )


def _finish(run: _Run, required, status: str, reason: str | None) -> Validation:
    run.data["complete"] = status == "complete"
    run.data["status"], run.data["incomplete_reason"] = status, reason
    for name, entry in run.data["dtypes"].items():
        if reason and entry.get("verdict") == "not judged":
            entry["reason"] = f"{name} was not judged: {reason}"
    run.data["required"] = [dtype_name(d) for d in required]
    verdicts = {name: entry.get("verdict") for name, entry in run.data["dtypes"].items()}
    missing = [dtype_name(d) for d in required if verdicts.get(dtype_name(d)) != "accepted"]
    run.data["exit_code"] = 1 if missing or status == "interrupted" else 0
    paths = report.write(run, figures=True)
    return Validation(run.data, paths)


def validate(
    recipe,
    *,
    out=None,
    dtypes=None,
    require=(),
    device=None,
    seed: int = 0,
    steps: int = DEFAULT_STEPS,
    max_seconds: float | None = None,
    force: bool = False,
    progress: bool = True,
) -> Validation:
    """Run the protocol on ``recipe`` (a path, a module, or an object/dict with the recipe's functions).

    Writes ``report.json`` and ``report.html`` into ``out`` (default ``<recipe name>-report`` in the current
    folder; an earlier report there is never overwritten unless ``force=True``) and returns a
    :class:`Validation` (``.exit_code``: 0 when every ``require``-d dtype is accepted, else 1). An unusable
    recipe or argument raises :class:`UsageError` (exit code 2) with a message and no traceback of the tool.
    """
    loaded = load_recipe(recipe)
    if loaded.criteria is None:
        raise UsageError(
            f"The recipe {loaded.source} has no `criteria`, so the tool refuses to judge it.\n\n{CRITERIA_HOWTO}"
        )
    tried, required = parse_dtypes(dtypes, "dtypes") if dtypes else None, parse_dtypes(require, "require")
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 0:
        raise UsageError(f"steps must be a whole number >= 0 (training steps per trial); got {steps!r}.")
    if max_seconds is not None and not (isinstance(max_seconds, (int, float)) and max_seconds > 0):
        raise UsageError(f"max_seconds must be a positive number of seconds; got {max_seconds!r}.")
    out = report.prepare_out(out, loaded, force)
    device = _device(device)
    if tried is None:
        tried = [d for d in AUTOCAST_DTYPES if probe_autocast(device, d)[0]]
    tried += [d for d in required if d not in tried]
    threads = loaded.cpu_threads if device.type == "cpu" else None
    previous = torch.get_num_threads()
    if threads:
        torch.set_num_threads(threads)
    try:
        return _validate(loaded, out, device, seed, steps, max_seconds, progress, tried, required)
    finally:
        torch.set_num_threads(previous)


def _validate(loaded, out, device, seed, steps, max_seconds, progress, tried, required) -> Validation:
    run = _Run(loaded, out, device, seed, steps, max_seconds, progress)
    run.warming = figures.start_warming()  # the plotting library loads while the model runs
    run.data["environment"] = _environment(run, tried)
    run.data["criteria"] = report.criteria_entry(
        loaded.criteria, getattr(loaded.namespace, "training_tolerance", None)
    )
    run.bars.note(
        f"criteria {loaded.criteria.fingerprint} recorded before the trial; device {device}; dtypes "
        + ", ".join(dtype_name(d) for d in tried)
    )
    for dtype in tried:
        works, note = probe_autocast(device, dtype)
        if not works:
            run.data["dtypes"][dtype_name(dtype)] = report.not_run(
                dtype_name(dtype), f"autocast {dtype_name(dtype)} does not work on {device}: {note}"
            )
    usable = [d for d in tried if dtype_name(d) not in run.data["dtypes"]]
    try:
        _protocol(run, usable)
    except _OutOfTime as stop:
        return _finish(run, required, "time limit", f"--max-seconds {max_seconds:g} reached before {stop}")
    except KeyboardInterrupt:
        phase = run.data["phases"][-1]["name"] if run.data["phases"] else "the start"
        run.bars.close_all()
        return _finish(run, required, "interrupted", f"interrupted (Ctrl-C) during {phase}")
    finally:
        run.bars.close_all()
    return _finish(run, required, "complete", None)


def _device(device) -> torch.device:
    if device is None:
        return pick_device()
    try:
        device = torch.device(device)
    except (RuntimeError, TypeError):
        raise UsageError(f"--device {device!r} is not a device torch knows: use cpu or cuda.") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise UsageError(f"--device {device} asks for a GPU, but torch sees none here.")
    return device


class Validation:
    """What ``validate`` found: ``.data`` (the report.json content), ``.paths``, ``.exit_code``, the verdicts."""

    def __init__(self, data: dict, paths: dict):
        self.data, self.paths = data, paths

    @property
    def exit_code(self) -> int:
        return self.data["exit_code"]

    @property
    def verdicts(self) -> dict:
        return {name: entry["verdict"] for name, entry in self.data["dtypes"].items()}

    def table(self) -> str:
        return report.verdict_text(self.data)

    def __str__(self) -> str:
        return self.table() + f"\nreport: {self.paths.get('html')}"

    __repr__ = __str__

    def _repr_html_(self) -> str:
        return report.verdict_html(self.data) + f"<p>Report: <code>{self.paths.get('html')}</code></p>"
