"""Lesson 05: find the *first* place a training step stops being finite, and read skipped updates (lesson 05).

Once one value is inf or NaN, everything computed from it is too: the loss is NaN, every later layer
is NaN, every gradient is NaN. Printing the loss tells you *that* something broke, never *where*.
``find_first_nonfinite`` runs one real training step with hooks and reports the first checkpoint, in
the order the values were produced, that holds a non-finite value:

1. the data (``inputs``, ``targets``) before the model runs;
2. the forward pass, in the order modules *finish*: a leaf module's output is checked before the
   container that called it (forward hooks fire when a module returns), and a value that a container
   computes in its own code between two submodules is caught when it enters the next submodule
   (forward pre-hooks);
3. the loss;
4. the backward pass, in the order autograd produces gradients: the gradient arriving at each module
   output (tensor hooks) and each parameter's gradient (parameter hooks), scaled by the loss scale;
5. the parameters after the optimizer step.

Each checkpoint records the dtype at that point (float16 under autocast, float32 for parameters), how
many NaN/+inf/-inf it holds and its largest finite magnitude, so the report also shows what was still
finite just before it. Every hook is removed afterwards, even when the step raises.

The module also holds ``OpDtypeRecorder`` (which dtype each op really ran in, seen through a
``TorchFunctionMode``) and the skipped-update helpers ``scale_history_table``/``plot_scale_history``.
"""

from __future__ import annotations

import html
import math
from dataclasses import dataclass, field

import torch
from torch import nn

from amp_lessons.autocast_state import float_tensors
from amp_lessons.environment import dtype_name
from amp_lessons.training import train_step
from amp_lessons.utils import scale_text, step_was_skipped

FP16_MAX = float(torch.finfo(torch.float16).max)  # 65504
ROOT_NAME = "(model)"
STAGES = ("input", "forward", "loss", "backward", "update")


# --------------------------------------------------------------------------------------------------
# One checkpoint: the statistics of one tensor at one point of the step
# --------------------------------------------------------------------------------------------------
@dataclass
class Checkpoint:
    """What one tensor looked like at one point of the step (statistics only, no tensor is kept)."""

    order: int
    stage: str  # one of STAGES
    kind: str  # "inputs", "targets", "module output", "module input", "loss", "loss gradient",
    #            "output gradient", "input gradient", "parameter gradient", "parameters"
    name: str  # qualified module or parameter name ("(model)" for the model itself)
    module: str  # class name of the module ("" when not about a module)
    dtype: str
    shape: tuple
    numel: int
    nan: int
    posinf: int
    neginf: int
    max_abs: float  # largest finite |value| (nan when there is none)
    leaf: bool = True
    note: str = ""

    @property
    def finite(self) -> bool:
        return self.nan == 0 and self.posinf == 0 and self.neginf == 0

    @property
    def where(self) -> str:
        """A readable label, e.g. "output of `attn.scores` (ScoreProduct)"."""
        module = f" ({self.module})" if self.module else ""
        labels = {
            "inputs": f"data: {self.name}",
            "targets": f"data: {self.name}",
            "module output": f"output of `{self.name}`{module}",
            "module input": f"input of `{self.name}`{module}",
            "loss": "loss",
            "loss gradient": "backward starts: d(scaled loss)/d(loss)",
            "output gradient": f"gradient at output of `{self.name}`{module}",
            "input gradient": f"gradient at input of `{self.name}`{module}",
            "parameter gradient": f"gradient of parameter `{self.name}`",
            "parameters": f"parameter `{self.name}` after the step" if self.name else "parameters after the step",
        }
        return labels.get(self.kind, f"{self.kind} {self.name}")

    def counts(self) -> str:
        """'3 NaN, 12 +inf of 288 values' or 'all 288 finite'."""
        if self.finite:
            return f"all {self.numel} finite"
        parts = [f"{n} {label}" for n, label in ((self.nan, "NaN"), (self.posinf, "+inf"), (self.neginf, "-inf")) if n]
        return f"{', '.join(parts)} of {self.numel} values"

    def row(self) -> dict:
        return {
            "#": self.order,
            "stage": self.stage,
            "where": self.where,
            "dtype": self.dtype,
            "shape": "x".join(map(str, self.shape)) or "scalar",
            "finite": self.finite,
            "max |finite value|": self.max_abs,
            "NaN": self.nan,
            "+inf": self.posinf,
            "-inf": self.neginf,
            "note": self.note,
        }


