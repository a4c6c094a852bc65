"""Lesson 04's checkers: a tie-aware ``decide``, criteria for a stated application, judging a trial.

Each checker runs the learner's function on hand-picked boundary cases first (margin exactly equal to
the tolerance, all-equal rows, NaN and inf rows, one class, an empty batch, low-precision inputs), each
with the message that names the usual mistake, then on random rows against the package's own version.
What a case saw is judged by a table of small named rules (``amp_lessons.checks.mistakes``), most
specific first, so each rule can be tested on its own.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch

from amp_lessons.checks.harness import NOT_DONE, LearnerProblem, call_learner, checker, failed, passed, stop
from amp_lessons.checks.mistakes import Mistake, first_mistake, rule
from amp_lessons.core.environment import dtype_name
from amp_lessons.l04_baseline_and_decision_boundary.criteria import Criteria
from amp_lessons.l04_baseline_and_decision_boundary.validation import accuracy, decide, margins

NAN, INF = math.nan, math.inf

# ------------------------------------------------------------------------------------------ 04.1 decide


def _t(rows, dtype=torch.float32):
    return torch.tensor(rows, dtype=dtype)


# (scores, tie_tolerance, expected, message naming the mistake when the answer differs)
_DECIDE_CASES = [
    (
        _t([[0.1, 2.0, -1.0, 0.5], [3.0, -2.0, 1.0, 0.0], [-1.0, -0.5, -3.0, -0.75]]),
        0.0,
        [1, 0, 1],
        "On rows with one clear winner the decision must be the "
        "index of the largest score (torch.argmax along dim=1).",
    ),
    (
        _t([[2.0, 5.0, 5.0], [7.0, 7.0, 1.0]]),
        0.0,
        [1, 0],
        "An exact tie must go to the LOWEST index: [2, 5, 5] decides 1 and [7, 7, 1] decides 0.",
    ),
    (
        _t([[1.0, 0.75, 0.0]]),
        0.25,
        [0],
        "The margin 1.0 - 0.75 = 0.25 is exactly equal to tie_tolerance=0.25: that row must decide (0). "
        "Abstain only when the margin is strictly below the tolerance: use `margin < tie_tolerance`, not `<=`.",
    ),
    (
        _t([[1.0, 1.0003]]),
        1e-3,
        [-1],
        "Scores [1.0, 1.0003] with tie_tolerance=0.001 have margin 0.0003 < 0.001, so the row must abstain "
        "(-1). Does your function use tie_tolerance?",
    ),
    (
        _t([[1.0, 0.875 + 2**-12]]),
        0.125,
        [-1],
        "The margin 1.0 - 0.875244 = 0.124756 is below tie_tolerance=0.125, so the row must abstain (-1). "
        "Compare the exact margin with the tolerance: rounding it (to 3 decimals 0.124756 becomes 0.125) moves "
        "near-ties across the line, and near-ties are exactly the rows the rule is for.",
    ),
    (
        _t([[1.0 - 2**-20, 0.0]]),
        1.0,
        [-1],
        "The margin 0.99999905 is below tie_tolerance=1.0 (by 2**-20, about 1e-6), so the row must abstain "
        "(-1). torch.isclose (and numpy.isclose) call the two numbers equal, because they allow a relative "
        "difference of 1e-5: the rule is the strict comparison `margin < tie_tolerance`, with no slack.",
    ),
    (
        _t([[1.0, 1.0 + 2**-20, 0.0]]),
        0.0,
        [1],
        "Scores 1.0 and 1.00000095 are not a tie: the larger one wins (index 1). Only exactly equal top scores "
        "are a tie (torch.argmax gives those to the lowest index); torch.isclose would call these two equal.",
    ),
    (
        _t([[1000.0, 0.0625]], torch.float16),
        1000.0,
        [-1],
        "float16 scores [1000.0, 0.0625] have margin 999.9375, below tie_tolerance=1000, so the row must "
        "abstain (-1). Computed in float16, 1000 - 0.0625 rounds to 1000 (float16's spacing near 1000 is 0.5): "
        "convert the scores to float32 first (`scores.float()`, exact) and take the margin there.",
    ),
    (
        _t([[5.0, 4.9, 0.0], [0.0, 5.0, 4.9]]),
        0.5,
        [-1, -1],
        "The margin is the top score minus the RUNNER-UP (second largest in the row, e.g. torch.topk(scores, "
        "2)), not minus the smallest score and not column 0 minus column 1: [5.0, 4.9, 0.0] and [0.0, 5.0, "
        "4.9] both have margin 0.1 < 0.5 and must give -1.",
    ),
    (
        _t([[3.0, 3.0, 3.0], [-1.0, -1.0, -1.0]]),
        0.0,
        [0, 0],
        "All-equal rows with tie_tolerance=0 are exact ties: they must decide the lowest index, 0.",
    ),
    (
        _t([[3.0, 3.0, 3.0]]),
        0.5,
        [-1],
        "An all-equal row has margin 0, which is below tie_tolerance=0.5: it must give -1.",
    ),
    (
        _t([[NAN, 1.0, 2.0], [1.0, 2.0, 3.0]]),
        0.0,
        [-1, 2],
        "A row containing NaN must give -1 (torch.argmax treats NaN as the largest value, and skipping the "
        "NaN would decide from a broken row); the other rows decide "
        "as usual. Test rows with torch.isfinite(...).all(dim=1).",
    ),
    (
        _t([[INF, 1.0, 2.0], [1.0, -INF, 0.0]]),
        0.0,
        [-1, -1],
        "A row with +inf or -inf must give -1 too (the spec says any NaN or infinity): torch.isnan alone "
        "misses infinities; use torch.isfinite.",
    ),
    (
        _t([[0.3], [2.0], [-7.0]]),
        0.5,
        [0, 0, 0],
        "With a single class there is no runner-up: the margin counts as infinite and every finite row "
        "decides 0 (torch.topk(scores, 2) fails when C == 1: handle that case first).",
    ),
    (_t([[NAN]]), 0.0, [-1], "A single-class row that is NaN must still give -1."),
    (
        torch.zeros(0, 3),
        0.1,
        [],
        "An empty batch (shape [0, 3]) must return an empty LongTensor of shape [0], without an error.",
    ),
    (
        _t([[1.0, 1.0003]], torch.float16),
        0.0,
        [0],
        "float16 scores [1.0, 1.0003] are stored as [1.0, 1.0] (1.0003 rounds to 1.0): an exact tie, so the "
        "decision is 0. Decide on the tensor you are given; do not round or perturb it.",
    ),
    (
        _t([[1.0, 0.75, 0.5]], torch.bfloat16),
        0.25,
        [0],
        "bfloat16 scores [1.0, 0.75, 0.5] with tie_tolerance=0.25: "
        "the margin is exactly 0.25 and must decide 0.",
    ),
]

# Probes: rows where the rule, `<=` and torch.isclose all agree, but deciding on CHANGED scores (rounded,
# turned into probabilities, rescaled per row) does not. They run as cases after the ones above, and when an
# earlier case fails they are asked too: a learner who decided on changed scores can fail first where the
# change looks like another mistake (softmax of [1.0, 0.75, 0.0] has margin 0.11 < 0.25, like `<=`).
_DECIDE_PROBES = [
    (
        _t([[1.4, 0.6]]),
        0.5,
        [0],
        "The margin 1.4 - 0.6 = 0.8 is above tie_tolerance=0.5, so the row decides 0. Take the margin on the "
        "exact scores: rounded to whole numbers the row is a tie [1, 1].",
    ),
    (
        _t([[1.0, 0.54]]),
        0.5,
        [-1],
        "The margin 1.0 - 0.54 = 0.46 is below tie_tolerance=0.5, so the row must abstain (-1). Take the "
        "margin on the exact scores: rounded to 1 decimal it becomes 0.5 and the row would decide.",
    ),
    (
        _t([[1.0, 0.754]]),
        0.25,
        [-1],
        "The margin 1.0 - 0.754 = 0.246 is below tie_tolerance=0.25, so the row must abstain (-1). Take the "
        "margin on the exact scores: rounded to 2 decimals it becomes 0.25 and the row would decide.",
    ),
    (
        _t([[10.0, 9.0]]),
        0.5,
        [0],
        "The margin 10 - 9 = 1 is above tie_tolerance=0.5, so the row decides 0. The tolerance is in the units "
        "of the scores: softmax would turn the row into [0.73, 0.27], a margin of 0.46.",
    ),
    (
        _t([[10.0, 0.0]]),
        2.0,
        [0],
        "The margin 10 is far above tie_tolerance=2.0, so the row decides 0. Take the margin on the scores as "
        "given: probabilities or a rescaled row ([1, 0] after dividing by its length) have a margin near 1.",
    ),
    (
        _t([[0.3, 0.2]]),
        0.15,
        [-1],
        "The margin 0.3 - 0.2 = 0.1 is below tie_tolerance=0.15, so the row must abstain (-1). Take the "
        "margin on the scores as given: divided by its sum the row becomes [0.6, 0.4] (margin 0.2).",
    ),
]


@dataclass(frozen=True)
class DecideAnswer:
    """One boundary case of 04.1 and what the learner's ``decide`` did with it."""

    scores: torch.Tensor
    tolerance: float
    expected: list
    got: list
    case_mistake: str  # the message of the mistake this case is built to catch
    changed_input: bool = False
    probe_got: tuple = ()  # the learner's decisions on each of _DECIDE_PROBES (None where unusable)

    @property
    def what(self) -> str:
        return _case_text(self.scores, self.tolerance)

    def shown(self, text: str) -> str:
        return f"{text}\nFor {self.what} you returned {self.got}, expected {self.expected}."


