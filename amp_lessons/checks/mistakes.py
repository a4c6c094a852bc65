"""The one way checkers write "a known mistake, how to recognise it, and the message that names it".

A checker's diagnosis is a table of named rules, most specific first, each rule a plain function a test can call::

    @rule("clip before unscale_", "You clipped before scaler.unscale_(optimizer): ...")
    def clipped_before_unscale(seen) -> bool:
        return seen.clipped_before_unscale

    RULES = (clipped_before_unscale, ...)          # the table: read it top to bottom, the first match wins
    mistake = first_mistake(RULES, seen)
    if mistake: return failed(mistake.text(seen))

The message is a string, or a function of the same facts (``@rule("name", message=scale_message)``) when it
quotes the learner's numbers. Three idioms, each for one kind of evidence:

- **observation** (most checkers): the check runs the learner's code on probes that *record* what happened (call
  order, dtypes, files written, the scaler's calls); ``recognise(seen)`` reads that record. Use it when the
  mistake shows in *how* the code behaved (03.1, 05.2, 06.1, 07.1, 08.1, 09.1).
- **model**: ``recognise`` *replays* a known wrong implementation on the same inputs and asks whether it
  reproduces the learner's answers (``replays(wrong_fn, ...)``; ``best_mistake`` picks the model that explains
  the most cases). Use it when only return values are visible and a wrong formula explains them (01.x, 02.x, 04.x).
- **test bed**: a purpose-built case carries the evidence (a model whose container computes its own non-finite
  output, an overflow at one exact layer); the rule says which cases the learner got wrong (05.1).

A rule that raises while recognising does not recognise: a broken rule must never turn a learner's mistake into
a crash. A rule stays in a table only while an answer a real learner could write triggers it (its test shows
that answer).
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


def rule(name: str, message: str | Callable[..., str], kind: type = Mistake) -> Callable[[Callable], Mistake]:
    """Decorate a named predicate to make it a rule: ``@rule("sign lost", "The sign is lost: ...")``.

    The decorated name is then the rule (a :class:`Mistake`, or ``kind`` for a subclass with more fields).
    """

    def make(recognise: Callable[..., bool]) -> Mistake:
        return kind(name, recognise, message)

    return make


def replays(wrong: Callable, same: Callable[[object, object], bool]) -> Callable[..., bool]:
    """A *model* rule's recogniser: ``same(got, wrong(*inputs))`` for facts ``(*inputs, expected, got)``."""

    def recognise(*facts) -> bool:
        *inputs, _expected, got = facts
        return same(got, wrong(*inputs))

    return recognise


def first_mistake(rules: Iterable[Mistake], *facts) -> Mistake | None:
    """The first rule, in table order, that recognises ``facts`` (None when no known mistake fits)."""
    return next((rule for rule in rules if rule.matches(*facts)), None)


def name_mistake(rules: Iterable[Mistake], *facts) -> str | None:
    """The message of the first rule that recognises ``facts``, or None."""
    found = first_mistake(rules, *facts)
    return found.text(*facts) if found else None


def best_mistake(rules: Iterable[Mistake], cases: Iterable[tuple]) -> tuple[Mistake | None, int]:
    """The rule that recognises the most ``cases`` (each a tuple of facts), and its count.

    Ties go to the earlier rule, so a table lists the more specific explanation first.
    """
    cases = list(cases)
    best, best_count = None, 0
    for candidate in rules:
        count = sum(candidate.matches(*case) for case in cases)
        if count > best_count:
            best, best_count = candidate, count
    return best, best_count
