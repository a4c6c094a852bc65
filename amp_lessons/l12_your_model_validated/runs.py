"""Lesson 12: the runs the protocol performs — evaluation passes, short training runs, the non-finite finder.

Why the runs are written this way:

- every trial starts from the **same initial weights** (a deep copy of the one model ``build_model()`` gave)
  and the same seed, so the only difference between FP32 and a trial is the precision;
- the data are listed once and reused, so every run sees exactly the same batches (and the tool checks that
  ``evaluation_batches()`` really is fixed: a second call must give the same tensors);
- outputs are checked where they appear (a tensor, floating point, one row per sample, FP32 outside
  autocast), so a wrong shape or dtype is reported with what was expected instead of failing later inside a
  comparison;
- the time spent in the learner's code (the runs) is counted apart from the tool's own bookkeeping
  (:class:`Clock`), so a report can say how much the tool itself added;
- a training loss that is not finite stops nothing: the step goes on as training would, and the first one is
  localised by lesson 05's finder on a copy of the model (the weights before that step).
"""

from __future__ import annotations

import contextlib
import copy
import time
from dataclasses import dataclass, field

import torch

from amp_lessons.core.environment import dtype_name, seed_everything
from amp_lessons.l02_fp16_underflow_and_loss_scaling.scaling import parameter_gradients
from amp_lessons.l05_nan_debugging.debugging import find_first_nonfinite
from amp_lessons.l07_measuring_gains.benchmark import synchronize
from amp_lessons.l12_your_model_validated.recipe import RecipeError

__all__ = ["Clock", "Evaluation", "TrainingRun", "evaluate", "localise", "same_batches", "to_device", "train"]


class Clock:
    """Wall time since the start, and the part of it spent inside the runs (the learner's code)."""

    def __init__(self):
        self.started = time.perf_counter()
        self.run_seconds = 0.0

    @contextlib.contextmanager
    def run(self, device):
        began = time.perf_counter()
        try:
            yield
        finally:
            synchronize(device)
            self.run_seconds += time.perf_counter() - began

    @property
    def total(self) -> float:
        return time.perf_counter() - self.started


def to_device(obj, device):
    """Tensors inside ``obj`` (tuples, lists, dicts) moved to ``device``; anything else unchanged."""
    if isinstance(obj, torch.Tensor):
        return obj.to(device)
    if isinstance(obj, (list, tuple)):
        return type(obj)(to_device(item, device) for item in obj)
    if isinstance(obj, dict):
        return type(obj)({key: to_device(value, device) for key, value in obj.items()})
    return obj


def _batch_size(targets) -> int | None:
    return int(targets.shape[0]) if isinstance(targets, torch.Tensor) and targets.dim() > 0 else None


def same_batches(first: list, second: list) -> bool:
    """True when two listings of ``evaluation_batches()`` hold the same tensors in the same order."""
    if len(first) != len(second):
        return False
    for a, b in zip(first, second):
        flat_a, flat_b = _tensors(a), _tensors(b)
        if len(flat_a) != len(flat_b):
            return False
        for x, y in zip(flat_a, flat_b):
            if x.shape != y.shape or x.dtype != y.dtype or not torch.equal(x.cpu(), y.cpu()):
                return False
    return True


def _tensors(obj) -> list:
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, (list, tuple)):
        return [t for item in obj for t in _tensors(item)]
    if isinstance(obj, dict):
        return [t for value in obj.values() for t in _tensors(value)]
    return []


# ------------------------------------------------------------------------------------------ evaluation


@dataclass
class Evaluation:
    """The scores of one pass over the evaluation set: ``[rows, C]`` (classification) or ``[rows]``."""

    scores: torch.Tensor
    targets: torch.Tensor | None
    sample_of_row: torch.Tensor  # the evaluation sample (index along the batch axis) each row belongs to
    output_dtype: str
    nonfinite_batch: int | None = None  # the first batch with non-finite outputs


