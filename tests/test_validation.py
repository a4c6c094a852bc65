"""amp_lessons.validation (compare, decide, criteria, baseline, regression, risk plot/widget) and lesson 04's checkers."""

import dataclasses
import math

import numpy as np
import pandas as pd
import pytest
import torch
from notebook_code import exercise, solution

from amp_lessons.checks.harness import NOT_DONE
from amp_lessons.checks.l04_validation import check_criteria, check_decide, check_judge_trial
from amp_lessons.validation import (
    Criteria,
    CriteriaChangedError,
    NonFiniteReferenceError,
    Report,
    accuracy,
    at_risk,
    compare,
    compare_regression,
    decide,
    judge,
    judge_quality,
    margin_plot,
    margins,
    record_baseline,
    risk_summary,
    risk_view,
    tolerance_explorer,
)

LESSON = "04_baseline_and_decision_boundary.ipynb"
NAN, INF = math.nan, math.inf

REQUIRED_COLUMNS = ["finite", "max abs diff", "within tolerance", "reference decision", "trial decision",
                    "decision changed", "reference margin"]


def five_rows():
    """Row 0 fine, 1 NaN, 2 out of tolerance (same decision), 3 within tolerance but flipped, 4 +inf."""
    reference = torch.tensor([[2.0, 1.0, 0.0], [0.0, 2.0, 1.0], [3.0, 0.0, 0.0], [1.0, 1.0003, 0.0], [0.0, 0.0, 5.0]])
    trial = torch.tensor([[2.001, 1.0, 0.0], [NAN, 2.0, 1.0], [3.5, 0.0, 0.0], [1.0003, 1.0, 0.0], [0.0, 0.0, INF]])
    return reference, trial


# ------------------------------------------------------------------------------------------------- compare


def test_compare_one_row_per_sample_and_flags_exactly_the_problem_rows():
    reference, trial = five_rows()
    report = compare(reference, trial, atol=0.01, rtol=0.0)
    t = report.table
    assert len(t) == 5
    for column in REQUIRED_COLUMNS:
        assert column in t.columns, column
    assert t["finite"].tolist() == [True, False, True, True, False]
    assert t["within tolerance"].tolist() == [True, False, False, True, False]
    assert t["decision changed"].tolist() == [False, True, False, True, True]
    assert t["reference decision"].tolist() == [0, 1, 0, 1, 2]
    assert t["trial decision"].tolist() == [0, -1, 0, 0, -1]
    assert t["max abs diff"][1] == INF and t["max abs diff"][4] == INF
    assert t["flag"][0] == "ok" and "decision changed" in t["flag"][3] and "non-finite" in t["flag"][1]
    assert list(report.flagged().index) == [1, 2, 3, 4]
    assert report.counts() == {"samples": 5, "non-finite": 2, "out of tolerance": 3, "decision changed": 3}
    assert not report.passed


def test_a_decision_change_fails_even_within_tolerance_unless_allowed():
    reference = torch.tensor([[1.0, 1.0003, 0.0], [2.0, 0.0, 0.0]])
    trial = torch.tensor([[1.0003, 1.0, 0.0], [2.0, 0.0, 0.0]])
    report = compare(reference, trial, atol=0.01, rtol=0.0)
    assert report.table["within tolerance"].all()
    assert not report.passed
    assert any("changed decision" in r for r in report.reasons)
    assert compare(reference, trial, atol=0.01, rtol=0.0, allowed_decision_changes=1).passed


def test_each_failure_alone():
    reference = torch.tensor([[2.0, 0.0], [0.0, 2.0]])
    assert compare(reference, reference.clone(), atol=0.0, rtol=0.0).passed
    nan = torch.tensor([[2.0, 0.0], [NAN, 2.0]])
    assert not compare(reference, nan, atol=1e9, rtol=0.0, allowed_decision_changes=5).passed  # non-finite fails
    out = torch.tensor([[2.5, 0.0], [0.0, 2.0]])
    report = compare(reference, out, atol=0.1, rtol=0.0)
    assert not report.passed and report.counts()["decision changed"] == 0  # numeric alone fails


