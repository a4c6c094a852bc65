"""A recipe: a small CNN on the bundled handwritten digits (8x8 pixels, 10 classes).

``python -m amp_lessons validate digits_cnn.py --require bf16`` runs the course's protocol on it. The model is
trained here, in FP32, for a few epochs (about a second on a laptop CPU): the tool validates a *trained* model,
as you would validate yours, and then runs a short training trial from those weights in each dtype.
"""

import torch
import torch.nn.functional as F
from torch import nn

from amp_lessons.l04_baseline_and_decision_boundary import Criteria
from amp_lessons.l12_your_model_validated.digits import split_digits

task = "classification"
cpu_threads = 1  # a model this small runs faster (and steadier) on one CPU thread

# Written down before any trial, from what the decisions are used for.
criteria = Criteria(
    atol=0.05,
    rtol=0.02,
    min_quality=0.95,
    allowed_decision_changes=1,
    application="read a handwritten digit on a form; one changed reading in 360 goes to manual review",
)

TRAIN_X, TRAIN_Y, EVAL_X, EVAL_Y = split_digits(evaluation=360, seed=0)


def build_model():
    model = nn.Sequential(
        nn.Conv2d(1, 16, 3, padding=1),
        nn.ReLU(),
        nn.Conv2d(16, 32, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(32 * 4 * 4, 64),
        nn.ReLU(),
        nn.Dropout(0.1),
        nn.Linear(64, 10),
    )
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    generator = torch.Generator().manual_seed(1)
    for _ in range(8):  # pre-training in FP32: the model the trial starts from
        order = torch.randperm(len(TRAIN_Y), generator=generator)
        for start in range(0, len(order), 128):
            batch = order[start : start + 128]
            loss = F.cross_entropy(model(TRAIN_X[batch]), TRAIN_Y[batch])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    return model


def evaluation_batches():
    return [(EVAL_X[i : i + 120], EVAL_Y[i : i + 120]) for i in range(0, len(EVAL_Y), 120)]


def training_batches():
    generator = torch.Generator().manual_seed(2)
    while True:
        batch = torch.randint(0, len(TRAIN_Y), (64,), generator=generator)
        yield TRAIN_X[batch], TRAIN_Y[batch]


def loss_fn(outputs, targets):
    return F.cross_entropy(outputs, targets)


def optimizer(params):
    return torch.optim.Adam(params, lr=1e-3)
