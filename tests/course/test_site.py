"""The web edition (``make site``, site/): built, then every page opened in a real browser.

One test builds the site — lessons 00 and 01 only (AMP_SITE_LESSONS), to keep ``make integration`` fast; the full build
is ``make site`` and the GitHub workflow site.yml — serves it on 127.0.0.1 from a thread, and opens every page in
headless Chromium. It fails on a console error, a request that leaves 127.0.0.1 (the site must work offline), a
missing image, a broken internal link (file or #anchor), an error output, an empty page, a lesson page without its
environment banner, a widget without its static form, a quiz whose answers are not folded away, and a search that
finds nothing. One screenshot per page goes to screenshots/site/.

``AMP_SITE_HTML=site/_build/html`` checks a site built already (e.g. the full one) instead of building.
"""

from __future__ import annotations

import functools
import http.server
import os
import re
import shutil
import subprocess
import threading
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest

ROOT = Path(__file__).resolve().parents[2]
SITE_PYTHON = ROOT / ".venv-site" / "bin" / "python"
SCREENSHOTS = ROOT / "screenshots" / "site"
SUBSET = "00 01"
CHROMIUM = next(
    (
        path
        for path in (
            os.environ.get("AMP_LESSONS_CHROMIUM", ""),
            "/usr/bin/chromium",
            *(shutil.which(name) or "" for name in ("chromium", "chromium-browser", "google-chrome")),
        )
        if path and os.access(path, os.X_OK)
    ),
    "/usr/bin/chromium",
)
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking"]
ERROR_OUTPUT = ".output.traceback, .output.error, .cell_output .traceback, div.system-message"


class Links(HTMLParser):
    """Every href/src and every id of one HTML page."""

    def __init__(self):
        super().__init__()
        self.links, self.ids = [], set()

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if attrs.get("id"):
            self.ids.add(attrs["id"])
        for name in ("href", "src"):
            if attrs.get(name) and not (tag == "link" and attrs.get("rel") == "preconnect"):
                self.links.append(attrs[name])


@functools.cache
def parsed(path: Path) -> Links:
    links = Links()
    links.feed(path.read_text(encoding="utf-8", errors="replace"))
    return links


def broken_links(html_root: Path, page: Path) -> list:
    """Internal links of ``page`` whose file, or #anchor in it, does not exist."""
    broken = []
    for link in parsed(page).links:
        parts = urlsplit(link)
        if parts.scheme or parts.netloc or link.startswith(("mailto:", "javascript:", "data:")):
            continue
        target = (page.parent / unquote(parts.path)).resolve() if parts.path else page
        if target.is_dir():
            target = target / "index.html"
        if not target.is_file() or html_root.resolve() not in target.parents:
            broken.append(link)
        elif (
            parts.fragment and target.suffix == ".html" and unquote(parts.fragment) not in parsed(target).ids
        ):
            broken.append(link)
    return broken