def _case_text(scores: torch.Tensor, tolerance: float) -> str:
    return f"scores {scores.tolist()} ({dtype_name(scores.dtype)}), tie_tolerance={tolerance}"


def _decide_changed(change, scores: torch.Tensor, tolerance: float, finite_first: bool) -> list:
    """The rule applied to ``change(scores)``; with ``finite_first`` non-finite rows are set aside before the
    change (a learner who tests the raw rows), otherwise the changed rows are tested."""
    s = scores.float()
    if not finite_first:
        return decide(change(s), tolerance).tolist()
    finite = torch.isfinite(s).all(dim=1, keepdim=True)
    decided = decide(change(torch.where(finite, s, torch.zeros_like(s))), tolerance)
    return torch.where(finite.squeeze(1), decided, torch.full_like(decided, -1)).tolist()


def _rounded(decimals: int):
    return lambda s: torch.round(s, decimals=decimals)


def _per_row(by):
    return lambda s: s / by(s)


def _min_max(s):
    low, high = s.min(dim=1, keepdim=True).values, s.max(dim=1, keepdim=True).values
    return (s - low) / (high - low)


# Each known change: (what it is, in words, as the message shows it; the change itself).
ROUNDINGS = (
    ("the scores rounded to whole numbers (torch.round(scores))", _rounded(0)),
    ("the scores rounded to 1 decimal (torch.round(scores, decimals=1))", _rounded(1)),
    ("the scores rounded to 2 decimals (torch.round(scores, decimals=2))", _rounded(2)),
)
PROBABILITIES = (
    ("torch.softmax(scores, dim=1)", lambda s: torch.softmax(s, dim=1)),
    ("torch.sigmoid(scores)", torch.sigmoid),
)
RESCALINGS = (
    ("each row divided by its sum", _per_row(lambda s: s.sum(dim=1, keepdim=True))),
    (
        "each row divided by its length (L2 norm, F.normalize(scores, dim=1))",
        _per_row(lambda s: s.norm(dim=1, keepdim=True)),
    ),
    ("each row divided by its largest absolute value", _per_row(lambda s: s.abs().amax(dim=1, keepdim=True))),
    ("each row scaled to [0, 1] (min-max)", _min_max),
    (
        "each row standardised ((row - mean) / std)",
        lambda s: (s - s.mean(dim=1, keepdim=True)) / s.std(dim=1, keepdim=True),
    ),
)


