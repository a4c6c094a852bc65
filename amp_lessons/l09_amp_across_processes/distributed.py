"""Lesson 09: start ranks the way people do (torchrun), and make sure every one of them ends.

A distributed run has a failure mode a single process does not: one rank waits forever for a collective
(``all_reduce``, ``barrier``) that another rank never joins, because it crashed, took another branch or
is stuck. A notebook that waits for such a run hangs with it. So everything here has three deadlines:

- a **collective timeout** in ``init_process_group``: a rank blocked in a collective raises after it;
- a **rank deadline** (``faulthandler.dump_traceback_later(..., exit=True)``): a rank still alive after it
  prints where it was stuck and exits on its own;
- a **hard timeout** in the launcher: after it the launcher stops ``torchrun`` and kills every process of
  the run by its id (torchrun starts each worker in its own session, so killing torchrun's process group
  alone would leave workers behind). The run ends with a :class:`DistributedRunError` that says which
  rank did what.

Two ways to start ranks:

- :func:`launch` runs ``torchrun --standalone --nproc-per-node 2 -m <worker module>``, in fresh processes,
  exactly as on a cluster (the lesson's runs; a few seconds for every launch, most of it importing torch);
- :func:`run_ranks` starts the ranks from the current process (forked on Linux, so in well under a
  second; spawned elsewhere) and runs one Python function on each: what the exercise checker uses.

Both use ``gloo`` on the loopback interface: it runs on any laptop CPU. A GPU cluster uses NCCL instead
(the worker picks it when there is one GPU per rank).
"""

from __future__ import annotations

import contextlib
import datetime
import faulthandler
import io
import marshal
import multiprocessing
import os
import pickle
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import traceback
import types
import uuid
from dataclasses import dataclass
from multiprocessing.connection import wait as wait_for_pipes
from pathlib import Path

from amp_lessons.core.files import repo_root
from amp_lessons.core.processes import tagged_processes

WORLD_SIZE = 2
TOKEN_VARIABLE = "AMP_LESSONS_RUN_TOKEN"


class DistributedRunError(RuntimeError):
    """A run that failed, hung or was killed; the message names each rank's last words."""


# ------------------------------------------------------------------------------------------ environment


def loopback_interface() -> str | None:
    """The loopback network interface's name (``lo`` on Linux, ``lo0`` on macOS), or None.

    gloo picks the network interface from the host name; on a laptop on a VPN or with a odd ``/etc/hosts``
    that can be an address the other rank cannot reach (or one a firewall asks about). Two ranks on one
    machine only need the loopback interface, so local runs name it in ``GLOO_SOCKET_IFNAME``.
    """
    try:
        names = [name for _, name in socket.if_nameindex()]
    except (OSError, AttributeError):
        return None
    return next((name for name in names if name in ("lo", "lo0")), None)


def run_environment(extra: dict | None = None) -> dict:
    """The environment for the ranks: one CPU thread each, loopback gloo, the package importable."""
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", "1")  # torchrun's own default, set so it does not print a banner
    interface = loopback_interface()
    if interface and "GLOO_SOCKET_IFNAME" not in env:
        env["GLOO_SOCKET_IFNAME"] = interface
    root = str(repo_root())
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH", "")) if p)
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra or {})
    return env


def torchrun_command(module: str, args=(), *, nproc: int = WORLD_SIZE, python: str | None = None) -> list:
    """``torchrun --standalone --nproc-per-node N -m module args``, spelled with this kernel's Python.

    ``python -m torch.distributed.run`` *is* ``torchrun`` (the ``torchrun`` command is a script that calls
    it); naming the interpreter makes sure the ranks run the same torch as this notebook.
    """
    return [
        python or sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={nproc}",
        "--max-restarts=0",
        "--monitor-interval=0.1",
        "-m",
        module,
        *[str(a) for a in args],
    ]


def shown_command(command: list) -> str:
    """The command as a person would type it (``torchrun ...``)."""
    if command[1:3] == ["-m", "torch.distributed.run"]:
        command = ["torchrun", *command[3:]]
    return " ".join(command)


# ------------------------------------------------------------------------------------------------ launch


@dataclass
class RunResult:
    """A finished torchrun launch: one payload per rank (rank order), the time it took, what it printed."""

    command: list
    seconds: float
    ranks: list
    log: str = ""
    out_dir: str = ""

    def __repr__(self) -> str:
        return f"RunResult({len(self.ranks)} ranks, {self.seconds:.1f} s): {shown_command(self.command)}"


