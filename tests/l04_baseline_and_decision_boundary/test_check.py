"""Lesson 04 checkers: the solutions pass, the untouched exercises are "not done", every known wrong answer
is rejected with a message that names its mistake, each rule of the tables recognises its own case, and junk
never raises."""

import math

import numpy as np
import pytest
import torch
from notebook_code import exercise, solution

from amp_lessons.checks.harness import NOT_DONE
from amp_lessons.checks.mistakes import first_mistake
from amp_lessons.l04_baseline_and_decision_boundary import check as l04
from amp_lessons.l04_baseline_and_decision_boundary.check import (
    check_criteria,
    check_decide,
    check_judge_trial,
)
from amp_lessons.l04_baseline_and_decision_boundary.criteria import Criteria
from amp_lessons.l04_baseline_and_decision_boundary.validation import decide

LESSON = "04_baseline_and_decision_boundary.ipynb"
NAN, INF = math.nan, math.inf


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
    if not scores.shape[0]:
        return torch.zeros(0, dtype=torch.long)
    return (scores.shape[1] - 1 - flipped.argmax(dim=1)).long()


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
    if s.shape[1] == 1:
        margin = torch.full((len(s),), INF)
    else:
        top2 = s0.topk(2, dim=1).values
        margin = top2[:, 0] - top2[:, 1]
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

GOOD = dict(
    atol=0.05,
    rtol=0.01,
    min_quality=0.8,
    nonfinite="fail",
    tie_rule="abstain",
    tie_tolerance=0.1,
    allowed_decision_changes=0,
)


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
    return {
        "finite": finite,
        "numeric": numeric,
        "decision": decision,
        "quality": quality,
        "passed": finite and numeric and decision and quality,
    }


def _parts(
    reference,
    trial,
    labels,
    criteria,
    *,
    strict=False,
    trial_rtol=False,
    no_abs=False,
    nan_passes=False,
    ignore_policy=False,
    argmax=False,
    all_labels=False,
    skip_abstain=False,
    quality_default=False,
    ignore_decisions=False,
    ignore_allowed=False,
):
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
    allowed_changes = 0 if ignore_allowed else criteria.allowed_decision_changes
    decision = True if ignore_decisions else changed <= allowed_changes
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

JUNK = [
    None,
    "decide",
    42,
    lambda: None,
    lambda *a: None,
    lambda *a: "yes",
    lambda *a: [1, 2],
    lambda *a: torch.tensor([NAN]),
    lambda *a: 1 / 0,
    lambda *a: {"finite": None},
]


@pytest.mark.parametrize("check", [check_decide, check_criteria, check_judge_trial])
@pytest.mark.parametrize("junk", JUNK, ids=lambda j: repr(j)[:20])
def test_checkers_never_raise_on_junk(check, junk):
    result = check(junk)
    assert not result.passed and result.message
    assert result.status in ("failed", NOT_DONE)


def test_checks_are_fast():
    import time

    for check, fn in (
        (check_decide, decide_solution()),
        (check_judge_trial, judge_solution()),
        (check_criteria, solution(LESSON, "make_criteria")),
    ):
        times = []
        for _ in range(2):  # the better of two runs: a shared CI machine can stall one of them
            start = time.perf_counter()
            assert check(fn).passed
            times.append(time.perf_counter() - start)
        assert min(times) < 2.0, (check.__name__, times)


# ------------------------------------------------------------------------------- the rule tables, one by one


def decide_answer(
    got, *, scores=((2.0, 5.0, 5.0),), tolerance=0.0, expected=(1,), changed_input=False, probe_got=None
):
    """``probe_got``: the change of the scores whose decisions on the probes the learner gave (None: none)."""
    probes = (
        ()
        if probe_got is None
        else tuple(l04._decide_changed(probe_got, s, t, True) for s, t, _, _ in l04._DECIDE_PROBES)
    )
    return l04.DecideAnswer(
        torch.tensor(scores),
        tolerance,
        list(expected),
        list(got),
        "the case's message",
        changed_input,
        probes,
    )


