"""rlstab: stable RL for LLMs by composition.

Compose stability methods (token masks, advantage estimators, clipping rules, aggregations,
regularisers) in YAML, validate them before a cluster starts, and run them as one torch loss::

    import rlstab
    loss_fn = rlstab.compile(rlstab.load("stapo"))       # or rlstab.load("stapo").compile()
    out = loss_fn(rlstab.TokenBatch(logprobs=..., old_logprobs=..., advantages=..., response_mask=..., entropy=...))
    out.loss.backward(); print(out.metrics)
"""

from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as _metadata_version
from typing import TYPE_CHECKING

from rlstab.batch import BatchError, LossOutput, TokenBatch
from rlstab.errors import ConfigError, StateError
from rlstab.loading import load
from rlstab.objective import Objective
from rlstab.presets import preset_names
from rlstab.registry import register

try:  # the installed distribution's version: one number, in pyproject.toml
    __version__ = _metadata_version("rlstab")
except PackageNotFoundError:  # imported from a source tree that was never installed
    __version__ = "0+unknown"

if TYPE_CHECKING:
    from rlstab.compiled import CompiledObjective, StepStats


def compile(objective: Objective) -> "CompiledObjective":
    """The loss of ``objective``: a [`CompiledObjective`][rlstab.CompiledObjective], ``loss_fn(batch) -> LossOutput``.

    The compiler's entry point (``objective.compile()`` is its alias). Imports torch at the first call,
    not at ``import rlstab``: the objective, its [`Plan`][rlstab.compiler.plan.Plan] and
    [`explain`][rlstab.explain.explain] need none.
    """
    from rlstab.compiled import CompiledObjective

    return CompiledObjective(objective)


def __getattr__(name: str):
    # rlstab.compiled subclasses torch.autograd.Function, so importing it imports torch: not on the
    # path of validating an objective (rlstab.lazy says why), only when the compiled loss is wanted.
    if name in ("CompiledObjective", "StepStats"):
        from rlstab import compiled

        return getattr(compiled, name)
    raise AttributeError(f"module 'rlstab' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), "CompiledObjective", "StepStats"})


__all__ = [
    "BatchError",
    "CompiledObjective",
    "ConfigError",
    "LossOutput",
    "Objective",
    "StateError",
    "StepStats",
    "TokenBatch",
    "compile",
    "load",
    "preset_names",
    "register",
]
