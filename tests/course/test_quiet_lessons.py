"""Quiet lessons: no unexplained stderr in a lesson run (the root conftest.py fails such a cell during the nbval run
``make test`` already does), expected warnings summarised in one line, no remarks for maintainers in lesson text."""

import importlib.util
import json
import logging
import re
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat

from amp_lessons.l08_amp_in_your_training_loop import loop_numerics

ROOT = Path(__file__).resolve().parents[2]
LESSONS = sorted(ROOT.glob("notebooks/[0-9][0-9]_*.ipynb"))
spec = importlib.util.spec_from_file_location("quiet_conftest", ROOT / "conftest.py")
quiet = importlib.util.module_from_spec(spec)
spec.loader.exec_module(quiet)

MAINTAINER_REMARKS = re.compile(
    r"\b[Aa] test (runs|checks|keeps|compares)\b|course's tests|GPU figure|widget front end", re.I
)


def stream(name, text):
    return {"output_type": "stream", "name": name, "text": text}


def test_stderr_fails_a_cell_unless_it_is_tagged():
    outputs = [stream("stdout", "fine\n"), stream("stderr", "W1201 a warning\n")]
    assert quiet.unexpected_stderr(outputs, []) == "W1201 a warning"
    assert quiet.unexpected_stderr(outputs, ["shows-warning"]) == ""
    assert quiet.unexpected_stderr([stream("stdout", "only stdout")], None) == ""
    assert quiet.unexpected_stderr([{"output_type": "error", "ename": "E"}], []) == ""


def test_the_hook_fails_a_loud_lesson_cell_in_a_real_nbval_run(tmp_path):
    shutil.copy(ROOT / "conftest.py", tmp_path / "conftest.py")
    (tmp_path / "notebooks").mkdir()
    notebook = nbformat.v4.new_notebook()
    notebook.cells = [
        nbformat.v4.new_code_cell("print('quiet')"),
        nbformat.v4.new_code_cell("import sys\nprint('unexplained noise', file=sys.stderr)"),
        nbformat.v4.new_code_cell(
            "import warnings\nwarnings.warn('shown on purpose')", metadata={"tags": ["shows-warning"]}
        ),
    ]
    notebook.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(notebook, tmp_path / "notebooks" / "loud.ipynb")
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--nbval-lax", "--nbval-current-env"]
        + ["notebooks/loud.ipynb"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert "1 failed, 2 passed" in run.stdout, run.stdout + run.stderr
    assert "unexplained noise" in run.stdout and "shows-warning" in run.stdout


def test_no_lesson_text_speaks_to_maintainers():
    for path in LESSONS:
        for index, cell in enumerate(json.loads(path.read_text(encoding="utf-8"))["cells"]):
            source = "".join(cell["source"])
            found = MAINTAINER_REMARKS.search(source)
            assert not found, f"{path.name}, cell {index}: {found.group(0)!r} is a remark for maintainers"


def test_gpu_figures_are_found_by_their_tag_not_a_comment():
    """The gpu report collects cells tagged gpu-figure; with the "# GPU figure:" comments gone they are still there."""
    tagged = [
        cell
        for path in LESSONS
        for cell in json.loads(path.read_text(encoding="utf-8"))["cells"]
        if "gpu-figure" in cell.get("metadata", {}).get("tags", [])
    ]
    assert len(tagged) >= 7


def test_compile_messages_are_caught_and_summarised_in_one_line(capsys):
    shown = []
    with loop_numerics.expected_compile_messages(show=shown.append) as caught:
        logging.getLogger("torch._dynamo.fake").warning(
            "Graph break from `Tensor.item()`, consider setting..."
        )
        logging.getLogger("torch").warning("No CUDA runtime is found, using CUDA_HOME='/usr/local'")
    assert len(caught) == 2 and capsys.readouterr().err == ""
    assert shown == [
        "(torch.compile logged 2 expected messages, not shown: a graph break: dynamo ended the graph at a Python "
        "decision on a tensor's value; no CUDA runtime here, so inductor generates C++ for the CPU.)"
    ]
    assert loop_numerics.compile_summary([]) == ""
    assert loop_numerics.explain_compile_message("something new\nmore") == "something new"


def test_the_compile_helpers_put_torchs_handlers_back():
    logger = logging.getLogger("torch")
    before = list(logger.handlers)
    with loop_numerics.expected_compile_messages(show=None):
        assert logger.handlers != before or not before
    assert logger.handlers == before
    _, _, error = loop_numerics.first_call(lambda: 1 / 0)
    assert error.startswith("ZeroDivisionError") and logger.handlers == before
