"""`python -m amp_lessons gpu-report` (`make gpu-report`): run the course on a CUDA GPU, keep its figures.

The course quotes a handful of numbers that only a GPU can produce: lesson 03's CUDA autocast policy column,
lesson 05's hand-written log(softmax(...)) case, lesson 06's bitwise resume with GPU kernels, lesson 07's timings, memory and
Tensor-Core shapes. Claiming them without running them would break the course's first rule, so this command

1. refuses, with a clear message, on a machine where torch sees no CUDA device;
2. runs the test suite, the solutions, the exercises and every lesson notebook with
   ``AMP_LESSONS_REQUIRE_CUDA=1`` (setup() then fails loudly instead of quietly falling back to the CPU);
3. collects the text output of every lesson cell tagged ``gpu-figure`` plus each lesson's run time into
   ``docs/gpu_report.json`` (one file, with the GPU's name and the torch/CUDA versions);
4. regenerates the GPU column of ``docs/instructor_guide.md`` from that file (between the
   ``<!-- gpu-column -->`` markers), so the guide never quotes a GPU figure nobody measured.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from amp_lessons.core.files import repo_root

FIGURE_TAG = "gpu-figure"
REPORT = Path("docs") / "gpu_report.json"
GUIDE = Path("docs") / "instructor_guide.md"
BEGIN, END = "<!-- gpu-column -->", "<!-- /gpu-column -->"


class NoGPU(RuntimeError):
    """Raised where there is no CUDA device: the report is about GPU numbers and must not invent them."""


def gpu_description() -> dict:
    """Name and versions of the GPU torch sees; raises NoGPU without one."""
    import torch

    if not torch.cuda.is_available():
        raise NoGPU(
            "torch sees no CUDA device here (torch.cuda.is_available() is False), so there are no "
            "GPU figures to measure. Run `make gpu-report` on a machine with an NVIDIA or AMD (ROCm) "
            "GPU; on this machine `make test` covers everything the CPU can show."
        )
    return {
        "gpu": torch.cuda.get_device_name(0),
        "torch": torch.__version__,
        "cuda": torch.version.cuda or "",
        "hip": getattr(torch.version, "hip", None) or "",
    }


def figure_outputs(notebook) -> list:
    """The text each ``gpu-figure`` cell printed (stream text, or a result's text/plain), in cell order."""
    found = []
    for cell in notebook.cells:
        if cell.cell_type != "code" or FIGURE_TAG not in cell.get("metadata", {}).get("tags", []):
            continue
        texts = []
        for output in cell.get("outputs", []):
            if output.get("output_type") == "stream":
                texts.append(output.get("text", ""))
            elif "data" in output and "text/plain" in output["data"]:
                texts.append(output["data"]["text/plain"])
        first_line = cell.source.splitlines()[0] if cell.source else ""
        found.append({"code": first_line, "output": "".join(texts).strip()})
    return found


def run_lesson(path: Path, timeout: float = 600) -> dict:
    """Run one lesson top to bottom on the GPU; its run time, its first error and its tagged figures."""
    import nbformat
    from nbclient import NotebookClient

    notebook = nbformat.read(path, as_version=4)
    started = time.perf_counter()
    error = ""
    try:
        NotebookClient(
            notebook,
            timeout=int(timeout),
            kernel_name="python3",
            resources={"metadata": {"path": str(path.parent)}},
        ).execute()
    except Exception as exc:  # the report records the failure; the remaining lessons still run
        error = f"{type(exc).__name__}: {str(exc).strip().splitlines()[-1] if str(exc).strip() else ''}"
    return {
        "notebook": path.name,
        "seconds": round(time.perf_counter() - started, 1),
        "error": error,
        "figures": figure_outputs(notebook),
    }


def guide_column(report: dict) -> str:
    """Markdown lines for the guide: one per lesson, its GPU run time or error."""
    versions = f"torch {report['torch']}, CUDA {report['cuda']}"
    head = f"Measured by `make gpu-report` on {report['gpu']} ({versions})."
    lines = [head, "", "| lesson | GPU: Run All | result |", "|---|---|---|"]
    for lesson in report["lessons"]:
        figures = len(lesson["figures"])
        result = lesson["error"] or f"passed; {figures} quoted figure(s) in docs/gpu_report.json"
        lines.append(f"| `{lesson['notebook']}` | {lesson['seconds']} s | {result} |")
    return "\n".join(lines)


def update_guide(report: dict, guide: Path) -> bool:
    text = guide.read_text(encoding="utf-8")
    if BEGIN not in text or END not in text:
        return False
    start, stop = text.index(BEGIN) + len(BEGIN), text.index(END)
    guide.write_text(text[:start] + "\n" + guide_column(report) + "\n" + text[stop:], encoding="utf-8")
    return True


def main(argv=None) -> int:
    root = repo_root()
    try:
        report = gpu_description()
    except NoGPU as exc:
        print(f"gpu-report: {exc}", file=sys.stderr)
        return 2
    env = dict(os.environ, AMP_LESSONS_REQUIRE_CUDA="1")
    nbval = [sys.executable, "-m", "pytest", "-q", "--nbval-lax", "--nbval-current-env"]
    runs = [
        ([sys.executable, "-m", "pytest", "-q", "tests"], {}),
        ([*nbval, "solutions"], {"AMP_LESSONS_STRICT": "1"}),
        ([*nbval, "exercises"], {"AMP_LESSONS_STRICT": "not-done"}),
    ]
    codes = [subprocess.run(command, cwd=root, env={**env, **extra}).returncode for command, extra in runs]
    report["suite_passed"] = not any(codes)
    os.environ["AMP_LESSONS_REQUIRE_CUDA"] = "1"
    report["lessons"] = [run_lesson(path) for path in sorted((root / "notebooks").glob("[0-9][0-9]_*.ipynb"))]
    (root / REPORT).write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    updated = update_guide(report, root / GUIDE)
    print(f"wrote {REPORT}" + (f" and the GPU column of {GUIDE}" if updated else ""))
    failed = [lesson["notebook"] for lesson in report["lessons"] if lesson["error"]]
    suite = "passed" if report["suite_passed"] else "FAILED"
    print(f"suite {suite}; lessons failed: {', '.join(failed) or 'none'}")
    return 0 if report["suite_passed"] and not failed else 1
