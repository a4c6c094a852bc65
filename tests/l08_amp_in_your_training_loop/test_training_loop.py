"""Lesson 08 helpers: accumulation (reference and wrong placements), several losses with one scaler, the
autocast/scaler switchboard, TF32 emulation and pinning, BCE, eps, and the torch.compile helpers."""

import math
import warnings

import matplotlib.pyplot as plt
import pytest
import torch
import torch.nn.functional as F

from amp_lessons.core.environment import (
    float32_matmul_settings,
    float32_settings_text,
    has_fp32_precision_api,
    one_cpu_thread,
)
from amp_lessons.core.models import DeepSigmoidMLP, OutlierFeatureMLP, TinyClassifier, seeded_weights
from amp_lessons.l03_autocast_and_gradscaler.probes import recorded_call
from amp_lessons.l03_autocast_and_gradscaler.training import train_step
from amp_lessons.l08_amp_in_your_training_loop import loop_numerics, training_loop
from amp_lessons.l08_amp_in_your_training_loop.probes import SCENARIOS, ProbedRun, events


@pytest.fixture(autouse=True)
def single_thread():
    with one_cpu_thread():
        yield


def fresh(seed=0, init_scale=2.0**12):
    with seeded_weights(seed):
        model = TinyClassifier()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    return model, optimizer, torch.amp.GradScaler("cpu", init_scale=init_scale)


def flat(model):
    return torch.cat([p.detach().reshape(-1).clone() for p in model.parameters()])


# ------------------------------------------------------------------------------------ accumulation


def test_split_batch_makes_equal_micro_batches_and_refuses_uneven_splits():
    inputs, targets = training_loop.accumulation_problem(batch=12)
    parts = training_loop.split_batch(inputs, targets, 3)
    assert [len(x) for x, _ in parts] == [4, 4, 4]
    assert torch.equal(torch.cat([x for x, _ in parts]), inputs)
    for bad in (5, 0, True, 2.0):
        with pytest.raises(ValueError):
            training_loop.split_batch(inputs, targets, bad)


@pytest.mark.filterwarnings("ignore:In CPU autocast, but the target dtype is not supported")
@pytest.mark.parametrize(
    "dtype, tolerance", [(torch.float32, 1e-5), (torch.float16, 2e-3), (torch.bfloat16, 2e-2)]
)
def test_accumulate_step_matches_the_full_batch_step(dtype, tolerance):
    inputs, targets = training_loop.accumulation_problem()
    model_a, opt_a, scaler_a = fresh()
    model_b, opt_b, scaler_b = fresh()
    before = flat(model_a)
    full_loss = train_step(
        model_a, opt_a, scaler_a, F.cross_entropy, inputs, targets, dtype=dtype, max_norm=0.1
    )
    micro_batches = training_loop.split_batch(inputs, targets, 4)
    loss = training_loop.accumulate_step(
        model_b, opt_b, scaler_b, F.cross_entropy, micro_batches, dtype=dtype, max_norm=0.1
    )
    full_update, update = flat(model_a) - before, flat(model_b) - before
    assert ((update - full_update).norm() / full_update.norm()).item() < tolerance
    assert abs(loss.item() - full_loss.item()) < tolerance * 10
    assert loss.dtype == torch.float32 and not loss.requires_grad
    assert scaler_b.get_scale() == scaler_a.get_scale()


def test_accumulate_step_skips_the_whole_step_when_one_micro_batch_overflows():
    inputs, targets = training_loop.accumulation_problem()
    model, optimizer, scaler = fresh(init_scale=2.0**40)
    before = flat(model)
    training_loop.accumulate_step(
        model,
        optimizer,
        scaler,
        F.cross_entropy,
        training_loop.split_batch(inputs, targets, 4),
        dtype=torch.float16,
    )
    assert torch.equal(flat(model), before) and scaler.get_scale() == 2.0**39


def test_placement_errors_measure_each_wrong_placement():
    inputs, targets = training_loop.accumulation_problem()
    max_norm = round(training_loop.true_gradient_norm(inputs, targets) / 8, 3)
    table = training_loop.placement_errors(inputs, targets, parts=4, max_norms=(None, max_norm))
    free, clipped = "update error, no clipping", f"update error, max_norm={max_norm:g}"
    assert list(table.index) == ["right: accumulate_step", *training_loop.WRONG_PLACEMENTS]
    assert table.loc["right: accumulate_step", free] < 1e-3
    assert table.loc["loss not divided by N", free] == pytest.approx(3.0, abs=0.01)  # N - 1 with N = 4
    assert table.loc["loss not divided by N", clipped] < 1e-3  # clipping hides it
    assert table.loc["clip after the loop, before unscale_", clipped] == pytest.approx(1.0, abs=0.01)
    updates = f"optimizer updates, max_norm={max_norm:g}"
    assert table.loc["unscale_/clip/step/update inside the loop", updates] == 4
    for refused in ("unscale_ inside the loop", "update inside the loop"):
        assert math.isnan(table.loc[refused, free]) and table.loc[refused, "torch says"]
    ax = training_loop.plot_placement_errors(table)
    assert len(ax.patches) == 2 * len(table)
    plt.close("all")


