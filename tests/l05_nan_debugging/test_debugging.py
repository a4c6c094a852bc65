"""Lesson 05 helpers: the first-non-finite finder and its report, the op-dtype recorder, skipped updates,
the models.

The checkers' tests (05.1, 05.2) are in tests/checks/test_l05_debugging.py."""

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from amp_lessons.core.autocast_state import OpDtypeRecorder
from amp_lessons.core.environment import one_cpu_thread
from amp_lessons.core.models import TextureNet, TinyAttentionClassifier, attention_batch, texture_batch
from amp_lessons.l05_nan_debugging.debugging import find_first_nonfinite, hook_count
from amp_lessons.l05_nan_debugging.nonfinite_report import NonFiniteReport, plot_probes, tensor_stats
from amp_lessons.l05_nan_debugging.skipped_updates import (
    plot_scale_history,
    scale_history_table,
    skip_verdict,
)


class FP32ScoreProduct(nn.Module):
    def forward(self, q, k):
        with torch.autocast(device_type=q.device.type, enabled=False):
            return q.float() @ k.float().transpose(-2, -1)


def _step_parts(model, init_scale=2.0**16):
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    return model, optimizer, torch.amp.GradScaler("cpu", init_scale=init_scale)


# ----------------------------------------------------------------------------------------------------- models


def test_attention_model_overflows_in_fp16_only():
    x, y, loud = attention_batch()
    model = TinyAttentionClassifier(seed=0)
    with torch.no_grad():
        assert torch.isfinite(model(x)).all()
        scores = model.scores(model.query(x), model.key(x))
        assert scores.abs().max() > 65504 and torch.isfinite(scores).all()
        with torch.autocast("cpu", dtype=torch.float16):
            scores16 = model.scores(model.query(x), model.key(x))
            assert scores16.dtype == torch.float16 and torch.isinf(scores16).any()
            assert not torch.isfinite(model(x)).all()
    over = (scores.abs() > 65504).flatten(1).any(1)
    assert over.any() and not (over & ~loud).any()


def test_models_are_deterministic_and_keep_global_rng():
    torch.manual_seed(3)
    before = torch.rand(1)
    torch.manual_seed(3)
    a, b = TinyAttentionClassifier(seed=1), TinyAttentionClassifier(seed=1)
    assert torch.equal(torch.rand(1), before)  # seeded init forks the RNG
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))
    assert torch.equal(attention_batch(seed=2)[0], attention_batch(seed=2)[0])
    with pytest.raises(ValueError):
        attention_batch(n=0)
    with pytest.raises(ValueError):
        texture_batch(classes=1)


@pytest.mark.parametrize("seed", [0, 1])
def test_texture_net_overflows_in_fp16_only(seed):
    model = TextureNet(seed=seed)
    x, _ = texture_batch(n=8, seed=seed)
    with torch.no_grad():
        h = model.features(x)
        gram = h.transpose(1, 2) @ h
        assert gram.max() > 65504 and (gram / h.shape[1]).max() < 65504
        assert torch.isfinite(model(x)).all()
        with torch.autocast("cpu", dtype=torch.float16):
            assert not torch.isfinite(model(x)).all()


# ----------------------------------------------------------------------------------------------------- finder


def test_finder_names_the_overflowing_module_output():
    x, y, _ = attention_batch()
    model, optimizer, scaler = _step_parts(TinyAttentionClassifier(seed=0))
    report = find_first_nonfinite(model, optimizer, scaler, F.cross_entropy, x, y, dtype=torch.float16)
    assert isinstance(report, NonFiniteReport) and report.found
    assert report.stage == "forward" and report.name == "scores" and report.dtype == "float16"
    assert report.first.kind == "module output" and report.first.leaf and report.first.posinf > 0
    assert [c.name for c in report.before] == ["inputs", "query", "key", "value"]
    assert all(c.finite for c in report.before)
    assert report.skipped is True and report.scale_after == report.scale_before / 2
    assert hook_count(model) == 0
    assert "scores" in str(report) and "65504" in report.explanation()
    # 65504 is float16's maximum; the 65344 quoted next to it is this tensor's, not the format's (issue 11.5)
    assert "float16 holds at most 65504 (this tensor's largest value that stayed finite is 65344)" in (
        report.explanation()
    )
    assert "its largest finite value" not in report.explanation()
    assert "ScoreProduct" in report._repr_html_()
    table = report.table()
    assert list(table.index) == list(range(1, len(report.probes) + 1))
    assert len(report.table(upto_first=True)) == report.first.order