def test_nonfinite_policy_allow_flags_but_does_not_fail_on_its_own():
    reference = torch.tensor([[2.0, 0.0], [0.0, 2.0]])
    trial = torch.tensor([[INF, 0.0], [0.0, 2.0]])
    report = compare(reference, trial, atol=0.1, rtol=0.0, nonfinite="allow", allowed_decision_changes=1)
    assert not report.table["finite"][0]
    verdicts = report.summary.set_index("criterion")["verdict"]
    assert verdicts["finite outputs"] == "allowed"
    assert verdicts["numeric difference"] == "FAIL"  # inf is still outside any tolerance


def test_tolerance_is_inclusive_and_relative_to_the_reference():
    reference = torch.tensor([[2.0, 0.0]])
    assert compare(reference, torch.tensor([[2.5, 0.0]]), atol=0.25, rtol=0.125).passed  # exactly at the limit
    assert not compare(torch.tensor([[1.0, 0.0]]), torch.tensor([[2.0, 0.0]]), atol=0.0, rtol=0.6).passed


def test_low_precision_trial_and_devices_are_accepted():
    reference = torch.tensor([[1.0, 1.0003]])
    report = compare(reference, reference.to(torch.float16), atol=1e-3, rtol=0.0)
    assert report.table["trial decision"][0] == 0 and report.table["decision changed"][0]
    numpy_report = compare(reference.numpy(), np.array([[1.0, 1.0003]], dtype=np.float32), atol=0.0, rtol=0.0)
    assert numpy_report.passed


def test_tie_tolerance_makes_near_ties_abstain_on_both_sides():
    reference = torch.tensor([[1.0, 1.0003]])
    trial = reference.to(torch.bfloat16)
    assert not compare(reference, trial, atol=1e-2, rtol=0.0).passed
    report = compare(reference, trial, atol=1e-2, rtol=0.0, tie_tolerance=1e-3)
    assert report.passed and report.table["reference decision"][0] == -1 and report.table["trial decision"][0] == -1


def test_empty_batch_and_single_class():
    report = compare(torch.zeros(0, 3), torch.zeros(0, 3), atol=0.1, rtol=0.0)
    assert report.passed and len(report.table) == 0
    single = compare(torch.tensor([[1.0], [2.0]]), torch.tensor([[1.5], [2.0]]), atol=1.0, rtol=0.0)
    assert single.passed and single.table["reference margin"].tolist() == [INF, INF]


@pytest.mark.parametrize(
    "reference, trial, error, words",
    [
        (torch.zeros(3, 2), torch.zeros(3, 3), ValueError, "same samples"),
        (torch.zeros(3, 2), torch.zeros(4, 2), ValueError, "shape"),
        ([[1.0, 2.0]], torch.zeros(1, 2), TypeError, "torch tensor"),
        (torch.zeros(3, 2), None, TypeError, "NoneType"),
        (torch.zeros(3), torch.zeros(3), ValueError, "unsqueeze"),
        (torch.zeros(2, 2, 2), torch.zeros(2, 2, 2), ValueError, r"\[N, C\]"),
        (torch.zeros(2, 0), torch.zeros(2, 0), ValueError, "at least one class"),
        (torch.zeros(2, 2, dtype=torch.bool), torch.zeros(2, 2), TypeError, "real numbers"),
        (torch.tensor([[NAN, 1.0]]), torch.zeros(1, 2), NonFiniteReferenceError, "reference must be finite"),
    ],
)
def test_compare_gives_clear_errors(reference, trial, error, words):
    with pytest.raises(error, match=words):
        compare(reference, trial, atol=0.1, rtol=0.0)


@pytest.mark.parametrize("atol, error", [(-1.0, ValueError), (NAN, ValueError), ("0.1", TypeError), (None, TypeError)])
def test_compare_rejects_bad_tolerances(atol, error):
    with pytest.raises(error, match="atol"):
        compare(torch.zeros(1, 2), torch.zeros(1, 2), atol=atol, rtol=0.0)


