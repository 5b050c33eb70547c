"""Loading objectives: sources, text, YAML 1.2, limits and ``extends:``.

[`rlstab.load`][rlstab.load] is the entry point; the modules are its steps, in order:
``text`` (size and encoding), ``yaml12`` (plain data from YAML), ``limits``, ``extends`` (the chain,
merged), then the [`Objective`][rlstab.Objective] model validates the fields.
"""

from rlstab.loading.limits import LIMITS, Limits
from rlstab.loading.sources import load, load_data
from rlstab.loading.yaml12 import parse_yaml

__all__ = ["LIMITS", "Limits", "load", "load_data", "parse_yaml"]