def test_finder_checks_the_data_first():
    x, y, _ = attention_batch(n=8)
    x[2, 1, 0] = float("nan")
    model, optimizer, scaler = _step_parts(TinyAttentionClassifier(seed=0))
    report = find_first_nonfinite(model, optimizer, scaler, F.cross_entropy, x, y)
    assert report.stage == "input" and report.first.kind == "inputs" and report.first.nan == 1
    assert report.before == [] and "data pipeline" in report.explanation()
    assert hook_count(model) == 0


def test_finder_catches_a_value_computed_between_submodules():
    model, optimizer, scaler = _step_parts(TextureNet(seed=0))
    x, y = texture_batch()
    report = find_first_nonfinite(model, optimizer, scaler, F.cross_entropy, x, y)
    assert report.first.kind == "module input" and report.name == "head" and report.dtype == "float16"
    assert "(model)" in report.first.note and "outside any submodule" in report.first.note
    assert [c.name for c in report.before] == ["inputs", "features.0", "features.1"]


class _InlineTail(nn.Module):
    """Its own code (after its only child) overflows: the container's output is the first non-finite value."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        h = self.fc(x)
        return h @ torch.full((4, 2), 3e4, device=x.device)


def test_finder_blames_a_container_only_after_its_children():
    torch.manual_seed(0)
    model, optimizer, scaler = _step_parts(_InlineTail())
    x, y = torch.randn(5, 4) * 3, torch.randn(5, 2)
    report = find_first_nonfinite(model, optimizer, scaler, F.mse_loss, x, y)
    assert report.first.kind == "module output" and report.name == "(model)" and not report.first.leaf
    assert "own forward code" in report.explanation()
    assert report.probe("forward", "fc").finite


def test_finder_reports_a_nonfinite_loss_and_the_damage_without_scaler():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)

    def broken_loss(outputs, targets):
        return F.mse_loss(outputs.float(), targets) / 0.0

    report = find_first_nonfinite(model, optimizer, None, broken_loss, torch.randn(4, 3), torch.randn(4, 2))
    assert report.stage == "loss" and report.first.posinf == 1
    assert report.skipped is None and not report.scaler_enabled
    assert report.probes[-1].stage == "update" and not report.probes[-1].finite


def test_finite_loss_but_nonfinite_gradient():
    x, y, _ = attention_batch()
    model = TinyAttentionClassifier(seed=0)
    model.scores = FP32ScoreProduct()
    model, optimizer, scaler = _step_parts(model, init_scale=2.0**20)
    report = find_first_nonfinite(model, optimizer, scaler, F.cross_entropy, x, y)
    assert report.stage == "backward" and math.isfinite(report.loss)
    assert all(c.finite for c in report.probes if c.stage in ("input", "forward", "loss"))
    assert report.skipped and "finite loss does not guarantee" in report.explanation()
    orders = [c.order for c in report.probes]
    assert orders == sorted(orders)
    stages = [c.stage for c in report.probes]
    assert stages.index("backward") > stages.index("loss")


def test_all_finite_step_updates_the_model():
    torch.manual_seed(0)
    model, optimizer, scaler = _step_parts(nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2)), 2.0**4)
    before = [p.detach().clone() for p in model.parameters()]
    report = find_first_nonfinite(
        model,
        optimizer,
        scaler,
        F.cross_entropy,
        torch.randn(6, 3),
        torch.randint(0, 2, (6,)),
        dtype=torch.bfloat16,
    )
    assert not report.found and report.first is None and report.stage is None
    assert report.skipped is False and "Every probe is finite" in str(report)
    assert any(not torch.equal(b, p) for b, p in zip(before, model.parameters()))
    # the Sequential returns its last child's tensor: one probe, noted as also the model's output
    last = report.probe("forward", "2")
    assert "also the output of `(model)`" in last.note
    assert report.probe("forward", "(model)") is None


class _Explodes(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(3, 3)

    def forward(self, x):
        self.fc(x)
        raise RuntimeError("boom inside forward")


def test_hooks_are_removed_even_on_error():
    model, optimizer, scaler = _step_parts(_Explodes())
    with pytest.raises(RuntimeError, match="boom"):
        find_first_nonfinite(model, optimizer, scaler, F.mse_loss, torch.randn(2, 3), torch.randn(2, 3))
    assert hook_count(model) == 0

    model, optimizer, scaler = _step_parts(nn.Linear(3, 3))

    def bad_loss(outputs, targets):
        raise ValueError("loss broke")

    with pytest.raises(ValueError, match="loss broke"):
        find_first_nonfinite(model, optimizer, scaler, bad_loss, torch.randn(2, 3), torch.randn(2, 3))
    assert hook_count(model) == 0


def test_finder_rejects_bad_arguments_clearly():
    model, optimizer, scaler = _step_parts(nn.Linear(3, 3))
    x = torch.randn(2, 3)
    with pytest.raises(TypeError, match="nn.Module"):
        find_first_nonfinite("model", optimizer, scaler, F.mse_loss, x, x)
    with pytest.raises(TypeError, match="optimizer"):
        find_first_nonfinite(model, None, scaler, F.mse_loss, x, x)
    with pytest.raises(TypeError, match="GradScaler"):
        find_first_nonfinite(model, optimizer, 3, F.mse_loss, x, x)
    with pytest.raises(TypeError, match="loss_fn"):
        find_first_nonfinite(model, optimizer, scaler, "mse", x, x)
    with pytest.raises(TypeError, match="inputs"):
        find_first_nonfinite(model, optimizer, scaler, F.mse_loss, [1, 2, 3], x)
    with pytest.raises(ValueError, match="float16 or torch.bfloat16"):
        find_first_nonfinite(model, optimizer, scaler, F.mse_loss, x, x, dtype=torch.float32)
    with pytest.raises(TypeError):
        hook_count("model")
    with pytest.raises(TypeError):
        tensor_stats([1.0])
    with pytest.raises(TypeError):
        plot_probes("report")


def test_custom_step_is_used():
    calls = []

    def my_step(model, optimizer, scaler, loss_fn, inputs, targets, *, dtype, max_norm):
        calls.append((dtype, max_norm))
        with torch.autocast(device_type="cpu", dtype=dtype):
            loss = loss_fn(model(inputs), targets)
        loss.backward()
        return loss.detach()

    model, optimizer, scaler = _step_parts(nn.Linear(3, 3))
    report = find_first_nonfinite(
        model, optimizer, scaler, F.mse_loss, torch.randn(2, 3), torch.randn(2, 3), max_norm=1.0, step=my_step
    )
    assert calls == [(torch.float16, 1.0)] and not report.found


def test_tensor_stats():
    stats = tensor_stats(torch.tensor([1.0, -3.0, float("nan"), float("inf"), float("-inf"), float("-inf")]))
    assert stats == {"nan": 1, "posinf": 1, "neginf": 2, "max_abs": 3.0}
    assert math.isnan(tensor_stats(torch.tensor([float("nan")]))["max_abs"])
    assert tensor_stats(torch.tensor([1, -5]))["max_abs"] == 5.0


def test_plot_probes_draws_one_bar_per_probe():
    x, y, _ = attention_batch(n=8)
    model, optimizer, scaler = _step_parts(TinyAttentionClassifier(seed=0))
    report = find_first_nonfinite(model, optimizer, scaler, F.cross_entropy, x, y)
    figure = plot_probes(report)
    shown = [c for c in report.probes if c.stage in ("input", "forward", "loss")]
    assert len(figure.axes[0].patches) == len(shown)


class _ScaleInPlace(nn.Module):
    def forward(self, x):
        return x.mul_(1e30)


def test_finder_sees_a_tensor_made_nonfinite_in_place():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 3), _ScaleInPlace())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    report = find_first_nonfinite(
        model,
        optimizer,
        None,
        lambda out, t: out.float().sum(),
        torch.randn(2, 3) * 1e10,
        None,
        dtype=torch.bfloat16,
    )
    assert report.name == "1" and "in place" in report.first.note
    assert report.probe("forward", "0").finite


# -------------------------------------------------------------------------------------------------- op dtypes


def test_op_dtype_recorder_sees_the_precision_each_op_ran_in():
    model = TinyAttentionClassifier(seed=0)
    model.scores = FP32ScoreProduct()
    x, _, _ = attention_batch(n=4)
    with OpDtypeRecorder("cpu") as ops, torch.no_grad(), torch.autocast("cpu", dtype=torch.float16):
        out = model(x)
    assert out.dtype == torch.float16
    linears = [c for c in ops.calls if c.name == "linear"]
    assert len(linears) == 4 and all(c.output_dtype == "float16" and c.autocast for c in linears)
    scores = [c for c in ops.matmuls if c.shape == (4, 12, 12)]
    assert len(scores) == 1 and scores[0].output_dtype == "float32" and not scores[0].autocast
    assert {"name", "output_dtype"} <= set(ops.table().columns)


# -------------------------------------------------------------------------------------------- skipped updates


def test_scale_history_table_counts_skips_and_reads_them():
    calibrating = [8.0, 4.0, 2.0, 2.0, 2.0, 4.0, 4.0, 2.0, 2.0, 2.0]
    table = scale_history_table(calibrating, window=3)
    assert list(table["steps"]) == ["1-3", "4-6", "7-9"]
    assert list(table["skipped"]) == [2, 0, 1] and list(table["scale grew"]) == [0, 1, 0]
    assert table["reading"][0].startswith("calibration") and table["reading"][2].startswith("probing")
    assert "Healthy" in skip_verdict(table)

    collapsing = [2.0 ** (16 - i) for i in range(12)] + [0.0, 0.0]
    table = scale_history_table(collapsing, window=5)
    assert int(table["skipped"].sum()) == 13  # a scale stuck at 0 still counts as skipping
    assert all(r.startswith("persistent") for r in table["reading"])
    assert skip_verdict(table).startswith("PROBLEM")

    assert skip_verdict(scale_history_table([4.0] * 6, window=5)) == "Healthy: no update was skipped."
    with pytest.raises(ValueError):
        scale_history_table([1.0], window=2)
    with pytest.raises(ValueError):
        scale_history_table([1.0, 2.0], window=0)
    with pytest.raises(ValueError):
        skip_verdict(None)


def test_a_real_run_separates_healthy_from_broken():
    x, y, _ = attention_batch(n=32)
    from amp_lessons.l03_autocast_and_gradscaler.training import train_step

    histories = {}
    for name, fix in (("fixed", True), ("broken", False)):
        model = TinyAttentionClassifier(seed=0)
        if fix:
            model.scores = FP32ScoreProduct()
        optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
        scaler = torch.amp.GradScaler("cpu", growth_interval=10)
        scales = [scaler.get_scale()]
        with one_cpu_thread():
            for _ in range(40):
                train_step(model, optimizer, scaler, F.cross_entropy, x, y, dtype=torch.float16)
                scales.append(scaler.get_scale())
        histories[name] = scales
    assert skip_verdict(scale_history_table(histories["fixed"], window=10)).startswith("Healthy")
    assert skip_verdict(scale_history_table(histories["broken"], window=10)).startswith("PROBLEM")
    figure = plot_scale_history(histories)
    assert len(figure.axes) == 2
    with pytest.raises(TypeError):
        plot_scale_history([1, 2])


def test_one_cpu_thread_restores():
    before = torch.get_num_threads()
    with one_cpu_thread():
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == before


# ------------------------------------------------------------- the lesson's own code agrees with the package


LESSON = "notebooks/05_nan_debugging.ipynb"


def _lesson_namespace(marker: str) -> dict:
    """Execute the lesson's code cell that contains ``marker`` (it is self-contained) and return its names."""
    from notebook_code import ROOT

    from amp_lessons.tools.exercises.builder import cell_source, read_notebook

    cells = [cell_source(c) for c in read_notebook(ROOT / LESSON)["cells"] if c["cell_type"] == "code"]
    (source,) = [s for s in cells if marker in s]
    namespace = {"__name__": "lesson_05"}
    exec(compile(source, f"{LESSON}:{marker}", "exec"), namespace)
    return namespace


