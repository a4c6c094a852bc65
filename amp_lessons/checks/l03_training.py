"""Lesson 03's checkers: the AMP training step, and stepping a scheduler only after real updates.

``check_train_step`` is behavioural *and* diagnostic. It runs the learner's step and the reference step
(``amp_lessons.training.train_step``) from identical states in four scenarios, on the CPU with a tiny model:

1. a normal FP16 step, ``max_norm=None``, with stale gradients left in ``.grad`` by a previous iteration;
2. a BF16 step whose unscaled gradient norm is well above ``max_norm``;
3. an FP16 step whose scaled gradients overflow (``init_scale=2**40``): it must be skipped, the scale backed
   off and the parameters left untouched;
4. two consecutive FP16 steps with ``growth_interval=1`` (the scale must grow in between).

While the learner's code runs, everything it touches records what happens: the model (is autocast on in
forward, in which dtype, are the parameters still FP32), the loss function (autocast on?), a probe at the
model output (is autocast on during backward, by how much was the loss scaled, were old gradients still
there), the GradScaler and the optimizer (which methods, in which order, the gradient norm the optimizer is
about to use). A mistake is then named from what was observed, not guessed from the final numbers.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from amp_lessons.autocast_state import autocast_dtype, autocast_enabled, switch_autocast_off
from amp_lessons.checks.harness import NOT_DONE, LearnerProblem, call_learner, checker, failed, passed
from amp_lessons.environment import dtype_name, one_cpu_thread
from amp_lessons.models import TinyClassifier, seeded_weights
from amp_lessons.training import total_grad_norm
from amp_lessons.training import train_step as reference_train_step
from amp_lessons.utils import scale_text

DEVICE_TYPE = "cpu"  # every scenario runs on the CPU, whatever the learner's machine has


# ----------------------------------------------------------------------------------------------- helpers


def grad_norm(parameters) -> float:
    """Total 2-norm of the gradients (missing gradients count as zero); inf/NaN stay visible."""
    return float(total_grad_norm(parameters))


def _grads_all_zero(parameters) -> bool:
    return all(p.grad is None or not bool(p.grad.detach().ne(0).any()) for p in parameters)


def _close(a: float, b: float, rtol: float) -> bool:
    if not (math.isfinite(a) and math.isfinite(b)):
        return False
    return abs(a - b) <= rtol * max(abs(a), abs(b), 1e-30)


# ------------------------------------------------------------------------------------- recording objects


class Log:
    """What happened during one call of a training step, in order."""

    def __init__(self):
        self.events: list = []
        self.inside_scaler_step = False  # optimizer.step() called by scaler.step() vs. by the learner

    def add(self, name: str, **info) -> dict:
        event = {"name": name, **info}
        self.events.append(event)
        return event

    def names(self) -> list:
        return [e["name"] for e in self.events]

    def first(self, name: str):
        return next((e for e in self.events if e["name"] == name), None)

    def count(self, name: str) -> int:
        return sum(1 for e in self.events if e["name"] == name)


class _OutputProbe(torch.autograd.Function):
    """Identity on the model output; its backward is the first to run, so it sees the state backward starts in."""

    @staticmethod
    def forward(ctx, x, watched):
        ctx.watched = watched
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        watched = ctx.watched
        g = grad.detach().float()
        finite = bool(torch.isfinite(g).all())
        watched.log.add(
            "backward",
            autocast=autocast_enabled(DEVICE_TYPE),
            grad_absmax=float(g.abs().max()) if finite else float("inf"),
            finite=finite,
            stale=not _grads_all_zero(watched.parameters()),
        )
        return grad, None


class WatchedModel(nn.Module):
    """The model handed to the learner: a TinyClassifier whose forward records the autocast state and dtypes."""

    def __init__(self, log: Log, seed: int = 0):
        super().__init__()
        with seeded_weights(seed):
            self.core = TinyClassifier()
        self.log = log

    def forward(self, x):
        self.log.add(
            "forward",
            autocast=autocast_enabled(DEVICE_TYPE),
            autocast_cuda=autocast_enabled("cuda"),
            dtype=autocast_dtype(DEVICE_TYPE),
            param_dtypes={p.dtype for p in self.parameters()},
        )
        return _OutputProbe.apply(self.core(x), self)


class WatchedLoss:
    """Cross-entropy that records whether autocast was on when the loss was computed."""

    def __init__(self, log: Log):
        self.log = log

    def __call__(self, outputs, targets):
        self.log.add("loss", autocast=autocast_enabled(DEVICE_TYPE))
        return F.cross_entropy(outputs, targets)


class RecordingSGD(torch.optim.SGD):
    """SGD that records zero_grad() and step(), and whether step() came from scaler.step()."""

    def __init__(self, params, log: Log, lr: float = 0.1):
        super().__init__(params, lr=lr)
        self._log = log

    def zero_grad(self, set_to_none: bool = True):
        self._log.add("zero_grad")
        return super().zero_grad(set_to_none=set_to_none)

    def step(self, closure=None):
        self._log.add("optimizer.step", via_scaler=self._log.inside_scaler_step)
        return super().step(closure)


class RecordingScaler(torch.amp.GradScaler):
    """A real GradScaler that records each public call (before doing it, so the record survives its errors)."""

    def __init__(self, log: Log, **kwargs):
        super().__init__(DEVICE_TYPE, **kwargs)
        self._log = log

    def _params(self, optimizer):
        return [p for group in optimizer.param_groups for p in group["params"]]

    def scale(self, outputs):
        self._log.add("scale")
        return super().scale(outputs)

    def unscale_(self, optimizer):
        if self._log.inside_scaler_step:  # step() unscales by itself when the learner did not
            return super().unscale_(optimizer)
        self._log.add("unscale_", norm_before=grad_norm(self._params(optimizer)))
        return super().unscale_(optimizer)

    def step(self, optimizer, *args, **kwargs):
        names = self._log.names()
        since_update = names[len(names) - names[::-1].index("update"):] if "update" in names else names
        unscaled = "unscale_" in since_update
        scale = float(self._scale) if self._scale is not None else float("nan")
        params = self._params(optimizer)
        self._log.add("scaler.step", unscaled=unscaled, norm=grad_norm(params), scale=scale,
                      all_zero=_grads_all_zero(params))
        self._log.inside_scaler_step = True
        try:
            return super().step(optimizer, *args, **kwargs)
        finally:
            self._log.inside_scaler_step = False

    def update(self, new_scale=None):
        self._log.add("update")
        return super().update(new_scale)


# ------------------------------------------------------------------------------------------- scenarios


@dataclass(frozen=True)
class Scenario:
    title: str
    dtype: torch.dtype
    max_norm: float | None
    init_scale: float
    growth_interval: int = 2000
    steps: int = 1
    stale_grads: bool = False
    seed: int = 0


SCENARIOS = (
    Scenario("a normal FP16 step (max_norm=None, old gradients left in .grad)", torch.float16, None, 2.0**10,
             stale_grads=True, seed=1),
    Scenario("a BF16 step whose unscaled gradient norm is above max_norm=0.05", torch.bfloat16, 0.05, 2.0**10, seed=2),
    Scenario("an FP16 step that overflows (init_scale=2**40, max_norm=1.0)", torch.float16, 1.0, 2.0**40, seed=3),
    Scenario("two consecutive FP16 steps (growth_interval=1, max_norm=1.0)", torch.float16, 1.0, 2.0**8,
             growth_interval=1, steps=2, seed=4),
)


@dataclass
class CallRecord:
    """Everything observed during one call of a training step."""

    log: Log
    returned: object = None
    problem: LearnerProblem | None = None
    warnings: list = field(default_factory=list)
    new_scalers: int = 0
    autocast_left_on: bool = False
    norm_after: float = 0.0
    scale_before: float = 0.0
    scale_after: float = float("nan")
    params_after: list = field(default_factory=list)
    param_dtypes_after: set = field(default_factory=set)


class _Run:
    """One training run (model, optimizer, scaler, data) that a step function is called on."""

    def __init__(self, scenario: Scenario):
        self.scenario = scenario
        self.log = Log()
        self.model = WatchedModel(self.log, seed=scenario.seed)
        self.optimizer = RecordingSGD(self.model.parameters(), self.log, lr=0.1)
        self.scaler = RecordingScaler(self.log, init_scale=scenario.init_scale, growth_interval=scenario.growth_interval)
        self.loss_fn = WatchedLoss(self.log)
        g = torch.Generator().manual_seed(100 + scenario.seed)
        self.batches = [(torch.randn(8, 6, generator=g) * 2, torch.randint(0, 4, (8,), generator=g))
                        for _ in range(scenario.steps)]
        if scenario.stale_grads:
            for p in self.model.parameters():
                p.grad = torch.randn(p.shape, generator=g)

    def call(self, fn, index: int, learner: bool) -> CallRecord:
        self.log = self.model.log = self.loss_fn.log = self.optimizer._log = self.scaler._log = Log()
        record = CallRecord(self.log, scale_before=self.scaler.get_scale())
        inputs, targets = self.batches[index]
        original_init = torch.amp.GradScaler.__init__

        def counting_init(scaler_self, *args, **kwargs):
            record.new_scalers += 1
            original_init(scaler_self, *args, **kwargs)

        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torch.amp.GradScaler.__init__ = counting_init
            try:
                kwargs = {"dtype": self.scenario.dtype, "max_norm": self.scenario.max_norm}
                if learner:
                    record.returned = call_learner(fn, self.model, self.optimizer, self.scaler, self.loss_fn,
                                                   inputs.clone(), targets.clone(), what="`train_step`", **kwargs)
                else:
                    record.returned = fn(self.model, self.optimizer, self.scaler, self.loss_fn, inputs, targets, **kwargs)
            except LearnerProblem as problem:
                record.problem = problem
            finally:
                torch.amp.GradScaler.__init__ = original_init
                record.autocast_left_on = autocast_enabled(DEVICE_TYPE) or autocast_enabled("cuda")
                if record.autocast_left_on:
                    switch_autocast_off()
        record.warnings = [str(w.message) for w in caught]
        params = list(self.model.parameters())
        record.norm_after = grad_norm(params)
        record.params_after = [p.detach().clone() for p in params]
        record.param_dtypes_after = {p.dtype for p in params}
        record.scale_after = self.scaler.get_scale() if self.scaler._scale is not None else float("nan")
        return record


# ------------------------------------------------------------------------------------------- diagnosis


def _diagnose(ref: CallRecord, got: CallRecord, scenario: Scenario, step_no: int) -> str | None:
    """The named mistake in ``got`` (the learner's call), judged against ``ref``; None when it matches."""
    log = got.log
    names = log.names()
    where = f"In {scenario.title}" + (f", call {step_no + 1}" if scenario.steps > 1 else "")
    error = got.problem.result.message if got.problem is not None else ""
    text = " ".join(got.warnings) + " " + error
    lower = text.lower()

    if got.autocast_left_on:
        return (f"{where}: autocast was still switched on after train_step returned. Use it as a context manager, "
                "`with torch.autocast(device_type=..., dtype=dtype):`, so it ends after the loss.")
    if got.new_scalers:
        deprecated = " (and torch.cuda.amp.GradScaler is deprecated: use torch.amp.GradScaler)" if "torch.cuda.amp.gradscaler" in lower else ""
        return (f"{where}: your train_step created a new GradScaler{deprecated}. Create the scaler once per training "
                "run and use the one passed in: a fresh scaler starts from init_scale every step, so it never "
                "learns a safe scale, and the skip/backoff history that protects training is thrown away.")
    low_params = {d for d in got.param_dtypes_after if d != torch.float32}
    forward = log.first("forward")
    if forward is not None:
        low_params |= {d for d in forward["param_dtypes"] if d != torch.float32}
    if low_params:
        return (f"{where}: the model's parameters became {', '.join(sorted(dtype_name(d) for d in low_params))} — "
                "did you call .half() / .to(dtype) on the model? Keep FP32 master weights: autocast casts a copy "
                "per op, the optimizer updates the FP32 weights (small updates survive), and GradScaler refuses "
                "FP16 gradients ('Attempting to unscale FP16 gradients.').")
    if forward is None:
        if error:
            return f"{where}: {error}"
        return f"{where}: the model was never called. Compute `outputs = model(inputs)` inside autocast."
    if not forward["autocast"]:
        if forward["autocast_cuda"] or ("cuda" in lower and ("not available" in lower or "deprecated" in lower)):
            how = ("torch.cuda.amp.autocast (deprecated, and CUDA-only)" if "torch.cuda.amp.autocast" in lower
                   else "device_type='cuda'")
            return (f"{where}: autocast was on for CUDA but the tensors are on the CPU, so the forward pass ran in "
                    f"FP32: you used {how}. Take the device from the data: "
                    "`torch.autocast(device_type=inputs.device.type, dtype=dtype)`.")
        return (f"{where}: the forward pass did not run under autocast (the model ran in FP32). Wrap the forward "
                "pass and the loss in `with torch.autocast(device_type=inputs.device.type, dtype=dtype):`.")
    if forward["dtype"] != scenario.dtype:
        return (f"{where}: autocast ran in {dtype_name(forward['dtype'])}, but train_step was called with "
                f"dtype={dtype_name(scenario.dtype)}. Pass it on: `torch.autocast(..., dtype=dtype)`.")
    loss_event = log.first("loss")
    if loss_event is None:
        if error:
            return f"{where}: {error}"
        return f"{where}: loss_fn was never called. Compute `loss = loss_fn(outputs, targets)` inside autocast."
    if not loss_event["autocast"]:
        return (f"{where}: the loss was computed outside autocast. Put `loss = loss_fn(outputs, targets)` inside "
                "the same `with torch.autocast(...)` block as the forward pass: the policy decides the loss's "
                "precision too (on CUDA, cross_entropy and mse_loss are on its float32 list); outside it the loss "
                "runs in whatever low precision the outputs happen to have.")
    backward = log.first("backward")
    scale_event = log.first("scale")
    if backward is None:
        if error:
            return f"{where}: {error}"
        return f"{where}: there was no backward pass. Call `scaler.scale(loss).backward()` after the autocast block."
    if backward["autocast"]:
        return (f"{where}: backward ran inside the autocast block. Autocast should cover only the forward pass and "
                "the loss (the PyTorch docs advise against backward under autocast), and it is not harmless: "
                "backward ops are dispatched through autocast again, so a region you kept in FP32 with "
                "`torch.autocast(..., enabled=False)` gets low-precision gradients. Move "
                "`scaler.scale(loss).backward()` below the `with` block.")
    ref_backward = ref.log.first("backward")
    if scale_event is None or (ref_backward and ref_backward["finite"] and backward["finite"]
                               and _close(backward["grad_absmax"], ref_backward["grad_absmax"] / got.scale_before, 0.05)):
        return (f"{where}: backward ran on the unscaled loss (`loss.backward()`). Scale it first: "
                "`scaler.scale(loss).backward()`. Otherwise small FP16 gradients still underflow, and "
                "scaler.step() divides the gradients by the scale anyway, so every update is "
                f"{scale_text(got.scale_before)} times too small.")
    if ref_backward and ref_backward["finite"] and backward["finite"] and not _close(
            backward["grad_absmax"], ref_backward["grad_absmax"], 0.05):
        ratio = backward["grad_absmax"] / (ref_backward["grad_absmax"] / got.scale_before)
        return (f"{where}: the gradient reaching the model output was {ratio:.4g} times the unscaled one; with "
                f"`scaler.scale(loss).backward()` it is exactly the scale, {scale_text(got.scale_before)}. Scale the "
                "loss once, with scaler.scale, and call backward on that.")
    if _zero_grad_between(log, "backward", "scaler.step"):
        return (f"{where}: you called zero_grad() after backward: it erased this step's gradients before the "
                "optimizer used them. Zero the gradients at the start of the step, before the forward pass.")
    if backward["stale"]:
        end = (" You clear them at the end of the step: the first step of a run (or one after any other backward) "
               "still adds up old gradients, so clear at the start." if _after(log, "zero_grad", "update") else "")
        return (f"{where}: gradients from an earlier backward pass were still in .grad when backward ran, so they "
                "were added to this step's gradients. Start the step with `optimizer.zero_grad()`." + end)
    direct = [e for e in log.events if e["name"] == "optimizer.step" and not e["via_scaler"]]
    if direct:
        both = " as well as scaler.step(optimizer) (so it stepped twice)" if "scaler.step" in names else ""
        return (f"{where}: you called optimizer.step() directly{both}. Use `scaler.step(optimizer)` only: it "
                "unscales the gradients if you have not, and skips the update when they contain inf/NaN; "
                "optimizer.step() applies scaled or non-finite gradients to the weights.")
    if log.count("unscale_") > 1:
        return (f"{where}: scaler.unscale_(optimizer) was called twice in one step (torch raises 'unscale_() has "
                "already been called on this optimizer since the last update()'). Call it once, after backward "
                "and before clipping.")
    if "unscale_" in names and "scaler.step" in names and names.index("unscale_") > names.index("scaler.step"):
        return (f"{where}: scaler.unscale_() came after scaler.step(). step() has already unscaled and applied the "
                "gradients; unscale_ belongs between backward and clipping.")
    if "update" in names and ("scaler.step" not in names or names.index("update") < names.index("scaler.step")):
        return (f"{where}: scaler.update() ran before scaler.step(optimizer). update() reads the inf checks of "
                "this step's step() and then resets them, so it must come last: "
                "backward -> unscale_ -> clip -> step -> update.")
    if "scaler.step" not in names:
        if error and "non-finite" in lower and "clip" in lower:
            return (f"{where}: {error}. With a GradScaler, inf/NaN gradients are expected now and then (an "
                    "overflow that scaler.step skips): do not make clipping raise on them (error_if_nonfinite=False).")
        if error:
            return f"{where}: {error}"
        return f"{where}: the optimizer never stepped. Call `scaler.step(optimizer)` after clipping."
    step = log.first("scaler.step")
    if step["all_zero"] and not ref.log.first("scaler.step")["all_zero"]:
        return (f"{where}: all gradients were zero when scaler.step() ran: did you call zero_grad() after "
                "backward? It erases the gradients before the optimizer uses them; zero them at the start of the step.")
    if "update" not in names:
        return (f"{where}: scaler.update() was never called. Without it the scale never adapts (no backoff after "
                "an overflow, no growth), and the next scaler.step() fails with 'step() has already been called "
                "since the last update()'. End the step with `scaler.update()`.")
    if log.count("update") > 1:
        return f"{where}: scaler.update() was called {log.count('update')} times; once per step, after scaler.step()."
    if error:
        return f"{where}: {error}"

    message = _diagnose_clipping(ref, got, scenario, where)
    if message:
        return message
    return _diagnose_results(ref, got, scenario, where)


def _zero_grad_between(log: Log, start: str, end: str) -> bool:
    names = log.names()
    if start not in names:
        return False
    stop = names.index(end) if end in names else len(names)
    return "zero_grad" in names[names.index(start):stop]


def _after(log: Log, first: str, then: str) -> bool:
    """True when an event ``first`` happens after the last ``then``."""
    names = log.names()
    if first not in names or then not in names:
        return False
    last_then = len(names) - 1 - names[::-1].index(then)
    return any(i > last_then for i, n in enumerate(names) if n == first)


def _norm_used(step: dict) -> float:
    """The gradient norm the optimizer uses in a ``scaler.step`` event: step() unscales first when the learner has not."""
    return step["norm"] if step["unscaled"] else step["norm"] / step["scale"]


def _diagnose_clipping(ref: CallRecord, got: CallRecord, scenario: Scenario, where: str) -> str | None:
    ref_step, step = ref.log.first("scaler.step"), got.log.first("scaler.step")
    used, expected = _norm_used(step), _norm_used(ref_step)
    if not (math.isfinite(expected) and math.isfinite(used)):
        return None  # an overflowing step: judged by what happened to the parameters and the scale
    if _close(used, expected, 0.02):
        if scenario.max_norm is not None and not step["unscaled"] and _close(
                step["norm"], scenario.max_norm * step["scale"], 0.02):
            return (f"{where}: you clipped the still-scaled gradients against max_norm * scale. The update comes out "
                    "right here, but clip_grad_norm_ returns a norm that is `scale` times too large (the number you "
                    "would log or guard on), and get_scale() synchronises with the GPU every step. Call "
                    "`scaler.unscale_(optimizer)` and clip the true gradients with the plain `max_norm`.")
        return None
    unscaled_too = got.log.first("unscale_") is not None  # yet the norm says it clipped the scaled gradients
    if scenario.max_norm is None:
        return (f"{where}: max_norm is None, which means no clipping, but the gradient norm the optimizer used was "
                f"{used:.4g} instead of {expected:.4g}. Clip only `if max_norm is not None:`.")
    scale = step["scale"]
    if _close(used, scenario.max_norm / scale, 0.05):
        if unscaled_too:
            return (f"{where}: you clipped before scaler.unscale_(). clip_grad_norm_ saw gradients {scale_text(scale)} "
                    f"times too large and cut them to norm {scenario.max_norm}; after unscaling the update had norm "
                    f"{used:.3g}, {scale_text(scale)} times smaller than intended. Call unscale_ first, then clip.")
        return (f"{where}: you clipped without calling scaler.unscale_(optimizer) first. clip_grad_norm_ saw the "
                f"scaled gradients ({scale_text(scale)} times too large) and cut them to norm {scenario.max_norm}; "
                f"scaler.step() then unscaled them to norm {used:.3g}. Call `scaler.unscale_(optimizer)` before clipping.")
    ref_unscale = ref.log.first("unscale_")
    raw = ref_unscale["norm_before"] / ref_step["scale"] if ref_unscale else float("nan")
    if used > scenario.max_norm * 1.02 and not _close(used, raw, 0.02):
        return (f"{where}: the gradient norm the optimizer used was {used:.4g}: the gradients were changed, but not "
                f"clipped to total norm max_norm={scenario.max_norm} (unclipped it is {raw:.4g}). Use "
                "`torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)`, not clip_grad_value_, after unscale_.")
    if used > scenario.max_norm * 1.02:
        if _close(got.norm_after, scenario.max_norm, 0.02) or got.norm_after < used * 0.98:
            return (f"{where}: you clipped after scaler.step(): the optimizer had already used gradients of norm "
                    f"{used:.4g} > max_norm={scenario.max_norm}. Clip between unscale_ and step.")
        return (f"{where}: the gradients were not clipped: the optimizer used a gradient norm of {used:.4g} although "
                f"max_norm={scenario.max_norm}. After `scaler.unscale_(optimizer)`, call "
                "`torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)`.")
    return (f"{where}: the gradient norm the optimizer used was {used:.4g}, but clipping the unscaled gradients to "
            f"max_norm={scenario.max_norm} gives {expected:.4g}. Use clip_grad_norm_ (not clip_grad_value_) on "
            "model.parameters() with max_norm, after unscale_.")


def _diagnose_results(ref: CallRecord, got: CallRecord, scenario: Scenario, where: str) -> str | None:
    if not _close(got.scale_after, ref.scale_after, 1e-6):
        return (f"{where}: the loss scale after the step is {scale_text(got.scale_after)}; the reference step leaves "
                f"{scale_text(ref.scale_after)}. Call scaler.update() exactly once, after scaler.step(optimizer).")
    skipped = ref.log.count("optimizer.step") == 0
    for p_ref, p_got in zip(ref.params_after, got.params_after):
        if p_ref.shape != p_got.shape or not torch.allclose(p_ref, p_got, rtol=1e-3, atol=1e-5, equal_nan=True):
            if skipped:
                return (f"{where}: this step overflowed and must be skipped, but the parameters changed. "
                        "scaler.step(optimizer) skips optimizer.step() when the gradients contain inf/NaN.")
            diff = (p_ref - p_got).abs().max().item() if p_ref.shape == p_got.shape else float("nan")
            return (f"{where}: after your step the parameters differ from the reference step's by up to {diff:.3g}, "
                    "although every call looked right. Follow the order zero_grad -> autocast(forward, loss) -> "
                    "scaler.scale(loss).backward() -> unscale_ -> clip -> scaler.step -> scaler.update.")
    return _diagnose_return(ref, got, where)


def _diagnose_return(ref: CallRecord, got: CallRecord, where: str) -> str | None:
    value = got.returned
    if value is None:
        return f"{where}: train_step returned None. Return the unscaled loss (e.g. `return loss.detach()`)."
    if isinstance(value, torch.Tensor):
        if value.numel() != 1:
            return f"{where}: train_step returned a tensor of shape {tuple(value.shape)}; return the scalar loss."
        number = float(value.detach().float())
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        number = float(value)
    else:
        return f"{where}: train_step returned a {type(value).__name__}; return the unscaled loss tensor."
    expected = float(ref.returned)
    if _close(number, expected, 1e-3):
        return None
    scale = got.scale_before
    if _close(number, expected * scale, 1e-3):
        return (f"{where}: train_step returned the scaled loss ({number:.6g} = loss x {scale_text(scale)}). "
                "Return the loss as loss_fn computed it; scaler.scale(loss) is only for backward.")
    return f"{where}: train_step returned {number:.6g}, but the loss of this batch is {expected:.6g}."


# ------------------------------------------------------------------------------------------- the checkers


def hardcoded_device(fn) -> str | None:
    """'cpu' or 'cuda' when the function's source contains that string literal (a hard-coded device type)."""
    import ast
    import inspect
    import textwrap

    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
    except (OSError, TypeError, SyntaxError, IndentationError):
        return None
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and node.value in ("cpu", "cuda"):
            return node.value
    return None


def _judge_train_step(train_step):
    """Run every scenario; the first named mistake as a failed result, a "not done" result, or None."""
    for scenario in SCENARIOS:
        reference, learner = _Run(scenario), _Run(scenario)
        for step_no in range(scenario.steps):
            ref = reference.call(reference_train_step, step_no, learner=False)  # its errors are checker bugs
            got = learner.call(train_step, step_no, learner=True)
            if got.problem is not None and got.problem.result.status == NOT_DONE:
                return got.problem.result
            message = _diagnose(ref, got, scenario, step_no)
            if message:
                return failed(message)
    return None


@checker("03.1 the AMP training step")
def check_train_step(train_step):
    """``train_step(model, optimizer, scaler, loss_fn, inputs, targets, *, dtype, max_norm) -> loss``."""
    if not callable(train_step):
        call_learner(train_step)  # turns None / a string / a number into a clear message
    # the check seeds its models (the learner's random stream is left alone) and runs them on one thread (fast)
    with torch.random.fork_rng(devices=[]), one_cpu_thread():
        result = _judge_train_step(train_step)
    if result is not None:
        return result
    device = hardcoded_device(train_step)
    if device:
        return failed(f"Your step behaves like the reference here, but it hard-codes the device type '{device}'. On "
                      "another machine autocast would then be on for the wrong device and do nothing. Use "
                      "`device_type = inputs.device.type` (and the scaler you are given).")
    return passed(
        "Your step matches the reference in all four scenarios: autocast around forward and loss, scaled backward "
        "outside it, unscale_ before clipping, scaler.step + update, overflowing steps skipped with the scale "
        "backed off, and the scale growing between consecutive steps."
    )


# ----------------------------------------------------------------------- exercise 2: scheduler after real updates

# overflow pattern of the scheduler check: skipped first steps (a too-large init_scale), growth, a later spike
SCHEDULER_PATTERN = (True, True, False, False, False, True, False, False, False, False)


class CountingStepLR(torch.optim.lr_scheduler.StepLR):
    """StepLR that counts the learner's calls to step()."""

    def __init__(self, optimizer):
        self.calls = 0
        super().__init__(optimizer, step_size=1, gamma=0.9)
        self.calls = 0  # the constructor's own initial step does not count

    def step(self, *args, **kwargs):
        self.calls += 1
        return super().step(*args, **kwargs)


def _scheduler_setup():
    """A one-weight model, its optimizer and a real GradScaler (init_scale=2**8, growth_interval=2)."""
    weight = nn.Parameter(torch.ones(4))
    optimizer = torch.optim.SGD([weight], lr=0.1)
    scaler = torch.amp.GradScaler(DEVICE_TYPE, init_scale=2.0**8, growth_interval=2)
    x = torch.linspace(0.5, 2.0, 4)
    return weight, optimizer, scaler, x


@checker("03.2 step the scheduler only after real updates")
def check_scheduler_step(step_scheduler_if_updated):
    """``step_scheduler_if_updated(scaler, scheduler, scale_before) -> bool`` after ``scaler.update()``."""
    weight, optimizer, scaler, x = _scheduler_setup()
    scheduler = CountingStepLR(optimizer)
    with warnings.catch_warnings(), one_cpu_thread():
        warnings.simplefilter("ignore")  # the 'lr_scheduler.step() before optimizer.step()' warning is the lesson's
        for iteration, overflow in enumerate(SCHEDULER_PATTERN):
            optimizer.zero_grad()
            scale_before = scaler.get_scale()
            scaler.scale((weight * x).sum()).backward()
            if overflow:
                weight.grad[0] = float("inf")
            scaler.step(optimizer)
            scaler.update()
            scale_after = scaler.get_scale()
            calls_before = scheduler.calls
            got = call_learner(step_scheduler_if_updated, scaler, scheduler, scale_before,
                               what="`step_scheduler_if_updated`")
            calls = scheduler.calls - calls_before
            if scaler.get_scale() != scale_after:
                return failed("Your function changed the loss scale: it must only read it (scaler.get_scale()); "
                              "scaler.update() already ran in this iteration.")
            if isinstance(got, torch.Tensor) and got.numel() == 1 and got.dtype == torch.bool:
                got = bool(got)
            if type(got).__name__ not in ("bool", "bool_"):
                return failed(f"step_scheduler_if_updated returned {got!r}; return True when the optimizer really "
                              "stepped (and you stepped the scheduler), False otherwise.")
            got = bool(got)
            change = (f"the scale went from {scale_text(scale_before)} to {scale_text(scale_after)}"
                      if scale_after != scale_before else f"the scale stayed at {scale_text(scale_after)}")
            if overflow:
                if got or calls:
                    return failed(
                        f"Iteration {iteration} overflowed and scaler.step() skipped the update ({change}), but "
                        + ("you stepped the scheduler" if calls else "you returned True")
                        + ". A skipped update must not advance the schedule: a drop in the scale means skipped.")
                continue
            if not got:
                why = ("the scale grew, which GradScaler only does after growth_interval successful steps"
                       if scale_after > scale_before else "an unchanged scale means there was no overflow")
                return failed(f"Iteration {iteration} really updated the weights ({change}: {why}), but you returned "
                              "False. Compare with `>=`: only a *drop* in the scale means a skipped step.")
            if calls != 1:
                return failed(f"Iteration {iteration} really updated the weights and you returned True, but "
                              f"scheduler.step() was called {calls} times; call it exactly once when the step was real.")
    updates = SCHEDULER_PATTERN.count(False)
    return passed(f"Over {len(SCHEDULER_PATTERN)} iterations with {SCHEDULER_PATTERN.count(True)} skipped updates "
                  f"you stepped the scheduler exactly {updates} times, once per real optimizer update.")
