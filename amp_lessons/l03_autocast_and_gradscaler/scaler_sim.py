"""Lesson 03: a GradScaler simulator: the loss-scale arithmetic of ``torch.amp.GradScaler`` as a function.

What ``scaler.update()`` does after each iteration (``torch._amp_update_scale_``, the same CPU and CUDA
kernel):

- if any gradient was inf/NaN this iteration ("found_inf"), the optimizer step was skipped:
  ``scale = float32(scale * backoff_factor)`` and the growth tracker resets to 0;
- otherwise the tracker counts one more clean step; when it reaches ``growth_interval`` the scale becomes
  ``float32(scale * growth_factor)`` (kept unchanged if that would be inf) and the tracker resets to 0.

The scale lives in a float32 tensor and the factors are doubles, so each product is computed in double and
rounded to float32 — ``simulate_scaler`` does the same, so its scales equal torch's bit for bit (a test drives
a real ``torch.amp.GradScaler`` through the same overflow pattern and compares).

An "overflow pattern" says which iterations produce inf/NaN gradients. It is either a sequence of booleans or
a function ``(iteration, scale) -> bool``: real overflows depend on the scale (a gradient ``g`` overflows FP16
once ``scale * |g| > 65504``), which ``threshold_pattern`` models.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

FP16_MAX = 65504.0


@dataclass
class ScalerRun:
    """What happened over a run: the scale each iteration used, which ones overflowed, the real updates."""

    scales: list = field(default_factory=list)  # scale used by iteration i (before its update())
    overflow: list = field(default_factory=list)  # True where iteration i had inf/NaN gradients (skipped)
    growth_trackers: list = field(default_factory=list)  # tracker after iteration i's update()
    scale_after: float = 0.0  # scale after the last update()

    @property
    def iterations(self) -> int:
        return len(self.scales)

    @property
    def updates(self) -> int:
        """Real optimizer updates = iterations whose step was not skipped."""
        return sum(1 for o in self.overflow if not o)

    @property
    def skipped(self) -> int:
        return sum(1 for o in self.overflow if o)

    def table(self):
        import pandas as pd

        return pd.DataFrame(
            {
                "iteration": range(self.iterations),
                "scale used": self.scales,
                "log2(scale)": [math.log2(s) if s > 0 else float("-inf") for s in self.scales],
                "overflow -> skipped": self.overflow,
                "growth tracker after": self.growth_trackers,
            }
        )


def _check_factors(init_scale, growth_factor, backoff_factor, growth_interval) -> None:
    def number(name, value):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(float(value)):
            raise TypeError(f"{name} must be a finite number, not {value!r}.")

    for name, value in (
        ("init_scale", init_scale),
        ("growth_factor", growth_factor),
        ("backoff_factor", backoff_factor),
    ):
        number(name, value)
    if init_scale <= 0:
        raise ValueError(f"init_scale must be positive (e.g. 2.0**16), not {init_scale!r}.")
    if growth_factor <= 1.0:
        raise ValueError(f"growth_factor must be > 1.0 (torch refuses anything else), not {growth_factor!r}.")
    if not 0.0 < backoff_factor < 1.0:
        raise ValueError(
            f"backoff_factor must be between 0 and 1 (torch's default is 0.5), not {backoff_factor!r}."
        )
    if (
        isinstance(growth_interval, bool)
        or not isinstance(growth_interval, (int, np.integer))
        or growth_interval < 1
    ):
        raise ValueError(
            f"growth_interval must be a whole number >= 1 (torch's default is 2000), not {growth_interval!r}."
        )


def simulate_scaler(
    overflows,
    *,
    iterations: int | None = None,
    init_scale: float = 2.0**16,
    growth_factor: float = 2.0,
    backoff_factor: float = 0.5,
    growth_interval: int = 2000,
) -> ScalerRun:
    """Replay GradScaler's scale updates over an overflow pattern; returns a ``ScalerRun``.

    ``overflows``: a sequence of booleans (one per iteration), or a function ``(iteration, scale) -> bool``
    together with ``iterations``.
    """
    _check_factors(init_scale, growth_factor, backoff_factor, growth_interval)
    if callable(overflows):
        if isinstance(iterations, bool) or not isinstance(iterations, (int, np.integer)) or iterations < 0:
            raise ValueError("With an overflow function, pass iterations=<number of iterations to simulate>.")
        decide, count = overflows, int(iterations)
    else:
        try:
            pattern = [bool(o) for o in overflows]
        except TypeError:
            raise TypeError(
                "overflows must be a list of True/False (one per iteration) or a function (iteration, "
                "scale) -> bool."
            ) from None
        if iterations is not None and iterations != len(pattern):
            raise ValueError(
                f"iterations={iterations} but the pattern has {len(pattern)} entries; leave iterations out."
            )
        decide, count = (lambda i, s: pattern[i]), len(pattern)

    scale = np.float32(init_scale)  # torch.full((), init_scale, dtype=torch.float32)
    tracker = 0  # int32 growth tracker
    run = ScalerRun()
    with np.errstate(over="ignore"):
        for i in range(count):
            found_inf = bool(decide(i, float(scale)))
            run.scales.append(float(scale))
            run.overflow.append(found_inf)
            if found_inf:
                scale = np.float32(float(scale) * float(backoff_factor))
                tracker = 0
            else:
                successful = tracker + 1
                if successful == growth_interval:
                    grown = np.float32(float(scale) * float(growth_factor))
                    if np.isfinite(grown):
                        scale = grown
                    tracker = 0
                else:
                    tracker = successful
            run.growth_trackers.append(tracker)
    run.scale_after = float(scale)
    return run


# --- overflow patterns for the widget and the lesson --------------------------------------------------------


def threshold_pattern(max_abs_grad: float, limit: float = FP16_MAX):
    """Overflow whenever ``scale * max_abs_grad`` exceeds ``limit`` (FP16's largest finite value by default).

    This is what really happens in FP16 training: the largest gradient decides the largest safe scale.
    """
    if not max_abs_grad > 0:
        raise ValueError("max_abs_grad must be positive.")
    return lambda iteration, scale: scale * max_abs_grad > limit


def first_n_pattern(n: int):
    """The first ``n`` iterations overflow (e.g. a warm-up with a too-large init_scale), none after."""
    return lambda iteration, scale: iteration < n


def every_k_pattern(k: int, start: int = 0):
    """A rare spike: every ``k``-th iteration (from ``start``) overflows whatever the scale."""
    if k < 1:
        raise ValueError("k must be >= 1.")
    return lambda iteration, scale: iteration >= start and (iteration - start) % k == 0


PATTERNS = {
    "gradient limit (|g|max)": "threshold",
    "first N iterations": "first_n",
    "every k-th iteration": "every_k",
    "never": "never",
}


def make_pattern(kind: str, value: float):
    """A pattern by name: 'threshold' (value: log2 of the largest |gradient|), 'first_n', 'every_k' or
    'never'."""
    if kind == "threshold":
        return threshold_pattern(2.0 ** float(value))
    if kind == "first_n":
        return first_n_pattern(int(value))
    if kind == "every_k":
        return every_k_pattern(max(1, int(value)))
    if kind == "never":
        return lambda iteration, scale: False
    raise ValueError(f"kind must be one of {sorted(set(PATTERNS.values()))}, not {kind!r}.")


def scaler_figure(run: ScalerRun, title: str = ""):
    """log2(scale) per iteration, skipped iterations marked in red; the update count in the title."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 3.2))
    its = list(range(run.iterations))
    logs = [math.log2(s) if s > 0 else float("nan") for s in run.scales]
    ax.step(its, logs, where="post", color="#1565c0", label="log2(scale used)")
    skipped = [i for i in its if run.overflow[i]]
    if skipped:
        ax.scatter(
            skipped,
            [logs[i] for i in skipped],
            color="#c62828",
            zorder=3,
            s=18,
            label="overflow: step skipped",
        )
    ax.set_xlabel("iteration")
    ax.set_ylabel("log2(scale)")
    head = title + "\n" if title else ""
    ax.set_title(
        f"{head}{run.iterations} iterations, {run.updates} real optimizer updates, {run.skipped} skipped"
    )
    ax.grid(alpha=0.3)
    ax.legend(loc="best", fontsize=8)
    fig.tight_layout()
    return fig


def scaler_widget(iterations: int = 300):
    """Sliders for init scale, growth factor, backoff, growth interval, overflow pattern -> redrawn curve."""
    import ipywidgets as widgets
    import matplotlib.pyplot as plt

    style = {"description_width": "150px"}
    layout = widgets.Layout(width="460px")
    # continuous_update off: a slider that updates while it moves also snaps a value typed into its readout to
    # its step and sends that back over the typed one (2.03 became 2.05); and each redraw simulates every iteration.
    look = {"style": style, "layout": layout, "continuous_update": False}
    init_exp = widgets.IntSlider(value=16, min=0, max=32, description="init_scale = 2^", **look)
    growth = widgets.FloatSlider(value=2.0, min=1.05, max=4.0, step=0.05, description="growth_factor", **look)
    backoff = widgets.FloatSlider(
        value=0.5, min=0.05, max=0.95, step=0.05, description="backoff_factor", **look
    )
    interval = widgets.IntSlider(value=50, min=1, max=500, description="growth_interval", **look)
    kind = widgets.Dropdown(
        options=list(PATTERNS.items()),
        value="threshold",
        description="overflow pattern",
        style=style,
        layout=layout,
    )
    value = widgets.FloatSlider(value=-3.0, min=-20, max=20, step=1, description="log2|g|max / N / k", **look)

    def draw(init_exp, growth, backoff, interval, kind, value):
        run = simulate_scaler(
            make_pattern(kind, value),
            iterations=iterations,
            init_scale=2.0**init_exp,
            growth_factor=growth,
            backoff_factor=backoff,
            growth_interval=interval,
        )
        scaler_figure(run)
        plt.show()

    out = widgets.interactive_output(
        draw,
        {
            "init_exp": init_exp,
            "growth": growth,
            "backoff": backoff,
            "interval": interval,
            "kind": kind,
            "value": value,
        },
    )
    controls = widgets.HBox(
        [widgets.VBox([init_exp, growth, backoff]), widgets.VBox([interval, kind, value])]
    )
    ui = widgets.VBox([controls, out])
    return ui
