"""Multiple-choice self-checks at the end of each lesson.

In JupyterLab a question shows as radio buttons and a "Check" button; after an attempt it shows
whether the choice was right, the right answer and why. Where no widget front end is attached (a
plain console, nbconvert, a terminal) the same question prints as readable text and
``quiz[i].answer(choice)`` gives the same feedback. The grading logic is plain Python so tests can
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


@dataclass(frozen=True)
class Question:
    prompt: str
    options: tuple
    correct: int
    explanation: str

    def __post_init__(self) -> None:
        if len(self.options) < 2:
            raise ValueError("a multiple-choice question needs at least two options")
        if not 0 <= self.correct < len(self.options):
            raise ValueError(f"correct={self.correct} is not an index into the {len(self.options)} options")

    def feedback(self, choice) -> tuple[bool, str]:
        """Grade a choice given as an index (0-based) or as the option's text."""
        if isinstance(choice, str) and choice in self.options:
            choice = self.options.index(choice)
        if isinstance(choice, bool) or not isinstance(choice, int) or not 0 <= choice < len(self.options):
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


class Quiz:
    """A list of questions shown together; ``Quiz(...)`` as the last line of a cell displays it."""

    def __init__(self, title: str, questions: list[Question]):
        self.title = title
        self.questions = list(questions)

    def __getitem__(self, index: int) -> Question:
        return self.questions[index]

    def __len__(self) -> int:
        return len(self.questions)

    def answer(self, number: int, choice) -> str:
        """Text-mode attempt: ``quiz.answer(1, 2)`` answers question 1 with option 2."""
        if not 1 <= number <= len(self.questions):
            return f"There are questions 1 to {len(self.questions)}."
        return self.questions[number - 1].feedback(choice)[1]

    def score(self, choices: list) -> int:
        return sum(q.feedback(c)[0] for q, c in zip(self.questions, choices))

    def __str__(self) -> str:
        parts = [f"Quiz — {self.title}"]
        parts += [q.text(i + 1) for i, q in enumerate(self.questions)]
        parts.append(
            "Answer in JupyterLab with the buttons, or here with quiz.answer(question_number, option_number)."
        )
        return "\n\n".join(parts)

    def __repr__(self) -> str:
        return str(self)

    def widget(self):
        """The interactive form: one radio group and a Check button per question."""
        import ipywidgets as widgets

        boxes = [widgets.HTML(f"<h4 style='margin:4px 0'>Quiz — {html.escape(self.title)}</h4>")]
        for number, question in enumerate(self.questions, start=1):
            choices = widgets.RadioButtons(
                options=[(option, i) for i, option in enumerate(question.options)],
                value=None,
                layout=widgets.Layout(width="auto"),
            )
            button = widgets.Button(description="Check", button_style="info")
            result = widgets.HTML()

            def on_check(_button, question=question, choices=choices, result=result):
                if choices.value is None:
                    result.value = "<i>Pick an option first.</i>"
                    return
                correct, message = question.feedback(choices.value)
                colour = "#2e7d32" if correct else "#c62828"
                result.value = f"<div style='color:{colour}'>{html.escape(message)}</div>"

            button.on_click(on_check)
            prompt = widgets.HTML(f"<b>Q{number}.</b> {html.escape(question.prompt)}")
            boxes += [prompt, choices, button, result]
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
    questions = [
        Question(q["prompt"], tuple(q["options"]), int(q["correct"]), q["explanation"])
        for q in data["questions"]
    ]
    return Quiz(data["title"], questions)
