"""Exercises from solutions: ``builder`` writes ``exercises/`` from ``solutions/`` (solution regions become
stubs that raise ``NotImplementedError``); ``course`` is the nbgrader side of the same notebooks (solution and
locked check cells, restoring check cells before grading)."""
