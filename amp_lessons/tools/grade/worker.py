"""One notebook, graded in a process of its own: ``python -m amp_lessons.tools.grade.worker`` (the judge's side).

`grade` (and, under nbgrader, ``nbgrader_judge.JudgedExecute``) starts one worker per notebook, in its own
session, with a minimal environment (see ``sandbox``). The worker reads the job as JSON on stdin and writes the
rows as JSON on stdout. It starts the learner's kernel in a sandbox (``sandbox.kernel_command``; the kernel's
stdin/stdout are a channel only the worker reads, its stderr goes nowhere), sends it the learner's cells one by
one and judges every graded check cell itself (``judge``): the check cells are the course's
(``course.restore_check_cells``), and a verdict is a ``CheckResult`` the course's checker returned in this
process. Nothing the kernel prints, records or writes becomes a verdict; labels the course does not know never
become rows. See docs/grading.md.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import stat
import sys
import threading
import time
from pathlib import Path

from amp_lessons.checks import registry
from amp_lessons.core.record import RESULTS_FILE_VARIABLE
from amp_lessons.tools.exercises import course
from amp_lessons.tools.grade import judge, sandbox

# The harness's statuses (amp_lessons.checks.harness), repeated so that grading never imports torch or a
# checker; tests/tools/test_grade.py keeps them equal.
PASSED = "passed"
FAILED = "failed"
NOT_DONE = "not done"
CHECKER_BUG = "checker error"
NOT_ATTEMPTED = "not attempted"
TIMED_OUT = "timed out"
KERNEL_DIED = "kernel died"
UNREADABLE = "unreadable"
UNKNOWN_LESSON = "unknown lesson"
NO_CHECKS = "no checks"
ERROR = "could not run"
WHOLE_NOTEBOOK = "(whole notebook)"


def first_line(cell) -> str:
    lines = [line.strip() for line in course.cell_source(cell).splitlines() if line.strip()]
    return (lines[0][:50] + ("..." if len(lines[0]) > 50 else "")) if lines else ""


def row(learner_file: str, exercise: str, status: str, message: str, seconds: float) -> dict:
    return {
        "learner_file": learner_file,
        "exercise": exercise,
        "status": status,
        "passed": status == PASSED,
        "message": capped(message),
        "seconds": round(seconds, 1),
    }


def read_learner_notebook(path: Path) -> dict:
    """The learner's notebook (nbformat 4 JSON); ``ValueError`` says why it cannot be read."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(" ".join(str(exc).split())[:200] or type(exc).__name__) from None
    try:
        notebook = json.loads(text)
    except ValueError as exc:
        raise ValueError(f"not valid JSON: {exc}") from None
    if not isinstance(notebook, dict) or not isinstance(notebook.get("cells"), list):
        raise ValueError("it has no list of cells")
    if notebook.get("nbformat") != 4:
        raise ValueError(f"nbformat {notebook.get('nbformat')!r}; JupyterLab saves nbformat 4")
    if not all(isinstance(cell, dict) for cell in notebook["cells"]):
        raise ValueError("a cell is not a JSON object")
    return notebook


def expected_labels(source: dict, known: dict) -> dict[str, list[str]]:
    """``{grade_id: [exercise labels]}``: what each graded cell of the source checks (the course's text)."""
    cells = source.get("cells", [])
    labels = {}
    for index, identifier in course.graded_cells(source):
        checks = course.called_checks(course.cell_source(cells[index]), known)
        labels[identifier] = [known[name] for name in checks]
    return labels


MESSAGE_LIMIT = 2000  # characters of a message in the table (a spreadsheet cell holds 32,767)


def capped(message: str, limit: int = MESSAGE_LIMIT) -> str:
    message = str(message)
    if len(message) <= limit:
        return message
    note = f" ... [{len(message) - limit + 60} more characters cut by the grader]"
    return message[: limit - len(note)] + note


def refuse_odd_file(path: Path) -> str:
    """Why a learner's file is not graded ('' when it is a regular file): links and devices are refused."""
    try:
        info = os.lstat(path)
    except OSError as exc:
        return " ".join(str(exc).split())[:200]
    if stat.S_ISLNK(info.st_mode):
        return "it is a symbolic link; hand in the notebook file itself"
    if not stat.S_ISREG(info.st_mode):
        return "it is not a regular file"
    return ""


