"""JupyterHub for a class of "Mixed Precision, Validated" on one server (README.md here; the instructor guide's
"Run the workshop on a hub"). Start it with ``make hub`` (127.0.0.1:8000) or, as root on the class server,
``.venv-hub/bin/jupyterhub -f deploy/jupyterhub/jupyterhub_config.py``.

- **Login: JupyterHub's built-in SharedPasswordAuthenticator.** The room gets one password (``AMP_HUB_PASSWORD``,
  8+ characters) and each learner picks a user name; the instructors named in ``AMP_HUB_INSTRUCTORS`` log in with a
  second password (``AMP_HUB_ADMIN_PASSWORD``, 32+ characters) and are the hub's admins. Nothing to install, no
  accounts to prepare, no e-mail round trip. The price: anyone with the room password can log in under any learner's
  name. Where grades count, hand out per-learner passwords instead (FirstUseAuthenticator: see README.md).
- **One UNIX account per learner** (as root), created on first start as ``useradd <name>`` with a 0700 home under
  ``AMP_HUB_HOME_ROOT`` and membership of ``AMP_HUB_GROUP``; an existing account outside that group (``root``,
  ``daemon``, a staff member) is refused, so a user name can never start a server as someone else. Each learner's
  server runs as their account, so homes, progress records and nbgrader submissions are theirs. Without root
  (a laptop dry run) every server runs as you, in ``.hub-state/homes/<name>``: no isolation, for trying it only.
- **Limits per learner** (``AMP_HUB_MEM``, ``AMP_HUB_CPUS``) from the measured peaks of the lessons, enforced with a
  cgroup per learner (v2 or v1) around the server and its kernels; ``OMP_NUM_THREADS`` follows the CPU limit.
- **Idle culling**: jupyterhub-idle-culler stops a server idle for ``AMP_HUB_CULL_S`` (3600 s); inside each server,
  kernels idle for 30 minutes are shut down (singleuser/jupyter_server_config.py). Work is in the home, so a culled
  learner logs in again and carries on.
- **nbgitpuller** puts the course in each home from the link the hub prints at start; opened again, it merges
  new commits without overwriting the learner's edits.
- **nbgrader's exchange** at ``AMP_HUB_EXCHANGE``: root-owned 1777 (nbgrader requires a world-writable root), with
  the course's folder made by the hub and owned by the first instructor, so no learner can claim it first; nbgrader
  itself makes ``inbound`` write-only for learners (733) and ``outbound`` read-only (755).
"""

import grp
import os
import pwd
import re
import subprocess
import sys
from pathlib import Path
from urllib.parse import quote, urlencode

from jupyterhub.spawner import LocalProcessSpawner, SimpleLocalProcessSpawner

c = get_config()  # noqa: F821  (JupyterHub defines get_config while it reads this file)
HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]


def setting(name: str, default) -> str:
    return os.environ.get(f"AMP_HUB_{name}", str(default))


AS_ROOT = os.geteuid() == 0
STATE = Path(setting("STATE", REPO / ".hub-state"))
COURSE_VENV = Path(setting("COURSE_VENV", REPO / ".venv"))  # torch, JupyterLab, nbgrader, the course
HUB_VENV = Path(
    sys.prefix
)  # .venv-hub: jupyterhub, nbgitpuller, the culler (sees COURSE_VENV through a .pth)
# not inside STATE, which holds the hub's secrets and is private to root: learners could not reach it
EXCHANGE = Path(setting("EXCHANGE", "/srv/nbgrader/exchange" if AS_ROOT else STATE / "exchange"))
COURSE_ID = setting("COURSE_ID", "mixed-precision-validated")
INSTRUCTORS = [name for name in setting("INSTRUCTORS", "instructor").split(",") if name]
GROUP = setting("GROUP", "amp-learners")
HOME_ROOT = Path(setting("HOME_ROOT", "/home" if AS_ROOT else STATE / "homes"))
MEM = setting("MEM", "3G")  # lesson 09 peaks at 1.9 GiB, a server is 0.15, an idle kernel 0.9: README.md
CPUS = float(setting("CPUS", "1"))
CULL_S = int(setting("CULL_S", 3600))
IP, PORT = setting("IP", "127.0.0.1"), int(setting("PORT", 8000))


