"""Lesson 10: Adam's two states in 8 or 4 bits (torchao.optim), and the error of quantising them, measured.

Why: Adam keeps two numbers per parameter, the running mean of the gradient and of its square — 8 of the 16 bytes
an FP32 run spends per parameter. Block-wise quantisation stores each block of states as small integer codes plus
one float32 scale per block: 8-bit codes cut the states from 8 to about 2 bytes, 4-bit codes to about 1. The
price is a quantisation error in the *states* (not the weights, which stay FP32); whether it costs quality has to
be measured on the task. torchao's optimizers also quantise only tensors with at least 4096 elements (a smaller
tensor keeps FP32 states), and they wrap their step in ``torch.compile``: on a GPU that fuses the step into one
kernel; on a CPU compiling costs tens of seconds (measured here: about 100 s for the BF16 stochastic-rounding step
of a 4,000-parameter model, against 1.3 s for all 300 steps unfused), so ``torchao_step`` runs the same operations
eagerly there. torchao needs a recent torch: on an older one ``torchao_support()`` says why, and this module's
plain-torch block quantiser still shows the error.
"""

from __future__ import annotations

import contextlib
import io
import logging
import warnings

import torch

from amp_lessons.core.optional_libraries import torchao_support
from amp_lessons.l10_where_fp32_lives.designs import tensor_bytes

__all__ = ["quantisation_errors", "quiet_compile", "state_bytes", "torchao_optimizers", "torchao_step"]


def torchao_optimizers() -> dict:
    """``{name: (parameter dtype, make(params, lr))}`` for torchao's BF16-SR AdamW and its 8-/4-bit AdamW.

    Empty when torchao does not import here (``torchao_support().reason`` says why). No weight decay, as in
    ``LowPrecisionAdam``, so the runs differ only in how they store numbers.
    """
    if not torchao_support().available:
        return {}
    from torchao import optim

    return {
        "torchao _AdamW, BF16 + stochastic rounding": (
            torch.bfloat16,
            lambda params, lr: optim._AdamW(params, lr=lr, weight_decay=0.0, bf16_stochastic_round=True),
        ),
        "torchao AdamW8bit": (
            torch.float32,
            lambda params, lr: optim.AdamW8bit(params, lr=lr, weight_decay=0.0),
        ),
        "torchao AdamW4bit": (
            torch.float32,
            lambda params, lr: optim.AdamW4bit(params, lr=lr, weight_decay=0.0),
        ),
    }


@contextlib.contextmanager
def quiet_compile(caught: list | None = None):
    """Keep torch.compile's first-call messages (no CUDA runtime found, tensor-subclass caching notes) out of
    stderr; the caught warnings' first lines are appended to ``caught``."""
    loggers = [logging.getLogger(name) for name in ("torch", "torchao")]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings(record=True) as seen, contextlib.redirect_stderr(io.StringIO()):
            warnings.simplefilter("always")
            yield
        if caught is not None:
            caught.extend(str(w.message).splitlines()[0] for w in seen)
    finally:
        for logger, level in zip(loggers, levels):
            logger.setLevel(level)


def _not_compiled(fn=None, **options):
    """``torch.compile``'s signature, returning the function itself: the step's operations run one by one."""
    return fn if fn is not None else (lambda function: function)


@contextlib.contextmanager
def torchao_step(device: torch.device | str, caught: list | None = None):
    """Run torchao's optimizer steps quietly, and on a CPU without ``torch.compile``.

    torchao calls ``torch.compile(single_param_adam, fullgraph=True)`` inside every ``step()``. Compiling changes
    how fast the step runs, not what it computes (the same operations, fused), and on a CPU the first compile
    takes far longer than the whole run. So on a CPU ``torch.compile`` is the identity while this block runs
    (restored afterwards); on a GPU the step compiles as torchao intends.
    """
    eager = torch.device(device).type == "cpu"
    compile_function = torch.compile
    if eager:
        torch.compile = _not_compiled
    try:
        with quiet_compile(caught):
            yield
    finally:
        torch.compile = compile_function


def state_bytes(optimizer: torch.optim.Optimizer) -> dict:
    """Bytes the optimizer's per-parameter states occupy (``exp_avg``, ``exp_avg_sq``), and how many of its
    tensors are kept quantised; a quantised state counts its codes and its block scales."""
    total, quantised, tensors = 0, 0, 0
    for state in optimizer.state.values():
        for name in ("exp_avg", "exp_avg_sq"):
            value = state.get(name)
            if isinstance(value, torch.Tensor):
                total += tensor_bytes(value)
                tensors += 1
                quantised += type(value) is not torch.Tensor
    return {"state bytes": total, "quantised state tensors": quantised, "state tensors": tensors}


def _block_quantise(x: torch.Tensor, bits: int, block: int) -> torch.Tensor:
    """Absmax block quantisation with ``bits``-bit signed linear codes, dequantised again (plain torch)."""
    flat = x.detach().float().reshape(-1, block)
    levels = 2 ** (bits - 1) - 1
    scale = flat.abs().amax(dim=1, keepdim=True).clamp_min(1e-30) / levels
    return (torch.round(flat / scale) * scale).reshape(x.shape)


def quantisation_errors(optimizer: torch.optim.Optimizer, *, settings=((8, 256), (4, 128))):
    """For an FP32 Adam's states: relative error of block quantisation at each (bits, block size) setting.

    The relative error is ``||q(s) - s|| / ||s||`` over all quantisable states (at least 4096 elements). It uses a
    plain linear code: torchao's 8-bit code is a non-linear map with more levels near zero, so its error is
    smaller than this one's.
    """
    import pandas as pd

    rows = []
    for bits, block in settings:
        for name in ("exp_avg", "exp_avg_sq"):
            states = [s[name] for s in optimizer.state.values() if name in s and s[name].numel() >= 4096]
            if not states:
                continue
            error = sum(float((_block_quantise(s, bits, block) - s).norm() ** 2) for s in states) ** 0.5
            size = sum(float(s.float().norm() ** 2) for s in states) ** 0.5
            rows.append(
                {
                    "state": name,
                    "bits": bits,
                    "block": block,
                    "bytes per element": bits / 8 + 4 / block,
                    "relative error": error / size if size else 0.0,
                }
            )
    return pd.DataFrame(rows)
