"""Small models the lessons train and break on purpose. Each says what about it matters numerically."""

from __future__ import annotations

import contextlib

import torch
from torch import nn


@contextlib.contextmanager
def seeded_weights(seed: int | None):
    """Initialise layers inside this block from ``seed``: the same weights whatever ran before, and the
    caller's global random stream untouched. ``None`` draws from the global stream as usual."""
    with torch.random.fork_rng(devices=[], enabled=seed is not None):
        if seed is not None:
            torch.manual_seed(seed)
        yield


def normal_batch(n: int, in_features: int, out_features: int, seed: int, device="cpu"):
    """A fixed regression batch ``(x, y)``: standard-normal inputs and targets from their own generator."""
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(n, in_features, generator=generator)
    y = torch.randn(n, out_features, generator=generator)
    return x.to(device), y.to(device)


# ----------------------------------------------------------------------------- lesson 07: a step worth timing


class TimingMLP(nn.Module):
    """A matmul-heavy MLP for timing FP32 vs FP16/BF16 autocast (lesson 07).

    Numerically it is boring on purpose (it trains fine in every dtype); what matters is its mix of ops:
    ``Linear`` layers (autocast runs them in low precision: the part that can get faster), a ``LayerNorm``
    (on CUDA autocast keeps it in FP32; the CPU policy does not) and ``GELU``. ``hidden`` sets the matmul
    sizes, so the lesson can compare a Tensor-Core-friendly multiple of 8 with an unfriendly size on a GPU.
    """

    def __init__(self, in_features: int = 256, hidden: int = 512, classes: int = 10):
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(in_features, hidden),
            nn.LayerNorm(hidden),
            nn.GELU(),
            nn.Linear(hidden, hidden),
            nn.GELU(),
            nn.Linear(hidden, classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


# --------------------------------------------------- lesson 04: a classifier and a regressor with a reference


class SectorClassifier(nn.Module):
    """Three-class classifier of 2-D inputs (lesson 04's reference model); weights come from amp_lessons.core.data.

    No bias terms, on purpose: a bias-free ReLU network is positively homogeneous, ``f(c * x) = c * f(x)``,
    so in exact arithmetic a scaled input keeps its decision. Under FP16 autocast a large input overflows
    the hidden activations (> 65504) and a tiny one underflows to zero, so any decision that changes for
    them is the number format, not the model.
    """

    def __init__(self, hidden: int = 32, classes: int = 3):
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(2, hidden, bias=False),
            nn.ReLU(),
            nn.Linear(hidden, hidden, bias=False),
            nn.ReLU(),
            nn.Linear(hidden, classes, bias=False),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class LoadRegressor(nn.Module):
    """Predicts a load in kW (values ~300 to 1300) from the time of day in [0, 1] (lesson 04).

    The last step turns a normalised output back into physical units, ``OFFSET + SCALE * z``. Under autocast
    that step runs in the low-precision dtype of ``z``, so the prediction is rounded at the scale of
    ~1000, where FP16 values are 0.5 apart and BF16 values 4 to 8 apart.
    """

    OFFSET = 800.0
    SCALE = 400.0

    def __init__(self, hidden: int = 32):
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(1, hidden), nn.Tanh(), nn.Linear(hidden, hidden), nn.Tanh(), nn.Linear(hidden, 1)
        )

    def forward(self, t: torch.Tensor) -> torch.Tensor:
        return self.OFFSET + self.SCALE * self.net(t)


# ------------------------------------------------------- lesson 03: the model the training step is checked on