def git(*args: str) -> str:
    run = subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, text=True, check=False)
    return run.stdout.strip() if run.returncode == 0 else ""


# the course's git repository: a URL learners' servers can reach (GitHub), or a path on this server
COURSE_REPO = setting("COURSE_REPO", git("remote", "get-url", "origin") or f"file://{REPO}")
COURSE_BRANCH = setting("COURSE_BRANCH", git("rev-parse", "--abbrev-ref", "HEAD") or "main")
COURSE_DIR = setting("COURSE_DIR", "mixed-precision-validated")  # the course's folder in each home
LOCAL_REPO = COURSE_REPO.removeprefix("file://") if COURSE_REPO.startswith(("/", "file://")) else None

STATE.mkdir(parents=True, exist_ok=True, mode=0o700)


def reachable_by_all(path: Path) -> bool:
    """Can an account with no rights of its own read ``path`` (every folder above it searchable)?"""
    path = path.resolve()
    return all(os.stat(folder).st_mode & 0o001 for folder in path.parents) and os.stat(path).st_mode & 0o004


if AS_ROOT:  # learners' servers run this environment's Python as their own accounts
    for needed in (Path(sys.executable), Path(sys.base_prefix) / "lib", COURSE_VENV / "pyvenv.cfg", REPO):
        if not reachable_by_all(needed):
            sys.exit(
                f"[amp-hub] {needed.resolve()} cannot be read by learners' accounts: build .venv-hub from a "
                "Python every account can run (make hub-setup HUB_PYTHON=/usr/bin/python3; README.md)"
            )

# --- the hub and its proxy, on this machine ------------------------------------------------------------------------
SSL_CERT, SSL_KEY = setting("SSL_CERT", ""), setting("SSL_KEY", "")  # for a class over the network: HTTPS
c.JupyterHub.bind_url = f"{'https' if SSL_CERT else 'http'}://{IP}:{PORT}"
if SSL_CERT:
    c.JupyterHub.ssl_cert, c.JupyterHub.ssl_key = SSL_CERT, SSL_KEY
PUBLIC_URL = setting("PUBLIC_URL", f"{'https' if SSL_CERT else 'http'}://{IP}:{PORT}")  # what learners type
c.JupyterHub.hub_bind_url = f"http://127.0.0.1:{setting('HUB_PORT', 8081)}"
c.ConfigurableHTTPProxy.api_url = f"http://127.0.0.1:{setting('PROXY_API_PORT', 8001)}"
LOCAL_PROXY = REPO / ".hub-node" / "node_modules" / ".bin" / "configurable-http-proxy"  # make hub-setup
c.ConfigurableHTTPProxy.command = [str(LOCAL_PROXY) if LOCAL_PROXY.exists() else "configurable-http-proxy"]
c.ConfigurableHTTPProxy.pid_file = str(STATE / "proxy.pid")
c.JupyterHub.db_url = f"sqlite:///{STATE / 'jupyterhub.sqlite'}"
c.JupyterHub.cookie_secret_file = str(STATE / "cookie_secret")
c.JupyterHub.cleanup_servers = True  # stopping the hub stops every learner's server

# --- login -------------------------------------------------------------------------------------------------------
c.JupyterHub.authenticator_class = "shared-password"
c.SharedPasswordAuthenticator.user_password = os.environ.get("AMP_HUB_PASSWORD")
c.SharedPasswordAuthenticator.admin_password = os.environ.get("AMP_HUB_ADMIN_PASSWORD")
c.Authenticator.admin_users = set(INSTRUCTORS)
DRY_RUN_PASSWORDS = {"dry-run-password", "dry-run-instructor-password-0123456789"}  # the Makefile's defaults
if IP != "127.0.0.1" and DRY_RUN_PASSWORDS & {
    os.environ.get("AMP_HUB_PASSWORD"),
    os.environ.get("AMP_HUB_ADMIN_PASSWORD"),
}:
    sys.exit(f"[amp-hub] refusing the dry-run passwords on {IP}: set HUB_PASSWORD and HUB_ADMIN_PASSWORD")
