"""What `grade` does so that a learner's notebook does not reach the grader (and what it cannot do).

A notebook under grading is arbitrary code running as the grading user. Grading therefore:

- starts each notebook's kernel with a **minimal environment** (:func:`minimal_environment`): a short list of
  harmless variables, never the instructor's tokens or keys, and a fresh ``HOME`` and ``TMPDIR`` per notebook;
- makes the grading processes **non-dumpable** on Linux (:func:`hide_this_process`): another process of the
  same user can then no longer read their environment, open files or working folder through ``/proc`` (their
  command line stays visible, as for every process);
- **kills everything the notebook started** when it ends (:func:`end_processes`): the kernel's process group,
  and on Linux every process that still carries the notebook's run token in its environment, which finds
  children that left the group with ``setsid``.

What it cannot stop: learner code runs *as the grading user*. It can read and write every file that user can
(other submissions, the CSV while grading runs, ``~/.ssh``), use the network, and a process that both leaves
the group and clears its environment survives. Grade as a user that owns nothing else, or in a container::

    sudo -u grader -H .venv/bin/python -m amp_lessons grade submissions/ --csv /tmp/grades.csv
    docker run --rm --network none -v "$PWD":/course -w /course IMAGE \\
        .venv/bin/python -m amp_lessons grade submissions/ --csv grades.csv
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from pathlib import Path

from amp_lessons.core.processes import tagged_processes

TOKEN_VARIABLE = "AMP_LESSONS_GRADE_RUN"
# Passed through when set: how to find programs and libraries, the locale, and the course's own device and
# thread settings. Anything else (cloud keys, tokens, SSH agents, the instructor's shell) stays behind.
KEPT_VARIABLES = (
    "PATH",
    "LANG",
    "LANGUAGE",
    "LC_ALL",
    "LC_CTYPE",
    "TZ",
    "USER",
    "LOGNAME",
    "SHELL",
    "LD_LIBRARY_PATH",
    "DYLD_LIBRARY_PATH",
    "SYSTEMROOT",
    "COMSPEC",
    "PATHEXT",
    "WINDIR",
    "VIRTUAL_ENV",
    "CONDA_PREFIX",
    "PYTHONPATH",
    "JUPYTER_PATH",
    "JUPYTER_DATA_DIR",
    "AMP_LESSONS_DEVICE",
    "AMP_LESSONS_REQUIRE_CUDA",
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
    "CUDA_VISIBLE_DEVICES",
    "HIP_VISIBLE_DEVICES",
    "ROCR_VISIBLE_DEVICES",
    "CUBLAS_WORKSPACE_CONFIG",
)


def minimal_environment(scratch: Path, extra: dict | None = None, source: dict | None = None) -> dict:
    """The environment a grading kernel gets: :data:`KEPT_VARIABLES` from ``source`` plus ``extra``.

    ``HOME`` and ``TMPDIR`` point into ``scratch``; ``JUPYTER_PATH`` keeps the kernel specs this user can see
    (a kernel registered under the real ``HOME`` must still be found).
    """
    source = os.environ if source is None else source
    env = {name: source[name] for name in KEPT_VARIABLES if source.get(name)}
    home, temporary = scratch / "home", scratch / "tmp"
    home.mkdir(parents=True, exist_ok=True)
    temporary.mkdir(parents=True, exist_ok=True)
    env.update(
        HOME=str(home),
        TMPDIR=str(temporary),
        TMP=str(temporary),
        TEMP=str(temporary),
        PYTHONDONTWRITEBYTECODE="1",
        PYTHONUNBUFFERED="1",
        MPLCONFIGDIR=str(home / ".matplotlib"),
    )
    with contextlib.suppress(Exception):  # jupyter_core is there wherever a kernel can run
        from jupyter_core.paths import jupyter_path

        env["JUPYTER_PATH"] = os.pathsep.join(
            dict.fromkeys([*filter(None, env.get("JUPYTER_PATH", "").split(os.pathsep)), *jupyter_path()])
        )
    env.update(extra or {})
    return env


def hide_this_process() -> bool:
    """Linux: make this process non-dumpable, so same-user processes cannot read its /proc environ, fd, cwd.

    Returns whether it worked (False elsewhere). Root can still read everything: do not grade as root.
    """
    if not sys.platform.startswith("linux"):
        return False
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        pr_set_dumpable = 4
        return libc.prctl(pr_set_dumpable, 0, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def _signal_group(pgid: int, signum: int) -> None:
    if pgid > 1 and hasattr(os, "killpg") and pgid != os.getpgrp():
        with contextlib.suppress(OSError):
            os.killpg(pgid, signum)


def end_processes(token: str = "", groups=()) -> int:
    """SIGKILL the given process groups and every process tagged with ``token``; return the tagged count."""
    sigkill = getattr(signal, "SIGKILL", signal.SIGTERM)
    for pgid in groups:
        if pgid:
            _signal_group(int(pgid), sigkill)
    tagged = tagged_processes(TOKEN_VARIABLE, token) if token else []
    for pid in tagged:
        with contextlib.suppress(OSError):
            os.kill(pid, sigkill)
    return len(tagged)
