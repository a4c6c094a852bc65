"""Every lesson has the same shape, so a workshop can follow the core track and nothing is a wall of output.

- each ``##`` section heading says its track (``*Track: core*`` or ``*Track: full*`` on the next line), and
  the markers agree with lesson 00's lesson map: the sections it lists for the core track exist and are marked
  core, every other section is full;
- each exercise, in the solution and the exercise notebook, carries the track lesson 00 gives it;
- each cell that draws a figure has a "**What to look for:**" line in the markdown cell right before or right
  after it;
- the helpers the lessons call to show tables show at most 10 rows by default (the rest behind a toggle).

Nothing here executes a notebook: the notebooks are read as JSON, and the table helpers are called directly.
"""

import inspect
import json
import re
from pathlib import Path

import pandas as pd
import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
LESSONS = sorted(path.stem for path in (ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
EXERCISE_NOTEBOOKS = [
    f"{folder}/{path.name}"
    for folder in ("solutions", "exercises")
    for path in sorted((ROOT / folder).glob("[0-9][0-9]_*.ipynb"))
]
MARKERS = {"*Track: core*": "core", "*Track: full*": "full"}
EXEMPT = re.compile(r"## (\d+\. )?(Summary|Quiz)\b")  # headings that need no marker
CLOSING = re.compile(r"(Quiz|Quizzes|Exercises|Your turn)$")  # core when the lesson has a core part
MAX_ROWS = 10

# A code cell draws a figure when its code (comments left out) calls matplotlib or one of the course's
# plotting helpers and widgets: plt.*, .plot(...), .plot.barh(...), plot_*(...), *_plot(...), *_figure(...),
# *_widget(...), *_explorer(...), explorer_html(...).
FIGURE = re.compile(
    r"\bplt\.|\.plot\(|\.plot\.\w+\(|\bplot_\w+\(|\w_plot\(|\w_figure\(|\w_widget\("
    r"|\w_explorer\(|\bexplorer_html\("
)


def cells(relative):
    notebook = json.loads((ROOT / relative).read_text(encoding="utf-8"))
    return [
        (c["cell_type"], c["source"] if isinstance(c["source"], str) else "".join(c["source"]), c)
        for c in notebook["cells"]
    ]


def headings(relative, prefix="## "):
    """``[(heading line, track or None)]`` for every markdown line that starts with ``prefix``."""
    found = []
    for kind, source, _ in cells(relative):
        lines = source.splitlines()
        for i, line in enumerate(lines):
            if kind == "markdown" and line.startswith(prefix):
                found.append((line, MARKERS.get(lines[i + 1]) if i + 1 < len(lines) else None))
    return found


def numbered_sections(lesson):
    """``{number: (title, track)}`` for the lesson's ``## N. Title`` headings."""
    sections = {}
    for line, track in headings(f"notebooks/{lesson}.ipynb"):
        match = re.match(r"## (\d+)\. (.+)", line)
        if match:
            sections[int(match.group(1))] = (match.group(2), track)
    return sections


def lesson_map():
    """Lesson 00's map: ``{lesson stem: core-track column}``."""
    rows = {}
    for kind, source, _ in cells("notebooks/00_start_here.ipynb"):
        for line in source.splitlines():
            match = re.match(r"\| \d\d \| `(\d\d_\w+)` \|", line)
            if kind == "markdown" and match:
                rows[match.group(1)] = [column.strip() for column in line.strip("|").split("|")][3]
    return rows


def core_sections(column):
    """The ``§N Name`` items of a core-track column: ``[(N, name)]`` ("(atomic save)" and "— reading only" are
    remarks, not part of the name)."""
    listed = column.split(";")[0]
    items = []
    for item in re.split(r",\s*(?=§)", listed):
        match = re.match(r"§(\d+) (.+)", item.strip())
        if match:
            items.append((int(match.group(1)), re.split(r" \(| — ", match.group(2))[0].strip()))
    return items


def core_exercises():
    return {label for column in lesson_map().values() for label in re.findall(r"exercise (\d\d\.\d)", column)}


# ------------------------------------------------------------------------------------------------ tracks


@pytest.mark.parametrize("lesson", LESSONS)
def test_every_section_heading_says_its_track(lesson):
    for line, track in headings(f"notebooks/{lesson}.ipynb"):
        if not EXEMPT.match(line):
            assert track is not None, f"{lesson}: {line!r} has no *Track: core* / *Track: full* line under it"


def test_lesson_00_maps_every_lesson():
    assert sorted(lesson_map()) == LESSONS


@pytest.mark.parametrize("lesson", [lesson for lesson in LESSONS if not lesson.startswith("00")])
def test_lesson_00_core_track_names_only_sections_that_exist(lesson):
    sections = numbered_sections(lesson)
    for number, name in core_sections(lesson_map()[lesson]):
        assert number in sections, f"lesson 00 lists §{number} {name} for {lesson}: no section {number}"
        title, track = sections[number]
        assert name.lower() in title.lower(), f"{lesson}: lesson 00: §{number} {name!r}, heading {title!r}"
        assert track == "core", f"{lesson}: §{number} {title!r} is on lesson 00's core track, marked {track}"


@pytest.mark.parametrize("lesson", LESSONS)
def test_track_markers_agree_with_lesson_00(lesson):
    column = lesson_map()[lesson]
    listed = {number for number, _ in core_sections(column)}
    everything = column.startswith("all")
    has_core = everything or bool(listed) or bool(re.search(r"exercise \d\d\.\d", column))
    for line, track in headings(f"notebooks/{lesson}.ipynb"):
        if track is None:
            continue  # an exempt heading without a marker (see the test above)
        match = re.match(r"## (?:(\d+)\. )?(.+)", line)
        number, title = (int(match.group(1)) if match.group(1) else None), match.group(2)
        if CLOSING.search(title):
            expected = "core" if has_core else "full"
        else:
            expected = "core" if everything or number in listed else "full"
        assert track == expected, f"{lesson}: {line!r} is marked {track}; lesson 00's map makes it {expected}"


@pytest.mark.parametrize("notebook", EXERCISE_NOTEBOOKS)
def test_every_exercise_carries_the_track_lesson_00_gives_it(notebook):
    from amp_lessons.checks import registry

    labels = registry.declared_checks()
    core = core_exercises()
    heading = None  # (line, track) of the nearest heading above, of any level
    checked = 0
    for kind, source, _ in cells(notebook):
        lines = source.splitlines()
        if kind == "markdown":
            for i, line in enumerate(lines):
                if line.startswith("#"):
                    heading = (line, MARKERS.get(lines[i + 1]) if i + 1 < len(lines) else None)
            continue
        for name in re.findall(r"^(check_\w+)\(", source, re.MULTILINE):
            if name in labels and re.match(r"\d\d\.\d ", labels[name]):
                label = labels[name].split()[0]
                expected = "core" if label in core else "full"
                assert heading is not None and heading[1] == expected, (
                    f"{notebook}: exercise {label} sits under {heading and heading[0]!r}, marked "
                    f"{heading and heading[1]}; lesson 00 makes it {expected}"
                )
                checked += 1
    assert checked, f"{notebook}: no check cell found"


# ----------------------------------------------------------------------------------------------- figures


def code_without_comments(source):
    return "\n".join(
        re.sub(r"\s+#.*$", "", line) for line in source.splitlines() if not line.lstrip().startswith("#")
    )


def says_what_to_look_for(cell):
    kind, source, _ = cell
    return kind == "markdown" and any(line.startswith("**What to look for") for line in source.splitlines())


@pytest.mark.parametrize("lesson", LESSONS)
def test_every_figure_says_what_to_look_for(lesson):
    notebook = cells(f"notebooks/{lesson}.ipynb")
    for i, (kind, source, _) in enumerate(notebook):
        if kind == "code" and FIGURE.search(code_without_comments(source)):
            neighbours = [notebook[j] for j in (i - 1, i + 1) if 0 <= j < len(notebook)]
            assert any(says_what_to_look_for(cell) for cell in neighbours), (
                f"{lesson}, cell {i}: a figure with no '**What to look for:**' line right before or after:\n"
                f"{source[:200]}"
            )


def test_the_figure_rule_finds_the_figures():
    """Every lesson after 00 draws at least one figure; if the rule found none, it would test nothing."""
    for lesson in LESSONS[1:]:
        sources = [source for kind, source, _ in cells(f"notebooks/{lesson}.ipynb") if kind == "code"]
        assert any(FIGURE.search(code_without_comments(source)) for source in sources), lesson


# ------------------------------------------------------------------------------------------------ tables


def shown_rows(html):
    """Rows of the first table in ``html`` that is shown without opening a toggle."""
    shown = html.split("<details>")[0]
    table = re.search(r"<table.*?</table>", shown, re.S)
    if table is None:
        return 0
    body = re.search(r"<tbody>(.*?)</tbody>", table.group(0), re.S)
    return len(re.findall(r"<tr", body.group(1))) if body else len(re.findall(r"<tr", table.group(0))) - 1


def long_frame(rows=25):
    return pd.DataFrame(
        {
            "op": [f"op {i}" for i in range(rows)],
            "inputs": "h",
            "differs": ["yes"] + [""] * (rows - 1),
            "value": range(rows),
        }
    )


@pytest.mark.parametrize(
    "helper",
    [
        "amp_lessons.core.display.short_table",
        "amp_lessons.core.display.ShortTable",
        "amp_lessons.l03_autocast_and_gradscaler.autocast_policy.policy_view",
        "amp_lessons.l03_autocast_and_gradscaler.autocast_policy.ShortTable",
    ],
)
def test_table_helpers_show_at_most_ten_rows_by_default(helper):
    import importlib

    module, name = helper.rsplit(".", 1)
    function = getattr(importlib.import_module(module), name)
    assert inspect.signature(function).parameters["rows"].default <= MAX_ROWS
    frame = long_frame()
    shown = function(frame) if name != "ShortTable" else function(frame.drop(columns="inputs"))
    html = shown._repr_html_()
    assert shown_rows(html) == MAX_ROWS and "<details>" in html  # the other 15 rows behind the toggle


def test_a_comparison_report_shows_its_summary_not_every_sample():
    from amp_lessons.l04_baseline_and_decision_boundary.validation import compare

    reference = torch.randn(40, 3, generator=torch.Generator().manual_seed(0))
    report = compare(reference, reference.half().float(), atol=1e-2, rtol=1e-3)
    assert len(report.table) == 40 and shown_rows(report._repr_html_()) <= MAX_ROWS


def test_a_first_nonfinite_report_shows_the_probes_around_the_first_one():
    import torch.nn.functional as F

    from amp_lessons.core.models import TinyAttentionClassifier, attention_batch
    from amp_lessons.l05_nan_debugging.debugging import find_first_nonfinite

    x, y, _ = attention_batch(n=16)
    model = TinyAttentionClassifier(seed=0)
    report = find_first_nonfinite(
        model,
        torch.optim.SGD(model.parameters(), lr=1e-3),
        torch.amp.GradScaler("cpu"),
        F.cross_entropy,
        x,
        y,
        dtype=torch.float16,
    )
    assert report.found and len(report.probes) > MAX_ROWS
    assert shown_rows(report._repr_html_()) <= MAX_ROWS
