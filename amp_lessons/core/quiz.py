"""Multiple-choice self-checks at the end of each lesson.

In JupyterLab a question shows as radio buttons, a "Check" and a "Show answer" button. A first wrong pick
says it is not right and why *that* option is wrong (each question's ``why_wrong``), and lets the learner
try again; the answer and its explanation show after a second wrong pick, after a right one, or on request.
In a plain console, nbconvert or a terminal the same question prints as text, and ``quiz.answer(n, choice)``
and ``quiz.reveal(n)`` give the same feedback. The logic is plain Python (:class:`Attempts`), so tests
drive it without a browser.

The questions live in data files (``amp_lessons/lNN_<lesson>/quiz.json``), not in the notebooks, so the
answer is not sitting in the cell that shows the quiz; a lesson shows its quiz with ``lesson_quiz("03")``.
"""

from __future__ import annotations

import html
import json
from dataclasses import dataclass
from pathlib import Path

# Each lesson keeps its questions beside its code: amp_lessons/lNN_<notebook stem>/quiz.json
PACKAGE_FOLDER = Path(__file__).resolve().parents[1]


CORRECT, RETRY, REVEALED, INVALID = "correct", "retry", "revealed", "invalid"
WRONG_PICKS_BEFORE_ANSWER = 2  # the answer shows after this many wrong picks (or on request)


@dataclass(frozen=True)
class Question:
    prompt: str
    options: tuple
    correct: int
    explanation: str
    why_wrong: tuple = ()  # aligned with options: why each wrong option is wrong ("" for the right one)

    def __post_init__(self) -> None:
        if len(self.options) < 2:
            raise ValueError("a multiple-choice question needs at least two options")
        if not 0 <= self.correct < len(self.options):
            raise ValueError(f"correct={self.correct} is not an index into the {len(self.options)} options")
        if self.why_wrong and len(self.why_wrong) != len(self.options):
            raise ValueError(f"why_wrong has {len(self.why_wrong)} entries for {len(self.options)} options")

    def index_of(self, choice):
        """The option's index for a choice given as an index (0-based) or as the option's text, else None."""
        if isinstance(choice, str) and choice in self.options:
            choice = self.options.index(choice)
        if isinstance(choice, bool) or not isinstance(choice, int) or not 0 <= choice < len(self.options):
            return None
        return choice

    def not_right(self, choice: int, retry: str) -> str:
        """A first wrong pick: not right, why this option is wrong, and how to try again (no answer)."""
        why = self.why_wrong[choice] if self.why_wrong else ""
        return f"Not quite: “{self.options[choice]}” is not right. {why} {retry}".replace("  ", " ")

    def answer_text(self) -> str:
        return f"The answer is “{self.options[self.correct]}”. {self.explanation}"

    def feedback(self, choice) -> tuple[bool, str]:
        """Grade a choice (index or option text) and show the answer: the final word on a question."""
        choice = self.index_of(choice)
        if choice is None:
            return False, f"Choose one of the options by its number (0 to {len(self.options) - 1})."
        right = self.options[self.correct]
        if choice == self.correct:
            return True, f"Correct: {right}. {self.explanation}"
        return False, (
            f"Not quite: you chose “{self.options[choice]}”. The answer is “{right}”. {self.explanation}"
        )

    def text(self, number: int | None = None) -> str:
        head = f"Q{number}. " if number is not None else ""
        lines = [head + self.prompt]
        lines += [f"   {i}) {option}" for i, option in enumerate(self.options)]
        return "\n".join(lines)


class Attempts:
    """One learner's picks on one question: the first wrong one gets a reason and a retry, then the answer."""

    def __init__(self, question: Question, retry: str = "Pick another option and press Check."):
        self.question, self.retry, self.wrong, self.revealed = question, retry, 0, False

    def pick(self, choice) -> tuple[str, str]:
        """``(state, message)``: state is correct, retry (not right, try again), revealed or invalid."""
        index = self.question.index_of(choice)
        if index is None:
            return INVALID, self.question.feedback(choice)[1]
        if index == self.question.correct:
            self.revealed = True
            return CORRECT, self.question.feedback(index)[1]
        self.wrong += 1
        if self.revealed or self.wrong >= WRONG_PICKS_BEFORE_ANSWER:
            self.revealed = True
            return REVEALED, self.question.feedback(index)[1]
        return RETRY, self.question.not_right(index, self.retry)

    def reveal(self) -> str:
        self.revealed = True
        return self.question.answer_text()