# Each rank torchrun starts is a fresh Python that loads torch: about 550 MiB resident here (lesson 09 peaked at
# 2046 MiB PSS with its kernel and two ranks; docs/instructor_guide.md, "Peak memory per lesson").
RANK_MEMORY_BYTES = 550 * 2**20


def _read_number(path: str) -> int | None:
    try:
        text = Path(path).read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def free_memory_bytes() -> int | None:
    """Memory this process's container can still use: its cgroup's limit minus its use where a limit is set
    (Binder, a hub's per-learner limit), else the machine's MemAvailable; None where neither can be read."""
    limit, used = _read_number("/sys/fs/cgroup/memory.max"), _read_number("/sys/fs/cgroup/memory.current")
    if limit is None:  # cgroup v1
        limit = _read_number("/sys/fs/cgroup/memory/memory.limit_in_bytes")
        used = _read_number("/sys/fs/cgroup/memory/memory.usage_in_bytes")
    available = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                available = int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    if limit is not None and used is not None and limit < 2**60:
        container = max(limit - used, 0)
        return container if available is None else min(container, available)
    return available


def memory_problem(nproc: int, free: int | None = None) -> str:
    """Why ``nproc`` fresh ranks would not fit here ('' when they fit, or when the free memory is unknown)."""
    free = free_memory_bytes() if free is None else free
    needed = nproc * RANK_MEMORY_BYTES
    if free is None or free >= needed:
        return ""
    return (
        f"Not enough memory to start {nproc} ranks here: {free / 2**20:,.0f} MiB free, about "
        f"{needed / 2**20:,.0f} MiB needed (each rank is a new Python that loads torch). Starting them would "
        "get this kernel killed, so nothing was started. On Binder (about 2 GB) or a small hub, run lesson 09 "
        "on a laptop or a bigger server; close other notebooks' kernels first if you have several open."
    )


def launch(
    module: str,
    args=(),
    *,
    nproc: int = WORLD_SIZE,
    timeout_s: float = 120.0,
    out_dir: str | None = None,
    command: list | None = None,
) -> RunResult:
    """Run ``torchrun ... -m module args --out DIR`` and return what each rank saved with :func:`save_rank`.

    Every process of the run has ended when this returns or raises: after ``timeout_s`` (or on Ctrl-C) the
    launcher stops torchrun and kills the ranks by id. ``command`` replaces the torchrun command (tests).
    Where the free memory cannot hold ``nproc`` fresh ranks (Binder's 2 GB), it refuses with a message instead
    of letting the kernel be killed.
    """
    if command is None and memory_problem(nproc):
        raise DistributedRunError(memory_problem(nproc))
    out_dir = out_dir or tempfile.mkdtemp(prefix="amp_lessons_run_")
    os.makedirs(out_dir, exist_ok=True)
    for stale in [
        path
        for pattern in ("pid.rank*", "result.rank*", "error.rank*", "stuck.rank*")
        for path in Path(out_dir).glob(pattern)
    ]:  # a previous run's: never read, never killed
        stale.unlink()
    command = command or torchrun_command(
        module, [*args, "--out", out_dir, "--deadline", timeout_s - 3], nproc=nproc
    )
    token = uuid.uuid4().hex
    log_path = os.path.join(out_dir, "torchrun.log")
    started = time.perf_counter()
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            command,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=run_environment({TOKEN_VARIABLE: token}),
            **_new_group(),
        )
        try:
            code = process.wait(timeout=timeout_s)
        except BaseException as stop:  # the deadline, or Ctrl-C / the notebook's interrupt button
            end_run(process, token, out_dir)
            seconds = time.perf_counter() - started
            if isinstance(stop, subprocess.TimeoutExpired):
                what = f"did not finish within {timeout_s:.0f} s and was killed"
                raise DistributedRunError(_failure_text(what, out_dir, nproc, seconds)) from None
            raise
        finally:
            end_run(process, token, out_dir)
    seconds = time.perf_counter() - started
    if code != 0:
        raise DistributedRunError(_failure_text(f"failed with exit code {code}", out_dir, nproc, seconds))
    try:
        ranks = [_read_rank(out_dir, rank) for rank in range(nproc)]
    except Exception as exc:  # a worker saved something that is not plain data: a course bug, said plainly
        raise DistributedRunError(
            f"The ranks finished, but their results could not be read back "
            f"({type(exc).__name__}: {str(exc).splitlines()[0]}). Files: {out_dir}"
        ) from None
    missing = [rank for rank, payload in enumerate(ranks) if payload is None]
    if missing:
        what = f"exited 0 but ranks {missing} saved no result"
        raise DistributedRunError(_failure_text(what, out_dir, nproc, seconds))
    return RunResult(command, seconds, ranks, _read_text(log_path), out_dir)