def tensor_stats(tensor: torch.Tensor) -> dict:
    """Counts of NaN/+inf/-inf and the largest finite magnitude of a floating-point tensor."""
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"tensor_stats needs a torch.Tensor, got {type(tensor).__name__}")
    with torch.no_grad():
        t = tensor.detach()
        if not (t.is_floating_point() or t.is_complex()):
            return {"nan": 0, "posinf": 0, "neginf": 0, "max_abs": float(t.abs().max()) if t.numel() else math.nan}
        if t.is_complex():
            t = torch.view_as_real(t)
        finite = torch.isfinite(t)
        max_abs = float(t[finite].abs().max().float()) if bool(finite.any()) else math.nan
        return {
            "nan": int(torch.isnan(t).sum()),
            "posinf": int(torch.isposinf(t).sum()),
            "neginf": int(torch.isneginf(t).sum()),
            "max_abs": max_abs,
        }



# --------------------------------------------------------------------------------------------------
# The recorder: hooks that turn a training step into a list of checkpoints
# --------------------------------------------------------------------------------------------------
class _Recorder:
    """Installs the hooks on ``model`` and collects checkpoints in the order values are produced."""

    def __init__(self, model: nn.Module):
        self.model = model
        self.checkpoints: list[Checkpoint] = []
        self.handles: list = []
        self.seen: dict[int, Checkpoint] = {}  # id(tensor) -> the checkpoint that first recorded it
        self.keep: list = []  # strong references, so that no id is reused during the step
        self.calls: dict[str, int] = {}
        self.names = {id(m): (n or ROOT_NAME) for n, m in model.named_modules()}

    # -- bookkeeping ---------------------------------------------------------------------------
    def record(self, tensor, stage, kind, name, module="", leaf=True, note="") -> Checkpoint:
        stats = tensor_stats(tensor)
        checkpoint = Checkpoint(
            order=len(self.checkpoints) + 1, stage=stage, kind=kind, name=name, module=module,
            dtype=dtype_name(tensor.dtype), shape=tuple(tensor.shape), numel=tensor.numel(), leaf=leaf,
            note=note, **stats,
        )
        self.checkpoints.append(checkpoint)
        return checkpoint

    def remember(self, tensor, checkpoint) -> None:
        self.seen[id(tensor)] = checkpoint
        self.keep.append(tensor)

    def record_data(self, label: str, obj) -> None:
        tensors = list(float_tensors(obj))
        for i, tensor in enumerate(tensors):
            name = label if len(tensors) == 1 else f"{label}[{i}]"
            self.remember(tensor, self.record(tensor, "input", label, name))

    def _call_name(self, module) -> str:
        name = self.names.get(id(module), type(module).__name__)
        count = self.calls.get(name, 0)
        return name if count <= 1 else f"{name} (call {count})"

    # -- forward -------------------------------------------------------------------------------
    def pre_hook(self, module, args, kwargs):
        name = self.names.get(id(module), type(module).__name__)
        self.calls[name] = self.calls.get(name, 0) + 1
        call_name = self._call_name(module)
        parent = name.rsplit(".", 1)[0] if "." in name else ROOT_NAME
        for tensor in float_tensors((args, kwargs)):
            if id(tensor) in self.seen:
                continue  # the data, or the output of a module already checked
            note = f"computed in the forward of `{parent}`, outside any submodule" if name != ROOT_NAME else ""
            checkpoint = self.record(tensor, "forward", "module input", call_name, type(module).__name__, note=note)
            self.remember(tensor, checkpoint)
            self.watch_gradient(tensor, checkpoint)
        return None

    def forward_hook(self, module, args, output):
        call_name = self._call_name(module)
        leaf = next(module.children(), None) is None
        for tensor in float_tensors(output):
            earlier = self.seen.get(id(tensor))
            if earlier is not None:  # e.g. a Sequential returns its last child's output tensor itself
                if earlier.finite and not bool(torch.isfinite(tensor.detach()).all()):  # changed in place since
                    note = "the same tensor as an earlier checkpoint, made non-finite in place by this module"
                    self.seen[id(tensor)] = self.record(tensor, "forward", "module output", call_name,
                                                        type(module).__name__, leaf, note)
                    continue
                alias = f"also the output of `{call_name}`"
                earlier.note = f"{earlier.note}; {alias}" if earlier.note else alias
                continue
            note = "" if leaf else "computed by this container's own code (its submodules' outputs are checked before)"
            checkpoint = self.record(tensor, "forward", "module output", call_name, type(module).__name__, leaf, note)
            self.remember(tensor, checkpoint)
            self.watch_gradient(tensor, checkpoint)
        return None

    # -- backward ------------------------------------------------------------------------------
    def watch_gradient(self, tensor, checkpoint) -> None:
        if not tensor.requires_grad:
            return
        kind = {"loss": "loss gradient", "module input": "input gradient"}.get(checkpoint.kind, "output gradient")

        def hook(grad, checkpoint=checkpoint, kind=kind):
            self.record(grad, "backward", kind, checkpoint.name, checkpoint.module, checkpoint.leaf)
            return None

        self.handles.append(tensor.register_hook(hook))

    def watch_parameters(self) -> None:
        for name, parameter in self.model.named_parameters():
            if not parameter.requires_grad:
                continue

            def hook(grad, name=name):
                self.record(grad, "backward", "parameter gradient", name)
                return None

            self.handles.append(parameter.register_hook(hook))

    def watch_loss(self, loss_fn):
        def watched_loss_fn(*args, **kwargs):
            loss = loss_fn(*args, **kwargs)
            if isinstance(loss, torch.Tensor) and (loss.is_floating_point() or loss.is_complex()):
                checkpoint = self.record(loss, "loss", "loss", "loss")
                self.remember(loss, checkpoint)
                self.watch_gradient(loss, checkpoint)
            return loss

        return watched_loss_fn

    # -- install / remove ----------------------------------------------------------------------
    def attach(self) -> None:
        for module in self.model.modules():
            self.handles.append(module.register_forward_pre_hook(self.pre_hook, with_kwargs=True))
            self.handles.append(module.register_forward_hook(self.forward_hook))
        self.watch_parameters()

    def detach(self) -> None:
        for handle in self.handles:
            handle.remove()
        self.handles.clear()
        self.keep.clear()
        self.seen.clear()

    def record_parameters(self) -> None:
        """One checkpoint for the parameters after the step: the first non-finite one, or all finite."""
        named = list(self.model.named_parameters())
        largest = []
        for name, parameter in named:
            stats = tensor_stats(parameter)
            if stats["nan"] or stats["posinf"] or stats["neginf"]:
                self.record(parameter, "update", "parameters", name)
                return
            largest.append(stats["max_abs"])
        if named:
            total = sum(p.numel() for _, p in named)
            dtypes = sorted({dtype_name(p.dtype) for _, p in named})
            self.checkpoints.append(Checkpoint(
                len(self.checkpoints) + 1, "update", "parameters", "", "", "/".join(dtypes), (total,), total,
                0, 0, 0, max(largest), note=f"{len(named)} parameter tensors",
            ))


