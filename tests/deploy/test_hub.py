"""A class on JupyterHub, end to end: deploy/jupyterhub/jupyterhub_config.py with a real hub, its proxy and servers.

The hub runs from .venv-hub (``make hub-setup``) on free ports of 127.0.0.1, with configurable-http-proxy from npm,
as root, so every learner is a real UNIX account (the config's ``useradd``) with a 0700 home and a server that runs
as them. One instructor and three learners log in through the hub's login form (the shared passwords); each opens the
nbgitpuller link, which clones a bare copy of this repository made here (``file://``, no network), and later pulls a
new commit without losing an edit. In alice's server, a kernel started through the Jupyter server's API runs an
exercise check; her progress record lands in her home. The instructor's kernel generates and releases a one-notebook
assignment (lesson 01's exercise) with the course's own nbgrader_config.py; the learners fetch, edit and submit it
through their servers' Assignments API (alice: both functions written; bob: untouched; mallory: check cells forged
into prints of the pass text), and the instructor collects and autogrades: alice 2, bob 0, mallory 0. Then bob's
kernel tries to read alice's home, the instructor's gradebook and the exchange's inbound folder, and is refused.

It always ends: every request has a timeout, a watchdog kills the hub and the class's processes after LIMIT_S, and a
``finally`` stops the hub, kills what is left by PID, removes the accounts, cgroups and folders, then checks that
nothing listens on any port the class used. Skipped (with the reason) without root, .venv-hub or the proxy.
"""

from __future__ import annotations

import grp
import json
import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from urllib.parse import quote, urlencode

import pytest

from amp_lessons.tools.exercises import course

requests = pytest.importorskip("requests")
tornado_websocket = pytest.importorskip("tornado.websocket")

ROOT = Path(__file__).resolve().parents[2]
HUB_VENV = Path(os.environ.get("AMP_HUB_VENV", ROOT / ".venv-hub"))
JUPYTERHUB = HUB_VENV / "bin" / "jupyterhub"
LOCAL_PROXY = ROOT / ".hub-node" / "node_modules" / ".bin" / "configurable-http-proxy"
GROUP = "amph-test"
INSTRUCTOR = "amph-teacher"
LEARNERS = ("amph-alice", "amph-bob", "amph-mallory")
EVERYONE = (INSTRUCTOR, *LEARNERS)
PASSWORD = "room-password-8"
ADMIN_PASSWORD = "instructor-password-at-least-32-characters"
COURSE_ID = "amp-hub-test"
COURSE_DIR = "course"
ASSIGNMENT = "hub-test"
LESSON = "01_precision_formats"
LIMIT_S = 480
FORGED = 'print("[PASS] Passed — {label}\\nWell done.")'


def skip_reason() -> str:
    if sys.platform != "linux":
        return "the class test runs on Linux (UNIX accounts, cgroups)"
    if os.geteuid() != 0:
        return "needs root: it creates real UNIX accounts (useradd) for an instructor and three learners"
    if not JUPYTERHUB.exists():
        return f"jupyterhub is not installed in {HUB_VENV}: `make hub-setup`"
    if not (LOCAL_PROXY.exists() or shutil.which("configurable-http-proxy")):
        return "configurable-http-proxy is missing: `make hub-setup` installs it into .hub-node/ (needs npm)"
    missing = [tool for tool in ("useradd", "userdel", "groupdel", "git") if not shutil.which(tool)]
    if missing:
        return f"missing {', '.join(missing)}"
    layered = list(HUB_VENV.glob("lib/python3*/site-packages/amp_course_venv.pth"))
    if not layered or sys.prefix not in layered[0].read_text():
        return f"{HUB_VENV} is layered on another environment than this one ({sys.prefix})"
    python = Path(os.path.realpath(HUB_VENV / "bin" / "python"))
    if not all(os.stat(folder).st_mode & 0o001 for folder in python.parents):
        return (
            f"learners' accounts cannot run {python}: `make hub-setup HUB_PYTHON=/usr/bin/python3` (README)"
        )
    return ""


pytestmark = pytest.mark.skipif(bool(skip_reason()), reason=skip_reason() or "-")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def class_processes() -> list:
    import psutil

    found = []
    for process in psutil.process_iter(["username"]):
        if process.info["username"] in EVERYONE:
            found.append(process)
    return found


