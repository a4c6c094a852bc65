"""Lesson 07: the memory of a training step, measured by kind — what AMP shrinks and what it does not.

On a GPU, ``torch.cuda.max_memory_allocated`` after ``reset_peak_memory_stats`` gives the peak of the tensors
torch allocated (``amp_lessons.l07_measuring_gains.measure`` reports it). On a CPU torch has no such counter, and
process-level numbers (peak RSS) only ever grow for the whole process, so they cannot be attributed to one
variant. What we *can* measure everywhere, exactly and deterministically, is the size of the tensors autograd
saves for backward (``torch.autograd.graph.saved_tensors_hooks``): that is the activation memory AMP
shrinks. Weights, gradients and optimizer state stay FP32 under AMP, and autocast adds a low-precision copy
of each weight it casts — so "AMP halves memory" is never quite true, and at small batches it can be false.
"""

from __future__ import annotations

import sys

import torch

from amp_lessons.core.environment import dtype_name


def tensor_bytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def saved_tensor_report(model, loss_fn, inputs, targets, *, dtype=None):
    """Bytes autograd saves for backward in one forward pass (+ loss), by kind and dtype.

    ``dtype=None`` runs in FP32, otherwise under ``torch.autocast(dtype=dtype)``. A saved tensor is
    classified as
    - ``"parameter itself (FP32)"`` when it *is* a parameter (FP32 runs save the weight itself: no extra
      memory; torch.amp keeps no separate "master" copy, the parameters simply stay FP32),
    - ``"weight copy cast by autocast"`` when it has a parameter's shape (or its transpose) but a
      low-precision
      dtype (autocast casts each weight once per forward and keeps the copy for backward: memory FP32 training
      does not need). This is judged by shape, so keep batch sizes different from layer widths;
    - ``"activation"`` otherwise.
    Tensors saved twice are counted once. Returns a DataFrame with columns kind, dtype, tensors, bytes.
    """
    import pandas as pd

    parameters = {p.data_ptr(): p for p in model.parameters()}
    parameter_shapes = {tuple(sorted(p.shape)) for p in model.parameters()}  # Linear saves weight.t()
    seen, rows = set(), []

    def pack(t):
        key = (t.data_ptr(), t.dtype, tuple(t.shape), tuple(t.stride()))
        if key not in seen:
            seen.add(key)
            if t.data_ptr() in parameters and t.dtype == parameters[t.data_ptr()].dtype:
                kind = "parameter itself (FP32)"
            elif tuple(sorted(t.shape)) in parameter_shapes and t.dtype in (torch.float16, torch.bfloat16):
                kind = "weight copy cast by autocast"
            else:
                kind = "activation"
            rows.append((kind, dtype_name(t.dtype), tensor_bytes(t)))
        return t

    device_type = inputs.device.type
    with torch.enable_grad(), torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        if dtype is None:
            loss = loss_fn(model(inputs), targets)
        else:
            with torch.autocast(device_type=device_type, dtype=dtype):
                loss = loss_fn(model(inputs), targets)
    del loss
    frame = pd.DataFrame(rows, columns=["kind", "dtype", "bytes"])
    return (
        frame.assign(tensors=1)
        .groupby(["kind", "dtype"], as_index=False)[["tensors", "bytes"]]
        .sum()
        .sort_values(["kind", "dtype"])
        .reset_index(drop=True)
    )


def state_bytes(model, optimizer=None) -> dict:
    """Bytes of weights, gradients and optimizer state: AMP leaves all three in FP32."""
    weights = sum(tensor_bytes(p) for p in model.parameters())
    grads = sum(tensor_bytes(p.grad) for p in model.parameters() if p.grad is not None)
    state = 0
    if optimizer is not None:
        for per_param in optimizer.state.values():
            tensors = [v for v in per_param.values() if isinstance(v, torch.Tensor) and v.dim() > 0]
            state += sum(tensor_bytes(v) for v in tensors)
    return {"weights": weights, "gradients": grads, "optimizer state": state}


def memory_breakdown(state: dict, saved: dict):
    """Table in KiB: rows = memory kinds, columns = variants.

    ``state`` is ``state_bytes(...)`` (the same for every variant: AMP keeps FP32 weights, gradients and
    optimizer state); ``saved`` maps a variant label to its ``saved_tensor_report`` frame.
    """
    import pandas as pd

    kinds = ["activation", "weight copy cast by autocast"]
    columns = {}
    for label, report in saved.items():
        by_kind = report.groupby("kind")["bytes"].sum() if len(report) else pd.Series(dtype=float)
        column = dict(state)
        for kind in kinds:
            column[f"saved for backward: {kind}"] = int(by_kind.get(kind, 0))
        column["total"] = sum(column.values())
        columns[label] = column
    return (pd.DataFrame(columns) / 1024).round(1)


def plot_memory(breakdown, ax=None):
    """Stacked bars of ``memory_breakdown`` (KiB): what stays FP32 and what autocast shrinks or adds."""
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(6.5, 3.6))
    parts = [row for row in breakdown.index if row != "total"]
    colours = ["#90a4ae", "#b0bec5", "#cfd8dc", "#1565c0", "#ef6c00"]
    bottom = [0.0] * len(breakdown.columns)
    for colour, part in zip(colours, parts):
        values = [float(v) for v in breakdown.loc[part]]
        ax.bar(list(breakdown.columns), values, bottom=bottom, label=part, color=colour, width=0.6)
        bottom = [b + v for b, v in zip(bottom, values)]
    for i, total in enumerate(bottom):
        ax.annotate(
            f"{total:,.0f} KiB",
            (i, total),
            xytext=(0, 3),
            textcoords="offset points",
            ha="center",
            fontsize=9,
        )
    ax.set_ylabel("KiB")
    ax.set_ylim(0, max(bottom) * 1.2)
    ax.set_title("training memory by kind (measured by size, not by a profiler)")
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.12), ncol=2)
    return ax.figure