def _new_group() -> dict:
    if os.name == "nt":
        return {"creationflags": subprocess.CREATE_NEW_PROCESS_GROUP}
    return {"start_new_session": True}


def end_run(process: subprocess.Popen, token: str, out_dir: str, grace_s: float = 3.0) -> None:
    """Stop torchrun (SIGTERM: it stops its workers), then kill whatever of this run is still alive."""
    if process.poll() is None:
        _signal_group(process.pid, signal.SIGTERM if os.name != "nt" else signal.CTRL_BREAK_EVENT)
        try:
            process.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            _signal_group(process.pid, signal.SIGKILL if os.name != "nt" else signal.SIGTERM)
            process.wait()
    for pid in sorted(run_processes(token, out_dir)):
        _signal_group(pid, signal.SIGKILL if os.name != "nt" else signal.SIGTERM)


def _signal_group(pid: int, sig) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError, OSError):
        if os.name == "nt":
            os.kill(pid, sig)
        elif os.getpgid(pid) == pid:  # a session/group leader: torchrun, or a worker torchrun started
            os.killpg(pid, sig)
        else:
            os.kill(pid, sig)


def run_processes(token: str, out_dir: str) -> set:
    """Ids of the processes of one run that are still alive.

    On Linux: exactly the processes whose environment carries this run's token (read from /proc), so
    nothing else is ever touched, even if a process id has been reused. Elsewhere: the ids the ranks
    wrote into ``pid.rankN`` files of this run's folder (stale ones are removed before a run starts).
    """
    if Path(f"/proc/{os.getpid()}/environ").exists():
        found = set(tagged_processes(TOKEN_VARIABLE, token))
    else:
        found = set()
        for path in Path(out_dir).glob("pid.rank*"):
            with contextlib.suppress(ValueError, OSError):
                found.add(int(path.read_text().strip()))
    return {pid for pid in found if _alive(pid)}


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, PermissionError, OSError):
        return False
    with contextlib.suppress(OSError):  # a zombie has ended; it only waits for its parent to collect it
        if "\nState:\tZ" in Path(f"/proc/{pid}/status").read_text():
            return False
    return True


def _read_text(path: str, limit: int = 20000) -> str:
    with contextlib.suppress(OSError):
        return Path(path).read_text(errors="replace")[-limit:]
    return ""


def _read_rank(out_dir: str, rank: int):
    import torch

    path = os.path.join(out_dir, f"result.rank{rank}.pt")
    if not os.path.exists(path):
        return None
    return torch.load(path, map_location="cpu", weights_only=True)


def _failure_text(what: str, out_dir: str, nproc: int, seconds: float) -> str:
    lines = [f"The torchrun run {what} after {seconds:.1f} s. Every process of the run has been stopped."]
    for rank in range(nproc):
        error = _read_text(os.path.join(out_dir, f"error.rank{rank}.txt")).strip()
        dump = _read_text(os.path.join(out_dir, f"stuck.rank{rank}.txt"))
        stuck = [line.strip() for line in dump.splitlines() if line.strip().startswith("File ")]
        done = os.path.exists(os.path.join(out_dir, f"result.rank{rank}.pt"))
        if error:
            last = [line.strip() for line in error.splitlines() if line.strip(" ~^")]  # not the caret lines
            lines.append(f"  rank {rank}: " + " | ".join(last[-3:]))
        elif stuck:  # faulthandler's dump at the rank's deadline: innermost frame first
            lines.append(f"  rank {rank}: still running at its deadline, stuck in {stuck[0]}")
        else:
            lines.append(
                f"  rank {rank}: "
                + (
                    "finished and saved its result"
                    if done
                    else "left no error message (killed, or stuck before it could report)"
                )
            )
    log = [line for line in _read_text(os.path.join(out_dir, "torchrun.log")).splitlines() if line.strip()]
    if log:
        lines.append("  torchrun's last lines: " + " | ".join(log[-4:]))
    lines.append(
        "A rank stuck in a collective (all_reduce, barrier) waits for a rank that never joins it: "
        "look for the rank that failed first. Run files: " + out_dir
    )
    return "\n".join(lines)


# ------------------------------------------------------------------------------ inside a torchrun worker


