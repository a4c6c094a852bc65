"""Lesson 12 — your model, validated: the course's protocol as a tool, a report and a CI gate.

The lesson's files (notebook ``notebooks/12_your_model_validated.ipynb``, exercise ``solutions/12_your_model_validated.ipynb`` -> ``exercises/12_your_model_validated.ipynb``, tests ``tests/l12_your_model_validated/``; the recipe format, report keys and exit codes in ``docs/validate.md``):

- ``check.py``: the exercise checkers (loaded by ``amp_lessons.checks``; notebooks never import it)
- ``command.py``: ``python -m amp_lessons validate RECIPE.py`` — arguments, exit codes 0/1/2.
- ``digits.py``: the handwritten digits, bundled (``digits.csv.gz``, scikit-learn's copy, BSD-3; notice inside).
- ``digits.csv.gz``: the data file itself (1797 images of 8x8 pixels and their digit).
- ``examples/``: recipes that run as they are (the digits CNN, a Hugging Face BERT, torch's TransformerEncoder).
- ``figures.py``: the report's figures, from the earlier lessons' plots, as embedded PNGs.
- ``html_page.py``: ``report.html``, one self-contained page, the verdicts first.
- ``judging.py``: the verdict per dtype — inference at two levels, the training trial, one sentence.
- ``recipe.py``: load a recipe and call it, with clear messages and only the learner's frames.
- ``report.py``: ``report.json`` (stable keys) and the report folder, written atomically; progress bars.
- ``runs.py``: the runs — evaluation passes, short training runs, the non-finite finder on a copy.
- ``speed.py``: speed and memory, for accepted dtypes only (lesson 07).
- ``validate.py``: the protocol in order — ``validate(recipe, ...)``.
- ``hints.json``: three hints per exercise, as data (``amp_lessons.core.hints.hint``)
- ``quiz.json``: the end-of-lesson quiz, as data (``amp_lessons.core.quiz.lesson_quiz``)

``__all__`` is what the lesson's notebooks import from here.
"""

from amp_lessons.l12_your_model_validated.digits import load_digits, split_digits
from amp_lessons.l12_your_model_validated.examples import example_path
from amp_lessons.l12_your_model_validated.recipe import RecipeError, UsageError, load_recipe
from amp_lessons.l12_your_model_validated.report import report_figure
from amp_lessons.l12_your_model_validated.validate import Validation, validate

__all__ = [
    "RecipeError",
    "UsageError",
    "Validation",
    "example_path",
    "load_digits",
    "load_recipe",
    "report_figure",
    "split_digits",
    "validate",
]
