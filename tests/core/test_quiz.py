"""Quizzes live in data files, answer positions are balanced, and no notebook writes a quiz inline."""

import json
from collections import Counter
from pathlib import Path

import pytest

from amp_lessons.core.quiz import lesson_quiz, quiz_files

ROOT = Path(__file__).resolve().parents[2]
LESSONS = sorted(ROOT.glob("notebooks/[0-9][0-9]_*.ipynb"))


def all_questions():
    return [q for path in quiz_files() for q in lesson_quiz(path.parent.name[1:]).questions]


@pytest.mark.parametrize("notebook", LESSONS, ids=lambda p: p.stem)
def test_every_lesson_shows_its_quiz_from_a_data_file(notebook):
    cells = json.loads(notebook.read_text(encoding="utf-8"))["cells"]
    code = ["".join(c["source"]) for c in cells if c["cell_type"] == "code"]
    assert not any("Question(" in source for source in code), (
        "quiz questions belong in the lesson's quiz.json"
    )
    assert any(f'lesson_quiz("{notebook.stem[:2]}")' in source for source in code)
    quiz = lesson_quiz(notebook.stem[:2])
    assert len(quiz) >= 2


def test_no_lesson_prints_a_quiz_answer():
    for notebook in LESSONS:
        cells = json.loads(notebook.read_text(encoding="utf-8"))["cells"]
        code = ["".join(c["source"]) for c in cells if c["cell_type"] == "code"]
        assert not any(".answer(" in source for source in code), notebook.name


def test_answer_positions_are_balanced():
    positions = Counter(q.correct for q in all_questions())
    total = sum(positions.values())
    assert max(positions.values()) / total <= 0.40, positions


def test_feedback_only_after_an_attempt():
    quiz = lesson_quiz("03")
    shown = str(quiz)
    for question in quiz.questions:
        assert question.explanation not in shown
    right = quiz.questions[0].correct
    assert quiz.answer(1, right).startswith("Correct")
    assert quiz.answer(1, (right + 1) % len(quiz.questions[0].options)).startswith("Not quite")


def test_unknown_lesson_names_the_quizzes():
    with pytest.raises(FileNotFoundError, match="00_start_here"):
        lesson_quiz("42")
