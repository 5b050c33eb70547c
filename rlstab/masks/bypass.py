r"""Rollout rejection in bypass mode: the test of ``rollout_rejection`` on the policy ratio $\pi_\theta/\pi_{old}$.

**Bypass mode** (veRL 0.9.1: ``algorithm.rollout_correction.bypass_mode=True``,
``apply_bypass_mode`` in ``verl/trainer/ppo/rollout_corr_helper.py``) skips the trainer's
old-policy pass: the inference engine's log-probabilities stand in for the old policy's
(``old_log_prob = rollout_log_prob``), so two policies remain instead of three, and the policy
ratio $r = \pi_\theta / \pi_{old}$ *is* the train/inference ratio $\pi_\theta / \pi_{rollout}$.
veRL's ``bypass_mode`` loss (``compute_policy_loss_bypass_mode`` in ``core_algos.py``) then runs
its rollout correction on the current policy against the rollout's: rejection sampling
(``rollout_rs``) edits the response mask, and

- ``loss_type=ppo_clip`` (default): PPO on $r$, no importance weight (the ratio is the
  correction): rlstab's ``ppo_clip`` with these masks;
- ``loss_type=reinforce``: REINFORCE weighted by the detached truncated $r$ (``rollout_is``):
  rlstab's [`Reinforce`][rlstab.clipping.Reinforce] with ``is_weight: token`` or ``sequence``.

In rlstab, bypass mode is a property of the batch, not of the objective: the trainer hands the
rollout's log-probabilities as ``TokenBatch.old_logprobs`` (veRL does). Every surrogate then
reads $r = \pi_\theta/\pi_{rollout}$; what changes is the rejection, whose statistic must compare
the current policy with ``old_logprobs`` (the rollout's), where
[`RolloutRejection`][rlstab.masks.RolloutRejection] compares ``old_logprobs`` with
``rollout_logprobs`` (the trainer's old policy with the engine's, decoupled mode). That is this
mask: the same statistics, levels, bounds and clamp (veRL's ``compute_rollout_rejection_mask``
is called on the same log-ratio in both modes), on $\log r = \log\pi_\theta - \log\pi_{old}$
(detached). It reads no ``rollout_logprobs``, so it runs under every adapter.

The mapping from veRL's ``algorithm.rollout_correction`` in bypass mode to an rlstab objective:

| veRL | rlstab |
|---|---|
| ``bypass_mode=True`` (``old_log_prob = rollout_log_prob``) | the rollout's log-probs as ``old_logprobs`` |
| ``loss_type=ppo_clip`` | ``surrogate: {kind: ppo_clip}`` (the ``grpo`` preset), no reweighter |
| ``loss_type=reinforce``, ``rollout_is=token`` / ``sequence`` / null | ``surrogate: {kind: reinforce, is_weight: token / sequence / none}`` |
| ``rollout_is_threshold: C`` (a single number) | ``is_cap: C`` |
| ``rollout_is_threshold: "low_high"`` (IcePop) | ``is_cap: high`` and ``{kind: bypass_rejection, level: token, divergence: k1, low, high, rejected: masked}`` |
| ``rollout_rs``, ``rollout_rs_threshold`` | ``masks: [{kind: bypass_rejection, level, divergence, high, low}]`` |
| ``rollout_is_batch_normalize`` | not expressed (a per-micro-batch mean in veRL's loss) |

Running it inside veRL: ``apply_bypass_mode`` sets ``policy_loss.loss_mode = "bypass_mode"``
whatever the config said, so ``bypass_mode=True`` runs veRL's own loss, not ``rlstab``'s; the
rlstab objective above needs the batch's ``old_log_probs`` replaced by its
``rollout_log_probs`` with ``loss_mode=rlstab`` kept (the conformance tests call the loss so).
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar, Literal

from rlstab.lazy import torch
from rlstab.masks.rollout import Rejected, RolloutRejection
from rlstab.tokens import Tokens


class BypassRejection(RolloutRejection):
    r"""Rejection sampling on $\pi_\theta / \pi_{old}$, i.e. $\pi_\theta/\pi_{rollout}$ in bypass mode (veRL's ``rollout_rs``).

    Every option of [`RolloutRejection`][rlstab.masks.RolloutRejection] (``level``,
    ``divergence``, ``high``, ``low``, ``rejected``) with the same meaning, applied to
    $\log r = \mathrm{clamp}(\log\pi_\theta - \log\pi_{old}, \pm 20)$. With the batch's
    ``old_logprobs`` the rollout's (bypass mode), this is veRL 0.9.1's ``rollout_rs`` inside its
    ``bypass_mode`` loss.

    ``rejected: masked`` by default, unlike ``rollout_rejection``: veRL's bypass rejection edits
    the response mask *inside* the loss, after ``ppo_loss`` has counted the step's tokens and
    responses (``global_batch_info``, always set in training), so the rejected tokens stay in
    the step's denominators. One exception: under ``seq-mean-token-mean`` veRL divides each
    response's sum by its tokens left after a token-level rejection (what ``padding`` counts)
    while the step still counts every response; no option is both. ``rejected: padding`` is
    veRL's result when the micro-batch is its own step (no global batch info). veRL's bypass
    presets use ``sequence_mean`` k1 with [0.999, 1.001] (``bypass_ppo_clip_geo_rs``,
    ``bypass_pg_geo_rs``) and ``sequence_mean`` k3 with 0.01 (``bypass_ppo_clip_k3_rs``).
    IcePop in bypass mode is a ``token`` k1 band with ``rejected: masked`` (and ``is_cap`` its upper bound).

    The statistic reads the current policy's log-probabilities, so the kept tokens move as the
    policy moves within the step (veRL recomputes them in every micro-batch's loss; rlstab
    computes them where the step's statistics are gathered, from the step's current policy).
    """

    kind: Literal["bypass_rejection"] = "bypass_rejection"  # type: ignore[assignment]
    rejected: Rejected = "masked"
    """``masked`` (veRL's bypass loss under its global counts): rejected tokens still count in ``count: valid``;
    ``padding``: they leave every denominator."""

    reads: ClassVar[frozenset[str]] = frozenset()

    def keep(self, t: Tokens, threshold) -> torch.Tensor:
        # RolloutRejection tests log(old / rollout): present the current policy as "old" and old as "rollout".
        as_rollout = dataclasses.replace(t, old_logprobs=t.logprobs, rollout_logprobs=t.old_logprobs)
        return super().keep(as_rollout, threshold)

    def describe(self) -> str:
        return super().describe().replace("rollout_rejection", "bypass_rejection", 1).replace(
            "r = pi_train(old)/pi_infer", "r = pi/pi_old (= pi/pi_rollout in bypass mode)"
        ).replace("p = pi_train(old)(y_t), q = pi_infer(y_t)", "p = pi(y_t), q = pi_old(y_t) (= pi_rollout in bypass mode)")