def _explains(change, a: DecideAnswer, finite_first: bool) -> bool:
    return _decide_changed(change, a.scores, a.tolerance, finite_first) == a.got and all(
        _decide_changed(change, scores, tolerance, finite_first) == got
        for (scores, tolerance, _, _), got in zip(_DECIDE_PROBES, a.probe_got)
    )


def _explaining_change(a: DecideAnswer, changes) -> str | None:
    """The changes whose decisions are exactly the learner's, on the failing case and on every probe, in
    words (each change decides some probe wrongly, so a learner right on the probes is never taken for one;
    the probes cannot tell every pair apart, e.g. softmax from sigmoid on two classes, so all are named)."""
    if a.got == a.expected or len(a.probe_got) != len(_DECIDE_PROBES) or None in a.probe_got:
        return None
    words = [w for w, change in changes if any(_explains(change, a, first) for first in (True, False))]
    return " or ".join(words) or None


def _changed_scores(name: str, changes, why: str) -> Mistake:
    """A rule for deciding on changed scores: it names the change that reproduces the learner's answers and
    shows, besides the failing case, the first probe where the change shows."""

    def message(a: DecideAnswer) -> str:
        text = a.shown(
            f"Your decisions are the rule applied to {_explaining_change(a, changes)}, not to the "
            f"scores you were given. {why}"
        )
        for (scores, tolerance, expected, _), got in zip(_DECIDE_PROBES, a.probe_got):
            if got != expected:
                return f"{text}\nFor {_case_text(scores, tolerance)} you returned {got}, expected {expected}."
        return text

    return Mistake(name, lambda a: _explaining_change(a, changes) is not None, message)


@rule(
    "changed the scores in place",
    "decide changed the scores tensor it was given (an in-place operation such as nan_to_num_ or "
    "sort_). Work on a copy or use out-of-place operations.",
)
def changed_the_scores_in_place(a: DecideAnswer) -> bool:
    return a.changed_input


decided_on_rounded_scores = _changed_scores(
    "decided on rounded scores",
    ROUNDINGS,
    "Rounding moves each score by up to half of the last decimal kept, so a margin just "
    "below tie_tolerance can become equal to it (and decide) and a clear margin can shrink "
    "into a tie: near-ties are exactly the rows the rule is for. Decide on the exact scores; "
    "round only what you print.",
)


decided_on_probabilities = _changed_scores(
    "decided on probabilities",
    PROBABILITIES,
    "Probabilities keep the order of the scores but not their differences: softmax turns "
    "[10, 9] (margin 1) into [0.73, 0.27] (margin 0.46), and no two probabilities differ by "
    "more than 1. tie_tolerance is in the units of the scores you are given (the logits): "
    "take the margin on them.",
)


decided_on_rescaled_rows = _changed_scores(
    "decided on rescaled rows",
    RESCALINGS,
    "Rescaling a row scales its margin too ([10, 0] divided by its length is [1, 0]: margin "
    "1 instead of 10), so rows move across tie_tolerance, and dividing by a negative sum "
    "even reverses the order. tie_tolerance is in the units of the scores you are given: "
    "take the margin on them as they are.",
)


def _abstains_at_equal_margin_message(a: DecideAnswer) -> str:
    return a.shown(
        f"A row whose margin is exactly equal to tie_tolerance={a.tolerance} must decide, not abstain: "
        "abstain only when the margin is strictly below the tolerance (`margin < tie_tolerance`, not `<=`). "
        "With tie_tolerance=0 an exact tie therefore decides, and goes to the lowest index."
    )


@rule("abstains when the margin equals tie_tolerance", _abstains_at_equal_margin_message)
def abstains_at_equal_margin(a: DecideAnswer) -> bool:
    """A row that should decide abstained, and its margin is exactly the tolerance (`<=` instead of `<`)."""
    wrongly_abstained = [i for i, (g, e) in enumerate(zip(a.got, a.expected)) if g == -1 and e != -1]
    row_margins = margins(a.scores)
    return a.got != a.expected and any(float(row_margins[i]) == a.tolerance for i in wrongly_abstained)


def _the_mistake_this_case_catches_message(a: DecideAnswer) -> str:
    return a.shown(a.case_mistake)


@rule("the mistake this case is built to catch", _the_mistake_this_case_catches_message)
def the_mistake_this_case_catches(a: DecideAnswer) -> bool:
    return a.got != a.expected


DECIDE_MISTAKES = (
    changed_the_scores_in_place,
    decided_on_rounded_scores,
    decided_on_probabilities,
    decided_on_rescaled_rows,
    abstains_at_equal_margin,
    the_mistake_this_case_catches,
)