def test_compare_rejects_wrong_number_of_labels_ids_categories():
    with pytest.raises(ValueError, match="labels"):
        compare(torch.zeros(2, 2), torch.zeros(2, 2), atol=0.0, rtol=0.0, labels=[0])
    with pytest.raises(ValueError, match="ids"):
        compare(torch.zeros(2, 2), torch.zeros(2, 2), atol=0.0, rtol=0.0, ids=["a"])
    with pytest.raises(ValueError, match="categories"):
        compare(torch.zeros(2, 2), torch.zeros(2, 2), atol=0.0, rtol=0.0, categories=["a", "b", "c"])


def test_summary_table_form_and_quality_row():
    reference = torch.tensor([[2.0, 0.0], [0.0, 2.0], [1.0, 0.0]])
    trial = torch.tensor([[2.0, 0.0], [2.0, 0.0], [1.0, 0.0]])
    criteria = Criteria(atol=5.0, rtol=0.0, min_quality=0.9, allowed_decision_changes=1)
    report = judge(reference, trial, criteria, labels=[0, 1, -1], label="AMP x")
    assert list(report.summary.columns) == ["criterion", "reference", "AMP x", "verdict"]
    rows = report.summary.set_index("criterion")
    assert list(rows.index) == ["finite outputs", "numeric difference", "application decision", "quality on the fixed set"]
    assert rows.loc["quality on the fixed set", "reference"] == "100.0%"
    assert rows.loc["quality on the fixed set", "AMP x"] == "50.0%"
    assert rows.loc["quality on the fixed set", "verdict"] == "FAIL"
    assert rows.loc["application decision", "verdict"] == "pass"
    assert not report.passed
    assert "AMP x: FAILED" in str(report) and "<table" in report._repr_html_()


def test_quality_without_labels_fails_when_a_minimum_is_set():
    criteria = Criteria(atol=1.0, rtol=0.0, min_quality=0.5)
    report = judge(torch.zeros(1, 2), torch.zeros(1, 2), criteria)
    assert not report.passed and any("no labels" in r for r in report.reasons)


# -------------------------------------------------------------------------------------- decide, margins


@pytest.mark.parametrize(
    "scores, tolerance, expected",
    [
        ([[0.1, 2.0, -1.0]], 0.0, [1]),
        ([[2.0, 5.0, 5.0], [7.0, 7.0, 1.0]], 0.0, [1, 0]),  # ties -> lowest index
        ([[1.0, 0.75, 0.0]], 0.25, [0]),  # margin == tolerance decides
        ([[1.0, 1.0003]], 1e-3, [-1]),  # margin below the tolerance abstains
        ([[3.0, 3.0, 3.0]], 0.0, [0]),
        ([[3.0, 3.0, 3.0]], 0.5, [-1]),
        ([[NAN, 1.0, 2.0], [1.0, 2.0, 3.0]], 0.0, [-1, 2]),
        ([[INF, 1.0]], 0.0, [-1]),
        ([[0.3], [-2.0]], 0.5, [0, 0]),
    ],
)
def test_decide_rules(scores, tolerance, expected):
    got = decide(torch.tensor(scores), tolerance)
    assert got.dtype == torch.long and got.tolist() == expected


def test_decide_empty_and_margins():
    assert decide(torch.zeros(0, 4)).shape == (0,)
    m = margins(torch.tensor([[3.0, 1.0, 2.0], [NAN, 0.0, 0.0]]))
    assert m[0] == 1.0 and math.isnan(m[1])
    assert margins(torch.tensor([[1.0]]))[0] == INF
    with pytest.raises(ValueError, match="tie_tolerance"):
        decide(torch.zeros(1, 2), -1.0)


def test_accuracy_ignores_unlabelled_and_counts_abstain_as_wrong():
    assert accuracy(torch.tensor([0, -1, 1]), torch.tensor([0, 1, -1])) == 0.5
    assert math.isnan(accuracy(torch.tensor([0]), torch.tensor([-1])))
    with pytest.raises(ValueError, match="one label per sample"):
        accuracy(torch.tensor([0, 1]), torch.tensor([0]))


