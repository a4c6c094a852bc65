"""Helpers, checkers and widgets for the course "Mixed Precision, Validated".

Start every notebook with::

    from amp_lessons import setup
    env = setup()      # seeds everything, picks the device, probes what AMP can do here
    env                # shows the environment card
    device = env.device

The layout (see docs/architecture.md): core modules here (environment, models, data, quiz, record, utils,
autocast_state), one lesson helper per topic here (formats, scaling, ..., benchmark), the exercise checkers in
``checks/`` and the command-line tools in ``tools/``. Imports point one way: tools -> checks -> lesson helpers
-> core. ``setup`` is loaded on first use, so ``python -m amp_lessons progress`` does not import torch.
"""

__all__ = ["Environment", "SetupError", "setup"]
__version__ = "0.1.0"


def __getattr__(name):
    if name in __all__:
        from amp_lessons import environment

        return getattr(environment, name)
    raise AttributeError(f"module 'amp_lessons' has no attribute {name!r}")
