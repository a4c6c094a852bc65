"""Core: the processes a run started, found by the token it gave them.

``tagged_processes`` finds the processes carrying a run's token in their environment, so that grading (tools)
and lesson 09's launcher end exactly the processes they started, and nothing else.
"""

from __future__ import annotations

import os
from pathlib import Path


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
