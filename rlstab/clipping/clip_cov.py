"""Clip-Cov: detach a random few of the tokens whose covariance drives entropy down."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from rlstab.clipping.base import Surrogate, SurrogateResult
from rlstab.clipping.bounded import clip_between
from rlstab.clipping.covariance import token_covariance
from rlstab.lazy import torch
from rlstab.tokens import Tokens


class ClipCov(Surrogate):
    r"""Clip-Cov (Cui et al., "The Entropy Mechanism of RL for Reasoning LMs", arXiv 2505.22617, section 4).

    The PPO clip, plus: among the valid tokens that the clip left trainable and whose covariance
    (see ``rlstab.clipping.covariance``) lies strictly between ``cov_low`` and ``cov_high``,
    draw $\max(\lfloor f\,N\rfloor, 1)$ at random ($N$: valid tokens of the micro-batch, $f$:
    ``fraction``) and give them zero loss and zero gradient:

    $$\mathrm{cov}_t = (A_t - \bar A)(\log\pi_t - \overline{\log\pi}), \qquad
    l_t = c_t\,\max\bigl(-A r,\ -A\,\mathrm{clip}(r, 1-\epsilon_{low}, 1+\epsilon_{high})\bigr),
    \quad c_t = 0 \text{ on the drawn tokens, else } 1$$

    The drawn tokens stay in the denominator (veRL's ``clip_cov`` aggregates over the response
    mask), so this is a surrogate, not a mask.

    **Scope** (``selection: micro_batch``, the only value). Per micro-batch, as in the authors'
    code and veRL 0.9.1: the means, $N$ and the draw use only the micro-batch being computed,
    not the step. A step-wide draw would need
    every micro-batch's candidates before any loss runs; rlstab's step hooks carry sums only.
    So, unlike most of rlstab, a step split into more micro-batches draws more tokens.
    Candidates are valid tokens whatever the objective's masks (veRL has none): a drawn token
    that a mask also silences simply stays silent.

    **Randomness.** Candidates are listed in row-major order (response, then position) and the
    draw is the first $k$ entries of ``torch.randperm(number of candidates)``, on the CPU, as
    veRL does. ``seed: null`` draws from torch's global CPU generator, exactly like veRL:
    seed it with ``torch.manual_seed`` (veRL and most trainers do at start-up), and the draw
    changes from call to call. ``seed: <int>`` draws from a generator freshly seeded with that
    integer for every micro-batch: the draw becomes a function of the micro-batch alone
    (reproducible, unchanged by padding or by recomputing a micro-batch, independent of other
    users of the global generator), at the price that two micro-batches with the same number
    of candidates pick the same candidate ranks. ``torch.manual_seed(s)`` followed by veRL's
    ``clip_cov`` selects the same tokens as ``seed: s`` here (tested).

    **Defaults and their source.** ``fraction = 2e-4``, ``cov_low = 1``, ``cov_high = 5``: the
    paper's and the authors' scripts (``recipe/dapo/7b_clip_cov.sh``; veRL's
    ``clip_cov_ratio/lb/ub``). ``eps_low = eps_high = 0.2``: PPO; the authors' Clip-Cov runs
    set both to 1 (the ``clip_cov`` preset does), so the ratio is barely clipped and the
    covariance clip does the work. No dual-clip (veRL's ``clip_cov`` has none). The ratio uses
    the objective's clamped log-ratio, where veRL's ``clip_cov`` does not clamp (identical below
    $|\log r| = 20$).

    Metrics: ``clip/high_fraction`` and ``clip/low_fraction`` (as PPO clip), and
    ``clip/cov_fraction`` (tokens drawn), as fractions of valid tokens.
    """

    kind: Literal["clip_cov"] = "clip_cov"
    eps_low: float = Field(0.2, ge=0.0, le=1.0)
    """Lower clip range: r is clipped below at 1 - eps_low (1: no lower clip; authors' runs: 1)."""
    eps_high: float = Field(0.2, ge=0.0, le=10.0)
    """Upper clip range: r is clipped above at 1 + eps_high (authors' runs: 1)."""
    fraction: float = Field(2e-4, gt=0.0, le=1.0)
    """Share f of the micro-batch's valid tokens to detach: max(floor(f N), 1) tokens (paper: 2e-4)."""
    cov_low: float = Field(1.0)
    """Candidates have a covariance strictly above this (paper: 1)."""
    cov_high: float = Field(5.0)
    """Candidates have a covariance strictly below this (paper: 5)."""
    seed: int | None = Field(None, ge=0)
    """null: torch's global CPU generator (veRL's behaviour); an integer: a generator seeded with it per micro-batch."""
    selection: Literal["micro_batch"] = "micro_batch"
    """Where the means, N and the selection are computed: each micro-batch (the only scope; see Scope)."""

    @model_validator(mode="after")
    def _band_not_empty(self):
        if self.cov_low >= self.cov_high:
            raise ValueError(f"cov_low ({self.cov_low}) must be below cov_high ({self.cov_high})")
        return self

    def detached(self, t: Tokens) -> torch.Tensor:
        """``[B, T]`` float, 1.0 on the tokens drawn for detaching (one draw per call)."""
        r, adv, valid = t.ratio, t.advantages, t.valid_bool
        # The tokens the PPO clip removes, decided exactly as veRL does (pg_losses2 > pg_losses1).
        clipped = (-adv * torch.clamp(r, 1.0 - self.eps_low, 1.0 + self.eps_high)) > (-adv * r)
        cov = token_covariance(t)
        candidates = valid & ~clipped & (cov > self.cov_low) & (cov < self.cov_high)
        # Host syncs (on a GPU, in every call): the candidates' number and the micro-batch's N size the
        # authors' draw, randperm(n)[:k] on the CPU generator, which the method reproduces exactly.
        where = torch.nonzero(candidates)  # row-major
        drawn = torch.zeros_like(t.valid)
        n = len(where)
        if n == 0:
            return drawn
        k = max(int(self.fraction * int(t.valid.sum())), 1)
        generator = None if self.seed is None else torch.Generator().manual_seed(self.seed)
        perm = torch.randperm(n, generator=generator)[: min(k, n)].to(where.device)
        chosen = where[perm]
        drawn[chosen[:, 0], chosen[:, 1]] = 1.0
        return drawn

    def evaluate(self, t: Tokens, weight: torch.Tensor, step=None) -> SurrogateResult:
        drawn = self.detached(t)
        result = clip_between(t, weight * (1.0 - drawn), 1.0 - self.eps_low, 1.0 + self.eps_high)
        result.counts["clip/cov_fraction"] = drawn.sum()
        return result

    def describe(self) -> str:
        seed = "torch's global generator" if self.seed is None else f"seed {self.seed}"
        return (
            f"clip_cov: l = max(-A r, -A clip(r, {1 - self.eps_low:g}, {1 + self.eps_high:g})), and l = 0 on "
            f"max(floor({self.fraction:g} N), 1) random tokens with {self.cov_low:g} < cov(A, log p) < {self.cov_high:g} "
            f"per micro-batch ({seed})"
        )
