"""Hooking rlstab into verl: the loss registration, the ``ppo_loss`` wrapper and the start-up check.

Idempotent: importing the adapter twice, or ``import verl`` after an explicit import, installs
everything once.
"""

from __future__ import annotations

import logging
import sys
import warnings

import verl
from verl.trainer.ppo.core_algos import register_policy_loss
from verl.workers.config import ActorConfig

from rlstab.adapters.post_import import when_imported
from rlstab.adapters.verl import bypass, checkpoint, entropy, model_output, step_scope, tinker
from rlstab.adapters.verl.config import add_actor_check
from rlstab.adapters.verl.loss import rlstab_policy_loss

SUPPORTED_VERL = (">=0.9.0", "<0.10")
"""The ``rlstab[verl]`` range: releases whose loss path (``ppo_loss``, ``global_batch_info``, the ``verl.plugins`` group)
the adapter was run against (CI tests 0.9.1; docs/install.md says what ran on 0.9.0)."""

LOSS_MODE = "rlstab"

_log = logging.getLogger(__name__)


def _supported(version: str) -> bool:
    parts = version.split(".")
    try:
        major, minor = int(parts[0]), int(parts[1])
    except (IndexError, ValueError):
        return False
    return (major, minor) == (0, 9)


def install() -> None:
    """Register ``loss_mode=rlstab``, wrap ``ppo_loss``, add the ``ActorConfig`` start-up check and the engine entropy."""
    if not _supported(verl.__version__):
        warnings.warn(
            f"rlstab's veRL adapter is tested with verl {','.join(SUPPORTED_VERL)}; this is verl {verl.__version__}",
            stacklevel=2,
        )
    register_policy_loss(LOSS_MODE)(rlstab_policy_loss)
    model_output.wrap_ppo_loss(sys.modules)
    add_actor_check(ActorConfig)
    when_imported("verl.workers.engine_workers", lambda module: entropy.wrap_set_loss_fn(module.TrainingWorker))
    when_imported("verl.workers.engine_workers", lambda module: checkpoint.wrap_training_worker(module.TrainingWorker))
    when_imported("verl.workers.engine_workers", lambda module: step_scope.wrap_training_worker(module.TrainingWorker))
    when_imported("verl.trainer.ppo.ray_trainer", lambda module: step_scope.keep_old_entropy(module.RayPPOTrainer))
    when_imported("verl.trainer.ppo.rollout_corr_helper", bypass.wrap_apply_bypass_mode)
    when_imported("verl.workers.engine_workers_tinker", lambda module: tinker.wrap_tinker_worker(module.TinkerTrainingWorker))
    _log.debug("rlstab: policy loss %r registered in verl %s", LOSS_MODE, verl.__version__)