# --------------------------------------------------------------------------------------------------
# The report
# --------------------------------------------------------------------------------------------------
def _of_first(attribute: str) -> property:
    """A read-only property: ``attribute`` of the report's first non-finite checkpoint (None when all are finite)."""
    return property(lambda report: getattr(report.first, attribute) if report.first else None,
                    doc=f"The first non-finite checkpoint's {attribute} (None when every checkpoint is finite).")


@dataclass
class NonFiniteReport:
    """Everything ``find_first_nonfinite`` saw, with the first non-finite checkpoint singled out."""

    checkpoints: list
    loss: float
    autocast_dtype: str
    device_type: str
    scale_before: float | None = None
    scale_after: float | None = None
    scaler_enabled: bool = False
    first: Checkpoint | None = field(init=False, default=None)

    def __post_init__(self) -> None:
        self.first = next((c for c in self.checkpoints if not c.finite), None)

    # -- shortcuts -----------------------------------------------------------------------------
    @property
    def found(self) -> bool:
        return self.first is not None

    stage = _of_first("stage")
    name = _of_first("name")
    where = _of_first("where")
    dtype = _of_first("dtype")

    @property
    def before(self) -> list:
        """The checkpoints produced before the first non-finite one (all finite)."""
        if self.first is None:
            return list(self.checkpoints)
        return [c for c in self.checkpoints if c.order < self.first.order]

    @property
    def skipped(self) -> bool | None:
        """Did GradScaler skip the optimizer step (the scale went down)? None without an enabled scaler."""
        if not self.scaler_enabled or self.scale_before is None or self.scale_after is None:
            return None
        return step_was_skipped(self.scale_before, self.scale_after)

    def checkpoint(self, stage: str, name: str) -> Checkpoint | None:
        """The first checkpoint of ``stage`` about ``name`` (e.g. ``("forward", "scores")``)."""
        return next((c for c in self.checkpoints if c.stage == stage and c.name == name), None)

    # -- words ---------------------------------------------------------------------------------
    def headline(self) -> str:
        if self.first is None:
            return (f"Every checkpoint is finite ({len(self.checkpoints)} checked: data, forward, loss, backward, "
                    "parameters).")
        return f"First non-finite value: {self.first.where} — {self.first.dtype}, {self.first.counts()}."

    def explanation(self) -> str:
        first = self.first
        if first is None:
            return "Nothing to fix in this step: the data, every module output, the loss and every gradient are finite."
        before = self.before
        last_ok = f" The last finite checkpoint before it: {before[-1].where} ({before[-1].dtype})." if before else ""
        overflow = bool(first.posinf or first.neginf)
        range_note = ""
        if overflow and first.dtype == "float16" and first.kind == "module input":
            range_note = (f" float16 holds at most {FP16_MAX:g}: an inline op produced a value beyond it (what you see "
                          "may have been divided or reshaped afterwards, but inf stays inf).")
        elif overflow and first.dtype == "float16":
            largest = "" if math.isnan(first.max_abs) else f" (its largest finite value is {first.max_abs:.6g})"
            range_note = (f" float16 holds at most {FP16_MAX:g}{largest}: values beyond it become inf — an overflow "
                          "caused by the precision, not by the data.")
        elif overflow and first.dtype == "bfloat16":
            range_note = (" bfloat16 has float32's range, so this would overflow in float32 as well: look at the "
                          "values, not the precision.")
        elif not overflow:
            range_note = (" NaN without any inf from finite inputs means an invalid operation (0/0, inf-inf, "
                          "sqrt or log of a negative number).")
        if first.stage == "input":
            return (f"The {first.name} are non-finite before the model runs: fix the data pipeline; autocast and the "
                    "loss scale are not involved.")
        if first.kind == "module input":
            return (f"Every module output before it was finite, yet the value entering `{first.name}` is not: it was "
                    f"{first.note}. Read that forward code between the submodules (an inline `@`, `exp`, division, "
                    f"...), or give that op its own nn.Module so the finder can name it.{range_note}{last_ok}")
        if first.kind == "module output" and first.leaf:
            return (f"`{first.name}` ({first.module}) received finite inputs and produced non-finite values in "
                    f"{first.dtype}: the culprit is the computation inside this module.{range_note}{last_ok}")
        if first.kind == "module output":
            return (f"All submodules of `{first.name}` returned finite values, so the non-finite value was computed "
                    f"by `{first.name}`'s own forward code (an op that is not a submodule).{range_note}{last_ok}")
        if first.stage == "loss":
            return (f"The model's outputs were finite but the loss is not ({first.dtype}): look at the loss function "
                    f"and the targets (log of 0, division by a zero count, ...).{range_note}")
        if first.stage == "backward":
            if first.kind == "parameter gradient" and overflow and self.autocast_dtype == "float16":
                range_note = (" The parameter (and so its .grad) is float32, but autocast ran the layer on a float16 "
                              "copy of it: the weight gradient was computed in float16, overflowed there, and was "
                              "then cast to float32.")
            scale = ""
            if self.scaler_enabled and self.scale_before is not None:
                scale = (f" Gradients here are multiplied by the loss scale {scale_text(self.scale_before)}; "
                         "GradScaler sees the inf/NaN, skips this optimizer step and lowers the scale. Once, early "
                         "on, that is calibration; at every step it is a problem to find.")
            return (f"The forward pass and the loss ({self.loss:.6g}) were finite — a finite loss does not guarantee "
                    f"finite gradients. The first non-finite gradient is the {first.where}, in {first.dtype}."
                    f"{range_note}{scale}")
        return ("Every gradient was finite but a parameter is not after the optimizer step: the update itself "
                "overflowed (learning rate too large, or a step taken without GradScaler's inf check).")

    # -- tables and rendering ------------------------------------------------------------------
    def table(self, *, upto_first: bool = False):
        """A pandas DataFrame, one row per checkpoint in the order they were produced."""
        import pandas as pd

        rows = self.checkpoints
        if upto_first and self.first is not None:
            rows = [c for c in rows if c.order <= self.first.order]
        return pd.DataFrame([c.row() for c in rows]).set_index("#") if rows else pd.DataFrame()

    def _context(self, keep: int = 6) -> tuple[list, int]:
        """The checkpoints to show: the last ``keep`` finite ones before the first non-finite, then it."""
        if self.first is None:
            return self.checkpoints[-keep:], max(0, len(self.checkpoints) - keep)
        before = self.before
        shown = before[-keep:] + [self.first]
        return shown, len(before) - len(before[-keep:])

    def _step_line(self) -> str:
        loss = "nan" if math.isnan(self.loss) else f"{self.loss:.6g}"
        text = f"autocast {self.autocast_dtype} on {self.device_type}; loss {loss}"
        if self.scaler_enabled:
            verdict = {True: "optimizer step SKIPPED", False: "optimizer step taken", None: ""}[self.skipped]
            text += f"; scale {scale_text(self.scale_before)} -> {scale_text(self.scale_after)} ({verdict})"
        return text

    def __str__(self) -> str:
        shown, hidden = self._context()
        lines = [self.headline(), self.explanation(), self._step_line(), ""]
        if hidden:
            lines.append(f"  ... {hidden} earlier finite checkpoints (report.table() lists all)")
        for c in shown:
            mark = "OK " if c.finite else ">> "
            largest = "-" if math.isnan(c.max_abs) else f"{c.max_abs:.4g}"
            lines.append(f"  {mark}#{c.order:<3} {c.stage:8s} {c.where:55s} {c.dtype:9s} max|x| {largest:>10s}  "
                         f"{c.counts()}")
        later = len(self.checkpoints) - (self.first.order if self.first else len(self.checkpoints))
        if later:
            bad = sum(1 for c in self.checkpoints if self.first and c.order > self.first.order and not c.finite)
            lines.append(f"  ... then {later} later checkpoints, {bad} of them non-finite (consequences, not causes)")
        return "\n".join(lines)

    def __repr__(self) -> str:
        return str(self)

    def _repr_html_(self) -> str:
        shown, hidden = self._context()
        colour = ("#ffebee", "#c62828") if self.found else ("#e8f5e9", "#2e7d32")
        rows = []
        for c in shown:
            style = "" if c.finite else " style='background:#ffcdd2;font-weight:bold'"
            largest = "–" if math.isnan(c.max_abs) else f"{c.max_abs:.4g}"
            rows.append(
                f"<tr{style}><td>{c.order}</td><td>{c.stage}</td><td>{html.escape(c.where)}</td>"
                f"<td>{c.dtype}</td><td style='text-align:right'>{largest}</td><td>{html.escape(c.counts())}</td></tr>"
            )
        note = f"<tr><td colspan=6><i>… {hidden} earlier finite checkpoints</i></td></tr>" if hidden else ""
        later = len(self.checkpoints) - (self.first.order if self.first else len(self.checkpoints))
        tail = (f"<tr><td colspan=6><i>… then {later} later checkpoints (consequences, not causes); "
                "<code>report.table()</code> lists all</i></td></tr>") if later else ""
        return (
            f"<div style='background:{colour[0]};border-left:6px solid {colour[1]};padding:8px 12px;"
            f"border-radius:4px'><b>{html.escape(self.headline())}</b>"
            f"<div style='margin:4px 0'>{html.escape(self.explanation())}</div>"
            f"<div style='color:#555;font-size:90%'>{html.escape(self._step_line())}</div>"
            "<table style='margin-top:6px;font-size:90%'><tr><th>#</th><th>stage</th><th>where</th><th>dtype</th>"
            f"<th>max |finite|</th><th>values</th></tr>{note}{''.join(rows)}{tail}</table></div>"
        )


