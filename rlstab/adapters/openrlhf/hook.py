"""Putting the rlstab loss into OpenRLHF 0.11.2, in whichever process builds the trainer.

What is patched, and why each is needed:

1. ``openrlhf.trainer.ray.ppo_actor.PolicyLoss`` -> [`RlstabPolicyLoss`][rlstab.adapters.openrlhf.RlstabPolicyLoss].
   ``ActorPPOTrainer.__init__`` builds its loss as ``PolicyLoss(...)``, a name that
   ``ppo_actor`` bound at import (``from openrlhf.models import ... PolicyLoss``); rebinding it
   in that module is the narrowest change that makes the trainer build the rlstab loss. OpenRLHF
   has no loss plug-in point.
2. ``ActorPPOTrainer.training_step``: its returned status also carries the loss's metrics
   (``rlstab/...``), which OpenRLHF averages and logs with its own loggers
   ([`metrics`][rlstab.adapters.openrlhf.metrics]).
3. ``ActorPPOTrainer.__init__``, ``ppo_train`` and ``training_step``, and ``ppo_actor``'s name
   ``iter_grad_accum_global_norm``: the step-wide statistics and the start-up checks
   ([`step_scope`][rlstab.adapters.openrlhf.step_scope]).
4. ``DeepspeedStrategy.save_ckpt`` / ``load_ckpt``: the objective's state rides in OpenRLHF's
   checkpoints ([`checkpoint`][rlstab.adapters.openrlhf.checkpoint]).
5. Only when the objective reads entropy: ``openrlhf.models.actor.Actor.forward`` and that
   module's ``compute_entropy`` (see [`entropy`][rlstab.adapters.openrlhf.entropy]), because the
   trainer never passes entropy to the loss and computes it only for its bonus, with gradient.

Both are applied by post-import hooks ([`when_imported`][rlstab.adapters.post_import.when_imported]),
so processes that never import the trainer (vLLM engines) import nothing of OpenRLHF's.
"""

from __future__ import annotations

import os

from rlstab.adapters.openrlhf.config import (
    OBJECTIVE_ENV,
    STEP_STATISTICS_ENV,
    build_objective,
    check_step_statistics,
    objective_from_env,
    objective_to_env,
    step_statistics_from_env,
)
from rlstab.adapters.post_import import when_imported
from rlstab.compiler.plan import Plan
from rlstab.objective import Objective

PPO_ACTOR_MODULE = "openrlhf.trainer.ray.ppo_actor"
ACTOR_MODULE = "openrlhf.models.actor"
SETUP_HOOK = "rlstab.adapters.openrlhf.hook.setup_hook"
"""The ``worker_process_setup_hook`` the launcher gives Ray (a ``module.function`` path Ray imports in each worker)."""


def install(objective=None, step_statistics: str | None = None) -> Objective:
    """Make this process's OpenRLHF trainer use the rlstab loss; returns the validated objective.

    ``objective``: a preset, YAML path, dict or Objective, stored in ``$RLSTAB_OPENRLHF_OBJECTIVE``
    for the loss's constructor; None: the objective already there (set by the launcher).
    ``step_statistics``: ``"optimizer_step"`` or ``"local"``, stored in
    ``$RLSTAB_OPENRLHF_STEP_STATISTICS``; None: the mode already there (``optimizer_step`` when unset).
    """
    if step_statistics is None:
        step_statistics_from_env()  # a bad value fails here, not in the first worker
    else:
        os.environ[STEP_STATISTICS_ENV] = check_step_statistics(step_statistics, "install(step_statistics=...)")
    if objective is None:
        loaded = objective_from_env()
    else:
        loaded = build_objective(objective)
        os.environ[OBJECTIVE_ENV] = objective_to_env(loaded)
    when_imported(PPO_ACTOR_MODULE, _use_rlstab_loss)
    if Plan.of(loaded).readers("entropy"):
        when_imported(ACTOR_MODULE, _attach_entropy)
    return loaded


def setup_hook() -> None:
    """Ray's ``worker_process_setup_hook``: [`install`][rlstab.adapters.openrlhf.hook.install] from the environment."""
    install()


def _use_rlstab_loss(ppo_actor) -> None:
    from rlstab.adapters.openrlhf.checkpoint import wrap_strategy
    from rlstab.adapters.openrlhf.loss import RlstabPolicyLoss
    from rlstab.adapters.openrlhf.metrics import log_rlstab_metrics
    from rlstab.adapters.openrlhf.step_scope import install_step_scope

    ppo_actor.PolicyLoss = RlstabPolicyLoss
    install_step_scope(ppo_actor)
    log_rlstab_metrics(ppo_actor.ActorPPOTrainer)
    wrap_strategy(ppo_actor.DeepspeedStrategy)


def _attach_entropy(actor_module) -> None:
    from rlstab.adapters.openrlhf.entropy import switch_compute_entropy, wrap_actor_forward

    switch_compute_entropy(actor_module)
    wrap_actor_forward(actor_module.Actor)
