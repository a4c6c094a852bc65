"""Lesson 02: the scaling helpers, the slider's logic and the two models.
The checkers are tested in tests/checks/test_l02_scaling.py."""

import math

import matplotlib.pyplot as plt
import pandas as pd
import pytest
import torch
from torch import nn

from amp_lessons.core.environment import probe_autocast
from amp_lessons.core.models import DeepSigmoidMLP, OutlierFeatureMLP
from amp_lessons.l02_fp16_underflow_and_loss_scaling.scaling import (
    ActivationGradients,
    capture_gradients,
    classify,
    flat_values,
    fractions,
    limits,
    parameter_gradients,
    per_layer_medians,
    plot_magnitudes,
    plot_sweep,
    scale_explorer,
    scale_sweep,
    scale_table,
    scale_view,
    style_table,
)

F16, BF16 = torch.float16, torch.bfloat16


@pytest.fixture(scope="module")
def small_groups():
    """A few hundred gradient-like values per group: enough for the plot/widget logic, quick to draw."""
    generator = torch.Generator().manual_seed(0)
    magnitudes = torch.exp2(torch.rand(2, 300, generator=generator) * 40 - 38)
    return {"parameter gradients": magnitudes[0], "activation gradients": -magnitudes[1] / 64}


@pytest.fixture(scope="module")
def grads():
    model = DeepSigmoidMLP()
    x, y = DeepSigmoidMLP.example_batch()
    return capture_gradients(model, x, y, nn.MSELoss())


# ----------------------------------------------------------------------------- helpers


def test_limits_come_from_finfo():
    assert limits(F16).log2() == (-24.0, -14.0, math.log2(65504.0))
    assert limits(BF16).smallest_subnormal == 2.0**-133 and limits(BF16).smallest_normal == 2.0**-126
    with pytest.raises(TypeError, match="floating-point torch dtype"):
        limits("float16")


def test_classify_follows_rounding_at_both_ends():
    values = torch.tensor(
        [2.0**-26, 2.0**-25, 1.5 * 2.0**-25, 2.0**-20, 1.0, 65519.0, 65520.0, -1e5, 0.0, float("nan")]
    )
    counts = classify(values, F16)
    # 2^-26 and the tie 2^-25 round to 0; 1.5*2^-25 rounds up to 2^-24 (subnormal); 65519 rounds down to 65504
    assert counts == {"nonzero": 8, "zero": 2, "subnormal": 2, "normal": 2, "inf": 2, "skipped": 2}
    assert classify(values, BF16)["zero"] == 0 and classify(values, BF16)["inf"] == 0


def test_scaling_happens_before_the_cast():
    assert classify(torch.tensor([2.0**-30]), F16, 2.0**16)["normal"] == 1
    expected = {"zero": 0.5, "subnormal": 0.0, "normal": 0.5, "inf": 0.0}
    assert fractions(torch.tensor([2.0**-30, 1.0]), F16, 1.0) == expected


def test_empty_and_bad_input():
    assert fractions(torch.zeros(0), F16) == {"zero": 0.0, "subnormal": 0.0, "normal": 0.0, "inf": 0.0}
    assert flat_values([]).numel() == 0
    with pytest.raises(ValueError, match="positive, finite"):
        classify(torch.ones(3), F16, scale=0)
    with pytest.raises(TypeError, match="list or dict of tensors"):
        classify("gradients", F16)
    with pytest.raises(TypeError, match="integer"):
        scale_table({"g": torch.ones(3)}, 1.5)


def test_the_lesson_model_underflows_at_scale_one_and_overflows_at_2_24(grads):
    sweep = scale_sweep(grads, (0, 8, 16, 24)).set_index(["gradients", "scale"])
    params = sweep.loc["parameter gradients"]
    assert params.loc["2^0", "zero"] > 0.10  # substantial underflow without scaling
    assert params.loc["2^0", "zero"] > params.loc["2^8", "zero"] > params.loc["2^16", "zero"]
    assert params.loc["2^16", "inf"] == 0 and params.loc["2^24", "inf"] > 0
    assert bool(params.loc["2^24", "step skipped"]) and not bool(params.loc["2^16", "step skipped"])
    activations = sweep.loc["activation gradients"]
    assert activations.loc["2^0", "zero"] > params.loc["2^0", "zero"]  # per-sample gradients are smaller


def test_scale_table_has_both_formats_and_bf16_loses_nothing(grads):
    table = scale_table(grads, 0)
    assert set(table["format"]) == {"float16", "bfloat16"}
    bf16 = table[table["format"] == "bfloat16"]
    assert (bf16["zero"] == 0).all() and (bf16["inf"] == 0).all()
    rows = table[["zero", "subnormal", "normal", "inf"]].sum(axis=1)
    assert rows.round(12).eq(1.0).all()
    assert "%" in style_table(table).to_html()