class Run:
    """One notebook's run: the kernel in its sandbox, the verdicts the judge reached, each cell's error."""

    def __init__(self, job: dict):
        self.job, self.scratch = job, Path(job["scratch"])
        self.verdicts: dict = {}
        self.errors: dict = {}
        self.first_error = ""
        self.sandbox = ""

    def start(self):
        folders = [self.scratch / name for name in ("home", "tmp", "work")]
        for folder in folders:
            folder.mkdir(exist_ok=True)
        hidden = (list(self.job.get("hidden_folders", [])), list(self.job.get("hidden_files", [])))
        command, self.sandbox = sandbox.kernel_command(self.scratch / "work", folders, hidden)
        env = {key: value for key, value in os.environ.items() if key != RESULTS_FILE_VARIABLE}
        env.update(HOME=str(folders[0]), TMPDIR=str(folders[1]), TMP=str(folders[1]), TEMP=str(folders[1]))
        (self.scratch / "sandbox").write_text(self.sandbox)

        def started(pid: int) -> None:
            (self.scratch / "kernel.pgid").write_text(str(pid))

        return judge.Kernel(command, env, str(folders[2]), on_start=started, preexec=sandbox.limit_resources)

    def execute(self, notebook: dict, restored: dict, labels: dict, known: dict) -> tuple:
        """Run the notebook cell by cell; return (stop status or None, why it stopped)."""
        timeout = float(self.job["timeout"])
        current, kernel = None, None
        deadline = time.monotonic() + timeout  # from the start: a slow start counts too
        try:
            kernel = self.start()
            for module in {registry_module(known, name) for name in _called(restored, notebook, known)}:
                importlib.import_module(module)  # the judge loads its checkers while the kernel starts
            kernel.wait_ready(max(1.0, deadline - time.monotonic()))
            for index, cell in enumerate(notebook["cells"]):
                if cell.get("cell_type") != "code":
                    continue
                current = (index, cell)
                (self.scratch / "cell").write_text(f"{index + 1}\t{first_line(cell)}")
                if index in restored:
                    error = self.judge_cell(
                        kernel, course.cell_source(cell), labels.get(restored[index], []), known
                    )
                else:
                    error = kernel.run_cell(course.cell_source(cell), deadline)
                self.errors[index] = (
                    f"cell {index + 1} (`{first_line(cell)}`) raised {error}" if error else ""
                )
                self.first_error = self.first_error or self.errors[index]
                if time.monotonic() > deadline:
                    raise judge.KernelGone("timed out", TIMED_OUT)
        except judge.KernelGone as gone:
            where = f" in cell {current[0] + 1} (`{first_line(current[1])}`)" if current else ""
            if gone.status == TIMED_OUT:
                return TIMED_OUT, f"stopped after {timeout:g} s{where}"
            return KERNEL_DIED, f"the kernel died{where}"
        except Exception as exc:  # the kernel would not start, ...
            text = str(exc).strip().splitlines()
            return ERROR, f"{type(exc).__name__}: {text[0][:200] if text else ''}"
        finally:
            if kernel is not None:
                kernel.stop()
            sandbox.end_processes(os.environ.get(sandbox.TOKEN_VARIABLE, ""), [])
        return None, ""

    def judge_cell(self, kernel, source: str, labels: list, known: dict) -> str:
        """The course's check cell, judged here; returns the error the cell would have raised ('' if none)."""
        try:
            results = judge.judge_check_cell(kernel, source, known)
        except judge.NotAttempted as why:
            return str(why)
        except ValueError as exc:
            for label in labels:
                self.verdicts[label] = {
                    "status": CHECKER_BUG,
                    "passed": False,
                    "message": f"course bug: {exc}",
                }
            return ""
        for result in results:
            if "KernelGone" in result.message:  # the kernel died during the call: said as such below
                continue
            if result.exercise in labels:
                self.verdicts[result.exercise] = {
                    "status": result.status,
                    "passed": result.passed is True and result.status == PASSED,
                    "message": result.message,
                }
        if kernel.broken:  # e.g. stopped at the check's time budget: the check said so; nothing more runs
            raise judge.KernelGone(kernel.broken)
        return ""


def _called(restored: dict, notebook: dict, known: dict) -> list:
    cells = notebook["cells"]
    return [
        name for index in restored for name in course.called_checks(course.cell_source(cells[index]), known)
    ]


def registry_module(known: dict, name: str) -> str:
    from amp_lessons.checks import CHECKS

    return CHECKS.get(name, "amp_lessons.checks")