# ------------------------------------------------------------------------------------ several losses


def test_one_scaler_for_two_losses_and_two_optimizers():
    inputs, targets = training_loop.accumulation_problem()
    table = training_loop.multi_loss_errors(inputs, targets)
    assert (table.loc[["right", "sum"]].filter(like="update error") < 2e-3).all().all()
    assert table.loc["update per optimizer", "head B: update error"] == pytest.approx(0.5, abs=0.01)
    assert table.loc["update per optimizer", "head A: update error"] < 2e-3
    assert table.loc["one scaler per loss", "trunk: update error"] > 0.5
    assert table.loc["one scaler per loss", "scale(s) after"] == "2048 / 128"


def test_multi_loss_step_rejects_nothing_silently():
    model = training_loop.TwoHeadNet()
    optimizers = training_loop.two_optimizers(model)
    scaler = torch.amp.GradScaler("cpu")
    inputs, targets = training_loop.accumulation_problem()
    loss_a, loss_b = training_loop.multi_loss_step(
        model, optimizers, (scaler,), inputs, targets, dtype=torch.bfloat16
    )
    assert loss_a.dtype == torch.float32 and math.isfinite(loss_b.item())


# ------------------------------------------------------------------------------------ switchboard


def test_toggle_runs_tell_autocast_problems_from_scaling_problems():
    x, y = OutlierFeatureMLP.example_batch()
    forward = training_loop.toggle_runs(lambda: OutlierFeatureMLP(), x, y, F.mse_loss).set_index(
        ["autocast", "GradScaler"]
    )
    assert not forward.loc[("on", "on"), "loss finite"] and not forward.loc[("on", "off"), "loss finite"]
    assert forward.loc[("off", "on"), "loss finite"] and forward.loc[("off", "off"), "loss finite"]
    x, y = DeepSigmoidMLP.example_batch()
    scaling = training_loop.toggle_runs(
        lambda: DeepSigmoidMLP(), x, y, F.mse_loss, watch="layers.0.weight"
    ).set_index(["autocast", "GradScaler"])
    zeros = scaling["zero gradients in layers.0.weight"]
    assert zeros[("on", "off")] > 0.5 and zeros[("on", "on")] < 0.01 and zeros[("off", "off")] < 0.01


# ------------------------------------------------------------------------------------ TF32


def test_round_to_tf32_keeps_ten_mantissa_bits_and_rounds_ties_away_from_zero():
    x = torch.tensor(
        [
            1.0,
            1.0003,
            -1.0003,
            1 + 2**-11,
            1 + 3 * 2**-11,
            -(1 + 2**-11),
            0.0,
            float("inf"),
            float("nan"),
            3.0e38,
        ]
    )
    got = loop_numerics.round_to_tf32(x)
    assert got[:6].tolist() == [1.0, 1.0, -1.0, 1 + 2**-10, 1 + 2**-9, -(1 + 2**-10)]
    assert got[6] == 0 and got[7] == float("inf") and math.isnan(got[8]) and math.isfinite(got[9])
    values = torch.randn(1000) * 1e3
    relative = ((loop_numerics.round_to_tf32(values) - values).abs() / values.abs()).max().item()
    assert 2**-12 < relative <= 2**-11  # half a unit in the 10th mantissa bit
    with pytest.raises(TypeError):
        loop_numerics.round_to_tf32(values.half())


def test_emulated_tf32_rounds_matmul_inputs_only_inside_the_block():
    a, b = torch.randn(8, 16), torch.randn(16, 4)
    with loop_numerics.EmulatedTF32() as mode:
        inside = a @ b
        linear = F.linear(a, b.T)
    expected = loop_numerics.round_to_tf32(a) @ loop_numerics.round_to_tf32(b)
    assert torch.equal(inside, expected) and torch.allclose(linear, expected, atol=1e-5)
    assert mode.calls == 4 and not torch.equal(a @ b, expected)


def test_fp32_reference_settings_pin_and_restore(monkeypatch):
    before = float32_matmul_settings()
    with loop_numerics.real_tf32() as loose:
        if has_fp32_precision_api():  # torch >= 2.9: the new API only
            assert loose["torch.backends.cuda.matmul.fp32_precision"] == "tf32"
        else:
            assert loose["torch.get_float32_matmul_precision()"] == "high"
        with loop_numerics.fp32_reference_settings() as pinned:
            if has_fp32_precision_api():
                assert pinned["torch.backends.cuda.matmul.fp32_precision"] == "ieee"
                assert pinned["torch.backends.cudnn.conv.fp32_precision"] == "ieee"
            else:
                assert pinned["torch.get_float32_matmul_precision()"] == "highest"
                assert pinned["torch.backends.cudnn.allow_tf32"] is False
    assert float32_matmul_settings() == before
    assert "tf32" in float32_settings_text(before).lower()


