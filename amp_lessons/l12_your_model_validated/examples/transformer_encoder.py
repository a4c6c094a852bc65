"""A recipe: ``torch.nn.TransformerEncoder`` classifying windows of raw sensor readings.

The readings are in their raw units (pressures around 400, with swings of ±100), fed to the encoder without
normalisation, as often happens when a model is moved from a prototype to production data. In FP32 that is
only unusual; in float16 the attention scores (query · key over 32 features of magnitude ~400) pass 65504 and
become inf, and softmax turns inf into NaN. The report names the module where the first inf appears.
BF16 has FP32's range, so it is judged on its rounding alone.
"""

import torch
import torch.nn.functional as F
from torch import nn

from amp_lessons.l04_baseline_and_decision_boundary import Criteria

task = "classification"
cpu_threads = 1

criteria = Criteria(
    atol=0.05,
    rtol=0.05,
    min_quality=None,  # random weights: the decisions are compared with FP32's, quality is not judged
    allowed_decision_changes=2,
    application="flag a sensor window as one of 4 states; a flipped flag pages the wrong team",
)

FEATURES, WINDOW, CLASSES = 32, 16, 4


class SensorClassifier(nn.Module):
    def __init__(self):
        super().__init__()
        layer = nn.TransformerEncoderLayer(
            FEATURES, nhead=4, dim_feedforward=64, dropout=0.0, activation=F.silu, batch_first=True
        )
        self.encoder = nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=False)
        self.head = nn.Linear(FEATURES, CLASSES)

    def forward(self, readings):
        return self.head(self.encoder(readings).mean(dim=1))


def _readings(count: int, seed: int):
    generator = torch.Generator().manual_seed(seed)
    readings = 400 + 100 * torch.randn(count, WINDOW, FEATURES, generator=generator)
    labels = torch.randint(0, CLASSES, (count,), generator=generator)
    return readings, labels


EVAL_X, EVAL_Y = _readings(64, seed=0)
TRAIN_X, TRAIN_Y = _readings(256, seed=1)


def build_model():
    return SensorClassifier()


def evaluation_batches():
    return [(EVAL_X[i : i + 32], EVAL_Y[i : i + 32]) for i in range(0, len(EVAL_Y), 32)]


def training_batches():
    return [(TRAIN_X[i : i + 32], TRAIN_Y[i : i + 32]) for i in range(0, len(TRAIN_Y), 32)]


def loss_fn(outputs, targets):
    return F.cross_entropy(outputs, targets)


def optimizer(params):
    return torch.optim.AdamW(params, lr=1e-4)