DECIDE_RULE_CASES = {
    "changed the scores in place": decide_answer([1], changed_input=True),
    "abstains when the margin equals tie_tolerance": decide_answer(
        [-1], scores=((1.0, 0.75, 0.0),), tolerance=0.25, expected=(0,)
    ),
    "decided on rounded scores": decide_answer(
        [0], scores=((1.0 - 2**-20, 0.0),), tolerance=1.0, expected=(-1,), probe_got=l04._rounded(2)
    ),
    "decided on probabilities": decide_answer(
        [-1],
        scores=((1.0, 0.75, 0.0),),
        tolerance=0.25,
        expected=(0,),
        probe_got=lambda s: torch.softmax(s, dim=1),
    ),
    "decided on rescaled rows": decide_answer(
        [1, 0, 2],
        scores=((0.1, 2.0, -1.0, 0.5), (3.0, -2.0, 1.0, 0.0), (-1.0, -0.5, -3.0, -0.75)),
        expected=(1, 0, 1),
        probe_got=lambda s: s / s.sum(dim=1, keepdim=True),
    ),
    "the mistake this case is built to catch": decide_answer([2]),
}


@pytest.mark.parametrize("name", DECIDE_RULE_CASES)
def test_each_decide_rule_recognises_its_case(name):
    answer = DECIDE_RULE_CASES[name]
    rule = first_mistake(l04.DECIDE_MISTAKES, answer)
    assert rule is not None and rule.name == name
    assert rule.text(answer)
    assert first_mistake(l04.DECIDE_MISTAKES, decide_answer([1])) is None
    assert set(DECIDE_RULE_CASES) == {rule.name for rule in l04.DECIDE_MISTAKES}


CRITERIA_RULE_CASES = {
    "returned None": None,
    "not a Criteria": dict(GOOD),
    "atol and rtol swapped": dict(atol=0.01, rtol=0.05),
    "rtol as a percentage": dict(rtol=1.0),
    "no relative part": dict(rtol=0.0),
    "another rtol": dict(rtol=0.02),
    "another atol": dict(atol=0.5),
    "no minimum quality": dict(min_quality=None),
    "another minimum quality": dict(min_quality=0.08),
    "non-finite outputs allowed": dict(nonfinite="allow"),
    "ties to the lowest index": dict(tie_rule="lowest_index", tie_tolerance=0.0),
    "tie_tolerance set to atol": dict(tie_tolerance=0.05),
    "another tie_tolerance": dict(tie_tolerance=0.2),
    "decision changes allowed": dict(allowed_decision_changes=1),
}


@pytest.mark.parametrize("name", CRITERIA_RULE_CASES)
def test_each_criteria_rule_recognises_its_case(name):
    change = CRITERIA_RULE_CASES[name]
    got = change if name in ("returned None", "not a Criteria") else Criteria(**{**GOOD, **change})
    rule = first_mistake(l04.CRITERIA_MISTAKES, got)
    assert rule is not None and rule.name == name
    assert rule.text(got)
    assert first_mistake(l04.CRITERIA_MISTAKES, Criteria(**GOOD)) is None
    assert set(CRITERIA_RULE_CASES) == {rule.name for rule in l04.CRITERIA_MISTAKES}


def judge_answer(target="decision", **got):
    want = {"finite": True, "numeric": True, "decision": True, "quality": True, "passed": True}
    return l04.JudgeAnswer(
        "a case",
        target,
        "the case's own message",
        torch.zeros(1, 2),
        torch.zeros(1, 2),
        [0],
        Criteria(atol=0.01, rtol=0.0),
        {**want, **got},
        want,
    )


JUDGE_RULE_CASES = {
    "the level this case is about": (judge_answer("numeric", numeric=False, passed=False), "own message"),
    "'finite' wrong": (judge_answer(finite=False, quality=False), "'finite' is True when"),
    "'numeric' wrong": (judge_answer(numeric=False), "'numeric' is True when"),
    "'decision' wrong": (judge_answer("quality", decision=False), "'decision' is True when"),
    "'quality' wrong": (judge_answer(quality=False), "'quality' is True when"),
    "'passed' is not all four levels": (judge_answer(passed=False), "only when all four levels pass"),
}


