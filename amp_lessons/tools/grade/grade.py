"""`python -m amp_lessons grade PATH... [--csv FILE]`: the quick way to grade a folder of learners' notebooks.

For a workshop without nbgrader (nbgrader is the full path: see docs/instructor_guide.md), collect the
learners' ``exercises/NN_*.ipynb`` (one folder per learner, or any layout) and run
``python -m amp_lessons grade submissions/``. It protects the grades the way nbgrader's autograde does:

- **check cells come from the course's source** (``solutions/``), never from the learner's copy: each
  notebook's lesson is told by its metadata or its file name, and every graded check cell is restored from
  that lesson's source notebook (deleted ones are put back), see ``course.restore_check_cells``;
- **verdicts are reached outside the learner's kernel**: the learner's cells run in a sandboxed kernel
  (bubblewrap where installed), and a judge process runs the course's checkers itself, calling the learner's
  functions in the kernel and reading back only plain data (``judge``, ``codec``); labels the course does not
  know are ignored (``worker``);
- each notebook runs in a **fresh kernel**, in a worker process of its own with a **minimal environment**, a
  time limit (``--timeout``, default 120 s); everything it started is killed when it ends (``sandbox``); the
  learner's file is read, never written, symbolic links and other non-regular files are refused;
- **rows are written as each notebook finishes** and the CSV is replaced atomically: the file starts with
  a ``not graded`` row per notebook, each replaced by its real rows when it is done, so a crash, a kill or
  Ctrl-C leaves every finished row and says which notebooks were not graded; an output path that cannot be
  written is refused before grading starts; cells are escaped for terminals and spreadsheets (``table``).

What this stops and what it cannot: docs/grading.md.

One row per (learner file, exercise): ``status`` is one of ``passed``, ``failed``, ``not done`` (the check
ran on the untouched stub), ``not attempted`` (the check cell ran but its check did not, e.g. the learner's
function is missing), ``checker error``, ``timed out``, ``kernel died``, ``grader killed`` (the notebook
killed its grading process), ``unreadable``, ``unknown lesson``, ``could not run`` or ``not graded``.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from pathlib import Path

from amp_lessons.core.files import repo_root
from amp_lessons.tools.exercises import course
from amp_lessons.tools.grade import sandbox, table
from amp_lessons.tools.grade.worker import (
    CHECKER_BUG,
    ERROR,
    FAILED,
    KERNEL_DIED,
    NO_CHECKS,
    NOT_ATTEMPTED,
    NOT_DONE,
    PASSED,
    TIMED_OUT,
    UNKNOWN_LESSON,
    UNREADABLE,
    WHOLE_NOTEBOOK,
    row,
)

COLUMNS = table.COLUMNS
NOT_GRADED = "not graded"
GRADER_KILLED = "grader killed"
STARTUP_ALLOWANCE = 180.0  # seconds a worker may take beyond --timeout: starting and stopping its kernel
SCRATCH_PREFIX = "amp_lessons_grade_"
__all__ = [
    "CHECKER_BUG",
    "ERROR",
    "FAILED",
    "GRADER_KILLED",
    "KERNEL_DIED",
    "NOT_ATTEMPTED",
    "NOT_DONE",
    "NOT_GRADED",
    "NO_CHECKS",
    "PASSED",
    "TIMED_OUT",
    "UNKNOWN_LESSON",
    "UNREADABLE",
    "WHOLE_NOTEBOOK",
    "COLUMNS",
    "display_name",
    "find_notebooks",
    "grade",
    "pending_rows",
    "summary",
]


def find_notebooks(paths) -> list[Path]:
    """Every ``.ipynb`` in the given files and folders (folders searched recursively), in a stable order."""
    found = []
    for name in paths:
        path = Path(name)
        if path.is_dir() and path.suffix != ".ipynb":  # a folder named x.ipynb is a (refused) submission
            found += sorted(p for p in path.rglob("*.ipynb") if ".ipynb_checkpoints" not in p.parts)
        else:
            found.append(path)  # a missing or odd file still gets a row that says what is wrong
    return list(dict.fromkeys(found))


def display_name(path: Path) -> str:
    try:
        relative = os.path.relpath(path)
    except ValueError:  # another drive on Windows
        return str(path)
    return str(path) if relative.startswith("..") else relative


def pending_rows(notebooks) -> list[dict]:
    message = "not graded: grading stopped before this notebook was finished; run grade again"
    return [row(display_name(path), WHOLE_NOTEBOOK, NOT_GRADED, message, 0.0) for path in notebooks]


def summary(rows) -> str:
    return table.summary(rows, WHOLE_NOTEBOOK)


# ------------------------------------------------------------------------------------- scratch folders


def _remove_stale_scratch(folder: Path) -> None:
    """Remove scratch folders left by a grader that was killed (its process no longer exists)."""
    for stale in folder.glob(f"{SCRATCH_PREFIX}*"):
        try:
            owner = int((stale / "owner.pid").read_text())
            os.kill(owner, 0)
        except ProcessLookupError:
            shutil.rmtree(stale, ignore_errors=True)
        except (OSError, ValueError):
            continue  # another user's, still running, or not ours


@contextlib.contextmanager
def _scratch_root():
    base = Path(tempfile.gettempdir())
    _remove_stale_scratch(base)
    root = Path(tempfile.mkdtemp(prefix=SCRATCH_PREFIX))
    (root / "owner.pid").write_text(str(os.getpid()))
    try:
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


# ----------------------------------------------------------------------------------------- one worker


class _Worker:
    """One notebook's grading process: started, waited for, and cleaned up after, whatever happened."""

    def __init__(self, path: Path, scratch: Path, options: dict):
        self.path, self.scratch, self.options = path, scratch, options
        self.token = secrets.token_hex(16)
        self.process = None
        self.cancelled = threading.Event()

    def _job(self) -> dict:
        return {
            "notebook": str(Path(self.path).absolute()),
            "name": display_name(self.path),
            "sources": str(self.options["sources"]),
            "timeout": self.options["timeout"],
            "kernel": self.options["kernel"],
            "scratch": str(self.scratch),
            "hidden_folders": self.options["hidden"][0],
            "hidden_files": self.options["hidden"][1],
            "in_memory": self.options.get("in_memory"),
            "own_checks": bool(self.options.get("own_checks")),
        }

    def _env(self) -> dict:
        extra = {
            sandbox.TOKEN_VARIABLE: self.token,
            "AMP_LESSONS_PROGRESS_FILE": "off",
            "PYTHONPATH": str(repo_root()),
        }
        inherited = os.environ.get("PYTHONPATH")
        if inherited:
            extra["PYTHONPATH"] = os.pathsep.join([str(repo_root()), inherited])
        return sandbox.minimal_environment(self.scratch, extra)

    def run(self) -> list[dict]:
        started = time.monotonic()
        if self.cancelled.is_set():
            return []
        self.process = subprocess.Popen(
            [sys.executable, "-m", "amp_lessons.tools.grade.worker"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd=self.scratch,
            env=self._env(),
            start_new_session=True,
            # the judge too: a report it replays (05.2's trace) must not be able to exhaust the machine's memory
            preexec_fn=sandbox.limit_resources,
        )
        limit = float(self.options["timeout"]) + STARTUP_ALLOWANCE
        try:
            out, err = self.process.communicate(json.dumps(self._job()).encode("utf-8"), timeout=limit)
            overran = False
        except subprocess.TimeoutExpired:
            self.stop()
            out, err = self.process.communicate()
            overran = True
        finally:
            self.stop()
        return self._rows(out, err, overran, time.monotonic() - started)

    def stop(self) -> None:
        """Kill the worker, its kernel and everything they started (safe to call any time, more than once)."""
        groups = [self.process.pid] if self.process else []
        with contextlib.suppress(OSError, ValueError):
            groups.append(int((self.scratch / "kernel.pgid").read_text() or 0))
        sandbox.end_processes(self.token, groups)

    def _rows(self, out: bytes, err: bytes, overran: bool, seconds: float) -> list[dict]:
        code = self.process.returncode
        if code == 0 and not overran:
            try:
                rows = json.loads(out.decode("utf-8"))
                if isinstance(rows, list) and rows and all(isinstance(r, dict) for r in rows):
                    return [{name: r.get(name) for name in COLUMNS} for r in rows]
            except ValueError:
                pass
        where = ""
        with contextlib.suppress(OSError, ValueError):
            number, first = (self.scratch / "cell").read_text().split("\t", 1)
            where = f" in cell {int(number)} (`{first}`)"
        if self.cancelled.is_set():
            return []
        if overran:
            status, message = TIMED_OUT, f"its grading process did not finish within {seconds:.0f} s{where}"
        elif code is not None and code < 0:
            name = signal.Signals(-code).name if -code in signal.valid_signals() else str(-code)
            status, message = GRADER_KILLED, f"the notebook stopped its grading process ({name}){where}"
        else:
            lines = err.decode("utf-8", "replace").strip().splitlines()
            last = lines[-1] if lines else "?"
            status, message = ERROR, f"the grading process failed (exit {code}): {last}"
        return [
            row(display_name(self.path), label, status, message, seconds)
            for label in _labels_of(self.path, self.options["sources"])
        ]


def _labels_of(path: Path, sources: Path) -> list[str]:
    """The exercise labels of the lesson a file belongs to (from the course's source), for rows without
    a run."""
    from amp_lessons.checks import registry
    from amp_lessons.tools.grade.worker import expected_labels

    notebook = None
    with contextlib.suppress(OSError, ValueError):
        notebook = json.loads(Path(path).read_text(encoding="utf-8"))
    source = course.lesson_source(
        Path(path), notebook if isinstance(notebook, dict) else None, course.source_notebooks(Path(sources))
    )
    if source is None:
        return [WHOLE_NOTEBOOK]
    labels = expected_labels(json.loads(source.read_text(encoding="utf-8")), registry.declared_checks())
    return [label for found in labels.values() for label in found] or [WHOLE_NOTEBOOK]


# ------------------------------------------------------------------------------------------ all of them


def grade(
    paths,
    timeout: float = 120.0,
    kernel_name: str = "python3",
    jobs: int = 1,
    on_notebook=None,
    csv_path: Path | None = None,
    sources: Path | None = None,
    roots=None,
) -> list[dict]:
    """Grade every notebook under ``paths``, ``jobs`` at a time; one row per (learner file, exercise).

    With ``csv_path`` the table is rewritten (atomically) after every notebook, unfinished ones marked
    ``not graded``. Ctrl-C stops every running notebook, writes the table and raises ``KeyboardInterrupt``.
    """
    notebooks = find_notebooks(paths)
    options = {
        "timeout": float(timeout),
        "kernel": kernel_name,
        # absolute: the worker that reads them runs in a scratch folder of its own
        "sources": Path(sources).absolute() if sources else repo_root() / "solutions",
        "hidden": sandbox.hidden_paths(
            [*paths, *notebooks], [p for p in (csv_path, sources) if p is not None]
        ),
    }
    sandbox.hide_this_process()
    finished: dict[Path, list[dict]] = {}

    def write() -> None:
        if csv_path is not None:
            rows = [r for path in notebooks for r in finished.get(path) or pending_rows([path])]
            table.write_csv(csv_path, rows)
            table.write_learners(
                csv_path, rows, WHOLE_NOTEBOOK, [display_name(Path(p)) for p in roots or paths]
            )

    with _scratch_root() as root, ThreadPoolExecutor(max_workers=max(1, int(jobs))) as pool:
        workers = [_Worker(path, Path(tempfile.mkdtemp(dir=root)), options) for path in notebooks]
        futures = {pool.submit(worker.run): worker for worker in workers}
        try:
            waiting = set(futures)
            while waiting:
                done, waiting = wait(waiting, timeout=0.5, return_when=FIRST_COMPLETED)
                for future in done:
                    worker = futures[future]
                    finished[worker.path] = future.result()
                    write()
                    if on_notebook:
                        on_notebook(worker.path, finished[worker.path])
        except BaseException:
            for worker in workers:
                worker.cancelled.set()
                worker.stop()
            for future in futures:
                future.cancel()
            write()
            raise
    return [r for path in notebooks for r in finished.get(path, [])]