# ----------------------------------------------------------------------------------------------- criteria


def test_criteria_are_immutable_and_fingerprinted():
    criteria = Criteria(atol=1e-2, rtol=1e-3, min_quality=0.8, application="router")
    with pytest.raises(dataclasses.FrozenInstanceError):
        criteria.atol = 1.0
    same = Criteria(atol=0.01, rtol=0.001, min_quality=0.8, application="router")
    assert criteria.fingerprint == same.fingerprint and len(criteria.fingerprint) == 12
    for change in (dict(atol=0.011), dict(rtol=0.0), dict(min_quality=0.81), dict(nonfinite="allow"),
                   dict(allowed_decision_changes=1), dict(application="other"),
                   dict(tie_rule="abstain", tie_tolerance=0.1)):
        assert dataclasses.replace(criteria, **change).fingerprint != criteria.fingerprint, change
    assert criteria.fingerprint in str(criteria) and criteria.fingerprint in criteria._repr_html_()


@pytest.mark.parametrize(
    "fields, words",
    [
        (dict(atol=-1.0, rtol=0.0), "atol"),
        (dict(atol=0.1, rtol=0.0, min_quality=80), "fraction"),
        (dict(atol=0.1, rtol=0.0, nonfinite="ignore"), "nonfinite"),
        (dict(atol=0.1, rtol=0.0, tie_rule="random"), "tie_rule"),
        (dict(atol=0.1, rtol=0.0, tie_tolerance=0.1), "lowest_index"),
        (dict(atol=0.1, rtol=0.0, tie_rule="abstain"), "tie_tolerance > 0"),
        (dict(atol=0.1, rtol=0.0, allowed_decision_changes=-1), "allowed_decision_changes"),
        (dict(atol=0.1, rtol=0.0, allowed_decision_changes=0.5), "allowed_decision_changes"),
    ],
)
def test_criteria_reject_bad_values(fields, words):
    with pytest.raises(ValueError, match=words):
        Criteria(**fields)


def test_judge_names_the_fingerprint_and_refuses_changed_criteria():
    criteria = Criteria(atol=0.1, rtol=0.0)
    recorded = criteria.fingerprint
    reference = torch.tensor([[2.0, 0.0]])
    report = judge(reference, reference, criteria, recorded_fingerprint=recorded)
    assert report.passed and report.fingerprint == recorded and recorded in report.headline()
    widened = dataclasses.replace(criteria, atol=10.0)
    with pytest.raises(CriteriaChangedError, match=recorded):
        judge(reference, reference, widened, recorded_fingerprint=recorded)
    with pytest.raises(TypeError, match="Criteria"):
        judge(reference, reference, {"atol": 0.1})


def test_judge_quality_for_a_rollback_trigger():
    criteria = Criteria(atol=0.1, rtol=0.0, min_quality=0.8)
    assert judge_quality(0.85, criteria)[0] and criteria.quality_ok(0.8)
    ok, message = judge_quality(0.7, criteria)
    assert not ok and "below the minimum" in message and criteria.fingerprint in message
    assert not judge_quality(NAN, criteria)[0]
    assert Criteria(atol=0.1, rtol=0.0).quality_ok(0.0)
    with pytest.raises(TypeError):
        judge_quality("high", criteria)


# ----------------------------------------------------------------------------------------------- baseline