@pytest.mark.parametrize("name", JUDGE_RULE_CASES)
def test_each_judge_rule_recognises_its_case(name):
    answer, words = JUDGE_RULE_CASES[name]
    rule = first_mistake(l04.JUDGE_MISTAKES, answer)
    assert rule is not None and rule.name == name
    assert words in rule.text(answer) and "Case 'a case'" in rule.text(answer)
    assert first_mistake(l04.JUDGE_MISTAKES, judge_answer()) is None
    assert set(JUDGE_RULE_CASES) == {rule.name for rule in l04.JUDGE_MISTAKES}


@pytest.mark.parametrize("table", ["DECIDE_MISTAKES", "CRITERIA_MISTAKES", "JUDGE_MISTAKES"])
def test_each_rule_table_is_a_list_of_named_rules(table):
    """Each rule is a module-level name (a test can call it on its own), so the table reads as a list of names."""
    named = {id(value) for name, value in vars(l04).items() if not name.isupper()}
    assert all(id(rule) in named for rule in getattr(l04, table))


# ------------------------------------------- correct answers written differently, and more natural mistakes


def _decide_sorted(scores, tie_tolerance):
    s = scores.double()  # float64: exact for every input dtype
    if s.shape[0] == 0:
        return torch.empty(0, dtype=torch.long)
    finite = torch.isfinite(s).all(dim=1)
    s = torch.where(finite.unsqueeze(1), s, torch.zeros_like(s))
    ordered = torch.sort(s, dim=1, descending=True, stable=True).values
    margin = ordered[:, 0] - ordered[:, 1] if s.shape[1] > 1 else torch.full((s.shape[0],), INF)
    decision = s.argmax(dim=1)
    decision[~finite | (margin < tie_tolerance)] = -1
    return decision


def _decide_loop(scores, tie_tolerance):
    out = []
    for row in scores.float().tolist():  # a Python loop over rows: slow in general, fine for a few rows
        if not all(math.isfinite(v) for v in row):
            out.append(-1)
            continue
        best = max(range(len(row)), key=lambda i: (row[i], -i))
        rest = sorted(row, reverse=True)
        margin = rest[0] - rest[1] if len(row) > 1 else INF
        out.append(-1 if margin < tie_tolerance else best)
    return torch.tensor(out, dtype=torch.long)


def _decide_numpy(scores, tie_tolerance):
    s = scores.float().numpy()
    if s.shape[0] == 0:
        return torch.zeros(0, dtype=torch.long)
    finite = np.isfinite(s).all(axis=1)
    s = np.where(finite[:, None], s, 0.0)
    top = np.sort(s, axis=1)[:, ::-1]
    margin = top[:, 0] - top[:, 1] if s.shape[1] > 1 else np.full(s.shape[0], np.inf)
    decision = np.where(~finite | (margin < tie_tolerance), -1, np.argmax(s, axis=1))
    return torch.from_numpy(decision.astype(np.int64))


def _decide_masked_max(scores, tie_tolerance):
    s = scores.float()
    n, c = s.shape
    finite = torch.isfinite(s).all(dim=1)
    s = torch.where(finite.unsqueeze(1), s, torch.zeros_like(s))
    top, winner = s.max(dim=1) if n else (torch.zeros(0), torch.zeros(0, dtype=torch.long))
    others = s.scatter(1, winner.unsqueeze(1), -INF) if c > 1 else torch.full_like(s, -INF)
    runner_up = others.max(dim=1).values if n else torch.zeros(0)
    abstain = ~finite | (top < runner_up + tie_tolerance)  # margin < tolerance, written as a sum
    return torch.where(abstain, -1, winner)


@pytest.mark.parametrize("variant", [_decide_sorted, _decide_loop, _decide_numpy, _decide_masked_max])
def test_decide_checker_accepts_correct_variants(variant):
    result = check_decide(variant)
    assert result.passed, result.message