c.Authenticator.allow_all = (
    True  # whoever has the room password; AMP_HUB_LEARNERS lists names to allow only those
)
if os.environ.get("AMP_HUB_LEARNERS"):
    c.Authenticator.allow_all = False
    c.Authenticator.allowed_users = set(os.environ["AMP_HUB_LEARNERS"].split(","))
c.Authenticator.username_pattern = r"^[a-z][a-z0-9-]{1,30}$"  # a valid UNIX account name, lower case


# --- one account, home, progress record and cgroup per learner ------------------------------------------------------
def home_of(name: str) -> Path:
    return HOME_ROOT / name


def ensure_account(name: str) -> None:
    """Create ``name``'s account on first start; refuse an account the hub did not create."""
    try:
        grp.getgrnam(GROUP)
    except KeyError:
        subprocess.run(["groupadd", GROUP], check=True)
    try:
        account = pwd.getpwnam(name)
    except KeyError:
        subprocess.run(
            [
                "useradd",
                "--create-home",
                "--home-dir",
                str(home_of(name)),
                "--groups",
                GROUP,
                "--shell",
                "/bin/bash",
            ]
            + [name],
            check=True,
        )
        account = pwd.getpwnam(name)
    if name not in grp.getgrnam(GROUP).gr_mem or Path(account.pw_dir) != home_of(name):
        raise PermissionError(
            f"{name!r} is an account this hub did not create (not in group {GROUP}): refused"
        )
    os.chmod(account.pw_dir, 0o700)


def ensure_exchange(instructor: str | None) -> None:
    """The exchange root is world-writable and sticky; the course's folder belongs to an instructor."""
    EXCHANGE.mkdir(parents=True, exist_ok=True)
    os.chmod(EXCHANGE, 0o1777)
    course = EXCHANGE / COURSE_ID
    if instructor and AS_ROOT and not course.exists():
        course.mkdir(mode=0o755)
        account = pwd.getpwnam(instructor)
        os.chown(course, account.pw_uid, account.pw_gid)


def cgroup_dirs(name: str, memory_bytes: int, cpus: float) -> list[Path]:
    """A cgroup for one learner with their memory and CPU limits (v2, else v1); [] where cgroups are read-only."""
    base, quota = Path("/sys/fs/cgroup"), str(int(cpus * 100_000))
    try:
        if (base / "cgroup.controllers").exists():
            parent = base / "amp-hub"
            parent.mkdir(exist_ok=True)
            for folder in (base, parent):
                (folder / "cgroup.subtree_control").write_text("+memory +cpu")
            (parent / name).mkdir(exist_ok=True)
            (parent / name / "memory.max").write_text(str(memory_bytes))
            (parent / name / "cpu.max").write_text(f"{quota} 100000")
            return [parent / name]
        memory, cpu = base / "memory" / "amp-hub" / name, base / "cpu" / "amp-hub" / name
        memory.mkdir(parents=True, exist_ok=True)
        cpu.mkdir(parents=True, exist_ok=True)
        (memory / "memory.limit_in_bytes").write_text(str(memory_bytes))
        (cpu / "cpu.cfs_period_us").write_text("100000")
        (cpu / "cpu.cfs_quota_us").write_text(quota)
        return [memory, cpu]
    except OSError as error:
        print(f"[amp-hub] limits for {name} not enforced ({error}); see README.md", file=sys.stderr)
        return []


class ClassSpawner(LocalProcessSpawner):
    """LocalProcessSpawner whose server (and so every kernel it starts) runs in the learner's cgroup."""

    def make_preexec_fn(self, name):
        become_user = super().make_preexec_fn(name)
        groups = cgroup_dirs(name, self.mem_limit, self.cpu_limit)

        def preexec():
            for folder in groups:
                (folder / "cgroup.procs").write_text(str(os.getpid()))
            become_user()

        return preexec


class DryRunSpawner(SimpleLocalProcessSpawner):
    """Without root: every server runs as you, in .hub-state/homes/<name> (a dry run, no isolation)."""

    home_dir_template = str(HOME_ROOT / "{username}")


