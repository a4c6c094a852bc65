"""Lessons 00-03 as a learner reads them: every section says its track, lesson 00 maps the whole course, every
figure says what to look for, and the corrected claims stay corrected (no "identical numerics", no separate
"FP32 master weights", FP16's gap below 1.0)."""

import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LESSONS = [
    "00_start_here",
    "01_precision_formats",
    "02_fp16_underflow_and_loss_scaling",
    "03_autocast_and_gradscaler",
]
SOLUTIONS = LESSONS[1:]
FIGURE_CALLS = (
    "plt.show()",
    "plot_magnitudes(",
    "plot_sweep(",
    "scaler_widget()",
    "scale_explorer(",
    "format_explorer(",
    "explorer_html(",
    "scaler_figure(",
)


def cells(path):
    notebook = json.loads(path.read_text(encoding="utf-8"))
    return [
        (c["cell_type"], c["source"] if isinstance(c["source"], str) else "".join(c["source"]), c)
        for c in notebook["cells"]
    ]


def lesson(name):
    return cells(ROOT / "notebooks" / f"{name}.ipynb")


@pytest.mark.parametrize("name", LESSONS)
def test_every_section_heading_says_its_track(name):
    for kind, source, _ in lesson(name):
        lines = source.splitlines()
        for i, line in enumerate(lines):
            if kind == "markdown" and line.startswith("## ") and line != "## Summary":
                assert i + 1 < len(lines) and lines[i + 1] in ("*Track: core*", "*Track: full*"), line


def test_lesson_00_maps_every_lesson_and_the_core_track():
    text = "\n".join(source for kind, source, _ in lesson("00_start_here") if kind == "markdown")
    for notebook in sorted((ROOT / "notebooks").glob("*.ipynb")):
        assert f"`{notebook.stem}`" in text, notebook.stem
    for stem in ("08_amp_in_your_training_loop", "09_amp_across_processes"):
        assert f"`{stem}`" in text
    minutes = [int(m) for m in re.findall(r"\| (\d+) \|\n", text)]
    assert sum(minutes) == 180, minutes  # the core track fits a 3-hour workshop


@pytest.mark.parametrize("name", LESSONS)
def test_every_figure_says_what_to_look_for(name):
    notebook = lesson(name)
    for i, (kind, source, _) in enumerate(notebook):
        if kind == "code" and any(call in source for call in FIGURE_CALLS):
            before = next(s for k, s, _ in reversed(notebook[:i]) if k == "markdown")
            assert "**What to look for:**" in before, source[:80]


@pytest.mark.parametrize(
    "folder, name", [("notebooks", n) for n in LESSONS] + [("solutions", n) for n in SOLUTIONS]
)
def test_no_identical_numerics_and_no_master_weights(folder, name):
    text = "\n".join(source for _, source, _ in cells(ROOT / folder / f"{name}.ipynb"))
    assert not re.search(r"master weights", text, re.IGNORECASE)
    assert not re.search(r"numerics\*?( of FP16 and BF16)? are (the same|identical)", text, re.IGNORECASE)
    assert "are the same on CPU and GPU" not in text


def test_lesson_03_states_the_fp16_gap_on_both_sides_of_one():
    text = "\n".join(source for _, source, _ in lesson("03_autocast_and_gradscaler"))
    assert "`2**-11` apart just below it" in text and "-3e-4" in text
    assert "far shorter float32 lists" not in text


def test_lesson_03_policy_cell_is_collected_for_the_gpu_report():
    tagged = [
        source
        for kind, source, cell in lesson("03_autocast_and_gradscaler")
        if "gpu-figure" in cell.get("metadata", {}).get("tags", [])
    ]
    assert len(tagged) == 1 and "policy_table(device" in tagged[0]
