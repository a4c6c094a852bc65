"""Lesson 04's helpers: amp_lessons.l04_baseline_and_decision_boundary.validation (compare, judge, decide, baseline, regression),
amp_lessons.l04_baseline_and_decision_boundary.criteria and amp_lessons.l04_baseline_and_decision_boundary.risk (samples at risk: table, plot, widget).
The checkers are tested in tests/checks/test_l04_validation.py."""

import dataclasses
import math

import numpy as np
import pandas as pd
import pytest
import torch

from amp_lessons.l04_baseline_and_decision_boundary import criteria as criteria_module
from amp_lessons.l04_baseline_and_decision_boundary.criteria import Criteria
from amp_lessons.l04_baseline_and_decision_boundary.risk import (
    at_risk,
    margin_plot,
    risk_summary,
    risk_view,
    tolerance_explorer,
)
from amp_lessons.l04_baseline_and_decision_boundary.validation import (
    CriteriaChangedError,
    NonFiniteReferenceError,
    Report,
    accuracy,
    compare,
    compare_regression,
    decide,
    judge,
    judge_quality,
    margins,
    record_baseline,
)

NAN, INF = math.nan, math.inf

REQUIRED_COLUMNS = [
    "finite",
    "max abs diff",
    "within tolerance",
    "reference decision",
    "trial decision",
    "decision changed",
    "reference margin",
]


def five_rows():
    """Row 0 fine, 1 NaN, 2 out of tolerance (same decision), 3 within tolerance but flipped, 4 +inf."""
    reference = torch.tensor(
        [[2.0, 1.0, 0.0], [0.0, 2.0, 1.0], [3.0, 0.0, 0.0], [1.0, 1.0003, 0.0], [0.0, 0.0, 5.0]]
    )
    trial = torch.tensor(
        [[2.001, 1.0, 0.0], [NAN, 2.0, 1.0], [3.5, 0.0, 0.0], [1.0003, 1.0, 0.0], [0.0, 0.0, INF]]
    )
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
    # non-finite fails
    assert not compare(reference, nan, atol=1e9, rtol=0.0, allowed_decision_changes=5).passed
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
    # exactly at the limit
    assert compare(reference, torch.tensor([[2.5, 0.0]]), atol=0.25, rtol=0.125).passed
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
    assert report.passed
    assert report.table["reference decision"][0] == -1 and report.table["trial decision"][0] == -1


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


@pytest.mark.parametrize(
    "atol, error", [(-1.0, ValueError), (NAN, ValueError), ("0.1", TypeError), (None, TypeError)]
)
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
    assert list(rows.index) == [
        "finite outputs",
        "numeric difference",
        "application decision",
        "quality on the fixed set",
    ]
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
    for change in (
        dict(atol=0.011),
        dict(rtol=0.0),
        dict(min_quality=0.81),
        dict(nonfinite="allow"),
        dict(allowed_decision_changes=1),
        dict(application="other"),
        dict(tie_rule="abstain", tie_tolerance=0.1),
    ):
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


def test_compare_takes_loose_tolerances_and_judge_takes_criteria_never_both():
    reference, trial = five_rows()
    criteria = Criteria(atol=0.01, rtol=0.0, nonfinite="allow", allowed_decision_changes=2)
    with pytest.raises(TypeError, match=r"judge\(reference, trial, criteria"):
        compare(reference, trial, atol=1.0, rtol=1.0, criteria=criteria)
    loose = compare(reference, trial, atol=0.01, rtol=0.0, nonfinite="allow", allowed_decision_changes=2)
    strict = judge(reference, trial, criteria)
    assert loose.fingerprint == strict.fingerprint == criteria.fingerprint
    assert loose.table.equals(strict.table) and loose.summary.equals(strict.summary)
    assert loose.reasons == strict.reasons and loose.passed == strict.passed


def test_criteria_live_in_their_own_module_and_validation_re_exports_them():
    assert Criteria is criteria_module.Criteria and judge_quality is criteria_module.judge_quality
    assert criteria_module.validate_tolerance(1, "atol") == 1.0
    with pytest.raises(TypeError, match="atol must be a number"):
        criteria_module.validate_tolerance(True, "atol")


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
    moved = compare_regression(
        reference,
        torch.tensor([100.0, 300.0, 300.2, 50.0]),
        targets,
        atol=0.5,
        rtol=1e-3,
        ids=["a", "b", "c", "d"],
    )
    assert not moved.passed and any("tie between b, c" in r or "moved from b" in r for r in moved.reasons)
    tied = compare_regression(
        reference, torch.tensor([100.0, 300.0, 300.0, 50.0]), targets, atol=200.0, rtol=0.0, ids=list("abcd")
    )
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


