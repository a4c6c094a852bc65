"""report.html opens in a real headless Chromium, offline, with every figure drawn (skipped without Chromium)."""

import json
import os
import shutil
from pathlib import Path

import pytest

CHROMIUM = os.environ.get("AMP_LESSONS_CHROMIUM", "/usr/bin/chromium")
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking"]


@pytest.fixture(scope="module")
def page():
    if not (os.path.isfile(CHROMIUM) and os.access(CHROMIUM, os.X_OK)) and not shutil.which("chromium"):
        pytest.skip("Chromium not installed: apt-get install chromium, or set AMP_LESSONS_CHROMIUM")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.skip("Python playwright not installed: pip install -r requirements-dev.txt")
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        try:
            context = browser.new_context(offline=True)  # a self-contained report needs no network
            yield context.new_page()
        finally:
            browser.close()


def test_the_report_opens_with_every_figure_drawn(full_run, page):
    data = json.loads(Path(full_run.paths["json"]).read_text(encoding="utf-8"))
    page.goto(Path(full_run.paths["html"]).as_uri())
    page.wait_for_load_state("load")
    assert page.locator("table.verdicts").is_visible()
    assert page.locator("h2").first.inner_text() == "Verdicts"  # the verdict table comes first
    images = page.eval_on_selector_all(
        "img[data-figure]",
        "els => els.map(e => [e.dataset.figure, e.complete, e.naturalWidth, e.naturalHeight])",
    )
    assert [name for name, *_ in images] == data["figures"] and len(images) >= 3
    for name, complete, width, height in images:
        assert complete and width > 100 and height > 100, f"figure {name} was not drawn"
    for dtype in data["dtypes"]:
        assert page.locator(f"#dtype-{dtype}").is_visible()


def test_a_partial_report_says_so_in_the_browser(write_recipe, tmp_path, page):
    from amp_lessons.l12_your_model_validated import validate

    result = validate(write_recipe(), out=tmp_path / "r", max_seconds=1e-6, progress=False)
    page.goto(Path(result.paths["html"]).as_uri())
    assert "Incomplete report" in page.locator("#incomplete").inner_text()