def _call_case(fn, args, case: str, mistake: str, first: bool):
    """Call the learner on one named case. A problem there is reported as what it is (an error, a wrong
    signature, not a function): on the first, plainest case nothing else is said, since it has nothing to do
    with the case (a typo such as `torch.isfinte` fails there); on a later case, where the error comes from
    what that case tests, the message adds the case and what it tests."""
    try:
        return call_learner(fn, *args)
    except LearnerProblem as problem:
        if problem.result.status == NOT_DONE or first:
            raise
        stop(f"{problem.result.message}\nIt raised only on this case: {case}. What the case tests: {mistake}")


def _as_decisions(got, n: int, what: str) -> torch.Tensor:
    if not isinstance(got, torch.Tensor):
        stop(
            f"decide returned a {type(got).__name__} for {what}; return a LongTensor of shape [N] "
            "(e.g. `torch.tensor([...], dtype=torch.long)` or `.long()`)."
        )
    if got.dtype != torch.long:
        stop(
            f"decide returned dtype {got.dtype} for {what}; decisions are class indices: return a "
            "LongTensor (dtype torch.long, e.g. `.long()`), with -1 for abstain."
        )
    if tuple(got.shape) != (n,):
        stop(
            f"decide returned shape {tuple(got.shape)} for {what}; expected [{n}]: one decision per row "
            "(reduce over dim=1 and do not keep the dimension)."
        )
    return got.detach().cpu()


def _probe_answers(decide_fn) -> tuple:
    """The learner's decisions on every probe, asked only once a case has failed (None where it raised or
    returned something that is not one decision per row: those answers are judged as cases, not here)."""
    answers = []
    for scores, tolerance, _, _ in _DECIDE_PROBES:
        try:
            got = call_learner(decide_fn, scores.clone(), tolerance)
        except LearnerProblem:
            got = None
        usable = isinstance(got, torch.Tensor) and tuple(got.shape) == (scores.shape[0],)
        answers.append(got.tolist() if usable else None)
    return tuple(answers)


def _decide_random_rows(decide_fn):
    """Random quarter-valued rows (exact ties and margins happen) against the package's ``decide``."""
    generator = torch.Generator().manual_seed(4)
    for trial in range(30):
        n = int(torch.randint(1, 9, (1,), generator=generator))
        c = int(torch.randint(2, 6, (1,), generator=generator))
        scores = torch.round(torch.randn(n, c, generator=generator) * 4) / 4  # quarters: ties, exact margins
        if trial % 3 == 0:
            scores[0, 0] = NAN
        tolerance = (0.0, 0.25, 0.5, 1.0)[trial % 4]
        expected = decide(scores, tolerance)
        got = _as_decisions(call_learner(decide_fn, scores.clone(), tolerance), n, "a random batch")
        if not torch.equal(got, expected):
            row = int((got != expected).nonzero()[0])
            return failed(
                f"On random scores your decision differs from the rule: row {scores[row].tolist()} with "
                f"tie_tolerance={tolerance} should give {int(expected[row])}, you gave {int(got[row])}."
            )
    return None


@checker("04.1 decide with a tie rule")
def check_decide(decide_fn):
    """``decide_fn(scores, tie_tolerance) -> LongTensor [N]`` per the rules of exercise 04.1."""
    for number, (scores, tolerance, expected, case_mistake) in enumerate(_DECIDE_CASES + _DECIDE_PROBES):
        given = scores.clone()  # the learner gets a copy: the cases must survive an in-place mistake
        case = _case_text(scores, tolerance)
        got = _call_case(decide_fn, (given, tolerance), case, case_mistake, number == 0)
        got = _as_decisions(got, scores.shape[0], _case_text(scores, tolerance))
        changed = not torch.allclose(given.float(), scores.float(), rtol=0, atol=0, equal_nan=True)
        answer = DecideAnswer(scores, tolerance, expected, got.tolist(), case_mistake, changed)
        if answer.got != expected and not changed:
            answer = DecideAnswer(
                scores, tolerance, expected, answer.got, case_mistake, changed, _probe_answers(decide_fn)
            )
        mistake = first_mistake(DECIDE_MISTAKES, answer)
        if mistake:
            return failed(mistake.text(answer))
    problem = _decide_random_rows(decide_fn)
    return (
        problem
        if problem is not None
        else passed(
            "decide follows the rule on every boundary: exact ties -> lowest index, margin strictly below the "
            "tolerance -> -1, margin equal to it decides, NaN/inf rows -> -1, one class -> 0, empty -> empty."
        )
    )


# ------------------------------------------------------------------------------------ 04.2 make_criteria

# What the ticket router's text states (exercise 04.2).
WANT = dict(
    atol=0.05,
    rtol=0.01,
    min_quality=0.8,
    nonfinite="fail",
    tie_rule="abstain",
    tie_tolerance=0.1,
    allowed_decision_changes=0,
)


def _is(value: float, field: str) -> bool:
    """``value`` is the stated one, also after float32 (np.float32(0.01), a tensor's .item())."""
    return math.isclose(value, WANT[field], rel_tol=1e-6)


@rule(
    "returned None",
    "make_criteria returned None: end it with `return Criteria(...)` (printing the criteria or "
    "assigning them to a variable does not hand them back).",
)
def returned_none(got) -> bool:
    return got is None


def _not_a_criteria_message(got) -> str:
    return (
        f"make_criteria returned a {type(got).__name__}; return an amp_lessons.l04_baseline_and_decision_boundary.Criteria(...) "
        "(immutable, with a fingerprint), not a dict or a tuple."
    )


@rule("not a Criteria", _not_a_criteria_message)
def not_a_criteria(got) -> bool:
    return not isinstance(got, Criteria)