def _decide_with(margin_rule=None, tie_rule=None, keep_dtype=False):
    """The solution with one natural change to how the margin or the winner is taken."""

    def decide_fn(scores, tie_tolerance):
        s = scores if keep_dtype else scores.float()
        n, c = s.shape
        if n == 0:
            return torch.zeros(0, dtype=torch.long)
        finite = torch.isfinite(s).all(dim=1)
        s = torch.where(finite.unsqueeze(1), s, torch.zeros_like(s))
        winner = s.argmax(dim=1) if tie_rule is None else tie_rule(s)
        top2 = s.topk(2, dim=1).values if c > 1 else None
        margin = top2[:, 0] - top2[:, 1] if c > 1 else torch.full((n,), INF)
        abstain = margin < tie_tolerance if margin_rule is None else margin_rule(margin, tie_tolerance)
        return torch.where(~finite | abstain, torch.full_like(winner, -1), winner)

    return decide_fn


def _isclose_tie(s):
    near_top = torch.isclose(s, s.max(dim=1, keepdim=True).values)  # "equal enough" counts as a tie
    return near_top.float().argmax(dim=1)


def _typo_decide(scores, tie_tolerance):
    finite = torch.isfinte(scores).all(dim=1)  # noqa: F841  (a typo: isfinte)


@pytest.mark.parametrize(
    "wrong, words",
    [
        (_decide_with(margin_rule=lambda m, t: torch.round(m, decimals=3) < t), "rounding it"),
        (
            _decide_with(margin_rule=lambda m, t: (m < t) & ~torch.isclose(m, torch.full_like(m, t))),
            "torch.isclose (and numpy.isclose) call the two numbers equal",
        ),
        (_decide_with(tie_rule=_isclose_tie), "are not a tie"),
        (_decide_with(keep_dtype=True), "Computed in float16"),
    ],
)
def test_decide_checker_names_new_mistakes(wrong, words):
    result = check_decide(wrong)
    assert not result.passed and result.status != NOT_DONE
    assert words in result.message, result.message


def _decide_on(change, finite_first=False):
    """The solution applied to changed scores: rounded, turned into probabilities, or rescaled per row."""

    def decide_fn(scores, tie_tolerance):
        s = scores.float()
        if not finite_first or s.shape[0] == 0:
            return decide_solution()(change(s), tie_tolerance)
        finite = torch.isfinite(s).all(dim=1)
        decided = decide_solution()(
            change(torch.where(finite.unsqueeze(1), s, torch.zeros_like(s))), tie_tolerance
        )
        return torch.where(finite, decided, -1)

    return decide_fn


def _min_max(s):
    low, high = s.min(dim=1, keepdim=True).values, s.max(dim=1, keepdim=True).values
    return (s - low) / (high - low)


@pytest.mark.parametrize(
    "wrong, words",
    [
        # each was named as another mistake before the probes: isclose, `<=`, argmax, "use tie_tolerance?"
        (_decide_on(lambda s: torch.round(s, decimals=2)), "rounded to 2 decimals"),
        (_decide_on(lambda s: torch.round(s, decimals=1)), "rounded to 1 decimal "),
        (_decide_on(torch.round, finite_first=True), "rounded to whole numbers"),
        (_decide_on(lambda s: s.softmax(dim=1)), "torch.softmax(scores, dim=1)"),
        (_decide_on(lambda s: s.softmax(dim=1), finite_first=True), "torch.softmax"),
        (_decide_on(torch.sigmoid), "torch.sigmoid(scores)"),
        (_decide_on(lambda s: torch.nn.functional.normalize(s, dim=1)), "divided by its length"),
        (_decide_on(lambda s: s / s.sum(dim=1, keepdim=True)), "divided by its sum"),
        (_decide_on(_min_max, finite_first=True), "min-max"),
        (
            _decide_on(lambda s: (s - s.mean(dim=1, keepdim=True)) / s.std(dim=1, keepdim=True)),
            "standardised",
        ),
    ],
)
def test_decide_checker_names_changed_scores(wrong, words):
    result = check_decide(wrong)
    assert not result.passed and result.status != NOT_DONE
    assert words in result.message and "not to the scores you were given" in result.message, result.message
    assert result.message.count("\nFor scores") == 2, result.message  # the failing case, then a probe


