"""`make lab` serves the whole course folder and opens lesson 00.

The test asks make for the lab target's own command line (`make -s print-lab-command`, the variable the ``lab``
and ``instructor`` recipes run), adds only a throw-away port and token and ``--no-browser`` through ``LAB_ARGS``,
starts it on 127.0.0.1 with throw-away Jupyter folders, and asks the server's contents API for ``exercises/``,
``solutions/`` and ``docs/``: a learner following a lesson's closing pointer ("Exercise:
``exercises/01_precision_formats.ipynb``") must find it in the file browser. The server is always stopped (its
whole process group, by id) and the port is checked to be free again.
"""

from __future__ import annotations

import json
import os
import secrets
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
VENV = Path(sys.prefix)
START = "notebooks/00_start_here.ipynb"

pytestmark = pytest.mark.skipif(
    shutil.which("make") is None or not (VENV / "bin" / "jupyter").exists(),
    reason="needs make and a venv with jupyter (make setup)",
)


def make(*args: str) -> str:
    # under `make test` the parent's flags and command-line variables would reach this make through MAKEFLAGS
    env = {
        k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL", "MAKEOVERRIDES")
    }
    done = subprocess.run(
        ["make", "--no-print-directory", f"VENV={VENV}", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return done.stdout


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def listening(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(1)
        return sock.connect_ex(("127.0.0.1", port)) == 0


class NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args, **kwargs):
        return None


def get(url: str, token: str, follow: bool = True):
    request = urllib.request.Request(url, headers={"Authorization": f"token {token}"})
    opener = urllib.request.build_opener() if follow else urllib.request.build_opener(NoRedirect)
    try:
        with opener.open(request, timeout=10) as answer:
            return answer.status, dict(answer.headers), answer.read()
    except urllib.error.HTTPError as error:  # a redirect not followed, or a 404
        return error.code, dict(error.headers), error.read()


def test_lab_and_instructor_run_the_printed_command():
    command = make("-s", "print-lab-command").strip()
    assert f"--ServerApp.root_dir='{ROOT}'" in command, command
    assert f"--LabApp.default_url=/lab/tree/{START}" in command, command
    arguments = [part for part in shlex.split(command) if not part.startswith("-")]
    assert not any(a.endswith(".ipynb") for a in arguments), "a notebook argument makes its folder the root"
    # dry runs: the recipes' last lines are that command (set-up lines, if any, come first)
    assert make("-n", "lab").strip().splitlines()[-1].strip() == command
    assert make("-n", "instructor").strip().splitlines()[-1].strip().endswith(command)


@pytest.fixture
def lab_server():
    """The real lab command on a free port; always stopped (process group, by id), port free afterwards."""
    base = Path(tempfile.mkdtemp(prefix="amp_lessons_make_lab_"))
    port, token = free_port(), secrets.token_hex(16)
    extra = (
        f"--no-browser --ServerApp.port={port} --ServerApp.port_retries=0 --IdentityProvider.token={token}"
    )
    command = shlex.split(make("-s", "print-lab-command", f"LAB_ARGS={extra}"))
    env = dict(os.environ)
    for name in ("home", "config", "runtime", "data", "settings", "workspaces"):
        (base / name).mkdir()
    env.update(
        HOME=str(base / "home"),
        JUPYTER_CONFIG_DIR=str(base / "config"),
        JUPYTER_RUNTIME_DIR=str(base / "runtime"),
        JUPYTER_DATA_DIR=str(base / "data"),
        JUPYTERLAB_SETTINGS_DIR=str(base / "settings"),
        JUPYTERLAB_WORKSPACES_DIR=str(base / "workspaces"),
        AMP_LESSONS_PROGRESS_FILE=str(base / "progress.json"),
    )
    log = open(base / "lab.log", "w")
    process = subprocess.Popen(
        command,
        cwd=ROOT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 90
        while True:
            if process.poll() is not None:
                pytest.fail(
                    f"the lab command exited ({process.returncode}):\n{(base / 'lab.log').read_text()}"
                )
            try:
                if get(f"{url}/api/status", token)[0] == 200:
                    break
            except OSError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"the lab command did not answer in 90 s:\n{(base / 'lab.log').read_text()}")
            time.sleep(0.3)
        yield url, token
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(timeout=10)
        log.close()
        shutil.rmtree(base, ignore_errors=True)
        deadline = time.monotonic() + 10
        while listening(port) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not listening(port), f"something still listens on port {port} after the lab server stopped"


def listing(url: str, token: str, folder: str) -> list[str]:
    status, _, body = get(f"{url}/api/contents/{folder}?content=1", token)
    assert status == 200, f"/api/contents/{folder} answered {status}: the file browser cannot reach {folder}/"
    model = json.loads(body)
    assert model["type"] == "directory"
    return sorted(item["name"] for item in model["content"])


def test_make_lab_serves_the_course_folder_and_opens_lesson_00(lab_server):
    url, token = lab_server
    top = listing(url, token, "")
    assert {"notebooks", "exercises", "solutions", "docs"} <= set(top), top
    for folder, pattern in (("exercises", "*.ipynb"), ("solutions", "*.ipynb"), ("docs", "*.md")):
        expected = sorted(p.name for p in (ROOT / folder).glob(pattern))
        assert expected, f"the repository has no {folder}/{pattern}"
        assert set(expected) <= set(listing(url, token, folder)), folder
    assert "cheatsheet.md" in listing(url, token, "docs")
    status, _, _ = get(f"{url}/api/contents/exercises/01_precision_formats.ipynb?content=0", token)
    assert status == 200
    # the address the server prints (and the browser opens) is lesson 00
    status, headers, _ = get(f"{url}/", token, follow=False)
    assert status in (301, 302), status
    assert headers.get("Location", "").split("?")[0].endswith(f"/lab/tree/{START}"), headers
