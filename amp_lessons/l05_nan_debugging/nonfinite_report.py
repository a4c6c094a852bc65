"""Lesson 05: what ``find_first_nonfinite`` saw — one ``Probe`` per tensor, read by a ``NonFiniteReport``.

A probe is the statistics of one tensor at one point of a training step (its dtype, how many NaN/+inf/-inf
it holds, its largest finite magnitude); no tensor is kept. The report holds the probes in the order the
values were produced and singles out the first non-finite one: everything after it is computed from it,
so only the first one is a cause. Its words (``headline``, ``explanation``) say *why* that value broke —
float16's range (65504), an invalid operation (0/0, inf - inf), the data, the loss or the update — and
what was still finite just before it. ``plot_probes`` draws the same story as bars.
"""

from __future__ import annotations

import html
import math
from dataclasses import dataclass, field

import torch

from amp_lessons.core.display import scale_text
from amp_lessons.l03_autocast_and_gradscaler.training import step_was_skipped

FP16_MAX = float(torch.finfo(torch.float16).max)  # 65504
STAGES = ("input", "forward", "loss", "backward", "update")


# --------------------------------------------------------------------------------------------------
# One probe: the statistics of one tensor at one point of the step
# --------------------------------------------------------------------------------------------------
@dataclass
class Probe:
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
        after_step = f"parameter `{self.name}` after the step" if self.name else "parameters after the step"
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
            "parameters": after_step,
        }
        return labels.get(self.kind, f"{self.kind} {self.name}")

    def counts(self) -> str:
        """'3 NaN, 12 +inf of 288 values' or 'all 288 finite'."""
        if self.finite:
            return f"all {self.numel} finite"
        counted = ((self.nan, "NaN"), (self.posinf, "+inf"), (self.neginf, "-inf"))
        parts = [f"{n} {label}" for n, label in counted if n]
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
            largest = float(t.abs().max()) if t.numel() else math.nan
            return {"nan": 0, "posinf": 0, "neginf": 0, "max_abs": largest}
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
# The report
# --------------------------------------------------------------------------------------------------
def _of_first(attribute: str) -> property:
    """A read-only property: ``attribute`` of the first non-finite probe (None when all are finite)."""
    return property(
        lambda report: getattr(report.first, attribute) if report.first else None,
        doc=f"The first non-finite probe's {attribute} (None when every probe is finite).",
    )


def _range_note(first: Probe) -> str:
    """Why the first non-finite value appeared, read from its dtype: float16's range, or an invalid op."""
    overflow = bool(first.posinf or first.neginf)
    if overflow and first.dtype == "float16" and first.kind == "module input":
        return (
            f" float16 holds at most {FP16_MAX:g}: an inline op produced a value beyond it (what you see "
            "may have been divided or reshaped afterwards, but inf stays inf)."
        )
    if overflow and first.dtype == "float16":
        largest = (
            ""
            if math.isnan(first.max_abs)
            else f" (this tensor's largest value that stayed finite is {first.max_abs:.6g})"
        )
        return (
            f" float16 holds at most {FP16_MAX:g}{largest}; values beyond {FP16_MAX:g} become inf — an "
            "overflow caused by the precision, not by the data."
        )
    if overflow and first.dtype == "bfloat16":
        return (
            " bfloat16 has float32's range, so this would overflow in float32 as well: look at the "
            "values, not the precision."
        )
    if not overflow:
        return (
            " NaN without any inf from finite inputs means an invalid operation (0/0, inf-inf, "
            "sqrt or log of a negative number)."
        )
    return ""


