"""rlstab-wreinforce: W-REINFORCE's positive-sample weight (arXiv 2506.01347) as an rlstab reweighter.

The package declares ``WReinforce`` in the ``rlstab.components`` entry-point group
(``pyproject.toml``), so an installed copy makes ``reweighters: [{kind: w_reinforce}]`` available
to every objective.
"""

from rlstab_wreinforce.w_reinforce import WReinforce

__all__ = ["WReinforce"]
__version__ = "0.1.0"