def start_rank(out_dir: str, deadline_s: float) -> None:
    """First thing a worker does: note its process id (so the launcher can always end it) and arm its
    own deadline (past it, the rank writes where it was stuck into ``stuck.rankN.txt`` and exits)."""
    rank = int(os.environ.get("RANK", "0"))
    Path(out_dir, f"pid.rank{rank}").write_text(str(os.getpid()))
    if deadline_s and deadline_s > 0:
        handle = open(os.path.join(out_dir, f"stuck.rank{rank}.txt"), "w")  # noqa: SIM115 (lives until exit)
        faulthandler.dump_traceback_later(deadline_s, exit=True, file=handle)


def save_rank(out_dir: str, payload: dict) -> None:
    """Save this rank's result (plain data: numbers, strings, lists, dicts, tensors) for :func:`launch`."""
    import torch

    rank = int(os.environ.get("RANK", "0"))
    faulthandler.cancel_dump_traceback_later()
    path = os.path.join(out_dir, f"result.rank{rank}.pt")
    torch.save(payload, path + ".tmp")
    os.replace(path + ".tmp", path)


def report_failure(out_dir: str) -> None:
    """Call from ``except``: write the traceback where the launcher's error message will quote it."""
    rank = int(os.environ.get("RANK", "0"))
    faulthandler.cancel_dump_traceback_later()
    Path(out_dir, f"error.rank{rank}.txt").write_text(traceback.format_exc())


# ------------------------------------------------------------------------ ranks started from this process


@dataclass
class RankOutcome:
    """What one rank of :func:`run_ranks` did: ``status`` is "ok", "error", "timeout", "not started" or
    "crashed"; ``output`` is what it printed (and, when it did not finish, what C++ code printed)."""

    rank: int
    status: str
    value: object = None
    error: str = ""
    output: str = ""
    seconds: float = 0.0


@dataclass
class RanksResult:
    """Every rank's :class:`RankOutcome` (rank order), the seconds it all took, and "fork" or "spawn"."""

    outcomes: list
    seconds: float
    method: str

    @property
    def ok(self) -> bool:
        return all(o.status == "ok" for o in self.outcomes)

    @property
    def values(self) -> list:
        return [o.value for o in self.outcomes]

    def describe(self) -> str:
        """One line per rank that did not finish normally (empty when all did)."""
        lines = []
        for o in self.outcomes:
            if o.status != "ok":
                detail = o.error.strip().splitlines()[-1] if o.error.strip() else ""
                lines.append(f"rank {o.rank}: {o.status}" + (f" ({detail})" if detail else ""))
        return "\n".join(lines)


def start_method() -> str:
    """ "fork" on Linux (the ranks share the already-imported torch: fast), "spawn" elsewhere (macOS and
    Windows, where forking a process that uses system frameworks or threads is unsafe)."""
    if sys.platform.startswith("linux") and "fork" in multiprocessing.get_all_start_methods():
        return "fork"
    return "spawn"


def run_ranks(
    task,
    *args,
    world_size: int = WORLD_SIZE,
    timeout_s: float = 10.0,
    start_timeout_s: float | None = None,
    collective_timeout_s: float = 5.0,
    prepare=None,
    method: str | None = None,
) -> RanksResult:
    """Run ``task(rank, world_size, *args)`` in ``world_size`` processes joined by a gloo process group.

    Two deadlines: every rank must have joined the group (and run ``prepare()``, e.g. the imports a task
    needs) within ``start_timeout_s`` (default 5 s forked, 15 s spawned: a spawned process imports torch
    first), then finish ``task`` within ``timeout_s``. Ranks still running at a deadline are killed. With
    "spawn", ``task``, ``prepare`` and ``args`` travel by pickle; plain functions among ``args`` (a
    learner's answer) travel as :class:`PortableFunction`.
    """
    method = method or start_method()
    if method == "fork":  # import here once, so that every forked rank inherits it instead of importing it
        import torch.distributed  # noqa: F401
    if start_timeout_s is None:
        start_timeout_s = 5.0 if method == "fork" else 15.0
    if method == "spawn":
        args = tuple(PortableFunction(a) if isinstance(a, types.FunctionType) else a for a in args)
    context = multiprocessing.get_context(method)
    folder = tempfile.mkdtemp(prefix="amp_lessons_ranks_")
    started = time.perf_counter()
    processes, pipes = [], {}
    try:
        for rank in range(world_size):
            reader, writer = context.Pipe(duplex=False)
            process = context.Process(
                target=_rank_main,
                daemon=True,
                name=f"amp_lessons-rank{rank}",
                args=(task, args, rank, world_size, folder, collective_timeout_s, prepare, writer),
            )
            with _quiet_fork():
                process.start()
            writer.close()
            processes.append(process)
            pipes[reader] = rank
        outcomes = _collect(processes, pipes, start_timeout_s, timeout_s)
        for outcome in outcomes:  # what a rank printed below Python (gloo, a crash) is in its log file
            if outcome.status != "ok":
                outcome.output = (
                    outcome.output + _read_text(os.path.join(folder, f"rank{outcome.rank}.log"), 4000)
                ).strip()
    finally:
        for process in processes:
            if process.is_alive():
                process.kill()
            process.join(5)
        shutil.rmtree(folder, ignore_errors=True)
    return RanksResult(outcomes, time.perf_counter() - started, method)


