"""The stability lab: objectives x seeds x stress regimes on the embedded trainer, with statistics.

``rlstab compare`` on the command line; from Python::

    from rlstab.lab import compare
    results = compare(["grpo", "stapo"], seeds=5, steps=100, regimes=["default", "policy-lag"], out="runs/lab")
"""

from rlstab.lab.compare import LabError, compare, plan
from rlstab.lab.regimes import Regime, load_regime, regime_names
from rlstab.lab.spec import RunSpec

__all__ = ["LabError", "Regime", "RunSpec", "compare", "load_regime", "plan", "regime_names"]
