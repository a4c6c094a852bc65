"""Helpers, checkers and widgets for the course "Mixed Precision, Validated".

Start every notebook with::

    from amp_lessons import setup
    env = setup()      # seeds everything, picks the device, probes what AMP can do here
    env                # shows the environment card
    device = env.device
"""

from amp_lessons.environment import Environment, SetupError, setup

__all__ = ["Environment", "SetupError", "setup"]
__version__ = "0.1.0"
