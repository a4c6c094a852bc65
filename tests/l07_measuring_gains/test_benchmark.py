"""Lesson 07: the benchmark and memory helpers and the conclusions they generate.

The time_step checker's tests are in tests/checks/test_l07_benchmark.py."""

import math
import time

import matplotlib.figure
import pytest
import torch
from torch import nn

from amp_lessons.core.environment import cpu_threads
from amp_lessons.core.models import TimingMLP
from amp_lessons.l07_measuring_gains import benchmark, memory
from amp_lessons.l07_measuring_gains.benchmark import Measurement

# ----------------------------------------------------------------------------- measure and friends


def _counting_step():
    calls = []

    def step():
        calls.append(1)
        return torch.tensor(1.0)

    return step, calls


def test_measure_calls_warmup_plus_repeats():
    step, calls = _counting_step()
    m = benchmark.measure(step, device="cpu", warmup=2, repeats=7, label="x")
    assert len(calls) == 9
    assert len(m.times) == 7 and all(t >= 0 for t in m.times)
    assert m.all_finite is True and m.peak_memory_bytes is None and m.label == "x"


def test_measure_checks_outputs_after_timing():
    m = benchmark.measure(lambda: torch.tensor(float("nan")), device="cpu", warmup=0, repeats=3)
    assert m.all_finite is False
    assert benchmark.measure(lambda: None, device="cpu", warmup=0, repeats=2).all_finite is None


def test_measure_stops_at_max_seconds_after_min_repeats():
    m = benchmark.measure(
        lambda: time.sleep(0.02), device="cpu", warmup=0, repeats=100, max_seconds=0.01, min_repeats=3
    )
    assert len(m.times) == 3


@pytest.mark.parametrize("kwargs", [dict(warmup=-1), dict(repeats=0), dict(repeats=2.5), dict(warmup=True)])
def test_measure_rejects_bad_counts(kwargs):
    with pytest.raises(ValueError):
        benchmark.measure(lambda: None, device="cpu", **kwargs)


def test_measure_rejects_non_callable():
    with pytest.raises(TypeError):
        benchmark.measure("step", device="cpu")


def test_measurement_statistics():
    m = Measurement("a", [0.004, 0.001, 0.003, 0.002, 0.005])
    assert m.median == 0.003
    assert m.q25 == 0.002 and m.q75 == 0.004
    assert m.spread == pytest.approx(0.002)
    assert "median 3.000 ms" in str(m)
    assert math.isnan(Measurement("empty", []).median)


def test_synchronize_and_item_overhead_on_cpu():
    benchmark.synchronize("cpu")
    benchmark.make_synchronizer(torch.device("cpu"))()
    step, calls = _counting_step()
    without, with_item = benchmark.item_overhead(step, device="cpu", steps=4, rounds=3)
    assert len(without) == len(with_item) == 3
    assert len(calls) == 2 + 2 * 12  # warm-up (plain and with .item()) + both loops * steps * rounds
    with pytest.raises(ValueError):
        benchmark.item_overhead(step, device="cpu", steps=0)


def test_item_overhead_alternates_rounds():
    log = []

    class Loss:
        def item(self):
            log.append("item")
            return 1.0

    def step():
        log.append("step")
        return Loss()

    without, with_item = benchmark.item_overhead(step, device="cpu", steps=2, rounds=2)
    assert len(without) == len(with_item) == 2
    # warm-up (step, step+item), then rounds:
    # [step step] [step item step item] [step step] [step item step item]
    rounds = log[3:]
    assert rounds == ["step", "step", "step", "item", "step", "item"] * 2
    short = benchmark.item_overhead(
        lambda: time.sleep(0.01) or Loss(), device="cpu", steps=1, rounds=50, max_seconds=0.001
    )
    assert len(short[0]) == 2


def test_cpu_threads_restores():
    before = torch.get_num_threads()
    with cpu_threads(1):
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == before
    with cpu_threads(None):
        assert torch.get_num_threads() == before
    with pytest.raises(ValueError):
        with cpu_threads(0):
            pass


# ----------------------------------------------------------------------------- generated conclusions


def _m(label, median, jitter=0.02):
    return Measurement(label, [median * (1 + jitter * k) for k in (-2, -1, 0, 1, 2)])


def test_speed_verdict_branches():
    base = _m("FP32", 0.010)
    assert benchmark.speed_verdict(base, _m("BF16", 0.005))[0] == "faster"
    assert benchmark.speed_verdict(base, _m("BF16", 0.020))[0] == "slower"
    assert benchmark.speed_verdict(base, _m("BF16", 0.0101))[0] == "no clear difference"
    noisy = Measurement("BF16", [0.002, 0.004, 0.008, 0.012, 0.016])  # faster median, overlapping IQR
    assert benchmark.speed_verdict(base, noisy)[0] == "no clear difference"