def test_probes_tell_changed_scores_from_the_rule_and_its_near_misses():
    """Each change decides some probe wrongly, so a learner right on every probe is never taken for one; the
    rule, `<=` and torch.isclose agree on every probe, so the probes never blame those mistakes."""
    changes = l04.ROUNDINGS + l04.PROBABILITIES + l04.RESCALINGS
    for words, change in changes:
        for finite_first in (True, False):
            assert any(
                l04._decide_changed(change, s, t, finite_first) != e for s, t, e, _ in l04._DECIDE_PROBES
            ), words
    near_misses = [
        _abstain_on_equal,
        _decide_with(margin_rule=lambda m, t: (m < t) & ~torch.isclose(m, torch.full_like(m, t))),
        _decide_with(tie_rule=_isclose_tie),
    ]
    for fn in [decide_solution(), *near_misses]:
        for scores, tolerance, expected, _ in l04._DECIDE_PROBES:
            assert fn(scores.clone(), tolerance).tolist() == expected


def test_decide_checker_reports_an_error_first():
    result = check_decide(_typo_decide)
    assert result.message.startswith("`_typo_decide` raised an error: AttributeError"), result.message
    assert "isfinte" in result.message and "\n" not in result.message  # the error, and nothing unrelated
    single = check_decide(_no_single_class_case)  # raises only on one case: the error, then that case
    first, rest = single.message.split("\n", 1)
    assert "raised an error" in first and "It raised only on this case" in rest and "single class" in rest


def _judge_variant(*, allclose=False, double=False, package_accuracy=False):
    from amp_lessons.l04_baseline_and_decision_boundary.validation import accuracy

    def judge_trial(reference, trial, labels, criteria):
        dtype = torch.float64 if double else torch.float32
        ref, tri = reference.to(dtype), trial.to(dtype)
        finite = bool(torch.isfinite(tri).all()) or criteria.nonfinite == "allow"
        if allclose:
            numeric = torch.allclose(tri, ref, rtol=criteria.rtol, atol=criteria.atol)
        else:
            numeric = bool(torch.isclose(tri, ref, rtol=criteria.rtol, atol=criteria.atol).all())
        ref_d, tri_d = decide(ref, criteria.tie_tolerance), decide(tri, criteria.tie_tolerance)
        decision = int((ref_d != tri_d).sum()) <= criteria.allowed_decision_changes
        quality = True
        if criteria.min_quality is not None:
            if package_accuracy:
                value = accuracy(tri_d, labels)
            else:
                keep = labels >= 0
                value = float((tri_d[keep] == labels[keep]).double().mean()) if keep.any() else NAN
            quality = value >= criteria.min_quality
        verdict = {"finite": finite, "numeric": numeric, "decision": decision, "quality": bool(quality)}
        return {**verdict, "passed": all(verdict.values())}

    return judge_trial


@pytest.mark.parametrize(
    "variant",
    [_judge_variant(allclose=True), _judge_variant(double=True), _judge_variant(package_accuracy=True)],
)
def test_judge_trial_checker_accepts_correct_variants(variant):
    result = check_judge_trial(variant)
    assert result.passed, result.message


def _judge_mistake(kind):
    good = judge_solution()

    def judge_trial(reference, trial, labels, criteria):
        if kind == "reference cast down":  # e.g. to please torch.allclose, which refuses mixed dtypes
            return good(reference.to(trial.dtype), trial, labels, criteria)
        verdict = good(reference, trial, labels, criteria)
        if criteria.min_quality is not None:
            ref_d, tri_d = decide(reference, criteria.tie_tolerance), decide(trial, criteria.tie_tolerance)
            keep = labels >= 0
            if kind == "quality from the reference":
                value = float((ref_d[keep] == labels[keep]).float().mean())
            else:  # "agreement": how often the trial agrees with the reference
                value = float((tri_d == ref_d).float().mean())
            verdict["quality"] = value >= criteria.min_quality
            verdict["passed"] = all(verdict[k] for k in ("finite", "numeric", "decision", "quality"))
        return verdict

    return judge_trial


def _judge_numpy(reference, trial, labels, criteria):
    return judge_solution()(reference, torch.from_numpy(trial.numpy()), labels, criteria)  # no bfloat16


def _judge_mixed_allclose(reference, trial, labels, criteria):
    verdict = judge_solution()(reference, trial, labels, criteria)
    verdict["numeric"] = torch.allclose(trial, reference, atol=criteria.atol, rtol=criteria.rtol)
    return verdict


