"""Lesson 07: measure time and memory of training-step variants honestly.

What "honestly" means here, and why each rule exists:

- **Warm-up first.** The first calls of a step pay one-off costs (allocator growth, kernel selection and
  autotuning, lazy initialisation, caches). They are run and thrown away before anything is timed.
- **Synchronise.** A GPU runs work asynchronously: a Python call returns when the kernels are *queued*,
  not when they have finished. Without ``torch.cuda.synchronize`` (or CUDA events read after a
  synchronisation) a timer measures the launch, not the work. On a CPU every op finishes before the call
  returns, so synchronising is a no-op there — but the code stays the same on both.
- **Repeat and report the spread.** One timing is an anecdote. We keep every repeat and report the
  median (robust to the odd slow repeat caused by another process) and the interquartile range.
- **No diagnostics inside the timed region.** ``loss.item()``, ``torch.isfinite(...)``, ``print`` are work
  (and on a GPU each ``.item()`` is a synchronisation that stops the CPU queueing the next step). The step
  outputs are kept and checked *after* the timed region.
- **Same model, shapes, batch and data for every variant**, so the only difference is the precision.
- **Memory**: on a GPU, ``torch.cuda.max_memory_allocated`` after ``reset_peak_memory_stats`` gives the peak
  of the tensors torch allocated (``measure`` reports it). Everywhere else, and by kind, memory is measured
  by ``amp_lessons.l07_measuring_gains.memory``.
"""

from __future__ import annotations

import functools
import statistics
import time
from dataclasses import dataclass

import torch

# ----------------------------------------------------------------------------- synchronisation


def synchronize(device) -> None:
    """Wait until every queued operation on ``device`` has finished (a no-op on the CPU)."""
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def make_synchronizer(device):
    """A zero-argument ``sync()`` for ``device``: ``torch.cuda.synchronize`` on a GPU, a no-op on the CPU."""
    return functools.partial(synchronize, torch.device(device))


# ----------------------------------------------------------------------------- measurements


