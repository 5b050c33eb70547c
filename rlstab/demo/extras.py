"""Whether the optional packages a command needs are installed, asked before any work is done.

``rlstab demo``, ``audit`` and ``compare`` draw their curves with matplotlib (the ``demo`` extra).
Finding out after minutes of training, with a traceback and no summary written, wastes the run.
"""

from __future__ import annotations

import importlib.util


def missing_plotting(command: str) -> str | None:
    """One line saying what to install when matplotlib is missing, else None."""
    if importlib.util.find_spec("matplotlib") is not None:
        return None
    return f"{command}: its curves need matplotlib, which is not installed: pip install 'rlstab[demo]'"
