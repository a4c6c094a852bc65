"""`python -m amp_lessons doctor`: is this machine ready for the workshop?

An instructor runs it on every laptop before the session. Each probe says what it found and, when something
is missing or wrong, the one command that fixes it, written for *this* Python (``<python> -m pip install
...``), so it works whichever ``python`` is first on the learner's PATH. The doctor never shows a traceback:
a probe that cannot run (numpy, torch or Jupyter missing, a kernel that will not start) is one line, and the
exit code is 1 until every probe passes. A missing GPU is *not* a failure: every lesson runs on the CPU, and
the card says which parts (speed, memory) will be CPU numbers.

The probes are named ``probe_*`` (``check_*`` names the exercise checkers) and import nothing heavy at the
top of this module, so the doctor starts in an empty virtual environment.
"""

from __future__ import annotations

import importlib.util
import shlex
import subprocess
import sys
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from amp_lessons.core.files import repo_root

REPO = repo_root()
PYTHON = shlex.quote(sys.executable)
MIN_TORCH = (2, 4)
# (import name, distribution, requirement): what the lessons import, at the versions requirements.txt asks
PACKAGES = (
    ("numpy", "numpy", "numpy>=1.24"),
    ("torch", "torch", "torch>=2.4"),
    ("pandas", "pandas", "pandas>=2.0"),
    ("matplotlib", "matplotlib", "matplotlib>=3.7"),
    ("tqdm", "tqdm", "tqdm>=4.66"),
    ("filelock", "filelock", "filelock>=3.12"),
    ("nbformat", "nbformat", "nbformat>=5.9"),
    ("nbclient", "nbclient", "nbclient>=0.9"),
    ("ipykernel", "ipykernel", "ipykernel>=6.25"),
)
WIDGETS = ("ipywidgets>=8.1", "jupyterlab_widgets>=3.0.9", "jupyterlab>=4.1")


@dataclass
class DoctorCheck:
    name: str
    ok: bool
    found: str
    next_step: str = ""

    def line(self) -> str:
        text = f"[{'ok' if self.ok else 'FAIL'}] {self.name}: {self.found}"
        return text if self.ok else f"{text}\n       next step: {self.next_step}"


def pip_install(*requirements: str) -> str:
    return f"{PYTHON} -m pip install " + " ".join(shlex.quote(r) for r in requirements)


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


def version_tuple(version: str) -> tuple[int, int]:
    """(major, minor) of a version such as '2.14.1+cu130' (the rule of environment.torch_version_tuple)."""
    parts = []
    for piece in version.split("+")[0].split(".")[:2]:
        digits = "".join(ch for ch in piece if ch.isdigit())
        parts.append(int(digits or 0))
    return (parts + [0, 0])[0], (parts + [0, 0])[1]


def probe_pip() -> DoctorCheck:
    found = importlib.util.find_spec("pip") is not None
    return DoctorCheck(
        "pip",
        found,
        "installed" if found else f"not installed for {sys.executable}",
        f"{PYTHON} -m ensurepip --upgrade",
    )


def probe_package(module: str, distribution: str, requirement: str) -> DoctorCheck:
    """Installed at all (without importing it: a broken install must not stop the doctor)."""
    version = installed_version(distribution)
    present = version is not None and importlib.util.find_spec(module) is not None
    found = f"{version}" if present else f"not installed for {sys.executable}"
    return DoctorCheck(module, present, found, pip_install(requirement))


def probe_torch(version: str) -> DoctorCheck:
    ok = version_tuple(version) >= MIN_TORCH
    return DoctorCheck(
        "torch 2.4 or newer", ok, version, f"{pip_install('torch>=2.4')} --upgrade (then restart the kernel)"
    )


def probe_widgets(ipywidgets: str | None, lab_widgets: str | None, jupyterlab: str | None) -> DoctorCheck:
    """ipywidgets 8 pairs with jupyterlab_widgets 3 (and JupyterLab 3+), ipywidgets 7 with
    jupyterlab_widgets 1."""
    found = (
        f"ipywidgets {ipywidgets or 'missing'}, jupyterlab_widgets {lab_widgets or 'missing'}, "
        f"jupyterlab {jupyterlab or 'missing'}"
    )
    fix = f"{pip_install(*WIDGETS)}  (ipywidgets 8, jupyterlab_widgets 3 and JupyterLab 4 go together)"
    if not ipywidgets or not lab_widgets or not jupyterlab:
        return DoctorCheck("widgets work in JupyterLab", False, found, fix)
    pairs = {8: 3, 7: 1}
    ok = (
        pairs.get(major(ipywidgets)) == major(lab_widgets)
        and (major(jupyterlab) or 0) >= 4
        and major(ipywidgets) == 8
    )
    return DoctorCheck("widgets work in JupyterLab", ok, found, fix)


def kernel_python() -> tuple[str | None, str]:
    """The interpreter of the ``python3`` kernel JupyterLab will start, or (None, why there is none)."""
    try:
        from jupyter_client.kernelspec import KernelSpecManager, NoSuchKernel
    except Exception as exc:  # jupyter_client comes with ipykernel
        return None, f"jupyter_client cannot be imported ({type(exc).__name__})"
    try:
        argv = KernelSpecManager().get_kernel_spec("python3").argv
    except NoSuchKernel:
        return None, "no kernel named python3 is installed"
    except Exception as exc:
        return None, f"the python3 kernel spec cannot be read ({type(exc).__name__}: {exc})"
    python = argv[0] if argv else sys.executable
    # jupyter_client starts a bare "python" kernel command with the server's own interpreter
    if python in ("python", "python3", f"python3.{sys.version_info[1]}"):
        python = sys.executable
    return python, ""


