"""veRL's bypass mode (``algorithm.rollout_correction.bypass_mode=true``) with ``loss_mode: rlstab``.

In bypass mode veRL skips the old-policy pass and, every step, ``apply_bypass_mode`` (in
``verl/trainer/ppo/rollout_corr_helper.py``) sets ``old_log_probs = rollout_log_probs`` and then
*replaces* the actor's ``policy_loss.loss_mode`` by its own ``bypass_mode`` loss: a run configured
with ``loss_mode=rlstab`` would silently train on veRL's loss instead. The wrapper keeps the first
half and leaves an rlstab loss in place: rlstab's objective then reads the rollout's log-probs as
``old_logprobs``, which is how rlstab expresses bypass mode (``ppo_clip`` for veRL's
``loss_type: ppo_clip``; ``reinforce`` with ``is_weight`` for ``loss_type: reinforce``; the
``bypass_rejection`` mask for ``rollout_rs``; docs/papers.md). veRL's own ``rollout_is`` /
``rollout_rs`` settings are not applied to an rlstab loss: when set, a warning says which, once.
"""

from __future__ import annotations

import functools
import warnings
from types import ModuleType

from rlstab.adapters.patching import patch_once


def ignored_settings(rollout_corr_config) -> list[str]:
    """veRL's rollout-correction settings an rlstab loss does not apply, as ``name=value``."""
    if rollout_corr_config is None:
        return []
    found = []
    for name in ("rollout_is", "rollout_rs", "loss_type"):
        value = rollout_corr_config.get(name, None)
        if value is not None and not (name == "loss_type" and value == "ppo_clip"):
            found.append(f"algorithm.rollout_correction.{name}={value}")
    return found


def wrap_apply_bypass_mode(module: ModuleType) -> None:
    """Wrap ``module.apply_bypass_mode`` so that it keeps ``loss_mode=rlstab`` (idempotent)."""
    patch_once(module, "apply_bypass_mode", _keeping_rlstab, key=__name__)


def _keeping_rlstab(original):
    @functools.wraps(original)
    def apply_bypass_mode(batch, rollout_corr_config=None, policy_loss_config=None):
        if policy_loss_config is None or policy_loss_config.get("loss_mode", None) != "rlstab":
            return original(batch, rollout_corr_config, policy_loss_config)
        if "rollout_log_probs" not in batch.batch:
            raise ValueError(
                "algorithm.rollout_correction.bypass_mode=true needs rollout_log_probs in the batch: set "
                "actor_rollout_ref.rollout.calculate_log_probs=true"
            )
        batch.batch["old_log_probs"] = batch.batch["rollout_log_probs"]
        ignored = ignored_settings(rollout_corr_config)
        if ignored and not getattr(apply_bypass_mode, "warned", False):
            apply_bypass_mode.warned = True
            warnings.warn(
                f"bypass mode with loss_mode=rlstab: the rlstab objective trains with old_logprobs = the rollout's "
                f"log-probs; {', '.join(ignored)} are veRL's bypass loss settings and are not applied: express them "
                "in the objective (reinforce's is_weight, the bypass_rejection mask)",
                stacklevel=2,
            )
        return None

    return apply_bypass_mode