def _typo_judge(reference, trial, labels, criteria):
    return {"finite": bool(torch.isfinte(trial).all())}


@pytest.mark.parametrize(
    "wrong, words",
    [
        (_judge_mistake("quality from the reference"), "'quality' is the TRIAL's accuracy"),
        (_judge_mistake("agreement"), "not agreement with the reference"),
        (_judge_mistake("reference cast down"), "Casting the reference down"),
        (_judge_numpy, "NumPy has no bfloat16"),
        (_judge_mixed_allclose, "convert the TRIAL up"),
    ],
)
def test_judge_trial_checker_names_new_mistakes(wrong, words):
    result = check_judge_trial(wrong)
    assert not result.passed and result.status != NOT_DONE
    assert words in result.message, result.message


def test_judge_trial_checker_reports_an_error_first():
    result = check_judge_trial(_typo_judge)
    first = result.message.split("\n")[0]
    assert first.startswith("`_typo_judge` raised an error: AttributeError") and "isfinte" in first
    assert "\n" not in result.message and "Case '" not in result.message
    mixed = check_judge_trial(_judge_mixed_allclose).message
    assert mixed.startswith("`_judge_mixed_allclose` raised an error") and "'a float16 trial'" in mixed


@pytest.mark.parametrize(
    "variant",
    [
        lambda: Criteria(
            **{**GOOD, "rtol": 1 / 100, "min_quality": 80 / 100}
        ),  # fractions written as divisions
        lambda: Criteria(
            tie_tolerance=1e-1,
            tie_rule="abstain",
            allowed_decision_changes=0,
            nonfinite="fail",
            min_quality=0.80,
            rtol=0.01,
            atol=5e-2,
            application="tickets -> one of three teams",
        ),
        # the defaults, spelled out
        lambda: Criteria(atol=0.05, rtol=0.01, min_quality=0.8, tie_rule="abstain", tie_tolerance=0.1),
    ],
)
def test_criteria_checker_accepts_correct_variants(variant):
    result = check_criteria(variant)
    assert result.passed, result.message


@pytest.mark.parametrize(
    "variant",
    [
        lambda: Criteria(0.05, 0.01, 0.8, "fail", "abstain", 0.1, 0, "ticket router"),  # positional
        # values that went through float32 (numpy or torch scalars): 0.01 is 0.0099999998 there, same criteria
        lambda: Criteria(
            **{
                **GOOD,
                "atol": np.float32(0.05),
                "rtol": np.float32(0.01),
                "min_quality": np.float32(0.8),
                "tie_tolerance": np.float32(0.1),
            }
        ),
        lambda: Criteria(
            **{**GOOD, "rtol": torch.tensor(0.01).item(), "min_quality": 1 - 0.2, "tie_tolerance": 0.3 - 0.2}
        ),  # arithmetic that lands within rounding of the value
    ],
)
def test_review_criteria_variants_pass(variant):
    result = check_criteria(variant)
    assert result.passed, result.message


def _criteria_printed_not_returned():
    print(Criteria(**GOOD))  # shown in the notebook, but the function returns None


@pytest.mark.parametrize(
    "make, words",
    [
        (_criteria_printed_not_returned, "returned None: end it with `return Criteria(...)`"),
        (lambda: (Criteria(**GOOD),), "returned a tuple"),  # a stray trailing comma after the Criteria(...)
        (lambda: Criteria(**{**GOOD, "atol": 0.0505, "rtol": 0.0}), "relative part"),  # 0.05 * 1.01 folded in
        (
            lambda: Criteria(**{**GOOD, "min_quality": 0.1, "tie_tolerance": 0.8}),
            "'at least 80 %'",
        ),  # swapped
    ],
)
def test_review_criteria_names_mistakes(make, words):
    result = check_criteria(make)
    assert not result.passed and result.status != NOT_DONE
    assert words in result.message, result.message


