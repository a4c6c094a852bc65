"""Lesson 10: where the FP32 copy of the weights lives — nowhere, in the model, or in the optimizer — and what it costs.

Why: autocast answers only "in which dtype does this op compute". Where the float32 numbers of a training run are
*stored* is a separate choice, and it decides both the memory and whether small updates survive:

- **in the model** (autocast): parameters, gradients and Adam states stay float32; each forward casts a BF16 copy of
  the weights for the matmuls. 16 bytes per parameter, nothing lost;
- **nowhere** (pure BF16): parameters, gradients and optimizer states all BF16. 8 bytes per parameter, and every
  update smaller than half a BF16 spacing is rounded away (``rounding="nearest"``), unless the update is rounded
  stochastically (``"stochastic"``, same 8 bytes) or with a Kahan compensation (``"kahan"``, 10 bytes);
- **in the optimizer**: the model holds BF16 parameters and gradients, the optimizer a float32 copy and float32 states
  (``"fp32_copy"``). 16 bytes, like autocast — but the 12 optimizer bytes are the part ZeRO/FSDP shard across ranks.

``LowPrecisionAdam`` is Adam (no weight decay) that runs every design with the same arithmetic: the update is
always computed in float32 from the stored states, only the way it is stored differs.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from amp_lessons.l10_where_fp32_lives.rounding import kahan_add, nearest_add, stochastic_add

ROUNDINGS = ("nearest", "stochastic", "kahan", "fp32_copy")

__all__ = ["DESIGNS", "ROUNDINGS", "Design", "LowPrecisionAdam", "bytes_per_parameter", "tensor_bytes"]


@dataclass(frozen=True)
class Design:
    """One way to store a training run: parameter dtype, forward under autocast or not, and how updates are stored."""

    name: str
    parameters: torch.dtype
    autocast: bool
    rounding: str  # one of ROUNDINGS; "nearest" on float32 parameters is plain FP32 Adam
    where: str  # where the float32 copy of the weights lives


DESIGNS = {
    "FP32": Design("FP32", torch.float32, False, "nearest", "the weights are float32"),
    "autocast, FP32 params": Design("autocast, FP32 params", torch.float32, True, "nearest", "in the model"),
    "pure BF16": Design("pure BF16", torch.bfloat16, False, "nearest", "nowhere"),
    "BF16 + FP32 copy in optimizer": Design(
        "BF16 + FP32 copy in optimizer", torch.bfloat16, False, "fp32_copy", "in the optimizer"
    ),
    "pure BF16 + stochastic rounding": Design(
        "pure BF16 + stochastic rounding", torch.bfloat16, False, "stochastic", "nowhere"
    ),
    "pure BF16 + Kahan": Design(
        "pure BF16 + Kahan", torch.bfloat16, False, "kahan", "nowhere (a BF16 compensation)"
    ),
}

_ADD = {"nearest": nearest_add, "stochastic": stochastic_add, "kahan": kahan_add}


class LowPrecisionAdam(torch.optim.Optimizer):
    """Adam without weight decay whose update is computed in float32 and stored the way ``rounding`` says.

    ``nearest``: states in the parameters' dtype, new weights rounded to nearest (on float32 parameters: plain
    Adam). ``stochastic``: the same, rounded with ``stochastic_round``. ``kahan``: the same plus a compensation
    buffer in the parameters' dtype. ``fp32_copy``: a float32 copy of each parameter and float32 states live in
    the optimizer; the parameter receives the copy rounded to nearest. After each step ``lost_fraction`` is the
    share of elements whose stored value did not move although their update was not zero.
    """

    def __init__(
        self, params, lr: float = 1e-3, betas=(0.9, 0.999), eps: float = 1e-8, *, rounding="nearest", seed=0
    ):
        if rounding not in ROUNDINGS:
            raise ValueError(f"rounding must be one of {ROUNDINGS}; got {rounding!r}")
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps))
        self.rounding, self.seed = rounding, seed
        self.generators: dict = {}
        self.lost_fraction = 0.0

    def _state(self, p: torch.Tensor) -> dict:
        state = self.state[p]
        if not state:
            keep = torch.float32 if self.rounding == "fp32_copy" else p.dtype
            state["step"] = 0
            state["exp_avg"] = torch.zeros_like(p, dtype=keep)
            state["exp_avg_sq"] = torch.zeros_like(p, dtype=keep)
            if self.rounding == "fp32_copy":
                state["fp32_copy"] = p.detach().float().clone()
            if self.rounding == "kahan":
                state["compensation"] = torch.zeros_like(p)
        return state

    def _generator(self, device: torch.device) -> torch.Generator:
        if device not in self.generators:
            self.generators[device] = torch.Generator(device=device).manual_seed(self.seed)
        return self.generators[device]

    @torch.no_grad()
    def step(self, closure=None):
        lost, total = 0, 0
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self._state(p)
                state["step"] += 1
                t, grad = state["step"], p.grad.float()
                exp_avg = state["exp_avg"].float().mul_(beta1).add_(grad, alpha=1 - beta1)
                exp_avg_sq = state["exp_avg_sq"].float().mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
                state["exp_avg"].copy_(exp_avg)
                state["exp_avg_sq"].copy_(exp_avg_sq)
                denom = (exp_avg_sq / (1 - beta2**t)).sqrt_().add_(group["eps"])
                update = (
                    exp_avg / denom * (-group["lr"] / (1 - beta1**t))
                )  # (not in place: exp_avg may be the state)
                lost += self._store(p, update, state)
                total += p.numel()
        self.lost_fraction = lost / max(total, 1)

    def _store(self, p: torch.Tensor, update: torch.Tensor, state: dict) -> int:
        """Write ``p + update`` back the design's way; return how many non-zero updates left no trace."""
        if self.rounding == "fp32_copy":
            before = state["fp32_copy"].clone()
            state["fp32_copy"].add_(update)
            p.copy_(state["fp32_copy"])
            return int(((state["fp32_copy"] == before) & (update != 0)).sum())
        extra = state.get("compensation")
        new = _ADD[self.rounding](p, update, extra, generator=self._generator(p.device))
        if extra is not None:  # Kahan keeps what the rounding dropped: nothing is lost
            unchanged = torch.zeros_like(update, dtype=torch.bool)
        else:
            unchanged = (new == p) & (update != 0)
        p.copy_(new)
        return int(unchanged.sum())


def tensor_bytes(t: torch.Tensor) -> int:
    """Bytes a tensor's data occupy; for a tensor subclass (torchao's quantised states) the sum of its parts."""
    if type(t) is not torch.Tensor and hasattr(t, "__tensor_flatten__"):
        names, _ = t.__tensor_flatten__()
        return sum(tensor_bytes(getattr(t, name)) for name in names)
    return t.numel() * t.element_size()


def bytes_per_parameter(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict:
    """Measured bytes per parameter: the parameters, their gradients, the optimizer's states and its copies."""
    params = [p for p in model.parameters()]
    count = sum(p.numel() for p in params)
    states, copies = 0, 0
    for state in optimizer.state.values():
        for name, value in state.items():
            if isinstance(value, torch.Tensor) and value.numel() > 1:
                if name in ("fp32_copy", "compensation"):
                    copies += tensor_bytes(value)
                else:
                    states += tensor_bytes(value)
    row = {
        "parameters": sum(tensor_bytes(p) for p in params) / count,
        "gradients": sum(tensor_bytes(p.grad) for p in params if p.grad is not None) / count,
        "optimizer states": states / count,
        "copies (FP32 copy / compensation)": copies / count,
    }
    row["total"] = sum(row.values())
    return row