def _log_of_softmax(logits, targets):
    return F.nll_loss(torch.log(torch.softmax(logits, dim=-1)), targets)


def _fixed_model():
    model = TinyAttentionClassifier(seed=0)
    model.scores = FP32ScoreProduct()
    return model


def test_the_lessons_finder_agrees_with_the_package():
    """The 25 lines of hooks in lesson 05 name the same first non-finite value as ``find_first_nonfinite``."""
    first_nonfinite = _lesson_namespace("def first_nonfinite(")["first_nonfinite"]
    x, y, _ = attention_batch(n=64)
    poisoned = x.clone()
    poisoned[5, 3, 0] = float("nan")
    cases = {  # name: (model factory, loss, inputs, loss scale or None, expected)
        "a float16 overflow in the forward": (
            lambda: TinyAttentionClassifier(seed=0),
            F.cross_entropy,
            x,
            None,
            ("forward", "scores"),
        ),
        "a NaN in the data": (_fixed_model, F.cross_entropy, poisoned, None, ("input", "inputs")),
        "log of a flushed probability": (_fixed_model, _log_of_softmax, x, None, ("loss", "loss")),
        "a scaled gradient that overflows": (
            _fixed_model,
            F.cross_entropy,
            x,
            2.0**20,
            ("backward", "head.weight"),
        ),
        "a healthy step": (_fixed_model, F.cross_entropy, x, 2.0**8, None),
    }
    for name, (make, loss_fn, inputs, scale, expected) in cases.items():
        lesson_model = make()
        mine = first_nonfinite(lesson_model, loss_fn, inputs, y, dtype=torch.float16, loss_scale=scale or 1.0)
        model, optimizer, scaler = _step_parts(make(), init_scale=scale or 1.0)
        report = find_first_nonfinite(
            model, optimizer, scaler if scale else None, loss_fn, inputs, y, dtype=torch.float16
        )
        theirs = (report.first.stage, report.first.name) if report.found else None
        assert mine == theirs == expected, name
        assert hook_count(lesson_model) == 0, name