@pytest.mark.parametrize(
    "change, words",
    [
        (dict(rtol=0.05), "rtol is 0.05"),  # "1 %" read as the 5 % of atol
        (dict(tie_rule="escalate"), "tie_rule must be one of"),  # Criteria itself refuses, and says why
        (dict(allowed_decision_changes=None), "allowed_decision_changes must be an integer"),
        (dict(tie_rule="lowest_index"), "tie_rule='lowest_index' settles exact ties only"),
    ],
)
def test_criteria_checker_names_new_mistakes(change, words):
    result = check_criteria(lambda: Criteria(**{**GOOD, **change}))
    assert not result.passed and result.status != NOT_DONE
    assert words in result.message, result.message


# ----------------------------------- a review pass: more styles a class writes, and one more mistake


def _judge_numpy_float64(reference, trial, labels, criteria):
    """numpy in float64 for the numeric level, the package's decide for decisions, a print of the verdict."""
    r, t = reference.double().numpy(), trial.double().numpy()
    finite = bool(np.isfinite(t).all()) or criteria.nonfinite == "allow"
    with np.errstate(invalid="ignore"):
        numeric = bool(np.all(np.abs(t - r) <= criteria.atol + criteria.rtol * np.abs(r)))
    reference_decision = decide(reference, criteria.tie_tolerance)
    trial_decision = decide(trial.float(), criteria.tie_tolerance)
    decision = int((reference_decision != trial_decision).sum()) <= criteria.allowed_decision_changes
    quality = True
    if criteria.min_quality is not None:
        scored = labels >= 0
        accuracy = float((trial_decision[scored] == labels[scored]).double().mean()) if scored.any() else 0.0
        quality = bool(scored.any()) and accuracy >= criteria.min_quality
    verdict = {"finite": finite, "numeric": numeric, "decision": decision, "quality": quality}
    verdict["passed"] = all(verdict.values())
    print(verdict)
    return verdict


def _judge_allclose_trial_first(reference, trial, labels, criteria):
    """torch.allclose(trial, reference) is |trial - reference| <= atol + rtol * |reference|: the same rule."""
    verdict = dict(judge_solution()(reference, trial, labels, criteria))
    verdict["numeric"] = bool(
        torch.allclose(trial.float(), reference.float(), rtol=criteria.rtol, atol=criteria.atol)
    )
    verdict["passed"] = all(verdict[k] for k in ("finite", "numeric", "decision", "quality"))
    return verdict


@pytest.mark.parametrize(
    "variant", [_judge_numpy_float64, _judge_allclose_trial_first], ids=lambda f: f.__name__
)
def test_review_judge_trial_variants_pass(variant):
    assert check_judge_trial(variant).passed


def _judge_quality_over_all_rows(reference, trial, labels, criteria):
    verdict = dict(judge_solution()(reference, trial, labels, criteria))
    if criteria.min_quality is not None:  # -1 labels counted as misses
        hits = decide(trial.float(), criteria.tie_tolerance) == labels
        verdict["quality"] = float(hits.float().mean()) >= criteria.min_quality
    verdict["passed"] = all(verdict[k] for k in ("finite", "numeric", "decision", "quality"))
    return verdict


def test_review_judge_trial_names_unlabelled_rows_counted():
    result = check_judge_trial(_judge_quality_over_all_rows)
    assert result.status == "failed" and "leave those rows out of the accuracy" in result.message


# ----------------------------------- issue 19: 04.3's NaN near zero, softmaxed margins, and two messages


def _judge(reference, trial, labels, criteria, *, scores=None, to_labels=False, strict=False, zero_nan=False):
    """A judge_trial in a learner's style, with one known slip switched on."""
    raw = trial.float()
    compared = torch.nan_to_num(raw, nan=0.0) if zero_nan else raw
    finite = bool(torch.isfinite(raw).all()) or criteria.nonfinite == "allow"
    numeric = bool(((compared - reference).abs() <= criteria.atol + criteria.rtol * reference.abs()).all())
    prepare = scores or (lambda s: s)
    ref_d = decide(prepare(reference), criteria.tie_tolerance)
    trial_d = decide(prepare(raw), criteria.tie_tolerance)
    changed = int((trial_d != (labels if to_labels else ref_d)).sum())
    decision = changed <= criteria.allowed_decision_changes
    quality = True
    if criteria.min_quality is not None:
        scored = labels >= 0
        acc = float((trial_d[scored] == labels[scored]).float().mean()) if scored.any() else math.nan
        quality = acc > criteria.min_quality if strict else acc >= criteria.min_quality
    out = dict(finite=finite, numeric=numeric, decision=decision, quality=bool(quality))
    out["passed"] = all(out.values())
    return out


