"""Core: files the course writes and finds.

- ``atomic_write``: a file is either the old one or the complete new one, never half of each. Checkpoints
  (lesson 06), the learner's progress record and the grade table all rely on it.
- ``repo_root``: the course's folder (notebooks/, solutions/, exercises/ sit there).
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path
from typing import BinaryIO, Callable


def repo_root() -> Path:
    """The folder that holds ``amp_lessons/``, ``notebooks/``, ``solutions/`` and ``exercises/``."""
    return Path(__file__).resolve().parents[2]


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
        raise FileNotFoundError(
            f"The folder {folder} does not exist; create it first (os.makedirs(folder, exist_ok=True))."
        )
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
