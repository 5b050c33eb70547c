"""rlstab-vespo: VESPO (arXiv 2602.10693) as an rlstab surrogate, installed as a third-party plugin.

The package declares ``VESPO`` in the ``rlstab.components`` entry-point group (``pyproject.toml``),
so an installed copy makes ``surrogate: {kind: vespo}`` available to every objective.
"""

from rlstab_vespo.vespo import VESPO

__all__ = ["VESPO"]
__version__ = "0.1.0"
