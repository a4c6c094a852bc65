"""The techniques lessons 02 and 03 open up: the few lines each notebook shows agree with the package's
version on the same inputs, so the notebook and the package cannot drift apart."""

import pytest
import torch
from notebook_code import load_function
from torch import nn

from amp_lessons.core.environment import dtype_name, one_cpu_thread
from amp_lessons.core.models import DeepSigmoidMLP
from amp_lessons.l02_fp16_underflow_and_loss_scaling.scaling import ActivationGradients, classify, scale_table
from amp_lessons.l03_autocast_and_gradscaler import autocast_policy
from amp_lessons.l03_autocast_and_gradscaler.training import step_was_skipped

LESSON_02 = "notebooks/02_fp16_underflow_and_loss_scaling.ipynb"
LESSON_03 = "notebooks/03_autocast_and_gradscaler.ipynb"


@pytest.fixture(autouse=True)
def single_thread():
    with one_cpu_thread():
        yield


# ------------------------------------------------------------- lesson 03: the measurement behind policy_table


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=dtype_name)
def test_the_notebooks_output_dtype_measures_what_policy_table_measures(dtype):
    output_dtype = load_function(LESSON_03, "output_dtype")
    cpu = torch.device("cpu")
    tensors = autocast_policy._tensors(cpu)
    for case in autocast_policy.OP_CASES:
        package = autocast_policy.measure_op(case, cpu, dtype, tensors)
        try:
            mine = dtype_name(output_dtype(lambda h, x, case=case: case.run(tensors, h), "cpu", dtype))
        except Exception as exc:
            mine = f"error: {type(exc).__name__}"
        assert mine == package, case.label


# --------------------------------------------------------------------- lesson 03: the skipped-step detector


def test_the_notebooks_detector_agrees_with_step_was_skipped():
    was_skipped = load_function(LESSON_03, "was_skipped")
    scales = [2.0**k for k in range(-3, 25)] + [3.0, 1e-30, 65536.0]
    for before in scales:
        for after in scales:
            assert was_skipped(before, after) == step_was_skipped(before, after), (before, after)
    assert step_was_skipped(0.0, 0.0) and not was_skipped(0.0, 0.0)  # the one case the package adds


def test_the_detector_counts_what_a_real_scaler_skipped():
    was_skipped = load_function(LESSON_03, "was_skipped")
    weight = nn.Parameter(torch.ones(4))
    optimizer = torch.optim.SGD([weight], lr=0.1)
    updates = []
    optimizer.register_step_post_hook(lambda *args: updates.append(1))
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**8, growth_interval=2)
    skipped = 0
    for overflow in (True, False, False, False, True, False, False):
        optimizer.zero_grad()
        before = scaler.get_scale()
        scaler.scale((weight * 2).sum()).backward()
        if overflow:
            weight.grad[0] = float("inf")
        scaler.step(optimizer)
        scaler.update()
        skipped += was_skipped(before, scaler.get_scale())
    assert skipped == 2 == 7 - len(updates)


# ---------------------------------------------------- lesson 02: the hooks and the count behind scale_table


def _model_and_batch():
    torch.manual_seed(0)
    model = DeepSigmoidMLP()
    x, y = DeepSigmoidMLP.example_batch()
    return model, x, y


@pytest.mark.parametrize("autocast", [False, True], ids=["fp32", "fp16 autocast"])
def test_the_notebooks_hooks_record_what_activation_gradients_records(autocast):
    output_gradients = load_function(LESSON_02, "output_gradients")
    model, x, y = _model_and_batch()

    def forward_and_backward():
        with torch.autocast("cpu", dtype=torch.float16, enabled=autocast):
            loss = nn.functional.mse_loss(model(x), y)
        (loss * 2.0**8).backward()

    model.zero_grad(set_to_none=True)
    mine = output_gradients(model, forward_and_backward)
    model.zero_grad(set_to_none=True)
    with ActivationGradients(model) as recorder:
        forward_and_backward()
    assert mine.keys() == recorder.grads.keys() and mine
    for name in mine:
        assert mine[name].dtype == recorder.grads[name].dtype
        assert torch.equal(mine[name], recorder.grads[name]), name
    assert not any(m._forward_hooks for m in model.modules()), "the notebook's hooks must be removed"


def test_the_notebooks_hooks_come_off_after_an_error():
    output_gradients = load_function(LESSON_02, "output_gradients")
    model, x, _ = _model_and_batch()
    with pytest.raises(RuntimeError):
        output_gradients(model, lambda: model(x).backward())  # not a scalar: backward raises
    assert not any(m._forward_hooks for m in model.modules())


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=dtype_name)
@pytest.mark.parametrize("exponent", [0, 8, 16, 24])
def test_the_notebooks_fate_counts_what_scale_table_counts(dtype, exponent):
    fate = load_function(LESSON_02, "fate")
    generator = torch.Generator().manual_seed(1)
    magnitudes = torch.exp2(torch.rand(4000, generator=generator) * 70 - 50)  # 2^-50 .. 2^20
    values = magnitudes * (torch.rand(4000, generator=generator) - 0.5)
    values = torch.cat([values, torch.tensor([0.0, float("inf"), float("nan"), 65519.0, 65520.0, 2.0**-25])])
    row = scale_table({"g": values}, exponent, dtypes=(dtype,)).iloc[0]
    mine = fate(values, dtype, 2.0**exponent)
    for kind in ("zero", "subnormal", "normal", "inf"):
        assert mine[kind] == pytest.approx(row[kind], abs=1e-6), kind  # a float32 mean
    counts = classify(values, dtype, 2.0**exponent)
    assert mine["zero"] == pytest.approx(counts["zero"] / counts["nonzero"], abs=1e-6)
