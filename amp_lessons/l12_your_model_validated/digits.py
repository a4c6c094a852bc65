"""Lesson 12: the handwritten digits the capstone validates on, bundled in the package (no download).

``digits.csv.gz`` is scikit-learn's copy of the UCI "Optical Recognition of Handwritten Digits" test set
(E. Alpaydin, C. Kaynak, 1998): 1797 images of 8x8 pixels, each pixel a count 0..16, and the digit 0-9 as
the last column. It is copied unchanged from scikit-learn's wheel (``sklearn/datasets/data/digits.csv.gz``),
so the course needs neither scikit-learn nor a network. Why this set: it is real data (people's
handwriting), small enough that a CNN trains in seconds on a laptop CPU, and hard enough that some samples
sit close to a decision boundary — exactly the samples a low-precision trial can flip.

NOTICE. The file is distributed under scikit-learn's licence:

    BSD 3-Clause License. Copyright (c) 2007-2026 The scikit-learn developers. All rights reserved.
    Redistribution and use in source and binary forms, with or without modification, are permitted
    provided that the following conditions are met: (1) Redistributions of source code must retain the
    above copyright notice, this list of conditions and the following disclaimer. (2) Redistributions in
    binary form must reproduce the above copyright notice, this list of conditions and the following
    disclaimer in the documentation and/or other materials provided with the distribution. (3) Neither
    the name of the copyright holder nor the names of its contributors may be used to endorse or promote
    products derived from this software without specific prior written permission.
    THIS SOFTWARE IS PROVIDED BY THE COPYRIGHT HOLDERS AND CONTRIBUTORS "AS IS" AND ANY EXPRESS OR IMPLIED
    WARRANTIES, INCLUDING, BUT NOT LIMITED TO, THE IMPLIED WARRANTIES OF MERCHANTABILITY AND FITNESS FOR A
    PARTICULAR PURPOSE ARE DISCLAIMED. IN NO EVENT SHALL THE COPYRIGHT HOLDER OR CONTRIBUTORS BE LIABLE
    FOR ANY DIRECT, INDIRECT, INCIDENTAL, SPECIAL, EXEMPLARY, OR CONSEQUENTIAL DAMAGES (INCLUDING, BUT NOT
    LIMITED TO, PROCUREMENT OF SUBSTITUTE GOODS OR SERVICES; LOSS OF USE, DATA, OR PROFITS; OR BUSINESS
    INTERRUPTION) HOWEVER CAUSED AND ON ANY THEORY OF LIABILITY, WHETHER IN CONTRACT, STRICT LIABILITY, OR
    TORT (INCLUDING NEGLIGENCE OR OTHERWISE) ARISING IN ANY WAY OUT OF THE USE OF THIS SOFTWARE, EVEN IF
    ADVISED OF THE POSSIBILITY OF SUCH DAMAGE.

The data themselves come from the UCI Machine Learning Repository (CC BY 4.0),
https://archive.ics.uci.edu/dataset/80/optical+recognition+of+handwritten+digits.
"""

from __future__ import annotations

import functools
import gzip
from pathlib import Path

import numpy as np
import torch

DATA_FILE = Path(__file__).with_name("digits.csv.gz")
SAMPLES = 1797

__all__ = ["DATA_FILE", "SAMPLES", "load_digits", "split_digits"]


@functools.lru_cache(maxsize=1)
def _read() -> tuple[np.ndarray, np.ndarray]:
    with gzip.open(DATA_FILE, "rt", encoding="ascii") as handle:
        table = np.loadtxt(handle, delimiter=",", dtype=np.float32)
    return table[:, :-1].reshape(-1, 1, 8, 8), table[:, -1].astype(np.int64)


def load_digits() -> tuple[torch.Tensor, torch.Tensor]:
    """``(images, labels)``: float32 ``[1797, 1, 8, 8]`` scaled to 0..1 (pixel counts / 16), int64 ``[1797]``."""
    images, labels = _read()
    return torch.from_numpy(images / 16.0).float(), torch.from_numpy(labels.copy())


def split_digits(evaluation: int = 360, seed: int = 0):
    """A fixed split: ``(train_images, train_labels, eval_images, eval_labels)``, the same for every ``seed`` call.

    The permutation comes from its own generator, so the split never depends on (or moves) the global
    random state a validation run seeds.
    """
    images, labels = load_digits()
    order = torch.randperm(len(labels), generator=torch.Generator().manual_seed(seed))
    held, kept = order[:evaluation], order[evaluation:]
    return images[kept], labels[kept], images[held], labels[held]
