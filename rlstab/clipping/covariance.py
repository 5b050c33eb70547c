"""The token-wise covariance of advantage and log-probability that Clip-Cov and KL-Cov rank tokens by.

"The Entropy Mechanism of Reinforcement Learning for Reasoning Language Models" (Cui et al.,
arXiv 2505.22617) shows that entropy falls by the covariance between a token's log-probability
and its advantage; tokens with a large centred product drive the collapse:

    cov_t = (A_t - mean A) * (log pi_t - mean log pi)

The means run over the valid tokens of one micro-batch, as in the authors' code and veRL 0.9.1.
"""

from __future__ import annotations

from rlstab.lazy import torch
from rlstab.tokens import Tokens


def token_covariance(t: Tokens) -> torch.Tensor:
    """``[B, T]`` centred products over this micro-batch's valid tokens (padding holds garbage).

    The means are veRL's ``masked_mean``: ``sum(where(valid, x, 0)) / (count + 1e-8)``, in the
    same order of operations, so the tokens selected near a threshold are the same.
    """
    valid = t.valid_bool
    count = t.valid.sum() + 1e-8
    adv = t.advantages
    mean_adv = torch.where(valid, adv, 0.0).sum() / count
    mean_logp = torch.where(valid, t.logprobs, 0.0).sum() / count
    return (adv - mean_adv) * (t.logprobs - mean_logp)
