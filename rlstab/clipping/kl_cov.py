"""KL-Cov: a KL penalty on the tokens whose covariance drives entropy down most."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from rlstab.clipping.base import Surrogate, SurrogateResult, unclamped
from rlstab.lazy import torch
from rlstab.tokens import Tokens


class KLCov(Surrogate):
    r"""KL-Cov (Cui et al., "The Entropy Mechanism of RL for Reasoning LMs", arXiv 2505.22617, section 4).

    No ratio clip at all: every token takes the importance-weighted policy gradient, and the
    $k = \max(\lfloor f\,N\rfloor, 1)$ valid tokens with the largest covariance
    $\mathrm{cov}_t = (A_t - \bar A)(\log\pi_t - \overline{\log\pi})$ also pay a penalty on
    $|\log r|$ (an estimate of their KL to the old policy):

    $$l_t = -A_t\, r_t + \beta\, s_t\, \bigl|\log r_t\bigr|, \qquad
    s_t = 1 \text{ on the top-}k\text{ tokens by cov, else } 0$$

    $$\frac{\partial l}{\partial\log\pi} = -A\,r + \beta\, s\,\mathrm{sign}(\log r)$$

    **Scope** (``selection: micro_batch``, the only value). Per micro-batch, as in the authors'
    code and veRL 0.9.1: the means (plain means over the micro-batch's valid tokens), $N$ and
    the top-$k$ use only the micro-batch being computed. A step-wide top-$k$ would need every micro-batch's covariances before any loss
    runs; rlstab's step hooks carry sums only. Ties in the top-$k$ are broken by
    ``torch.topk`` over the valid tokens in row-major order, as veRL does. The ranking covers
    valid tokens whatever the objective's masks (veRL has none); a penalised token that a mask
    silences pays nothing.

    **Defaults and their source.** ``fraction = 2e-3`` and ``coef = 1``: the authors' code
    (``k_percent: 0.2``, read as a percentage, and ``ppo_kl_coef: 1`` in their
    ``ppo_trainer.yaml`` and every ``recipe/dapo/*kl_cov.sh``), which veRL's own
    ``recipe/entropy`` scripts repeat (``kl_cov_ratio=0.002``, ``ppo_kl_coef=1``). veRL 0.9.1's
    *dataclass* defaults differ (``kl_cov_ratio = 2e-4``, ``ppo_kl_coef = 0.1``); set those in
    veRL to match. $\log r$ is the objective's clamped log-ratio; veRL's ``kl_cov`` does not
    clamp (identical below $|\log r| = 20$).

    Metrics: ``kl_cov/penalised_fraction`` (the top-$k$ tokens, as a fraction of valid tokens).
    """

    kind: Literal["kl_cov"] = "kl_cov"
    fraction: float = Field(2e-3, gt=0.0, le=1.0)
    """Share f of the micro-batch's valid tokens penalised: max(floor(f N), 1) (authors: 0.002)."""
    coef: float = Field(1.0, ge=0.0, le=1e3)
    """Penalty coefficient beta on |log r| (authors: 1)."""
    selection: Literal["micro_batch"] = "micro_batch"
    """Where the means, N and the selection are computed: each micro-batch (the only scope; see Scope)."""

    def penalised(self, t: Tokens) -> torch.Tensor:
        """``[B, T]`` float, 1.0 on the top-k valid tokens by covariance."""
        valid = t.valid_bool
        selected = torch.zeros(t.valid.shape, device=t.valid.device)  # row-major: view(-1)[i] is the i-th token
        # Host syncs (on a GPU, in every call): the micro-batch's valid tokens, as veRL selects them, size the
        # top-k, k = max(floor(f N), 1).
        adv, logp = t.advantages[valid], t.logprobs[valid]  # row-major, as veRL
        n = adv.numel()
        if n == 0:
            return selected
        cov = (adv - adv.mean()) * (logp - logp.mean())
        k = max(1, int(n * self.fraction))
        top = torch.topk(cov, k, largest=True).indices
        flat = torch.nonzero(valid.reshape(-1), as_tuple=True)[0]
        selected.view(-1)[flat[top]] = 1.0
        return selected

    def evaluate(self, t: Tokens, weight: torch.Tensor, step=None) -> SurrogateResult:
        r, log_r = t.ratio, t.log_ratio
        selected = self.penalised(t)
        wa = weight * t.advantage_rows.neg()  # weight first: a zero weight silences padding
        penalty = weight * selected * self.coef
        loss = torch.dot(wa.reshape(-1), r.reshape(-1)) + torch.dot(penalty.reshape(-1), log_r.abs().reshape(-1))
        grad = (wa * r + penalty * torch.sign(log_r)) * unclamped(t)
        return SurrogateResult(loss, grad, {"kl_cov/penalised_fraction": selected.sum()})

    def describe(self) -> str:
        return (
            f"kl_cov: l = -A r, plus {self.coef:g} |log r| on the top max(floor({self.fraction:g} N), 1) "
            "tokens by cov(A, log p) per micro-batch (no clip)"
        )
