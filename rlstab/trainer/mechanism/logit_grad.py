"""Each response token's logit-gradient norm against its probability and entropy (STAPO's correlation claim).

Definitions. For a response token t with sampled label y, logits z and next-token distribution
``p = softmax(z)`` at temperature 1 (the policy's own distribution, as ``Policy.token_stats``):

    d logp_y / d z = e_y - p,    ||e_y - p||^2 = (1 - p_y)^2 + sum_{j != y} p_j^2 = 1 - 2 p_y + sum_j p_j^2

- ``direction``: ``||e_y - p||``, the coefficient-free norm (a function of the distribution only;
  it falls as p_y rises to 1, and at a fixed p_y rises with the mass piled on a single other token).
- ``norm``: ``||dL / dz_t|| = |c_t| * ||e_y - p||`` with ``c_t = dL / dlogp_t`` the full loss's
  coefficient (``rlstab.trainer.mechanism.share``): what the token sends back into the network.

Both are binned by ``p_y`` (``PROBABILITY_EDGES``) and by the entropy H_t in nats
(``ENTROPY_EDGES``): per bin the token count and the mean of each norm. Bins are ``[low, high)``,
the last one closed (``p_y = 1``) or open-ended (``high`` None). Correlations over every response
token: Pearson (linear) and Spearman (Pearson of the ranks, ties given their mean rank) of each
norm with ``p_y`` and with H; None when fewer than two tokens or a constant variable.

``sum_j p_j^2`` comes from the policy's own forward pass (``Policy.token_distribution``, which both
policies of the trainer have).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from rlstab.lazy import torch

PROBABILITY_EDGES = (0.0, 1e-4, 1e-3, 1e-2, 0.1, 0.5, 0.9, 0.99, 1.0)
"""Bins of the sampled token's probability p_y: log-spaced below 0.1 (STAPO's spurious tokens have p < 0.002), then finer towards 1."""
ENTROPY_EDGES = (0.0, 0.01, 0.1, 0.3, 0.6, 1.0, 2.0, math.inf)
"""Bins of the next-token entropy H, in nats."""


class DistributionError(RuntimeError):
    """The policy's ``token_stats`` did not show its next-token distributions to the instrument."""


def distribution_stats(policy, rollout) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(logprobs, entropy, sum_squares)``: ``policy.token_stats(rollout)`` with ``sum_j p_j^2`` of each position,
    from the policy's ``token_distribution`` (the same forward pass); ``logprobs`` keeps its graph. Raises
    :class:`DistributionError` for a policy without it."""
    if not callable(getattr(policy, "token_distribution", None)):
        raise DistributionError(
            f"{type(policy).__name__} has no token_distribution(rollout): the instruments need each position's "
            "sum_j p_j^2 (rlstab.trainer.policy.Policy)"
        )
    return policy.token_distribution(rollout)


def direction_norm(logprobs: torch.Tensor, sum_squares: torch.Tensor) -> torch.Tensor:
    """``||e_y - p|| = sqrt(1 - 2 p_y + sum_j p_j^2)`` per token (float64; clamped at 0 against rounding)."""
    p = logprobs.detach().double().exp()
    return (1 - 2 * p + sum_squares.double()).clamp(min=0).sqrt()


def _ranks(x: torch.Tensor) -> torch.Tensor:
    """Ranks 0..n-1 of ``x``, ties given their mean rank."""
    order = torch.argsort(x, stable=True)
    ordered = x[order]
    starts = torch.ones_like(ordered, dtype=torch.bool)
    starts[1:] = ordered[1:] != ordered[:-1]
    group = starts.long().cumsum(0) - 1
    n = int(group[-1]) + 1
    position = torch.arange(x.numel(), dtype=torch.float64)
    mean_rank = torch.zeros(n, dtype=torch.float64).index_add_(0, group, position) / torch.zeros(
        n, dtype=torch.float64).index_add_(0, group, torch.ones_like(position))
    ranks = torch.empty(x.numel(), dtype=torch.float64)
    ranks[order] = mean_rank[group]
    return ranks


def pearson(x: torch.Tensor, y: torch.Tensor) -> float | None:
    """Pearson's correlation of two vectors (float64), None with fewer than two values or a constant one."""
    if x.numel() < 2:
        return None
    x, y = x.double() - x.double().mean(), y.double() - y.double().mean()
    scale = float(x.norm() * y.norm())
    if scale == 0:
        return None
    return min(1.0, max(-1.0, float(x @ y) / scale))


def spearman(x: torch.Tensor, y: torch.Tensor) -> float | None:
    """Spearman's rank correlation: Pearson's of the ranks (ties at their mean rank)."""
    if x.numel() < 2:
        return None
    return pearson(_ranks(x), _ranks(y))


def _cat(parts: list[torch.Tensor]) -> torch.Tensor:
    return torch.cat(parts) if parts else torch.zeros(0, dtype=torch.float64)


