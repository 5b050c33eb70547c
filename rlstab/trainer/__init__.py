"""The embedded trainer: GRPO-family RL of a small policy on synthetic tasks, with any compiled objective.

``Run`` (``rlstab.trainer.run``) trains one objective from a seed and a ``TrainConfig``, step by
step, with ``state_dict()`` and ``load_state_dict()``; ``rlstab demo`` and the lab
(``rlstab compare``) both drive it. Its parts: the policies (``models``, ``policy``,
``tiny_model``, ``warmstart``, ``smollm2``), the tasks (``tasks``), one RL step (``loop``), the
objective's sampler and rollout layers (``layers``, ``branching``) and the metrics rows (``rows``).

Nothing here is imported by ``import rlstab``; importing this package loads pydantic, not torch.
"""

from rlstab.trainer.config import TrainConfig, TrainerSettings

__all__ = ["Run", "StepOutcome", "TrainConfig", "TrainerSettings"]


def __getattr__(name: str):
    if name in ("Run", "StepOutcome"):  # torch loads with them
        from rlstab.trainer import run

        return getattr(run, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