def test_the_lessons_finder_removes_its_hooks_when_the_step_raises():
    first_nonfinite = _lesson_namespace("def first_nonfinite(")["first_nonfinite"]
    model = TinyAttentionClassifier(seed=0)
    x, y, _ = attention_batch(n=4)
    with pytest.raises(RuntimeError):
        first_nonfinite(model, lambda logits, targets: logits @ torch.ones(2), x, y, dtype=torch.float16)
    assert hook_count(model) == 0


def test_the_lessons_dtype_log_agrees_with_op_dtype_recorder():
    """Lesson 05's 12-line TorchFunctionMode logs the same ops and dtypes as ``OpDtypeRecorder``."""
    dtype_log = _lesson_namespace("class DtypeLog(")["DtypeLog"]
    x, _, _ = attention_batch(n=8)
    xt, _ = texture_batch(n=4)
    models = ((_fixed_model(), x), (TinyAttentionClassifier(seed=0), x), (TextureNet(seed=0), xt))
    for model, inputs in models:
        for dtype in (torch.float16, torch.bfloat16):
            with (
                dtype_log() as log,
                OpDtypeRecorder("cpu") as ops,
                torch.no_grad(),
                torch.autocast("cpu", dtype=dtype),
            ):
                model(inputs)
            assert log.ops == [(c.name, c.output_dtype) for c in ops.calls] and log.ops


