"""`python -m amp_lessons doctor`: is this machine ready for the workshop?

An instructor runs it on every laptop before the session. Each check says what it found and, when it
fails, the one next step to take. A missing GPU is *not* a failure: every lesson runs on the CPU, and
the card says which parts (speed, memory) will be CPU numbers.
"""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from amp_lessons.environment import MIN_TORCH, SetupError, setup, torch_version_tuple

REPO = Path(__file__).resolve().parent.parent


@dataclass
class DoctorCheck:
    name: str
    ok: bool
    found: str
    next_step: str = ""

    def line(self) -> str:
        text = f"[{'ok' if self.ok else 'FAIL'}] {self.name}: {self.found}"
        return text if self.ok else f"{text}\n       next step: {self.next_step}"


def installed_version(distribution: str) -> str | None:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


def major(version: str | None) -> int | None:
    if not version:
        return None
    digits = version.split(".")[0]
    return int(digits) if digits.isdigit() else None


def check_torch(version: str) -> DoctorCheck:
    ok = torch_version_tuple(version) >= MIN_TORCH
    return DoctorCheck(
        "torch 2.4 or newer",
        ok,
        version,
        "pip install --upgrade 'torch>=2.4' (then restart the kernel)",
    )


def check_widgets(ipywidgets: str | None, lab_widgets: str | None, jupyterlab: str | None) -> DoctorCheck:
    """ipywidgets 8 pairs with jupyterlab_widgets 3 (and JupyterLab 3+); ipywidgets 7 with jupyterlab_widgets 1."""
    found = f"ipywidgets {ipywidgets or 'missing'}, jupyterlab_widgets {lab_widgets or 'missing'}, jupyterlab {jupyterlab or 'missing'}"
    fix = "pip install -r requirements.txt  (installs ipywidgets 8, jupyterlab_widgets 3 and JupyterLab 4 together)"
    if not ipywidgets or not lab_widgets or not jupyterlab:
        return DoctorCheck("widgets work in JupyterLab", False, found, fix)
    pairs = {8: 3, 7: 1}
    ok = pairs.get(major(ipywidgets)) == major(lab_widgets) and (major(jupyterlab) or 0) >= 4 and major(ipywidgets) == 8
    return DoctorCheck("widgets work in JupyterLab", ok, found, fix)


def check_kernel_imports_package(notebooks: Path) -> DoctorCheck:
    """Start the 'python3' kernel's interpreter in notebooks/ and import the package there."""
    try:
        from jupyter_client.kernelspec import KernelSpecManager

        argv = KernelSpecManager().get_kernel_spec("python3").argv
        python = argv[0] if argv else sys.executable
        # jupyter_client starts a bare "python" kernel command with the server's own interpreter
        if python in ("python", "python3", f"python3.{sys.version_info[1]}"):
            python = sys.executable
    except Exception:
        python = sys.executable
    where = notebooks if notebooks.is_dir() else Path.cwd()
    try:
        run = subprocess.run(
            [python, "-c", "import amp_lessons, sys; print(amp_lessons.__file__)"],
            cwd=where, capture_output=True, text=True, timeout=120,
        )
        ok = run.returncode == 0
        found = f"kernel python {python} imports {run.stdout.strip()}" if ok else (run.stderr.strip().splitlines() or ["failed"])[-1]
    except (OSError, subprocess.TimeoutExpired) as exc:
        ok, found = False, f"could not start {python}: {exc}"
    return DoctorCheck(
        "the notebooks' kernel can import amp_lessons",
        ok,
        found,
        f"from the course folder run: {python} -m pip install -e .",
    )


def run_doctor(out=print) -> int:
    """Print the card and the checks; return the exit code (0 = ready)."""
    checks = []
    try:
        env = setup()
        out(str(env))
        out("")
    except SetupError as exc:
        checks.append(DoctorCheck("device", False, str(exc), "fix the device settings above, or unset AMP_LESSONS_DEVICE / AMP_LESSONS_REQUIRE_CUDA"))
        env = None
    import torch

    checks.append(check_torch(torch.__version__))
    checks.append(check_widgets(installed_version("ipywidgets"), installed_version("jupyterlab_widgets"), installed_version("jupyterlab")))
    checks.append(check_kernel_imports_package(REPO / "notebooks"))
    if env is not None:
        works, note = env.grad_scaler
        checks.append(DoctorCheck("GradScaler runs here", works, note, "upgrade torch: torch.amp.GradScaler needs 2.3+ (this course needs 2.4+)"))
        checks.append(DoctorCheck(
            "at least one autocast dtype works",
            bool(env.autocast_dtypes),
            ", ".join(str(d) for d in env.autocast_dtypes) or "none",
            "upgrade torch to 2.4+; CPU autocast supports bfloat16 and float16 there",
        ))
    out("Workshop readiness")
    for check in checks:
        out(check.line())
    failures = [c for c in checks if not c.ok]
    if env is not None and not env.is_gpu:
        out("note: no GPU here. Every lesson runs; lesson 07's speed and memory results will be CPU numbers.")
    out("READY" if not failures else f"NOT READY: {len(failures)} check(s) failed; take the next steps above.")
    return 0 if not failures else 1