@contextlib.contextmanager
def _quiet_fork():
    """Python 3.12+ warns when a process with threads (a Jupyter kernel) forks; the ranks run only torch
    on one thread and exit without returning to the kernel's code, the case where fork is fine."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        yield


def _collect(processes, pipes, start_timeout_s: float, timeout_s: float) -> list:
    """Read each rank's "ready" and then its answer; a rank silent at a deadline is reported and killed."""
    outcomes, ready = {}, set()
    deadline = time.perf_counter() + start_timeout_s
    while pipes and time.perf_counter() < deadline:
        for reader in wait_for_pipes(list(pipes), timeout=max(0.0, deadline - time.perf_counter())):
            rank = pipes[reader]
            try:
                message = pickle.loads(reader.recv_bytes())
            except (EOFError, OSError, pickle.UnpicklingError):
                pipes.pop(reader)
                processes[rank].join(1)
                outcomes[rank] = RankOutcome(
                    rank,
                    "crashed",
                    error=f"the process ended without an answer ({_exit_text(processes[rank].exitcode)})",
                )
                continue
            if message == "ready":
                ready.add(rank)
                if len(ready) == len(processes):  # everyone has started: the task's own deadline begins
                    deadline = time.perf_counter() + timeout_s
                continue
            pipes.pop(reader)
            outcomes[rank] = RankOutcome(rank, *message)
    for rank in list(pipes.values()):
        if rank in ready:
            outcomes[rank] = RankOutcome(
                rank, "timeout", error=f"still running {timeout_s:g} s after all ranks had started: killed"
            )
        else:
            outcomes[rank] = RankOutcome(
                rank,
                "not started",
                error=f"not ready within {start_timeout_s:g} s "
                "(still importing or joining the group): killed",
            )
    return [outcomes[rank] for rank in range(len(processes))]


def _exit_text(code) -> str:
    if code is None:
        return "still closing"
    if code < 0:
        with contextlib.suppress(ValueError):
            return f"killed by signal {signal.Signals(-code).name}"
    return f"exit code {code}"


def _send(pipe, message) -> None:
    """Plain pickle: torch's multiprocessing pickler would pass tensors through shared memory that vanishes
    when this process exits."""
    try:
        data = pickle.dumps(message)
    except Exception as exc:  # an answer that does not pickle is a course bug: say so instead
        data = pickle.dumps(("error", None, f"could not send the answer back ({exc})", "", 0.0))
    pipe.send_bytes(data)


def _rank_main(task, args, rank, world_size, folder, collective_timeout_s, prepare, pipe) -> None:
    """One rank: join the group, prepare, say "ready", run the task, send back
    (status, value, error, printed output, seconds). Python's output goes into the answer; what C++ code
    prints (gloo's errors, a crash) goes to ``rankN.log`` in ``folder``, never into the notebook."""
    import torch
    import torch.distributed as dist

    faulthandler.disable()  # a crash shows as its exit code and log, not as a dump in the parent's terminal
    with open(os.path.join(folder, f"rank{rank}.log"), "wb") as log:
        os.dup2(log.fileno(), 1)
        os.dup2(log.fileno(), 2)
    captured = io.StringIO()
    sys.stdout = sys.stderr = captured
    store = Path(folder, "store").as_uri()
    torch.set_num_threads(1)
    started = time.perf_counter()
    try:
        dist.init_process_group(
            "gloo",
            init_method=store,
            rank=rank,
            world_size=world_size,
            timeout=datetime.timedelta(seconds=collective_timeout_s),
        )
        if prepare is not None:
            prepare()
        _send(pipe, "ready")
        started = time.perf_counter()
        value = task(rank, world_size, *args)
        answer = ("ok", value, "", captured.getvalue()[-4000:], time.perf_counter() - started)
    except BaseException:  # anything at all: it is reported, and this process ends below
        answer = (
            "error",
            None,
            traceback.format_exc(limit=6),
            captured.getvalue()[-4000:],
            time.perf_counter() - started,
        )
    _send(pipe, answer)
    with contextlib.suppress(Exception):
        dist.destroy_process_group()
    pipe.close()