@dataclass
class NonFiniteReport:
    """Everything ``find_first_nonfinite`` saw, with the first non-finite probe singled out."""

    probes: list
    loss: float
    autocast_dtype: str
    device_type: str
    scale_before: float | None = None
    scale_after: float | None = None
    scaler_enabled: bool = False
    first: Probe | None = field(init=False, default=None)

    def __post_init__(self) -> None:
        self.first = next((p for p in self.probes if not p.finite), None)

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
        """The probes produced before the first non-finite one (all finite)."""
        if self.first is None:
            return list(self.probes)
        return [p for p in self.probes if p.order < self.first.order]

    @property
    def skipped(self) -> bool | None:
        """Did GradScaler skip the optimizer step (the scale went down)? None without an enabled scaler."""
        if not self.scaler_enabled or self.scale_before is None or self.scale_after is None:
            return None
        return step_was_skipped(self.scale_before, self.scale_after)

    def probe(self, stage: str, name: str) -> Probe | None:
        """The first probe of ``stage`` about ``name`` (e.g. ``("forward", "scores")``)."""
        return next((p for p in self.probes if p.stage == stage and p.name == name), None)

    # -- words ---------------------------------------------------------------------------------
    def headline(self) -> str:
        if self.first is None:
            return (
                f"Every probe is finite ({len(self.probes)} checked: data, forward, loss, backward, "
                "parameters)."
            )
        return f"First non-finite value: {self.first.where} — {self.first.dtype}, {self.first.counts()}."

    def explanation(self) -> str:
        first = self.first
        if first is None:
            return (
                "Nothing to fix in this step: the data, every module output, the loss and every gradient "
                "are finite."
            )
        before = self.before
        last_ok = ""
        if before:
            last_ok = f" The last finite probe before it: {before[-1].where} ({before[-1].dtype})."
        range_note = _range_note(first)
        if first.stage == "input":
            return (
                f"The {first.name} are non-finite before the model runs: fix the data pipeline; autocast "
                "and the loss scale are not involved."
            )
        if first.kind == "module input":
            return (
                f"Every module output before it was finite, yet the value entering `{first.name}` is "
                f"not: it was {first.note}. Read that forward code between the submodules (an inline "
                "`@`, `exp`, division, ...), or give that op its own nn.Module so the finder can name "
                f"it.{range_note}{last_ok}"
            )
        if first.kind == "module output" and first.leaf:
            return (
                f"`{first.name}` ({first.module}) received finite inputs and produced non-finite values "
                f"in {first.dtype}: the culprit is the computation inside this module."
                f"{range_note}{last_ok}"
            )
        if first.kind == "module output":
            return (
                f"All submodules of `{first.name}` returned finite values, so the non-finite value was "
                f"computed by `{first.name}`'s own forward code (an op that is not a submodule)."
                f"{range_note}{last_ok}"
            )
        if first.stage == "loss":
            return (
                f"The model's outputs were finite but the loss is not ({first.dtype}): look at the loss "
                f"function and the targets (log of 0, division by a zero count, ...).{range_note}"
            )
        if first.stage == "backward":
            return self._backward_explanation(range_note)
        return (
            "Every gradient was finite but a parameter is not after the optimizer step: the update "
            "itself overflowed (learning rate too large, or a step taken without GradScaler's inf "
            "check)."
        )

    def _backward_explanation(self, range_note: str) -> str:
        """A finite loss, a non-finite gradient: float16 weight gradients, and what GradScaler does next."""
        first = self.first
        overflow = bool(first.posinf or first.neginf)
        if first.kind == "parameter gradient" and overflow and self.autocast_dtype == "float16":
            range_note = (
                " The parameter (and so its .grad) is float32, but autocast ran the layer on a "
                "float16 copy of it: the weight gradient was computed in float16, overflowed "
                "there, and was then cast to float32."
            )
        scale = ""
        if self.scaler_enabled and self.scale_before is not None:
            scale = (
                f" Gradients here are multiplied by the loss scale {scale_text(self.scale_before)}; "
                "GradScaler sees the inf/NaN, skips this optimizer step and lowers the scale. Once, "
                "early on, that is calibration; at every step it is a problem to find."
            )
        return (
            f"The forward pass and the loss ({self.loss:.6g}) were finite — a finite loss does not "
            f"guarantee finite gradients. The first non-finite gradient is the {first.where}, "
            f"in {first.dtype}.{range_note}{scale}"
        )

    # -- tables and rendering ------------------------------------------------------------------
    def table(self, *, upto_first: bool = False):
        """A pandas DataFrame, one row per probe in the order they were produced."""
        import pandas as pd

        rows = self.probes
        if upto_first and self.first is not None:
            rows = [p for p in rows if p.order <= self.first.order]
        return pd.DataFrame([p.row() for p in rows]).set_index("#") if rows else pd.DataFrame()

    def _context(self, keep: int = 6) -> tuple[list, int]:
        """The probes to show: the last ``keep`` finite ones before the first non-finite, then it."""
        if self.first is None:
            return self.probes[-keep:], max(0, len(self.probes) - keep)
        before = self.before
        shown = before[-keep:] + [self.first]
        return shown, len(before) - len(before[-keep:])

    def _later(self) -> int:
        """How many probes come after the first non-finite one (0 when every probe is finite)."""
        return len(self.probes) - (self.first.order if self.first else len(self.probes))

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
            lines.append(f"  ... {hidden} earlier finite probes (report.table() lists all)")
        for p in shown:
            mark = "OK " if p.finite else ">> "
            largest = "-" if math.isnan(p.max_abs) else f"{p.max_abs:.4g}"
            lines.append(
                f"  {mark}#{p.order:<3} {p.stage:8s} {p.where:55s} {p.dtype:9s} "
                f"max|x| {largest:>10s}  {p.counts()}"
            )
        later = self._later()
        if later:
            bad = sum(1 for p in self.probes if self.first and p.order > self.first.order and not p.finite)
            lines.append(
                f"  ... then {later} later probes, {bad} of them non-finite (consequences, not causes)"
            )
        return "\n".join(lines)

    def __repr__(self) -> str:
        return str(self)

    def _repr_html_(self) -> str:
        shown, hidden = self._context()
        colour = ("#ffebee", "#c62828") if self.found else ("#e8f5e9", "#2e7d32")
        rows = []
        for p in shown:
            style = "" if p.finite else " style='background:#ffcdd2;font-weight:bold'"
            largest = "–" if math.isnan(p.max_abs) else f"{p.max_abs:.4g}"
            rows.append(
                f"<tr{style}><td>{p.order}</td><td>{p.stage}</td><td>{html.escape(p.where)}</td>"
                f"<td>{p.dtype}</td><td style='text-align:right'>{largest}</td>"
                f"<td>{html.escape(p.counts())}</td></tr>"
            )
        note = f"<tr><td colspan=6><i>… {hidden} earlier finite probes</i></td></tr>" if hidden else ""
        later = self._later()
        tail = (
            (
                f"<tr><td colspan=6><i>… then {later} later probes (consequences, not causes); "
                "<code>report.table()</code> lists all</i></td></tr>"
            )
            if later
            else ""
        )
        return (
            f"<div style='background:{colour[0]};border-left:6px solid {colour[1]};padding:8px 12px;"
            f"border-radius:4px'><b>{html.escape(self.headline())}</b>"
            f"<div style='margin:4px 0'>{html.escape(self.explanation())}</div>"
            f"<div style='color:#555;font-size:90%'>{html.escape(self._step_line())}</div>"
            "<table style='margin-top:6px;font-size:90%'><tr><th>#</th><th>stage</th><th>where</th>"
            "<th>dtype</th><th>max |finite|</th><th>values</th></tr>"
            f"{note}{''.join(rows)}{tail}</table></div>"
        )


