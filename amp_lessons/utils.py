"""Core: the few small jobs several parts of the course share, written once.

- ``atomic_write``: a file is either the old one or the complete new one, never half of each. Checkpoints
  (lesson 06) and the learner's progress record both rely on it.
- ``scale_text``: a loss scale as people read it (``2**16`` rather than ``65536.0``).
- ``step_was_skipped``: GradScaler lowers the scale exactly when it found inf/NaN gradients and skipped the
  optimizer step, so a drop in the scale *is* a skipped step.
- ``repo_root``: the course's folder (notebooks/, solutions/, exercises/ sit there).
- ``tagged_processes``: the processes carrying a run's token in their environment, so that grading (tools)
  and lesson 09's launcher end exactly the processes they started, and nothing else.
"""

from __future__ import annotations

import contextlib
import math
import os
import tempfile
from pathlib import Path
from typing import BinaryIO, Callable


def repo_root() -> Path:
    """The folder that holds ``amp_lessons/``, ``notebooks/``, ``solutions/`` and ``exercises/``."""
    return Path(__file__).resolve().parent.parent


def scale_text(scale) -> str:
    """``2**16`` for a power of two, otherwise the number; ``-`` when there is no scale."""
    if scale is None:
        return "-"
    scale = float(scale)
    if scale > 0 and math.isfinite(scale) and math.log2(scale).is_integer():
        return f"2**{int(math.log2(scale))}"
    return f"{scale:.6g}"


def step_was_skipped(scale_before, scale_after) -> bool:
    """Did GradScaler skip this optimizer step? It did when the scale went down.

    GradScaler only lowers the scale (by ``backoff_factor``) after it found inf/NaN gradients, and it never
    lowers it otherwise; a scale that reached 0 skips every step from then on (0 * inf is NaN).
    """
    before, after = float(scale_before), float(scale_after)
    return after < before or after <= 0


def tagged_processes(variable: str, token: str) -> list[int]:
    """Linux: the processes (not this one) whose environment holds ``variable=token``, read from /proc.

    Nothing else is ever matched, even if a process id has been reused. [] where there is no /proc.
    """
    wanted = f"{variable}={token}".encode()
    found = []
    proc = Path("/proc")
    if not proc.is_dir():
        return found
    for entry in proc.iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            environ = (entry / "environ").read_bytes()
        except OSError:  # gone, another user's, or non-dumpable
            continue
        if wanted in environ.split(b"\0"):
            found.append(int(entry.name))
    return found


def _give_usual_permissions(temporary: str, path: str) -> None:
    """mkstemp creates files readable by their owner only; give the file the mode a plain open() would."""
    try:
        mode = os.stat(path).st_mode & 0o777
    except OSError:
        umask = os.umask(0)
        os.umask(umask)
        mode = 0o666 & ~umask
    with contextlib.suppress(OSError):
        os.chmod(temporary, mode)


def atomic_write(path, write: Callable[[BinaryIO], None]) -> str:
    """Call ``write(handle)`` on a temporary file next to ``path``, flush it to disk, then ``os.replace`` it.

    A rename within one folder is atomic, so a crash at any moment leaves either the old file or the complete
    new one. An exception removes the temporary file and leaves whatever was at ``path`` untouched. The folder
    must exist. Returns the absolute path written.
    """
    path = os.path.abspath(os.fspath(path))
    folder = os.path.dirname(path)
    if not os.path.isdir(folder):
        raise FileNotFoundError(f"The folder {folder} does not exist; create it first "
                                "(os.makedirs(folder, exist_ok=True)).")
    descriptor, temporary = tempfile.mkstemp(dir=folder, prefix=f".{os.path.basename(path)}.", suffix=".tmp")
    try:
        _give_usual_permissions(temporary, path)
        with os.fdopen(descriptor, "wb") as handle:
            write(handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.remove(temporary)
        raise
    with contextlib.suppress(OSError, AttributeError):  # make the rename itself durable (POSIX only)
        directory = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(directory)
        finally:
            os.close(directory)
    return path
