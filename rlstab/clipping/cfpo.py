"""CFPO: the clip replaced by a quadratic penalty on the ratio's distance from 1."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from rlstab.clipping.base import Surrogate, SurrogateResult, indicator, unclamped
from rlstab.lazy import torch
from rlstab.tokens import Tokens


class CFPO(Surrogate):
    r"""Clipping-Free Policy Optimization (Çağatan et al., arXiv 2601.22801).

    $$l = -\Bigl(A\,r - \frac{|A|}{2\epsilon}\,(r - 1)^2\Bigr),\qquad
    \frac{\partial l}{\partial \log\pi} = -r\Bigl(A - \frac{|A|}{\epsilon}\,(r - 1)\Bigr)$$

    PPO's clip zeroes the gradient of every token whose ratio left $[1-\epsilon, 1+\epsilon]$ in
    the direction of its advantage. CFPO replaces it with a convex quadratic penalty derived from a
    total-variation trust region: the objective is differentiable everywhere, and each token's
    objective peaks exactly at PPO's clip boundary, $r^* = 1 + \epsilon\,\mathrm{sign}(A)$, beyond
    which the gradient reverses and pulls the ratio back instead of vanishing. The paper calls it
    "a one-line code change and no additional hyperparameters": $\epsilon$ is PPO's clip range.

    **The authors' code fixes each choice.** Their veRL pull request (verl-project/verl #5252;
    github asparius/verl, commit 18bd5cde, ``verl/trainer/ppo/core_algos.py``
    ``compute_policy_loss_cfpo``, registered as the policy loss ``cfpo``):

    - the loss, line 1301-1304: ``-(A r - |A| (r - 1)^2 / (2 clip_ratio))``;
    - $\epsilon$, line 1289: ``cliprange = clip_ratio``, the symmetric PPO clip range (veRL's
      default 0.2), even when ``clip_ratio_low``/``clip_ratio_high`` are set: one $\epsilon$ for
      both signs of A, so ``epsilon: 0.2`` here;
    - the ratio, line 1295: ``exp(clamp(log pi - log pi_old, -20, 20))``, the objective's
      ``log_ratio_clamp`` here (20 by default); the clamp has zero gradient outside its range,
      as in every rlstab surrogate;
    - the trainer's rollout importance weights multiply the per-token loss (line 1306): rlstab's
      ``tis`` reweighter or a trainer's ``is_weights``, which compose with any surrogate;
    - aggregation: veRL's ``agg_loss`` with the trainer's ``loss_agg_mode`` (line 1309); the
      ``cfpo`` preset keeps GRPO's token-mean over valid tokens.

    Metrics: ``clip/high_fraction`` (A > 0, r > 1 + epsilon) and ``clip/low_fraction`` (A < 0,
    r < 1 - epsilon): the tokens PPO would have clipped (the PR's ``pg_clipfrac``, line 1312-1318),
    which CFPO still trains, towards the boundary. Fractions of valid tokens.
    """

    kind: Literal["cfpo"] = "cfpo"
    epsilon: float = Field(0.2, gt=0.0, le=10.0)
    """The trust region's radius: the penalty is |A| (r - 1)^2 / (2 epsilon) (veRL's clip_ratio, 0.2)."""

    def evaluate(self, t: Tokens, weight: torch.Tensor, step=None) -> SurrogateResult:
        r, adv = t.ratio, t.advantage_rows
        excess = r - 1.0
        penalty = adv.abs() / self.epsilon  # [B, 1] or [B, T]
        # l = -(A r - |A| (r - 1)^2 / (2 eps));  dl/dlogp = -r (A - |A| (r - 1) / eps)
        per_token = penalty * 0.5 * excess * excess - adv * r
        slope = penalty * excess - adv
        # `where` rather than a multiply by weight alone: a huge ratio on padding must not become inf * 0
        per_token = torch.where(t.valid_bool, per_token, 0.0)
        loss = torch.dot(weight.reshape(-1), per_token.reshape(-1))
        grad = torch.where(t.valid_bool, slope * r, 0.0).mul_(weight).mul_(unclamped(t))
        valid = t.valid.reshape(-1)
        pos = indicator(torch.gt, adv, 0.0) * indicator(torch.gt, r, 1.0 + self.epsilon)
        neg = indicator(torch.lt, adv, 0.0) * indicator(torch.lt, r, 1.0 - self.epsilon)
        counts = {
            "clip/high_fraction": torch.dot(valid, pos.expand_as(r).reshape(-1)),
            "clip/low_fraction": torch.dot(valid, neg.expand_as(r).reshape(-1)),
        }
        return SurrogateResult(loss, grad, counts)

    def describe(self) -> str:
        return f"cfpo: l = -(A r - |A| (r - 1)^2 / (2 * {self.epsilon:g})), no clip (gradient everywhere)"
