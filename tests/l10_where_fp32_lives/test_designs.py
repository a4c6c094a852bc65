"""Lesson 10's designs and training task: bytes per parameter measured on the tensors, and the runs the lesson
judges — pure BF16 stalls, every design with an FP32 copy, stochastic rounding or Kahan follows the FP32 run."""

import pytest
import torch

from amp_lessons.l04_baseline_and_decision_boundary import Criteria
from amp_lessons.l10_where_fp32_lives.designs import (
    DESIGNS,
    LowPrecisionAdam,
    bytes_per_parameter,
    tensor_bytes,
)
from amp_lessons.l10_where_fp32_lives.training import task, train_design, verdicts

BYTES = {
    "FP32": 16,
    "autocast, FP32 params": 16,
    "pure BF16": 8,
    "BF16 + FP32 copy in optimizer": 16,
    "pure BF16 + stochastic rounding": 8,
    "pure BF16 + Kahan": 10,
}


@pytest.fixture(scope="module")
def runs():
    return {name: train_design(design) for name, design in DESIGNS.items()}


@pytest.mark.parametrize("name", list(BYTES))
def test_bytes_per_parameter(runs, name):
    run = runs[name]
    assert bytes_per_parameter(run.model, run.optimizer)["total"] == BYTES[name]


def test_pure_bf16_stalls_and_the_fixes_follow_fp32(runs):
    reference = runs["FP32"].final_loss
    assert runs["pure BF16"].final_loss > 1.25 * reference
    for name in BYTES:
        if name != "pure BF16":
            assert runs[name].final_loss == pytest.approx(reference, rel=0.03), name
    late = runs["pure BF16"].lost[150:]
    assert sum(late) / len(late) > 0.5 and max(runs["pure BF16 + Kahan"].lost) == 0


def test_verdicts_judge_against_the_reference(runs):
    criteria = Criteria(atol=0.25, rtol=0.05, min_quality=0.9)
    labels = task()["y_eval"]
    table = verdicts(
        runs.values(), runs["FP32"], criteria, recorded_fingerprint=criteria.fingerprint, labels=labels
    )
    verdict = dict(zip(table["design"], table["verdict"]))
    assert verdict["pure BF16"] == "FAILED"
    assert all(v == "PASSED" for name, v in verdict.items() if name != "pure BF16")


def test_the_optimizer_refuses_an_unknown_rounding():
    with pytest.raises(ValueError, match="rounding must be one of"):
        LowPrecisionAdam([torch.nn.Parameter(torch.zeros(2))], rounding="banker")


def test_fp32_design_is_plain_adam():
    torch.manual_seed(0)
    a = torch.nn.Parameter(torch.randn(5))
    b = torch.nn.Parameter(a.detach().clone())
    mine, theirs = LowPrecisionAdam([a], lr=0.1), torch.optim.Adam([b], lr=0.1)
    for _ in range(5):
        for p, opt in ((a, mine), (b, theirs)):
            opt.zero_grad()
            (p**2).sum().backward()
            opt.step()
    assert torch.allclose(a, b, atol=1e-6)


def test_tensor_bytes_of_a_plain_tensor():
    assert tensor_bytes(torch.zeros(10, dtype=torch.bfloat16)) == 20