# --------------------------------------------------------------------------------------------------
# The finder
# --------------------------------------------------------------------------------------------------
def _validate(model, optimizer, scaler, loss_fn, inputs, dtype, step):
    if not isinstance(model, nn.Module):
        raise TypeError(f"find_first_nonfinite needs the model (an nn.Module) first, got {type(model).__name__}.")
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(f"optimizer must be a torch.optim optimizer (e.g. torch.optim.SGD(model.parameters(), lr=0.1)), "
                        f"got {type(optimizer).__name__}.")
    if scaler is not None and not all(hasattr(scaler, a) for a in ("scale", "step", "update", "get_scale")):
        raise TypeError(f"scaler must be a torch.amp.GradScaler (or None for no loss scaling), got {type(scaler).__name__}.")
    if not callable(loss_fn):
        raise TypeError(f"loss_fn must be callable, e.g. torch.nn.functional.cross_entropy; got {type(loss_fn).__name__}.")
    if not isinstance(inputs, torch.Tensor):
        raise TypeError(f"inputs must be a tensor (the batch the model is called with), got {type(inputs).__name__}.")
    if dtype not in (torch.float16, torch.bfloat16):
        raise ValueError(f"dtype must be torch.float16 or torch.bfloat16 (the autocast dtype), got {dtype!r}. For an "
                         "FP32 reference, call the model without autocast.")
    if not callable(step):
        raise TypeError(f"step must be a training-step function like amp_lessons.training.train_step, got {type(step).__name__}.")


