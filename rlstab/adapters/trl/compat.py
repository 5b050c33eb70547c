"""Which TRL this adapter is written against.

The adapter overrides ``GRPOTrainer._compute_loss`` and reads TRL's micro-batch keys
(``num_items_in_batch``, ``old_per_token_logps``, ``importance_sampling_ratio``, ...) and its
attributes (``_buffered_inputs``, ``_step``, ``_metrics``). These are internals: they move between
minor releases, so other versions get a warning, and the conformance tests pin the version.
"""

from __future__ import annotations

import warnings

SUPPORTED_TRL = "1.16.0"
"""The TRL release whose ``GRPOTrainer._compute_loss`` the adapter is tested against (``rlstab[trl]`` pins it)."""


def trl_version() -> str:
    import trl

    return trl.__version__


def supported(version: str) -> bool:
    """Patch releases of the supported minor version (1.16.x) keep the loss path."""
    return version.split(".")[:2] == SUPPORTED_TRL.split(".")[:2]


def check_version() -> None:
    """Warn when the installed TRL is not 1.16.x."""
    version = trl_version()
    if not supported(version):
        warnings.warn(
            f"rlstab's TRL adapter is tested with trl=={SUPPORTED_TRL}; this is trl {version}. "
            "GRPOTrainer._compute_loss and its inputs may have changed: run tests/adapters/trl against it",
            stacklevel=3,
        )
