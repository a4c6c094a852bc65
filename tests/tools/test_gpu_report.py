"""`gpu-report` refuses without CUDA and, on a GPU, keeps exactly what the tagged cells printed."""

import nbformat
import pytest
import torch

from amp_lessons.tools import gpu_report


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is here: the refusal path cannot be seen")
def test_refuses_cleanly_without_cuda(capsys):
    assert gpu_report.main([]) == 2
    err = capsys.readouterr().err
    assert "no CUDA device" in err and "make gpu-report" in err and "Traceback" not in err


def test_collects_only_tagged_cells():
    notebook = nbformat.v4.new_notebook()
    tagged = nbformat.v4.new_code_cell("print(table)", metadata={"tags": ["gpu-figure"]})
    tagged.outputs = [nbformat.v4.new_output("stream", name="stdout", text="softmax float32\n")]
    other = nbformat.v4.new_code_cell("print(1)")
    other.outputs = [nbformat.v4.new_output("stream", name="stdout", text="1\n")]
    result = nbformat.v4.new_code_cell("x", metadata={"tags": ["gpu-figure"]})
    result.outputs = [
        nbformat.v4.new_output("execute_result", data={"text/plain": "12.5 ms"}, execution_count=1)
    ]
    notebook.cells = [tagged, other, result]
    assert gpu_report.figure_outputs(notebook) == [
        {"code": "print(table)", "output": "softmax float32"},
        {"code": "x", "output": "12.5 ms"},
    ]


def test_guide_column_is_regenerated_between_markers(tmp_path):
    guide = tmp_path / "guide.md"
    guide.write_text(f"before\n{gpu_report.BEGIN}\nold\n{gpu_report.END}\nafter\n", encoding="utf-8")
    report = {
        "gpu": "H200",
        "torch": "2.11",
        "cuda": "12.8",
        "lessons": [{"notebook": "03_x.ipynb", "seconds": 4.2, "error": "", "figures": [{}]}],
    }
    assert gpu_report.update_guide(report, guide)
    text = guide.read_text(encoding="utf-8")
    assert "old" not in text and "| `03_x.ipynb` | 4.2 s |" in text and text.endswith("after\n")


def test_lessons_quote_gpu_figures_from_tagged_cells():
    """The lessons that quote GPU-only numbers tag the cells that produce them."""
    from amp_lessons.core.files import repo_root

    tagged = {
        path.name
        for path in (repo_root() / "notebooks").glob("*.ipynb")
        if any(
            gpu_report.FIGURE_TAG in cell.get("metadata", {}).get("tags", [])
            for cell in nbformat.read(path, as_version=4).cells
        )
    }
    assert {
        "03_autocast_and_gradscaler.ipynb",
        "05_nan_debugging.ipynb",
        "06_checkpoint_and_rollback.ipynb",
        "07_measuring_gains.ipynb",
    } <= tagged
