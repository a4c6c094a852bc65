"""Lesson 03 helpers: the reference step, its diagnostic guards, the autocast policy table, the simulator."""

import inspect
import math
import warnings

import matplotlib.pyplot as plt
import numpy as np
import pytest
import torch
from torch import nn

from amp_lessons.core.environment import one_cpu_thread
from amp_lessons.core.models import TinyClassifier
from amp_lessons.l03_autocast_and_gradscaler import autocast_policy, scaler_sim
from amp_lessons.l03_autocast_and_gradscaler.training import NonFiniteError, guarded_train_step, train_step


@pytest.fixture(autouse=True)
def single_thread():
    """Tiny models: one thread is much faster on a busy machine (see one_cpu_thread)."""
    with one_cpu_thread():
        yield


def make_run(seed=0, init_scale=2.0**10, **scaler_kwargs):
    torch.manual_seed(seed)
    model = TinyClassifier()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu", init_scale=init_scale, **scaler_kwargs)
    inputs, targets = torch.randn(8, 6), torch.randint(0, 4, (8,))
    return model, optimizer, scaler, inputs, targets


# --------------------------------------------------------------------------------------- train_step


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_train_step_updates_fp32_weights_and_returns_unscaled_loss(dtype):
    model, optimizer, scaler, inputs, targets = make_run()
    before = [p.detach().clone() for p in model.parameters()]
    loss = train_step(
        model, optimizer, scaler, nn.functional.cross_entropy, inputs, targets, dtype=dtype, max_norm=1.0
    )
    assert loss.dtype == torch.float32 and not loss.requires_grad
    with torch.no_grad():
        assert abs(loss.item() - nn.functional.cross_entropy(model(inputs), targets).item()) < 0.5
    assert all(p.dtype == torch.float32 for p in model.parameters())
    assert any(not torch.equal(b, p) for b, p in zip(before, model.parameters()))


def test_train_step_skips_an_overflow_and_backs_off():
    model, optimizer, scaler, inputs, targets = make_run(init_scale=2.0**40)
    before = [p.detach().clone() for p in model.parameters()]
    train_step(
        model,
        optimizer,
        scaler,
        nn.functional.cross_entropy,
        inputs,
        targets,
        dtype=torch.float16,
        max_norm=1.0,
    )
    assert all(torch.equal(b, p) for b, p in zip(before, model.parameters()))
    assert scaler.get_scale() == 2.0**39


def test_guarded_step_stops_on_non_finite_loss_and_optionally_on_overflow():
    model, optimizer, scaler, inputs, targets = make_run()
    bad = inputs.clone()
    bad[0, 0] = float("nan")
    with pytest.raises(NonFiniteError, match="non-finite loss"):
        guarded_train_step(model, optimizer, scaler, nn.functional.cross_entropy, bad, targets)
    model, optimizer, scaler, inputs, targets = make_run(init_scale=2.0**40)
    loss = guarded_train_step(
        model, optimizer, scaler, nn.functional.cross_entropy, inputs, targets, max_norm=1.0
    )
    # the overflow was allowed to be skipped
    assert math.isfinite(loss.item()) and scaler.get_scale() == 2.0**39
    model, optimizer, scaler, inputs, targets = make_run(init_scale=2.0**40)
    with pytest.raises(NonFiniteError, match="non-finite gradients"):
        guarded_train_step(
            model, optimizer, scaler, nn.functional.cross_entropy, inputs, targets, allow_overflow_skips=False
        )


def test_guarded_step_equals_train_step_when_nothing_is_wrong():
    a = make_run(seed=3)
    b = make_run(seed=3)
    la = train_step(*a[:3], nn.functional.cross_entropy, *a[3:], dtype=torch.bfloat16, max_norm=0.5)
    lb = guarded_train_step(*b[:3], nn.functional.cross_entropy, *b[3:], dtype=torch.bfloat16, max_norm=0.5)
    assert torch.equal(la, lb)
    assert all(torch.equal(p, q) for p, q in zip(a[0].parameters(), b[0].parameters()))


def test_guarded_step_is_train_step_with_guards_on():
    """One step, one switch: guarded_train_step has no ``guards`` argument to turn its guards off."""
    assert "guards" not in inspect.signature(guarded_train_step).parameters
    model, optimizer, scaler, inputs, targets = make_run()
    bad = inputs.clone()
    bad[0, 0] = float("nan")
    with pytest.raises(NonFiniteError, match="non-finite loss"):
        train_step(model, optimizer, scaler, nn.functional.cross_entropy, bad, targets, guards=True)
    loss = train_step(model, optimizer, scaler, nn.functional.cross_entropy, bad, targets)  # guards off
    assert math.isnan(loss.item())


# ------------------------------------------------------------------------------------ autocast policy


