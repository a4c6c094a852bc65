"""Lesson 04, a class round (issue 19): right answers written unlike the solution, and natural wrong answers
the other tests do not cover, each named by its own mistake.

Nothing wrong found: every right answer passed and every wrong one below is named.
"""

import dataclasses

import pytest
import torch

from amp_lessons.l04_baseline_and_decision_boundary import Criteria
from amp_lessons.l04_baseline_and_decision_boundary.check import check_criteria as K
from amp_lessons.l04_baseline_and_decision_boundary.check import check_decide as D


def _fin(s):
    return torch.isfinite(s).all(dim=1)


def r_scatter_runner_up(scores, tie_tolerance):
    s = scores.float()
    if s.shape[0] == 0:
        return torch.empty(0, dtype=torch.long)
    ok = _fin(s)
    s = torch.where(ok[:, None], s, 0.0)
    top, idx = s.max(dim=1)
    rest = s.scatter(1, idx[:, None], float("-inf"))
    margin = top - rest.max(dim=1).values if s.shape[1] > 1 else torch.full_like(top, float("inf"))
    return torch.where(ok & ~(margin < tie_tolerance), idx, -1)


def r_kthvalue(scores, tie_tolerance):
    s = scores.to(torch.float64)
    n, c = s.shape
    out = torch.full((n,), -1, dtype=torch.int64)
    if n == 0:
        return out
    ok = torch.isfinite(s).all(1)
    s = s.nan_to_num(0.0, 0.0, 0.0)
    win = s.argmax(1)
    margin = (
        s.max(1).values - torch.kthvalue(s, c - 1, dim=1).values
        if c > 1
        else torch.full((n,), torch.inf, dtype=s.dtype)
    )
    keep = ok & (margin >= tie_tolerance)
    out[keep] = win[keep]
    return out


def r_pad_column(scores, tie_tolerance):
    s = scores.float()
    n = s.shape[0]
    ok = torch.isfinite(s).all(dim=1)
    s = torch.cat([torch.where(ok[:, None], s, 0.0), torch.full((n, 1), float("-inf"))], dim=1)
    top2 = torch.topk(s, 2, dim=1)
    margin = top2.values[:, 0] - top2.values[:, 1]
    win = s.argmax(dim=1)
    return win.masked_fill(~ok | (margin < tie_tolerance), -1)


def r_python_rows(scores, tie_tolerance):
    import math

    out = []
    for row in scores.float().tolist():
        if not all(math.isfinite(v) for v in row):
            out.append(-1)
            continue
        best = max(range(len(row)), key=lambda i: (row[i], -i))
        second = max((v for i, v in enumerate(row) if i != best), default=-math.inf)
        out.append(-1 if row[best] - second < tie_tolerance else best)
    return torch.tensor(out, dtype=torch.long, device=scores.device)


def _good(s, tol, margin_fn=None, cast=True, axis=1):
    s0 = s.float() if cast else s
    if s0.shape[0] == 0:
        return torch.zeros(0, dtype=torch.long)
    ok = torch.isfinite(s0).all(1)
    s1 = torch.where(ok[:, None], s0, torch.zeros_like(s0))
    win = s1.argmax(dim=axis)
    if s1.shape[1] == 1:
        m = torch.full((s1.shape[0],), float("inf"))
    else:
        m = margin_fn(s1) if margin_fn else (lambda t: t[:, 0] - t[:, 1])(s1.topk(2, dim=1).values)
    return torch.where(~ok | (m < tol), torch.full_like(win, -1), win)


def w_relative_margin(scores, tol):
    return _good(scores, tol, lambda s: (lambda t: (t[:, 0] - t[:, 1]) / t[:, 0].abs())(s.topk(2, 1).values))


def w_first_two_columns(scores, tol):
    return _good(scores, tol, lambda s: (s[:, 0] - s[:, 1]).abs())


def w_no_float_cast(scores, tol):
    return _good(scores, tol, cast=False)


def w_int32(scores, tol):
    return _good(scores, tol).to(torch.int32)


def w_margin_to_mean(scores, tol):
    return _good(scores, tol, lambda s: s.max(1).values - s.mean(1))


