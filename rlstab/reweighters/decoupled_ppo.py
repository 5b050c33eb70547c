"""AReaL's decoupled PPO: the behaviour importance weight pi_prox / pi_behav, with its cap."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field

from rlstab.lazy import torch
from rlstab.reweighters.base import Reweighter
from rlstab.tokens import Tokens

SAFETY_BOUND = 20.0


class DecoupledPPO(Reweighter):
    r"""Decoupled PPO's behaviour importance weight (AReaL, Fu et al., arXiv 2505.24298).

    $$J(\theta) = \mathbb E_{y \sim \pi_{behav}}\Bigl[\sum_t w_t \,
      \min\bigl(u_t A_t,\ \mathrm{clip}(u_t, 1-\epsilon, 1+\epsilon) A_t\bigr)\Bigr],\qquad
      u_t = \frac{\pi_\theta(y_t)}{\pi_{prox}(y_t)},\quad
      w_t = \frac{\pi_{prox}(y_t)}{\pi_{behav}(y_t)}\,\mathbb 1\bigl[w_t \le C\bigr]$$

    In an asynchronous trainer the rollouts come from a behaviour policy $\pi_{behav}$ several
    versions old (and from an inference engine). Standard PPO would centre its trust region on
    that stale policy; decoupled PPO centres it on a *proximal* policy $\pi_{prox}$, the trainer's
    own recent weights, and corrects the off-policyness separately with the importance weight
    $\pi_{prox}/\pi_{behav}$ (the paper's decoupled, "staleness-enhanced" PPO objective). This
    component is that weight; the clip is the objective's surrogate (``ppo_clip`` in the
    ``decoupled_ppo`` preset): $u_t$ is rlstab's ratio $r$, because ``old_logprobs`` *are* the
    proximal policy's. The roles of the batch's fields:

    - $\pi_{prox}$ = ``TokenBatch.old_logprobs``, recomputed by the trainer before the update
      (AReaL's ``recompute_logprob``, which its ``use_decoupled_loss`` implies);
    - $\pi_{behav}$ = ``TokenBatch.rollout_logprobs``, what the inference engine reported when it
      sampled. This component reads it: a trainer whose loss call does not carry it is refused at
      start-up (``rlstab.adapters.trainer_parts.unsupplied``); rlstab's embedded trainer supplies
      it, from a stale sampler under ``policy_lag``.

    **Choices and where they come from** (github inclusionAI/AReaL, commit 61d1bbb3,
    ``areal/utils/functional/functional.py`` ``ppo_actor_loss_fn``, line 144-233, the last version
    with ``behav_imp_weight_cap``):

    - the weight, line 208-209: ``exp(proximal_logprobs - old_logprobs)``, not truncated; here the
      log-ratio is clamped to $\pm 20$ first, as every rlstab ratio (a weight above $e^{20}$ is
      capped anyway; below $e^{-20}$ it differs from AReaL's by less than $2\cdot10^{-9}$);
    - the cap, line 210-216: tokens whose weight *exceeds* ``behav_imp_weight_cap`` get weight 0
      (``<=`` keeps: inclusive), the others keep their full weight: ``above_cap: drop``. AReaL's
      later ``rejection_sampling`` (``action: clamp``) truncates instead, as TIS does:
      ``above_cap: clamp``;
    - ``cap = 5.0``: AReaL's code default is None (no cap, ``cli_args.py`` line 1063-1068), but
      every example config of that commit sets ``behav_imp_weight_cap: 5.0`` (for instance
      ``examples/math/gsm8k_grpo.yaml`` line 70) and ``docs/best_practices/algo_perf.md`` line 96
      recommends 5; ``cap: null`` is AReaL's default;
    - dropped tokens stay in the denominator: line 219 divides by the count of the original
      ``loss_mask``, which is rlstab's ``token-mean`` with ``count: valid`` (a reweighter's zero
      silences a token without removing it from any count);
    - the weight multiplies the clipped loss, after the min/max (line 217), and carries no
      gradient (both log-probabilities are the trainer's inputs).

    With ``above_cap: drop`` this equals ``icepop`` (``low`` -> 0, ``high = cap``, ``rejected:
    masked``) with ``tis`` (``cap``) under ``count: valid``: IcePop's band is decoupled PPO's cap
    with a lower bound added. In veRL the same weights come from its own rollout correction in
    "decoupled mode": ``algorithm.rollout_correction.rollout_is=token`` with
    ``rollout_is_threshold="1e-12_5.0"`` (an IcePop band whose floor never binds), which veRL hands
    the loss as ``rollout_is_weights``; tests/adapters/verl/test_decoupled_ppo.py checks the two
    agree within 1e-6 (veRL's loss always dual-clips, so there with ``dual_clip`` set). Metrics: ``capped_fraction``, the step's valid tokens whose weight
    exceeded the cap (AReaL's ``behave_mask`` complement), summed over micro-batches and ranks.
    """

    kind: Literal["decoupled_ppo"] = "decoupled_ppo"
    cap: float | None = Field(5.0, gt=1.0)
    """C: the largest behaviour weight pi_prox / pi_behav kept (AReaL's behav_imp_weight_cap, > 1); null: no cap."""
    above_cap: Literal["drop", "clamp"] = "drop"
    """``drop``: weight 0 above the cap (AReaL's behav_imp_weight_cap); ``clamp``: min(w, cap) (its later action: clamp)."""

    reads: ClassVar[frozenset[str]] = frozenset({"rollout_logprobs"})

    def _log_weight(self, t: Tokens) -> torch.Tensor:
        # where, not a multiply by valid: padding may hold anything (inf - inf is NaN)
        log_weight = torch.where(t.valid_bool, t.old_logprobs - t.rollout_logprobs, 0.0)
        return log_weight.clamp_(-SAFETY_BOUND, SAFETY_BOUND)

    def weights(self, t: Tokens, step) -> torch.Tensor:
        w = self._log_weight(t).exp_()
        if self.cap is None:
            return w
        if self.above_cap == "clamp":
            return w.clamp_(max=self.cap)
        return torch.where(w <= self.cap, w, 0.0)

    def step_sums(self, t: Tokens) -> torch.Tensor:
        """Valid tokens above the cap, and valid tokens, of this micro-batch."""
        above = (self._log_weight(t).exp_() > (self.cap if self.cap is not None else float("inf"))) & t.valid_bool
        return torch.stack([above.to(torch.float64).sum(), t.valid.to(torch.float64).sum()])

    def begin_step(self, sums, state):
        if sums is None:
            return {"capped": 0.0, "valid": 0.0}, state
        return {"capped": sums[0], "valid": sums[1]}, state

    def step_metrics(self, step) -> dict[str, torch.Tensor]:
        if step is None:
            return {}
        valid = step["valid"]
        return {"capped_fraction": step["capped"] / valid.clamp(min=1.0) if torch.is_tensor(valid) else 0.0}

    def describe(self) -> str:
        w = "w = pi_prox(old_logprobs) / pi_behav(rollout_logprobs)"
        if self.cap is None:
            return f"decoupled_ppo: {w}, uncapped; the surrogate's ratio is pi / pi_prox"
        rule = f"0 where w > {self.cap:g}" if self.above_cap == "drop" else f"min(w, {self.cap:g})"
        return f"decoupled_ppo: {w}, {rule}; the surrogate's ratio is pi / pi_prox"
