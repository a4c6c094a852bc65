"""The fixed reference datasets of lesson 04 (and anyone who needs a small, honest validation set).

A validation set for AMP is short, fixed and *chosen*: random samples alone rarely hit the cases where
low precision hurts. So every sample has an id and a category:

- ``normal``: ordinary inputs from the data distribution;
- ``edge: large``: the same kind of input at large magnitude — the hidden activations exceed FP16's
  maximum (65504) *inside* the model although the input itself is representable;
- ``edge: tiny``: inputs scaled down so far that FP16 flushes the smallest of them to zero (values up to
  2^-25 ~ 3e-8 round to 0; 2^-24 ~ 6e-8 is its smallest subnormal);
- ``edge: zero``: an all-zero input, whose reference scores are an exact tie;
- ``boundary``: inputs placed on purpose next to the classifier's decision boundary, so the top two
  reference scores are nearly tied (margins from 1e-5 to 3e-2).

Everything is deterministic: the classifier is trained on the CPU in float32 from a fixed seed in well under
a second (no weight file is shipped), and the boundary samples are found by bisection on *that* model, so
they are near-tied on every machine. The model is in eval mode; preprocessing (:func:`preprocess`) is fixed
and runs in float32 before the model.

Why the classifier has no bias terms: a bias-free ReLU network is positively homogeneous,
``f(c * x) = c * f(x)`` for ``c > 0``, so in exact arithmetic scaling an input never changes its decision.
Any decision that changes for a large or tiny input is therefore the low-precision format talking, not
the model.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import math
from dataclasses import dataclass

import pandas as pd
import torch

from amp_lessons.core.environment import one_cpu_thread
from amp_lessons.core.models import LoadRegressor, SectorClassifier, seeded_weights

CLASSES = ("north", "west", "south")
# Preprocessing: raw measurements are divided by these fixed per-feature scales (float32, outside autocast).
FEATURE_SCALE = torch.tensor([4.0, 0.5])
# Class k owns the angles [SECTOR_STARTS[k], SECTOR_STARTS[k + 1]) of the preprocessed input.
SECTOR_STARTS = (0.0, 2.0, 4.2)
LARGE_SCALES = (1e2, 1e3, 3e3, 1e4, 2e4, 5e4)
TINY_SCALES = (1e-4, 1e-6, 1e-8, 1e-9)
BOUNDARY_MARGINS = (1e-5, 1e-4, 1e-3, 1e-2)
BOUNDARY_RADII = (0.8, 1.3, 2.1, 2.9)
SEED = 0


def preprocess(raw: torch.Tensor) -> torch.Tensor:
    """The fixed preprocessing: divide each feature by its recorded scale, in float32."""
    if not isinstance(raw, torch.Tensor):
        raise TypeError(f"preprocess expects a torch tensor of shape [N, 2]; got {type(raw).__name__}.")
    if raw.dim() != 2 or raw.shape[1] != 2:
        raise ValueError(f"preprocess expects raw inputs of shape [N, 2]; got {tuple(raw.shape)}.")
    return raw.float() / FEATURE_SCALE.to(raw.device)


def true_class(features: torch.Tensor) -> torch.Tensor:
    """The rule that generated the labels: the angle sector of the preprocessed input (-1 for the origin)."""
    angle = torch.atan2(features[:, 1], features[:, 0]) % (2 * math.pi)
    label = torch.zeros(len(features), dtype=torch.long)
    for k, start in enumerate(SECTOR_STARTS):
        label[angle >= start] = k
    label[(features == 0).all(dim=1)] = -1
    return label


def _fit(model, loss_fn, steps: int, lr: float):
    """Train ``model`` with full-batch Adam on the CPU in float32, on one thread (deterministic); eval mode.

    Adam is written out (a few lines): the first ``torch.optim`` optimizer of a process costs 1-2 s, because
    constructing it imports ``torch._dynamo``.
    """
    params = list(model.parameters())
    m = [torch.zeros_like(p) for p in params]
    v = [torch.zeros_like(p) for p in params]
    beta1, beta2, eps = 0.9, 0.999, 1e-8
    with one_cpu_thread():
        for step in range(1, steps + 1):
            model.zero_grad(set_to_none=True)
            loss_fn(model).backward()
            with torch.no_grad():
                for p, m_p, v_p in zip(params, m, v):
                    m_p.mul_(beta1).add_(p.grad, alpha=1 - beta1)
                    v_p.mul_(beta2).addcmul_(p.grad, p.grad, value=1 - beta2)
                    denom = (v_p / (1 - beta2**step)).sqrt_().add_(eps)
                    p.addcdiv_(m_p, denom, value=-lr / (1 - beta1**step))
    model.zero_grad(set_to_none=True)
    return model.eval()


def _training_data(n: int = 768) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(SEED)
    features = torch.randn(n, 2, generator=generator)
    return features, true_class(features)


@functools.lru_cache(maxsize=1)
def _trained_classifier() -> SectorClassifier:
    with seeded_weights(SEED):  # fixed initial weights; the caller's random stream is left alone
        model = SectorClassifier()
    features, labels = _training_data()
    # label smoothing keeps the logits O(1), like a calibrated production classifier
    return _fit(
        model,
        lambda net: torch.nn.functional.cross_entropy(net(features), labels, label_smoothing=0.1),
        250,
        0.02,
    )


def classifier(device: torch.device | str = "cpu") -> SectorClassifier:
    """The lesson's classifier with fixed weights, in eval mode, on ``device``.

    Trained once per process on the CPU in float32 (deterministic, well under a second); every call returns
    its own copy, with the same weights on every device.
    """
    return copy.deepcopy(_trained_classifier()).to(device)


@dataclass(frozen=True)
class ReferenceSet:
    """A fixed set of samples: ``ids``, ``categories``, raw ``inputs`` [N, F] and ``labels`` (-1 = none)."""

    ids: tuple
    categories: tuple
    inputs: torch.Tensor
    labels: torch.Tensor
    notes: tuple

    def __len__(self) -> int:
        return len(self.ids)

    def to(self, device) -> torch.Tensor:
        """The raw inputs on ``device`` (the set itself stays on the CPU)."""
        return self.inputs.to(device)

    def table(self) -> pd.DataFrame:
        frame = pd.DataFrame({"id": self.ids, "category": self.categories})
        for j in range(self.inputs.shape[1]):
            frame[f"x{j}"] = self.inputs[:, j].tolist()
        frame["label"] = self.labels.tolist()
        frame["note"] = self.notes
        return frame

    def counts(self) -> pd.Series:
        return pd.Series(self.categories).value_counts().rename("samples")


def _unit(angle: float) -> torch.Tensor:
    return torch.tensor([math.cos(angle), math.sin(angle)], dtype=torch.float64)


def _scores_at(model, angle: float) -> torch.Tensor:
    with torch.no_grad():
        return model(_unit(angle).float().unsqueeze(0))[0].double()


def _boundary_angle(model, a: int, b: int, lo: float, hi: float, target: float) -> float:
    """Bisection for the angle in [lo, hi] where score[a] - score[b] == target (sign change assumed)."""

    def gap(angle):
        s = _scores_at(model, angle)
        return float(s[a] - s[b]) - target

    g_lo = gap(lo)
    for _ in range(60):
        mid = 0.5 * (lo + hi)
        g_mid = gap(mid)
        if (g_mid > 0) == (g_lo > 0):
            lo, g_lo = mid, g_mid
        else:
            hi = mid
    return 0.5 * (lo + hi)


@functools.lru_cache(maxsize=1)
def _reference_set() -> ReferenceSet:
    model = classifier("cpu")
    generator = torch.Generator().manual_seed(SEED + 1)
    ids, categories, features, notes = [], [], [], []

    def add(prefix, category, feature, note):
        ids.append(f"{prefix}-{sum(1 for i in ids if i.startswith(prefix)):02d}")
        categories.append(category)
        features.append(feature.double())
        notes.append(note)

    for _ in range(12):
        add(
            "normal",
            "normal",
            torch.randn(2, generator=generator, dtype=torch.float64),
            "drawn from the data distribution",
        )
    directions = [_unit(a) for a in (0.9, 3.1, 5.3)]
    for i, scale in enumerate(LARGE_SCALES):
        add("large", "edge: large", directions[i % 3] * scale, f"unit direction x {scale:g}")
    for scale, k in zip(TINY_SCALES, (0, 2, 1, 2)):
        add("tiny", "edge: tiny", directions[k] * scale, f"unit direction x {scale:g}")
    add("zero", "edge: zero", torch.zeros(2, dtype=torch.float64), "all zeros: every score is exactly 0")
    # The boundary between class a and class b sits near SECTOR_STARTS; bisect on the model itself for the
    # angle where score[a] - score[b] equals +margin (a wins) or -margin (b wins), alternating the winner.
    # Radii differ so that no two boundary inputs round to the same low-precision input; by homogeneity the
    # margin at radius r is r times the margin on the unit circle.
    for start, a, b in ((2.0, 0, 1), (4.2, 1, 2), (2 * math.pi, 2, 0)):
        for i, (margin, radius) in enumerate(zip(BOUNDARY_MARGINS, BOUNDARY_RADII)):
            winner, loser, target = (a, b, margin) if i % 2 == 0 else (b, a, -margin)
            angle = _boundary_angle(model, a, b, start - 0.6, start + 0.6, target / radius)
            add(
                "boundary",
                "boundary",
                _unit(angle) * radius,
                f"{CLASSES[winner]} just ahead of {CLASSES[loser]} (target margin {margin:g})",
            )
    stacked = torch.stack(features).float()
    labels = true_class(stacked)
    raw = stacked * FEATURE_SCALE  # store raw measurements; preprocess() gives the features back
    return ReferenceSet(tuple(ids), tuple(categories), raw, labels, tuple(notes))


def reference_set() -> ReferenceSet:
    """The fixed reference set of lesson 04 (same samples on every call and every machine).

    Each call returns its own copy of the tensors, so an in-place edit in a notebook cannot change the set.
    """
    cached = _reference_set()
    return dataclasses.replace(cached, inputs=cached.inputs.clone(), labels=cached.labels.clone())


# ---------------------------------------------------------------------------------------------- regression


def load_curve(t: torch.Tensor) -> torch.Tensor:
    """The regression target: a daily load profile in kW, peaking twice (values ~ 300 to 1300)."""
    return 800 + 350 * torch.sin(2 * math.pi * t) + 150 * torch.sin(4 * math.pi * t + 1.0)


@functools.lru_cache(maxsize=1)
def _trained_regressor() -> LoadRegressor:
    with seeded_weights(SEED):
        model = LoadRegressor()
    t = torch.linspace(0, 1, 256).unsqueeze(1)
    target = load_curve(t)
    return _fit(
        model, lambda net: torch.nn.functional.mse_loss(net(t), target) / LoadRegressor.SCALE**2, 800, 0.01
    )


def regressor(device: torch.device | str = "cpu") -> LoadRegressor:
    """The lesson's regression model (fixed weights, eval mode) on ``device``; each call returns its own
    copy."""
    return copy.deepcopy(_trained_regressor()).to(device)


@dataclass(frozen=True)
class RegressionSet:
    ids: tuple
    inputs: torch.Tensor  # [N, 1] time of day in [0, 1]
    targets: torch.Tensor  # [N] measured load

    def __len__(self) -> int:
        return len(self.ids)


def regression_set() -> RegressionSet:
    """24 hourly samples of the load curve: the outputs that matter are the errors and the peak hour.

    Built afresh on every call (it is cheap), so an in-place edit in a notebook cannot change the next one.
    """
    t = torch.linspace(0, 1, 25)[:-1]
    return RegressionSet(tuple(f"h{int(round(float(v) * 24)):02d}" for v in t), t.unsqueeze(1), load_curve(t))