def find_first_nonfinite(model, optimizer, scaler, loss_fn, inputs, targets, *, dtype=torch.float16, max_norm=None,
                         step=None) -> NonFiniteReport:
    """Run ONE training step with hooks and report the first non-finite value and what was finite before it.

    The arguments are those of ``amp_lessons.training.train_step`` (which is the step run, unless you pass
    your own ``step`` with the same signature). ``scaler=None`` means no loss scaling. This really is a
    training step: when everything is finite the optimizer updates the model; when a gradient is not,
    GradScaler skips the update as usual. All hooks are removed afterwards, also when the step raises
    (the error is then re-raised unchanged).
    """
    step = train_step if step is None else step
    _validate(model, optimizer, scaler, loss_fn, inputs, dtype, step)
    device_type = inputs.device.type
    if scaler is None:
        scaler = torch.amp.GradScaler(device_type, enabled=False)
    enabled = bool(scaler.is_enabled()) if hasattr(scaler, "is_enabled") else True
    scale_before = float(scaler.get_scale()) if enabled else None

    recorder = _Recorder(model)
    recorder.record_data("inputs", inputs)
    recorder.record_data("targets", targets)
    try:
        recorder.attach()
        loss = step(model, optimizer, scaler, recorder.watch_loss(loss_fn), inputs, targets, dtype=dtype,
                    max_norm=max_norm)
    finally:
        recorder.detach()
    recorder.record_parameters()
    scale_after = float(scaler.get_scale()) if enabled else None
    loss_value = float(loss.detach().float()) if isinstance(loss, torch.Tensor) and loss.numel() == 1 else math.nan
    return NonFiniteReport(recorder.checkpoints, loss_value, dtype_name(dtype), device_type, scale_before,
                           scale_after, enabled)