def test_spacing_table_shows_tf32_like_fp16_precision_with_fp32_range():
    table = loop_numerics.spacing_table((1.0003, 1e20))
    assert table["TF32 (10 mantissa bits)"][0] == 1.0 and table["TF32 (10 mantissa bits)"][1] > 9e19
    assert table["float16 (10 bits, 5-bit exponent)"][1] == float("inf")


# ------------------------------------------------------------------------------------ BCE and eps


def test_bce_on_rounded_probabilities_saturates_but_with_logits_does_not():
    table = loop_numerics.bce_table([0.0, 12.0], dtype=torch.float16)
    assert table["BCELoss(sigmoid(z))"][1] == pytest.approx(100.0)
    assert table["BCEWithLogitsLoss(z)"][1] == pytest.approx(table["exact loss"][1], rel=1e-3)
    ax = loop_numerics.plot_bce({"float16": table})
    assert len(ax.lines) == 3
    plt.close("all")


def test_eps_of_1e_12_vanishes_in_fp16_and_a_zero_row_becomes_nan():
    table = loop_numerics.stored_eps((1e-12, 1e-5)).set_index("eps")
    assert table.loc[1e-12, "in float16"] == 0.0 and table.loc[1e-12, "in bfloat16"] > 0
    rows = torch.zeros(2, 8)
    rows[1] = 3.0
    assert torch.isnan(loop_numerics.rms_norm(rows.half(), 1e-12)[0]).all()
    assert (loop_numerics.rms_norm(rows.half(), 1e-5)[0] == 0).all()
    assert (loop_numerics.rms_norm(rows, 1e-12)[0] == 0).all()


# ------------------------------------------------------------------------------------ compile helpers


def test_first_call_times_and_reports_errors_instead_of_raising():
    result, seconds, error = loop_numerics.first_call(lambda x: x + 1, 1)
    assert result == 2 and seconds >= 0 and error == ""
    result, _, error = loop_numerics.first_call(lambda: 1 / 0)
    assert result is None and error.startswith("ZeroDivisionError")
    likely, why = loop_numerics.compiler_status()
    assert isinstance(likely, bool) and why


def test_graph_breaks_counts_an_item_guard_without_compiling():
    def guarded(x):
        if x.sum().item() > 0:
            x = x * 2
        return x + 1

    graphs, breaks, reasons = loop_numerics.graph_breaks(guarded, torch.ones(3))
    assert breaks >= 1 and graphs >= 2 and reasons
    assert loop_numerics.graph_breaks(lambda x: x + 1, torch.ones(3))[:2] == (1, 0)


# ------------------------------------------------------------------------------------ checker probes


def test_probes_record_a_reference_step_in_order():
    run = ProbedRun(SCENARIOS[0])
    log = run.new_log()
    training_loop.accumulate_step(
        run.model, run.optimizer, run.scaler, run.loss_fn, run.micro_batches(0), dtype=torch.float16
    )
    names = log.names()
    assert names.count("forward") == names.count("backward") == names.count("scale") == 4
    assert names[-3:] == ["scaler.step", "optimizer.step", "update"] and names[0] == "zero_grad"
    assert not any(e["erased"] or e["changed"] for e in events(log, "forward"))
    assert not any(e["stale"] for e in events(log, "backward"))


def test_probes_keep_watching_gradients_on_data_labelled_cuda():
    """The CUDA-labelled run: data and parameters report CUDA; the gradient hooks still see each backward."""
    scenario = next(s for s in SCENARIOS if s.cuda_labelled)
    run = ProbedRun(scenario)
    assert not run.scaler.is_enabled() and next(run.model.parameters()).is_cuda
    assert all(x.device.type == "cuda" for x, _ in run.micro_batches(0))
    log = run.new_log()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # 'CUDA is not available... Disabling autocast' on a CPU machine
        training_loop.accumulate_step(
            run.model, run.optimizer, run.scaler, run.loss_fn, run.micro_batches(0), dtype=scenario.dtype
        )
    assert not any(e["autocast"] for e in events(log, "forward"))  # no CPU autocast for CUDA data
    assert run.model.accumulated and log.count("backward") == scenario.parts


def test_recorded_call_restores_torch_when_the_call_raises():
    run = ProbedRun(SCENARIOS[0])
    original = torch.amp.GradScaler.__init__
    with pytest.raises(RuntimeError, match="boom"), recorded_call(run) as record:
        torch.amp.GradScaler("cpu")
        torch.autocast("cpu", dtype=torch.bfloat16).__enter__()
        raise RuntimeError("boom")
    assert record.new_scalers == 1 and torch.amp.GradScaler.__init__ is original
    assert not torch.is_autocast_enabled("cpu")
    with recorded_call(run) as record:
        torch.autocast("cpu", dtype=torch.bfloat16).__enter__()
    assert record.autocast_left_on and not torch.is_autocast_enabled("cpu")
    assert record.scale_before == 2.0**10 and math.isnan(record.scale_after)  # no scale() yet
    assert record.params_after and record.param_dtypes_after == {torch.float32}
