"""Start-up checks on verl's ``ActorConfig``, where the objective meets the rest of the actor config.

``RlstabPolicyLossConfig`` validates the objective but cannot see the actor section around it;
whether the engine will compute entropy is an actor setting. verl builds its ``ActorConfig``
in the driver's ``validate_config`` before any worker or rollout starts, so a check run there
fails the run in seconds with the flag to set, not after the first rollout.
"""

from __future__ import annotations

import functools
import logging

from rlstab.adapters.verl.config import CONFIG_PATH, RlstabPolicyLossConfig

ACTOR_PATH = "actor_rollout_ref.actor"
_log = logging.getLogger(__name__)


def add_check(actor_config_class: type) -> None:
    """Run [`check_actor`][rlstab.adapters.verl.startup.check_actor] after ``ActorConfig.__post_init__``."""
    original = actor_config_class.__post_init__
    if getattr(original, "__rlstab_wrapped__", False):
        return

    @functools.wraps(original)
    def __post_init__(self):
        original(self)
        check_actor(self)

    __post_init__.__rlstab_wrapped__ = True
    actor_config_class.__post_init__ = __post_init__


def check_actor(actor) -> None:
    """Refuse an actor config on which the rlstab loss would fail or silently differ."""
    policy_loss = actor.policy_loss
    ours = isinstance(policy_loss, RlstabPolicyLossConfig)
    if policy_loss.get("loss_mode") == "rlstab" and not ours:
        raise ValueError(
            f"{CONFIG_PATH}.loss_mode=rlstab needs {CONFIG_PATH}._target_=rlstab.adapters.verl.RlstabPolicyLossConfig "
            f"and {CONFIG_PATH}.objective=<preset or YAML path>"
        )
    if not ours:
        return
    compiled = policy_loss.rlstab_compiled
    readers = compiled.readers("entropy")
    # verl computes entropy when calculate_entropy is set or the entropy bonus is on (ray_trainer._update_actor).
    if readers and not (actor.calculate_entropy or actor.entropy_coeff != 0):
        raise ValueError(
            f"{CONFIG_PATH}.objective {compiled.objective.name or policy_loss.objective!r}: {', '.join(readers)} "
            f"reads the per-token entropy; set {ACTOR_PATH}.calculate_entropy=True"
        )
    kind = compiled.objective.aggregation.kind
    if kind != actor.loss_agg_mode and (actor.entropy_coeff != 0 or actor.use_kl_loss):
        _log.warning(
            "rlstab: the objective aggregates the policy loss with %s; verl's entropy bonus and KL loss use "
            "%s.loss_agg_mode=%s",
            kind,
            ACTOR_PATH,
            actor.loss_agg_mode,
        )