def _checked_output(out, targets, recipe, index: int, reference: bool):
    """The output tensor of batch ``index``, or a RecipeError saying what is wrong with it."""
    where = f"batch {index} of evaluation_batches()"
    if not isinstance(out, torch.Tensor):
        hint = (
            " The model returns a "
            + type(out).__name__
            + ": define outputs_of(model, inputs) in the recipe to return the scores tensor (e.g. "
            "`return model(inputs).logits` for a Hugging Face model, `model(inputs)[0]` for a tuple)."
        )
        raise RecipeError(f"The outputs for {where} are not a tensor.{hint}")
    if not out.is_floating_point():
        raise RecipeError(f"The outputs for {where} have dtype {out.dtype}; scores must be floating point.")
    if reference and out.dtype != torch.float32:
        raise RecipeError(
            f"Outside autocast the model returned {dtype_name(out.dtype)} for {where}: the reference must be "
            "FP32. build_model() must return a float32 model (no .half()/.to(torch.bfloat16)) and "
            "outputs_of must not cast."
        )
    size = _batch_size(targets)
    if out.dim() == 0 or (size is not None and out.shape[0] != size):
        raise RecipeError(
            f"The outputs for {where} have shape {tuple(out.shape)}, but the batch has {size} targets: "
            "the first axis of the outputs must be the batch (one row per sample)."
        )
    if recipe.task == "classification" and out.dim() < 2:
        raise RecipeError(
            f"The outputs for {where} have shape {tuple(out.shape)}; a classification recipe needs scores "
            "[batch, ..., classes] (decisions are the argmax over the last axis). For one value per sample "
            "set task = 'regression' in the recipe."
        )
    return out.detach()


def _rows(out, targets, recipe):
    """The batch's output as rows (classification ``[rows, C]``, regression ``[rows]``), targets per row."""
    per_sample = out.reshape(out.shape[0], -1).shape[1]
    if recipe.task == "classification":
        rows = out.reshape(-1, out.shape[-1])
        per_sample = rows.shape[0] // out.shape[0]
    else:
        rows = out.reshape(-1)
    row_targets = None
    if isinstance(targets, torch.Tensor) and targets.numel() == rows.shape[0]:
        row_targets = targets.detach().reshape(-1)
    return rows, row_targets, per_sample


def evaluate(recipe, model, batches, device, dtype, clock, *, reference=False, tick=None) -> Evaluation:
    """One pass over ``batches`` (already listed) under autocast ``dtype`` (None = FP32), without gradients."""
    scores, targets, samples, dtypes = [], [], [], set()
    seen, width, first_bad = 0, None, None
    model.eval()
    for index, (inputs, batch_targets) in enumerate(batches):
        inputs = to_device(inputs, device)
        with clock.run(device), torch.no_grad():
            with torch.autocast(device.type, dtype=dtype or torch.bfloat16, enabled=dtype is not None):
                out = recipe.outputs(model, inputs)
        out = _checked_output(out, batch_targets, recipe, index, reference)
        rows, row_targets, per_sample = _rows(out, batch_targets, recipe)
        if recipe.task == "classification":
            if width is not None and rows.shape[1] != width:
                raise RecipeError(f"Batch {index} has {rows.shape[1]} classes, batch 0 had {width}.")
            width = rows.shape[1]
        if first_bad is None and not bool(torch.isfinite(rows).all()):
            first_bad = index
        dtypes.add(dtype_name(rows.dtype))
        scores.append(rows.to("cpu", torch.float32))
        targets.append(None if row_targets is None else row_targets.cpu())
        samples.append(torch.arange(out.shape[0]).repeat_interleave(per_sample) + seen)
        seen += out.shape[0]
        if tick:
            tick()
    if not scores:
        raise RecipeError(
            "evaluation_batches() gave no batches: the evaluation set is empty. It must yield the fixed "
            "(inputs, targets) pairs the trial is judged on."
        )
    usable = targets if all(t is not None for t in targets) else None
    return Evaluation(
        torch.cat(scores),
        torch.cat(usable) if usable else None,
        torch.cat(samples),
        "/".join(sorted(dtypes)),
        first_bad,
    )


# -------------------------------------------------------------------------------------------- training


@dataclass
class TrainingRun:
    """The losses of a short training run, GradScaler's scale history and what went non-finite."""

    dtype: str
    losses: list
    scales: list | None = None  # scale before step 1, then after each step (None without a scaler)
    scaler_note: str = ""
    nonfinite_steps: list = field(default_factory=list)
    gradients: dict | None = None  # FP32 run: the first step's parameter gradients (lesson 02's share)
    localised: object = None  # the finder's NonFiniteReport for the first non-finite loss, if any
    interrupted: bool = False


def make_scaler(device, dtype):
    """``(GradScaler, note)``: an enabled scaler for float16 (where this torch has one for the device)."""
    if dtype != torch.float16:
        return torch.amp.GradScaler(device.type, enabled=False), "no loss scaling (not float16)"
    try:
        return torch.amp.GradScaler(device.type), "GradScaler, initial scale 65536"
    except Exception as error:  # an old torch without a CPU GradScaler
        note = f"no GradScaler for {device.type} on this torch ({type(error).__name__})"
        return torch.amp.GradScaler("cuda", enabled=False), note