@rule(
    "atol and rtol swapped",
    "atol and rtol are swapped: the absolute part is 0.05 (atol), the relative part 1 % (rtol=0.01).",
)
def atol_and_rtol_swapped(got) -> bool:
    return got.atol == WANT["rtol"] and got.rtol == WANT["atol"]


@rule("rtol as a percentage", "rtol=1 means 100 %: '1 % of the reference score' is rtol=0.01 (a fraction).")
def rtol_as_a_percentage(got) -> bool:
    return got.rtol == 1.0


@rule(
    "no relative part",
    "The tolerance has a relative part too: 'plus 1 % of the reference score's size' is rtol=0.01.",
)
def no_relative_part(got) -> bool:
    return got.rtol == 0


def _another_rtol_message(got) -> str:
    return f"rtol is {got.rtol:g}; '1 % of the size of the reference score' is rtol=0.01."


@rule("another rtol", _another_rtol_message)
def another_rtol(got) -> bool:
    return not _is(got.rtol, "rtol")


def _another_atol_message(got) -> str:
    return f"atol is {got.atol:g}; the application allows an absolute difference of 0.05."


@rule("another atol", _another_atol_message)
def another_atol(got) -> bool:
    return not _is(got.atol, "atol")


@rule(
    "no minimum quality",
    "The application requires at least 80 % accuracy on the labelled set: set min_quality=0.8.",
)
def no_minimum_quality(got) -> bool:
    return got.min_quality is None


def _another_minimum_quality_message(got) -> str:
    return f"min_quality is {got.min_quality:g}; 'at least 80 %' is min_quality=0.8."


@rule("another minimum quality", _another_minimum_quality_message)
def another_minimum_quality(got) -> bool:
    return not _is(got.min_quality, "min_quality")


@rule("non-finite outputs allowed", "Any NaN or inf must fail the trial: nonfinite='fail'.")
def non_finite_outputs_allowed(got) -> bool:
    return got.nonfinite != "fail"


@rule(
    "ties to the lowest index",
    "Near-ties are escalated to a person, not settled by the lowest index: tie_rule='abstain'.",
)
def ties_to_the_lowest_index(got) -> bool:
    return got.tie_rule != "abstain"


@rule(
    "tie_tolerance set to atol",
    "tie_tolerance is the MARGIN below which tickets are "
    "escalated (0.1), not the score tolerance atol (0.05).",
)
def tie_tolerance_set_to_atol(got) -> bool:
    return _is(got.tie_tolerance, "atol") and not math.isclose(WANT["atol"], WANT["tie_tolerance"])


def _another_tie_tolerance_message(got) -> str:
    return (
        f"tie_tolerance is {got.tie_tolerance:g}; tickets whose top two scores are closer "
        "than 0.1 are escalated: tie_tolerance=0.1."
    )


@rule("another tie_tolerance", _another_tie_tolerance_message)
def another_tie_tolerance(got) -> bool:
    return not _is(got.tie_tolerance, "tie_tolerance")


def _decision_changes_allowed_message(got) -> str:
    return (
        f"allowed_decision_changes is {got.allowed_decision_changes}; 'no ticket may change "
        "decision' means 0."
    )


@rule("decision changes allowed", _decision_changes_allowed_message)
def decision_changes_allowed(got) -> bool:
    return got.allowed_decision_changes != 0


# Each rule reads the object make_criteria returned; the first that fits names the mistake.
CRITERIA_MISTAKES = (
    returned_none,
    not_a_criteria,
    atol_and_rtol_swapped,
    rtol_as_a_percentage,
    no_relative_part,
    another_rtol,
    another_atol,
    no_minimum_quality,
    another_minimum_quality,
    non_finite_outputs_allowed,
    ties_to_the_lowest_index,
    tie_tolerance_set_to_atol,
    another_tie_tolerance,
    decision_changes_allowed,
)


def _without_generated_frames(tb):
    """The traceback cut before the first frame of generated code (a dataclass's ``__init__`` is compiled
    from a string, so its "line 11" is no line the learner wrote): the last frame left is the learner's."""
    head = tb
    while tb is not None and tb.tb_next is not None:
        if tb.tb_next.tb_frame.f_code.co_filename.startswith("<string>"):
            tb.tb_next = None
            break
        tb = tb.tb_next
    return head


def _calling_criteria(make_criteria):
    """``make_criteria`` as the learner wrote it, but an error raised while building the Criteria points at
    the learner's line (``return Criteria(...)``), where the wrong value is."""
    if not callable(make_criteria):
        return make_criteria

    @functools.wraps(make_criteria)
    def calling(*args, **kwargs):
        try:
            return make_criteria(*args, **kwargs)
        except Exception as exc:
            raise exc.with_traceback(_without_generated_frames(exc.__traceback__)) from None

    return calling


@checker("04.2 criteria for the ticket router")
def check_criteria(make_criteria):
    """``make_criteria()`` must return the Criteria the ticket-router application states."""
    got = call_learner(_calling_criteria(make_criteria))
    mistake = first_mistake(CRITERIA_MISTAKES, got)
    if mistake:
        return failed(mistake.text(got))
    return passed(
        f"These are the router's criteria, fingerprint {got.fingerprint}. Print them before any trial."
    )


# ---------------------------------------------------------------------------------------- 04.3 judge_trial

KEYS = ("finite", "numeric", "decision", "quality", "passed")
LEVELS = KEYS[:-1]


def _crit(**overrides) -> Criteria:
    base = dict(atol=0.01, rtol=0.0)
    base.update(overrides)
    return Criteria(**base)