def memory_conclusion(breakdown, *, baseline: str | None = None) -> str:
    """Text generated from ``memory_breakdown``: how much activations and the total shrank per variant."""
    columns = list(breakdown.columns)
    if not columns:
        return "Nothing was measured."
    base = baseline or columns[0]
    act = "saved for backward: activation"
    copies = "saved for backward: weight copy cast by autocast"
    lines = []
    for label in columns:
        if label == base:
            continue
        base_act = breakdown.at[act, base]
        act_ratio = breakdown.at[act, label] / base_act if base_act else float("nan")
        total_ratio = breakdown.at["total", label] / breakdown.at["total", base]
        lines.append(
            f"{label}: activations saved for backward are {act_ratio:.2f}× those of {base}, plus "
            f"{breakdown.at[copies, label]:,.1f} KiB of low-precision weight copies; the total is "
            f"{total_ratio:.2f}× ({breakdown.at['total', label]:,.1f} vs {breakdown.at['total', base]:,.1f} "
            "KiB)."
        )
    lines.append(
        "Weights, gradients and optimizer state are identical in every column: AMP keeps them in FP32."
    )
    return "\n".join(lines)


def memory_by_batch(
    model, loss_fn, state: dict, *, batch_sizes, in_features: int, classes: int, dtype, device, seed: int = 0
):
    """Total training memory (``memory_breakdown``'s total) in FP32 and under autocast, per batch size.

    Weights, gradients and optimizer state do not grow with the batch; saved activations do. So the AMP/FP32
    ratio falls towards (but never reaches) one half as the batch grows. Returns a DataFrame, one row per
    batch.
    """
    import pandas as pd

    generator = torch.Generator().manual_seed(seed)
    rows = []
    for batch in batch_sizes:
        x = torch.randn(batch, in_features, generator=generator).to(device)
        y = torch.randint(0, classes, (batch,), generator=generator).to(device)
        table = memory_breakdown(
            state,
            {
                "FP32": saved_tensor_report(model, loss_fn, x, y, dtype=None),
                "AMP": saved_tensor_report(model, loss_fn, x, y, dtype=dtype),
            },
        )
        activations = table.at["saved for backward: activation", "FP32"]
        rows.append(
            {
                "batch": batch,
                "FP32 total (KiB)": table.at["total", "FP32"],
                "AMP total (KiB)": table.at["total", "AMP"],
                "AMP / FP32": round(table.at["total", "AMP"] / table.at["total", "FP32"], 3),
                "activations share of FP32 total": round(activations / table.at["total", "FP32"], 3),
            }
        )
    return pd.DataFrame(rows).set_index("batch")


def plot_memory_by_batch(frame, ax=None):
    """AMP/FP32 total-memory ratio against batch size, with the "memory halves" line for reference."""
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(6.5, 3.2))
    ax.plot(frame.index, frame["AMP / FP32"], "o-", color="#1565c0", label="measured: AMP total / FP32 total")
    ax.axhline(0.5, color="#c62828", linestyle="--", label='the "memory halves" claim')
    ax.axhline(1.0, color="grey", linestyle=":", linewidth=1)
    ax.set_xscale("log", base=2)
    ax.set_xticks(list(frame.index), [str(b) for b in frame.index])
    ax.minorticks_off()
    ax.set_xlabel("batch size")
    ax.set_ylabel("AMP / FP32")
    ax.set_ylim(0, 1.1)
    ax.set_title("training memory: weights + grads + Adam state + saved tensors")
    ax.legend(fontsize=8, loc="lower left")
    return ax.figure


def memory_by_batch_conclusion(frame) -> str:
    """Text generated from ``memory_by_batch``: where AMP saves or costs memory, and how far from half."""
    ratios = frame["AMP / FP32"]
    smallest, largest = ratios.index[0], ratios.index[-1]
    lines = [
        f"At batch {smallest} AMP needs {ratios.iloc[0]:.2f}× the FP32 memory; at batch {largest}, "
        f"{ratios.iloc[-1]:.2f}×."
    ]
    more = [int(b) for b, r in ratios.items() if r > 1]
    if more:
        lines.append(
            f"At batch {', '.join(map(str, more))} AMP needs MORE memory than FP32: the "
            "low-precision weight copies outweigh the activations it saves."
        )
    if ratios.min() > 0.5:
        lines.append(
            f"No batch reached one half (the lowest ratio is {ratios.min():.2f}×): FP32 weights, "
            "gradients and optimizer state do not shrink."
        )
    else:
        lines.append(f"The ratio went down to {ratios.min():.2f}×.")
    return "\n".join(lines)


def process_peak_rss_bytes() -> int | None:
    """Peak resident memory of this whole Python process so far (None where the OS does not report it).

    It only ever grows, and it includes everything the process ever held (the notebook, other lessons'
    tensors, Python itself), so it cannot tell you what one variant of a step needs.
    """
    try:
        import resource
    except ImportError:  # Windows
        return None
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak if sys.platform == "darwin" else peak * 1024)
