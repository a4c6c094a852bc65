"""nbgrader's autograde through the course's judge: ``nbgrader_config.py`` puts :class:`JudgedExecute` where
nbgrader's own ``Execute`` preprocessor was.

nbgrader restores the locked check cells from its copy of the source (``OverwriteCells``) as before. Then,
instead of running the notebook in a kernel that also judges it, this preprocessor hands the notebook to the
same worker ``python -m amp_lessons grade`` uses: the learner's cells run in a sandboxed kernel with a clean
environment and a throw-away home, and each check cell is judged outside it (``judge``). Each graded check
cell then gets one output written from the judge's verdict:

- passed: a ``stream`` output (stdout) with the check's text, so nbgrader gives full points and its log
  shows nothing (an ``execute_result`` would go through nbgrader's partial-credit parser, which logs a
  warning for every text that is not a number);
- anything else: an ``error`` output whose text is the learner's message (no traceback into the course's
  harness), so nbgrader gives 0 points and the feedback says what to fix.

Learner cells keep no outputs. Nothing of the instructor's environment or home reaches the kernel, so no
token or secret can be printed into the feedback nbgrader releases.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from nbgrader.preprocessors import NbGraderPreprocessor
from traitlets import Float, List, Unicode

from amp_lessons.tools.exercises import course
from amp_lessons.tools.grade import grade, sandbox
from amp_lessons.tools.grade.worker import PASSED, row


class JudgedExecute(NbGraderPreprocessor):
    """Runs a submission through the course's judge and writes each check cell's verdict as its output."""

    timeout = Float(300.0, help="seconds for the whole notebook (the kernel is stopped after)").tag(
        config=True
    )
    hidden = List(Unicode(), help="more folders the learner's kernel must not see").tag(config=True)

    def preprocess(self, nb, resources):
        notebook = _plain(nb)
        labels = _labels_by_cell(notebook)
        rows = self._grade(notebook, resources)
        by_label = {r["exercise"]: r for r in rows}
        for index, cell in enumerate(nb.cells):
            if cell.cell_type != "code":
                continue
            cell.outputs = []
            cell.execution_count = None
            if index in labels:
                cell.outputs = [_output(by_label.get(label), label) for label in labels[index]][:1]
                failed = [label for label in labels[index] if not (by_label.get(label) or {}).get("passed")]
                if failed:
                    cell.outputs = [_output(by_label.get(failed[0]), failed[0])]
        for found in rows:
            if not found.get("passed"):
                self.log.info("%s: %s (%s)", found["exercise"], found["status"], str(found["message"])[:200])
        return nb, resources

    def _grade(self, notebook: dict, resources) -> list[dict]:
        name = str(resources.get("unique_key") or "submission")
        course_root = Path(str(resources.get("metadata", {}).get("path", "."))).absolute()
        refused = _linked_submission(course_root, name)
        if refused:
            return [
                row(name, label, "unreadable", refused, 0.0)
                for labels in _labels_by_cell(notebook).values()
                for label in labels
            ]
        folders = [*self.hidden, *_nbgrader_folders(course_root)]
        with tempfile.TemporaryDirectory(prefix=grade.SCRATCH_PREFIX) as scratch:
            options = {
                "timeout": float(self.timeout),
                "kernel": "python3",
                "sources": str(course_root),
                "hidden": sandbox.hidden_paths(folders),
                "in_memory": notebook,
                "own_checks": True,
            }
            worker = grade._Worker(Path(f"{name}.ipynb"), Path(scratch), options)
            return worker.run()


def _linked_submission(folder: Path, name: str) -> str:
    """Why nbgrader's copy of this submission is not graded ('' when it is fine): the file the learner handed
    in (``submitted/<student>/<assignment>/<name>.ipynb``) was a symbolic or hard link (e.g. to a classmate's)."""
    import os
    import stat

    parts = folder.parts
    if "autograded" not in parts:
        return ""
    at = len(parts) - 1 - parts[::-1].index("autograded")
    handed_in = Path(*parts[:at], "submitted", *parts[at + 1 :]) / f"{name}.ipynb"
    try:
        info = os.lstat(handed_in)
    except OSError:
        return ""
    if stat.S_ISLNK(info.st_mode):
        return "not graded: the submitted notebook is a symbolic link; hand in the notebook file itself"
    if info.st_nlink > 1:
        return "not graded: the submitted notebook is a hard link to another file; hand in your own notebook"
    return ""


def _plain(nb) -> dict:
    import json

    import nbformat

    return json.loads(nbformat.writes(nb))


def _labels_by_cell(notebook: dict) -> dict[int, list[str]]:
    from amp_lessons.checks import registry

    known = registry.declared_checks()
    found = {}
    for index, cell in enumerate(notebook.get("cells", [])):
        if course.is_graded(cell) and cell.get("cell_type") == "code":
            checks = course.called_checks(course.cell_source(cell), known)
            if checks:
                found[index] = [known[name] for name in checks]
    return found


def _nbgrader_folders(course_root: Path) -> list[str]:
    """Where nbgrader keeps every learner's work and the gradebook: the kernel sees none of it."""
    root = course_root
    for parent in [course_root, *course_root.parents]:
        if (parent / "submitted").is_dir() or (parent / "gradebook.db").exists():
            root = parent
            break
    names = ("submitted", "autograded", "feedback", "release", "source")
    return [str(root / n) for n in names if (root / n).is_dir()] + [str(root)]


def _output(found: dict | None, label: str):
    from nbformat.v4 import new_output

    found = found or row("", label, "not graded", "the grader did not reach this check", 0.0)
    if found.get("passed") and found.get("status") == PASSED:
        return new_output("stream", name="stdout", text=f"[PASS] Passed — {label}\n{found['message']}\n")
    title = {"failed": "Not yet right", "not done": "Not done yet"}.get(found["status"], str(found["status"]))
    text = f"[FAIL] {title} — {label}\n{found['message']}\nThis check did not pass, so it scores 0 points."
    return new_output("error", ename="CheckNotPassed", evalue=found["message"], traceback=text.splitlines())
