"""Every lesson, opened in JupyterLab in a real (headless) Chromium, the way a learner meets it.

A notebook can pass nbval and still be broken where people use it: a widget that shows "Error
displaying widget", a figure that never appears, a slider that changes nothing, a cell that only works
in the order the author ran it. So this test starts ``jupyter lab`` (127.0.0.1, random port, random
token, throw-away HOME / config / runtime / settings folders, windowing off so every cell is in the
DOM), opens each ``notebooks/*.ipynb`` (globbed when the tests are collected) from a temporary copy,
runs it with the *Run > Run All Cells* menu, waits for the kernel, and asserts:

- no cell produced an error and every code cell ran (Run All stops at the first error);
- every widget rendered (no "Error displaying widget", no error-widget placeholder, no "Loading widget...");
- figures are there: a lesson that uses matplotlib shows at least one ``<img>``, every image output is
  drawn, and no figure came out as the bare text ``<Figure size ...>``;
- in each widget that has a slider, moving the slider (keyboard arrows on its handle) changes what the
  widget shows besides the slider's own readout, without a traceback.

A screenshot per notebook goes to ``screenshots/`` (git-ignored). ``test_checker_reports_broken_widgets``
proves the checks can fail: it runs ``tests/fixtures/browser_widget_problems.ipynb``, which plants a widget
whose JavaScript module does not exist, a slider wired to nothing and a cell that raises.

Under pytest-xdist each worker that receives one of these tests starts its own server and browser
(module-scoped fixture). Without Chromium the tests are skipped with the install command.
``AMP_LESSONS_CHROMIUM`` points at another Chromium/Chrome binary; ``AMP_LESSONS_BROWSER_TIMEOUT``
(seconds, default 150) bounds each notebook's Run All.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from amp_lessons.tools.exercises.builder import cell_source

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures"
SCREENSHOTS = ROOT / "screenshots"
LESSONS = sorted((ROOT / "notebooks").glob("*.ipynb"))
BROKEN_FIXTURE = "browser_widget_problems.ipynb"

RUN_TIMEOUT = float(os.environ.get("AMP_LESSONS_BROWSER_TIMEOUT", "150"))
SLIDER_TIMEOUT = 20.0
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
    "--disable-sync",
    "--disable-dev-shm-usage",
]
INSTALL_HINT = (
    "Chromium not installed: apt-get install chromium (Debian; `sudo apt-get install chromium-browser` on "
    "Ubuntu), or point AMP_LESSONS_CHROMIUM at a Chromium/Chrome binary."
)
# User settings for the throw-away JupyterLab: render every cell (no windowing), no news or update checks.
LAB_SETTINGS = {
    "@jupyterlab/notebook-extension/tracker.jupyterlab-settings": {"windowingMode": "none"},
    "@jupyterlab/apputils-extension/notification.jupyterlab-settings": {
        "checkForUpdates": False,
        "fetchNews": "false",
    },
}
MATPLOTLIB_USE = re.compile(r"\bplt\.|\bmatplotlib\b|\bplots\.")


def chromium_candidates() -> list[str]:
    names = [os.environ.get("AMP_LESSONS_CHROMIUM", ""), "/usr/bin/chromium"]
    names += [
        shutil.which(n) or ""
        for n in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
    ]
    seen = []
    for name in names:
        if name and os.path.isfile(name) and os.access(name, os.X_OK) and name not in seen:
            seen.append(name)
    return seen


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# ------------------------------------------------------------------------------------------ the server


class LabServer:
    """A private ``jupyter lab`` on 127.0.0.1 serving a temporary copy of the notebooks."""

    def __init__(self, base: Path):
        self.base = base
        self.root = base / "root"
        self.token = secrets.token_hex(24)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = base / "jupyter-lab.log"
        self.progress_file = base / "progress.json"
        self.process: subprocess.Popen | None = None

    def prepare(self) -> None:
        for name in ("home", "config", "runtime", "data", "settings", "workspaces", "root"):
            (self.base / name).mkdir(parents=True, exist_ok=True)
        for name, values in LAB_SETTINGS.items():
            path = self.base / "settings" / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(values), encoding="utf-8")
        # learners' copies: the repository's clean notebooks are never opened, so never saved with outputs
        shutil.copytree(
            ROOT / "notebooks", self.root / "notebooks", ignore=shutil.ignore_patterns(".ipynb_checkpoints")
        )
        (self.root / "fixtures").mkdir()
        shutil.copy(FIXTURES / BROKEN_FIXTURE, self.root / "fixtures" / BROKEN_FIXTURE)

    def environment(self) -> dict:
        env = dict(os.environ)
        env.pop("MPLBACKEND", None)  # kernels keep the inline backend, or figures would vanish
        env.update(
            HOME=str(self.base / "home"),
            JUPYTER_CONFIG_DIR=str(self.base / "config"),
            JUPYTER_RUNTIME_DIR=str(self.base / "runtime"),
            JUPYTER_DATA_DIR=str(self.base / "data"),
            JUPYTERLAB_SETTINGS_DIR=str(self.base / "settings"),
            JUPYTERLAB_WORKSPACES_DIR=str(self.base / "workspaces"),
            AMP_LESSONS_PROGRESS_FILE=str(self.progress_file),
            AMP_LESSONS_STRICT="1",  # like `make notebooks`: a lesson's own check that fails is an error
            PYTHONDONTWRITEBYTECODE="1",
        )
        return env

    def start(self, timeout: float = 90.0) -> None:
        self.prepare()
        command = [
            sys.executable,
            "-m",
            "jupyterlab",
            "--no-browser",
            "--allow-root",
            "--ServerApp.ip=127.0.0.1",
            f"--ServerApp.port={self.port}",
            "--ServerApp.port_retries=0",
            f"--IdentityProvider.token={self.token}",
            f"--ServerApp.root_dir={self.root}",
            "--LabApp.expose_app_in_browser=True",  # read outputs from the notebook model (window.jupyterapp)
            "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
        ]
        with open(self.log_path, "w") as log:
            self.process = subprocess.Popen(
                command,
                env=self.environment(),
                cwd=str(self.root),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"jupyter lab exited with code {self.process.returncode}:\n{self.log_tail()}"
                )
            try:
                self.api("GET", "api/status")
                return
            except (OSError, urllib.error.URLError):
                time.sleep(0.25)
        raise RuntimeError(f"jupyter lab did not answer within {timeout:.0f} s:\n{self.log_tail()}")

    def api(self, method: str, path: str):
        request = urllib.request.Request(f"{self.url}/{path}", method=method)
        request.add_header("Authorization", f"token {self.token}")
        with urllib.request.urlopen(request, timeout=10) as answer:
            body = answer.read()
        return json.loads(body) if body else None

    def shutdown_kernels(self, path: str | None = None) -> None:
        try:
            for session in self.api("GET", "api/sessions") or []:
                if path is None or session.get("path") == path:
                    self.api("DELETE", f"api/sessions/{session['id']}")
        except (OSError, urllib.error.URLError, ValueError):
            pass

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            self.shutdown_kernels()
            self.process.terminate()
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=5)


# ------------------------------------------------------------------------------------------ the checks

JS_FINISHED = """() => {
  const indicator = document.querySelector('.jp-Notebook-ExecutionIndicator');
  const prompts = [...document.querySelectorAll('.jp-Notebook .jp-CodeCell .jp-InputArea-prompt')]
    .map(e => e.textContent);
  return !!indicator && indicator.getAttribute('data-status') === 'idle' && prompts.length > 0
      && !prompts.some(t => t.includes('*')) && /\\[\\d+\\]/.test(prompts.join(' '));
}"""
JS_STARTED = """() => [...document.querySelectorAll('.jp-Notebook .jp-CodeCell .jp-InputArea-prompt')]
  .some(e => /\\[(\\*|\\d+)\\]/.test(e.textContent))"""
JS_KERNEL_IDLE = """() => {
  const indicator = document.querySelector('.jp-Notebook-ExecutionIndicator');
  return !!indicator && indicator.getAttribute('data-status') === 'idle';
}"""
JS_MODEL = """(path) => {
  if (!window.jupyterapp) return null;
  const panel = [...window.jupyterapp.shell.widgets('main')].find(w => w.context && w.context.path === path);
  return panel ? panel.context.model.toJSON() : null;
}"""
# Per cell (DOM order = model order with windowing off): what each top-level output shows.
JS_OUTPUTS = """() => [...document.querySelectorAll('.jp-Notebook .jp-Cell')].map(cell => {
  const area = cell.querySelector('.jp-Cell-outputArea');
  if (!area) return [];
  return [...area.children].filter(c => c.classList.contains('jp-OutputArea-child')).map(child => {
    const out = child.querySelector('.jp-OutputArea-output');
    if (!out) return {};
    const text = out.textContent || '';
    const tracebacks = [...out.querySelectorAll(
      '.jupyter-widgets [data-mime-type="application/vnd.jupyter.stderr"]')]
      .map(e => e.textContent).filter(t => t.includes('Traceback'));
    return {
      widget: !!out.querySelector('.jupyter-widgets'),
      error_widget: out.querySelector('.jupyter-widgets-error-widget') ? text.trim().slice(0, 300) : '',
      error_text: text.includes('Error displaying widget') ? text.trim().slice(0, 300) : '',
      loading: text.includes('Loading widget'),
      images: out.querySelectorAll('img, .jp-RenderedSVG svg').length,
      sliders: out.querySelectorAll('.noUi-handle').length,
      widget_traceback: tracebacks.length ? tracebacks[0].trim().split('\\n').slice(-1)[0].slice(0, 300) : '',
    };
  });
})"""
JS_STILL_LOADING = (
    "() => [...document.querySelectorAll('.jp-OutputArea-output')]"
    ".some(o => (o.textContent || '').includes('Loading widget'))"
)
# What a widget shows besides its sliders (whose own readouts move with them).
JS_VIEW = """(out) => {
  const copy = out.cloneNode(true);
  copy.querySelectorAll('.widget-slider, .widget-hslider, .widget-vslider').forEach(e => e.remove());
  return copy.innerHTML;
}"""


@dataclass
class NotebookReport:
    """What one notebook looked like in JupyterLab; ``problems`` is empty when it is fine for learners."""

    name: str
    problems: list = field(default_factory=list)
    seconds: float = 0.0
    run_seconds: float = 0.0
    widgets: int = 0
    images: int = 0
    sliders_moved: int = 0
    console_errors: list = field(default_factory=list)
    notes: list = field(default_factory=list)
    screenshot: str = ""

    def __str__(self) -> str:
        lines = [
            f"{self.name}: {len(self.problems)} problem(s) in {self.seconds:.1f} s "
            f"(Run All {self.run_seconds:.1f} s; {self.widgets} widget(s), {self.images} image(s), "
            f"{self.sliders_moved} slider(s) moved); screenshot {self.screenshot or '-'}"
        ]
        lines += [f"  - {p}" for p in self.problems]
        lines += [f"  {n}" for n in self.notes]
        if self.console_errors:
            lines.append("  browser console errors:")
            lines += [f"    {e}" for e in self.console_errors[:5]]
        return "\n".join(lines)


def first_line(cell: dict) -> str:
    lines = [line for line in cell_source(cell).splitlines() if line.strip()]
    return (lines[0][:60] + ("..." if len(lines[0]) > 60 else "")) if lines else ""


def run_all_cells(page) -> None:
    """Run > Run All Cells from the menu bar (the command palette if the menu does not open)."""
    for _ in range(4):
        page.click("div.lm-MenuBar-itemLabel:text-is('Run')")
        try:
            page.click("li.lm-Menu-item[data-command='runmenu:run-all']", timeout=3000)
            return
        except Exception:
            page.keyboard.press("Escape")
            time.sleep(0.5)
    page.click(".jp-Notebook")
    page.keyboard.press("Escape")
    page.keyboard.press("Control+Shift+C")
    page.keyboard.type("Run All Cells")
    page.keyboard.press("Enter")


def check_problems_in_model(model: dict, report: NotebookReport) -> None:
    """Errors, cells never run, and figures that only printed ``<Figure size ...>``."""
    never_ran = []
    for number, cell in enumerate(model.get("cells", []), start=1):
        if cell.get("cell_type") != "code" or not cell_source(cell).strip():
            continue
        if cell.get("execution_count") is None:
            never_ran.append(number)
        for output in cell.get("outputs", []):
            if output.get("output_type") == "error":
                report.problems.append(
                    f"cell {number} (`{first_line(cell)}`) raised {output.get('ename')}: "
                    f"{str(output.get('evalue'))[:300]}"
                )
            data = output.get("data", {})
            if set(data) == {"text/plain"} and "<Figure size" in str(data["text/plain"]):
                report.problems.append(
                    f"cell {number} (`{first_line(cell)}`): a figure came out as text "
                    f"({str(data['text/plain']).strip()[:60]}) "
                    "instead of an image; is the inline backend disabled (MPLBACKEND) or plt.show() missing?"
                )
    if never_ran:
        report.problems.append(
            f"cell(s) {never_ran} never ran (Run All stops at the first error, or the kernel died)"
        )


def check_widgets_and_figures(model: dict, outputs: list, report: NotebookReport) -> None:
    cells = model.get("cells", [])
    if len(outputs) != len(cells):
        report.problems.append(
            f"the page shows {len(outputs)} cells but the notebook has {len(cells)}: is windowing still on?"
        )
        return
    image_outputs = 0
    for number, (cell, shown) in enumerate(zip(cells, outputs), start=1):
        for index, output in enumerate(cell.get("outputs", []) if cell.get("cell_type") == "code" else []):
            data = output.get("data", {})
            dom = shown[index] if index < len(shown) else {}
            where = f"cell {number} (`{first_line(cell)}`)"
            if "application/vnd.jupyter.widget-view+json" in data:
                report.widgets += 1
                if dom.get("error_widget") or dom.get("error_text"):
                    why = dom.get("error_text") or next(
                        (e for e in report.console_errors if "module" in e or "widget" in e.lower()),
                        "see the browser console",
                    )
                    report.problems.append(
                        f"{where}: widget did not render (Error displaying widget; {why.splitlines()[0]})"
                    )
                elif dom.get("loading"):
                    report.problems.append(f"{where}: widget still shows 'Loading widget...'")
                elif not dom.get("widget"):
                    report.problems.append(f"{where}: widget output shows no widget at all")
                if dom.get("widget_traceback"):
                    report.problems.append(
                        f"{where}: the widget shows a traceback: {dom['widget_traceback']}"
                    )
            if any(kind.startswith("image/") for kind in data):
                image_outputs += 1
    report.images = sum(d.get("images", 0) for shown in outputs for d in shown)
    if report.images < image_outputs:
        report.problems.append(
            f"the notebook has {image_outputs} image output(s) but the page shows {report.images} <img>"
        )
    if (
        any(MATPLOTLIB_USE.search(cell_source(c)) for c in cells if c.get("cell_type") == "code")
        and not report.images
    ):
        report.problems.append("the notebook uses matplotlib but no figure (<img>) appears in any output")


def wait_until_settled(page, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if page.evaluate(JS_KERNEL_IDLE) and not page.evaluate(JS_STILL_LOADING):
            return
        time.sleep(0.25)


def check_sliders(page, model: dict, report: NotebookReport, timeout: float = SLIDER_TIMEOUT) -> None:
    """In every top-level output that has a slider, move its first slider and expect the view to change."""
    outputs = page.locator(
        ".jp-Notebook .jp-Cell .jp-Cell-outputArea > .jp-OutputArea-child > .jp-OutputArea-output"
    )
    for index in range(outputs.count()):
        output = outputs.nth(index)
        if output.locator(".noUi-handle").count() == 0:
            continue
        number = output.evaluate(
            "(o) => [...document.querySelectorAll('.jp-Notebook .jp-Cell')]"
            ".indexOf(o.closest('.jp-Cell')) + 1"
        )
        cell = model["cells"][number - 1] if 0 < number <= len(model.get("cells", [])) else {}
        where = f"cell {number} (`{first_line(cell)}`)"
        handle = output.locator(".noUi-handle").first
        label = output.locator(".widget-slider .widget-label").first
        name = (label.text_content() or "").strip() if label.count() else ""
        wait_until_settled(page)
        before_view = output.evaluate(JS_VIEW)
        before_value = handle.get_attribute("aria-valuenow")
        handle.scroll_into_view_if_needed()
        handle.focus()
        page.keyboard.press("ArrowRight")
        if handle.get_attribute("aria-valuenow") == before_value:  # already at its maximum
            page.keyboard.press("ArrowLeft")
            page.keyboard.press("ArrowLeft")
        after_value = handle.get_attribute("aria-valuenow")
        if after_value == before_value:
            report.problems.append(f"{where}: the slider {name!r} did not move with the arrow keys")
            continue
        deadline, previous, changed = time.monotonic() + timeout, None, False
        while time.monotonic() < deadline:
            time.sleep(0.3)
            view = output.evaluate(JS_VIEW)
            if view != before_view and view == previous and page.evaluate(JS_KERNEL_IDLE):
                changed = True
                break
            previous = view
        if not changed:
            report.problems.append(
                f"{where}: moving the slider {name!r} from {before_value} to {after_value} "
                f"changed nothing else in the widget within {timeout:.0f} s "
                "(is it wired to the figure/table with interactive_output or observe?)"
            )
            continue
        report.sliders_moved += 1
        traceback = output.evaluate(
            "(o) => [...o.querySelectorAll('[data-mime-type=\"application/vnd.jupyter.stderr\"]')]"
            ".map(e => e.textContent)"
            ".filter(t => t.includes('Traceback')).map(t => t.trim().split('\\n').slice(-1)[0]).join(' | ')"
        )
        if traceback:
            report.problems.append(
                f"{where}: after moving the slider {name!r} the widget shows a traceback: {traceback[:300]}"
            )


def wait_for_kernel(page, lab: LabServer, path: str, timeout: float = 120.0) -> None:
    """Until the server says this notebook's kernel is idle and the page's indicator agrees."""
    page.wait_for_selector(".jp-Notebook-ExecutionIndicator", timeout=timeout * 1000)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            sessions = [s for s in lab.api("GET", "api/sessions") or [] if s.get("path") == path]
        except (OSError, urllib.error.URLError, ValueError):
            sessions = []
        if (
            sessions
            and (sessions[0].get("kernel") or {}).get("execution_state") == "idle"
            and page.evaluate(JS_KERNEL_IDLE)
        ):
            return
        time.sleep(0.25)
    raise AssertionError(f"{path}: the kernel was not ready after {timeout:.0f} s\n{lab.log_tail()}")


def diagnostics(page, lab: LabServer, path: str) -> list:
    """Context for a failure: open dialogs, the kernel's state, the server's last words about kernels."""
    notes = []
    dialogs = page.evaluate(
        "() => [...document.querySelectorAll('.jp-Dialog')].map(d => d.textContent.trim().slice(0, 200))"
    )
    notes += [f"(dialog open: {d})" for d in dialogs]
    try:
        states = [
            (s.get("kernel") or {}).get("execution_state")
            for s in lab.api("GET", "api/sessions") or []
            if s.get("path") == path
        ]
        notes.append(f"(kernel state now: {states or 'no session'})")
    except (OSError, urllib.error.URLError, ValueError):
        pass
    log = [
        line for line in lab.log_tail(200).splitlines() if re.search(r"restart|died|dead|error", line, re.I)
    ]
    notes += [f"(server log: {line.strip()[:200]})" for line in log[-5:]]
    return notes


def check_notebook_in_lab(
    browser, lab: LabServer, path: str, screenshot: Path | None = None, slider_timeout: float = SLIDER_TIMEOUT
) -> NotebookReport:
    """Open ``path`` (relative to the server root) in a fresh workspace, Run All, and report what a learner
    would see."""
    report = NotebookReport(Path(path).name)
    started = time.monotonic()
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    page.set_default_timeout(30_000)
    page.on(
        "console",
        lambda message: report.console_errors.append(message.text[:300]) if message.type == "error" else None,
    )
    page.on("pageerror", lambda error: report.console_errors.append(f"page error: {str(error)[:300]}"))
    workspace = f"w{secrets.token_hex(4)}"
    try:
        page.goto(f"{lab.url}/lab/workspaces/{workspace}/tree/{path}?reset&token={lab.token}")
        wait_for_kernel(page, lab, path)
        run_started = time.monotonic()
        run_all_cells(page)
        try:
            page.wait_for_function(JS_STARTED, timeout=20_000, polling=250)
        except Exception:  # the click was lost (e.g. the page was still busy): once more
            run_all_cells(page)
        try:
            page.wait_for_function(JS_FINISHED, timeout=RUN_TIMEOUT * 1000, polling=250)
        except Exception:
            report.problems.append(
                f"Run All had not finished after {RUN_TIMEOUT:.0f} s (a cell hangs, or the kernel is busy)"
            )
        report.run_seconds = time.monotonic() - run_started
        wait_until_settled(page)
        time.sleep(0.5)
        model = page.evaluate(JS_MODEL, path)
        if model is None:
            report.problems.append("could not read the notebook model (window.jupyterapp missing?)")
            return report
        check_problems_in_model(model, report)
        if report.problems:
            report.notes += diagnostics(page, lab, path)
        check_widgets_and_figures(model, page.evaluate(JS_OUTPUTS), report)
        check_sliders(page, model, report, slider_timeout)
        if screenshot is not None:
            screenshot.parent.mkdir(parents=True, exist_ok=True)
            # room for the notebook
            page.evaluate("() => window.jupyterapp.commands.execute('application:toggle-left-area')")
            for target in (
                ".jp-Cell-outputArea .jp-OutputArea-output:has(.noUi-handle)",
                ".jp-OutputArea-output img",
                ".jp-OutputArea-output .jupyter-widgets",
            ):
                found = page.locator(f".jp-Notebook {target}")
                if found.count():
                    found.first.scroll_into_view_if_needed()
                    break
            time.sleep(0.3)
            page.screenshot(path=str(screenshot))
            report.screenshot = str(
                screenshot.relative_to(ROOT) if screenshot.is_relative_to(ROOT) else screenshot
            )
    finally:
        lab.shutdown_kernels(path)
        page.close()
        report.seconds = time.monotonic() - started
    return report


# ------------------------------------------------------------------------------------------ fixtures, tests


@pytest.fixture(scope="module")
def browser():
    candidates = chromium_candidates()
    if not candidates:
        pytest.skip(INSTALL_HINT)
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.skip("Python playwright not installed: pip install -r requirements-dev.txt")
    with sync_playwright() as playwright:
        errors = []
        for executable in candidates:
            try:
                chromium = playwright.chromium.launch(executable_path=executable, args=CHROMIUM_ARGS)
            except Exception as exc:  # e.g. a snap stub that cannot run here: try the next one
                errors.append(f"{executable}: {str(exc).splitlines()[0]}")
                continue
            try:
                yield chromium
            finally:
                chromium.close()
            return
        pytest.fail("Chromium is installed but would not start:\n" + "\n".join(errors))


@pytest.fixture(scope="module")
def lab(browser):
    base = Path(tempfile.mkdtemp(prefix="amp_lessons_lab_"))
    server = LabServer(base)
    try:
        server.start()
        yield server
    finally:
        server.stop()
        shutil.rmtree(base, ignore_errors=True)


@pytest.mark.parametrize("lesson", LESSONS, ids=lambda p: p.stem)
def test_lesson_works_in_jupyterlab(browser, lab, lesson):
    report = check_notebook_in_lab(
        browser, lab, f"notebooks/{lesson.name}", SCREENSHOTS / f"{lesson.stem}.png"
    )
    print(report)
    assert not report.problems, f"{lesson.name} is broken in JupyterLab:\n{report}"


def test_checker_reports_broken_widgets(browser, lab):
    """The planted problems are each reported, and the working slider + figure are not."""
    report = check_notebook_in_lab(
        browser,
        lab,
        f"fixtures/{BROKEN_FIXTURE}",
        SCREENSHOTS / "fixture_widget_problems.png",
        slider_timeout=8,
    )
    print(report)
    text = "\n".join(report.problems)
    assert re.search(r"cell 4 .*widget did not render", text), text
    assert re.search(r"cell 3 .*slider 'dead' .*changed nothing", text), text
    assert re.search(r"cell 6 .*raised RuntimeError: planted error", text), text
    assert "cell(s) [7] never ran" in text, text
    assert not re.search(r"cell 2\b", text), f"the working slider was reported:\n{text}"
    assert report.sliders_moved == 1 and report.images >= 2, report
    assert len(report.problems) == 4, text