# (name, the key the case is about, reference, trial, labels, criteria, message when that key differs)
_JUDGE_CASES = [
    (
        "identical scores",
        "passed",
        _t([[2.0, 1.0, 0.0], [0.0, 3.0, 1.0]]),
        _t([[2.0, 1.0, 0.0], [0.0, 3.0, 1.0]]),
        [0, 1],
        _crit(min_quality=0.5),
        "Identical reference and trial scores must pass every level.",
    ),
    (
        "a flip within tolerance",
        "decision",
        _t([[1.0, 1.0003, 0.0]]),
        _t([[1.0003, 1.0, 0.0]]),
        [1],
        _crit(),
        "Every score is within 0.01 of the reference, but the decision changed (class 1 -> class 0). A "
        "decision change must fail 'decision' (and 'passed') even when 'numeric' passes.",
    ),
    (
        "one change allowed",
        "decision",
        _t([[1.0, 1.0003, 0.0]]),
        _t([[1.0003, 1.0, 0.0]]),
        [1],
        _crit(allowed_decision_changes=1),
        "The criteria allow 1 decision change (allowed_decision_changes=1): "
        "one changed row must pass 'decision'.",
    ),
    (
        "difference exactly at the tolerance",
        "numeric",
        _t([[2.0, 0.0]]),
        _t([[2.5, 0.0]]),
        [0],
        _crit(atol=0.25, rtol=0.125),
        "|2.5 - 2.0| = 0.5 equals atol + rtol*|ref| = 0.25 + 0.125*2: a difference exactly at the tolerance "
        "passes (use <=, as torch.allclose does).",
    ),
    (
        "rtol scales with the reference",
        "numeric",
        _t([[1.0, 0.0]]),
        _t([[2.0, 0.0]]),
        [0],
        _crit(atol=0.0, rtol=0.6),
        "rtol multiplies |reference|, not |trial|: the allowed difference is 0 + 0.6*|1.0| = 0.6 < 1.0, so "
        "'numeric' fails (with |trial| it would wrongly pass).",
    ),
    (
        "a score that went down",
        "numeric",
        _t([[2.0, 0.0]]),
        _t([[1.0, 0.0]]),
        [0],
        _crit(atol=0.5),
        "The trial score 1.0 is 1.0 BELOW the reference 2.0: compare the absolute difference |trial - "
        "reference| with the tolerance.",
    ),
    (
        "NaN in the trial",
        "numeric",
        _t([[2.0, 0.0], [0.0, 2.0]]),
        _t([[NAN, 0.0], [0.0, 2.0]]),
        [0, 1],
        _crit(),
        "A NaN score fails 'finite' (policy 'fail') and fails 'numeric' too: NaN compares False with "
        "everything, so `not (diff > tol).any()` lets it through; test `(diff <= tol).all()` instead.",
    ),
    (
        "NaN where the reference is near zero",
        "numeric",
        _t([[2.0, 0.004], [0.0, 2.0]]),
        _t([[2.0, NAN], [0.0, 2.0]]),
        [0, 1],
        _crit(allowed_decision_changes=1),
        "A NaN fails 'numeric' wherever it is, even where the reference score is 0.004: zeroing it "
        "(torch.nan_to_num, or NaN -> 0) turns it into 0.0, within atol=0.01 of the reference, and hides it. "
        "Compare the trial as it is: `((trial - reference).abs() <= tol).all()` is False for any NaN.",
    ),
    (
        "inf allowed by policy",
        "finite",
        _t([[2.0, 0.0], [0.0, 2.0]]),
        _t([[INF, 0.0], [0.0, 2.0]]),
        [0, 1],
        _crit(nonfinite="allow", allowed_decision_changes=1),
        "With nonfinite='allow' a non-finite score does not fail 'finite' (it still fails 'numeric', and its "
        "row decides -1, which is a change).",
    ),
    (
        "decisions compared with the reference, not the labels",
        "decision",
        _t([[2.0, 0.0], [0.0, 2.0]]),
        _t([[2.0, 0.0], [0.0, 2.0]]),
        [1, 0],
        _crit(),
        "'decision' counts the rows where the TRIAL's decision differs from the REFERENCE's, "
        "decide(reference, ...) vs decide(trial, ...), never the labels: here the trial decides exactly as "
        "the reference, so nothing changed, although both disagree with the labels (that is 'quality').",
    ),
    (
        "tie rule from the criteria",
        "decision",
        _t([[1.0, 0.95]]),
        _t([[0.95, 1.0]]),
        [0],
        _crit(atol=0.1, tie_rule="abstain", tie_tolerance=0.1),
        "Decide with the criteria's tie rule, `decide(scores, criteria.tie_tolerance)`: margins 0.05 < 0.1 "
        "make both rows abstain (-1), so no decision changed.",
    ),
    (
        "margins of the raw scores",
        "decision",
        _t([[1.0, 0.85]]),
        _t([[0.85, 1.0]]),
        [0],
        _crit(atol=0.2, tie_rule="abstain", tie_tolerance=0.1),
        "Decide on the scores as they are, `decide(trial, criteria.tie_tolerance)`: the margin 0.15 >= 0.1 "
        "decides class 0 in the reference and class 1 in the trial, a change. Softmaxed first, the margin "
        "shrinks to 0.075 and both rows abstain, hiding the change: tie_tolerance is in the units of the "
        "scores (the logits), not of probabilities.",
    ),
    (
        "accuracy, not agreement",
        "quality",
        _t([[2.0, 0.0], [2.0, 0.0]]),
        _t([[2.0, 0.0], [2.0, 0.0]]),
        [0, 1],
        _crit(min_quality=0.75),
        "'quality' is accuracy against the LABELS, not agreement with the reference: the trial agrees with the "
        "reference on every row, but row 1 is labelled 1 and both decide 0, so accuracy is 50 % < 75 %.",
    ),
    (
        "accuracy exactly at min_quality",
        "quality",
        _t([[2.0, 0.0], [0.0, 2.0]]),
        _t([[2.0, 0.0], [0.0, 2.0]]),
        [0, 0],
        _crit(min_quality=0.5),
        "The trial gets 1 of 2 labelled rows right, 50 %, exactly min_quality=0.5: a minimum is met when it "
        "is reached. Compare with `accuracy >= criteria.min_quality`, not `>`.",
    ),
    (
        "quality ignores unlabelled rows",
        "quality",
        _t([[2.0, 0.0], [2.0, 0.0], [0.0, 2.0]]),
        _t([[2.0, 0.0], [2.0, 0.0], [0.0, 2.0]]),
        [0, -1, 1],
        _crit(min_quality=1.0),
        "Label -1 means 'no correct answer': leave those rows out of the accuracy. Here both labelled rows "
        "are right, so quality is 100 % and meets min_quality=1.0.",
    ),
    (
        "abstaining is not correct",
        "quality",
        _t([[2.0, 1.95], [0.0, 2.0]]),
        _t([[2.0, 1.95], [0.0, 2.0]]),
        [0, 1],
        _crit(atol=0.1, tie_rule="abstain", tie_tolerance=0.1, min_quality=0.75),
        "An abstention (-1) is not the right answer: accuracy is "
        "1 of 2 labelled rows = 50 % < 75 %, so 'quality' fails.",
    ),
    (
        "quality of the trial's decisions",
        "quality",
        _t([[2.0, 0.0], [0.0, 2.0]]),
        _t([[0.0, 2.0], [0.0, 2.0]]),
        [0, 1],
        _crit(atol=3.0, allowed_decision_changes=1, min_quality=0.75),
        "'quality' is the TRIAL's accuracy: the trial changed row 0 to class 1 (label 0), so it gets 1 of 2 "
        "labelled rows right, 50 % < 75 %. Take it from decide(trial, ...): the reference's decisions never "
        "change, so a quality computed from them could never fail.",
    ),
    (
        "a float16 trial",
        "numeric",
        _t([[1.0, 1.0003, 0.0]]),
        _t([[1.0, 1.0003, 0.0]], torch.float16),
        [1],
        _crit(atol=1e-4),
        "The trial is float16 and stores 1.0003 as 1.0: |1.0 - 1.0003| = 0.0003 > atol=0.0001 fails 'numeric' "
        "(and the decision changed, 1 -> 0). Compare in float32: convert the TRIAL up (`trial.float()`, exact). "
        "Casting the reference down (`reference.to(trial.dtype)`, e.g. to satisfy torch.allclose, which refuses "
        "mixed dtypes) rounds away exactly the difference you are measuring.",
    ),
    (
        "a bfloat16 trial",
        "passed",
        _t([[3.0, 1.0], [0.5, 2.0]]),
        _t([[3.01, 1.0], [0.5, 2.0]], torch.bfloat16),
        [0, 1],
        _crit(atol=0.02, min_quality=1.0),
        "A bfloat16 trial (3.01 is stored as 3.015625) within atol=0.02 everywhere, with the same decisions and "
        "100 % quality, passes every level. bfloat16 tensors convert to float32 exactly (`trial.float()`); "
        "NumPy has no bfloat16 (`.numpy()` fails on it).",
    ),
    (
        "no minimum quality",
        "quality",
        _t([[0.0, 2.0]]),
        _t([[0.0, 2.0]]),
        [0],
        _crit(),
        "With min_quality=None quality is not judged: 'quality' must be True even though the only labelled "
        "row is wrong.",
    ),
]


