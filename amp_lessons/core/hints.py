"""A hint ladder for every exercise: up to three hints, asked for one at a time, before any verdict.

Each lesson keeps its hints beside its checker, as data: ``amp_lessons/lNN_<lesson>/hints.json`` maps each
exercise label to three hints in order — **the idea**, **where in the code** it goes, **nearly the line** —
and never the solution itself (a test compares every hint with the solution notebooks' code).

In an exercise notebook the cell above each check shows a **Hint** button (:func:`hint_button`); each press shows
the next hint. ``hint("01.1")`` does the same as text, anywhere (a console, a terminal). How far up the ladder
a learner went is kept in their progress record (``hints`` per exercise, see ``amp_lessons.core.record``).

The logic is plain Python (:class:`HintLadder`), so tests drive it without a browser.
"""

from __future__ import annotations

import html
import json
import sys
from dataclasses import dataclass
from pathlib import Path

from amp_lessons.core import record

PACKAGE_FOLDER = Path(__file__).resolve().parents[1]
LEVELS = ("the idea", "where in the code", "nearly the line")
_LADDERS: dict = {}


def hint_files() -> list:
    """Every lesson's hint file, in lesson order."""
    return sorted(PACKAGE_FOLDER.glob("l[0-9][0-9]_*/hints.json"))


def all_hints() -> dict:
    """``{exercise label: [hint, hint, hint]}`` for the whole course, read from the lessons' data files."""
    found = {}
    for path in hint_files():
        found.update(json.loads(path.read_text(encoding="utf-8"))["exercises"])
    return found


def resolve(exercise: str) -> str:
    """The full label for ``exercise``: the label itself, or its number (``"01.1"``, ``"00"``)."""
    known = all_hints()
    wanted = str(exercise).strip()
    if wanted in known:
        return wanted
    matches = [label for label in known if label.split()[0] == wanted]
    if len(matches) == 1:
        return matches[0]
    numbers = ", ".join(label.split()[0] for label in known)
    raise KeyError(f"No hints for exercise {exercise!r}; the exercises with hints are {numbers}.")


@dataclass
class Hint:
    """What one request shows: every hint up to ``level`` (the newest last)."""

    exercise: str
    level: int
    hints: tuple

    @property
    def newest(self) -> str:
        return self.hints[self.level - 1]

    @property
    def last(self) -> bool:
        return self.level >= len(self.hints)

    def lines(self) -> list:
        total = len(self.hints)
        shown = [
            f"Hint {i} of {total} ({LEVELS[i - 1]}): {self.hints[i - 1]}" for i in range(1, self.level + 1)
        ]
        if self.last:
            shown.append(
                "That was the last hint: the rest is yours, and the check names any mistake it sees."
            )
        return shown

    def __str__(self) -> str:
        return f"Hints — {self.exercise}\n" + "\n".join(self.lines())

    def __repr__(self) -> str:
        return str(self)

    def _repr_html_(self) -> str:
        items = "".join(f"<li>{html.escape(line)}</li>" for line in self.lines())
        return (
            "<div class='amp-hint' style='background:#e3f2fd;border-left:6px solid #1565c0;padding:6px 12px;"
            f"margin:4px 0;border-radius:4px'><b>💡 Hints — {html.escape(self.exercise)}</b>"
            f"<ol style='margin:4px 0;list-style:none;padding-left:0'>{items}</ol></div>"
        )


class HintLadder:
    """One exercise's hints, given one more per request; the highest level reached goes to the record."""

    def __init__(self, exercise: str, hints, *, save=True):
        hints = tuple(hints)
        if not hints:
            raise ValueError(f"exercise {exercise!r} has no hints")
        self.exercise, self.hints, self.level, self.save = exercise, hints, 0, save

    @property
    def left(self) -> int:
        return len(self.hints) - self.level

    def next(self) -> Hint:
        """The next hint (after the last one, the last one again)."""
        self.level = min(self.level + 1, len(self.hints))
        if self.save:
            try:
                record.record_hint(self.exercise, self.level)
            except Exception as exc:  # the record is a convenience: a hint must never fail because of it
                print(f"(hint not saved in your progress record: {exc})", file=sys.stderr)
        return Hint(self.exercise, self.level, self.hints)

    def button_label(self) -> str:
        if self.left == 0:
            return "No more hints"
        return f"Hint ({self.left} left)"


def ladder(exercise: str) -> HintLadder:
    """This kernel's ladder for ``exercise`` (one per exercise, so a second button continues the first)."""
    label = resolve(exercise)
    if label not in _LADDERS:
        _LADDERS[label] = HintLadder(label, all_hints()[label])
    return _LADDERS[label]


def hint(exercise: str) -> Hint:
    """The next hint for ``exercise`` (``hint("01.1")``), with the ones before it; each call goes one step up."""
    return ladder(exercise).next()


class HintButton:
    """A "Hint" button that shows the next hint per press; as text, how to ask with :func:`hint`."""

    def __init__(self, exercise: str):
        self.ladder = ladder(exercise)

    def __str__(self) -> str:
        number = self.ladder.exercise.split()[0]
        return (
            f"Stuck on {self.ladder.exercise}? hint({number!r}) shows the next of its "
            f"{len(self.ladder.hints)} hints."
        )

    def __repr__(self) -> str:
        return str(self)

    def press(self) -> Hint:
        return self.ladder.next()

    def widget(self):
        import ipywidgets as widgets

        button = widgets.Button(description=self.ladder.button_label(), icon="lightbulb-o")
        button.add_class("amp-hint-button")
        shown = widgets.HTML()

        def on_press(_button):
            shown.value = self.press()._repr_html_()
            button.description = self.ladder.button_label()
            button.disabled = self.ladder.left == 0

        button.on_click(on_press)
        return widgets.VBox([button, shown])

    def _repr_mimebundle_(self, include=None, exclude=None):
        bundle = {"text/plain": str(self)}
        try:
            bundle.update(self.widget()._repr_mimebundle_() or {})
            bundle["text/plain"] = str(self)
        except Exception:  # no ipywidgets or no kernel: the text says how to ask for a hint
            pass
        return bundle


def hint_button(exercise: str) -> HintButton:
    """The Hint button an exercise notebook shows above a check: ``hint_button("01.1")``."""
    return HintButton(exercise)
