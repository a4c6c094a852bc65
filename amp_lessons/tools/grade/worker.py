"""One notebook, graded in a process of its own: ``python -m amp_lessons.tools.grade.worker``.

`grade` starts one worker per notebook, in its own session, with a minimal environment (see ``sandbox``). The
worker reads the job as JSON on stdin and writes the rows as JSON on stdout; the kernel it starts gets neither
(its stdin, stdout and stderr are not the worker's), so a notebook cannot write rows. A notebook that kills
its kernel's parent kills only this worker: `grade` notices, says so in that notebook's rows and goes on.

What is run is the learner's notebook with every graded check cell taken from the course's source notebook
(``course.restore_check_cells``). Each check reports its verdict through ``$AMP_LESSONS_RESULTS_FILE`` (see
``checks.harness``); the worker reads that file after each restored check cell and keeps, for that cell, only
the verdicts of the checks the *source* cell calls. Printed text, the progress record and verdicts written at
any other moment count for nothing, and labels the course does not know never become rows.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

from amp_lessons.checks import registry
from amp_lessons.core.record import RESULTS_FILE_VARIABLE
from amp_lessons.tools.exercises import course
from amp_lessons.tools.grade import sandbox

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
        "message": message,
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


class Verdicts:
    """Reads the results file line by line; keeps what a restored check cell reported for its own labels."""

    def __init__(self, path: Path):
        self.path, self.offset, self.found = path, 0, {}

    def take(self, labels=()) -> None:
        try:
            with open(self.path, "rb") as handle:
                handle.seek(self.offset)
                data = handle.read()
        except OSError:
            return
        complete = data[: data.rfind(b"\n") + 1]
        self.offset += len(complete)
        for line in complete.splitlines():
            try:
                result = json.loads(line)
            except ValueError:
                continue
            if isinstance(result, dict) and result.get("exercise") in labels:
                self.found[result["exercise"]] = result


class Stopped(Exception):
    """The notebook run ended early: ``status`` is TIMED_OUT or KERNEL_DIED."""

    def __init__(self, status: str):
        super().__init__(status)
        self.status = status


def run_cell(manager, client, code: str, deadline: float) -> str:
    """Execute one cell; return its error as "Name: value" ("" when it ran cleanly).

    A loop over the kernel's messages, as nbclient does it, but without nbclient: grading needs only each
    cell's error, and nbformat's validators cost seconds to import in every worker. The kernel is asked
    whether it is still alive twice a second, so a kernel that dies is noticed at once, not when the time
    limit runs out.
    """
    import queue

    msg_id = client.execute(code, store_history=False, allow_stdin=False, stop_on_error=False)
    error = ""
    while True:
        if time.monotonic() > deadline:
            raise Stopped(TIMED_OUT)
        try:
            message = client.get_iopub_msg(timeout=0.5)
        except queue.Empty:
            if not manager.is_alive():
                raise Stopped(KERNEL_DIED) from None
            continue
        if message.get("parent_header", {}).get("msg_id") != msg_id:
            continue
        kind, content = message.get("msg_type"), message.get("content", {})
        if kind == "error" and not error:
            value = " ".join(str(content.get("evalue", "")).split())[:200]
            error = f"{content.get('ename')}: {value}"
        elif kind == "status" and content.get("execution_state") == "idle":
            break
    return error


def _start_kernel(job: dict):
    from jupyter_client.manager import KernelManager

    scratch = Path(job["scratch"])
    workdir = scratch / "work"
    workdir.mkdir(exist_ok=True)
    manager = KernelManager(kernel_name=job["kernel"])
    manager.start_kernel(
        env=dict(os.environ),
        cwd=str(workdir),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        extra_arguments=["--HistoryManager.hist_file=:memory:"],
    )
    provisioner = getattr(manager, "provisioner", None)
    pgid = getattr(provisioner, "pgid", None) or getattr(getattr(provisioner, "process", None), "pid", 0)
    (scratch / "kernel.pgid").write_text(str(pgid or 0))
    client = manager.client()
    client.start_channels()
    client.wait_for_ready(timeout=120)
    return manager, client


def execute(notebook: dict, job: dict, restored: dict, labels: dict, verdicts: Verdicts) -> tuple:
    """Run the notebook cell by cell; return (stop status or None, why it stopped, first error, errors)."""
    timeout, scratch = float(job["timeout"]), Path(job["scratch"])
    first_error, errors, current, manager = "", {}, None, None
    try:
        manager, client = _start_kernel(job)
        deadline = time.monotonic() + timeout
        for index, cell in enumerate(notebook["cells"]):
            if cell.get("cell_type") != "code":
                continue
            current = (index, cell)
            (scratch / "cell").write_text(f"{index + 1}\t{first_line(cell)}")
            error = run_cell(manager, client, course.cell_source(cell), deadline)
            verdicts.take(labels.get(restored.get(index), ()))
            errors[index] = f"cell {index + 1} (`{first_line(cell)}`) raised {error}" if error else ""
            first_error = first_error or errors[index]
    except Stopped as stop:
        where = f" in cell {current[0] + 1} (`{first_line(current[1])}`)" if current else ""
        why = f"stopped after {timeout:g} s{where}" if stop.status == TIMED_OUT else f"the kernel died{where}"
        return stop.status, why, first_error, errors
    except Exception as exc:  # the kernel would not start, ...
        text = str(exc).strip().splitlines()
        return ERROR, f"{type(exc).__name__}: {text[0][:200] if text else ''}", first_error, errors
    finally:
        if manager is not None:
            with contextlib.suppress(Exception):
                manager.shutdown_kernel(now=True)
        kernel_group = scratch / "kernel.pgid"
        groups = [int(kernel_group.read_text() or 0)] if kernel_group.exists() else []
        sandbox.end_processes(os.environ.get(sandbox.TOKEN_VARIABLE, ""), groups)
    return None, "", first_error, errors


def _rows_for(name, order, labels, restored, outcome, verdicts, seconds) -> list[dict]:
    stopped, why, first_error, errors = outcome
    cell_of = {identifier: index for index, identifier in restored.items()}
    rows = []
    for identifier in order:
        for label in labels[identifier]:
            result = verdicts.found.get(label)
            index = cell_of.get(identifier)
            if result:
                status = str(result.get("status") or FAILED)
                status = PASSED if result.get("passed") is True else (FAILED if status == PASSED else status)
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
        notebook = read_learner_notebook(path)
    except ValueError as exc:
        source_path = course.lesson_source(path, None, sources)
        message = f"not a readable notebook ({exc}); ask the learner to save it again from JupyterLab"
        source = json.loads(source_path.read_text(encoding="utf-8")) if source_path else {}
        labels = expected_labels(source, known)
        flat = [label for found in labels.values() for label in found] or [WHOLE_NOTEBOOK]
        return [row(name, label, UNREADABLE, message, time.monotonic() - started) for label in flat]
    source_path = course.lesson_source(path, notebook, sources)
    if source_path is None:
        lessons = ", ".join(f"{stem}.ipynb" for stem in sources) or "none found"
        message = f"cannot tell which lesson this notebook belongs to: name it after its exercise ({lessons})"
        return [row(name, WHOLE_NOTEBOOK, UNKNOWN_LESSON, message, time.monotonic() - started)]
    source = json.loads(source_path.read_text(encoding="utf-8"))
    runnable, restored = course.restore_check_cells(notebook, source)
    labels = expected_labels(source, known)
    verdicts = Verdicts(Path(os.environ[RESULTS_FILE_VARIABLE]))
    outcome = execute(runnable, job, restored, labels, verdicts)
    order = [identifier for _, identifier in course.graded_cells(source)]
    rows = _rows_for(name, order, labels, restored, outcome, verdicts, time.monotonic() - started)
    if not rows:
        stopped, why = outcome[:2]
        missing = f"{source_path.name} has no graded check cells (`python -m amp_lessons mark-solutions`)"
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
    Path(os.environ[RESULTS_FILE_VARIABLE]).touch()
    rows = grade_one(job)
    sys.stdout.write(json.dumps(rows))
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