def test_record_baseline_and_its_refusals():
    scores = torch.tensor([[2.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    baseline = record_baseline(scores, labels=[0, 1, -1], ids=["a", "b", "c"], categories=["x", "x", "y"])
    assert baseline.decisions.tolist() == [0, 1, 0] and baseline.quality == 1.0
    assert baseline.table["reference margin"].tolist() == [2.0, 1.0, 0.0]
    broken = scores.clone()
    broken[1, 0] = INF
    with pytest.raises(NonFiniteReferenceError, match="'b'"):
        record_baseline(broken, ids=["a", "b", "c"])
    with pytest.raises(ValueError, match="float32"):
        record_baseline(scores.half())
    with pytest.raises(ValueError, match="no rows"):
        record_baseline(torch.zeros(0, 2))


# --------------------------------------------------------------------------------------------- regression


def test_compare_regression_errors_and_extremes():
    reference = torch.tensor([100.0, 300.0, 200.0, 50.0])
    targets = torch.tensor([101.0, 299.0, 200.0, 50.0])
    same = compare_regression(reference, reference.clone(), targets, atol=0.5, rtol=0.0)
    assert same.passed and same.table["reference error"].tolist() == [-1.0, 1.0, 0.0, 0.0]
    moved = compare_regression(reference, torch.tensor([100.0, 300.0, 300.2, 50.0]), targets, atol=0.5, rtol=1e-3,
                               ids=["a", "b", "c", "d"])
    assert not moved.passed and any("tie between b, c" in r or "moved from b" in r for r in moved.reasons)
    tied = compare_regression(reference, torch.tensor([100.0, 300.0, 300.0, 50.0]), targets, atol=200.0, rtol=0.0,
                              ids=list("abcd"))
    assert not tied.passed and any("tie between b, c" in r for r in tied.reasons)
    nan = compare_regression(reference, torch.tensor([NAN, 300.0, 200.0, 50.0]), targets, atol=0.5, rtol=0.0)
    assert not nan.passed and nan.counts()["non-finite"] == 1
    with pytest.raises(ValueError, match="same number"):
        compare_regression(reference, reference[:3], targets, atol=0.5, rtol=0.0)
    with pytest.raises(ValueError, match="one value per sample"):
        compare_regression(torch.zeros(4, 2), torch.zeros(4, 2), targets, atol=0.5, rtol=0.0)


# --------------------------------------------------------------------------------- at risk: plot and widget


def flip_report():
    reference = torch.tensor([[1.0, 1.001, 0.0], [5.0, 0.0, 0.0], [1.0, 0.9, 0.0], [3.0, 0.0, 0.0]])
    trial = torch.tensor([[1.002, 1.0, 0.0], [5.1, 0.0, 0.0], [1.0, 0.9, 0.0], [NAN, 0.0, 0.0]])
    return compare(reference, trial, atol=0.01, rtol=0.0, categories=["b", "n", "b", "n"])


def test_at_risk_is_margin_below_twice_the_tolerance():
    report = flip_report()
    risky = at_risk(report.table, 0.05)  # margins 0.001 and 0.1: only the first is < 0.1
    assert list(risky.index) == [0]
    assert list(at_risk(report.table, 0.0505).index) == [0, 2]
    summary = risk_summary(report.table, 0.05)
    assert summary.loc["b", "at risk"] == 1 and summary.loc["b", "decision changed"] == 1
    assert summary.loc["b", "changed but not at risk"] == 0
    assert summary.loc["n", "changed but not at risk"] == 1  # the NaN row flipped with a huge margin
    with pytest.raises(TypeError):
        at_risk(pd.DataFrame({"x": [1]}), 0.1)


def test_margin_plot_and_risk_view_draw():
    import matplotlib.pyplot as plt

    report = flip_report()
    fig = margin_plot(report, tolerance=0.01)
    ax = fig.axes[0]
    assert ax.get_xscale() == "log" and ax.get_yscale() == "log"
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert any(label.startswith("decision changed") for label in labels)
    assert any(label.startswith("non-finite") for label in labels)
    plt.close(fig)
    fig, table = risk_view(report, 0.01)
    assert "outside tolerance" in table.columns and list(table.index) == [0]
    with pytest.raises(TypeError):
        margin_plot("report")


def test_tolerance_explorer_builds_and_reacts():
    import ipywidgets as widgets

    report = flip_report()
    box = tolerance_explorer({"a": report, "b": report}, tolerance=0.01)
    assert isinstance(box, widgets.VBox)
    dropdown, slider = box.children[0].children
    slider.value = 1.0  # moving the slider must not raise
    dropdown.value = "b"
    assert isinstance(tolerance_explorer(report), widgets.VBox)
    with pytest.raises(TypeError):
        tolerance_explorer({"a": "not a report"})


# ------------------------------------------------------------------------------------------ checker 04.1


def decide_solution():
    return solution(LESSON, "decide")


def test_decide_solution_passes():
    assert check_decide(decide_solution()).passed


def test_decide_untouched_exercise_is_not_done():
    assert check_decide(exercise(LESSON, "decide")).status == NOT_DONE


def _plain_argmax(scores, tie_tolerance):
    return scores.float().argmax(dim=1)


def _abstain_on_equal(scores, tie_tolerance):
    s = scores.float()
    finite = torch.isfinite(s).all(dim=1)
    s = torch.where(finite.unsqueeze(1), s, torch.zeros_like(s))
    margin = s.topk(2, dim=1).values if s.shape[1] > 1 else None
    m = margin[:, 0] - margin[:, 1] if margin is not None else torch.full((len(s),), INF)
    out = s.argmax(dim=1)
    return torch.where(~finite | (m <= tie_tolerance) & (m < INF), torch.full_like(out, -1), out)


def _last_index_ties(scores, tie_tolerance):
    flipped = scores.float().flip(dims=[1])
    return (scores.shape[1] - 1 - flipped.argmax(dim=1)).long() if scores.shape[0] else torch.zeros(0, dtype=torch.long)


def _margin_to_minimum(scores, tie_tolerance):
    s = scores.float()
    if s.shape[0] == 0:
        return torch.zeros(0, dtype=torch.long)
    finite = torch.isfinite(s).all(dim=1)
    s0 = torch.where(finite.unsqueeze(1), s, torch.zeros_like(s))
    margin = s0.max(dim=1).values - s0.min(dim=1).values
    margin = torch.where(torch.tensor(s.shape[1] == 1), torch.full_like(margin, INF), margin)
    out = s0.argmax(dim=1)
    return torch.where(~finite | (margin < tie_tolerance), torch.full_like(out, -1), out)


def _argmax_with_nan(scores, tie_tolerance):
    s = scores.float()
    if s.shape[0] == 0:
        return torch.zeros(0, dtype=torch.long)
    out = s.argmax(dim=1)
    if s.shape[1] > 1:
        top2 = torch.nan_to_num(s).topk(2, dim=1).values
        out = torch.where(top2[:, 0] - top2[:, 1] < tie_tolerance, torch.full_like(out, -1), out)
    return out


def _isnan_only(scores, tie_tolerance):
    s = scores.float()
    if s.shape[0] == 0:
        return torch.zeros(0, dtype=torch.long)
    bad = torch.isnan(s).any(dim=1)
    s0 = torch.nan_to_num(s, nan=0.0)
    out = s0.argmax(dim=1)
    margin = torch.full((len(s),), INF) if s.shape[1] == 1 else (lambda t: t[:, 0] - t[:, 1])(s0.topk(2, dim=1).values)
    return torch.where(bad | (margin < tie_tolerance), torch.full_like(out, -1), out)


def _no_single_class_case(scores, tie_tolerance):
    s = scores.float()
    finite = torch.isfinite(s).all(dim=1)
    s0 = torch.where(finite.unsqueeze(1), s, torch.zeros_like(s))
    top2 = s0.topk(2, dim=1).values  # fails when C == 1
    out = s0.argmax(dim=1)
    return torch.where(~finite | (top2[:, 0] - top2[:, 1] < tie_tolerance), torch.full_like(out, -1), out)


def _returns_float(scores, tie_tolerance):
    return decide_solution()(scores, tie_tolerance).float()


def _returns_list(scores, tie_tolerance):
    return decide_solution()(scores, tie_tolerance).tolist()


def _keeps_dim(scores, tie_tolerance):
    return decide_solution()(scores, tie_tolerance).unsqueeze(1)


def _crashes_on_empty(scores, tie_tolerance):
    rows = [decide_solution()(row.unsqueeze(0), tie_tolerance)[0] for row in scores]
    return torch.stack(rows)  # torch.stack([]) raises on an empty batch


def _in_place(scores, tie_tolerance):
    out = decide_solution()(scores, tie_tolerance)
    scores.nan_to_num_(nan=0.0, posinf=0.0, neginf=0.0)
    return out


@pytest.mark.parametrize(
    "wrong, words",
    [
        (_plain_argmax, "use tie_tolerance"),
        (_abstain_on_equal, "strictly below"),
        (_last_index_ties, "LOWEST index"),
        (_margin_to_minimum, "RUNNER-UP"),
        (_argmax_with_nan, "containing NaN must give -1"),
        (_isnan_only, "infinit"),
        (_no_single_class_case, "single class"),
        (_returns_float, "LongTensor"),
        (_returns_list, "LongTensor"),
        (_keeps_dim, "one decision per row"),
        (_crashes_on_empty, "empty batch"),
        (_in_place, "changed the scores tensor"),
    ],
)
def test_decide_checker_names_each_mistake(wrong, words):
    result = check_decide(wrong)
    assert not result.passed and result.status != NOT_DONE
    assert words in result.message, result.message


# ------------------------------------------------------------------------------------------ checker 04.2

GOOD = dict(atol=0.05, rtol=0.01, min_quality=0.8, nonfinite="fail", tie_rule="abstain", tie_tolerance=0.1,
            allowed_decision_changes=0)


def test_criteria_solution_passes_and_exercise_is_not_done():
    assert check_criteria(solution(LESSON, "make_criteria")).passed
    assert check_criteria(exercise(LESSON, "make_criteria")).status == NOT_DONE


@pytest.mark.parametrize(
    "change, words",
    [
        (dict(rtol=1.0), "rtol=1 means 100 %"),
        (dict(atol=0.01, rtol=0.05), "swapped"),
        (dict(rtol=0.0), "relative part"),
        (dict(atol=0.5), "absolute difference of 0.05"),
        (dict(min_quality=None), "min_quality=0.8"),
        (dict(min_quality=0.08), "min_quality=0.8"),
        (dict(nonfinite="allow"), "nonfinite='fail'"),
        (dict(tie_rule="lowest_index", tie_tolerance=0.0), "tie_rule='abstain'"),
        (dict(tie_tolerance=0.05), "MARGIN"),
        (dict(tie_tolerance=0.2), "tie_tolerance=0.1"),
        (dict(allowed_decision_changes=1), "means 0"),
    ],
)
def test_criteria_checker_names_each_mistake(change, words):
    fields = {**GOOD, **change}
    result = check_criteria(lambda: Criteria(**fields))
    assert not result.passed and words in result.message, result.message


def test_criteria_checker_other_mistakes():
    assert "not a dict" in check_criteria(lambda: dict(GOOD)).message
    percent = check_criteria(lambda: Criteria(**{**GOOD, "min_quality": 80}))
    assert not percent.passed and "fraction" in percent.message


# ------------------------------------------------------------------------------------------ checker 04.3


def judge_solution():
    return solution(LESSON, "judge_trial")


def test_judge_trial_solution_passes_and_exercise_is_not_done():
    assert check_judge_trial(judge_solution()).passed
    assert check_judge_trial(exercise(LESSON, "judge_trial")).status == NOT_DONE


def _verdict(finite, numeric, decision, quality):
    return {"finite": finite, "numeric": numeric, "decision": decision, "quality": quality,
            "passed": finite and numeric and decision and quality}


def _parts(reference, trial, labels, criteria, *, strict=False, trial_rtol=False, no_abs=False, nan_passes=False,
           ignore_policy=False, argmax=False, all_labels=False, skip_abstain=False, quality_default=False,
           ignore_decisions=False, ignore_allowed=False):
    trial = trial.float()
    finite = bool(torch.isfinite(trial).all()) or (criteria.nonfinite == "allow" and not ignore_policy)
    base = trial.abs() if trial_rtol else reference.abs()
    allowed = criteria.atol + criteria.rtol * base
    diff = (trial - reference) if no_abs else (trial - reference).abs()
    if nan_passes:
        numeric = not bool((diff > allowed).any())
    else:
        numeric = bool((diff < allowed).all() if strict else (diff <= allowed).all())
    if argmax:
        rd, td = reference.argmax(dim=1), torch.nan_to_num(trial, nan=-1e30).argmax(dim=1)
    else:
        rd, td = decide(reference, criteria.tie_tolerance), decide(trial, criteria.tie_tolerance)
    changed = int((rd != td).sum())
    decision = True if ignore_decisions else changed <= (0 if ignore_allowed else criteria.allowed_decision_changes)
    if criteria.min_quality is None:
        quality = not quality_default
    else:
        keep = torch.ones_like(labels, dtype=torch.bool) if all_labels else labels >= 0
        if skip_abstain:
            keep = keep & (td != -1)
        acc = float((td[keep] == labels[keep]).float().mean()) if keep.any() else 1.0
        quality = acc >= criteria.min_quality
    return _verdict(finite, numeric, decision, bool(quality))


def _wrong_judge(**mistake):
    def judge_trial(reference, trial, labels, criteria):
        return _parts(reference, trial, labels, criteria, **mistake)

    return judge_trial


def _any_passes(reference, trial, labels, criteria):
    verdict = _parts(reference, trial, labels, criteria)
    verdict["passed"] = verdict["finite"] or verdict["numeric"] or verdict["decision"]
    return verdict


@pytest.mark.parametrize(
    "wrong, words",
    [
        (_wrong_judge(ignore_decisions=True), "A decision change must fail 'decision'"),
        (_wrong_judge(ignore_allowed=True), "allowed_decision_changes=1"),
        (_wrong_judge(strict=True), "use <="),
        (_wrong_judge(trial_rtol=True), "not |trial|"),
        (_wrong_judge(no_abs=True), "absolute difference"),
        (_wrong_judge(nan_passes=True), "NaN compares False"),
        (_wrong_judge(ignore_policy=True), "nonfinite='allow'"),
        (_wrong_judge(argmax=True), "criteria.tie_tolerance"),
        (_wrong_judge(all_labels=True), "Label -1"),
        (_wrong_judge(skip_abstain=True), "abstention (-1) is not the right answer"),
        (_wrong_judge(quality_default=True), "'quality' is True when criteria.min_quality is None"),
        (_any_passes, "'passed' must be True only when all four"),
    ],
)
def test_judge_trial_checker_names_each_mistake(wrong, words):
    result = check_judge_trial(wrong)
    assert not result.passed and result.status != NOT_DONE
    assert words in result.message, result.message


def test_judge_trial_checker_accepts_numpy_and_tensor_bools():
    good = judge_solution()

    def numpy_bools(*args):
        return {k: np.bool_(v) for k, v in good(*args).items()}

    def tensor_bools(*args):
        return {k: torch.tensor(v) for k, v in good(*args).items()}

    assert check_judge_trial(numpy_bools).passed
    assert check_judge_trial(tensor_bools).passed


# ------------------------------------------------------------------------------------------ junk for all

JUNK = [None, "decide", 42, lambda: None, lambda *a: None, lambda *a: "yes", lambda *a: [1, 2],
        lambda *a: torch.tensor([NAN]), lambda *a: 1 / 0, lambda *a: {"finite": None}]


@pytest.mark.parametrize("check", [check_decide, check_criteria, check_judge_trial])
@pytest.mark.parametrize("junk", JUNK, ids=lambda j: repr(j)[:20])
def test_checkers_never_raise_on_junk(check, junk):
    result = check(junk)
    assert not result.passed and result.message
    assert result.status in ("failed", NOT_DONE)


def test_checks_are_fast():
    import time

    for check, fn in ((check_decide, decide_solution()), (check_judge_trial, judge_solution()),
                      (check_criteria, solution(LESSON, "make_criteria"))):
        times = []
        for _ in range(2):  # the better of two runs: a shared CI machine can stall one of them
            start = time.perf_counter()
            assert check(fn).passed
            times.append(time.perf_counter() - start)
        assert min(times) < 2.0, (check.__name__, times)


def test_report_type():
    assert isinstance(compare(torch.zeros(1, 2), torch.zeros(1, 2), atol=0.0, rtol=0.0), Report)
