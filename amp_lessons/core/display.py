"""Core: how the course shows things — a long table with its first rows, a loss scale as people read it.

- ``short_table`` / ``ShortTable``: a table shown with its first rows; in Jupyter the rest sits behind a toggle
  (lessons 04 and 06 show per-sample tables this way).
- ``scale_text``: a loss scale as people read it (``2**16`` rather than ``65536.0``).
"""

from __future__ import annotations

import html
import math


def scale_text(scale) -> str:
    """``2**16`` for a power of two, otherwise the number; ``-`` when there is no scale."""
    if scale is None:
        return "-"
    scale = float(scale)
    if scale > 0 and math.isfinite(scale) and math.log2(scale).is_integer():
        return f"2**{int(math.log2(scale))}"
    return f"{scale:.6g}"


class ShortTable:
    """A table shown with its first ``rows`` rows; in Jupyter the whole table sits behind a toggle below them.

    Order the frame so that the rows that matter come first (e.g. changed decisions). ``.frame`` is the whole
    table, for code and for ``.to_csv(...)``.
    """

    def __init__(self, frame, rows: int = 10, title: str = "all rows"):
        self.frame, self.rows, self.title = frame, rows, title

    @property
    def hidden(self) -> int:
        return max(0, len(self.frame) - self.rows)

    def __repr__(self) -> str:
        text = self.frame.head(self.rows).to_string() + "\n" if self.rows else ""
        if self.hidden:
            more = f"... and {self.hidden} more row(s) " if self.rows else ""
            text += f"{more}({self.title}: .frame holds all {len(self.frame)})"
        return text.rstrip("\n")

    def _repr_html_(self) -> str:
        shown = self.frame.head(self.rows).to_html() if self.rows else ""
        if not self.hidden:
            return shown
        more = f"{self.hidden} more row(s): " if self.rows else ""
        return (
            f"{shown}<details><summary>{more}show {html.escape(self.title)} ({len(self.frame)} rows)"
            f"</summary>{self.frame.to_html()}</details>"
        )


def short_table(frame, rows: int = 10, title: str = "all rows") -> ShortTable:
    """``frame`` shown with at most ``rows`` rows, the rest behind a toggle (see :class:`ShortTable`)."""
    import pandas as pd  # loaded here: scale_text's users (the progress CLI among them) need no pandas

    if not isinstance(frame, pd.DataFrame):
        raise TypeError(f"short_table expects a pandas DataFrame; got {type(frame).__name__}.")
    return ShortTable(frame, rows, title)
