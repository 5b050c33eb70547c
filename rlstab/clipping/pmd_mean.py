"""PMD-mean: the score function weighted by how far the response's log-ratio is from its target A/τ."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from rlstab.clipping.base import Surrogate, SurrogateResult
from rlstab.clipping.target import response_advantage
from rlstab.lazy import torch
from rlstab.tokens import Tokens


class PMDMean(Surrogate):
    r"""Policy mirror descent towards a sequence-level target log-ratio (PMD-mean), as prime-rl's ``pmd_mean`` loss.

    Each response $i$ should reach the log-ratio $\bar A_i/\tau$ to the behaviour policy: the KL-regularised
    target $\pi_{old}\, e^{\bar A/\tau}$ with its log-partition approximated by the group-mean
    reward, which the centred advantage already subtracts (Xu, Lu, Yu, Zhao, "Approximation of
    Log-Partition Function in Policy Mirror Descent Induces Implicit Regularization for LLM
    Post-Training", arXiv 2602.05933: PMD-mean; the target Kimi k1.5 regresses on, arXiv 2501.12599
    eq. 3). The residual against the response's actual summed log-ratio is a detached coefficient
    on the score function:

    $$c_i = \mathrm{sg}\Bigl(\frac{\bar A_i}{\tau} - \sum_{t} \log r_{i,t}\Bigr), \qquad
    l_{i,t} = -\,c_i \log\pi_\theta(y_{i,t}), \qquad \frac{\partial l_{i,t}}{\partial \log\pi_\theta(y_{i,t})} = -c_i,$$

    $r = \pi_\theta/\pi_{old}$, the sum over the response's valid tokens, $\bar A_i$ the response's
    advantage (its mean over its valid tokens, see [`rlstab.clipping.target`][rlstab.clipping.target]).
    The update moves a whole response towards its target rather than each token against its own
    advantage, and a response already at its target contributes no gradient. As for
    [`Reinforce`][rlstab.clipping.Reinforce], the loss *value* is $-c\log\pi$ as the reference
    computes it; only its gradient is meaningful. The log-ratios are summed unclamped (prime-rl
    clamps nothing), over ``response_mask`` less rejected tokens; tokens a mask silences still count
    in the sum (the residual is the response's), but get no gradient.

    **Source.** prime-rl pull request 3381 ("feat: add KPop, Kimi k1.5 and PMD-mean loss types",
    ``trainer.loss`` type ``pmd_mean``, knob ``pmd_tau``): "the rollout's mean advantage over
    ``pmd_tau`` is the log-ratio the sequence should reach; the residual against its actual summed
    log-ratio is a detached coefficient on the score function"; prime-rl sums each sample's
    per-token loss and divides by the step's loss-token count (``compute_loss``: ``rl_loss / rl_scale``,
    ``token-mean`` over valid tokens, the ``pmd_mean`` preset) and takes the ratio against the
    inference engine's log-probabilities (hand those as ``old_logprobs`` for parity). The pull
    request's code is not public in the mirror this was written from; the formula is restated from
    its description and from issue 41's ``sg(Ā/τ - Σ log r) ∇log π``.

    **Defaults.** ``tau = 0.01``: the PMD-mean paper's code (``horizon-rl/OpenKimi``,
    ``openkimi/pmd/core_algos.py``, ``compute_policy_loss_opmd``: ``pmd_tau`` default 0.01, "typically
    set equal to ``partition_tau``" 0.01), whose knob prime-rl's ``pmd_tau`` mirrors; prime-rl's own
    default could not be read. OpenKimi's ``opmd`` loss is $\frac{\tau}{2}(\bar A_i/\tau - \sum_t \log r_{i,t})^2$
    per response, ``seq-mean-token-mean``: the same residual, its gradient $\tau$ times this one's
    per token of a response of one weight.

    No metrics (nothing is clipped).
    """

    kind: Literal["pmd_mean"] = "pmd_mean"
    tau: float = Field(0.01, gt=0.0, le=1e6)
    """The KL temperature: the target log-ratio is A / tau (PMD-mean paper's code, pmd_tau: 0.01)."""

    def residual(self, t: Tokens) -> torch.Tensor:
        """``[B]``: the detached coefficient c_i = A_i / tau - sum_t log r_i,t (0 on a response without valid tokens)."""
        # `where`, not a multiply: padding may hold huge values (inf * 0 is NaN). Unclamped, as prime-rl.
        log_ratio = torch.where(t.valid_bool, t.logprobs - t.old_logprobs, 0.0).sum(-1)
        return response_advantage(t) / self.tau - log_ratio

    def evaluate(self, t: Tokens, weight: torch.Tensor, step=None) -> SurrogateResult:
        c = self.residual(t).unsqueeze(-1)  # [B, 1]
        grad = weight * c.neg()  # weight first: a zero weight silences padding
        per_token = torch.where(t.valid_bool, c.neg() * t.logprobs, 0.0)
        # Summed in float64: the terms are of size A / tau (100 for A = 1, tau = 0.01) and cancel to a value of
        # size A, which float32 would give only to ~1e-5, and differently for each split of the step.
        loss = torch.dot(weight.reshape(-1).double(), per_token.reshape(-1).double()).float()
        return SurrogateResult(loss, grad, {})

    def describe(self) -> str:
        return (
            f"pmd_mean: l = -sg(A_i / {self.tau:g} - sum_t log r_i,t) log p, r = pi/pi_old summed over response i's "
            "tokens, A_i its mean advantage (gradient only through log p)"
        )