def test_conclusions_say_slower_on_a_cpu_without_bf16():
    text = benchmark.conclusions(
        [_m("FP32", 0.010), _m("FP16 autocast", 0.020), _m("BF16 autocast", 0.015)],
        device_type="cpu",
        native_bf16=False,
    )
    assert "FP16 autocast is SLOWER" in text and "BF16 autocast is SLOWER" in text
    assert "no BF16 instructions" in text and "rarely have fast FP16" in text
    assert "AMP made the step slower" in text


def test_conclusions_faster_on_gpu_and_cpu_with_bf16():
    gpu = benchmark.conclusions([_m("FP32", 0.010), _m("BF16 autocast", 0.004)], device_type="cuda")
    assert "faster" in gpu and "Tensor Cores" in gpu and "measured speed-up" in gpu
    cpu = benchmark.conclusions(
        [_m("FP32", 0.010), _m("BF16 autocast", 0.004)], device_type="cpu", native_bf16=True
    )
    assert "has BF16 instructions" in cpu
    slow_gpu = benchmark.conclusions([_m("FP32", 0.010), _m("FP16 autocast", 0.02)], device_type="cuda")
    assert "too small" in slow_gpu


def test_conclusions_unclear_and_single_and_nonfinite():
    text = benchmark.conclusions([_m("FP32", 0.010), _m("BF16 autocast", 0.0101)])
    assert "no clear difference" in text and "do not claim a speed-up" in text
    assert "nothing to compare" in benchmark.conclusions([_m("FP32", 0.01)])
    bad = _m("FP16 autocast", 0.005)
    bad.all_finite = False
    assert "NaN/inf" in benchmark.conclusions([_m("FP32", 0.01), bad])


def test_item_conclusion_branches():
    plain = [0.010, 0.0101, 0.0099, 0.0100]
    slow = [0.020, 0.021, 0.019, 0.020]
    assert "measurably slower" in benchmark.item_conclusion(plain, slow, device_type="cuda")
    assert "other processes" in benchmark.item_conclusion(plain, slow, device_type="cpu")
    same = benchmark.item_conclusion(plain, plain, device_type="cpu")
    assert "No measurable cost" in same and "cheap here" in same
    assert "noise" in benchmark.item_conclusion(slow, plain, device_type="cpu")


def test_shape_conclusion_branches():
    friendly = _m("n=4096", 0.001)
    assert "multiple of 8 was clearly faster" in benchmark.shape_conclusion([friendly, _m("n=4095", 0.002)])
    assert "No clear difference" in benchmark.shape_conclusion([friendly, _m("n=4095", 0.001)])
    assert "unexpected" in benchmark.shape_conclusion([_m("n=4096", 0.002), _m("n=4095", 0.001)])
    assert "Need two" in benchmark.shape_conclusion([friendly])


def test_results_table_and_plot():
    results = [_m("FP32", 0.010), _m("BF16 autocast", 0.005)]
    table = benchmark.results_table(results)
    assert list(table.index) == ["FP32", "BF16 autocast"]
    assert table.loc["BF16 autocast", "speed-up vs FP32"] == 2.0
    assert table.loc["BF16 autocast", "verdict"] == "faster"
    assert table.loc["FP32", "peak GPU memory (MiB)"] == "n/a (CPU)"
    assert isinstance(benchmark.plot_times(results), matplotlib.figure.Figure)
    with pytest.raises(ValueError):
        benchmark.results_table([])
    with pytest.raises(ValueError):
        benchmark.results_table(results, baseline="FP64")


# ----------------------------------------------------------------------------- memory


@pytest.fixture(scope="module")
def small():
    torch.manual_seed(0)
    model = TimingMLP(32, 64, 5)
    x = torch.randn(24, 32)
    y = torch.randint(0, 5, (24,))
    return model, nn.CrossEntropyLoss(), x, y


def test_timing_mlp_shapes(small):
    model, _, x, _ = small
    assert model(x).shape == (24, 5)


def test_saved_tensor_report_fp32_vs_bf16(small):
    model, loss_fn, x, y = small
    fp32 = memory.saved_tensor_report(model, loss_fn, x, y)
    bf16 = memory.saved_tensor_report(model, loss_fn, x, y, dtype=torch.bfloat16)
    kinds32 = set(fp32["kind"])
    assert "weight copy cast by autocast" not in kinds32 and "parameter itself (FP32)" in kinds32
    copies = bf16[bf16["kind"] == "weight copy cast by autocast"]
    assert len(copies) and set(copies["dtype"]) == {"bfloat16"}
    act32 = fp32[fp32["kind"] == "activation"]["bytes"].sum()
    act16 = bf16[bf16["kind"] == "activation"]["bytes"].sum()
    assert 0.4 < act16 / act32 < 0.65  # roughly half: some activations (loss, int targets) stay wide
    assert "float32" in set(bf16[bf16["kind"] == "activation"]["dtype"])  # not everything goes low precision


