"""The one way checkers write "a known mistake, how to recognise it, and the message that names it".

A checker's diagnosis is a table of small named rules, most specific first::

    TOO_EARLY = Mistake("clip before unscale_", lambda seen: seen.clipped_before_unscale,
                        "You clipped before scaler.unscale_(optimizer): ...")
    RULES = (TOO_EARLY, ...)
    mistake = first_mistake(RULES, seen)          # the first rule that recognises what the check saw
    if mistake: return failed(mistake.text(seen))

Rules come in two kinds, written the same way:
- *observations*: ``recognise`` reads what the check recorded (call order, dtypes, files written);
- *models*: ``recognise`` replays a known wrong implementation on the same inputs and asks whether it
  reproduces the learner's answers (``best_mistake`` picks the model that explains the most cases).
Each rule is a value a test can call on its own. A rule that raises while recognising does not recognise:
a broken rule must never turn a learner's mistake into a crash.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Callable


@dataclass(frozen=True)
class Mistake:
    """One known wrong answer: a short ``name``, a ``recognise(*facts) -> bool`` and the ``message`` for it.

    ``message`` is a string, or a function of the same facts for a message that quotes the learner's numbers.
    """

    name: str
    recognise: Callable[..., bool]
    message: str | Callable[..., str]

    def matches(self, *facts) -> bool:
        try:
            return bool(self.recognise(*facts))
        except Exception:
            return False

    def text(self, *facts) -> str:
        return self.message(*facts) if callable(self.message) else self.message


def first_mistake(rules: Iterable[Mistake], *facts) -> Mistake | None:
    """The first rule, in table order, that recognises ``facts`` (None when no known mistake fits)."""
    return next((rule for rule in rules if rule.matches(*facts)), None)


def name_mistake(rules: Iterable[Mistake], *facts) -> str | None:
    """The message of the first rule that recognises ``facts``, or None."""
    rule = first_mistake(rules, *facts)
    return rule.text(*facts) if rule else None


def best_mistake(rules: Iterable[Mistake], cases: Iterable[tuple]) -> tuple[Mistake | None, int]:
    """The rule that recognises the most ``cases`` (each a tuple of facts), and its count.

    Ties go to the earlier rule, so a table lists the more specific explanation first.
    """
    cases = list(cases)
    best, best_count = None, 0
    for rule in rules:
        count = sum(rule.matches(*case) for case in cases)
        if count > best_count:
            best, best_count = rule, count
    return best, best_count