def test_policy_table_shows_cpu_softmax_differs_from_cuda_policy():
    table = autocast_policy.policy_table("cpu")
    assert len(table) == len(autocast_policy.OP_CASES)
    row = table.set_index("op").loc["softmax(h)"]
    assert row["float16: CUDA policy (from the docs)"] == "float32"
    assert row["CUDA list (docs)"] == "float32"
    linear = table.set_index("op").loc["linear (nn.Linear)"]
    assert linear["bfloat16: measured here (cpu)"] == "bfloat16"
    assert linear["bfloat16: CUDA policy (from the docs)"] == "bfloat16"
    residual = table.set_index("op").loc["add  h + x (residual)"]
    assert residual["float16: CUDA policy (from the docs)"] == "float32"


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_the_cpu_lists_as_transcribed_are_what_cpu_autocast_does(dtype):
    """The CPU lists are copied from the docs; CPU autocast itself says whether the copy is right."""
    cpu = torch.device("cpu")
    for case in autocast_policy.OP_CASES:
        measured = autocast_policy.measure_op(case, cpu, dtype)
        assert measured == autocast_policy.cpu_prediction(case, dtype), case.label


def test_the_table_holds_ops_of_both_lists_with_the_differing_ones_first():
    table = autocast_policy.policy_table("cpu")
    cpu_list, cuda_list = table["CPU list (docs)"], table["CUDA list (docs)"]
    assert {"binary_cross_entropy(sigmoid(h), p)", "max_pool3d(h)"} <= set(
        table[(cpu_list == "float32") & (cuda_list != "float32")]["op"]
    )
    assert {"softmax(h)", "layer_norm(h)", "h.sum()", "exp(h)", "h.pow(2)"} <= set(
        table[(cuda_list == "float32") & (cpu_list != "float32")]["op"]
    )
    differs = (table["differs"] != "").tolist()
    assert differs == sorted(differs, reverse=True) and any(differs) and not all(differs)
    bce = table.set_index("op").loc["binary_cross_entropy(sigmoid(h), p)"]
    assert bce["float16: CUDA policy (from the docs)"] == "error: RuntimeError"
    assert bce["float16: measured here (cpu)"] == "float32"


def test_policy_view_shows_ten_rows_and_keeps_the_rest_behind_a_toggle():
    table = autocast_policy.policy_table("cpu")
    view = autocast_policy.policy_view(table)
    shown, hidden = view._repr_html_().split("<details>")
    assert shown.count("<tr") == 1 + 10  # header + ten ops
    assert hidden.count("<tr") == 1 + len(table) and f"show all {len(table)} ops" in hidden
    assert all(op in repr(view) for op in table["op"])  # as text (terminal, GPU report): every op
    short = autocast_policy.policy_view(table.head(4))
    assert "<details>" not in short._repr_html_()


def test_cuda_lists_match_the_docs_for_the_ops_the_lesson_names():
    assert autocast_policy.cuda_list("softmax") == "float32"
    assert autocast_policy.cuda_list("linear") == "lower precision"
    assert autocast_policy.cuda_list("relu") == "not listed"
    assert autocast_policy.cuda_list("addcmul") == "promote"
    assert autocast_policy.CUDA_LOWER_PRECISION.isdisjoint(autocast_policy.CUDA_FLOAT32)
    assert autocast_policy.cuda_list("binary_cross_entropy") == "error"
    assert autocast_policy.cpu_list("binary_cross_entropy") == "float32"
    assert autocast_policy.cpu_list("cross_entropy") == "float32"  # the docs spell it cross_entropy_loss
    assert autocast_policy.cpu_list("softmax") == "not listed"
    assert autocast_policy.CPU_LOWER_PRECISION.isdisjoint(autocast_policy.CPU_FLOAT32)


def test_policy_table_rejects_bad_arguments():
    with pytest.raises(ValueError, match="float16"):
        autocast_policy.policy_table("cpu", dtypes=(torch.float32,))
    with pytest.raises(ValueError, match="device"):
        autocast_policy.policy_table("not-a-device")
    with pytest.raises(TypeError):
        autocast_policy.parameter_dtypes("model")


def test_autocast_keeps_parameters_fp32():
    model = TinyClassifier()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = model(torch.randn(2, 6))
    assert out.dtype == torch.bfloat16
    assert set(autocast_policy.parameter_dtypes(model).values()) == {"float32"}


# ------------------------------------------------------------------------------- GradScaler simulator


