"""Recipes for lesson 12's tests: a tiny good one, and a way to write variants of it into a temporary folder."""

import textwrap

import pytest

TINY = """
import torch
import torch.nn.functional as F
from torch import nn

from amp_lessons.l04_baseline_and_decision_boundary import Criteria

cpu_threads = 1
criteria = Criteria(atol=0.05, rtol=0.05, allowed_decision_changes=2, application="a test recipe")
generator = torch.Generator().manual_seed(0)
X, Y = torch.randn(32, 8, generator=generator), torch.randint(0, 3, (32,), generator=generator)


def build_model():
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))


def evaluation_batches():
    return [(X[:16], Y[:16]), (X[16:], Y[16:])]


def training_batches():
    return evaluation_batches() * 3


def loss_fn(outputs, targets):
    return F.cross_entropy(outputs, targets)
"""


@pytest.fixture
def write_recipe(tmp_path):
    """``write_recipe(extra="", drop=())`` -> the path of TINY with ``extra`` appended and ``drop``-ped defs."""

    def write(extra: str = "", drop=(), name: str = "recipe.py"):
        text = TINY
        for function in drop:
            start = text.index(f"def {function}(")
            end = text.find("\n\n\ndef ", start)
            text = text[:start] + (text[end + 3 :] if end != -1 else "")
        path = tmp_path / name
        path.write_text(text + "\n" + textwrap.dedent(extra), encoding="utf-8")
        return path

    return write


@pytest.fixture(scope="module")
def full_run(tmp_path_factory):
    """One full run of the tiny recipe in both dtypes, shared by the tests that only read its report."""
    from amp_lessons.l12_your_model_validated import validate

    folder = tmp_path_factory.mktemp("full")
    recipe = folder / "tiny.py"
    recipe.write_text(TINY, encoding="utf-8")
    return validate(recipe, out=folder / "report", steps=6, progress=False, device="cpu")