class Quiz:
    """A list of questions shown together; ``Quiz(...)`` as the last line of a cell displays it."""

    def __init__(self, title: str, questions: list[Question]):
        self.title = title
        self.questions = list(questions)
        self._attempts = [self._text_attempts(n) for n in range(1, len(self.questions) + 1)]

    def _text_attempts(self, number: int) -> Attempts:
        retry = f"Try again with quiz.answer({number}, option), or see the answer with quiz.reveal({number})."
        return Attempts(self.questions[number - 1], retry)

    def __getitem__(self, index: int) -> Question:
        return self.questions[index]

    def __len__(self) -> int:
        return len(self.questions)

    def answer(self, number: int, choice) -> str:
        """Text-mode attempt: ``quiz.answer(1, 2)`` answers question 1 with option 2 (a wrong first pick may
        be retried; the answer shows after the second wrong one)."""
        if not 1 <= number <= len(self.questions):
            return f"There are questions 1 to {len(self.questions)}."
        return self._attempts[number - 1].pick(choice)[1]

    def reveal(self, number: int) -> str:
        """The answer to question ``number`` and why, without picking: ``quiz.reveal(1)``."""
        if not 1 <= number <= len(self.questions):
            return f"There are questions 1 to {len(self.questions)}."
        return self._attempts[number - 1].reveal()

    def score(self, choices: list) -> int:
        return sum(q.feedback(c)[0] for q, c in zip(self.questions, choices))

    def __str__(self) -> str:
        parts = [f"Quiz — {self.title}"]
        parts += [q.text(i + 1) for i, q in enumerate(self.questions)]
        parts.append(
            "Answer in JupyterLab with the buttons, or here with quiz.answer(question_number, option_number); "
            "a wrong first pick says why and lets you try again, quiz.reveal(question_number) shows the answer."
        )
        return "\n\n".join(parts)

    def __repr__(self) -> str:
        return str(self)

    def widget(self):
        """The interactive form: per question a radio group, a Check button, the feedback, a Show answer button."""
        import ipywidgets as widgets

        boxes = [widgets.HTML(f"<h4 style='margin:4px 0'>Quiz — {html.escape(self.title)}</h4>")]
        for number, question in enumerate(self.questions, start=1):
            prompt = widgets.HTML(f"<b>Q{number}.</b> {html.escape(question.prompt)}")
            boxes += [prompt, *question_widgets(question, widgets)]
        return widgets.VBox(boxes)

    def _repr_mimebundle_(self, include=None, exclude=None):
        bundle = {"text/plain": str(self)}
        try:
            form = self.widget()
            bundle.update(form._repr_mimebundle_() or {})
            bundle["text/plain"] = str(self)
        except Exception:  # no ipywidgets or no kernel: the text form is the quiz
            pass
        return bundle


COLOURS = {CORRECT: "#2e7d32", REVEALED: "#c62828", RETRY: "#ef6c00", INVALID: "#555"}


def feedback_html(state: str, message: str) -> str:
    return f"<div class='amp-quiz-{state}' style='color:{COLOURS[state]}'>{html.escape(message)}</div>"


def question_widgets(question: Question, widgets) -> tuple:
    """``(choices, check, result, show)`` for one question, wired to a fresh :class:`Attempts`."""
    attempts = Attempts(question, "Pick another option and press Check, or press Show answer.")
    choices = widgets.RadioButtons(
        options=[(option, i) for i, option in enumerate(question.options)],
        value=None,
        layout=widgets.Layout(width="auto"),
    )
    check = widgets.Button(description="Check", button_style="info")
    show = widgets.Button(description="Show answer")
    result = widgets.HTML()

    def on_check(_button):
        if choices.value is None:
            result.value = "<i>Pick an option first.</i>"
            return
        result.value = feedback_html(*attempts.pick(choices.value))

    def on_show(_button):
        result.value = feedback_html(REVEALED, attempts.reveal())

    check.on_click(on_check)
    show.on_click(on_show)
    return choices, check, result, show


def quiz_files() -> list:
    """Every lesson's quiz file, in lesson order."""
    return sorted(PACKAGE_FOLDER.glob("l[0-9][0-9]_*/quiz.json"))


def quiz_file(lesson: str) -> Path:
    """The data file of lesson ``lesson`` ("03" or "03_autocast_and_gradscaler")."""
    number = str(lesson)[:2]
    matches = [path for path in quiz_files() if path.parent.name[1:3] == number]
    if not matches:
        known = ", ".join(path.parent.name[1:] for path in quiz_files())
        raise FileNotFoundError(f"No quiz for lesson {lesson!r}; the quizzes are {known}.")
    return matches[0]


def lesson_quiz(lesson: str) -> Quiz:
    """Lesson ``lesson``'s quiz, read from its data file; as a cell's last line it shows the questions."""
    data = json.loads(quiz_file(lesson).read_text(encoding="utf-8"))
    return Quiz(data["title"], [question_from_data(q) for q in data["questions"]])


def question_from_data(data: dict) -> Question:
    """One question of a quiz file; ``why_wrong`` maps a wrong option's index (as text) to why it is wrong."""
    options = tuple(data["options"])
    why = data.get("why_wrong") or {}
    why_wrong = tuple(why.get(str(i), "") for i in range(len(options))) if why else ()
    return Question(data["prompt"], options, int(data["correct"]), data["explanation"], why_wrong)
