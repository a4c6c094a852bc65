"""Every exercise has a ladder of three hints, written as data in its lesson's package, and no hint gives away
the solution's code; asking for hints goes one step at a time and is kept in the progress record."""

import ast
import json
import re
from pathlib import Path

import pytest

from amp_lessons.checks import registry
from amp_lessons.core import hints, record
from amp_lessons.tools.exercises.course import BEGIN, END, cell_source

ROOT = Path(__file__).resolve().parents[2]
LABELS = registry.declared_labels()
LONG_LINE = 25  # a solution line longer than this must never appear in a hint
CODE_SPAN = re.compile(r"`([^`]+)`")


def solution_regions() -> dict:
    """``{lesson number: [the code between BEGIN and END of each solution region]}`` from solutions/."""
    regions = {}
    for path in sorted((ROOT / "solutions").glob("[0-9][0-9]_*.ipynb")):
        for cell in json.loads(path.read_text(encoding="utf-8"))["cells"]:
            source = cell_source(cell)
            for part in source.split(BEGIN)[1:]:
                regions.setdefault(path.name[:2], []).append(part.split(END)[0])
    return regions


def solution_statements(code: str) -> list:
    """Every statement of a solution region (nested ones too), as normalised source."""
    tree = ast.parse(__import__("textwrap").dedent(code))
    return [ast.unparse(node) for node in ast.walk(tree) if isinstance(node, ast.stmt)]


def lesson_of(label: str) -> str:
    return label[:2]


def test_every_exercise_has_three_hints_in_its_own_lesson():
    found = hints.all_hints()
    assert sorted(found) == sorted(LABELS)
    for path in hints.hint_files():
        for label, ladder in json.loads(path.read_text(encoding="utf-8"))["exercises"].items():
            assert path.parent.name[1:3] == lesson_of(label), (path, label)
            assert len(ladder) == 3 and all(isinstance(h, str) and len(h) > 40 for h in ladder), label
            assert len(set(ladder)) == 3, label


@pytest.mark.parametrize("label", LABELS)
def test_no_hint_contains_a_solution_line(label):
    regions = solution_regions().get(lesson_of(label), [])
    lines = {line.strip() for region in regions for line in region.splitlines()}
    long_lines = [line for line in lines if len(line) > LONG_LINE and not line.startswith("#")]
    for text in hints.all_hints()[label]:
        leaked = [line for line in long_lines if line in text]
        assert not leaked, f"{label}: a hint quotes the solution: {leaked}"


@pytest.mark.parametrize("label", [label for label in LABELS if not label.startswith("00")])
def test_no_hint_is_a_whole_statement_of_the_solution(label):
    statements = {
        statement
        for region in solution_regions()[lesson_of(label)]
        for statement in solution_statements(region)
        if len(statement) > 20
    }
    assert statements, f"no solution found for {label}"
    for text in hints.all_hints()[label]:
        for span in CODE_SPAN.findall(text):
            try:
                spans = [ast.unparse(node) for node in ast.parse(span).body]
            except SyntaxError:
                continue
            assert not set(spans) & statements, f"{label}: the hint `{span}` is a statement of the solution"


def test_the_rule_catches_a_quoted_solution_line():
    region = solution_regions()["03"][0]
    line = next(line.strip() for line in region.splitlines() if len(line.strip()) > LONG_LINE)
    assert line in f"Hint: {line}"
    assert "scaler.update()" in solution_statements(region) or any(
        "scaler.update()" in s for s in solution_statements(region)
    )


def test_hints_come_one_at_a_time_and_are_recorded(private_progress):
    hints._LADDERS.clear()
    first = hints.hint("01.1")
    assert first.level == 1 and "Hint 1 of 3 (the idea)" in str(first) and "Hint 2" not in str(first)
    second = hints.hint("01.1 stored_value")  # the full label names the same ladder
    assert (
        second.level == 2
        and "Hint 1 of 3" in str(second)
        and "Hint 2 of 3 (where in the code)" in str(second)
    )
    assert json.loads(private_progress.read_text())["exercises"]["01.1 stored_value"]["hints"] == 2
    third, again = hints.hint("01.1"), hints.hint("01.1")
    assert third.last and again.level == 3 and "last hint" in str(again)
    entry = json.loads(private_progress.read_text())["exercises"]["01.1 stored_value"]
    assert entry["hints"] == 3 and entry["attempts"] == 0 and entry["passed"] is False
    assert "<li>" in third._repr_html_()


def test_an_unknown_exercise_names_the_known_ones():
    with pytest.raises(KeyError, match="01.1, 01.2"):
        hints.hint("01.9")


def test_the_hint_button_in_text_and_as_a_widget(private_progress):
    hints._LADDERS.clear()
    button = hints.hint_button("02.1")
    assert str(button) == "Stuck on 02.1 lost_fractions? hint('02.1') shows the next of its 3 hints."
    bundle = button._repr_mimebundle_()
    assert bundle["text/plain"] == str(button)
    assert "application/vnd.jupyter.widget-view+json" in bundle
    form = button.widget()
    press, shown = form.children
    assert press.description == "Hint (3 left)" and shown.value == ""
    press.click()
    assert "Hint 1 of 3" in shown.value and press.description == "Hint (2 left)"
    press.click()
    press.click()
    assert press.disabled and press.description == "No more hints" and "Hint 3 of 3" in shown.value
    assert record.load()["exercises"]["02.1 lost_fractions"]["hints"] == 3


def test_a_broken_record_never_stops_a_hint(monkeypatch, capsys):
    hints._LADDERS.clear()

    def broken(*args, **kwargs):
        raise OSError("read-only folder")

    monkeypatch.setattr(record, "record_hint", broken)
    assert hints.hint("00").level == 1
    assert "hint not saved" in capsys.readouterr().err


def test_each_check_in_the_exercises_has_a_hint_cell_above_it():
    for path in sorted((ROOT / "solutions").glob("[0-9][0-9]_*.ipynb")):
        cells = [cell_source(c) for c in json.loads(path.read_text(encoding="utf-8"))["cells"]]
        for index, source in enumerate(cells):
            found = re.search(r"\b(check_\w+)\(", source)
            if not found or "import" not in source:
                continue
            label = next(
                label for name, label in registry.declared_checks().items() if name == found.group(1)
            )
            assert f'hint_button("{label.split()[0]}")' in cells[index - 1], (path.name, label)