def plot_probes(report: NonFiniteReport, *, stages=("input", "forward", "loss"), ax=None):
    """Bar chart: largest finite magnitude at each probe, in order, against the float16 maximum.

    Non-finite probes are drawn red, reaching the top of the axis, so the first red bar is the place
    to look and everything to its right is a consequence.
    """
    import matplotlib.pyplot as plt

    if not isinstance(report, NonFiniteReport):
        raise TypeError(
            f"plot_probes needs a NonFiniteReport (from find_first_nonfinite), got {type(report).__name__}"
        )
    points = [p for p in report.probes if p.stage in stages]
    if ax is None:
        _, ax = plt.subplots(figsize=(9, 3.2))
    finite_values = [p.max_abs for p in points if p.finite and p.max_abs > 0 and not math.isnan(p.max_abs)]
    top = max(finite_values + [FP16_MAX]) * 30
    for i, p in enumerate(points):
        if p.finite:
            value = p.max_abs if p.max_abs > 0 else 1e-3
            ax.bar(i, value, color="#66bb6a")
        else:
            ax.bar(i, top, color="#e53935" if p is report.first else "#ef9a9a")
    ax.axhline(FP16_MAX, color="k", linestyle="--", linewidth=1)
    ax.text(len(points) - 0.5, FP16_MAX * 1.3, "float16 max 65504", ha="right", va="bottom", fontsize=8)
    ax.set_yscale("log")
    ax.set_xticks(range(len(points)))
    labels = [p.where.replace("output of ", "").replace("data: ", "").replace("`", "") for p in points]
    ax.set_xticklabels(labels, rotation=35, ha="right", fontsize=8)
    ax.set_ylabel("largest |value|")
    ax.set_title("Largest magnitude at each probe, in the order produced (red: non-finite)")
    ax.figure.tight_layout()
    return ax.figure