def trust_course_repo(gitconfig: Path, account) -> None:
    """git will not read a repository another account owns: name this one (bare, or a working copy) as safe."""
    for trusted in (LOCAL_REPO, os.path.join(LOCAL_REPO, ".git")):
        git_set = ["git", "config", "--file", str(gitconfig), "--replace-all", "safe.directory", trusted]
        subprocess.run([*git_set, f"^{re.escape(trusted)}$"], check=True)
    os.chown(gitconfig, account.pw_uid, account.pw_gid)


def pre_spawn(spawner) -> None:
    name = spawner.user.name
    if AS_ROOT:
        ensure_account(name)
    else:
        home_of(name).mkdir(parents=True, exist_ok=True, mode=0o700)
    ensure_exchange(name if name in INSTRUCTORS else None)
    (home_of(name) / ".amp_lessons").mkdir(exist_ok=True)
    if AS_ROOT:
        account = pwd.getpwnam(name)
        os.chown(home_of(name) / ".amp_lessons", account.pw_uid, account.pw_gid)
        if LOCAL_REPO:
            trust_course_repo(home_of(name) / ".gitconfig", account)


c.JupyterHub.spawner_class = ClassSpawner if AS_ROOT else DryRunSpawner
c.Spawner.pre_spawn_hook = pre_spawn
c.Spawner.cmd = [str(HUB_VENV / "bin" / "jupyterhub-singleuser")]
c.Spawner.default_url = "/lab"
c.Spawner.notebook_dir = "~"
c.Spawner.mem_limit = MEM
c.Spawner.cpu_limit = CPUS
c.Spawner.start_timeout = 180  # a busy machine imports JupyterLab slowly
c.Spawner.http_timeout = 120
c.Spawner.environment = {
    "AMP_LESSONS_PROGRESS_FILE": lambda spawner: str(
        home_of(spawner.user.name) / ".amp_lessons" / "progress.json"
    ),
    "AMP_LESSONS_EXCHANGE": str(
        EXCHANGE
    ),  # read by the course's nbgrader_config.py (the instructor's commands)
    "AMP_LESSONS_COURSE_ID": COURSE_ID,
    "OMP_NUM_THREADS": str(max(1, int(CPUS))),  # torch would start one thread per core of the whole machine
    "MKL_NUM_THREADS": str(max(1, int(CPUS))),
    # the course environment's Jupyter settings, extensions and kernels, after the hub's (exchange, culling)
    "JUPYTER_CONFIG_PATH": os.pathsep.join([str(HERE / "singleuser"), str(COURSE_VENV / "etc" / "jupyter")]),
    "JUPYTER_PATH": str(COURSE_VENV / "share" / "jupyter"),
    "PATH": os.pathsep.join(
        [str(HUB_VENV / "bin"), str(COURSE_VENV / "bin"), "/usr/local/bin", "/usr/bin", "/bin"]
    ),
}


# --- idle culling: a hub service with only the permissions it needs -------------------------------------------------
c.JupyterHub.services = [
    {
        "name": "idle-culler",
        "command": [sys.executable, "-m", "jupyterhub_idle_culler", f"--timeout={CULL_S}"],
    }
]
c.JupyterHub.load_roles = [
    {
        "name": "idle-culler",
        "scopes": ["list:users", "read:users:activity", "read:servers", "delete:servers"],
        "services": ["idle-culler"],
    }
]

# --- the link to hand out ---------------------------------------------------------------------------------------------
LINK_QUERY = {
    "repo": COURSE_REPO,
    "branch": COURSE_BRANCH,
    "targetpath": COURSE_DIR,
    "urlpath": f"lab/tree/{COURSE_DIR}/notebooks/00_start_here.ipynb",
}
CLASS_LINK = f"{PUBLIC_URL}/hub/user-redirect/git-pull?{urlencode(LINK_QUERY, quote_via=quote)}"
print(f"[amp-hub] the link to hand out: {CLASS_LINK}", file=sys.stderr)
if not AS_ROOT:
    print("[amp-hub] not root: every server runs as you (a dry run; see README.md)", file=sys.stderr)
