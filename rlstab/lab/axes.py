"""Axes of the lab's figures that read at any run length and any size of fraction.

- **Steps** are whole numbers: matplotlib's default locator puts ticks at 0.5 and 1.5 on a run of
  3 steps; [`integer_steps`][rlstab.lab.axes.integer_steps] allows only integers.
- **Fractions in percent** (silenced tokens) span 0.001% (STAPO's spurious tokens) to 80%
  (20-Entropy's mask), often in one panel. [`percent_axis`][rlstab.lab.axes.percent_axis] keeps a
  linear axis while the nonzero values lie within two decades of each other, and otherwise switches
  to a symmetric-log axis whose linear part ends at the decade of the smallest nonzero value, so that
  value sits on the log part with a labelled decade below it. The axis starts just under 0 (a
  fraction is never negative, though a t band may reach below 0), so a line at 0 stays visible,
  and its labels are plain numbers (``0.01``, not ``10^-2``).
"""

from __future__ import annotations

import math
from collections.abc import Iterable

LINEAR_DECADES = 2.0
"""The nonzero values of a linear percent axis lie within this many decades of each other."""


def integer_steps(ax) -> None:
    """Ticks of ``ax``'s x axis (RL steps) only at whole numbers."""
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True, steps=[1, 2, 5, 10]))  # 0, 20, 40, not 0, 15, 30


def percent_axis(ax, values: Iterable[float]) -> None:
    """Scale ``ax``'s y axis for the percentages ``values`` (every value drawn: means and band edges)."""
    from matplotlib.ticker import FuncFormatter

    finite = [v for v in values if math.isfinite(v)]
    top = max(finite, default=0.0)
    smallest = min((v for v in finite if v > 0), default=0.0)
    if top <= 0:  # nothing silenced anywhere: a flat line at 0 on a labelled axis
        ax.set_yscale("linear")
        ax.set_ylim(-0.03, 1.0)
    elif top / smallest <= 10**LINEAR_DECADES:
        ax.set_yscale("linear")
        ax.set_ylim(-0.03 * top, 1.1 * top)
    else:
        threshold = 10 ** math.floor(math.log10(smallest))
        ax.set_yscale("symlog", linthresh=threshold, linscale=0.5)
        ax.set_ylim(-0.2 * threshold, 1.5 * top)
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
