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
  widget shows besides the slider's own readout, without a traceback;
- every text box of every widget (text inputs and the sliders' editable readouts) keeps what is typed into it
  (after Enter, read back from the page) and the output it drives changes to match (``TYPED``: the value per box,
  and for some what the output must then say, e.g. lesson 01's explorer shows float16 storing 65504 for 65519).

``test_exercise_from_the_file_browser`` is a learner's way to an exercise: the server's root is a copy of the
course folder, the test double-clicks ``exercises/`` and an exercise in JupyterLab's file browser, runs the check
untouched ("Not done yet"), types a wrong answer into the solution cell (the check names the mistake), then a
correct one ("Passed"), each read from the page.

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
COURSE_FOLDERS = ("notebooks", "exercises", "solutions", "docs")

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
    """A private ``jupyter lab`` on 127.0.0.1 serving a temporary copy of the course folder.

    ``strict`` is the kernels' ``AMP_LESSONS_STRICT`` ("1": a lesson's own failing check is an error, as in
    ``make notebooks``); None for a learner's server, where an exercise's check may say "not done yet".
    """

    def __init__(self, base: Path, strict: str | None = "1"):
        self.base = base
        self.strict = strict
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
        for folder in COURSE_FOLDERS:
            shutil.copytree(
                ROOT / folder, self.root / folder, ignore=shutil.ignore_patterns(".ipynb_checkpoints")
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
            PYTHONDONTWRITEBYTECODE="1",
        )
        env.pop("AMP_LESSONS_STRICT", None)
        if self.strict:
            env["AMP_LESSONS_STRICT"] = self.strict
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
    boxes_typed: int = 0
    console_errors: list = field(default_factory=list)
    notes: list = field(default_factory=list)
    screenshot: str = ""

    def __str__(self) -> str:
        lines = [
            f"{self.name}: {len(self.problems)} problem(s) in {self.seconds:.1f} s "
            f"(Run All {self.run_seconds:.1f} s; {self.widgets} widget(s), {self.images} image(s), "
            f"{self.sliders_moved} slider(s) moved, {self.boxes_typed} box(es) typed into); screenshot {self.screenshot or '-'}"
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


# What to type into each widget text box (by its label), what the box must show afterwards, and a pattern the
# output it drives must then match (None: it must change). Sliders' readouts are boxes too. Off-step values test
# that a box keeps what was typed: a slider that updates while it moves snaps a typed readout value to its step.
TYPED = {
    # lesson 01: what float16 stores for 65519; lesson 11's FP8 explorer: E4M3FN saturates it to 448
    "x =": ("65519", "65519", r"float16[\d\s]*65504\.0|float8_e4m3fn[\d\s]*448\.0"),
    "log2 |x|": ("3", "3.00", r"x = 8\.0\b"),
    "log2(scale)": ("10", "10", r"2\^10\b"),
    "init_scale = 2^": ("12", "12", None),
    "growth_factor": ("3.03", "3.03", None),  # with init 2^12, enough growth to overflow: backoff matters
    "backoff_factor": ("0.33", "0.33", None),
    "growth_interval": ("37", "37", None),
    "log2|g|max / N / k": ("-7", "-7.00", None),
    "tolerance": ("3e-3", "3.0e-3", r"margin < 2 x 0\.003\b"),
}
JS_BOXES = """(out) => [...out.querySelectorAll(
    '.widget-text input, .widget-textarea textarea, .widget-readout[contenteditable="true"]')]
  .map(box => {
    const widget = box.closest('.widget-inline-hbox, .jupyter-widgets');
    const label = widget ? widget.querySelector('.widget-label') : null;
    return label ? label.textContent.trim() : '';
  })"""
JS_BOX_VALUE = (
    """(box) => box.tagName === 'INPUT' || box.tagName === 'TEXTAREA' ? box.value : box.textContent.trim()"""
)


def type_into_box(
    page, output, index: int, label: str, report: NotebookReport, where: str, timeout: float
) -> None:
    typed, shown, pattern = TYPED[label]
    box = output.locator(
        '.widget-text input, .widget-textarea textarea, .widget-readout[contenteditable="true"]'
    ).nth(index)
    wait_until_settled(page)
    before_view = output.evaluate(JS_VIEW)
    box.scroll_into_view_if_needed()
    box.fill(typed)
    box.press("Enter")
    deadline, previous, view = time.monotonic() + timeout, None, before_view
    while time.monotonic() < deadline:
        time.sleep(0.3)
        view = output.evaluate(JS_VIEW)
        if view != before_view and view == previous and page.evaluate(JS_KERNEL_IDLE):
            break
        previous = view
    value = box.evaluate(JS_BOX_VALUE).replace("\u2212", "-")  # readouts write minus as U+2212
    text = output.inner_text()
    report.boxes_typed += 1
    if value != shown:
        report.problems.append(f"{where}: typed {typed!r} into {label!r}, and the box now shows {value!r}")
    if view == before_view:
        report.problems.append(f"{where}: typing {typed!r} into {label!r} changed nothing else in the widget")
    elif pattern and not re.search(pattern, text):
        report.problems.append(
            f"{where}: after typing {typed!r} into {label!r} the output does not match {pattern!r}: "
            f"{' '.join(text.split())[:400]}"
        )


def check_text_boxes(page, model: dict, report: NotebookReport, timeout: float = SLIDER_TIMEOUT) -> None:
    """Type into every text box of every widget (``TYPED``); read back the box and the output it drives."""
    outputs = page.locator(
        ".jp-Notebook .jp-Cell .jp-Cell-outputArea > .jp-OutputArea-child > .jp-OutputArea-output"
    )
    for index in range(outputs.count()):
        output = outputs.nth(index)
        labels = output.evaluate(JS_BOXES)
        if not labels:
            continue
        number = output.evaluate(
            "(o) => [...document.querySelectorAll('.jp-Notebook .jp-Cell')]"
            ".indexOf(o.closest('.jp-Cell')) + 1"
        )
        cell = model["cells"][number - 1] if 0 < number <= len(model.get("cells", [])) else {}
        where = f"cell {number} (`{first_line(cell)}`)"
        for box_index, label in enumerate(labels):
            if label not in TYPED:
                report.problems.append(
                    f"{where}: a text box {label!r} this test has no value for (add it to TYPED)"
                )
                continue
            type_into_box(page, output, box_index, label, report, where, timeout)


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
    browser,
    lab: LabServer,
    path: str,
    screenshot: Path | None = None,
    slider_timeout: float = SLIDER_TIMEOUT,
    type_into_boxes: bool = True,
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
        if type_into_boxes:
            check_text_boxes(page, model, report)
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
        type_into_boxes=False,
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


# ------------------------------------------------------------------------------------------ a learner's exercise

EXERCISE = "exercises/03_autocast_and_gradscaler.ipynb"
ANSWER_START = "def step_scheduler_if_updated("
CHECK_CALL = "check_scheduler_step(step_scheduler_if_updated)"
WRONG_ANSWER = """def step_scheduler_if_updated(scaler, scheduler, scale_before):
    scheduler.step()
    return True
"""
RIGHT_ANSWER = """def step_scheduler_if_updated(scaler, scheduler, scale_before):
    stepped = scaler.get_scale() >= scale_before
    if stepped:
        scheduler.step()
    return stepped
"""
# what the page must say after each attempt at the check
FEEDBACK = (
    ("untouched", r"Not done yet.*still raises NotImplementedError"),
    ("wrong", r"Not yet right.*skipped the update.*but you stepped the scheduler"),
    ("right", r"Passed.*stepped the scheduler exactly \d+ times"),
)


@pytest.fixture(scope="module")
def learner_lab(browser):
    """A server as `make lab` gives a learner: the course folder as root, no AMP_LESSONS_STRICT."""
    base = Path(tempfile.mkdtemp(prefix="amp_lessons_learner_"))
    server = LabServer(base, strict=None)
    try:
        server.start()
        yield server
    finally:
        server.stop()
        shutil.rmtree(base, ignore_errors=True)


def open_from_file_browser(page, path: str) -> None:
    """Double-click each part of ``path`` in JupyterLab's file browser, from the root."""
    page.locator(".jp-FileBrowser .jp-BreadCrumbs-home").first.click()
    for part in path.split("/"):
        item = page.locator(".jp-FileBrowser .jp-DirListing-item").filter(
            has=page.locator(".jp-DirListing-itemText", has_text=re.compile(f"^{re.escape(part)}$"))
        )
        item.first.wait_for(timeout=30_000)
        item.first.dblclick()


def run_cell(page, cell) -> None:
    """Click into the cell and press Shift+Enter, as a learner runs it; wait for the kernel."""
    cell.locator(".jp-InputArea-editor").click()
    page.keyboard.press("Shift+Enter")
    time.sleep(0.5)
    page.wait_for_function(JS_KERNEL_IDLE, timeout=120_000, polling=250)
    time.sleep(0.3)


def replace_cell_text(page, cell, text: str) -> None:
    """Select everything in the cell's editor and put ``text`` in its place (inserted, not auto-indented)."""
    cell.locator(".jp-InputArea-editor .cm-content").click()
    page.keyboard.press("Control+A")
    page.keyboard.press("Delete")
    page.keyboard.insert_text(text)


def test_exercise_from_the_file_browser(browser, learner_lab):
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    page.set_default_timeout(30_000)
    seen = []
    try:
        page.goto(f"{learner_lab.url}/lab/workspaces/w{secrets.token_hex(4)}?reset&token={learner_lab.token}")
        page.wait_for_selector(".jp-FileBrowser .jp-DirListing-item", timeout=60_000)
        open_from_file_browser(page, EXERCISE)
        wait_for_kernel(page, learner_lab, EXERCISE)
        model = page.evaluate(JS_MODEL, EXERCISE)
        assert model, f"{EXERCISE} did not open from the file browser"
        sources = [cell_source(c) for c in model["cells"]]
        answer = next(i for i, s in enumerate(sources) if s.startswith(ANSWER_START))
        check = next(i for i, s in enumerate(sources) if CHECK_CALL in s)
        cells = page.locator(".jp-Notebook .jp-Cell")
        for attempt, pattern in FEEDBACK:
            if attempt != "untouched":
                replace_cell_text(
                    page, cells.nth(answer), WRONG_ANSWER if attempt == "wrong" else RIGHT_ANSWER
                )
            run_cell(page, cells.nth(answer))
            run_cell(page, cells.nth(check))
            deadline, text = time.monotonic() + 60, ""
            while time.monotonic() < deadline:
                text = " ".join(cells.nth(check).locator(".jp-OutputArea-output").all_inner_texts())
                if re.search(pattern, text, re.S):
                    break
                time.sleep(0.5)
            seen.append(f"{attempt}: {' '.join(text.split())[:300]}")
            assert re.search(pattern, text, re.S), (
                f"after the {attempt} answer the check said:\n" + "\n".join(seen)
            )
        print("\n".join(seen))
        SCREENSHOTS.mkdir(exist_ok=True)
        page.screenshot(path=str(SCREENSHOTS / "exercise_from_file_browser.png"))
    finally:
        learner_lab.shutdown_kernels(EXERCISE)
        page.close()


# ---- first-hour tests (h8) below ----

# A learner's first hour, the help before the verdict: in an exercise the Hint button gives hints one at a
# time; in a lesson the quiz lets a wrong first pick be retried (with why that option is wrong) and shows the
# answer after the second or on request; the lesson's closing progress widget shows the checks and hints just
# recorded. Every reading comes from the page.

HINT_EXERCISE = "exercises/01_precision_formats.ipynb"
HINT_FOR = 'hint_button("01.1")'
HINT_CHECK = "check_stored_value(stored_value)"
QUIZ_LESSON = "notebooks/01_precision_formats.ipynb"


def open_notebook(browser, lab: LabServer, path: str):
    """A fresh page with ``path`` open and its kernel idle; returns ``(page, cells, sources)``."""
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    page.set_default_timeout(30_000)
    page.goto(f"{lab.url}/lab/workspaces/w{secrets.token_hex(4)}/tree/{path}?reset&token={lab.token}")
    wait_for_kernel(page, lab, path)
    model = page.evaluate(JS_MODEL, path)
    assert model, f"{path} did not open"
    return page, page.locator(".jp-Notebook .jp-Cell"), [cell_source(c) for c in model["cells"]]


def output_text(cell) -> str:
    return " ".join(" ".join(cell.locator(".jp-OutputArea-output").all_inner_texts()).split())


def wait_for_text(cell, pattern: str, seen: list, what: str, timeout: float = 30.0) -> str:
    deadline, text = time.monotonic() + timeout, ""
    while time.monotonic() < deadline:
        text = output_text(cell)
        if re.search(pattern, text, re.S):
            seen.append(f"{what}: {text[:300]}")
            return text
        time.sleep(0.3)
    seen.append(f"{what} (NOT FOUND {pattern!r}): {text[:300]}")
    raise AssertionError("\n".join(seen))


def ask_for_hints(browser, lab: LabServer, seen: list) -> None:
    page, cells, sources = open_notebook(browser, lab, HINT_EXERCISE)
    try:
        hint = next(i for i, s in enumerate(sources) if HINT_FOR in s)
        check = next(i for i, s in enumerate(sources) if HINT_CHECK in s)
        assert check == hint + 1, "the hint cell sits right above the check"
        run_cell(page, cells.nth(hint))
        button = cells.nth(hint).locator("button", has_text="Hint")
        button.first.wait_for(timeout=30_000)
        wait_for_text(cells.nth(hint), r"^\s*$|Hint \(3 left\)", seen, "hint cell before a press")
        button.first.click()
        text = wait_for_text(cells.nth(hint), r"Hint 1 of 3 \(the idea\)", seen, "first press")
        assert "Hint 2 of 3" not in text, "one press, one hint"
        button.first.click()
        wait_for_text(
            cells.nth(hint), r"Hint 1 of 3.*Hint 2 of 3 \(where in the code\)", seen, "second press"
        )
        run_cell(page, cells.nth(hint - 1))  # the untouched answer cell: the stub is defined
        run_cell(page, cells.nth(check))
        wait_for_text(cells.nth(check), r"Not done yet", seen, "the check, untouched")
    finally:
        lab.shutdown_kernels(HINT_EXERCISE)
        page.close()


def retry_the_quiz_and_read_progress(browser, lab: LabServer, seen: list) -> None:
    page, cells, sources = open_notebook(browser, lab, QUIZ_LESSON)
    try:
        quiz = next(i for i, s in enumerate(sources) if 'lesson_quiz("01")' in s)
        progress = next(i for i, s in enumerate(sources) if 'show_progress("01")' in s)
        run_cell(page, cells.nth(quiz))
        out = cells.nth(quiz)
        first_question = out.locator(".widget-radio-box").first
        first_question.wait_for(timeout=30_000)
        first_question.locator("label", has_text=re.compile(r"^\s*inf\s*$")).click()
        out.locator("button", has_text="Check").first.click()
        text = wait_for_text(
            out, r"Not quite: “inf” is not right\. Overflow starts", seen, "first wrong pick"
        )
        assert "The answer is" not in text, "the answer must not show after one wrong pick"
        first_question.locator("label", has_text=re.compile(r"^\s*65520\s*$")).click()
        out.locator("button", has_text="Check").first.click()
        wait_for_text(out, r"The answer is “65504”", seen, "second wrong pick")
        out.locator("button", has_text="Show answer").nth(1).click()
        wait_for_text(out, r"The answer is “number of exponent bits", seen, "Show answer on question 2")
        run_cell(page, cells.nth(progress))
        pattern = r"0 of 2 exercises passed, 1 attempted, 1 not started; 2 hints used"
        wait_for_text(cells.nth(progress), pattern, seen, "the lesson's progress widget")
        cells.nth(progress).locator("button", has_text="Refresh").first.click()
        wait_for_text(cells.nth(progress), pattern, seen, "after Refresh")
        SCREENSHOTS.mkdir(exist_ok=True)
        cells.nth(quiz).scroll_into_view_if_needed()
        page.screenshot(path=str(SCREENSHOTS / "quiz_retry_and_progress.png"))
    finally:
        lab.shutdown_kernels(QUIZ_LESSON)
        page.close()


def test_hint_quiz_retry_and_progress_in_the_browser(browser, learner_lab):
    learner_lab.progress_file.unlink(missing_ok=True)  # this test's record starts empty
    seen = []
    ask_for_hints(browser, learner_lab, seen)
    retry_the_quiz_and_read_progress(browser, learner_lab, seen)
    recorded = json.loads(learner_lab.progress_file.read_text(encoding="utf-8"))["exercises"]
    assert recorded["01.1 stored_value"]["hints"] == 2 and recorded["01.1 stored_value"]["attempts"] == 1
    print("\n".join(seen))


if __name__ == "__main__":  # `make test` asks: will this test run the lessons (else nbval runs them)?
    import importlib.util

    print("yes" if chromium_candidates() and importlib.util.find_spec("playwright") else "")
