"""``python -m amp_lessons grade``: ``grade`` (a folder of notebooks, one worker each), ``worker`` (one notebook
in its own process and kernel), ``sandbox`` (the worker's minimal environment, and ending its processes),
``table`` (the grade table: escaped, capped CSV)."""
