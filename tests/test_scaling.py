"""Lesson 02: the scaling helpers, the slider's logic, the two models, and both checkers four ways
(the solution passes, the untouched exercise is "not done", each known wrong answer is named, junk never raises)."""

import math

import matplotlib.pyplot as plt
import pandas as pd
import pytest
import torch
from notebook_code import exercise, solution
from torch import nn

from amp_lessons.checks.harness import NOT_DONE
from amp_lessons.checks.l02_scaling import check_largest_safe_scale, check_lost_fractions
from amp_lessons.environment import probe_autocast
from amp_lessons.models import DeepSigmoidMLP, OutlierFeatureMLP
from amp_lessons.scaling import (
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

LESSON = "02_fp16_underflow_and_loss_scaling.ipynb"
F16, BF16 = torch.float16, torch.bfloat16
REFERENCE_FRACTIONS = solution(LESSON, "lost_fractions")
REFERENCE_SCALE = solution(LESSON, "largest_safe_scale")


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
    values = torch.tensor([2.0**-26, 2.0**-25, 1.5 * 2.0**-25, 2.0**-20, 1.0, 65519.0, 65520.0, -1e5, 0.0, float("nan")])
    counts = classify(values, F16)
    # 2^-26 and the tie 2^-25 round to 0; 1.5*2^-25 rounds up to 2^-24 (subnormal); 65519 rounds down to 65504
    assert counts == {"nonzero": 8, "zero": 2, "subnormal": 2, "normal": 2, "inf": 2, "skipped": 2}
    assert classify(values, BF16)["zero"] == 0 and classify(values, BF16)["inf"] == 0


def test_scaling_happens_before_the_cast():
    assert classify(torch.tensor([2.0**-30]), F16, 2.0**16)["normal"] == 1
    assert fractions(torch.tensor([2.0**-30, 1.0]), F16, 1.0) == {"zero": 0.5, "subnormal": 0.0, "normal": 0.5, "inf": 0.0}


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


CPU_FP16_AUTOCAST = pytest.mark.skipif(not probe_autocast(torch.device("cpu"), torch.float16)[0],
                                       reason="this torch build has no FP16 autocast on the CPU")


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


# ----------------------------------------------------------------------------- checker 02.1 lost_fractions


def test_lost_fractions_solution_passes():
    result = check_lost_fractions(solution(LESSON, "lost_fractions"))
    assert result.passed, result.message


def test_lost_fractions_untouched_exercise_is_not_done():
    result = check_lost_fractions(exercise(LESSON, "lost_fractions"))
    assert result.status == NOT_DONE, result.message


def _kept(grad):
    return grad[torch.isfinite(grad) & (grad != 0)]


def frac_thresholds(grad, dtype, scale):
    v = _kept(grad)
    if not v.numel():
        return 0.0, 0.0
    s = (v * scale).abs()
    return (s < 2.0**-24).float().mean().item(), (s > 65504).float().mean().item()


def frac_cast_first(grad, dtype, scale):
    v = _kept(grad)
    if not v.numel():
        return 0.0, 0.0
    stored = v.to(dtype) * scale
    return (stored == 0).float().mean().item(), torch.isinf(stored).float().mean().item()


def frac_normal_threshold(grad, dtype, scale):
    v = _kept(grad)
    if not v.numel():
        return 0.0, 0.0
    stored = (v * scale).to(dtype)
    return (stored.abs() < torch.finfo(dtype).tiny).float().mean().item(), torch.isinf(stored).float().mean().item()


def frac_no_abs(grad, dtype, scale):
    v = _kept(grad)
    if not v.numel():
        return 0.0, 0.0
    stored = (v * scale).to(dtype)
    return ((v * scale) < 2.0**-24).float().mean().item(), torch.isinf(stored).float().mean().item()


def frac_over_numel(grad, dtype, scale):
    if not grad.numel():
        return 0.0, 0.0
    stored = (_kept(grad) * scale).to(dtype)
    return (stored == 0).sum().item() / grad.numel(), torch.isinf(stored).sum().item() / grad.numel()


def frac_zeros_counted(grad, dtype, scale):
    v = grad[torch.isfinite(grad)]
    if not v.numel():
        return 0.0, 0.0
    stored = (v * scale).to(dtype)
    return (stored == 0).float().mean().item(), torch.isinf(stored).float().mean().item()


def frac_nan_on_empty(grad, dtype, scale):
    stored = (_kept(grad) * scale).to(dtype)
    return (stored == 0).float().mean().item(), torch.isinf(stored).float().mean().item()


def frac_divides_by_zero(grad, dtype, scale):
    v = _kept(grad)
    stored = (v * scale).to(dtype)
    return (stored == 0).sum().item() / v.numel(), torch.isinf(stored).sum().item() / v.numel()


def frac_off_by_one(grad, dtype, scale):
    v = _kept(grad)
    if not v.numel():
        return 0.0, 0.0
    s = v * scale
    tiny = torch.finfo(dtype).smallest_normal * torch.finfo(dtype).eps / 2  # 2^-25 for FP16
    return (s.abs() < tiny).float().mean().item(), torch.isinf(s.to(dtype)).float().mean().item()


def frac_always_fp16(grad, dtype, scale):
    return REFERENCE_FRACTIONS(grad, torch.float16, scale)


def frac_swapped(grad, dtype, scale):
    return REFERENCE_FRACTIONS(grad, dtype, scale)[::-1]


def frac_percent(grad, dtype, scale):
    return tuple(100 * v for v in REFERENCE_FRACTIONS(grad, dtype, scale))


@pytest.mark.parametrize(
    "wrong, named",
    [
        (frac_thresholds, "instead of casting"),
        (frac_cast_first, "scaled afterwards"),
        (frac_normal_threshold, "smallest *normal* 2^-14"),
        (frac_no_abs, "ignored the sign"),
        (frac_over_numel, "grad.numel()"),
        (frac_zeros_counted, "already 0 in FP32"),
        (frac_nan_on_empty, "0/0"),
        (frac_divides_by_zero, "instead of dividing by zero"),
        (frac_off_by_one, "compared with 2^-25"),
        (frac_always_fp16, "ignores `dtype`"),
        (frac_swapped, "(underflow, overflow), in that order"),
        (frac_percent, "percentages"),
    ],
    ids=lambda v: getattr(v, "__name__", "")[:30],
)
def test_lost_fractions_names_each_mistake(wrong, named):
    result = check_lost_fractions(wrong)
    assert not result.passed and result.status == "failed"
    assert named in result.message, result.message


@pytest.mark.parametrize(
    "junk, expected",
    [
        (None, "got None"),
        ("lost_fractions", "got a str"),
        (lambda grad: 0.0, "signature"),
        (lambda grad, dtype, scale: 0.5, "return a tuple"),
        (lambda grad, dtype, scale: (0.1, 0.2, 0.3), "return a tuple"),
        (lambda grad, dtype, scale: (float("nan"), 0.0), "NaN"),
        (lambda grad, dtype, scale: (torch.zeros(3), 0.0), "tensor with 3 elements"),
        (lambda grad, dtype, scale: ("a", "b"), "return a number"),
        (lambda grad, dtype, scale: grad[10**9], "IndexError"),
    ],
)
def test_lost_fractions_junk_never_raises(junk, expected):
    result = check_lost_fractions(junk)
    assert not result.passed and result.status == "failed"
    assert expected in result.message, result.message


def test_lost_fractions_check_is_fast():
    import time

    start = time.perf_counter()
    check_lost_fractions(solution(LESSON, "lost_fractions"))
    assert time.perf_counter() - start < 2.0


# ----------------------------------------------------------------------------- checker 02.2 largest_safe_scale


def test_largest_safe_scale_solution_passes():
    result = check_largest_safe_scale(solution(LESSON, "largest_safe_scale"))
    assert result.passed, result.message


def test_largest_safe_scale_untouched_exercise_is_not_done():
    result = check_largest_safe_scale(exercise(LESSON, "largest_safe_scale"))
    assert result.status == NOT_DONE, result.message


def _all(grads):
    return torch.cat([g.reshape(-1).float() for g in grads] + [torch.zeros(0)])


def _reference(grads, dtype, max_exponent=24):
    return REFERENCE_SCALE(grads, dtype, max_exponent)


def scale_too_big(grads, dtype, max_exponent=24):
    answer = _reference(grads, dtype, max_exponent)
    return None if answer is None else 2 * answer


def scale_too_small(grads, dtype, max_exponent=24):
    answer = _reference(grads, dtype, max_exponent)
    return None if answer is None or answer == 2.0**max_exponent else answer / 2


def scale_signed_max(grads, dtype, max_exponent=24):
    values = _all(grads)
    if not torch.isfinite(values).all():
        return None
    if not values.numel() or values.max() <= 0:
        return 2.0**max_exponent
    return _reference([values.max().reshape(1)], dtype, max_exponent)


def scale_threshold_65504(grads, dtype, max_exponent=24):
    values = _all(grads)
    if not torch.isfinite(values).all():
        return None
    largest = values.abs().max().item() if values.numel() else 0.0
    if largest == 0:
        return 2.0**max_exponent
    return 2.0 ** min(max_exponent, math.floor(math.log2(torch.finfo(dtype).max / largest)))


def scale_threshold_65536(grads, dtype, max_exponent=24):
    values = _all(grads)
    if not torch.isfinite(values).all():
        return None
    largest = values.abs().max().item() if values.numel() else 0.0
    if largest == 0:
        return 2.0**max_exponent
    k = max_exponent
    while largest * 2.0**k >= 2.0 ** math.ceil(math.log2(torch.finfo(dtype).max)):
        k -= 1
    return 2.0**k


def scale_ignores_inf(grads, dtype, max_exponent=24):
    values = _all(grads)
    return _reference([values[torch.isfinite(values)]], dtype, max_exponent)


def scale_log_of_zero(grads, dtype, max_exponent=24):
    values = _all(grads)
    math.log2(values.abs().max().item())  # max() of nothing raises; log2(0) raises on all-zero gradients
    return _reference(grads, dtype, max_exponent)


def scale_none_for_zeros(grads, dtype, max_exponent=24):
    values = _all(grads)
    if not values.numel() or values.abs().max() == 0:
        return None
    return _reference(grads, dtype, max_exponent)


def scale_first_only(grads, dtype, max_exponent=24):
    return _reference(grads[:1], dtype, max_exponent)


def scale_cast_first(grads, dtype, max_exponent=24):
    if any(not torch.isfinite(g.to(dtype)).all() for g in grads):
        return None
    return _reference(grads, dtype, max_exponent)


def scale_at_least_one(grads, dtype, max_exponent=24):
    answer = _reference(grads, dtype, max_exponent)
    return None if answer is None else max(answer, 1.0)


def scale_always_fp16(grads, dtype, max_exponent=24):
    return _reference(grads, torch.float16, max_exponent)


def scale_no_cap(grads, dtype, max_exponent=24):
    values = _all(grads)
    if values.numel() and torch.isfinite(values).all() and values.abs().max() > 0:
        return _reference(grads, dtype, 200)
    return _reference(grads, dtype, max_exponent)


def scale_not_power_of_two(grads, dtype, max_exponent=24):
    values = _all(grads)
    if not torch.isfinite(values).all():
        return None
    if not values.numel() or values.abs().max() == 0:
        return 2.0**max_exponent
    return min(2.0**max_exponent, torch.finfo(dtype).max / values.abs().max().item())


@pytest.mark.parametrize(
    "wrong, named",
    [
        (scale_too_big, "twice the largest safe one"),
        (scale_too_small, "half the largest safe one"),
        (scale_signed_max, "ignored the sign"),
        (scale_threshold_65504, "values below 65520 round *down*"),
        (scale_threshold_65536, "2^16 = 65536"),
        (scale_ignores_inf, "return None (skip this step"),
        (scale_log_of_zero, "return the cap"),
        (scale_none_for_zeros, "the answer is the cap"),
        (scale_first_only, "only at the first tensor"),
        (scale_cast_first, "returned None for finite gradients"),
        (scale_at_least_one, "below 1"),
        (scale_always_fp16, "ignores `dtype`"),
        (scale_no_cap, "larger than 2**max_exponent"),
        (scale_not_power_of_two, "not a power of two"),
    ],
    ids=lambda v: getattr(v, "__name__", "")[:30],
)
def test_largest_safe_scale_names_each_mistake(wrong, named):
    result = check_largest_safe_scale(wrong)
    assert not result.passed and result.status == "failed"
    assert named in result.message, result.message


@pytest.mark.parametrize(
    "junk, expected",
    [
        (None, "got None"),
        (42, "got a int"),
        (lambda grads: 1.0, "signature"),
        (lambda grads, dtype, max_exponent: "2^16", "return a number"),
        (lambda grads, dtype, max_exponent: True, "bool"),
        (lambda grads, dtype, max_exponent: float("nan"), "positive, finite power of two"),
        (lambda grads, dtype, max_exponent: -4.0, "positive, finite power of two"),
        (lambda grads, dtype, max_exponent: torch.ones(2), "tensor with 2 elements"),
        (lambda grads, dtype, max_exponent: grads.shape, "AttributeError"),
    ],
)
def test_largest_safe_scale_junk_never_raises(junk, expected):
    result = check_largest_safe_scale(junk)
    assert not result.passed and result.status == "failed"
    assert expected in result.message, result.message


def test_largest_safe_scale_accepts_an_int_power_of_two_and_a_tensor():
    reference = solution(LESSON, "largest_safe_scale")

    def as_tensor(grads, dtype, max_exponent=24):
        answer = reference(grads, dtype, max_exponent)
        return None if answer is None else torch.tensor(answer)

    assert check_largest_safe_scale(as_tensor).passed


def test_checks_run_in_strict_mode_on_the_solution(strict):
    assert check_lost_fractions(solution(LESSON, "lost_fractions")).passed
    assert check_largest_safe_scale(solution(LESSON, "largest_safe_scale")).passed
