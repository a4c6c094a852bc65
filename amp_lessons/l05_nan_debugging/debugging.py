"""Lesson 05: find the *first* place a training step stops being finite.

Once one value is inf or NaN, everything computed from it is too: the loss is NaN, every later layer
is NaN, every gradient is NaN. Printing the loss tells you *that* something broke, never *where*.
``find_first_nonfinite`` runs one real training step with hooks and records a probe (the statistics of
one tensor, see ``amp_lessons.l05_nan_debugging.nonfinite_report``) at every point below, in the order the values were
produced; its report names the first probe that holds a non-finite value:

1. the data (``inputs``, ``targets``) before the model runs;
2. the forward pass, in the order modules *finish*: a leaf module's output is probed before the
   container that called it (forward hooks fire when a module returns), and a value that a container
   computes in its own code between two submodules is caught when it enters the next submodule
   (forward pre-hooks);
3. the loss;
4. the backward pass, in the order autograd produces gradients: the gradient arriving at each module
   output (tensor hooks) and each parameter's gradient (parameter hooks), scaled by the loss scale;
5. the parameters after the optimizer step.

Each probe records the dtype at that point (float16 under autocast, float32 for parameters), how many
NaN/+inf/-inf it holds and its largest finite magnitude, so the report also shows what was still
finite just before it. Every hook is removed afterwards, even when the step raises.

Reading skipped updates over a whole run (GradScaler's scale history) is ``amp_lessons.l05_nan_debugging.skipped_updates``.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from amp_lessons.core.autocast_state import float_tensors
from amp_lessons.core.environment import dtype_name
from amp_lessons.l03_autocast_and_gradscaler.training import train_step
from amp_lessons.l05_nan_debugging.nonfinite_report import NonFiniteReport, Probe, tensor_stats

ROOT_NAME = "(model)"


# --------------------------------------------------------------------------------------------------
# The recorder: hooks that turn a training step into a list of probes
# --------------------------------------------------------------------------------------------------
class _Recorder:
    """Installs the hooks on ``model`` and collects probes in the order values are produced."""

    def __init__(self, model: nn.Module):
        self.model = model
        self.probes: list[Probe] = []
        self.handles: list = []
        self.seen: dict[int, Probe] = {}  # id(tensor) -> the probe that first recorded it
        self.keep: list = []  # strong references, so that no id is reused during the step
        self.calls: dict[str, int] = {}
        self.names = {id(m): (n or ROOT_NAME) for n, m in model.named_modules()}

    # -- bookkeeping ---------------------------------------------------------------------------
    def record(self, tensor, stage, kind, name, module="", leaf=True, note="") -> Probe:
        stats = tensor_stats(tensor)
        probe = Probe(
            order=len(self.probes) + 1,
            stage=stage,
            kind=kind,
            name=name,
            module=module,
            dtype=dtype_name(tensor.dtype),
            shape=tuple(tensor.shape),
            numel=tensor.numel(),
            leaf=leaf,
            note=note,
            **stats,
        )
        self.probes.append(probe)
        return probe

    def remember(self, tensor, probe) -> None:
        self.seen[id(tensor)] = probe
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
                continue  # the data, or the output of a module already probed
            note = ""
            if name != ROOT_NAME:
                note = f"computed in the forward of `{parent}`, outside any submodule"
            probe = self.record(
                tensor, "forward", "module input", call_name, type(module).__name__, note=note
            )
            self.remember(tensor, probe)
            self.watch_gradient(tensor, probe)
        return None

    def forward_hook(self, module, args, output):
        call_name = self._call_name(module)
        leaf = next(module.children(), None) is None
        for tensor in float_tensors(output):
            earlier = self.seen.get(id(tensor))
            if earlier is not None:  # e.g. a Sequential returns its last child's output tensor itself
                changed_in_place = earlier.finite and not bool(torch.isfinite(tensor.detach()).all())
                if changed_in_place:
                    note = "the same tensor as an earlier probe, made non-finite in place by this module"
                    self.seen[id(tensor)] = self.record(
                        tensor, "forward", "module output", call_name, type(module).__name__, leaf, note
                    )
                    continue
                alias = f"also the output of `{call_name}`"
                earlier.note = f"{earlier.note}; {alias}" if earlier.note else alias
                continue
            note = (
                ""
                if leaf
                else ("computed by this container's own code (its submodules' outputs are checked before)")
            )
            probe = self.record(
                tensor, "forward", "module output", call_name, type(module).__name__, leaf, note
            )
            self.remember(tensor, probe)
            self.watch_gradient(tensor, probe)
        return None

    # -- backward ------------------------------------------------------------------------------
    def watch_gradient(self, tensor, probe) -> None:
        if not tensor.requires_grad:
            return
        kind = {"loss": "loss gradient", "module input": "input gradient"}.get(probe.kind, "output gradient")

        def hook(grad, probe=probe, kind=kind):
            self.record(grad, "backward", kind, probe.name, probe.module, probe.leaf)
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
                probe = self.record(loss, "loss", "loss", "loss")
                self.remember(loss, probe)
                self.watch_gradient(loss, probe)
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
        """One probe for the parameters after the step: the first non-finite one, or all finite."""
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
            self.probes.append(
                Probe(
                    len(self.probes) + 1,
                    "update",
                    "parameters",
                    "",
                    "",
                    "/".join(dtypes),
                    (total,),
                    total,
                    0,
                    0,
                    0,
                    max(largest),
                    note=f"{len(named)} parameter tensors",
                )
            )


# --------------------------------------------------------------------------------------------------
# The finder
# --------------------------------------------------------------------------------------------------
def _validate(model, optimizer, scaler, loss_fn, inputs, dtype, step):
    def got(value) -> str:
        return type(value).__name__

    if not isinstance(model, nn.Module):
        raise TypeError(f"find_first_nonfinite needs the model (an nn.Module) first, got {got(model)}.")
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(
            "optimizer must be a torch.optim optimizer (e.g. torch.optim.SGD(model.parameters(), "
            f"lr=0.1)), got {got(optimizer)}."
        )
    if scaler is not None and not all(hasattr(scaler, a) for a in ("scale", "step", "update", "get_scale")):
        raise TypeError(
            f"scaler must be a torch.amp.GradScaler (or None for no loss scaling), got {got(scaler)}."
        )
    if not callable(loss_fn):
        raise TypeError(
            f"loss_fn must be callable, e.g. torch.nn.functional.cross_entropy; got {got(loss_fn)}."
        )
    if not isinstance(inputs, torch.Tensor):
        raise TypeError(f"inputs must be a tensor (the batch the model is called with), got {got(inputs)}.")
    if dtype not in (torch.float16, torch.bfloat16):
        raise ValueError(
            "dtype must be torch.float16 or torch.bfloat16 (the autocast dtype), "
            f"got {dtype!r}. For an FP32 reference, call the model without autocast."
        )
    if not callable(step):
        raise TypeError(
            "step must be a training-step function like amp_lessons.l03_autocast_and_gradscaler.train_step, "
            f"got {got(step)}."
        )


def find_first_nonfinite(
    model, optimizer, scaler, loss_fn, inputs, targets, *, dtype=torch.float16, max_norm=None, step=None
) -> NonFiniteReport:
    """Run ONE training step with hooks and report the first non-finite value and what was finite before it.

    The arguments are those of ``amp_lessons.l03_autocast_and_gradscaler.train_step`` (which is the step run, unless you pass
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
        loss = step(
            model,
            optimizer,
            scaler,
            recorder.watch_loss(loss_fn),
            inputs,
            targets,
            dtype=dtype,
            max_norm=max_norm,
        )
    finally:
        recorder.detach()
    recorder.record_parameters()
    scale_after = float(scaler.get_scale()) if enabled else None
    one_number = isinstance(loss, torch.Tensor) and loss.numel() == 1
    loss_value = float(loss.detach().float()) if one_number else math.nan
    return NonFiniteReport(
        recorder.probes, loss_value, dtype_name(dtype), device_type, scale_before, scale_after, enabled
    )


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


def global_hook_count() -> int:
    """How many hooks are installed for *every* module (``register_module_forward_hook`` and its siblings in
    ``torch.nn.modules.module``): 0 when clean. ``hook_count`` cannot see them, they belong to no model."""
    from torch.nn.modules import module as module_module

    names = (
        "_global_forward_hooks",
        "_global_forward_pre_hooks",
        "_global_backward_hooks",
        "_global_backward_pre_hooks",
    )
    return sum(len(getattr(module_module, name, None) or {}) for name in names)