def hook_count(model: nn.Module) -> int:
    """How many forward/backward hooks are installed on ``model``'s modules and parameters (0 when clean)."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"hook_count needs an nn.Module, got {type(model).__name__}")
    total = 0
    for module in model.modules():
        for attribute in ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks"):
            total += len(getattr(module, attribute, {}) or {})
    for parameter in model.parameters():
        total += len(getattr(parameter, "_backward_hooks", None) or {})
    return total


def plot_checkpoints(report: NonFiniteReport, *, stages=("input", "forward", "loss"), ax=None):
    """Bar chart: largest finite magnitude at each checkpoint, in order, against the float16 maximum.

    Non-finite checkpoints are drawn red, reaching the top of the axis, so the first red bar is the place
    to look and everything to its right is a consequence.
    """
    import matplotlib.pyplot as plt

    if not isinstance(report, NonFiniteReport):
        raise TypeError(f"plot_checkpoints needs a NonFiniteReport (from find_first_nonfinite), got {type(report).__name__}")
    points = [c for c in report.checkpoints if c.stage in stages]
    if ax is None:
        _, ax = plt.subplots(figsize=(9, 3.2))
    finite_values = [c.max_abs for c in points if c.finite and c.max_abs > 0 and not math.isnan(c.max_abs)]
    top = max(finite_values + [FP16_MAX]) * 30
    for i, c in enumerate(points):
        if c.finite:
            value = c.max_abs if c.max_abs > 0 else 1e-3
            ax.bar(i, value, color="#66bb6a")
        else:
            ax.bar(i, top, color="#e53935" if c is report.first else "#ef9a9a")
    ax.axhline(FP16_MAX, color="k", linestyle="--", linewidth=1)
    ax.text(len(points) - 0.5, FP16_MAX * 1.3, "float16 max 65504", ha="right", va="bottom", fontsize=8)
    ax.set_yscale("log")
    ax.set_xticks(range(len(points)))
    ax.set_xticklabels([c.where.replace("output of ", "").replace("data: ", "").replace("`", "") for c in points],
                       rotation=35, ha="right", fontsize=8)
    ax.set_ylabel("largest |value|")
    ax.set_title("Largest magnitude at each checkpoint, in the order produced (red: non-finite)")
    ax.figure.tight_layout()
    return ax.figure

# --------------------------------------------------------------------------------------------------
# Skipped updates: frequency and trend
# --------------------------------------------------------------------------------------------------
def scale_history_table(scales, *, window: int):
    """Per window of steps: how many updates GradScaler skipped, how often it grew, and what that means.

    ``scales[0]`` is ``scaler.get_scale()`` before the first step and ``scales[i]`` the value after
    step ``i``. GradScaler lowers the scale exactly when it found inf/NaN gradients and skipped the
    optimizer step, and raises it after ``growth_interval`` clean steps — so a drop marks a skipped
    update (a scale that collapsed to 0 skips every step: 0 * inf is NaN). Reading: skips only in the first window while the scale falls is *calibration* (the initial
    scale was too large); an occasional skip after each growth is *probing*, healthy; skipping most
    steps is *persistent*: something overflows whatever the scale, go and find it.
    """
    import pandas as pd

    values = [float(s) for s in scales]
    if len(values) < 2:
        raise ValueError("scale_history_table needs the scale before the first step and after at least one step.")
    if not isinstance(window, int) or window < 1:
        raise ValueError(f"window must be a positive int (steps per row), got {window!r}")
    steps = len(values) - 1
    rows = []
    skips = [False] + [step_was_skipped(values[i - 1], values[i]) for i in range(1, steps + 1)]
    first_growth = next((i for i in range(1, steps + 1) if values[i] > values[i - 1]), steps + 1)
    for start in range(1, steps + 1, window):
        stop = min(start + window - 1, steps)
        skipped = sum(skips[start:stop + 1])
        grown = sum(1 for i in range(start, stop + 1) if values[i] > values[i - 1])
        count = stop - start + 1
        rate = skipped / count
        last_skip = max((i for i in range(start, stop + 1) if skips[i]), default=0)
        if skipped == 0:
            reading = "no skips"
        elif start == 1 and last_skip < first_growth and not skips[stop]:
            reading = "calibration: initial scale too large"  # skips at the start, then clean steps
        elif rate >= 0.5:
            reading = "persistent: most updates skipped"
        else:
            reading = "probing: scale grew, then backed off"
        rows.append({
            "steps": f"{start}-{stop}", "skipped": skipped, "skip rate": round(rate, 3), "scale grew": grown,
            "scale at end": values[stop], "reading": reading,
        })
    return pd.DataFrame(rows)


def skip_verdict(table) -> str:
    """One sentence about a whole run, from ``scale_history_table``: trend matters more than the count."""
    if table is None or len(table) == 0:
        raise ValueError("skip_verdict needs a non-empty table from scale_history_table")
    late = table.iloc[len(table) // 2:]
    total = int(table["skipped"].sum())
    if float(late["skip rate"].mean()) >= 0.5:
        return (f"PROBLEM: {total} skipped updates and still skipping most steps late in the run — something "
                "overflows at every scale. Find the first non-finite value.")
    end_scale = float(table["scale at end"].iloc[-1])
    if end_scale < 1:
        return (f"PROBLEM: the scale has fallen to {end_scale:.3g} ({total} skipped updates): even unscaled gradients "
                "overflow. Find the first non-finite value.")
    if total == 0:
        return "Healthy: no update was skipped."
    return (f"Healthy: {total} skipped updates — early calibration and occasional probing; late in the run the skip "
            "rate stays low and the scale does not keep falling.")


def plot_scale_history(histories: dict):
    """The loss scale over steps (log2 axis), one panel per run, skipped updates marked with x.

    One panel each, because a healthy run moves by a few powers of two while a broken one falls by
    hundreds: on a shared axis the healthy run's calibration and probing would be invisible.
    """
    import matplotlib.pyplot as plt

    if not isinstance(histories, dict) or not histories:
        raise TypeError("plot_scale_history needs a dict {run name: list of scales (before step 1, after each step)}")
    figure, axes = plt.subplots(1, len(histories), figsize=(4.5 * len(histories), 3.2), squeeze=False)
    for ax, (label, scales) in zip(axes[0], histories.items()):
        values = [float(s) for s in scales]
        logs = [math.log2(v) if v > 0 else float("nan") for v in values]
        ax.plot(range(len(values)), logs, color="#1e88e5")
        skips = [i for i in range(1, len(values)) if step_was_skipped(values[i - 1], values[i])]
        ax.plot(skips, [logs[i] for i in skips], "x", color="#e53935", markersize=6, label="skipped update")
        collapsed = next((i for i, v in enumerate(values) if v <= 0), None)
        if collapsed is not None:
            ax.annotate(f"scale reached 0 at step {collapsed}", xy=(collapsed, logs[collapsed - 1]), fontsize=8,
                        xytext=(0.35, 0.85), textcoords="axes fraction", arrowprops={"arrowstyle": "->"})
        ax.set_title(f"{label}: {len(skips)} skipped of {len(values) - 1}", fontsize=10)
        ax.set_xlabel("step")
        ax.set_ylabel("log2(loss scale)")
        ax.legend(fontsize=8, loc="best")
    figure.suptitle("GradScaler's scale over a real run (x = update skipped: inf/NaN gradients found)", fontsize=11)
    figure.tight_layout()
    return figure
