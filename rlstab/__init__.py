"""rlstab: stable RL for LLMs by composition.

Compose stability methods (token masks, advantage estimators, clipping rules, aggregations,
regularisers) in YAML, validate them before a cluster starts, and run them as one torch loss::

    import rlstab
    loss_fn = rlstab.load("stapo").compile()
    out = loss_fn(rlstab.TokenBatch(logprobs=..., old_logprobs=..., advantages=..., response_mask=..., entropy=...))
    out.loss.backward(); print(out.metrics)
"""

import warnings
from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as _metadata_version

with warnings.catch_warnings():
    # torch warns at import when NumPy is absent; rlstab never uses NumPy, so keep the CLI's output clean.
    warnings.filterwarnings("ignore", message="Failed to initialize NumPy")
    import torch  # noqa: F401

from rlstab.batch import BatchError, LossOutput, TokenBatch
from rlstab.compiled import CompiledObjective, StepStats
from rlstab.errors import ConfigError, StateError
from rlstab.loading import load
from rlstab.objective import Objective
from rlstab.presets import preset_names
from rlstab.registry import register

try:  # the installed distribution's version: one number, in pyproject.toml
    __version__ = _metadata_version("rlstab")
except PackageNotFoundError:  # imported from a source tree that was never installed
    __version__ = "0+unknown"

__all__ = [
    "BatchError",
    "CompiledObjective",
    "ConfigError",
    "LossOutput",
    "Objective",
    "StateError",
    "StepStats",
    "TokenBatch",
    "load",
    "preset_names",
    "register",
]
