"""Where a learner's notebook runs while it is graded, and ending everything it started.

- :func:`kernel_command`: the learner's kernel in the strongest sandbox the machine has (:func:`kind`):
  **bubblewrap** (no network, own process namespace, fresh /tmp and homes, the file system read-only, answers,
  checkers, submissions and outputs hidden), else **unshare** (no network, own process namespace), else a plain
  **process group**; with :func:`limit_resources` (memory, file size, no core files);
- :func:`minimal_environment`: a short list of harmless variables, never the instructor's tokens or keys, and a
  fresh ``HOME`` and ``TMPDIR`` per notebook;
- :func:`hide_this_process`: the grading processes are non-dumpable on Linux (another process of the same user
  cannot read their environment, open files or memory through ``/proc``);
- :func:`end_processes`: kill a process group and every process tagged with the run's token.

What each sandbox still allows, and the attacks tested against them: docs/grading.md.
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
    "AMP_LESSONS_SANDBOX",
    "AMP_LESSONS_GRADE_MEMORY_GB",
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


# ------------------------------------------------------------------------------------ the kernel's sandbox

BWRAP = "bubblewrap"
UNSHARE = "unshare"
PLAIN = "process group"
SANDBOX_VARIABLE = (
    "AMP_LESSONS_SANDBOX"  # bubblewrap | unshare | process group: use that one (tests, debugging)
)
MEMORY_VARIABLE = "AMP_LESSONS_GRADE_MEMORY_GB"
DEFAULT_MEMORY_GB = 8.0
_AVAILABLE: dict = {}


def _works(command: list) -> bool:
    import subprocess

    if command[0] not in _AVAILABLE:
        try:
            done = subprocess.run(
                [*command, "true"], stdin=subprocess.DEVNULL, capture_output=True, timeout=20, check=False
            )
            _AVAILABLE[command[0]] = done.returncode == 0
        except (OSError, subprocess.SubprocessError):
            _AVAILABLE[command[0]] = False
    return _AVAILABLE[command[0]]


def _unshare_prefix() -> list:
    user = [] if os.geteuid() == 0 else ["--user", "--map-root-user"]
    return ["unshare", *user, "--net", "--pid", "--fork", "--kill-child", "--mount-proc", "--"]


def describe(chosen: str) -> str:
    return {
        BWRAP: "bubblewrap: no network, private home and /tmp, the course read-only, answers and checkers hidden",
        UNSHARE: "unshare: no network, own process namespace; files NOT hidden (install bubblewrap)",
        PLAIN: "a process group only: network and files NOT hidden (install bubblewrap)",
    }.get(chosen, chosen)


def kind() -> str:
    """Which sandbox this machine gives a grading kernel: bubblewrap, else unshare, else a process group."""
    import shutil

    wanted = os.environ.get(SANDBOX_VARIABLE, "")
    if not sys.platform.startswith("linux") or wanted == PLAIN:
        return PLAIN
    if wanted in ("", BWRAP) and shutil.which("bwrap"):
        if _works(
            ["bwrap", "--unshare-all", "--die-with-parent", "--ro-bind", "/", "/", "--proc", "/proc", "--"]
        ):
            return BWRAP
    if wanted in ("", BWRAP, UNSHARE) and shutil.which("unshare") and _works(_unshare_prefix()):
        return UNSHARE
    return PLAIN


def hidden_paths(graded=(), extra=()) -> tuple[list, list]:
    """(folders, files) the kernel must not see: the course's answers and checkers, the submissions, the
    nbgrader course, the instructor's home and every output."""
    from amp_lessons.checks import registry
    from amp_lessons.core.files import repo_root

    root = repo_root()
    needed = [
        root,
        Path(sys.prefix).resolve(),
        Path(sys.base_prefix).resolve(),
        Path(sys.executable).resolve(),
    ]
    folders = [root / name for name in ("solutions", ".git", "course", "tests", "shared")]
    files = list(registry.check_files())
    files += [Path(p) for p in extra]
    for path in map(lambda p: Path(p).absolute(), graded):
        folder = path if path.is_dir() else path.parent
        files += [] if path.is_dir() else [path]
        if not any(folder == n or folder in n.parents for n in needed):  # never hide the course itself
            folders.append(folder)
    folders = sorted({p for p in folders if p.is_dir() and not p.is_symlink()})
    inside = [
        f for f in files if f.is_file() and not any(folder in f.absolute().parents for folder in folders)
    ]
    return [str(p) for p in folders], sorted({str(p.absolute()) for p in inside})


