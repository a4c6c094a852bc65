"""A quiz lets the learner retry: the first wrong pick says why that option is wrong, the answer comes after the
second wrong pick or on request; every question of every quiz explains each wrong option."""

import pytest

from amp_lessons.core.quiz import (
    CORRECT,
    INVALID,
    RETRY,
    REVEALED,
    Attempts,
    Question,
    Quiz,
    lesson_quiz,
    quiz_files,
)

QUESTION = Question(
    "2+2?", ("3", "4", "5"), 1, "Arithmetic.", ("Three is one short.", "", "Five is one too many.")
)


def all_questions():
    return [
        (path.parent.name, q) for path in quiz_files() for q in lesson_quiz(path.parent.name[1:]).questions
    ]


@pytest.mark.parametrize("lesson, question", all_questions(), ids=lambda v: v if isinstance(v, str) else "")
def test_every_wrong_option_says_why_it_is_wrong(lesson, question):
    assert len(question.why_wrong) == len(question.options), (lesson, question.prompt)
    for index, why in enumerate(question.why_wrong):
        if index == question.correct:
            assert why == "", (lesson, question.prompt)
        else:
            assert len(why) > 20 and question.options[question.correct] not in why, (lesson, question.prompt)


def test_first_wrong_pick_explains_and_lets_the_learner_retry():
    attempts = Attempts(QUESTION, "Try again.")
    state, message = attempts.pick(0)
    assert state == RETRY and message == "Not quite: “3” is not right. Three is one short. Try again."
    assert "4" not in message and "Arithmetic" not in message  # no answer yet
    state, message = attempts.pick(1)
    assert state == CORRECT and message.startswith("Correct: 4.") and "Arithmetic." in message


def test_the_answer_shows_after_the_second_wrong_pick_or_on_request():
    attempts = Attempts(QUESTION)
    assert attempts.pick(0)[0] == RETRY
    state, message = attempts.pick(2)
    assert state == REVEALED and "The answer is “4”" in message and "Arithmetic." in message
    assert attempts.pick("3")[0] == REVEALED  # once shown, every later wrong pick shows it again
    asked = Attempts(QUESTION)
    assert asked.reveal() == "The answer is “4”. Arithmetic." and asked.pick(0)[0] == REVEALED
    assert Attempts(QUESTION).pick(9)[0] == INVALID


def test_text_mode_answer_and_reveal():
    quiz = Quiz("demo", [QUESTION, QUESTION])
    first = quiz.answer(1, 0)
    assert first.startswith("Not quite") and "quiz.answer(1, option)" in first and "quiz.reveal(1)" in first
    assert "The answer is" in quiz.answer(1, 2)
    assert quiz.reveal(2).startswith("The answer is “4”")
    assert "There are questions 1 to 2" in quiz.reveal(3)
    assert "quiz.reveal" in str(quiz)


def test_the_widget_retries_then_shows_the_answer():
    form = Quiz("demo", [QUESTION]).widget()
    radio, check, result, show = form.children[2:6]
    assert show.description == "Show answer"
    radio.value = 0
    check.click()
    assert "Three is one short." in result.value and "The answer is" not in result.value
    assert "Show answer" in result.value
    radio.value = 2
    check.click()
    assert "The answer is “4”" in result.value
    fresh = Quiz("demo", [QUESTION]).widget()
    fresh.children[5].click()
    assert "The answer is “4”" in fresh.children[4].value


def test_why_wrong_must_match_the_options():
    with pytest.raises(ValueError, match="why_wrong"):
        Question("?", ("a", "b"), 0, "", ("only one",))
