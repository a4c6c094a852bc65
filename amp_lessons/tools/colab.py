"""The first cell of every notebook: on Google Colab it installs the course; anywhere else it does nothing.

Colab opens one notebook from GitHub, with torch but without this course, so the notebook's first cell installs it
(``pip install`` from the GitHub repository, once per Colab session). On a laptop, in Binder, on a JupyterHub and in
the tests, ``google.colab`` is not imported and the cell returns at once — it never touches an installed course.

The cell must run before the course exists, so it is plain code with the repository written in; this module makes
it (:func:`cell_source`), puts it first in a notebook (:func:`add_colab_cell`, used once for notebooks/ and
solutions/; build-exercises copies it into exercises/) and tests read it from here. The cell carries the tag
``remove-cell``, so the web edition (site/) does not show it.
"""

from __future__ import annotations

import json
from pathlib import Path

REPOSITORY = "amp-lessons/mixed-precision-validated"  # owner/name on GitHub; site/amp_site.py's default too
BRANCH = "main"
MARKER = "# On Google Colab only:"
TAGS = ["remove-cell"]
CELL = """{marker} install the course (about a minute, once per session). Anywhere else this cell does nothing.
import sys

if "google.colab" in sys.modules:
    import importlib.util
    import subprocess

    COURSE = "{requirement}"
    if importlib.util.find_spec("amp_lessons") is None:
        subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", COURSE], check=True)"""


def requirement(repository: str = REPOSITORY, branch: str = BRANCH) -> str:
    """What the cell asks pip for: the course from its GitHub repository."""
    return f"amp_lessons @ git+https://github.com/{repository}@{branch}"


def cell_source(repository: str = REPOSITORY, branch: str = BRANCH) -> str:
    return CELL.format(marker=MARKER, requirement=requirement(repository, branch))


def colab_cell(repository: str = REPOSITORY, branch: str = BRANCH) -> dict:
    """The cell as notebook JSON (clean: no outputs, no execution count)."""
    return {
        "cell_type": "code",
        "execution_count": None,
        "metadata": {"tags": list(TAGS)},
        "outputs": [],
        "source": cell_source(repository, branch).splitlines(keepends=True),
    }


def has_colab_cell(notebook: dict) -> bool:
    cells = notebook.get("cells") or []
    return bool(cells) and "".join(cells[0].get("source", "")).startswith(MARKER)


def add_colab_cell(path: Path) -> bool:
    """Insert the cell at index 0 of the notebook at ``path`` (read, changed and written at once); False if it
    has one already."""
    from amp_lessons.tools.exercises.builder import dumps

    path = Path(path)
    notebook = json.loads(path.read_text(encoding="utf-8"))
    if has_colab_cell(notebook):
        return False
    notebook["cells"].insert(0, colab_cell())
    path.write_text(dumps(notebook), encoding="utf-8")
    return True