def w_abs_scores(scores, tol):
    return _good(scores.abs(), tol)


base = dict(
    application="ticket router: one of three teams; near-ties go to a person",
    atol=0.05,
    rtol=0.01,
    min_quality=0.8,
    nonfinite="fail",
    tie_rule="abstain",
    tie_tolerance=0.1,
    allowed_decision_changes=0,
)
cands = {
    "r_positional": lambda: Criteria(0.05, 0.01, 0.8, "fail", "abstain", 0.1, 0, "router"),
    "r_defaults_omitted": lambda: Criteria(
        atol=5e-2, rtol=1e-2, min_quality=4 / 5, tie_rule="abstain", tie_tolerance=1e-1, application="router"
    ),
    "r_replace": lambda: dataclasses.replace(
        Criteria(atol=0.05, rtol=0.01),
        min_quality=0.8,
        tie_rule="abstain",
        tie_tolerance=0.1,
        application="x",
    ),
    "r_no_application": lambda: Criteria(**{**base, "application": ""}),
}
for k, v in {
    "w_percent_quality": dict(min_quality=80),
    "w_atol_tenth": dict(atol=0.005),
    "w_tol_0": dict(tie_tolerance=0.0),
    "w_rtol_percent_as_1": dict(rtol=1),
    "w_nonfinite_raise": dict(nonfinite="raise"),
    "w_quality_09": dict(min_quality=0.9),
    "w_changes_none": dict(allowed_decision_changes=None),
    "w_tie_01_lowest": dict(tie_rule="lowest_index"),
    "w_atol_rtol_both_005": dict(rtol=0.05),
    "w_strings": dict(atol="0.05"),
    "w_tol_001": dict(tie_tolerance=0.01),
}.items():
    cands[k] = (lambda kw: lambda: Criteria(**{**base, **kw}))(v)
cands["w_returns_dict"] = lambda: dict(base)
cands["w_returns_class"] = lambda: Criteria


WRONG_DECIDE = {
    w_relative_margin: "divided by its length",
    w_first_two_columns: "RUNNER-UP",
    w_margin_to_mean: "RUNNER-UP",
    w_no_float_cast: "convert the scores to float32 first",
    w_int32: "return a LongTensor",
    w_abs_scores: "index of the largest score",
}
CRITERIA_WORDS = {
    "w_percent_quality": "min_quality is a fraction between 0 and 1",
    "w_atol_tenth": "atol is 0.005",
    "w_tol_0": "needs tie_tolerance > 0",
    "w_rtol_percent_as_1": "rtol=1 means 100 %",
    "w_nonfinite_raise": "nonfinite must be one of",
    "w_quality_09": "min_quality is 0.9",
    "w_changes_none": "allowed_decision_changes must be an integer",
    "w_tie_01_lowest": "tie_tolerance must be 0",
    "w_atol_rtol_both_005": "rtol is 0.05",
    "w_strings": "atol must be a number",
    "w_tol_001": "tie_tolerance is 0.01",
    "w_returns_dict": "returned a dict",
    "w_returns_class": "returned a type",
}


@pytest.mark.parametrize(
    "answer", [r_scatter_runner_up, r_kthvalue, r_pad_column, r_python_rows], ids=lambda f: f.__name__
)
def test_class_round_decide_right_answers_pass(answer):
    result = D(answer)
    assert result.passed, result.message


@pytest.mark.parametrize("wrong", WRONG_DECIDE, ids=lambda f: f.__name__)
def test_class_round_decide_wrong_answers_are_named(wrong):
    result = D(wrong)
    assert result.status == "failed", result.message
    assert WRONG_DECIDE[wrong] in result.message, result.message


@pytest.mark.parametrize("name", [n for n in cands if n.startswith("r_")])
def test_class_round_criteria_right_answers_pass(name):
    result = K(cands[name])
    assert result.passed, result.message


@pytest.mark.parametrize("name", CRITERIA_WORDS)
def test_class_round_criteria_wrong_answers_are_named(name):
    result = K(cands[name])
    assert result.status == "failed", result.message
    assert CRITERIA_WORDS[name] in result.message, result.message
