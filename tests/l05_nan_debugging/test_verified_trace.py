"""05.2's verified trace: the checker replays every op the learner's forward ran and trusts no recorded value.

The tests hand the checker doctored reports (what a learner's kernel could send when graded) through
``spies.trace_texture_forward``, which ``run_beside_learner`` calls in this process in self-study.
"""

import pytest
import torch
from notebook_code import solution

from amp_lessons.l05_nan_debugging import cases, spies, trace
from amp_lessons.l05_nan_debugging import check as l05
from amp_lessons.l05_nan_debugging.check import check_texture_forward

LESSON = "05_nan_debugging.ipynb"
REAL_TRACE = spies.trace_texture_forward


def right(model, x):
    return solution(LESSON, "texture_forward")(model, x)


def float32_forward(model, x):
    with torch.autocast(x.device.type, enabled=False):
        h = model.features(x.float())
        gram = h.transpose(1, 2) @ h / h.shape[1]
        return model.head(gram.flatten(1))


def check_with_reports(monkeypatch, doctor, forward=right):
    """Run the check with every report passed through ``doctor(report, autocast, gpu)`` first."""

    def doctored(fn, model, x, *, autocast, gpu=False):
        return doctor(REAL_TRACE(fn, model, x, autocast=autocast, gpu=gpu), autocast, gpu)

    monkeypatch.setattr(spies, "trace_texture_forward", doctored)
    return check_texture_forward(forward)


def test_the_solution_traces_with_only_ops_the_check_can_run():
    model, x, _ = cases.texture_case(0)
    report = REAL_TRACE(right, model, x, autocast=True)
    specs = [op["fn"] for op in report["trace"]["ops"]]
    assert all(trace.resolve(spec) is not None for spec in specs), specs
    assert [role for _, role, _ in report["trace"]["leaves"]][0] == "x"


def test_a_float32_forward_claimed_as_float16_is_not_followed(monkeypatch):
    def claim_float16(report, autocast, gpu):
        for op in report["trace"]["ops"]:
            op["autocast"] = [True, "float16"]
            op["outputs"] = [[ref, value.half()] for ref, value in op["outputs"]]
        report["result"]["value"] = report["result"]["value"].half()
        return report

    def forward(model, x):
        return float32_forward(model, x).half()

    result = check_with_reports(monkeypatch, claim_float16, forward)
    assert result.status == "failed" and "could not follow" in result.message, result.message


def test_an_honest_float32_forward_cast_to_half_is_named_by_its_mistake():
    result = check_texture_forward(lambda model, x: float32_forward(model, x).half())
    assert result.status == "failed" and "could not follow" not in result.message, result.message


def test_a_recorded_value_that_the_check_does_not_compute_is_refused(monkeypatch):
    def scale_gram(report, autocast, gpu):
        for op in report["trace"]["ops"]:
            if op["fn"][1] in ("matmul", "__matmul__"):
                op["outputs"] = [[ref, value * 1.01] for ref, value in op["outputs"]]
        return report

    result = check_with_reports(monkeypatch, scale_gram)
    assert result.status == "failed" and "gave other values when the check ran it" in result.message


def test_a_tensor_from_elsewhere_is_refused(monkeypatch):
    def foreign_weight(report, autocast, gpu):
        report["trace"]["leaves"][1][1] = "other"
        return report

    result = check_with_reports(monkeypatch, foreign_weight)
    assert result.status == "failed" and "neither `x`, nor one of the model's parameters" in result.message


def test_a_leaf_whose_values_are_not_the_checks_own_is_refused(monkeypatch):
    def other_x(report, autocast, gpu):
        report["trace"]["leaves"][0][2] = report["trace"]["leaves"][0][2] * 0.5
        return report

    result = check_with_reports(monkeypatch, other_x)
    assert result.status == "failed" and "is not the check's own" in result.message, result.message


