"""Peak memory and CPU of each lesson, the numbers behind the hub's per-learner limits.

Runs each notebook top to bottom in a fresh kernel (nbclient, the engine of ``jupyter execute`` and nbval), one at a
time, and samples the kernel's whole process tree (torchrun's ranks and compile workers included) every 50 ms:

    .venv/bin/python deploy/jupyterhub/measure_lessons.py [notebooks/*.ipynb solutions/*.ipynb] [--markdown]

For each notebook it prints the peak resident memory of the kernel and its children together (RSS summed over
processes alive at the same moment, so libraries shared between processes count more than once: an upper bound),
the largest single process, the CPU seconds they used and the wall time. The Jupyter server itself is not
included: tests/deploy/test_hub.py measures a learner's ``jupyterhub-singleuser`` next to it.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[2]
DRIVER = """
import sys, nbformat
from nbclient import NotebookClient
path = sys.argv[1]
nb = nbformat.read(path, as_version=4)
NotebookClient(nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": sys.argv[2]}}).execute()
"""


def measure(notebook: Path) -> dict:
    """Run one notebook with nbclient in a subprocess; sample its kernel's process tree until it ends."""
    env = dict(os.environ, AMP_LESSONS_PROGRESS_FILE="off", PYTHONDONTWRITEBYTECODE="1")
    started = time.monotonic()
    driver = subprocess.Popen(
        [sys.executable, "-c", DRIVER, str(notebook), str(notebook.parent)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    peak_tree = peak_process = 0
    cpu: dict[int, float] = {}
    parent = psutil.Process(driver.pid)
    while driver.poll() is None:
        total = 0
        try:
            descendants = parent.children(recursive=True)
        except psutil.NoSuchProcess:
            break
        for process in descendants:
            try:
                rss = process.memory_info().rss
                times = process.cpu_times()
            except psutil.Error:
                continue
            total += rss
            peak_process = max(peak_process, rss)
            cpu[process.pid] = max(cpu.get(process.pid, 0.0), times.user + times.system)
        peak_tree = max(peak_tree, total)
        time.sleep(0.05)
    error = driver.stderr.read()
    return {
        "notebook": str(notebook.relative_to(ROOT)),
        "ok": driver.returncode == 0,
        "peak_mib": round(peak_tree / 2**20),
        "largest_process_mib": round(peak_process / 2**20),
        "cpu_s": round(sum(cpu.values()), 1),
        "wall_s": round(time.monotonic() - started, 1),
        "error": "" if driver.returncode == 0 else error[-400:],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("notebooks", nargs="*", type=Path)
    parser.add_argument("--markdown", action="store_true", help="print the guide's table")
    parser.add_argument("--json", type=Path, help="also write the rows here")
    args = parser.parse_args(argv)
    notebooks = [path.resolve() for path in args.notebooks] or sorted(
        (ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb")
    )
    rows = []
    for notebook in notebooks:
        rows.append(measure(notebook))
        print(json.dumps(rows[-1]), flush=True)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1) + "\n")
    if args.markdown:
        print("| notebook | peak memory, kernel + children (MiB) | largest process (MiB) | CPU s | wall s |")
        print("|---|---|---|---|---|")
        for row in rows:
            cells = (
                row["notebook"],
                row["peak_mib"],
                row["largest_process_mib"],
                row["cpu_s"],
                row["wall_s"],
            )
            print("| " + " | ".join(str(cell) for cell in cells) + " |")
    return 0 if all(row["ok"] for row in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