def test_report_type():
    assert isinstance(compare(torch.zeros(1, 2), torch.zeros(1, 2), atol=0.0, rtol=0.0), Report)


# -------------------------------------------------------------------------------- opened in the lesson


def test_notebook_two_level_judge_agrees_with_compare():
    """Lesson 04 shows the two levels as a plain function, two_level_judge(); on the same inputs (NaN, inf,
    float16 and bfloat16 trials, exact ties, tie tolerances) its table equals compare()'s, column by
    column."""
    from notebook_code import load_function

    two_level_judge = load_function("notebooks/04_baseline_and_decision_boundary.ipynb", "two_level_judge")
    generator = torch.Generator().manual_seed(15)
    for case in range(60):
        reference = torch.round(torch.randn(12, 4, generator=generator) * 8) / 8
        trial = reference + torch.randn(12, 4, generator=generator) / 16
        trial[case % 12, case % 4] = (NAN, INF, -INF, 0.0)[case % 4]
        trial = trial.to((torch.float32, torch.float16, torch.bfloat16)[case % 3])
        atol, rtol, tie = (0.05, 0.0, 0.0), (0.01, 0.01, 0.25), (0.1, 0.05, 0.5)
        tolerances = dict(atol=atol[case % 3], rtol=rtol[case % 3], tie_tolerance=tie[case % 3])
        mine = two_level_judge(reference, trial, **tolerances)
        package = compare(reference, trial, **tolerances).table
        pd.testing.assert_frame_equal(mine, package[list(mine.columns)])


def test_baseline_records_whether_fp32_was_fp32():
    """The baseline records the switches of the precision API this torch has (never both APIs)."""
    from amp_lessons.core.environment import (
        FP32_PRECISION_OPS,
        LEGACY_FP32_SWITCHES,
        float32_matmul_settings,
        fp32_precision_backend,
        fp32_precision_name,
        has_fp32_precision_api,
    )

    baseline = record_baseline(torch.tensor([[2.0, 0.0]]))
    assert baseline.float32_settings == float32_matmul_settings()
    if not has_fp32_precision_api():  # torch < 2.9: the legacy switches
        assert set(baseline.float32_settings) == set(LEGACY_FP32_SWITCHES)
        previous = torch.get_float32_matmul_precision()
        try:
            torch.set_float32_matmul_precision("high")
            assert (
                record_baseline(torch.tensor([[2.0, 0.0]])).float32_settings[
                    "torch.get_float32_matmul_precision()"
                ]
                == "high"
            )
        finally:
            torch.set_float32_matmul_precision(previous)
        return
    expected = {fp32_precision_name(path) for path, _ in FP32_PRECISION_OPS if fp32_precision_backend(path)}
    assert set(baseline.float32_settings) == expected and not set(LEGACY_FP32_SWITCHES) & expected
    matmul = torch.backends.cuda.matmul
    previous = matmul.fp32_precision
    try:
        matmul.fp32_precision = "tf32"
        recorded = record_baseline(torch.tensor([[2.0, 0.0]])).float32_settings
        assert recorded["torch.backends.cuda.matmul.fp32_precision"] == "tf32"
    finally:
        matmul.fp32_precision = previous


def test_short_table_shows_at_most_ten_rows_and_keeps_the_rest():
    from amp_lessons.core.display import short_table

    frame = pd.DataFrame({"x": range(25)})
    shown = short_table(frame, title="every row")
    assert repr(shown).count("\n") == 11 and "15 more row(s)" in repr(shown)
    assert "<details>" in shown._repr_html_() and shown._repr_html_().count("<tr") == 11 + 26
    assert shown.frame is frame and "<details>" not in short_table(frame.head(4))._repr_html_()
    assert repr(short_table(frame, rows=0, title="all")) == "(all: .frame holds all 25)"
    with pytest.raises(TypeError):
        short_table([1, 2])