def _bins(values: torch.Tensor, edges, columns: dict[str, torch.Tensor]) -> list[dict]:
    index = torch.bucketize(values.double(), torch.tensor(edges[1:-1], dtype=torch.float64), right=True)
    out = []
    for i in range(len(edges) - 1):
        inside = index == i
        count = int(inside.sum())
        row = {"low": edges[i], "high": None if math.isinf(edges[i + 1]) else edges[i + 1], "count": count}
        for name, column in columns.items():
            row[name] = float(column[inside].mean()) if count else None
        out.append(row)
    return out


@dataclass
class TokenGradients:
    """Per-token probability, entropy and logit-gradient norms of the response tokens :meth:`add` is given."""

    probability: list[torch.Tensor] = field(default_factory=list)
    entropy: list[torch.Tensor] = field(default_factory=list)
    direction: list[torch.Tensor] = field(default_factory=list)
    norm: list[torch.Tensor] = field(default_factory=list)

    def add(self, logprobs: torch.Tensor, entropy: torch.Tensor, sum_squares: torch.Tensor,
            coefficients: torch.Tensor, mask: torch.Tensor) -> None:
        """One micro-batch, ``[B, T]`` each; ``mask``: its response tokens (the ones kept)."""
        mask = mask.bool().to(logprobs.device)
        direction = direction_norm(logprobs, sum_squares)
        self.probability.append(logprobs.detach().double().exp()[mask].cpu())
        self.entropy.append(entropy.detach().double()[mask].cpu())
        self.direction.append(direction[mask].cpu())
        self.norm.append((coefficients.detach().double().abs() * direction)[mask].cpu())

    def result(self) -> dict:
        """``{"tokens", "probability_bins", "entropy_bins", "pearson", "spearman"}`` (see the module)."""
        p, h, direction, norm = _cat(self.probability), _cat(self.entropy), _cat(self.direction), _cat(self.norm)
        columns = {"mean_norm": norm, "mean_direction": direction}
        pairs = {"norm_vs_probability": (norm, p), "norm_vs_entropy": (norm, h),
                 "direction_vs_probability": (direction, p), "direction_vs_entropy": (direction, h)}
        return {
            "tokens": int(p.numel()),
            "probability_bins": _bins(p, PROBABILITY_EDGES, columns),
            "entropy_bins": _bins(h, ENTROPY_EDGES, columns),
            "pearson": {name: pearson(a, b) for name, (a, b) in pairs.items()},
            "spearman": {name: spearman(a, b) for name, (a, b) in pairs.items()},
        }


MIN_BIN_TOKENS = 10
"""Fewest tokens a probability bin needs for its within-bin correlation (:func:`entropy_at_fixed_probability`)."""


def entropy_at_fixed_probability(probability: torch.Tensor, entropy: torch.Tensor, norms: dict[str, torch.Tensor],
                                 *, min_tokens: int = MIN_BIN_TOKENS) -> dict:
    """The correlation of each logit-gradient norm with the entropy *at fixed probability*.

    Within each bin of ``PROBABILITY_EDGES`` holding at least ``min_tokens`` tokens, Spearman's rank correlation of
    the norm with the entropy H over the bin's tokens (None for a constant variable); then their mean weighted by
    the bins' token counts, over the bins with a value:

        rho_fixed_p = sum_b n_b rho_b / sum_b n_b.

    STAPO (arXiv 2602.15620) has the gradient magnitude fall with the entropy at a given probability; over all
    tokens, H and p_y are themselves correlated, so the pooled correlation mixes the two (docs/audit.md). ``norms``:
    name -> per-token values (``direction``: ``||e_y - pi||``; ``norm``: ``|c_t| ||e_y - pi||``, as
    :class:`TokenGradients`). Returns ``{"bins": [{"low", "high", "count", <name>: rho}], <name>: weighted mean or
    None, "tokens": in the bins used}``.
    """
    index = torch.bucketize(probability.double(), torch.tensor(PROBABILITY_EDGES[1:-1], dtype=torch.float64), right=True)
    bins, sums, weights = [], dict.fromkeys(norms, 0.0), dict.fromkeys(norms, 0)
    used = 0
    for i in range(len(PROBABILITY_EDGES) - 1):
        inside = index == i
        count = int(inside.sum())
        if count < min_tokens:
            continue
        row = {"low": PROBABILITY_EDGES[i], "high": PROBABILITY_EDGES[i + 1], "count": count}
        used += count
        for name, values in norms.items():
            rho = spearman(values[inside], entropy[inside])
            row[name] = rho
            if rho is not None:
                sums[name] += count * rho
                weights[name] += count
        bins.append(row)
    return {"bins": bins, "tokens": used,
            **{name: sums[name] / weights[name] if weights[name] else None for name in norms}}
