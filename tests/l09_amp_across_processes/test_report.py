"""Lesson 09's checker reads the ranks' report as a claim: when a class is graded it comes from the learner's
kernel (``spies.run_synced_ranks``), so the checker must pass a report only when it equals the right replay,
fail junk with a message (never a checker error), and never turn a rank's problem into a pass."""

import pytest
import torch

from amp_lessons.checks.harness import CHECKER_BUG, FAILED, NOT_DONE, PASSED
from amp_lessons.l09_amp_across_processes import check as l09
from amp_lessons.l09_amp_across_processes import spies


def report_like(how: str, **rank_changes) -> dict:
    """The report ranks following replay ``how`` would send, with ``rank_changes`` merged into each rank."""
    replayed = l09.replay(how, l09._dtype())
    ranks = []
    for rank in range(spies.WORLD):
        records = [
            {
                "returned": replayed["mean"][step],
                "params": replayed["params"][rank][step].clone(),
                "scale": replayed["scale"][rank][step],
            }
            for step in range(len(spies.PLAN))
        ]
        entry = {"rank": rank, "status": "ok", "value": {"records": records}, "error": "", "output": ""}
        ranks.append(dict(entry, seconds=0.05, **rank_changes))
    return {"method": "fork", "seconds": 0.1, "ranks": ranks}


def judged(monkeypatch, report):
    """The check's verdict when the ranks (wherever they ran) sent ``report``."""
    monkeypatch.setattr(l09, "run_synced_ranks", lambda fn, dtype, **deadlines: report)
    return l09.check_synced_train_step(lambda *args, **kwargs: None)


def test_a_report_equal_to_the_right_replay_passes(monkeypatch):
    result = judged(monkeypatch, report_like("mean"))
    assert result.status == PASSED, result.message


@pytest.mark.parametrize(
    "how,words",
    [("none", "drift apart"), ("sum", "2x too large"), ("rank0", "rank 0's gradients only")],
)
def test_a_report_of_a_wrong_step_fails_by_its_rule(monkeypatch, how, words):
    result = judged(monkeypatch, report_like(how))
    assert result.status == FAILED and words in result.message, result.message


def test_made_up_scales_with_the_right_weights_fail(monkeypatch):
    report = report_like("mean")
    for rank in report["ranks"]:
        for record in rank["value"]["records"]:
            record["scale"] *= 2  # still backed off at the spike, but never the scaler's scale
    result = judged(monkeypatch, report)
    assert result.status == FAILED and "loss scale is 2**11 instead of 2**10" in result.message, (
        result.message
    )


def test_a_scale_the_scaler_never_had_is_named():
    """A step with right weights whose scale is set by hand: the check names the scale, not the weights."""
    import torch.distributed as dist

    def capped_scale(model, optimizer, scaler, loss_fn, inputs, targets, *, dtype, max_norm):
        optimizer.zero_grad()
        with torch.autocast("cpu", dtype=dtype):
            loss = loss_fn(model(inputs), targets)
        scaler.scale(loss).backward()
        for p in model.parameters():
            dist.all_reduce(p.grad)
            p.grad /= dist.get_world_size()
        if max_norm is not None:
            scaler.unscale_(optimizer)
            torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
        scaler.step(optimizer)
        scaler.update()
        scaler.update(new_scale=min(scaler.get_scale(), 512.0))  # "keep the scale small"
        value = loss.detach().clone()
        dist.all_reduce(value)
        return value / dist.get_world_size()

    result = l09.check_synced_train_step(capped_scale)
    assert result.status == FAILED and "loss scale is 2**9 instead of 2**10" in result.message, result.message


def test_a_rank_problem_never_passes(monkeypatch):
    """A problem a rank reports (whatever status it claims) is the learner's failure, not a verdict."""
    for status, expected in (("passed", FAILED), ("failed", FAILED), (NOT_DONE, NOT_DONE)):
        report = report_like("mean")
        for rank in report["ranks"]:
            rank["value"] = {"problem": "made up", "status": status, "step": 0, "records": []}
        result = judged(monkeypatch, report)
        assert result.status == expected and not result.passed and result.message == "made up"


def _junk_reports():
    def changed(change):
        report = report_like("mean")
        change(report)
        return report

    def record(field, value):
        return lambda report: report["ranks"][1]["value"]["records"][3].__setitem__(field, value)

    return {
        "none": None,
        "list": [1, 2],
        "no ranks": {"method": "fork", "seconds": 0.1},
        "one rank": changed(lambda r: r["ranks"].pop()),
        "ranks swapped": changed(lambda r: r["ranks"].reverse()),
        "rank is True": changed(lambda r: r["ranks"][1].__setitem__("rank", True)),
        "odd status": changed(lambda r: r["ranks"][0].__setitem__("status", "passed")),
        "no value": changed(lambda r: r["ranks"][0].__setitem__("value", None)),
        "short records": changed(lambda r: r["ranks"][0]["value"]["records"].pop()),
        "extra records": changed(lambda r: r["ranks"][0]["value"]["records"].append({})),
        "weights as list": record("params", [0.0] * 5),
        "weights too short": record("params", torch.zeros(7)),
        "weights 2-d": record("params", torch.zeros(1, l09._initial_weights().numel())),
        "weights as ints": record("params", torch.zeros(l09._initial_weights().numel(), dtype=torch.long)),
        "scale as string": record("scale", "1024"),
        "scale as bool": record("scale", True),
        "huge int loss": record("returned", 10**400),
        "loss as tensor": record("returned", torch.ones(1)),
        "error not text": changed(lambda r: r["ranks"][0].__setitem__("error", 3)),
        "odd method": changed(lambda r: r.__setitem__("method", "magic")),
        "negative time": changed(lambda r: r.__setitem__("seconds", -1.0)),
    }


@pytest.mark.parametrize("name", list(_junk_reports()))
def test_junk_reports_fail_with_a_message(monkeypatch, name):
    result = judged(monkeypatch, _junk_reports()[name])
    assert result.status == FAILED and result.status != CHECKER_BUG, result.message
    assert "report could not be read" in result.message, result.message


def test_the_helper_reports_plain_data():
    """What runs beside the learner returns only what the grader's channel carries: plain data and tensors."""
    from notebook_code import solution

    report = spies.run_synced_ranks(
        solution("09_amp_across_processes.ipynb", "synced_train_step"),
        l09._dtype(),
        timeout_s=l09.TASK_TIMEOUT_S,
        start_timeout_s=6.0,
        collective_timeout_s=l09.COLLECTIVE_TIMEOUT_S,
        method="fork",
    )

    def plain(value) -> bool:
        if type(value) in (dict, list):
            items = value.values() if type(value) is dict else value
            return all(plain(item) for item in items) and all(
                type(k) is str for k in value if type(value) is dict
            )
        return value is None or type(value) in (str, int, float, bool, torch.Tensor)

    assert plain(report), report
    assert l09.read_report(report).ok
