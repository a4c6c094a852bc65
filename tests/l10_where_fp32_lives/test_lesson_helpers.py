"""Lesson 10's other helpers: the BF16 KL gradient error, the FP16 mask constants with lesson 05's finder, SDPA's
boolean mask, the optimizer-state sizes and quantisation errors, and the instrumented framework flags."""

import math

import pytest
import torch
import torch.nn.functional as F

from amp_lessons.core.optional_libraries import torchao_support
from amp_lessons.l05_nan_debugging import find_first_nonfinite
from amp_lessons.l10_where_fp32_lives.designs import DESIGNS, tensor_bytes
from amp_lessons.l10_where_fp32_lives.framework_flags import run_flag, why_unusable
from amp_lessons.l10_where_fp32_lives.loss_precision import kl_gradient_errors
from amp_lessons.l10_where_fp32_lives.mask_constants import (
    FILLS,
    PaddedAttentionClassifier,
    mask_values,
    padded_batch,
    sdpa_masked_rows,
)
from amp_lessons.l10_where_fp32_lives.optimizer_states import (
    quantisation_errors,
    state_bytes,
    torchao_optimizers,
)
from amp_lessons.l10_where_fp32_lives.training import train_design


def test_the_bf16_loss_loses_the_gradient_and_fp32_keeps_it():
    table = kl_gradient_errors(distances=(1.0, 0.1))
    assert (table["loss in BF16"] > 0.02).all() and (table["loss in FP32"] < 1e-3).all()
    assert (
        table["loss in BF16"].iloc[1] > table["loss in BF16"].iloc[0]
    )  # worse as the student nears the teacher


def test_mask_values():
    table = mask_values().set_index("fill")
    assert table.loc["-1e9", "float16"] == -math.inf
    assert table.loc["torch.finfo(torch.float32).min", "bfloat16"] == -math.inf
    assert table.loc["torch.finfo(scores.dtype).min", "float16"] == -65504.0


@pytest.mark.parametrize("fill_name, broken", [("-1e9", True), ("torch.finfo(scores.dtype).min", False)])
def test_the_finder_points_at_the_mask(fill_name, broken):
    x, y = padded_batch()
    model = PaddedAttentionClassifier(FILLS[fill_name])
    report = find_first_nonfinite(
        model, torch.optim.SGD(model.parameters(), lr=1e-2), None, F.cross_entropy, x, y, dtype=torch.float16
    )
    assert report.found == broken
    if broken:
        assert report.first.name == "mask" and math.isnan(report.loss)


def test_fp32_forward_is_finite_with_every_fill():
    x, _ = padded_batch()
    for fill in FILLS.values():
        assert torch.isfinite(PaddedAttentionClassifier(fill)(x)).all()


def test_sdpa_report_counts_the_fully_masked_rows():
    report = sdpa_masked_rows()
    assert report["fully masked rows"] > 0 and report["other rows finite"]
    assert report["their outputs"] in ("all zeros", "NaN", "other")


def test_quantisation_errors_grow_as_bits_shrink():
    run = train_design(DESIGNS["FP32"], steps=20)
    table = quantisation_errors(run.optimizer)
    eight = table[table["bits"] == 8]["relative error"].max()
    four = table[table["bits"] == 4]["relative error"].min()
    assert eight < 0.05 < four
    assert state_bytes(run.optimizer)["state bytes"] == 8 * sum(p.numel() for p in run.model.parameters())


def test_torchao_optimizers_are_offered_only_where_torchao_imports():
    offered = torchao_optimizers()
    assert bool(offered) == torchao_support().available


@pytest.mark.skipif(not torchao_support().available, reason=torchao_support().reason or "torchao missing")
def test_a_quantised_state_counts_its_codes_and_scales():
    from torchao.optim.subclass_8bit import OptimState8bit

    state = OptimState8bit.zeros((4096,), signed=True, block_size=256)
    assert 4096 <= tensor_bytes(state) < 4096 + 2048


@pytest.mark.skipif(bool(why_unusable("lightning")), reason=why_unusable("lightning") or "-")
def test_lightning_bf16_true_trains_bf16_parameters_without_autocast():
    run = run_flag("lightning", "bf16-true")
    assert not run.error, run.error
    assert run.parameter_dtype == "bfloat16" and run.matmul_dtype == "bfloat16" and run.autocast is False
    assert run.scalers == 0 and run.unscaled_before_clip.startswith("no scaler")


@pytest.mark.skipif(bool(why_unusable("transformers")), reason=why_unusable("transformers") or "-")
def test_transformers_bf16_flag_is_autocast_with_fp32_parameters(capfd):
    run = run_flag("transformers", "bf16=True")
    assert not run.error, run.error
    assert run.parameter_dtype == "float32" and run.matmul_dtype == "bfloat16" and run.autocast is True
    assert capfd.readouterr().err == ""  # the frameworks' log lines are caught


def test_a_refused_flag_is_reported_not_raised():
    run = run_flag("lightning", "not-a-precision")
    assert run.error or run.parameter_dtype == "-"