def _oracle(reference, trial, labels, criteria) -> dict:
    finite = bool(torch.isfinite(trial).all()) or criteria.nonfinite == "allow"
    numeric = bool(((trial - reference).abs() <= criteria.atol + criteria.rtol * reference.abs()).all())
    trial_decision = decide(trial, criteria.tie_tolerance)
    changed = int((decide(reference, criteria.tie_tolerance) != trial_decision).sum())
    decision = changed <= criteria.allowed_decision_changes
    quality = True
    if criteria.min_quality is not None:
        quality = accuracy(trial_decision, torch.tensor(labels)) >= criteria.min_quality
    return {
        "finite": finite,
        "numeric": numeric,
        "decision": decision,
        "quality": bool(quality),
        "passed": finite and numeric and decision and bool(quality),
    }


def _as_verdict(got, name: str) -> dict:
    if not isinstance(got, dict):
        stop(
            f"judge_trial returned a {type(got).__name__} for the case '{name}'; return a dict with the "
            f"keys {list(KEYS)} and True/False values."
        )
    missing = [k for k in KEYS if k not in got]
    if missing:
        stop(f"The dict judge_trial returned has no key(s) {missing}; it needs exactly {list(KEYS)}.")
    verdict = {}
    for key in KEYS:
        value = got[key]
        if isinstance(value, torch.Tensor) and value.numel() == 1:
            value = value.item()
        if type(value).__module__ == "numpy" and getattr(value, "shape", None) == ():
            value = value.item()
        if not isinstance(value, bool):
            stop(
                f"judge_trial's '{key}' is {value!r} ({type(value).__name__}) for the case '{name}'; each "
                "value must be True or False (wrap it in bool(...))."
            )
        verdict[key] = value
    return verdict


