"""Lesson 10: an attention mask built with ``-1e9`` or ``finfo(float32).min`` turns into -inf, then NaN, in FP16.

Why: an additive mask ``(1 - allowed) * fill`` is made in the dtype of the attention scores. Under FP16 the scores
are float16, whose largest magnitude is 65504: ``-1e9`` and ``torch.finfo(torch.float32).min`` both become -inf.
A row of the softmax in which *every* key is masked — a padding token's own query, with left padding and a causal
mask — is then all -inf, and ``softmax`` of all -inf is 0/0 = NaN; in FP32 the same row is merely uniform. The NaN
survives even a pooling that multiplies padding by 0 (NaN * 0 is NaN). ``torch.finfo(scores.dtype).min`` with
``masked_fill`` (replace, not add) keeps every masked score finite in any dtype; ``F.scaled_dot_product_attention``
with a *boolean* mask does the masking itself.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from amp_lessons.core.models import seeded_weights

__all__ = ["FILLS", "PaddedAttentionClassifier", "mask_values", "padded_batch", "sdpa_masked_rows"]

FILLS = {
    "-1e9": -1e9,
    "torch.finfo(torch.float32).min": torch.finfo(torch.float32).min,
    "torch.finfo(scores.dtype).min": None,  # None: take the minimum of the scores' own dtype
}


class AdditiveMask(nn.Module):
    """``scores + (1 - allowed) * fill``, the mask made in the scores' dtype (how many models write it)."""

    def __init__(self, fill: float | None):
        super().__init__()
        self.fill = fill

    def forward(self, scores: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
        if self.fill is None:  # the fix: replace masked scores with the smallest number of the scores' dtype
            return scores.masked_fill(~allowed, torch.finfo(scores.dtype).min)
        bias = (1.0 - allowed.to(scores.dtype)) * torch.tensor(
            self.fill, dtype=scores.dtype, device=scores.device
        )
        return scores + bias


class PaddedAttentionClassifier(nn.Module):
    """One causal attention head over left-padded token sequences, mean-pooled over the real tokens, classified.

    A token whose features are all zero is padding. ``mask`` is the submodule that applies the mask, so lesson 05's
    finder sees its output as a probe of its own.
    """

    def __init__(self, fill: float | None, features: int = 8, dim: int = 16, classes: int = 3, seed: int = 0):
        super().__init__()
        with seeded_weights(seed):
            self.query = nn.Linear(features, dim)
            self.key = nn.Linear(features, dim)
            self.value = nn.Linear(features, dim)
            self.head = nn.Linear(dim, classes)
        self.mask = AdditiveMask(fill)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        real = x.abs().sum(dim=-1) > 0  # [batch, tokens]
        tokens = x.shape[1]
        causal = torch.ones(tokens, tokens, dtype=torch.bool, device=x.device).tril()
        allowed = causal & real[:, None, :]  # a query sees real keys at or before it
        q, k, v = self.query(x), self.key(x), self.value(x)
        scores = self.mask(q @ k.transpose(-2, -1) / k.shape[-1] ** 0.5, allowed)
        h = torch.softmax(scores, dim=-1) @ v
        pooled = (h * real[..., None]).sum(dim=1) / real.sum(dim=1, keepdim=True)
        return self.head(pooled)


def padded_batch(n: int = 16, tokens: int = 10, features: int = 8, seed: int = 0, device="cpu"):
    """Token sequences ``[n, tokens, features]``, left-padded with zeros to different lengths, and labels."""
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(n, tokens, features, generator=generator)
    pad = torch.arange(n) % (tokens // 2)  # 0 .. tokens/2 - 1 padding tokens at the left of each sequence
    for i, count in enumerate(pad.tolist()):
        x[i, :count] = 0
    y = torch.randint(0, 3, (n,), generator=generator)
    return x.to(device), y.to(device)


def mask_values(dtypes=(torch.float32, torch.bfloat16, torch.float16)):
    """What each fill value becomes when it is stored in each dtype."""
    import pandas as pd

    rows = []
    for name, fill in FILLS.items():
        row = {"fill": name}
        for dtype in dtypes:
            value = torch.finfo(dtype).min if fill is None else fill
            row[str(dtype).replace("torch.", "")] = torch.tensor(value, dtype=dtype).item()
        rows.append(row)
    return pd.DataFrame(rows)


def sdpa_masked_rows(device="cpu", dtype=torch.float16):
    """``scaled_dot_product_attention`` with a boolean causal-and-padding mask: are the fully masked rows finite?"""
    x, _ = padded_batch(n=4, device=device)
    real = x.abs().sum(dim=-1) > 0
    tokens = x.shape[1]
    allowed = torch.ones(tokens, tokens, dtype=torch.bool, device=device).tril() & real[:, None, :]
    q = x.to(dtype)[:, None]
    out = F.scaled_dot_product_attention(q, q, q, attn_mask=allowed[:, None])
    fully_masked = ~allowed.any(dim=-1)  # [batch, tokens]
    rows = out[:, 0][fully_masked]
    return {
        "fully masked rows": int(fully_masked.sum()),
        "their outputs finite": bool(torch.isfinite(rows).all()),
        "their outputs": "all zeros"
        if bool((rows == 0).all())
        else ("NaN" if bool(rows.isnan().any()) else "other"),
        "other rows finite": bool(torch.isfinite(out[:, 0][~fully_masked]).all()),
    }