def probe_kernel_spec() -> DoctorCheck:
    python, why = kernel_python()
    fix = (
        f"{PYTHON} -m ipykernel install --sys-prefix"
        if importlib.util.find_spec("ipykernel")
        else pip_install("ipykernel>=6.25")
    )
    return DoctorCheck(
        "the python3 kernel is installed", python is not None, f"runs {python}" if python else why, fix
    )


def probe_kernel_imports_package(notebooks: Path) -> DoctorCheck:
    """Start the 'python3' kernel's interpreter in notebooks/ and import the package there."""
    python, why = kernel_python()
    fix = f"from the course folder run: {shlex.quote(python or sys.executable)} -m pip install -e ."
    if python is None:
        return DoctorCheck("the notebooks' kernel can import amp_lessons", False, why, fix)
    where = notebooks if notebooks.is_dir() else Path.cwd()
    try:
        run = subprocess.run(
            [python, "-c", "import amp_lessons, sys; print(amp_lessons.__file__)"],
            cwd=where,
            capture_output=True,
            text=True,
            timeout=120,
        )
        ok = run.returncode == 0
        found = (
            f"kernel python {python} imports {run.stdout.strip()}"
            if ok
            else (run.stderr.strip().splitlines() or ["failed"])[-1]
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        ok, found = False, f"could not start {python}: {exc}"
    return DoctorCheck("the notebooks' kernel can import amp_lessons", ok, found, fix)


def probe_device(out) -> tuple[list[DoctorCheck], object]:
    """Run ``setup()`` (prints the environment card) and probe GradScaler and autocast on this device."""
    from amp_lessons.core.environment import SetupError, setup

    try:
        env = setup()
    except SetupError as exc:
        return [
            DoctorCheck(
                "device",
                False,
                str(exc),
                "fix the device settings above, or unset AMP_LESSONS_DEVICE / AMP_LESSONS_REQUIRE_CUDA",
            )
        ], None
    out(str(env))
    out("")
    works, note = env.grad_scaler
    checks = [
        DoctorCheck(
            "GradScaler runs here",
            works,
            note,
            f"{pip_install('torch>=2.4')} --upgrade (GradScaler('cpu') needs 2.3+, the course 2.4+)",
        ),
        DoctorCheck(
            "at least one autocast dtype works",
            bool(env.autocast_dtypes),
            ", ".join(str(d) for d in env.autocast_dtypes) or "none",
            f"{pip_install('torch>=2.4')} --upgrade (CPU autocast runs bfloat16 and float16 there)",
        ),
    ]
    return checks, env


def probe_process_group() -> DoctorCheck:
    """Lesson 09 starts two local processes that talk over gloo: can they form a process group here?"""
    from amp_lessons.l09_amp_across_processes.distributed import can_start_process_group

    ok, found = can_start_process_group(timeout_s=60)
    return DoctorCheck(
        "two local processes can start a process group (lesson 09)",
        ok,
        found,
        "set GLOO_SOCKET_IFNAME=lo (lo0 on macOS) and allow local connections in the "
        "firewall; "
        "the other lessons do not need this",
    )


def _safely(name: str, probe, *args):
    try:
        return probe(*args)
    except Exception as exc:  # a probe must never end the doctor with a traceback
        text = " ".join(str(exc).split())[:200]
        return DoctorCheck(
            name,
            False,
            f"could not be checked ({type(exc).__name__}: {text})",
            f"{pip_install('-r', 'requirements.txt')} from the course folder, then run doctor again",
        )


def run_doctor(out=print) -> int:
    """Print the card and the probes; return the exit code (0 = ready, 1 = something to fix)."""
    checks = [_safely("pip", probe_pip)]
    checks += [_safely(module, probe_package, module, dist, req) for module, dist, req in PACKAGES]
    missing = {c.name for c in checks if not c.ok}
    env = None
    if not {"numpy", "torch"} & missing:
        checks.append(_safely("torch 2.4 or newer", probe_torch, installed_version("torch") or "0"))
        device = _safely("device", probe_device, out)
        device_checks, env = device if isinstance(device, tuple) else ([device], None)
        checks += device_checks
        checks.append(
            _safely("two local processes can start a process group (lesson 09)", probe_process_group)
        )
    checks.append(
        _safely(
            "widgets work in JupyterLab",
            probe_widgets,
            installed_version("ipywidgets"),
            installed_version("jupyterlab_widgets"),
            installed_version("jupyterlab"),
        )
    )
    checks.append(_safely("the python3 kernel is installed", probe_kernel_spec))
    if checks[-1].ok:
        checks.append(
            _safely(
                "the notebooks' kernel can import amp_lessons",
                probe_kernel_imports_package,
                REPO / "notebooks",
            )
        )
    out("Workshop readiness")
    for check in checks:
        out(check.line())
    failures = [c for c in checks if not c.ok]
    if env is not None and not getattr(env, "is_gpu", True):
        out("note: no GPU here. Every lesson runs; lesson 07's speed and memory results will be CPU numbers.")
    if len(failures) > 1:
        out(
            f"Or all at once, from the course folder ({REPO}): {pip_install('-r', 'requirements.txt')} "
            f"&& {PYTHON} -m pip install -e ."
        )
    out(
        "READY" if not failures else f"NOT READY: {len(failures)} check(s) failed; take the next steps above."
    )
    return 0 if not failures else 1