class TinyClassifier(nn.Module):
    """Linear -> ReLU -> Linear classifier, small enough that a checker can train it many times in < 0.1 s.

    What matters for lesson 03: its two ``Linear`` layers are on autocast's lower-precision list (their
    outputs, and so the logits, come out in FP16/BF16), while ``cross_entropy`` on those logits is on the
    float32 list on CPU and CUDA alike — so the loss is FP32 and its gradient flows back into FP16 ops,
    where a too-large loss scale overflows.
    """

    def __init__(self, in_features: int = 6, hidden: int = 16, classes: int = 4):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(in_features, hidden), nn.ReLU(), nn.Linear(hidden, classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


# ------------------------------------------- lesson 06: a model whose training consumes random numbers


class SensorClassifier(nn.Module):
    """Classifies raw sensor readings into 4 classes (lesson 06: checkpoint, resume, roll back).

    What matters for checkpointing:
    - ``Dropout`` draws random numbers on every training step, so a resumed run reproduces the
      uninterrupted one only when the RNG state is saved and restored along with the weights;
    - ``fp32_regions`` names the parts kept in FP32 (autocast disabled inside them): part of the
      precision policy a checkpoint must record (``"head"`` by default: the logits are computed in FP32);
    - the readings are raw (values in the hundreds, see :func:`sensor_readings`), so FP16 gradients are
      large and the GradScaler has to back off from its initial scale: the scale it settles at is real
      state that a checkpoint must keep.
    """

    REGIONS = ("body", "head")

    def __init__(
        self,
        in_features: int = 16,
        hidden: int = 64,
        classes: int = 4,
        dropout: float = 0.2,
        fp32_regions=("head",),
    ):
        super().__init__()
        unknown = sorted(set(fp32_regions) - set(self.REGIONS))
        if unknown:
            raise ValueError(f"fp32_regions may name {self.REGIONS}; got unknown region(s) {unknown}.")
        self.fp32_regions = tuple(r for r in self.REGIONS if r in fp32_regions)
        self.body = nn.Sequential(
            nn.Linear(in_features, hidden),
            nn.ReLU(),
            nn.Dropout(dropout),
            nn.Linear(hidden, hidden),
            nn.ReLU(),
            nn.Dropout(dropout),
        )
        self.head = nn.Linear(hidden, classes)

    def _region(self, name: str, module: nn.Module, x: torch.Tensor) -> torch.Tensor:
        if name in self.fp32_regions:
            with torch.autocast(device_type=x.device.type, enabled=False):
                return module(x.float())
        return module(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._region("head", self.head, self._region("body", self.body, x))


def sensor_readings(
    n: int = 512, *, seed: int = 1, in_features: int = 16, classes: int = 4, scale: float = 300.0
):
    """``(readings [n, in_features], labels [n])`` for :class:`SensorClassifier`: a fixed, learnable task.

    The readings are raw values (standard deviation ``scale``, i.e. in the hundreds), not normalised: that
    makes the FP16 gradients large enough that a GradScaler starting at 2**16 skips its first steps.
    Labels come from one fixed random linear rule (the same for every ``seed``; ``seed`` picks the samples,
    so ``seed=2`` gives a held-out set of the same task).
    """
    rule = torch.randn(in_features, classes, generator=torch.Generator().manual_seed(0))
    readings = torch.randn(n, in_features, generator=torch.Generator().manual_seed(seed)) * scale
    return readings, (readings @ rule).argmax(dim=1)


# ---------------------------------------------- lesson 05: models that overflow in ONE op under FP16 autocast


class ScoreProduct(nn.Module):
    """Attention scores ``q @ k^T`` (no 1/sqrt(d) scaling), as a module of its own so hooks can name it.

    A matmul: on autocast's lower-precision list on CPU and CUDA alike. Each score sums ``dim`` products,
    so query/key entries in the hundreds give scores above 65504, the float16 maximum: +-inf in float16,
    an ordinary number in float32. The next softmax turns an inf into NaN.
    """

    def forward(self, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        return q @ k.transpose(-2, -1)


class TinyAttentionClassifier(nn.Module):
    """One attention head over a sequence of tokens, then a linear classifier (lesson 05).

    ``x`` is ``[batch, tokens, features]``. query/key/value are ``Linear`` layers, the scores come from
    the ``scores`` submodule (swap it to change how they are computed), the softmax and ``weights @ v``
    run inline in ``forward``. Loud inputs (raw, un-normalised readings in the hundreds) make some
    scores exceed 65504: in FP32 nothing is wrong, under FP16 autocast exactly one op overflows.
    """

    def __init__(self, features: int = 8, dim: int = 16, classes: int = 3, seed: int | None = None):
        super().__init__()
        with seeded_weights(seed):
            self.query = nn.Linear(features, dim)
            self.key = nn.Linear(features, dim)
            self.value = nn.Linear(features, dim)
            self.head = nn.Linear(dim, classes)
        self.scores = ScoreProduct()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.query(x), self.key(x), self.value(x)
        weights = torch.softmax(self.scores(q, k), dim=-1)
        return self.head((weights @ v).mean(dim=1))


def attention_batch(
    n: int = 64,
    *,
    tokens: int = 12,
    features: int = 8,
    classes: int = 3,
    loud_every: int = 4,
    loudness: float = 150.0,
    seed: int = 0,
    device=None,
):
    """Token sequences ``x [n, tokens, features]``, labels ``y [n]`` and a mask of the *loud* samples.

    Every ``loud_every``-th sample is multiplied by ``loudness`` (readings left in raw units): harmless
    in FP32, but its attention scores exceed the FP16 range. Deterministic for a given ``seed``.
    """
    if n < 1 or tokens < 1 or features < 1 or classes < 2 or loud_every < 1:
        raise ValueError("attention_batch needs n, tokens, features, loud_every >= 1 and classes >= 2")
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(n, tokens, features, generator=generator)
    loud = torch.arange(n) % loud_every == 0
    x[loud] *= loudness
    y = torch.randint(0, classes, (n,), generator=generator)
    return x.to(device), y.to(device), loud.to(device)


class TextureNet(nn.Module):
    """Gram-matrix ("texture", second-order) pooling, then a linear classifier (lesson 05's exercise).

    ``features`` maps each of the ``T`` tokens to ``channels`` non-negative activations ``h``; ``forward``
    pools them into the Gram matrix ``h^T h / T`` (channel co-occurrences, as in style transfer) and
    classifies its flattened entries. The product ``h^T @ h`` sums ``T`` products *before* the division
    by ``T``: with long sequences of strong activations it exceeds 65504 under FP16 autocast although the
    pooled value (after ``/ T``) is small. The product is written inline, not as a submodule.
    """

    def __init__(self, features: int = 8, channels: int = 6, classes: int = 3, seed: int | None = None):
        super().__init__()
        with seeded_weights(seed):
            self.features = nn.Sequential(nn.Linear(features, channels), nn.ReLU())
            self.head = nn.Linear(channels * channels, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.features(x)
        gram = h.transpose(1, 2) @ h / h.shape[1]
        return self.head(gram.flatten(1))


def texture_batch(
    n: int = 16,
    *,
    tokens: int = 64,
    features: int = 8,
    classes: int = 3,
    strength: float = 60.0,
    seed: int = 0,
    device=None,
):
    """Inputs ``x [n, tokens, features]`` (std ``strength``) and labels ``y [n]``, deterministic per
    ``seed``."""
    if n < 1 or tokens < 1 or features < 1 or classes < 2:
        raise ValueError("texture_batch needs n, tokens, features >= 1 and classes >= 2")
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(n, tokens, features, generator=generator) * strength
    y = torch.randint(0, classes, (n,), generator=generator)
    return x.to(device), y.to(device)


# -------------------------------------------- lesson 02: gradients that underflow / activations that overflow


class DeepSigmoidMLP(nn.Module):
    """A deep, narrow sigmoid MLP whose gradients shrink layer by layer going back from the loss (lesson 02).

    Why its gradients are small, in order of size:
    - **sigmoid's slope is at most 1/4** (at 0), and PyTorch's default ``Linear`` init keeps weights
      around ``1/sqrt(3 * fan_in)``; so every layer multiplies the backward signal by well under 1
      (about 2^-3 here), and seven hidden layers compound that to roughly 2^-20 between the head and
      the first layer: the classic vanishing-gradient design;
    - **the loss is a mean** over ``batch x outputs`` values, so the gradient arriving at the output is
      divided by that count before backward even starts;
    - **activation gradients are per sample**: a weight gradient sums over the batch, the gradient of a
      layer's output does not, so activation gradients are smaller still.
    Nothing here is pathological in FP32, which has range to spare; in FP16 many gradients fall below
    2^-24 and become zero. ``example_batch`` gives a fixed regression batch for it; ``seed`` fixes the
    weights.
    """

    def __init__(
        self, in_features: int = 32, width: int = 64, depth: int = 7, out_features: int = 10, seed: int = 0
    ):
        super().__init__()
        sizes = [in_features] + [width] * depth
        with seeded_weights(seed):
            self.layers = nn.ModuleList(nn.Linear(a, b) for a, b in zip(sizes[:-1], sizes[1:]))
            self.head = nn.Linear(width, out_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = torch.sigmoid(layer(x))
        return self.head(x)

    @staticmethod
    def example_batch(
        n: int = 128, in_features: int = 32, out_features: int = 10, seed: int = 1, device="cpu"
    ):
        """A fixed regression batch ``(x, y)``: standard-normal inputs and targets, from its own generator."""
        return normal_batch(n, in_features, out_features, seed, device)


class OutlierFeatureMLP(nn.Module):
    """A model whose weights were "designed for BF16": a few hidden channels reach ~10^5 (lesson 02).

    ``outliers`` of the first layer's output channels have their weights (and biases) multiplied by
    ``outlier_gain``, the way some channels of large trained models grow huge activations when nothing
    in training (FP32 or BF16, both with a range up to ~3.4e38) ever pushed back. The ``LayerNorm``
    after it divides by each row's spread, so in FP32 and BF16 the model's output is ordinary. In FP16 the
    first layer's output is stored above 65504, becomes inf, and the LayerNorm turns the whole row into
    NaN — in the *forward* pass, where no loss scale can reach it.
    """

    def __init__(
        self,
        in_features: int = 16,
        width: int = 64,
        out_features: int = 1,
        outliers: int = 4,
        outlier_gain: float = 2.0**17,
        seed: int = 0,
    ):
        super().__init__()
        with seeded_weights(seed):
            self.first = nn.Linear(in_features, width)
            self.norm = nn.LayerNorm(width)
            self.head = nn.Linear(width, out_features)
        with torch.no_grad():
            self.first.weight[:outliers].mul_(outlier_gain)
            self.first.bias[:outliers].mul_(outlier_gain)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.relu(self.norm(self.first(x))))

    @staticmethod
    def example_batch(n: int = 64, in_features: int = 16, out_features: int = 1, seed: int = 2, device="cpu"):
        """A fixed regression batch ``(x, y)`` from its own generator."""
        return normal_batch(n, in_features, out_features, seed, device)