def test_per_layer_gradients_shrink_towards_the_input():
    model = DeepSigmoidMLP()
    x, y = DeepSigmoidMLP.example_batch()
    nn.MSELoss()(model(x), y).backward()
    table = per_layer_medians(model)
    assert list(table["layer"])[-1] == "head"
    assert (table["change vs previous layer (octaves)"].iloc[1:] > 1).all()


def test_activation_gradients_are_recorded_and_hooks_removed():
    model = DeepSigmoidMLP()
    x, y = DeepSigmoidMLP.example_batch(n=8)
    with ActivationGradients(model) as recorder:
        nn.MSELoss()(model(x), y).backward()
    assert set(recorder.grads) == {f"layers.{i}" for i in range(7)} | {"head"}
    assert recorder.grads["head"].shape == (8, 10)
    assert all(not m._forward_hooks for m in model.modules())
    with pytest.raises(TypeError):
        ActivationGradients("model")


CPU_FP16_AUTOCAST = pytest.mark.skipif(
    not probe_autocast(torch.device("cpu"), torch.float16)[0],
    reason="this torch build has no FP16 autocast on the CPU",
)


@CPU_FP16_AUTOCAST
def test_autocast_fp16_activation_gradients_are_fp16_and_scaling_brings_them_back():
    model = DeepSigmoidMLP()
    x, y = DeepSigmoidMLP.example_batch()
    zero = {}
    for exponent in (0, 16):
        model.zero_grad(set_to_none=True)
        with ActivationGradients(model) as recorder:
            with torch.autocast("cpu", dtype=F16):
                loss = nn.MSELoss()(model(x), y)
            (loss * 2.0**exponent).backward()
        assert {g.dtype for g in recorder.grads.values()} == {F16}
        zero[exponent] = (flat_values(recorder.grads) == 0).float().mean().item()
        assert parameter_gradients(model)["head.weight"].dtype == torch.float32
    assert zero[0] > 0.2 and zero[16] < 0.01


def test_loss_scaling_by_a_power_of_two_is_exact_in_fp32(grads):
    model = DeepSigmoidMLP()
    x, y = DeepSigmoidMLP.example_batch()
    scaled = capture_gradients(model, x, y, nn.MSELoss(), scale=2.0**16)
    for name in grads:
        assert torch.equal(scaled[name] / 2.0**16, grads[name])


@CPU_FP16_AUTOCAST
def test_outlier_model_is_fine_in_bf16_and_nan_in_fp16():
    model = OutlierFeatureMLP()
    x, y = OutlierFeatureMLP.example_batch()
    with torch.no_grad():
        reference = nn.MSELoss()(model(x), y)
        assert math.isfinite(reference.item())
        with torch.autocast("cpu", dtype=BF16):
            assert abs(nn.MSELoss()(model(x), y).item() - reference.item()) < 0.05
        with torch.autocast("cpu", dtype=F16):
            assert torch.isinf(model.first(x)).any()
            assert math.isnan(nn.MSELoss()(model(x), y).item())


def test_models_are_seeded_and_leave_the_global_stream_alone():
    torch.manual_seed(123)
    before = torch.get_rng_state()
    a, b = DeepSigmoidMLP(), DeepSigmoidMLP()
    assert torch.equal(torch.get_rng_state(), before)
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))


# ----------------------------------------------------------------------------- plots and the slider


def test_slider_logic_redraws_figure_and_table(small_groups):
    grads = small_groups
    figure, table = scale_view(grads, 16)
    assert isinstance(table, pd.DataFrame) and set(table["scale"]) == {"2^16"}
    assert len(figure.axes) == 2  # range map + histogram
    plt.close(figure)
    low, high = scale_view(grads, 0)[1], scale_view(grads, 24)[1]
    assert low["zero"].sum() > high["zero"].sum() and high["inf"].sum() > low["inf"].sum()
    plt.close("all")


def test_plots_and_widget_build(small_groups):
    grads = small_groups
    figure = plot_sweep(grads, (0, 8, 16, 24))
    assert sum(ax.get_visible() for ax in figure.axes) == 4
    assert figure.axes[0].get_xlim() == figure.axes[3].get_xlim()  # one shared axis shows the shift
    plt.close(figure)
    figure = plot_magnitudes({"empty": torch.zeros(0), "g": torch.tensor([1e-9])}, 0, range_map=False)
    plt.close(figure)
    widget = scale_explorer(grads, exponent=3)
    assert widget.children[0].value == 3 and widget.children[0].max == 32
    widget.children[0].value = 20  # must redraw without raising
    plt.close("all")
