"""Sphinx configuration of the web edition: `make site` runs `sphinx-build -c site . site/_build/html`.

The source folder is the repository itself, so each notebook is read (and run) where it lives, in its own folder,
exactly as JupyterLab runs it; `include_patterns` keeps the build to the pages below. Sphinx + myst-nb +
sphinx-book-theme is the stack Jupyter Book 1 is made of, used directly (site/README.md says why).

Environment variables:
    AMP_SITE_LESSONS     "00 02": only these lessons (and their exercises) — the browser test's quick build
    AMP_SITE_REPOSITORY  owner/name on GitHub for the launch links (default: the git remote, else the course's)
    AMP_SITE_BRANCH      the branch the launch links open (default main)
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))

import amp_site  # noqa: E402  (site/amp_site.py, the banner and the cache key)

project = "Mixed Precision, Validated"
author = "the course's authors"
copyright = "the course's authors, MIT licence"

LESSONS = os.environ.get("AMP_SITE_LESSONS", "").replace(",", " ").split()
if LESSONS:
    lesson_globs = [f"{folder}/{n}_*.ipynb" for n in LESSONS for folder in ("notebooks", "exercises")]
else:
    lesson_globs = ["notebooks/[0-9][0-9]_*.ipynb", "exercises/[0-9][0-9]_*.ipynb"]

root_doc = "site/index"
include_patterns = ["site/*.md", "docs/*.md", *lesson_globs]
exclude_patterns = ["site/_build/**", "site/_extra/**", "site/README.md"]
extensions = ["myst_nb", "amp_site"]
html_theme = "sphinx_book_theme"
html_title = project
html_sourcelink_suffix = ""  # the notebook's download link is _sources/notebooks/NN_x.ipynb, a real .ipynb
html_static_path = ["_static"]
html_extra_path = ["_extra"]  # index.html at the top: a redirect to site/index.html (the root document)
html_css_files = ["amp_site.css"]
html_last_updated_fmt = None
html_show_sphinx = False

REPOSITORY, BRANCH = amp_site.repository(ROOT), os.environ.get("AMP_SITE_BRANCH", "main")
html_theme_options = {
    "repository_url": f"https://github.com/{REPOSITORY}",
    "repository_branch": BRANCH,
    "path_to_docs": "",
    "use_repository_button": True,
    "use_download_button": True,
    "use_source_button": True,
    "launch_buttons": {
        "binderhub_url": "https://mybinder.org",
        "colab_url": "https://colab.research.google.com",
        "notebook_interface": "jupyterlab",
    },
    "show_toc_level": 2,
}
html_context = {"amp_repository": REPOSITORY, "amp_branch": BRANCH, "default_mode": "light"}

# Markdown: the same syntax JupyterLab renders (no $-math: a "$" in the text stays a dollar sign).
myst_enable_extensions = ["colon_fence", "deflist"]
myst_heading_anchors = 3
suppress_warnings = ["myst.header", "misc.highlighting_failure"]

# Execution: every lesson runs on this machine; jupyter-cache keeps the outputs, so an unchanged notebook with an
# unchanged package is not run again. The cache's folder is named after the package's sources, torch and Python
# (amp_site.cache_key), so a changed helper re-runs the lessons instead of showing stale outputs.
nb_execution_mode = "cache"
nb_execution_cache_path = str(ROOT / "site/_build/cache" / amp_site.cache_key(ROOT))
nb_execution_excludepatterns = ["exercises/*"]  # exercises are shown as the learner gets them: not run
nb_execution_timeout = 300
nb_execution_raise_on_error = True  # an error in a lesson fails the build
nb_execution_show_tb = True
nb_merge_streams = True
# A widget view needs a live kernel: the page shows the widget's static form (amp_lessons/tools/site_forms.py,
# text/html) and loads no widget JavaScript from the web.
nb_mime_priority_overrides = [("html", "application/vnd.jupyter.widget-view+json", None)]
nb_ipywidgets_js = {}
amp_site.kernel_environment(ROOT, HERE / "kernel_startup.py")
