r"""What the target-matching surrogates share: the sequence log-likelihoods and the response's advantage.

Target PO ([`TargetPO`][rlstab.clipping.TargetPO]) and PMD-mean ([`PMDMean`][rlstab.clipping.PMDMean])
both aim each sampled response $y_i$ at the KL-regularised improvement of the behaviour policy,

$$\pi^\star(y_i) \propto \pi_{old}(y_i)\, e^{\bar A_i / \tau},$$

the solution of $\max_\pi \mathbb{E}_\pi[\bar A] - \tau\,\mathrm{KL}(\pi \,\Vert\, \pi_{old})$, and move the
response's log-likelihood $\ell_i = \sum_t \log\pi_\theta(y_{i,t})$ towards it: the gradient with
respect to $\ell_i$ is *current minus target*. They differ in how the target is normalised, and so in
what is matched. Target PO normalises exactly over the group's sampled responses and matches
probabilities on that simplex by cross-entropy: $\partial L / \partial \ell_i = p_i - q_i$. PMD-mean
replaces the log-partition by the (group-centred) mean advantage, 0, and regresses the log-ratio
$\ell_i - \ell_i^{old}$ on $\bar A_i/\tau$: $\partial L / \partial \ell_i = \sum_t \log r_{i,t} - \bar A_i/\tau$.
The normalisation makes Target PO a group-level method (its gradient needs the group's other
responses, gathered over the step) and PMD-mean a per-response one, with different temperatures
(1 and 0.01), inputs (group ids) and weighting: two kinds sharing these helpers, not one kind
with a switch.

$\bar A_i$ is the response's advantage: its mean over the response's valid tokens (the advantage
itself when advantages are per response, as the group estimators give them).
"""

from __future__ import annotations

from rlstab.lazy import torch
from rlstab.tokens import Tokens


def sequence_logps(t: Tokens, logprobs: torch.Tensor, length: str = "sum") -> torch.Tensor:
    """``[B]``: each response's log-likelihood over its valid tokens (``length: sum``), or its mean (``mean``).

    Padding may hold anything (``torch.where``, not a multiply); a response without valid tokens gets 0."""
    total = torch.where(t.valid_bool, logprobs, 0.0).sum(-1)
    if length == "mean":
        total = total / t.valid_rows().clamp(min=1.0)
    return total


def response_advantage(t: Tokens) -> torch.Tensor:
    """``[B]``: each response's advantage, the mean of its advantages over its valid tokens (0 without any)."""
    if t.advantage_per_response is not None:
        return torch.where(t.valid_rows() > 0, t.advantage_per_response, 0.0)
    total = torch.where(t.valid_bool, t.advantages, 0.0).sum(-1)
    return total / t.valid_rows().clamp(min=1.0)