def _quantile(values, q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    position = (len(ordered) - 1) * q
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


@dataclass
class Measurement:
    """Every timed repeat of one variant (seconds per call), its memory, and whether outputs were finite."""

    label: str
    times: list
    device: str = "cpu"
    peak_memory_bytes: int | None = None  # GPU: peak allocated during the timed repeats (None on CPU)
    start_memory_bytes: int | None = None  # GPU: allocated before the timed repeats (weights, optimizer)
    all_finite: bool | None = None  # checked after the timed region, never inside it

    @property
    def median(self) -> float:
        return statistics.median(self.times) if self.times else float("nan")

    @property
    def q25(self) -> float:
        return _quantile(self.times, 0.25)

    @property
    def q75(self) -> float:
        return _quantile(self.times, 0.75)

    @property
    def spread(self) -> float:
        """Interquartile range (seconds): how much the middle half of the repeats disagree."""
        return self.q75 - self.q25

    def __str__(self) -> str:
        memory = "" if self.peak_memory_bytes is None else f", peak {self.peak_memory_bytes / 2**20:.1f} MiB"
        return (
            f"{self.label}: median {self.median * 1e3:.3f} ms, IQR {self.spread * 1e3:.3f} ms over "
            f"{len(self.times)} repeats{memory}"
        )

    __repr__ = __str__


def _validate_int(name: str, value, low: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")


def measure(
    step_fn,
    *,
    device,
    warmup: int = 3,
    repeats: int = 20,
    label: str = "",
    max_seconds: float | None = None,
    min_repeats: int = 5,
) -> Measurement:
    """Time ``step_fn()`` (no arguments) ``repeats`` times after ``warmup`` untimed calls.

    ``max_seconds`` caps the timed part (a shared or slow machine stops after ``min_repeats`` once the cap is
    reached, and the result says how many repeats it got): a lesson must not hang on a busy laptop.

    - GPU: one pair of CUDA events per repeat, recorded around the call; the events are read only after a
      single ``synchronize`` at the end, so nothing inside the timed region waits for the GPU. The peak
      memory is ``torch.cuda.max_memory_allocated`` after ``reset_peak_memory_stats`` (reset after the
      warm-up).
    - CPU: ``time.perf_counter`` around each call (CPU ops are synchronous); no per-variant memory counter.

    Whatever ``step_fn`` returns (e.g. the loss) is kept and checked for NaN/inf only after timing.
    """
    if not callable(step_fn):
        raise TypeError(
            "step_fn must be a function with no arguments that runs one step, e.g. `lambda: step()`"
        )
    _validate_int("warmup", warmup, 0)
    _validate_int("repeats", repeats, 1)
    device = torch.device(device)
    outputs = []
    for _ in range(warmup):
        step_fn()
    synchronize(device)
    label = label or getattr(step_fn, "__name__", "step")
    measurement = Measurement(label=label, times=[], device=str(device))
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        measurement.start_memory_bytes = int(torch.cuda.memory_allocated(device))
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(repeats)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(repeats)]
        began = time.perf_counter()
        done = 0
        with torch.cuda.device(device):  # events record on this device's current stream
            for start, end in zip(starts, ends):
                start.record()
                outputs.append(step_fn())
                end.record()
                done += 1
                # host clock only: no wait for the GPU
                if _out_of_time(began, max_seconds, done, min_repeats):
                    break
        synchronize(device)  # the only wait: after the timed region
        measurement.times = [start.elapsed_time(end) / 1e3 for start, end in zip(starts[:done], ends[:done])]
        measurement.peak_memory_bytes = int(torch.cuda.max_memory_allocated(device))
    else:
        clock = time.perf_counter
        first = clock()
        for done in range(1, repeats + 1):
            began = clock()
            outputs.append(step_fn())
            measurement.times.append(clock() - began)
            if _out_of_time(first, max_seconds, done, min_repeats):
                break
    measurement.all_finite = outputs_finite(outputs)
    return measurement


def _out_of_time(began: float, max_seconds, done: int, min_repeats: int) -> bool:
    return max_seconds is not None and done >= min_repeats and time.perf_counter() - began > max_seconds


def outputs_finite(outputs) -> bool | None:
    """True when every tensor in ``outputs`` is finite; None when there were no tensors to check."""
    tensors = [o.detach().float().reshape(-1) for o in outputs if isinstance(o, torch.Tensor)]
    if not tensors:
        return None
    return bool(torch.isfinite(torch.cat(tensors)).all())


def _loop_once(step_fn, device, steps: int, item_each_step: bool) -> float:
    began = time.perf_counter()
    for _ in range(steps):
        loss = step_fn()
        if item_each_step:
            loss.item()  # the diagnostic under test: one number copied to the host, every step
    synchronize(device)
    return (time.perf_counter() - began) / steps


def item_overhead(
    step_fn, *, device, steps: int = 10, rounds: int = 5, max_seconds: float | None = None
) -> list:
    """Per-step seconds of loops without and with a ``loss.item()`` after every step: ``[without, with]``.

    Each loop of ``steps`` calls is timed as a whole (host clock, one sync at the end): that is what shows
    the cost of a ``.item()`` per step on a GPU — without it the CPU queues step k+1 while the GPU still runs
    step k; with it the CPU waits every step. The rounds alternate (without, with, without, with, ...) so that
    a change in the machine's load during the measurement hits both loops alike instead of biasing one of
    them. Each list has one value per round (at least 2; fewer than ``rounds`` once ``max_seconds`` is used
    up).
    """
    _validate_int("steps", steps, 1)
    _validate_int("rounds", rounds, 1)
    device = torch.device(device)
    step_fn()  # warm-up, both ways
    step_fn().item()
    synchronize(device)
    results = [[], []]
    first = time.perf_counter()
    for done in range(1, rounds + 1):
        for bucket, item_each_step in zip(results, (False, True)):
            bucket.append(_loop_once(step_fn, device, steps, item_each_step))
        if _out_of_time(first, max_seconds, done, 2):
            break
    return results


# ----------------------------------------------------------------------------- tables, figures, conclusions


def results_table(measurements, baseline: str | None = None):
    """One row per variant: median and IQR in ms, speed-up over ``baseline`` (default: the first), memory."""
    import pandas as pd

    measurements = list(measurements)
    if not measurements:
        raise ValueError("results_table needs at least one Measurement")
    base = _find(measurements, baseline)
    rows = []
    for m in measurements:
        verdict, speedup = speed_verdict(base, m)
        rows.append(
            {
                "variant": m.label,
                "median (ms)": round(m.median * 1e3, 3),
                "IQR (ms)": round(m.spread * 1e3, 3),
                "repeats": len(m.times),
                f"speed-up vs {base.label}": round(speedup, 2),
                "verdict": "baseline" if m is base else verdict,
                "peak GPU memory (MiB)": (
                    "n/a (CPU)" if m.peak_memory_bytes is None else round(m.peak_memory_bytes / 2**20, 1)
                ),
                "outputs finite": m.all_finite,
            }
        )
    return pd.DataFrame(rows).set_index("variant")


def _find(measurements, label):
    if label is None:
        return measurements[0]
    for m in measurements:
        if m.label == label:
            return m
    raise ValueError(f"no measurement labelled {label!r}; labels are {[m.label for m in measurements]}")


def plot_times(measurements, baseline: str | None = None, ax=None):
    """Bar chart of the median time per step with IQR error bars and every repeat as a dot."""
    import matplotlib.pyplot as plt

    measurements = list(measurements)
    base = _find(measurements, baseline)
    if ax is None:
        _, ax = plt.subplots(figsize=(6.5, 3.6))
    colours = {
        "fp32": "#607d8b",
        "bf16": "#2e7d32",
        "bfloat16": "#2e7d32",
        "fp16": "#ef6c00",
        "float16": "#ef6c00",
    }
    for i, m in enumerate(measurements):
        colour = next((c for key, c in colours.items() if key in m.label.lower()), "#1565c0")
        median = m.median * 1e3
        ax.bar(
            i,
            median,
            color=colour,
            alpha=0.75,
            width=0.6,
            yerr=[[median - m.q25 * 1e3], [m.q75 * 1e3 - median]],
            capsize=6,
        )
        ax.scatter(
            [i + 0.18 * ((k % 5) - 2) / 2 for k in range(len(m.times))],
            [t * 1e3 for t in m.times],
            s=9,
            color="black",
            alpha=0.5,
            zorder=3,
        )
        ax.annotate(
            f"{median:.2f} ms\n×{_speedup(base, m):.2f}",
            (i, max(max(m.times) * 1e3, m.q75 * 1e3)),
            xytext=(0, 4),
            textcoords="offset points",
            ha="center",
            va="bottom",
            fontsize=9,
        )
    ax.set_xticks(range(len(measurements)), [m.label for m in measurements])
    ax.set_ylabel("time per training step (ms)")
    ax.set_title(f"median of the repeats, bars = IQR, ×speed-up vs {base.label} ({measurements[0].device})")
    top = max(max(m.times) for m in measurements if m.times) * 1e3
    ax.set_ylim(0, top * 1.3)
    return ax.figure


def _speedup(baseline: Measurement, trial: Measurement) -> float:
    return baseline.median / trial.median if trial.median > 0 else float("nan")


def speed_verdict(baseline: Measurement, trial: Measurement, *, min_change: float = 0.05):
    """``("faster" | "slower" | "no clear difference", speed-up)`` of ``trial`` relative to ``baseline``.

    A difference is claimed only when the medians differ by more than ``min_change`` (5 %) *and* the
    interquartile ranges do not overlap: otherwise the run-to-run noise could explain it.
    """
    speedup = _speedup(baseline, trial)
    if speedup > 1 + min_change and trial.q75 < baseline.q25:
        return "faster", speedup
    if speedup < 1 - min_change and trial.q25 > baseline.q75:
        return "slower", speedup
    return "no clear difference", speedup


def conclusions(
    measurements, *, baseline: str | None = None, device_type: str = "cpu", native_bf16: bool | None = None
) -> str:
    """Plain-language conclusions generated from the measured numbers (never written before measuring).

    One sentence per low-precision variant (faster / slower / no clear difference, with the numbers),
    a likely reason that depends on the device, and an overall sentence.
    """
    measurements = list(measurements)
    if len(measurements) < 2:
        return "Only one variant was measured, so there is nothing to compare."
    base = _find(measurements, baseline)
    lines, verdicts = [], []
    for m in measurements:
        if m is base:
            continue
        verdict, speedup = speed_verdict(base, m)
        verdicts.append(verdict)
        numbers = (
            f"median {m.median * 1e3:.2f} ms vs {base.median * 1e3:.2f} ms for {base.label}, ×{speedup:.2f}"
        )
        if verdict == "faster":
            head = f"{m.label} is faster than {base.label} here ({numbers})."
        elif verdict == "slower":
            head = f"{m.label} is SLOWER than {base.label} here ({numbers})."
        else:
            head = (
                f"{m.label} shows no clear difference from {base.label} ({numbers}): the gap is smaller "
                "than 5 % or within the spread between repeats, so this run supports no speed claim."
            )
        lines.append(head + " " + _reason(m.label, verdict, device_type, native_bf16))
        if m.all_finite is False:
            lines.append(
                f"Warning: {m.label} produced NaN/inf losses while being timed — its time means nothing."
            )
    if verdicts and all(v == "slower" for v in verdicts):
        lines.append(
            "Overall: on this machine AMP made the step slower. If you use it here, it is not for speed."
        )
    elif "faster" in verdicts:
        lines.append(
            "Overall: AMP gave a measured speed-up here — on this model, these shapes and this "
            "batch. Re-measure on your real workload before you promise it."
        )
    else:
        lines.append(
            "Overall: no variant was clearly faster than FP32 here; do not claim a speed-up from this run."
        )
    return "\n".join(lines)


def _reason(label: str, verdict: str, device_type: str, native_bf16: bool | None) -> str:
    low = label.lower()
    is_bf16 = "bf16" in low or "bfloat16" in low
    if verdict == "no clear difference":
        return ""
    if device_type == "cuda":
        if verdict == "faster":
            return (
                "On a GPU the low-precision matmuls run on Tensor Cores (or matrix cores on AMD) and "
                "move half the bytes."
            )
        return (
            "On a GPU this usually means the model is too small: launch overhead and the extra cast "
            "kernels dominate, and the matmuls are too small to keep the Tensor Cores busy."
        )
    if verdict == "faster":
        if is_bf16 and native_bf16:
            return "This CPU has BF16 instructions (AVX512-BF16/AMX), and the low-precision matmuls use them."
        return (
            "The CPU gains from moving half the bytes through memory; the gain may not survive other shapes."
        )
    if is_bf16 and native_bf16 is False:
        return (
            "This CPU has no BF16 instructions, so BF16 arithmetic is emulated and the casts autocast "
            "inserts cost more than they save."
        )
    if not is_bf16:
        return (
            "CPUs rarely have fast FP16 arithmetic: autocast adds casts to and from FP16 and the matmuls "
            "gain little or nothing."
        )
    return (
        "The casts autocast inserts around every matmul cost more than the low-precision arithmetic "
        "saves here."
    )


def item_conclusion(without_item, with_item, *, device_type: str = "cpu", min_change: float = 0.05) -> str:
    """Text generated from two lists of seconds per step: loops without and with ``loss.item()`` each step."""
    plain = Measurement("without .item()", list(without_item))
    synced = Measurement("with .item()", list(with_item))
    verdict, speedup = speed_verdict(plain, synced, min_change=min_change)
    extra = (synced.median - plain.median) / plain.median * 100 if plain.median > 0 else float("nan")
    numbers = f"{synced.median * 1e3:.3f} ms vs {plain.median * 1e3:.3f} ms per step ({extra:+.1f} %)"
    if verdict == "slower":
        text = f"A .item() per step made the loop measurably slower: {numbers}."
    elif verdict == "faster":
        text = (
            f"The loop with .item() happened to be faster ({numbers}): that is noise from other "
            "processes, not a gain."
        )
    else:
        text = (
            f"No measurable cost from a .item() per step here: {numbers}, within the spread between rounds."
        )
    if device_type == "cuda":
        text += (
            " On a GPU each .item() waits for every queued kernel, so the CPU cannot queue the next "
            "step while the GPU works; the cost grows as the step gets shorter."
        )
    elif verdict == "slower":
        text += (
            " On a CPU every op has already finished when the call returns, so .item() itself only "
            "copies one number; a gap this size more likely comes from other processes on this machine "
            "— re-run to see whether it stays. On a GPU .item() is a full synchronisation and costs "
            "much more."
        )
    else:
        text += (
            " On a CPU every op has already finished when the call returns, so .item() only copies one "
            "number: it is cheap here. On a GPU it is a full synchronisation — measure it there before "
            "you dismiss it."
        )
    return text


def shape_conclusion(measurements) -> str:
    """Text generated from ``shape_comparison`` results: throughput (TFLOP/s) of each ``n x n`` matmul.

    Throughput, not time, is compared, because the sizes do slightly different amounts of work (2·n³ flops).
    """
    rates = []
    for m in measurements:
        n = int(str(m.label).split("=")[-1])
        rates.append((n, 2 * n**3 / m.median / 1e12 if m.median > 0 else float("nan"), m))
    if len(rates) < 2:
        return "Need two sizes to compare."
    (n_a, rate_a, m_a), (n_b, rate_b, m_b) = rates[0], rates[1]
    verdict, _ = speed_verdict(m_b, m_a)
    numbers = f"n={n_a}: {rate_a:.1f} TFLOP/s, n={n_b}: {rate_b:.1f} TFLOP/s (×{rate_a / rate_b:.2f})"
    friendly = n_a % 8 == 0 and n_b % 8 != 0
    if verdict == "faster" and friendly:
        return (
            f"The multiple of 8 was clearly faster per flop ({numbers}): Tensor Cores want dimensions "
            "that are multiples of 8 in FP16/BF16. Pad hidden sizes, vocabularies and batch sizes "
            "accordingly."
        )
    if verdict == "faster":
        return f"n={n_a} was clearly faster per flop ({numbers})."
    if verdict == "slower":
        return (
            f"n={n_a} was slower per flop ({numbers}): unexpected — re-run; other work on the GPU or "
            "clock changes can do this."
        )
    return (
        f"No clear difference ({numbers}): this GPU/library pads or handles the odd size well for this "
        "shape. Check your real layer sizes before padding them."
    )


# ----------------------------------------------------------------------------- GPU specifics


def shape_comparison(device, *, sizes=(4096, 4095), dtype=torch.float16, warmup: int = 3, repeats: int = 10):
    """Time an ``n x n`` matmul under autocast for each ``n`` in ``sizes`` (e.g. a multiple of 8 and not).

    On a GPU, Tensor Cores want FP16/BF16 matrix dimensions that are multiples of 8 (16 bytes); other sizes
    are padded or fall back to slower kernels. Returns a list of Measurement, one per size.
    """
    device = torch.device(device)
    results = []
    for n in sizes:
        a = torch.randn(n, n, device=device)
        b = torch.randn(n, n, device=device)

        def matmul(a=a, b=b):
            with torch.autocast(device_type=device.type, dtype=dtype):
                a @ b  # the product is dropped at once: keeping 10 of them would only fill memory

        results.append(measure(matmul, device=device, warmup=warmup, repeats=repeats, label=f"n={n}"))
        del a, b
    return results


def platform_note() -> str:
    """Which GPU platform this torch build targets; ROCm builds still call the device ``cuda``."""
    hip = getattr(torch.version, "hip", None)
    if hip:
        return (
            f"This torch is a ROCm build (HIP {hip}). The device is still called 'cuda' and torch.cuda.* "
            "works, but the kernels are AMD's (rocBLAS/hipBLASLt, MIOpen): speed, which dtypes are fast "
            "and even the last bits of results can differ from an NVIDIA GPU. Validate and measure on "
            "this platform."
        )
    if torch.version.cuda:
        return (
            f"This torch is a CUDA {torch.version.cuda} build (torch.version.hip is None). On an AMD GPU "
            "with a ROCm build the device would still be called 'cuda', with different kernels and "
            "possibly different speed and last-bit results — so numbers measured here do not transfer to "
            "it."
        )
    return (
        "This torch is a CPU-only build (torch.version.cuda and torch.version.hip are both None). On a "
        "ROCm build an AMD GPU is still called 'cuda', but its kernels, speed and last-bit results are "
        "AMD's: validate and measure again there."
    )
