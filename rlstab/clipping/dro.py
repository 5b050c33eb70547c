"""DRO: the policy gradient with a quadratic penalty on the log-ratio instead of a clip."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from rlstab.clipping.base import Surrogate, SurrogateResult
from rlstab.lazy import torch
from rlstab.tokens import Tokens


class DRO(Surrogate):
    r"""Direct Reward Optimization's policy loss: REINFORCE plus a quadratic log-ratio penalty.

    $$l = -\Bigl(A\,\log\pi_\theta(y_t) - \frac{\beta}{2}\bigl(\log\pi_\theta(y_t) - \log\pi_{old}(y_t)\bigr)^2\Bigr),
    \qquad \frac{\partial l}{\partial \log\pi} = -A + \beta\,(\log\pi_\theta - \log\pi_{old})$$

    No clip: the penalty pulls the policy back towards the sampling policy in proportion to how
    far each token's log-probability has moved, so the trust region is soft.

    **Source.** DRO (Richemond et al., "Offline Regularised Reinforcement Learning for Large
    Language Models Alignment", arXiv 2405.19107, the DRO objective) fits
    $\frac12\mathbb E\bigl[(r - V - \tau\log\frac{\pi_\theta}{\pi_{ref}})^2\bigr]$; its policy
    gradient is $-\tau\,\mathbb E[(A - \tau\log\frac{\pi_\theta}{\pi_{ref}})\nabla\log\pi_\theta]$
    with $A = r - V$, which is $\tau$ times the gradient of this loss with $\beta = \tau$ and the
    sampling policy as reference. Kimi k1.5 (arXiv 2501.12599, section 2.3, policy optimization) trains with the
    same gradient, $A$ the reward minus the group's mean reward, per response. This is veRL
    0.9.1's ``policy_loss.loss_mode=dro`` (``compute_policy_loss_dro`` in
    ``verl/trainer/ppo/core_algos.py``, ``docs/algo/dro.md``, PR #7245), per token, and
    Tinker's ``dro`` loss, which cite both papers.

    **Default.** ``beta = 0.05``: veRL has no default (``dro_beta`` is required and must be
    positive); 0.05 is the value of veRL's usage example (PR #7245,
    ``actor_rollout_ref.actor.policy_loss.dro_beta=0.05``) and of Tinker's DRO example. Neither
    paper fixes a value for reasoning RL.

    The penalty uses the raw log-ratio $\log\pi_\theta - \log\pi_{old}$, not the objective's
    clamped one: it is a polynomial (nothing overflows), and a clamp would switch off the pull
    back of exactly the tokens that moved furthest. It acts on kept tokens only (a masked token
    has no loss at all), unlike Tinker's, which penalises advantage-0 positions too.
    """

    kind: Literal["dro"] = "dro"
    beta: float = Field(0.05, gt=0.0, le=1e6)
    """Coefficient of the quadratic log-ratio penalty (veRL's ``dro_beta``; 0.05 as in veRL's and Tinker's examples)."""

    def evaluate(self, t: Tokens, weight: torch.Tensor, step=None) -> SurrogateResult:
        adv = t.advantage_rows
        # where, not a multiply by valid: padding may hold huge values (inf * 0 is NaN)
        log_ratio = torch.where(t.valid_bool, t.logprobs - t.old_logprobs, 0.0)
        grad = weight * (log_ratio * self.beta - adv)
        # veRL's order: -(log_prob * advantages - 0.5 * beta * log_ratio.square())
        per_token = torch.where(t.valid_bool, (t.logprobs * adv - 0.5 * self.beta * log_ratio.square()).neg(), 0.0)
        loss = torch.dot(weight.reshape(-1), per_token.reshape(-1))
        return SurrogateResult(loss, grad, {})

    def describe(self) -> str:
        return f"dro: l = -(A log p - {self.beta:g}/2 (log p - log p_old)^2) (no clipping)"