def _optimizer(recipe, model):
    if not recipe.has("optimizer"):
        return torch.optim.AdamW(model.parameters(), lr=1e-3)
    made = recipe.call("optimizer", model.parameters(), what="`optimizer(params)`")
    if not isinstance(made, torch.optim.Optimizer):
        raise RecipeError(
            f"`optimizer(params)` must return a torch.optim optimizer; got {type(made).__name__}."
        )
    return made


def _scalar_loss(loss, step: int):
    if not isinstance(loss, torch.Tensor) or loss.numel() != 1 or not loss.is_floating_point():
        got = type(loss).__name__ if not isinstance(loss, torch.Tensor) else f"shape {tuple(loss.shape)}"
        raise RecipeError(
            f"loss_fn(outputs, targets) must return one floating-point number as a tensor (e.g. the mean over "
            f"the batch); at training step {step} it returned {got}."
        )
    if not loss.requires_grad:
        raise RecipeError(
            f"The loss at training step {step} does not require grad: does outputs_of or loss_fn detach, or "
            "run under torch.no_grad()?"
        )
    return loss


def train(recipe, model, batches, device, dtype, seed, clock, *, tick=None, deadline=None) -> TrainingRun:
    """A short training run over ``batches`` (already listed) from ``model``'s weights, under ``dtype``."""
    seed_everything(seed)
    model.train()
    with clock.run(device):  # the learner's optimizer (building one may import parts of torch the first time)
        optimizer = _optimizer(recipe, model)
    scaler, note = make_scaler(device, dtype)
    run = TrainingRun(dtype_name(dtype or torch.float32), [], [] if scaler.is_enabled() else None, note)
    if run.scales is not None:
        run.scales.append(float(scaler.get_scale()))
    for step, (inputs, targets) in enumerate(batches, start=1):
        if deadline is not None and deadline():
            run.interrupted = True
            break
        inputs, targets = to_device(inputs, device), to_device(targets, device)
        with clock.run(device):
            optimizer.zero_grad(set_to_none=True)
            with torch.autocast(device.type, dtype=dtype or torch.bfloat16, enabled=dtype is not None):
                outputs = recipe.outputs(model, inputs)
                loss = _scalar_loss(
                    recipe.call("loss_fn", outputs, targets, what="`loss_fn(outputs, targets)`"), step
                )
            finite = bool(torch.isfinite(loss.detach()))
        if not finite:
            run.nonfinite_steps.append(step)
            if run.localised is None and dtype is not None:
                run.localised = localise(recipe, model, inputs, targets, dtype)
        with clock.run(device):
            scaler.scale(loss).backward()
            if dtype is None and step == 1:
                run.gradients = parameter_gradients(model)
            scaler.step(optimizer)
            scaler.update()
        run.losses.append(float(loss.detach()))
        if run.scales is not None:
            run.scales.append(float(scaler.get_scale()))
        if tick:
            tick()
    return run


# -------------------------------------------------------------------------------------------- the finder


def localise(recipe, model, inputs, targets, dtype, *, inference: bool = False):
    """Lesson 05's ``find_first_nonfinite`` on a copy of ``model`` (its weights now) and one batch.

    ``inference=True`` runs the forward pass as the evaluation did, without gradients (some modules, e.g.
    ``nn.TransformerEncoderLayer``, take a different, fused path then) and takes no backward step. Returns the
    finder's report, or a string saying why it could not run (the finder needs the inputs as one tensor)."""
    if not isinstance(inputs, torch.Tensor):
        return (
            "not localised: the finder needs the inputs as one tensor (these are a "
            + type(inputs).__name__
            + ")"
        )
    twin = copy.deepcopy(model)
    twin.eval() if inference else twin.train()
    optimizer = torch.optim.SGD(twin.parameters(), lr=0.0)

    def step(model, optimizer, scaler, loss_fn, inputs, targets, *, dtype, max_norm):
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast(inputs.device.type, dtype=dtype), torch.set_grad_enabled(not inference):
            loss = loss_fn(recipe.outputs(model, inputs), targets)
        if inference:
            return loss.detach()
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        return loss.detach()

    try:
        return find_first_nonfinite(
            twin,
            optimizer,
            None,
            lambda o, t: recipe.call("loss_fn", o, t),
            inputs,
            targets,
            dtype=dtype,
            step=step,
        )
    except KeyboardInterrupt:
        raise
    except Exception as error:  # the report says why, the validation goes on
        return f"not localised: the finder's step raised {type(error).__name__}: {str(error).splitlines()[0][:160]}"