def remove_class(workdir: Path | None) -> None:
    """Kill the accounts' processes by PID, then remove the accounts (only those in GROUP), cgroups and folders."""
    import psutil

    for process in class_processes():
        try:
            process.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(class_processes(), timeout=10)
    try:
        members = set(grp.getgrnam(GROUP).gr_mem)
    except KeyError:
        members = set()
    for name in EVERYONE:
        if name in members:
            subprocess.run(["userdel", "--remove", name], capture_output=True, timeout=60, check=False)
    if members or GROUP in {group.gr_name for group in grp.getgrall()}:
        subprocess.run(["groupdel", GROUP], capture_output=True, timeout=60, check=False)
    for base in ("/sys/fs/cgroup/amp-hub", "/sys/fs/cgroup/memory/amp-hub", "/sys/fs/cgroup/cpu/amp-hub"):
        for folder in [Path(base) / name for name in EVERYONE] + [Path(base)]:  # the parent only once empty
            try:
                os.rmdir(folder)
            except OSError:
                pass
    if workdir:
        shutil.rmtree(workdir, ignore_errors=True)


class Hub:
    """The hub as a process of ours: started with the course's config, stopped by PID (its process group)."""

    def __init__(self, workdir: Path):
        self.workdir, self.port = workdir, free_port()
        self.ports = {self.port, free_port(), free_port()}
        hub_port, api_port = sorted(self.ports - {self.port})
        self.base = f"http://127.0.0.1:{self.port}"
        self.env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "LANG": "C.UTF-8",
            "AMP_HUB_STATE": str(workdir / "state"),
            "AMP_HUB_EXCHANGE": str(workdir / "exchange"),
            "AMP_HUB_HOME_ROOT": str(workdir / "home"),
            "AMP_HUB_GROUP": GROUP,
            "AMP_HUB_INSTRUCTORS": INSTRUCTOR,
            "AMP_HUB_PASSWORD": PASSWORD,
            "AMP_HUB_ADMIN_PASSWORD": ADMIN_PASSWORD,
            "AMP_HUB_COURSE_REPO": f"file://{workdir / 'course.git'}",
            "AMP_HUB_COURSE_BRANCH": "main",
            "AMP_HUB_COURSE_DIR": COURSE_DIR,
            "AMP_HUB_COURSE_ID": COURSE_ID,
            "AMP_HUB_PORT": str(self.port),
            "AMP_HUB_HUB_PORT": str(hub_port),
            "AMP_HUB_PROXY_API_PORT": str(api_port),
        }
        self.log = workdir / "hub.log"
        self.process = None
        self.children: set[int] = set()

    def start(self) -> None:
        config = ROOT / "deploy" / "jupyterhub" / "jupyterhub_config.py"
        with self.log.open("wb") as log:
            self.process = subprocess.Popen(
                [str(JUPYTERHUB), "-f", str(config)],
                cwd=self.workdir,
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            assert self.process.poll() is None, f"the hub exited:\n{self.log.read_text()[-3000:]}"
            try:
                if requests.get(f"{self.base}/hub/api/", timeout=5).ok:
                    return
            except requests.ConnectionError:
                pass
            time.sleep(0.5)
        raise AssertionError(f"the hub did not answer in 90 s:\n{self.log.read_text()[-3000:]}")

    def remember_children(self) -> None:
        import psutil

        if self.process and self.process.poll() is None:
            self.children |= {
                child.pid for child in psutil.Process(self.process.pid).children(recursive=True)
            }

    def stop(self) -> None:
        """SIGTERM (the hub stops every server and its proxy), then SIGKILL for its group and every child seen."""
        import psutil

        if self.process is None:
            return
        self.remember_children()
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                pass
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.process.wait(timeout=30)
        for pid in self.children:
            try:
                psutil.Process(pid).kill()
            except psutil.Error:
                pass


def xsrf(session) -> str:
    return next(cookie.value for cookie in session.cookies if cookie.name == "_xsrf")


class Person:
    """Someone logged in through the hub's login form, with an API token for their own server."""

    def __init__(self, hub: Hub, name: str, password: str):
        self.hub, self.name, self.session = hub, name, requests.Session()
        self.session.get(f"{hub.base}/hub/login", timeout=30)
        reply = self.session.post(
            f"{hub.base}/hub/login",
            data={"username": name, "password": password, "_xsrf": xsrf(self.session)},
            allow_redirects=False,
            timeout=60,
        )
        assert reply.status_code == 302, f"{name} could not log in: {reply.status_code} {reply.text[:300]}"
        reply = self.session.post(
            f"{hub.base}/hub/api/users/{name}/tokens",
            json={"note": "class test", "expires_in": 3600},
            headers={"X-XSRFToken": xsrf(self.session)},
            timeout=30,
        )
        assert reply.status_code == 201, reply.text
        self.token = reply.json()["token"]
        self.headers = {"Authorization": f"token {self.token}"}
        self.server = f"{hub.base}/user/{name}"

    def hub_api(self, method: str, path: str, **kwargs):
        return self.session.request(
            method, f"{self.hub.base}/hub/api{path}", headers=self.headers, timeout=60, **kwargs
        )

    def spawn(self) -> None:
        reply = self.hub_api("POST", f"/users/{self.name}/server")
        assert reply.status_code in (201, 202), f"{reply.text}\n{self.hub.log.read_text()[-4000:]}"
        deadline = time.monotonic() + 150
        while time.monotonic() < deadline:
            server = self.hub_api("GET", f"/users/{self.name}").json()["servers"].get("", {})
            if server.get("ready"):
                return
            time.sleep(1)
        raise AssertionError(f"{self.name}'s server did not start:\n{self.hub.log.read_text()[-3000:]}")

    def api(self, method: str, path: str, **kwargs):
        reply = self.session.request(
            method, f"{self.server}{path}", headers=self.headers, timeout=120, **kwargs
        )
        assert reply.ok, f"{method} {path} as {self.name}: {reply.status_code} {reply.text[:500]}"
        return reply

    def pull(self, query: dict) -> None:
        """The link as a browser opens it (the hub's redirect, OAuth, nbgitpuller's page), then the pull itself."""
        link = f"{self.hub.base}/hub/user-redirect/git-pull?{urlencode(query, quote_via=quote)}"
        page = self.session.get(link, timeout=60)
        assert page.ok and f"/user/{self.name}/git-pull" in page.url, (page.status_code, page.url)
        events = self.api(
            "GET", "/git-pull/api", params={k: query[k] for k in ("repo", "branch", "targetpath")}
        )
        phases = [json.loads(line[5:]) for line in events.text.splitlines() if line.startswith("data:")]
        assert phases and phases[-1].get("phase") == "finished", phases[-3:]

    def notebook(self, path: str) -> dict:
        return self.api("GET", f"/api/contents/{path}", params={"content": "1"}).json()["content"]

    def save(self, path: str, notebook: dict) -> None:
        self.api(
            "PUT", f"/api/contents/{path}", json={"type": "notebook", "format": "json", "content": notebook}
        )

    def run(self, code: str, path: str = "", timeout: float = 240) -> str:
        """Execute code in a new kernel of this person's server (kernels API + its websocket); returns the output."""
        kernel = self.api("POST", "/api/kernels", json={"name": "python3", "path": path}).json()["id"]
        try:
            return execute(f"{self.server}/api/kernels/{kernel}/channels", self.headers, code, timeout)
        finally:
            self.session.delete(f"{self.server}/api/kernels/{kernel}", headers=self.headers, timeout=60)


def execute(url: str, headers: dict, code: str, timeout: float) -> str:
    import tornado.httpclient
    import tornado.ioloop

    async def talk() -> str:
        request = tornado.httpclient.HTTPRequest(
            url.replace("http://", "ws://"), headers=headers, connect_timeout=60, request_timeout=60
        )
        socket_ = await tornado_websocket.websocket_connect(request)
        msg_id = uuid.uuid4().hex
        header = {"msg_id": msg_id, "msg_type": "execute_request", "username": "test", "session": msg_id}
        content = {"code": code, "silent": False, "store_history": False, "allow_stdin": False}
        socket_.write_message(
            json.dumps(
                {
                    "header": {**header, "version": "5.3"},
                    "parent_header": {},
                    "metadata": {},
                    "content": content,
                }
                | {"channel": "shell"}
            )
        )
        output = []
        while True:
            message = json.loads(await socket_.read_message())
            if message.get("parent_header", {}).get("msg_id") != msg_id:
                continue
            kind, body = message["msg_type"], message["content"]
            if kind == "stream":
                output.append(body["text"])
            elif kind in ("display_data", "execute_result"):
                output.append(body["data"].get("text/plain", ""))
            elif kind == "error":
                output.append("\n".join(body["traceback"]))
            elif kind == "status" and body["execution_state"] == "idle":
                socket_.close()
                return "".join(output)

    return tornado.ioloop.IOLoop.current().run_sync(talk, timeout=timeout)


def answer(notebook: dict, solution: dict) -> dict:
    """alice: the solution cells' code typed in."""
    answers = {
        course.grade_id(cell): cell["source"] for cell in solution["cells"] if course.is_solution(cell)
    }
    for cell in notebook["cells"]:
        if course.is_solution(cell):
            source = course.cell_source({"source": answers[course.grade_id(cell)]})
            cell["source"] = "\n".join(line for line in source.split("\n") if "SOLUTION" not in line)
    return notebook


def forge(notebook: dict) -> dict:
    """mallory: every check cell turned into a print of the pass text."""
    for cell in notebook["cells"]:
        if course.is_graded(cell):
            cell["source"] = FORGED.format(label=course.grade_id(cell))
    return notebook


def solution_code(solution: dict, grade_id: str) -> str:
    cell = next(cell for cell in solution["cells"] if course.grade_id(cell) == grade_id)
    return "\n".join(line for line in course.cell_source(cell).split("\n") if "SOLUTION" not in line)


def make_course_repo(workdir: Path) -> Path:
    """A bare clone of this repository's HEAD, readable by every account (what the nbgitpuller link names)."""
    bare = workdir / "course.git"
    subprocess.run(["git", "clone", "--quiet", "--bare", str(ROOT), str(bare)], check=True, timeout=120)
    subprocess.run(["git", "-C", str(bare), "branch", "-f", "main", "HEAD"], capture_output=True, timeout=60)
    subprocess.run(
        ["git", "-C", str(bare), "symbolic-ref", "HEAD", "refs/heads/main"], check=True, timeout=60
    )
    subprocess.run(["chmod", "-R", "a+rX", str(bare)], check=True, timeout=60)
    return bare


def push_update(workdir: Path, bare: Path) -> None:
    """The instructor's next commit: a new file in the course."""
    clone = workdir / "update"
    subprocess.run(["git", "clone", "--quiet", str(bare), str(clone)], check=True, timeout=120)
    (clone / "NEWS.md").write_text("Lesson 10 is coming.\n")
    git = ["git", "-C", str(clone), "-c", "user.name=Instructor", "-c", "user.email=i@example.org"]
    subprocess.run([*git, "add", "NEWS.md"], check=True, timeout=60)
    subprocess.run([*git, "commit", "--quiet", "-m", "news"], check=True, timeout=60)
    subprocess.run([*git, "push", "--quiet", "origin", "HEAD:main"], check=True, timeout=60)
    subprocess.run(["chmod", "-R", "a+rX", str(bare)], check=True, timeout=60)


@pytest.fixture
def hub():
    """A hub in a fresh world-traversable folder; torn down whatever happens, with a watchdog on the whole test."""
    remove_class(None)  # what a killed earlier run may have left (accounts in GROUP only)
    workdir = Path(tempfile.mkdtemp(prefix="amp-hub-test-", dir="/tmp"))
    os.chmod(workdir, 0o755)
    (workdir / "home").mkdir(mode=0o755)
    the_hub = Hub(workdir)
    watchdog = threading.Timer(LIMIT_S, lambda: (the_hub.stop(), remove_class(None)))
    watchdog.daemon = True
    watchdog.start()
    try:
        yield the_hub
    finally:
        watchdog.cancel()
        if the_hub.log.exists():  # kept for a look after a failure
            (ROOT / ".test-output").mkdir(exist_ok=True)
            shutil.copy(the_hub.log, ROOT / ".test-output" / "hub.log")
        try:
            the_hub.stop()
        finally:
            remove_class(workdir)
        assert_nothing_left(the_hub)


def assert_nothing_left(the_hub: Hub) -> None:
    import psutil

    assert not class_processes(), "processes of the class's accounts are still running"
    alive = [
        pid for pid in the_hub.children if psutil.pid_exists(pid) and psutil.Process(pid).status() != "zombie"
    ]
    assert not alive, f"processes the hub started are still running: {alive}"
    for port in the_hub.ports:
        with socket.socket() as sock:
            assert sock.connect_ex(("127.0.0.1", port)) != 0, f"port {port} still listens"
    listening = [
        conn.laddr.port
        for conn in psutil.net_connections(kind="inet")
        if conn.status == psutil.CONN_LISTEN and conn.pid in the_hub.children
    ]
    assert not listening, f"ports still listening: {listening}"


def home(name: str, hub: Hub) -> Path:
    return hub.workdir / "home" / name


def refused(hub: Hub, name: str, password: str) -> bool:
    session = requests.Session()
    session.get(f"{hub.base}/hub/login", timeout=30)
    reply = session.post(
        f"{hub.base}/hub/login",
        data={"username": name, "password": password, "_xsrf": xsrf(session)},
        allow_redirects=False,
        timeout=60,
    )
    return reply.status_code == 403


def start_servers(hub: Hub) -> tuple[Person, dict]:
    """Logins (and the ones that must fail), four servers, each running as its own account in its cgroup."""
    import psutil

    assert refused(hub, LEARNERS[0], "not-the-password")
    assert refused(hub, INSTRUCTOR, PASSWORD), "the room password must never log an instructor in"
    teacher = Person(hub, INSTRUCTOR, ADMIN_PASSWORD)
    learners = {name: Person(hub, name, PASSWORD) for name in LEARNERS}
    assert teacher.hub_api("GET", f"/users/{INSTRUCTOR}").json()["admin"] is True
    assert learners[LEARNERS[0]].hub_api("GET", "/users").status_code == 403, "a learner is no admin"
    intruder = Person(
        hub, "root", PASSWORD
    )  # a name the room password accepts, an account the hub must refuse
    reply = intruder.hub_api("POST", "/users/root/server")
    time.sleep(2)
    assert reply.status_code >= 400 or not teacher.hub_api("GET", "/users/root").json()["servers"].get("", {})
    assert "is an account this hub did not create" in hub.log.read_text()
    for person in (teacher, *learners.values()):
        person.spawn()
    hub.remember_children()
    routes = teacher.hub_api("GET", "/proxy").json()
    hub.ports |= {
        int(route["target"].rsplit(":", 1)[1]) for route in routes.values() if "/user/" in route["routespec"]
    }
    for name in EVERYONE:
        servers = [
            p
            for p in class_processes()
            if p.username() == name and "jupyterhub-singleuser" in " ".join(p.cmdline())
        ]
        assert len(servers) == 1, f"{name}: {servers}"
        assert servers[0].uids().real == pwd.getpwnam(name).pw_uid
        assert home(name, hub).stat().st_mode & 0o777 == 0o700
        cgroups = Path(f"/proc/{servers[0].pid}/cgroup").read_text()
        if "amp-hub" in cgroups:  # where cgroups can be written (README: otherwise limits are advisory)
            assert f"amp-hub/{name}" in cgroups
            limit = [Path("/sys/fs/cgroup/memory/amp-hub", name, "memory.limit_in_bytes")]
            limit += [Path("/sys/fs/cgroup/amp-hub", name, "memory.max")]
            assert [int(path.read_text()) for path in limit if path.exists()] == [3 * 2**30], "3G per learner"
    services = {service["name"]: service for service in teacher.hub_api("GET", "/services").json().values()}
    assert psutil.pid_exists(services["idle-culler"]["pid"]), "the idle culler runs"
    return teacher, learners


def pull_everywhere(hub: Hub, people: list, bare: Path) -> dict:
    query = {
        "repo": f"file://{bare}",
        "branch": "main",
        "targetpath": COURSE_DIR,
        "urlpath": f"lab/tree/{COURSE_DIR}/notebooks/00_start_here.ipynb",
    }
    assert (
        f"the link to hand out: http://127.0.0.1:{hub.port}/hub/user-redirect/git-pull?"
        in hub.log.read_text()
    )
    for person in people:
        person.pull(query)
        pulled = home(person.name, hub) / COURSE_DIR / "notebooks" / "00_start_here.ipynb"
        assert pulled.stat().st_uid == pwd.getpwnam(person.name).pw_uid
    return query


def check_in_alice_server(hub: Hub, alice: Person) -> str:
    """Lesson 01's first check, run in a kernel of alice's server: the stub, then the solution."""
    mine = home(alice.name, hub) / COURSE_DIR
    exercise = json.loads((mine / "exercises" / f"{LESSON}.ipynb").read_text(encoding="utf-8"))
    solution = json.loads((mine / "solutions" / f"{LESSON}.ipynb").read_text(encoding="utf-8"))
    check = solution_code(exercise, "check_stored_value")
    stub = solution_code(exercise, "answer_stored_value")
    untouched = alice.run(f"{stub}\n{check}", path=f"{COURSE_DIR}/exercises")
    assert "Not done yet" in untouched, untouched
    solved = alice.run(
        f"{solution_code(solution, 'answer_stored_value')}\n{check}", path=f"{COURSE_DIR}/exercises"
    )
    assert "Passed" in solved and "Traceback" not in solved, solved
    record_file = home(alice.name, hub) / ".amp_lessons" / "progress.json"
    assert record_file.stat().st_uid == pwd.getpwnam(alice.name).pw_uid
    record = json.loads(record_file.read_text())["exercises"]
    entry = next(value for key, value in record.items() if key.startswith("01.1"))
    assert entry["passed"] and entry["attempts"] == 2, record
    for other in LEARNERS[1:]:
        assert not (home(other, hub) / ".amp_lessons" / "progress.json").exists()
    return solved


def update_keeps_edits(hub: Hub, alice: Person, query: dict, bare: Path) -> None:
    """alice edits a lesson, the instructor pushes a commit, the same link merges it and keeps her edit."""
    path = f"{COURSE_DIR}/notebooks/00_start_here.ipynb"
    notebook = alice.notebook(path)
    notebook["cells"].append({"cell_type": "markdown", "metadata": {}, "source": "alice's own note"})
    alice.save(path, notebook)
    push_update(hub.workdir, bare)
    alice.pull(query)
    assert (home(alice.name, hub) / COURSE_DIR / "NEWS.md").exists(), "the update arrived"
    assert "alice's own note" in (home(alice.name, hub) / path).read_text(encoding="utf-8"), (
        "her edit survived"
    )


def instructor_runs(teacher: Person, *steps: str) -> str:
    """nbgrader commands typed by the instructor: run in a kernel of their server, in their course folder."""
    code = (
        "import subprocess\nfrom pathlib import Path\n"
        f"for step in {[step.split() for step in steps]!r}:\n"
        f"    run = subprocess.run(['nbgrader', *step], cwd=Path.home() / {COURSE_DIR!r}, capture_output=True,"
        " text=True, timeout=300)\n"
        "    print('STEP', step[0], 'EXIT', run.returncode)\n"
        "    print(run.stdout[-3000:], run.stderr[-3000:])\n"
    )
    output = teacher.run(code, timeout=400)
    assert output.count("EXIT 0") == len(steps), output
    return output


def release(hub: Hub, teacher: Person) -> None:
    ours = home(INSTRUCTOR, hub) / COURSE_DIR
    source = ours / "course" / "source" / ASSIGNMENT
    teacher.run(
        f"import shutil\nfrom pathlib import Path\nsource = Path({str(source)!r})\n"
        f"source.mkdir(parents=True)\nshutil.copy(Path({str(ours)!r}) / 'solutions' / '{LESSON}.ipynb', source)\n"
    )
    instructor_runs(teacher, f"generate_assignment {ASSIGNMENT}", f"release_assignment {ASSIGNMENT}")
    course_folder = hub.workdir / "exchange" / COURSE_ID
    assert course_folder.stat().st_uid == pwd.getpwnam(INSTRUCTOR).pw_uid, (
        "the course's exchange folder is theirs"
    )
    assert (course_folder / "inbound").stat().st_mode & 0o777 == 0o733, "learners may hand in, never look in"
    assert (course_folder / "outbound").stat().st_mode & 0o777 == 0o755


def hand_in(hub: Hub, learners: dict, solution: dict) -> None:
    work = {LEARNERS[0]: lambda nb: answer(nb, solution), LEARNERS[1]: lambda nb: nb, LEARNERS[2]: forge}
    form = {"course_id": COURSE_ID, "assignment_id": ASSIGNMENT}
    for name, learner in learners.items():
        learner.api("POST", "/assignments/fetch", data=form)
        path = f"{ASSIGNMENT}/{LESSON}.ipynb"
        released = learner.notebook(path)
        assert all(
            cell["metadata"].get("editable") is False for cell in released["cells"] if course.is_graded(cell)
        )
        learner.save(path, work[name](released))
        reply = learner.api("POST", "/assignments/submit", data=form).json()
        assert not (isinstance(reply, dict) and reply.get("success") is False), reply


def gradebook(hub: Hub) -> dict:
    from nbgrader.api import Gradebook

    database = home(INSTRUCTOR, hub) / COURSE_DIR / "course" / "gradebook.db"
    with Gradebook(f"sqlite:///{database}") as book:
        return {name: book.find_submission(ASSIGNMENT, name).score for name in LEARNERS}


def isolation(hub: Hub, bob: Person) -> dict:
    """What bob's kernel can open: his own home, and nobody else's files."""
    alice, ours = home(LEARNERS[0], hub), home(INSTRUCTOR, hub) / COURSE_DIR
    paths = {
        "own home": str(home(LEARNERS[1], hub)),
        "alice's home": str(alice),
        "alice's progress record": str(alice / ".amp_lessons" / "progress.json"),
        "alice's submission copy": str(alice / ASSIGNMENT / f"{LESSON}.ipynb"),
        "the instructor's home": str(home(INSTRUCTOR, hub)),
        "the gradebook": str(ours / "course" / "gradebook.db"),
        "the exchange's inbound": str(hub.workdir / "exchange" / COURSE_ID / "inbound"),
    }
    probe = (
        "import os\n"
        f"for what, path in {paths!r}.items():\n"
        "    try:\n"
        "        os.listdir(path) if os.path.isdir(path) else open(path, 'rb').read(1)\n"
        "        print(what, '=', 'read')\n"
        "    except PermissionError:\n"
        "        print(what, '=', 'denied')\n"
    )
    output = bob.run(probe)
    return dict(line.split(" = ") for line in output.strip().splitlines())


def test_a_class_on_the_hub(hub, capsys):
    pytest.importorskip(
        "nbgrader.api", reason="nbgrader is for instructors: pip install -r requirements-dev.txt"
    )
    import psutil

    started, steps = time.monotonic(), []

    def timed(what):
        steps.append(f"{what} {time.monotonic() - started:.0f} s")

    bare = make_course_repo(hub.workdir)
    hub.start()
    timed("hub up")
    teacher, learners = start_servers(hub)
    alice, bob = learners[LEARNERS[0]], learners[LEARNERS[1]]
    timed("4 servers up")
    query = pull_everywhere(hub, [teacher, *learners.values()], bare)
    timed("course pulled")
    check_in_alice_server(hub, alice)
    server_mib = sum(p.memory_info().rss for p in class_processes() if p.username() == alice.name) / 2**20
    update_keeps_edits(hub, alice, query, bare)
    timed("check run, update pulled")
    release(hub, teacher)
    solution = json.loads((home(INSTRUCTOR, hub) / COURSE_DIR / "solutions" / f"{LESSON}.ipynb").read_text())
    hand_in(hub, learners, solution)
    timed("released, fetched, submitted")
    collected = instructor_runs(teacher, f"collect {ASSIGNMENT}", f"autograde {ASSIGNMENT}")
    assert "cheating" not in collected.lower(), "each submission belongs to the account that names it"
    timed("collected, autograded")
    scores = gradebook(hub)
    assert scores == {LEARNERS[0]: 2.0, LEARNERS[1]: 0.0, LEARNERS[2]: 0.0}, scores
    access = isolation(hub, bob)
    assert access.pop("own home") == "read" and set(access.values()) == {"denied"}, access
    hub.remember_children()
    with capsys.disabled():
        print(f"\nclass on the hub ({', '.join(steps)}): scores {scores}; bob denied {sorted(access)}")
        print(
            f"alice's server after two checks: {server_mib:.0f} MiB resident; hub children: {len(hub.children)}"
        )
    assert psutil.pid_exists(hub.process.pid)