def _rows_for(name, order, labels, restored, outcome, run, seconds) -> list[dict]:
    stopped, why = outcome
    first_error, errors = run.first_error, run.errors
    cell_of = {identifier: index for index, identifier in restored.items()}
    rows = []
    for identifier in order:
        for label in labels[identifier]:
            result = run.verdicts.get(label)
            index = cell_of.get(identifier)
            if result:
                status = PASSED if result["passed"] else str(result["status"] or FAILED)
                status = FAILED if status == PASSED and not result["passed"] else status
                rows.append(row(name, label, status, str(result.get("message", "")), seconds))
            elif index is not None and errors.get(index):
                earlier = f"; first error: {first_error}" if first_error != errors[index] else ""
                message = f"the check did not run: {errors[index]}{earlier}"
                rows.append(row(name, label, NOT_ATTEMPTED, message, seconds))
            elif stopped:
                rows.append(row(name, label, stopped, f"{why}, before this check ran", seconds))
            else:
                detail = f" ({first_error})" if first_error else ""
                rows.append(row(name, label, NOT_ATTEMPTED, f"its check never ran{detail}", seconds))
    return rows


def grade_one(job: dict) -> list[dict]:
    """Grade one notebook: one row per exercise of its lesson (see `grade` for the statuses)."""
    started = time.monotonic()
    name, path = job["name"], Path(job["notebook"])
    known = registry.declared_checks()
    sources = course.source_notebooks(Path(job["sources"]))
    try:
        odd = refuse_odd_file(path) if not job.get("in_memory") else ""
        if odd:
            raise ValueError(odd)
        notebook = job["in_memory"] if job.get("in_memory") else read_learner_notebook(path)
    except ValueError as exc:
        source_path = course.lesson_source(path, None, sources)
        message = f"not a readable notebook ({exc}); ask the learner to save it again from JupyterLab"
        source = json.loads(source_path.read_text(encoding="utf-8")) if source_path else {}
        labels = expected_labels(source, known)
        flat = [label for found in labels.values() for label in found] or [WHOLE_NOTEBOOK]
        return [row(name, label, UNREADABLE, message, time.monotonic() - started) for label in flat]
    if job.get("own_checks"):  # nbgrader restored the check cells from its own copy of the source already
        return _graded(name, notebook, notebook, job, known, started)
    source_path = course.lesson_source(path, notebook, sources)
    if source_path is None:
        lessons = ", ".join(f"{stem}.ipynb" for stem in sources) or "none found"
        message = f"cannot tell which lesson this notebook belongs to: name it after its exercise ({lessons})"
        return [row(name, WHOLE_NOTEBOOK, UNKNOWN_LESSON, message, time.monotonic() - started)]
    return _graded(name, notebook, json.loads(source_path.read_text(encoding="utf-8")), job, known, started)


def _graded(name: str, notebook: dict, source: dict, job: dict, known: dict, started: float) -> list[dict]:
    runnable, restored = course.restore_check_cells(notebook, source)
    labels = expected_labels(source, known)
    run = Run(job)
    outcome = run.execute(runnable, restored, labels, known)
    order = [identifier for _, identifier in course.graded_cells(source)]
    rows = _rows_for(name, order, labels, restored, outcome, run, time.monotonic() - started)
    for found in rows:
        found["sandbox"] = run.sandbox
    if not rows:
        stopped, why = outcome
        missing = "the source notebook has no graded check cells (`python -m amp_lessons mark-solutions`)"
        status, message = (stopped, why) if stopped else (NO_CHECKS, missing)
        rows.append(row(name, WHOLE_NOTEBOOK, status, message, time.monotonic() - started))
    return rows


def _end_with_parent(scratch: Path) -> None:
    """If `grade` dies (killed, Ctrl-C), end this notebook's kernel and everything it started, then exit."""
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(0.5)
        groups = []
        with contextlib.suppress(OSError, ValueError):
            groups.append(int((scratch / "kernel.pgid").read_text() or 0))
        sandbox.end_processes(os.environ.get(sandbox.TOKEN_VARIABLE, ""), groups)
        os._exit(3)

    threading.Thread(target=watch, daemon=True).start()


def main() -> int:
    sandbox.hide_this_process()
    job = json.loads(sys.stdin.read())
    _end_with_parent(Path(job["scratch"]))
    import tempfile

    temporary = Path(job["scratch"]) / "tmp"  # the checkers' temporary files: where the kernel can write
    temporary.mkdir(exist_ok=True)
    os.environ["TMPDIR"] = tempfile.tempdir = str(temporary)
    rows = grade_one(job)
    sys.stdout.write(json.dumps(rows))
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