def test_the_lessons_skip_detector_agrees_with_the_package():
    """Lesson 05's ``skipped_steps`` finds the steps ``step_was_skipped`` finds, and the counts of
    ``scale_history_table``."""
    from amp_lessons.l03_autocast_and_gradscaler.training import step_was_skipped, train_step

    skipped_steps = _lesson_namespace("def skipped_steps(")["skipped_steps"]
    x, y, _ = attention_batch(n=16)
    real = {}
    for name, model in (("fixed", _fixed_model()), ("broken", TinyAttentionClassifier(seed=0))):
        optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
        scaler = torch.amp.GradScaler("cpu", growth_interval=5)
        scales = [scaler.get_scale()]
        with one_cpu_thread():
            for _ in range(30):
                train_step(model, optimizer, scaler, F.cross_entropy, x, y, dtype=torch.float16)
                scales.append(scaler.get_scale())
        real[name] = scales
    synthetic = [
        [8.0, 4.0, 2.0, 2.0, 4.0, 4.0, 2.0, 2.0],
        [2.0 ** (4 - i) for i in range(6)] + [0.0, 0.0],
        [4.0] * 6,
    ]
    for scales in [*real.values(), *synthetic]:
        steps = skipped_steps(scales)
        assert steps == [i for i in range(1, len(scales)) if step_was_skipped(scales[i - 1], scales[i])]
        table = scale_history_table(scales, window=3)
        assert list(table["skipped"]) == [
            sum(start <= s < start + 3 for s in steps) for start in range(1, len(scales), 3)
        ]
    assert skipped_steps(real["broken"]) == list(range(1, 31)) and len(skipped_steps(real["fixed"])) < 10