class PortableFunction:
    """A learner's function made to travel to a spawned process: its code object (marshal), defaults and
    the globals it names that pickle (modules travel by name). A closure cannot travel; calling the copy
    then raises a clear error."""

    def __init__(self, function: types.FunctionType):
        self.function = function

    def __reduce__(self):  # unpickled, it is a plain function again
        fn = self.function
        names = {}
        for name in fn.__code__.co_names:
            if name in fn.__globals__:
                value = fn.__globals__[name]
                if isinstance(value, types.ModuleType):
                    names[name] = ("module", value.__name__)
                else:
                    with contextlib.suppress(Exception):
                        names[name] = ("value", pickle.dumps(value))
        closure = fn.__closure__ is not None
        return (
            _rebuild_function,
            (marshal.dumps(fn.__code__), fn.__name__, fn.__defaults__, fn.__kwdefaults__, names, closure),
        )


def _rebuild_function(code, name, defaults, kwdefaults, names, closure):
    import importlib

    namespace = {"__builtins__": __builtins__, "__name__": "learner"}
    for key, (kind, value) in names.items():
        with contextlib.suppress(Exception):
            namespace[key] = importlib.import_module(value) if kind == "module" else pickle.loads(value)
    if closure:

        def refuse(*args, **kwargs):
            raise RuntimeError(
                f"{name} uses variables from an enclosing function (a closure), which cannot "
                "travel to a new process on this system: define it at the top level of a "
                "cell."
            )

        return refuse
    function = types.FunctionType(marshal.loads(code), namespace, name, defaults)
    function.__kwdefaults__ = kwdefaults
    return function


def stuck_rank_demo(rank: int, world_size: int, stuck_s: float = 30.0) -> str:
    """A lesson's broken run: rank 0 all-reduces, rank 1 never gets there (stuck, say, reading data)."""
    import torch
    import torch.distributed as dist

    if rank == 0:
        value = torch.ones(1)
        dist.all_reduce(value)  # waits for rank 1, which never comes: the collective timeout ends it
        return f"all_reduce returned {float(value)}"
    time.sleep(stuck_s)
    return "woke up"


# ------------------------------------------------------------------------------------------------ doctor


def _probe_task(rank: int, world_size: int) -> float:
    import torch
    import torch.distributed as dist

    value = torch.tensor([float(rank + 1)])
    dist.all_reduce(value)
    return float(value)


def can_start_process_group(timeout_s: float = 60.0) -> tuple:
    """``(ok, message)``: can two local processes form a gloo process group here, both ways the course
    starts them (from this process for the checker, with torchrun for the lesson)?"""
    started = time.perf_counter()
    expected = float(sum(range(1, WORLD_SIZE + 1)))
    try:
        result = run_ranks(_probe_task, timeout_s=10.0, collective_timeout_s=10.0)
    except Exception as exc:
        return False, f"could not start {WORLD_SIZE} processes from Python: {type(exc).__name__}: {exc}"
    if not result.ok or result.values != [expected] * WORLD_SIZE:
        return False, (
            f"{WORLD_SIZE} processes started with {result.method} could not all_reduce over gloo: "
            + (result.describe() or f"got {result.values}").replace("\n", "; ")
        )
    left = timeout_s - (time.perf_counter() - started)
    folder = tempfile.mkdtemp(prefix="amp_lessons_probe_")
    try:
        run = launch(
            "amp_lessons.l09_amp_across_processes.workers.probe", timeout_s=max(10.0, left), out_dir=folder
        )
    except Exception as exc:  # never raises: the doctor reports what it found
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        return False, f"torchrun could not start {WORLD_SIZE} ranks: {first}"
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    if [payload.get("sum") for payload in run.ranks] != [expected] * WORLD_SIZE:
        return False, f"torchrun ranks returned {run.ranks} instead of all_reduce sums of {expected}"
    return True, (
        f"{WORLD_SIZE} gloo processes formed a group and all-reduced: from Python "
        f"({result.method}, {result.seconds:.1f} s) and with torchrun ({run.seconds:.1f} s)"
    )