def test_state_breakdown_and_conclusion(small):
    model, loss_fn, x, y = small
    optimizer = torch.optim.Adam(model.parameters())
    loss_fn(model(x), y).backward()
    optimizer.step()
    state = memory.state_bytes(model, optimizer)
    n = sum(p.numel() for p in model.parameters())
    assert state == {"weights": 4 * n, "gradients": 4 * n, "optimizer state": 8 * n}
    saved = {
        "FP32": memory.saved_tensor_report(model, loss_fn, x, y),
        "BF16": memory.saved_tensor_report(model, loss_fn, x, y, dtype=torch.bfloat16),
    }
    table = memory.memory_breakdown(state, saved)
    assert table.at["weights", "FP32"] == table.at["weights", "BF16"]
    assert table.at["total", "BF16"] > 0.5 * table.at["total", "FP32"]
    text = memory.memory_conclusion(table)
    assert "BF16: activations saved for backward are" in text and "keeps them in FP32" in text
    assert isinstance(memory.plot_memory(table), matplotlib.figure.Figure)
    model.zero_grad(set_to_none=True)


def test_memory_by_batch_ratio_falls_but_stays_above_half(small):
    model, loss_fn, _, _ = small
    state = memory.state_bytes(model)
    frame = memory.memory_by_batch(
        model,
        loss_fn,
        state,
        batch_sizes=[3, 48, 768],
        in_features=32,
        classes=5,
        dtype=torch.bfloat16,
        device="cpu",
    )
    ratios = list(frame["AMP / FP32"])
    assert ratios[0] > ratios[-1] > 0.5
    text = memory.memory_by_batch_conclusion(frame)
    assert "No batch reached one half" in text
    assert isinstance(memory.plot_memory_by_batch(frame), matplotlib.figure.Figure)


def test_memory_by_batch_conclusion_branches():
    import pandas as pd

    frame = pd.DataFrame({"AMP / FP32": [1.05, 0.8, 0.45]}, index=pd.Index([8, 64, 512], name="batch"))
    text = memory.memory_by_batch_conclusion(frame)
    assert "MORE memory" in text and "went down to 0.45" in text


def test_process_rss_and_platform_note(monkeypatch):
    rss = memory.process_peak_rss_bytes()
    assert rss is None or rss > 10 * 2**20
    monkeypatch.setattr(torch.version, "hip", "6.2.0", raising=False)
    assert "ROCm build" in benchmark.platform_note()
    monkeypatch.setattr(torch.version, "hip", None, raising=False)
    monkeypatch.setattr(torch.version, "cuda", None, raising=False)
    assert "CPU-only build" in benchmark.platform_note()
    monkeypatch.setattr(torch.version, "cuda", "12.4", raising=False)
    assert "CUDA 12.4 build" in benchmark.platform_note()


def test_shape_comparison_runs_on_cpu():
    results = benchmark.shape_comparison("cpu", sizes=(16, 15), dtype=torch.bfloat16, warmup=1, repeats=2)
    assert [r.label for r in results] == ["n=16", "n=15"]
    assert isinstance(benchmark.shape_conclusion(results), str)


# ----------------------------------------------------------------- the lesson's loop agrees with measure


def _lesson_time_calls():
    from notebook_code import load_function

    return load_function("notebooks/07_measuring_gains.ipynb", "time_calls")


def _simulated_step(monkeypatch, costs):
    """A step whose n-th call takes ``costs[n]`` seconds on a fake host clock (``time.perf_counter``)."""
    state = {"now": 0.0, "calls": 0}
    monkeypatch.setattr(time, "perf_counter", lambda: state["now"])

    def step():
        state["now"] += costs[min(state["calls"], len(costs) - 1)]
        state["calls"] += 1
        return torch.tensor(1.0)

    return step, state


def test_the_lessons_timing_loop_agrees_with_measure(monkeypatch):
    """Lesson 07's 25-line ``time_calls`` times the same calls as ``benchmark.measure``, the same way: warm-up
    untimed, one time per call (on a simulated clock, so the numbers are exact)."""
    time_calls = _lesson_time_calls()
    costs = [0.05, 0.04, 0.010, 0.012, 0.009, 0.011, 0.014, 0.010]
    step, state = _simulated_step(monkeypatch, costs)
    lesson = time_calls(step, device="cpu", warmup=2, repeats=6)
    lesson_calls = state["calls"]
    step, state = _simulated_step(monkeypatch, costs)
    package = benchmark.measure(step, device="cpu", warmup=2, repeats=6).times
    assert lesson == pytest.approx(package) and package == pytest.approx(costs[2:])
    assert lesson_calls == state["calls"] == 8


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the CUDA-events branch needs a GPU")
def test_the_lessons_timing_loop_agrees_with_measure_on_a_gpu():
    time_calls = _lesson_time_calls()
    a = torch.randn(1024, 1024, device="cuda")
    lesson = time_calls(lambda: a @ a, device="cuda", warmup=3, repeats=20)
    package = benchmark.measure(lambda: a @ a, device="cuda", warmup=3, repeats=20).times
    assert len(lesson) == len(package) == 20 and min(lesson) > 0 and min(package) > 0
    assert 0.5 < sorted(lesson)[10] / sorted(package)[10] < 2  # the same kernel, timed the same way
