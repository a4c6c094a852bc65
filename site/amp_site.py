"""The web edition's own Sphinx extension: the environment banner on every page, the launch links, the cache key.

Every page starts with a banner. On a lesson it says which device, torch and date produced the outputs below
(read from the lesson's own environment card, the output of its ``env = setup()`` cell, and from myst-nb's
execution record), links to the notebook itself and to the three ways in; on an exercise it says the notebook is
shown as a learner gets it, without outputs.
"""

from __future__ import annotations

import hashlib
import html
import importlib.metadata
import os
import platform
import re
import subprocess
import time
from pathlib import Path

from docutils import nodes
from myst_nb.sphinx_ import NbMetadataCollector

CARD_ROW = re.compile(r"<th[^>]*>([^<]+)</th><td[^>]*>([^<]*)</td>")
DEFAULT_REPOSITORY = "amp-lessons/mixed-precision-validated"


def repository(root: Path) -> str:
    """owner/name for the launch links: AMP_SITE_REPOSITORY, GitHub Actions' own, the git remote, the default."""
    for name in ("AMP_SITE_REPOSITORY", "GITHUB_REPOSITORY"):
        if os.environ.get(name):
            return os.environ[name]
    try:
        url = subprocess.run(
            ["git", "-C", str(root), "remote", "get-url", "origin"],
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        url = ""
    found = re.search(r"github\.com[:/]([^/]+/[^/]+?)(?:\.git)?$", url)
    if found:
        return found.group(1)
    try:
        from amp_lessons.tools.colab import REPOSITORY

        return REPOSITORY
    except ImportError:
        return DEFAULT_REPOSITORY


def cache_key(root: Path) -> str:
    """The package's sources, the kernel's start-up file, torch and Python: what a lesson's outputs depend on."""
    digest = hashlib.sha256()
    files = sorted((root / "amp_lessons").rglob("*.py")) + sorted((root / "amp_lessons").rglob("*.json"))
    for path in [*files, root / "site" / "kernel_startup.py"]:
        digest.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes())
    try:
        torch = importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        torch = "none"
    digest.update(f"torch {torch} python {platform.python_version()}".encode())
    # Older keys' folders stay (a build running beside this one may be using one): `rm -rf site/_build` clears all.
    return digest.hexdigest()[:16]


def kernel_environment(root: Path, startup: Path) -> None:
    """What each kernel of the build inherits: the static forms at start-up, no progress record, no .pyc files."""
    os.environ["PYTHONSTARTUP"] = str(startup)
    os.environ["AMP_LESSONS_PROGRESS_FILE"] = "off"
    os.environ["PYTHONDONTWRITEBYTECODE"] = "1"
    os.environ.setdefault("TQDM_DISABLE", "1")


def launch_links(app, path: str) -> dict:
    """The three ways in for one notebook (``path`` relative to the repository) — or for the course."""
    repo, branch = app.config.html_context["amp_repository"], app.config.html_context["amp_branch"]
    return {
        "Binder": f"https://mybinder.org/v2/gh/{repo}/{branch}?urlpath=lab/tree/{path}",
        "Colab": f"https://colab.research.google.com/github/{repo}/blob/{branch}/{path}",
        "GitHub": f"https://github.com/{repo}/blob/{branch}/{path}",
    }


def card_rows(doctree) -> dict:
    """The rows of the first environment card among the page's outputs ({} where it has none)."""
    for raw in doctree.findall(nodes.raw):
        text = raw.astext()
        if "Environment card" in text:
            return {html.unescape(k).strip(): html.unescape(v).strip() for k, v in CARD_ROW.findall(text)}
    return {}


def banner_html(app, docname: str, source: str, doctree) -> str:
    """The banner's HTML for one page."""
    up = "../" * docname.count("/")
    launch = f"<a href='{up}site/launch.html'>all three ways in</a>"
    if not source.endswith(".ipynb"):
        return f"Read it here, launch it (Binder, Colab) or install it: {launch}."
    links = launch_links(app, source)
    notebook = (
        f"Notebook: <a href='{up}_sources/{source}' download>{html.escape(source)}</a> "
        f"(<a href='{links['GitHub']}'>on GitHub</a>) · Launch: <a href='{links['Binder']}'>Binder</a> · "
        f"<a href='{links['Colab']}'>Colab</a> · {launch}"
    )
    if source.startswith("exercises/"):
        return f"<b>Exercise notebook</b>, shown as you get it: not run, no solutions. {notebook}"
    card = card_rows(doctree)
    data = NbMetadataCollector.get_exec_data(app.env, docname) or {}
    when = time.strftime("%Y-%m-%d", time.gmtime(data["mtime"])) if data.get("mtime") else "unknown date"
    device = card.get("device", "an unknown device")
    made = (
        f"<b>Outputs on this page</b>: run on {html.escape(device)} with torch "
        f"{html.escape(card.get('torch', '?'))}, {when}, by the site's build"
    )
    if not device.startswith("cuda"):
        made += " — CPU figures: speed-ups and GPU-only behaviour are not shown until a GPU run exists"
    return f"{made}. {notebook}"


def add_banner(app, doctree, docname: str) -> None:
    if app.builder.format != "html":
        return
    source = os.path.relpath(app.env.doc2path(docname), app.srcdir).replace(os.sep, "/")
    banner = nodes.raw(
        "",
        f"<div class='amp-env-banner'>{banner_html(app, docname, source, doctree)}</div>",
        format="html",
    )
    sections = list(doctree.findall(nodes.section))
    if sections:
        title_at = 1 if sections[0].children and isinstance(sections[0][0], nodes.title) else 0
        sections[0].insert(title_at, banner)
    else:
        doctree.insert(0, banner)


def setup(app):
    app.connect("doctree-resolved", add_banner)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