def drive_torch_scaler(decide, iterations, **kwargs):
    """A real torch.amp.GradScaler driven through an overflow pattern; the scales used and update count."""
    weight = nn.Parameter(torch.ones(2))
    optimizer = torch.optim.SGD([weight], lr=0.0)
    scaler = torch.amp.GradScaler("cpu", **kwargs)
    scales, stepped = [], []
    optimizer.register_step_post_hook(lambda *args: stepped.append(1))  # counts real optimizer.step() calls
    for i in range(iterations):
        optimizer.zero_grad()
        scaler.scale(weight.sum()).backward()
        scale = scaler.get_scale()
        scales.append(scale)
        if decide(i, scale):
            weight.grad[0] = float("inf")
        scaler.step(optimizer)
        scaler.update()
    return scales, len(stepped), scaler.get_scale()


CASES = [
    (scaler_sim.first_n_pattern(7), 40, dict(init_scale=2.0**24, growth_interval=5)),
    (scaler_sim.every_k_pattern(9, start=3), 60, dict(init_scale=2.0**16, growth_interval=4)),
    (scaler_sim.threshold_pattern(2.0**-3), 80, dict(init_scale=2.0**30, growth_interval=6)),
    (
        scaler_sim.threshold_pattern(3.7),
        50,
        dict(init_scale=1000.0, growth_factor=1.3, backoff_factor=0.3, growth_interval=3),
    ),
    (lambda i, s: False, 30, dict(init_scale=2.0**126, growth_interval=2)),  # growth stops below float32 inf
    (
        lambda i, s: i % 2 == 0,
        25,
        dict(init_scale=0.7, growth_factor=1.7, backoff_factor=0.9, growth_interval=1),
    ),
]


@pytest.mark.parametrize("decide,iterations,kwargs", CASES, ids=range(len(CASES)))
def test_simulator_reproduces_torch_grad_scaler_exactly(decide, iterations, kwargs):
    scales, updates, final = drive_torch_scaler(decide, iterations, **kwargs)
    run = scaler_sim.simulate_scaler(decide, iterations=iterations, **kwargs)
    assert run.scales == scales  # bit for bit
    assert run.updates == updates and run.skipped == iterations - updates
    assert run.scale_after == final


def test_simulator_accepts_a_list_and_builds_a_table():
    run = scaler_sim.simulate_scaler([True, True, False, False, False], init_scale=8.0, growth_interval=2)
    assert run.scales == [8.0, 4.0, 2.0, 2.0, 4.0]
    assert run.updates == 3 and run.scale_after == 4.0
    table = run.table()
    assert list(table["overflow -> skipped"]) == [True, True, False, False, False]
    assert table["log2(scale)"].iloc[0] == 3.0


@pytest.mark.parametrize(
    "kwargs,error",
    [
        (dict(growth_factor=1.0), ValueError),
        (dict(backoff_factor=1.5), ValueError),
        (dict(growth_interval=0), ValueError),
        (dict(growth_interval=2.5), ValueError),
        (dict(init_scale=-1.0), ValueError),
        (dict(init_scale="big"), TypeError),
    ],
)
def test_simulator_rejects_bad_settings(kwargs, error):
    with pytest.raises(error):
        scaler_sim.simulate_scaler([False], **kwargs)


def test_simulator_rejects_bad_patterns():
    with pytest.raises(TypeError, match="True/False"):
        scaler_sim.simulate_scaler(5)
    with pytest.raises(ValueError, match="iterations"):
        scaler_sim.simulate_scaler(lambda i, s: False)
    with pytest.raises(ValueError):
        scaler_sim.make_pattern("sometimes", 1)


def test_widget_logic_draws_the_curve():
    run = scaler_sim.simulate_scaler(
        scaler_sim.make_pattern("threshold", -3), iterations=100, init_scale=2.0**24, growth_interval=20
    )
    fig = scaler_sim.scaler_figure(run)
    assert f"{run.updates} real optimizer updates" in fig.axes[0].get_title()
    plt.close(fig)
    assert np.log2(max(run.scales[-20:])) <= 20  # settles below the overflow limit 65504 * 8 < 2**19


def test_one_cpu_thread_restores_the_thread_count():
    torch.set_num_threads(2)  # the autouse fixture restores the original count afterwards
    with one_cpu_thread():
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == 2


def test_widget_builds_without_a_browser():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ui = scaler_sim.scaler_widget(iterations=30)
    assert ui.children
    plt.close("all")


def test_widget_sliders_keep_a_typed_value():
    """Sliders that update while they move snap a number typed into their readout and send it back."""
    import ipywidgets as widgets

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ui = scaler_sim.scaler_widget(iterations=30)
    sliders = []
    pending = list(ui.children)
    while pending:
        child = pending.pop()
        pending += list(getattr(child, "children", ()))
        if isinstance(child, (widgets.IntSlider, widgets.FloatSlider)):
            sliders.append(child)
    assert len(sliders) == 5
    assert all(not s.continuous_update for s in sliders), [
        s.description for s in sliders if s.continuous_update
    ]
    plt.close("all")
