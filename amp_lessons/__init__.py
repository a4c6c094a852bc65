"""Helpers, checkers and widgets for the course "Mixed Precision, Validated".

Start every notebook with::

    from amp_lessons import setup
    env = setup()      # seeds everything, picks the device, probes what AMP can do here
    env                # shows the environment card
    device = env.device

The layout (see docs/architecture.md): one package per lesson, named after its notebook
(``l04_baseline_and_decision_boundary/``: the lesson's helpers, its checker and its quiz); ``core/`` for what
several lessons share; ``checks/`` for the learner's ``from amp_lessons.checks import check_...`` and the
harness checkers are built on; ``tools/`` for the command line. Imports point one way: tools -> checks ->
lessons -> harness -> core. ``setup`` is loaded on first use, so ``python -m amp_lessons progress`` does not
import torch.
"""

from amp_lessons import legacy_paths

__all__ = ["Environment", "SetupError", "setup"]
__version__ = "0.3.0"

legacy_paths.install()


def __getattr__(name):
    if name in __all__:
        from amp_lessons.core import environment

        return getattr(environment, name)
    raise AttributeError(f"module 'amp_lessons' has no attribute {name!r}")