def build_subset(out: Path) -> Path:
    """Lessons 00 and 01 (and their exercises) with the whole site around them, into ``out``."""
    subprocess.run(["make", "-s", "site-setup"], cwd=ROOT, check=True, timeout=900)
    env = dict(os.environ, AMP_SITE_LESSONS=SUBSET)
    command = [str(SITE_PYTHON), "-m", "sphinx", "-b", "html", "-q", "-W", "--keep-going"]
    result = subprocess.run(
        [*command, "-c", "site", ".", str(out)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, (
        f"the site's build failed:\n{result.stdout[-3000:]}\n{result.stderr[-6000:]}"
    )
    return out


class Server:
    """The built HTML on 127.0.0.1, from a thread."""

    def __init__(self, folder: Path):
        handler = functools.partial(QuietHandler, directory=str(folder))
        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(timeout=10)


class QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


def evaluate_settled(page, expression: str):
    """``page.evaluate`` once the page has stopped navigating: index.html redirects to lesson 00, and on a busy
    machine the redirect can land after the first load event, destroying the context an evaluate runs in."""
    for attempt in range(3):
        try:
            return page.evaluate(expression)
        except Exception as exc:
            if "Execution context was destroyed" not in str(exc) or attempt == 2:
                raise
            page.wait_for_load_state("load")
            page.wait_for_timeout(300)


def page_problems(page, url: str, name: str, html_root: Path) -> list:
    """Open one page; what is wrong with it (empty list: nothing)."""
    problems, events = [], []
    page.on("console", lambda m: events.append(f"console {m.type}: {m.text}") if m.type == "error" else None)
    page.on("pageerror", lambda e: events.append(f"page error: {e}"))
    page.on("requestfailed", lambda r: events.append(f"request failed: {r.url}"))
    page.goto(f"{url}/{name}", wait_until="load")
    page.wait_for_timeout(150)
    problems += events
    missing = evaluate_settled(
        page,
        "Array.from(document.images).filter(i => !i.complete || i.naturalWidth === 0).map(i => i.src.slice(0, 80))",
    )
    problems += [f"missing image: {src}" for src in missing]
    problems += [f"error output: {t[:200]}" for t in page.locator(ERROR_OUTPUT).all_inner_texts()]
    text = (
        page.locator("main, article, [role=main]").first.inner_text() if page.locator("main").count() else ""
    )
    if len(text.strip()) < 80 and name not in (
        "search.html",
        "genindex.html",
        "index.html",
    ):  # index: a redirect
        problems.append(f"empty page ({len(text.strip())} characters of text)")
    problems += [f"broken internal link: {link}" for link in broken_links(html_root, html_root / name)]
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(
        full_page=True, path=str(SCREENSHOTS / (name.replace("/", "__").removesuffix(".html") + ".png"))
    )
    return problems


def lesson_problems(page, name: str) -> list:
    """What a notebook page must have besides: the banner, static widget forms, folded quiz answers."""
    problems = []
    banner = page.locator(".amp-env-banner")
    if banner.count() != 1:
        return [f"{banner.count()} environment banners"]
    said = banner.inner_text()
    if name.startswith("notebooks/") and not re.search(
        r"run on .+ with torch \d+\.\d+.*\d{4}-\d\d-\d\d", said
    ):
        problems.append(f"the banner does not say device, torch and date: {said!r}")
    if "Binder" not in said or "Colab" not in said:
        problems.append(f"the banner has no launch links: {said!r}")
    if name.startswith("notebooks/"):
        if page.locator(".amp-static-quiz").count() != 1:
            problems.append("no static quiz")
        elif page.locator(".amp-static-quiz details[open]").count():
            problems.append("a quiz answer is not folded away")
        elif page.locator(".amp-static-answer p").first.is_visible():
            problems.append("a quiz answer is visible before it is unfolded")
    if re.search(r"VBox\(children=|HBox\(children=", page.locator("main").inner_text()):
        problems.append("a widget shown as its text repr (no static form)")
    return problems


def search_problems(page, url: str) -> list:
    page.goto(f"{url}/search.html?q=autocast", wait_until="load")
    try:
        page.wait_for_selector("#search-results ul li, ul.search li", timeout=15000)
    except Exception:  # playwright's TimeoutError
        return ["search for 'autocast' found nothing"]
    return []


def check_site(html_root: Path) -> dict:
    from playwright.sync_api import sync_playwright

    pages = sorted(
        str(p.relative_to(html_root))
        for p in html_root.rglob("*.html")
        if not p.relative_to(html_root).parts[0].startswith("_")
    )
    assert "notebooks/00_start_here.html" in pages, pages
    found = {}
    with Server(html_root) as server, sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        context = browser.new_context(viewport={"width": 1280, "height": 900})
        outside = []
        context.route(
            re.compile(r"^(?!http://127\.0\.0\.1:).*"),
            lambda route: (outside.append(route.request.url), route.abort()),
        )
        for name in pages:
            page = context.new_page()
            problems = page_problems(page, server.url, name, html_root)
            if name.startswith(("notebooks/", "exercises/")):
                problems += lesson_problems(page, name)
            found[name] = problems
            page.close()
        page = context.new_page()
        found["search.html?q=autocast"] = search_problems(page, server.url)
        found["requests outside 127.0.0.1"] = sorted(set(outside))
        browser.close()
    return {name: problems for name, problems in found.items() if problems}


@pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="Chromium not installed: apt-get install chromium")
def test_site_builds_and_every_page_opens_cleanly(tmp_path):
    given = os.environ.get("AMP_SITE_HTML")
    html_root = Path(given).resolve() if given else build_subset(tmp_path / "html")
    problems = check_site(html_root)
    assert not problems, "\n".join(f"{name}: {p}" for name, ps in problems.items() for p in ps)


# ------------------------------------------------------------------------------------------ Binder


def test_binder_installs_torch_cpu_build_and_the_course():
    lines = [
        line.split("#")[0].strip()
        for line in (ROOT / "binder" / "requirements.txt").read_text(encoding="utf-8").splitlines()
    ]
    lines = [line for line in lines if line]
    assert "--extra-index-url https://download.pytorch.org/whl/cpu" in lines  # torch's CPU wheels, 2.x.y+cpu
    assert any(re.fullmatch(r"torch>=2\.\d+", line) for line in lines)
    included = [line.split(None, 1)[1] for line in lines if line.startswith("-r ")]
    assert included == ["../requirements.txt"] and (ROOT / "binder" / included[0]).resolve().is_file()
    post_build = ROOT / "binder" / "postBuild"
    assert os.access(post_build, os.X_OK)
    text = post_build.read_text(encoding="utf-8")
    assert "pip install --quiet --no-deps -e ." in text
    opened = re.search(r'default_url = "/lab/tree/([^"]+)"', text).group(1)
    assert opened == "notebooks/00_start_here.ipynb" and (ROOT / opened).is_file()
    python = (ROOT / "binder" / "runtime.txt").read_text().strip()
    assert re.fullmatch(r"python-3\.(\d+)", python) and int(python.split(".")[1]) >= 9
