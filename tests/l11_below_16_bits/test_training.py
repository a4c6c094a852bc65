"""Lesson 11: FP8 training with torchao's recipes (skipped where torchao does not import), the filter, the table."""

import matplotlib
import pytest
import torch
import torch.nn as nn

from amp_lessons.core.optional_libraries import torchao_support
from amp_lessons.l11_below_16_bits import training

matplotlib.use("Agg")


def test_module_filter_skips_the_head_and_odd_sizes():
    assert training.fp8_module_filter(nn.Linear(16, 32), "hidden")
    assert not training.fp8_module_filter(nn.Linear(32, 4), "head")
    assert not training.fp8_module_filter(nn.Linear(32, 32), "model.head")
    assert not training.fp8_module_filter(nn.Linear(24, 32), "hidden")
    assert not training.fp8_module_filter(nn.ReLU(), "act")


def test_plain_runs_and_the_verdict_table():
    data = training.task_data(n_train=128, n_eval=64)
    runs = [training.train_run("fp32", data, steps=4), training.train_run("bf16", data, steps=4)]
    assert all(run.ran and len(run.losses) == 4 for run in runs)
    table = training.verdict_table(runs, {"bf16": type("R", (), {"passed": True})()})
    assert (
        table.loc["fp32", "verdict vs FP32"] == "reference"
        and table.loc["bf16", "verdict vs FP32"] == "PASSED"
    )
    assert training.loss_curves_figure(runs) is not None


def test_fp8_recipes_train_here_or_say_why():
    data = training.task_data(n_train=128, n_eval=32)
    run = training.train_run("rowwise_with_gw_hp", data, steps=2)
    support = torchao_support()
    if not support.available:
        assert not run.ran and run.reason == support.reason
        return
    assert run.ran, run.reason
    assert run.fp8_layers == ["first", "hidden"] and torch.isfinite(run.eval_scores).all()


def test_model_tensors_are_real():
    tensors = training.model_tensors(training.task_data(n_train=128), steps=2)
    assert set(tensors) == {
        f"{layer}: {kind}"
        for layer in ("first", "hidden")
        for kind in ("weight", "activation", "output gradient", "weight gradient")
    }
    assert tensors["hidden: output gradient"].shape == (128, 32)
    assert tensors["hidden: output gradient"].abs().max() < tensors["hidden: activation"].abs().max()


def test_step_times_say_why_not_without_an_sm89_gpu():
    if (
        torch.cuda.is_available()
        and torch.cuda.get_device_capability() >= (8, 9)
        and torchao_support().available
    ):
        pytest.skip("an SM89+ GPU is here: the timing runs in the lesson")
    reason = training.fp8_step_times("cpu")
    assert isinstance(reason, str) and "SM89" in reason