@dataclass(frozen=True)
class JudgeAnswer:
    """One case of 04.3: its inputs, the level it is about, and the learner's and the right verdicts."""

    name: str
    target: str
    case_mistake: str
    reference: torch.Tensor
    trial: torch.Tensor
    labels: list
    criteria: Criteria
    got: dict
    want: dict

    @property
    def wrong(self) -> list:
        """The levels (not 'passed') where the learner's verdict differs."""
        return [k for k in LEVELS if self.got[k] != self.want[k]]

    def explained(self, text: str) -> str:
        shown = ", ".join(f"'{k}': you said {self.got[k]}, expected {self.want[k]}" for k in self.wrong)
        c = self.criteria
        return (
            f"Case '{self.name}': {text}\n({shown}; reference {self.reference.tolist()}, trial "
            f"{self.trial.tolist()}, labels {self.labels}, criteria atol={c.atol:g} rtol={c.rtol:g} "
            f"min_quality={c.min_quality} tie_tolerance={c.tie_tolerance:g} "
            f"allowed_decision_changes={c.allowed_decision_changes} nonfinite='{c.nonfinite}'.)"
        )


def _level_hint(key: str, hint: str) -> Mistake:
    """When a level other than the case's own is the first one wrong, say what that level means."""
    return Mistake(f"'{key}' wrong", lambda a: a.wrong[:1] == [key], lambda a: a.explained(hint))


def _wrong_at_the_level_of_this_case_message(a: JudgeAnswer) -> str:
    return a.explained(a.case_mistake)


@rule("the level this case is about", _wrong_at_the_level_of_this_case_message)
def wrong_at_the_level_of_this_case(a: JudgeAnswer) -> bool:
    return a.target in a.wrong


finite_wrong = _level_hint(
    "finite", "'finite' is True when every trial score is finite, or when criteria.nonfinite == 'allow'."
)


numeric_wrong = _level_hint(
    "numeric",
    "'numeric' is True when abs(trial - reference) <= criteria.atol + criteria.rtol * "
    "abs(reference) for every score (NaN and inf never satisfy it).",
)


decision_wrong = _level_hint(
    "decision",
    "'decision' is True when the number of rows whose decide(..., criteria.tie_tolerance) "
    "differs between reference and trial is at most criteria.allowed_decision_changes.",
)


quality_wrong = _level_hint(
    "quality",
    "'quality' is True when criteria.min_quality is None; otherwise when the trial's accuracy "
    "on the rows with label >= 0 (an abstention, -1, counts as wrong) is at least min_quality.",
)


def _passed_is_not_all_four_levels_message(a: JudgeAnswer) -> str:
    return (
        f"Case '{a.name}': 'passed' must be True only when all four levels pass (finite, numeric, decision, "
        f"quality); you said {a.got['passed']} with {[a.got[k] for k in LEVELS]}."
    )


@rule("'passed' is not all four levels", _passed_is_not_all_four_levels_message)
def passed_is_not_all_four_levels(a: JudgeAnswer) -> bool:
    return a.got["passed"] != a.want["passed"]


JUDGE_MISTAKES = (
    wrong_at_the_level_of_this_case,
    finite_wrong,
    numeric_wrong,
    decision_wrong,
    quality_wrong,
    passed_is_not_all_four_levels,
)


def _judge_random_trials(judge_trial):
    """Random trials (quarter/sixteenth steps, mixed criteria) against the oracle."""
    generator = torch.Generator().manual_seed(43)
    for trial_number in range(12):
        reference = torch.round(torch.randn(6, 3, generator=generator) * 8) / 8
        trial = reference + torch.round(torch.randn(6, 3, generator=generator)) / 16
        trial = trial.to((torch.float32, torch.float16, torch.bfloat16)[trial_number % 3])  # may round
        labels = torch.randint(-1, 3, (6,), generator=generator)
        criteria = _crit(
            atol=(0.0625, 0.125)[trial_number % 2],
            rtol=0.0625 * (trial_number % 3),
            min_quality=(None, 0.5)[trial_number % 2],
            allowed_decision_changes=trial_number % 2,
        )
        got = call_learner(judge_trial, reference.clone(), trial.clone(), labels.clone(), criteria)
        got = _as_verdict(got, "random")
        want = _oracle(reference, trial, labels.tolist(), criteria)
        if got != want:
            wrong = [k for k in KEYS if got[k] != want[k]]
            return failed(f"On a random trial your verdict differs for {wrong}: expected {want}, got {got}.")
    return None


@checker("04.3 judge a trial against the criteria")
def check_judge_trial(judge_trial):
    """``judge_trial(reference, trial, labels, criteria) -> {finite, numeric, decision, quality, passed}``."""
    for number, (name, target, reference, trial, labels, criteria, case_mistake) in enumerate(_JUDGE_CASES):
        args = (reference.clone(), trial.clone(), torch.tensor(labels), criteria)
        case = (
            f"case '{name}', reference {reference.tolist()}, trial {trial.tolist()} "
            f"({dtype_name(trial.dtype)}), labels {labels}"
        )
        got = _as_verdict(_call_case(judge_trial, args, case, case_mistake, number == 0), name)
        want = _oracle(reference, trial, labels, criteria)
        answer = JudgeAnswer(name, target, case_mistake, reference, trial, labels, criteria, got, want)
        mistake = first_mistake(JUDGE_MISTAKES, answer)
        if mistake:
            return failed(mistake.text(answer))
    problem = _judge_random_trials(judge_trial)
    return (
        problem
        if problem is not None
        else passed(
            "judge_trial reads the criteria at every level: finite (with its policy), numeric (abs diff <= "
            "atol + rtol*|ref|, NaN fails), decision (tie rule, allowed changes) and quality (labelled rows)."
        )
    )