def judge_zeroes_nan(r, t, labels, c):
    return _judge(r, t, labels, c, zero_nan=True)


def judge_softmaxed(r, t, labels, c):
    return _judge(r, t, labels, c, scores=lambda s: torch.softmax(s.float(), dim=1))


def judge_decisions_vs_labels(r, t, labels, c):
    return _judge(r, t, labels, c, to_labels=True)


def judge_strict_minimum(r, t, labels, c):
    return _judge(r, t, labels, c, strict=True)


@pytest.mark.parametrize(
    "wrong, words",
    [
        (judge_zeroes_nan, "Case 'NaN where the reference is near zero'"),
        (judge_softmaxed, "Case 'margins of the raw scores'"),
        (judge_decisions_vs_labels, "never the labels"),
        (judge_strict_minimum, "not `>`"),
    ],
    ids=["nan_to_num", "softmax", "vs labels", "> min_quality"],
)
def test_judge_trial_names_the_real_mistake(wrong, words):
    result = check_judge_trial(wrong)
    assert result.status == "failed" and words in result.message, result.message
    assert "tie tolerance" not in result.message and "leave those rows out" not in result.message


def judge_numpy_style(reference, trial, labels, criteria):
    ref, tri = reference.double().numpy(), trial.double().numpy()
    lab = labels.numpy()
    finite = bool(np.isfinite(tri).all()) or criteria.nonfinite == "allow"
    with np.errstate(invalid="ignore"):
        numeric = bool(np.all(np.abs(tri - ref) <= criteria.atol + criteria.rtol * np.abs(ref)))
    rd = decide(reference, criteria.tie_tolerance).numpy()
    td = decide(trial.float(), criteria.tie_tolerance).numpy()
    decision = int((rd != td).sum()) <= criteria.allowed_decision_changes
    quality = True
    if criteria.min_quality is not None:
        mask = lab >= 0
        quality = bool(mask.any()) and float((td[mask] == lab[mask]).mean()) >= criteria.min_quality
    return {
        "finite": finite,
        "numeric": numeric,
        "decision": decision,
        "quality": quality,
        "passed": finite and numeric and decision and quality,
    }


def judge_allclose_per_row(reference, trial, labels, criteria):
    trial = trial.to(torch.float32)
    finite = criteria.nonfinite == "allow" or not bool((~torch.isfinite(trial)).any())
    numeric = all(
        torch.allclose(t, r, rtol=criteria.rtol, atol=criteria.atol) for t, r in zip(trial, reference)
    )
    d_ref, d_trial = decide(reference, criteria.tie_tolerance), decide(trial, criteria.tie_tolerance)
    decision = (d_ref != d_trial).count_nonzero().item() <= criteria.allowed_decision_changes
    if criteria.min_quality is None:
        quality = True
    else:
        right = [int(d) == int(y) for d, y in zip(d_trial, labels) if y >= 0]
        quality = bool(right) and sum(right) / len(right) >= criteria.min_quality
    verdict = {"finite": finite, "numeric": numeric, "decision": decision, "quality": quality}
    verdict["passed"] = all(verdict.values())
    return verdict


@pytest.mark.parametrize("variant", [judge_numpy_style, judge_allclose_per_row], ids=lambda f: f.__name__)
def test_judge_trial_accepts_new_styles_on_the_new_cases(variant):
    result = check_judge_trial(variant)
    assert result.passed, result.message


def criteria_with_a_bad_value():
    return Criteria(
        application="router",
        atol=0.05,
        rtol=0.01,
        min_quality=80,
        nonfinite="fail",
        tie_rule="abstain",
        tie_tolerance=0.1,
        allowed_decision_changes=0,
    )


def test_criteria_error_points_at_the_learners_line_not_the_generated_init():
    result = check_criteria(criteria_with_a_bad_value)
    assert result.status == "failed" and "min_quality is a fraction" in result.message, result.message
    assert "of criteria_with_a_bad_value()" in result.message and "__init__()" not in result.message
