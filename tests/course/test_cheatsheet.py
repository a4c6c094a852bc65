"""docs/cheatsheet.md never rots: every python block runs, in order, in one namespace.

That is how a reader pastes them."""

import re
from pathlib import Path

CHEATSHEET = Path(__file__).resolve().parents[2] / "docs" / "cheatsheet.md"


def blocks():
    text = CHEATSHEET.read_text(encoding="utf-8")
    sections = re.split(r"^## ", text, flags=re.M)
    for section in sections[1:]:
        title = section.splitlines()[0]
        for number, code in enumerate(re.findall(r"```python\n(.*?)```", section, flags=re.S)):
            yield f"{title} (block {number + 1})", code


def test_every_snippet_runs_in_order(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    namespace = {"__name__": "cheatsheet"}
    ran = []
    for where, code in blocks():
        exec(compile(code, f"cheatsheet: {where}", "exec"), namespace)
        ran.append(where)
    assert len(ran) >= 8
    assert namespace["passed"] in (True, False) and namespace["median"] > 0


def test_snippets_cover_what_the_course_teaches():
    titles = " ".join(where for where, _ in blocks()).lower()
    topics = ("training step", "accumulation", "inference", "reference", "non-finite", "checkpoint", "time")
    for topic in topics:
        assert topic in titles, topic


def test_no_deprecated_api():
    assert "torch.cuda.amp" not in CHEATSHEET.read_text(encoding="utf-8")
