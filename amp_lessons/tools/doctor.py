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

import importlib.machinery
import importlib.util
import os
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
    # the path finder itself: asking the import system for "pip" would make setuptools' distutils hack
    # switch itself off for this process, and nbgrader (doctor --instructor, the tests) could not import then
    found = importlib.machinery.PathFinder.find_spec("pip") is not None
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


def torchao_note() -> str:
    """torchao is optional for readiness: without it lessons 10 and 11 skip their torchao sections and say why."""
    try:
        from amp_lessons.core.optional_libraries import torchao_support

        support = torchao_support()
    except Exception as exc:  # the note must never end the doctor
        return f"note: torchao could not be checked ({type(exc).__name__})"
    if support.available:
        return f"note: torchao {support.version} imports here (lessons 10 and 11 run their torchao sections)"
    return (
        f"note: lessons 10 and 11 will skip their torchao sections: {support.reason}. Everything else runs; "
        f"to run them: {pip_install('-U', 'torch', 'torchao')}"
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
    if env is not None:
        out(torchao_note())
    if len(failures) > 1:
        out(
            f"Or all at once, from the course folder ({REPO}): {pip_install('-r', 'requirements.txt')} "
            f"&& {PYTHON} -m pip install -e ."
        )
    out(
        "READY" if not failures else f"NOT READY: {len(failures)} check(s) failed; take the next steps above."
    )
    return 0 if not failures else 1


# ----------------------------------------------------------------------------- doctor --instructor

NBGRADER_RANGE = ((0, 9, 6), (0, 10))  # requirements-instructor.txt: nbgrader>=0.9.6,<0.10
INSTALL_NBGRADER = (
    "make instructor  (or, from the course folder: {python} -m pip install -r requirements-instructor.txt)"
)


def release_tuple(version: str) -> tuple[int, ...]:
    return tuple(
        int("".join(ch for ch in part if ch.isdigit()) or 0) for part in version.split("+")[0].split(".")[:3]
    )


def probe_nbgrader() -> DoctorCheck:
    """Installed, in the range the course is tested with, and importable."""
    version = installed_version("nbgrader")
    fix = INSTALL_NBGRADER.format(python=PYTHON)
    if version is None:
        return DoctorCheck("nbgrader", False, f"not installed for {sys.executable}", fix)
    low, high = NBGRADER_RANGE
    if not low <= release_tuple(version) < high:
        return DoctorCheck("nbgrader", False, f"{version} (the course is tested with >=0.9.6,<0.10)", fix)
    try:
        __import__("nbgrader.apps")
    except Exception as exc:  # a broken install: one line, no traceback
        return DoctorCheck("nbgrader", False, f"{version} does not import ({type(exc).__name__}: {exc})", fix)
    return DoctorCheck("nbgrader", True, f"{version}, imports")


def probe_nbgrader_programs() -> DoctorCheck:
    """nbgrader starts alembic by name when it creates the gradebook: it must be on PATH."""
    import shutil

    found = shutil.which("alembic")
    return DoctorCheck(
        "nbgrader's helper programs are on PATH",
        found is not None,
        f"alembic is {found}" if found else "alembic is not on PATH (the first autograde would fail)",
        f"source {shlex.quote(str(Path(sys.executable).parent / 'activate'))}  (nbgrader's programs come from there)",
    )


def course_folder() -> Path:
    """Where nbgrader's commands read their config: this folder when it has one, else the course folder."""
    return Path.cwd() if (Path.cwd() / "nbgrader_config.py").is_file() else REPO


def probe_course_config(folder: Path):
    from amp_lessons.tools import learner_config

    name = "the course's nbgrader settings"
    try:
        settings = learner_config.course_settings(folder)
    except Exception as exc:
        text = " ".join(str(exc).split())[:200]
        fix = f"run nbgrader and this doctor from the course folder ({REPO})"
        return DoctorCheck(name, False, f"cannot read {folder / 'nbgrader_config.py'} ({text})", fix), None
    found = (
        f"{settings.config_file}: course id {settings.course_id!r}, course folder {settings.course_root}, "
        f"exchange {settings.exchange}"
    )
    ok = bool(settings.course_id.strip())
    return DoctorCheck(
        name, ok, found, "set AMP_LESSONS_COURSE_ID to a course id (letters, digits, -)"
    ), settings


def assignment_points(folder: Path) -> tuple[int, float]:
    """(notebooks, points of the graded cells) of one assignment's source folder."""
    import json

    from amp_lessons.tools.exercises import course

    notebooks = sorted(folder.glob("*.ipynb"))
    points = 0.0
    for path in notebooks:
        cells = json.loads(path.read_text(encoding="utf-8")).get("cells", [])
        points += sum(
            float(course.nbgrader_metadata(c).get("points", 0)) for c in cells if course.is_graded(c)
        )
    return len(notebooks), points


def probe_assignment(course_root: Path, assignment: str) -> DoctorCheck:
    """The assignment's source notebooks exist, and nbgrader's release of them is there and not older."""
    name = f"assignment {assignment}"
    source, release = course_root / "source" / assignment, course_root / "release" / assignment
    count, points = assignment_points(source) if source.is_dir() else (0, 0.0)
    if not count:
        return DoctorCheck(
            name, False, f"no source notebooks in {source}", f"{PYTHON} -m amp_lessons build-exercises"
        )
    found = (
        f"{count} notebook{'s' * (count != 1)}, {points:g} point{'s' * (points != 1)} (one per graded check)"
    )
    generate = f"nbgrader generate_assignment {assignment} --force  (from the course folder)"
    released = {p.name: p for p in release.glob("*.ipynb")} if release.is_dir() else {}
    missing = [p.name for p in sorted(source.glob("*.ipynb")) if p.name not in released]
    if missing:
        which = "" if len(missing) == count else f" ({', '.join(missing)})"
        return DoctorCheck(name, False, f"{found}; not generated yet{which}", generate)
    stale = [
        p.name for p in sorted(source.glob("*.ipynb")) if p.stat().st_mtime > released[p.name].stat().st_mtime
    ]
    if stale:
        return DoctorCheck(name, False, f"{found}; the release is older than {', '.join(stale)}", generate)
    return DoctorCheck(name, True, f"{found}, generated in {release}")


def probe_exchange_root(exchange: Path) -> DoctorCheck:
    """nbgrader needs a world-writable exchange; the sticky bit stops one account deleting another's folder."""
    import stat

    name = "the exchange folder"
    create = f"sudo install -d -m 1777 {shlex.quote(str(exchange))}"
    if not exchange.is_dir():
        return DoctorCheck(name, False, f"{exchange} does not exist", create)
    mode = exchange.stat().st_mode
    shown = f"{exchange} (mode {stat.S_IMODE(mode):04o})"
    if mode & 0o777 != 0o777:
        return DoctorCheck(
            name,
            False,
            f"{shown}: learners cannot write to it",
            f"sudo chmod 1777 {shlex.quote(str(exchange))}",
        )
    if not mode & stat.S_ISVTX:
        return DoctorCheck(
            name,
            False,
            f"{shown}: without the sticky bit any account can delete the course's folder",
            f"sudo chmod +t {shlex.quote(str(exchange))}",
        )
    return DoctorCheck(name, True, f"{shown}: every account can reach it, none can delete another's folder")


def _owner(path: Path) -> str:
    try:
        import pwd

        return pwd.getpwuid(path.stat().st_uid).pw_name
    except (ImportError, KeyError):
        return str(path.stat().st_uid)


def probe_exchange_course(exchange: Path, course_id: str, assignments: list[str]) -> DoctorCheck:
    """The course's folder in the exchange: yours, learners can hand in to inbound but not list it, and the
    assignments are released to outbound (read-only for learners)."""
    name = "the course in the exchange"
    folder = exchange / course_id
    release = f"nbgrader release_assignment {assignments[0]}  (a 3-hour room: {assignments[1]})"
    if not folder.is_dir():
        return DoctorCheck(name, False, f"{folder} does not exist: nothing released yet", release)
    if hasattr(os, "getuid") and folder.stat().st_uid != os.getuid():
        return DoctorCheck(
            name,
            False,
            f"{folder} belongs to {_owner(folder)}, not to you",
            f"check who created it; as root: chown -R {shlex.quote(_owner(Path.home()))} {shlex.quote(str(folder))}",
        )
    inbound, outbound = folder / "inbound", folder / "outbound"
    problems = []
    if not inbound.is_dir() or inbound.stat().st_mode & 0o777 != 0o733:
        problems.append(
            f"inbound should be mode 733 (hand in, not list): chmod 2733 {shlex.quote(str(inbound))}"
        )
    if not outbound.is_dir() or outbound.stat().st_mode & 0o022:
        problems.append(f"outbound should be mode 755 (read only): chmod 755 {shlex.quote(str(outbound))}")
    if problems:
        return DoctorCheck(name, False, f"{folder}: permissions are not nbgrader's", "; ".join(problems))
    released = sorted(p.name for p in outbound.iterdir() if p.is_dir())
    found = f"{folder}: inbound 733, outbound 755; released: {', '.join(released) or 'nothing yet'}"
    if not set(assignments) & set(released):
        return DoctorCheck(name, False, found, release)
    return DoctorCheck(name, True, found)


def learner_command(settings) -> str:
    """The command learners run: with explicit values where yours are not the course's defaults (a learner's
    shell does not have your AMP_LESSONS_COURSE_ID or AMP_LESSONS_EXCHANGE)."""
    from amp_lessons.tools import learner_config

    command = "python -m amp_lessons learner-config"
    if settings.course_id != learner_config.DEFAULT_COURSE_ID:
        command += f" --course-id {shlex.quote(settings.course_id)}"
    if settings.exchange != learner_config.DEFAULT_EXCHANGE:
        command += f" --exchange {shlex.quote(settings.exchange)}"
    return command


def probe_learner_config(settings) -> DoctorCheck:
    """Learner configs this account can see (this Python's, this account's) name the same course and exchange."""
    from amp_lessons.tools import learner_config

    name = "the learners' nbgrader settings"
    command = learner_command(settings)
    wanted = {"course_id": settings.course_id, "exchange": settings.exchange}
    seen = []
    for path, flag in (
        (learner_config.sys_prefix_config_path(), "--sys-prefix"),
        (
            learner_config.user_config_path(),
            f"--output {shlex.quote(str(learner_config.user_config_path()))}",
        ),
    ):
        if not path.is_file():
            continue
        found = learner_config.read_learner_config(path)
        wrong = {k: v for k, v in found.items() if k in wanted and v != wanted[k]}
        if wrong or "student_id" in found:
            what = ", ".join(
                f"{k} {v!r}"
                for k, v in {**wrong, **{k: v for k, v in found.items() if k == "student_id"}}.items()
            )
            return DoctorCheck(name, False, f"{path} sets {what}", f"{command} {flag} --force")
        seen.append(str(path))
    where = f"; {', '.join(seen)} agree" if seen else ""
    return DoctorCheck(
        name,
        True,
        f"learners run `{command}` (course id {settings.course_id!r}, exchange {settings.exchange}){where}",
    )


def run_instructor_doctor(out=print, folder: Path | None = None) -> int:
    """What an instructor needs to run the workshop through nbgrader; 0 = ready, 1 = something to fix."""
    from amp_lessons.tools.exercises.course import CORE_ASSIGNMENT, FULL_ASSIGNMENT

    folder = folder or course_folder()
    assignments = [FULL_ASSIGNMENT, CORE_ASSIGNMENT]
    checks = [
        _safely("nbgrader", probe_nbgrader),
        _safely("nbgrader's helper programs are on PATH", probe_nbgrader_programs),
    ]
    config = _safely("the course's nbgrader settings", probe_course_config, folder)
    config, settings = config if isinstance(config, tuple) else (config, None)
    checks.append(config)
    if settings is not None:
        root = Path(settings.course_root)
        checks += [_safely(f"assignment {a}", probe_assignment, root, a) for a in assignments]
        exchange = Path(settings.exchange)
        checks.append(_safely("the exchange folder", probe_exchange_root, exchange))
        checks.append(
            _safely(
                "the course in the exchange", probe_exchange_course, exchange, settings.course_id, assignments
            )
        )
        checks.append(_safely("the learners' nbgrader settings", probe_learner_config, settings))
    out("Ready to grade with nbgrader")
    for check in checks:
        out(check.line())
    failures = [c for c in checks if not c.ok]
    if hasattr(os, "getuid") and os.getuid() == 0:
        out(
            "note: this is root. Learners' code runs as the account that grades: grade as an account that owns nothing else."
        )
    out(
        "READY" if not failures else f"NOT READY: {len(failures)} check(s) failed; take the next steps above."
    )
    return 0 if not failures else 1