@pytest.mark.parametrize(
    "spec", [["torch", "save"], ["torch", "load"], ["method", "backward"], ["torch", "from_file"]]
)
def test_a_trace_cannot_make_the_check_run_what_it_must_not(monkeypatch, spec):
    def rename(report, autocast, gpu):
        report["trace"]["ops"][0]["fn"] = spec
        return report

    result = check_with_reports(monkeypatch, rename)
    assert result.status == "failed" and "is not an op the check can run again" in result.message


def test_what_a_trace_may_name():
    for spec in (
        ["torch", "save"],
        ["torch", "load"],
        ["torch", "set_default_dtype"],
        ["torch", "from_file"],
        ["torch", "compile"],
        ["method", "backward"],
        ["method", "register_hook"],
        ["method", "__reduce_ex__"],
        ["method", "requires_grad_"],
        ["unknown", "linear"],
        ["torch.nn.functional", "__class__"],
    ):
        assert trace.resolve(spec) is None, spec
    for spec in (
        ["torch.nn.functional", "linear"],
        ["torch", "einsum"],
        ["torch", "matmul"],
        ["method", "__matmul__"],
        ["method", "div_"],
        ["method", "float"],
        ["getter", "mT"],
        ["torch", "zeros"],
    ):
        assert trace.resolve(spec) is not None, spec


def test_a_silenced_recorder_leaves_a_result_the_check_cannot_place(monkeypatch):
    monkeypatch.setattr(
        trace.OpTrace,
        "__torch_function__",
        lambda self, func, types, args=(), kwargs=None: func(*args, **kwargs or {}),
    )
    result = check_texture_forward(right)
    assert result.status == "failed" and "no op of your forward produced" in result.message, result.message


def test_a_made_up_trace_of_the_right_computation_passes(monkeypatch):
    """By design: a trace passes when it IS the right forward, whatever function the learner handed in."""

    def doctored(fn, model, x, *, autocast, gpu=False):
        return REAL_TRACE(right, model, x, autocast=autocast, gpu=gpu)

    monkeypatch.setattr(spies, "trace_texture_forward", doctored)
    assert check_texture_forward(float32_forward).passed


def test_values_compare_with_a_few_units_in_the_last_place():
    a = torch.tensor([1.0, 1000.0, float("inf")], dtype=torch.float16)
    assert trace.same_values(a, a.clone())
    assert trace.same_values(a, torch.tensor([1.0, 1000.5, float("inf")], dtype=torch.float16))
    assert not trace.same_values(a, torch.tensor([1.0, 1010.0, float("inf")], dtype=torch.float16))
    assert not trace.same_values(a, a.float())
    assert not trace.same_values(a, torch.tensor([1.0, 1000.0, float("-inf")], dtype=torch.float16))
    assert trace.same_values(a, a.clone(), exact=True)


def baked_logits(model, x):
    """The right ops in sight of the trace, but the logits typed in: computed in float32 where no torch
    function mode sees them, then passed back in as a constant (tiny multiples keep the gradients alive)."""
    with torch._C.DisableTorchFunction(), torch.autocast(x.device.type, enabled=False):
        constant = float32_forward(model, x).tolist()
    h = model.features(x)
    with torch.autocast(x.device.type, enabled=False):
        gram = h.float().transpose(1, 2) @ h.float()
    pooled = (gram / h.shape[1]).flatten(1)
    logits = model.head(pooled)
    return logits * 1e-30 + torch.tensor(constant)


def test_logits_fixed_in_advance_fail_on_a_batch_the_learner_never_saw():
    result = check_texture_forward(baked_logits)
    assert result.status == "failed" and "another batch and another TextureNet" in result.message, (
        result.message
    )


def test_the_right_forward_passes_other_models_and_batches_with_room_to_spare():
    model, x, _ = cases.texture_case(0)
    with torch.no_grad():
        reference = model(x)
    runs = {
        autocast: l05._observe(right, model, x, reference, autocast=autocast) for autocast in (False, True)
    }
    for seed in range(2, 40):
        other, other_x, _ = cases.texture_case(seed)
        with torch.no_grad():
            held_out = (other, other_x, other(other_x))
        for autocast, run in runs.items():
            assert l05._held_out_problem(run, held_out, autocast=autocast) is None, seed