def _homes() -> list:
    import pwd

    found = {Path(os.path.expanduser("~")), Path("/root"), Path("/home")}
    with contextlib.suppress(KeyError, OSError):
        found.add(Path(pwd.getpwuid(os.getuid()).pw_dir))
    found = {p.resolve() for p in found if str(p) not in ("/", "") and p.is_dir()}
    return sorted(p for p in found if not any(other in p.parents for other in found))


def _python_folders() -> set:
    """What the kernel's Python imports from: its prefixes, and every site-packages folder on ``sys.path`` (a
    ``.pth`` file may add another environment's: the hub's ``.venv-hub`` sees the course's ``.venv`` that way)."""
    found = {Path(sys.prefix).resolve(), Path(sys.base_prefix).resolve()}
    for entry in sys.path:
        if entry and Path(entry).name in ("site-packages", "dist-packages") and Path(entry).is_dir():
            found.add(Path(entry).resolve())
    return found


def _bwrap(scratch: Path, writable: list, hidden: tuple) -> list:
    from amp_lessons.core.files import repo_root

    folders, files = hidden
    command = ["bwrap", "--unshare-all", "--die-with-parent", "--new-session", "--ro-bind", "/", "/"]
    command += ["--dev", "/dev", "--proc", "/proc"]
    # Fresh, empty /tmp, /var/tmp, /run and homes (the instructor's and every other: keys, tokens, history). The
    # course and the Python that runs the kernel may live inside one of them (a clone in /tmp, a pyenv Python in
    # a home): those come back read-only on top, before anything is hidden inside them.
    needed = sorted({repo_root(), *_python_folders()})
    for private in [Path("/tmp"), Path("/var/tmp"), Path("/run"), *_homes()]:
        if not private.is_dir():
            continue
        command += ["--tmpfs", str(private)]
        for path in needed:
            if private in path.parents:
                command += ["--ro-bind", str(path), str(path)]
    for folder in folders:
        command += ["--tmpfs", folder]
    for file in files:
        command += ["--ro-bind", "/dev/null", file]
    for folder in writable:
        command += ["--bind", str(folder), str(folder)]
    return [*command, "--chdir", str(scratch), "--"]


def kernel_command(
    scratch: Path, writable: list, hidden: tuple, chosen: str | None = None
) -> tuple[list, str]:
    """The command that starts a learner's kernel, and the sandbox it runs in (see :func:`kind`)."""
    chosen = chosen or kind()
    python = [sys.executable, "-m", "amp_lessons.tools.grade.kernel"]
    if chosen == BWRAP:
        return [*_bwrap(scratch, writable, hidden), *python], BWRAP
    if chosen == UNSHARE:
        return [*_unshare_prefix(), *python], UNSHARE
    return python, PLAIN


def limit_resources() -> None:
    """In the kernel's process before it starts: no core files, a cap on memory (not with a GPU: CUDA maps
    far more address space than it uses) and on the size of a file it writes."""
    import resource

    with contextlib.suppress(ValueError, OSError):
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    with contextlib.suppress(ValueError, OSError):
        resource.setrlimit(resource.RLIMIT_FSIZE, (2 << 30, 2 << 30))
    try:
        gigabytes = float(os.environ.get(MEMORY_VARIABLE, DEFAULT_MEMORY_GB))
    except ValueError:
        gigabytes = DEFAULT_MEMORY_GB
    if gigabytes > 0 and not Path("/dev/nvidia0").exists():
        with contextlib.suppress(ValueError, OSError):
            size = int(gigabytes * (1 << 30))
            resource.setrlimit(resource.RLIMIT_AS, (size, size))
