"""rlstab's metrics in OpenRLHF's own logging.

``ActorPPOTrainer.training_step`` returns ``{"metrics": ..., "weights": ...}``; ``ppo_train``
averages every metric over micro-batches and data-parallel ranks (weighted by tokens or samples,
as ``weights`` says) and hands the result to OpenRLHF's loggers (console, wandb, tensorboard).
Adding the loss's ``last_metrics`` to that dict, token-weighted, puts ``rlstab/mask/s2t/silenced``
and the rest next to ``policy_loss`` with no logger of ours. OpenRLHF has no other reduction, so
only the ``token_mean`` metrics combine as ``Metrics.combines`` declares (over the training batch);
counts are token-weighted per-micro-batch averages, step values their token-weighted mean over the
batch's steps (docs/adapters/openrlhf.md).
"""

from __future__ import annotations

import functools

from rlstab.adapters.patching import patch_once

PREFIX = "rlstab/"


def log_rlstab_metrics(trainer_class) -> None:
    """Wrap ``trainer_class.training_step`` to add the rlstab loss's metrics to its status (idempotent)."""
    patch_once(trainer_class, "training_step", _adding_metrics, key=__name__)


def _adding_metrics(original):
    @functools.wraps(original)
    def training_step(self, *args, **kwargs):
        status = original(self, *args, **kwargs)
        metrics = getattr(getattr(self, "actor_loss_fn", None), "last_metrics", None)
        if metrics and isinstance(status, dict) and "metrics" in status and "weights" in status:
            for name, value in metrics.items():
                status["metrics"][PREFIX + name] = float(value)
                status["weights"][PREFIX + name] = "token"
        return status

    return training_step
