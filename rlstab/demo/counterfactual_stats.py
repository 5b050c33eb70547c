"""The counterfactual audit's hand-checkable pieces: the token sets it silences, its exact p-values, their combination
over states, and the first-order entropy prediction.

Nothing here trains or samples (``rlstab.demo.counterfactual`` does); each function is a formula.

**Count-matched random sets** (:func:`random_sets`): ``K`` sets of ``m`` distinct tokens each, drawn uniformly
without replacement among the positive-advantage tokens (``torch.randperm`` of a ``torch.Generator`` seeded by the
caller). A generator rather than ``random_silence``'s hash keys: the keys of identical responses are identical
(issue 39), so a cut at the m-th key can silence fewer than m tokens; a permutation has exactly m by construction,
and its draws are independent of each other and of the responses' content.

**The probability-only set** (:func:`lowest_probability_set`): the m positive-advantage tokens of lowest
probability. ``stapo-probability-only``'s rule (A > 0 and p < tau_p) cut to the same count is this same set
whenever its rule catches at least m tokens: the m lowest-probability tokens of those below tau_p are the m
lowest of all.

**The exact p-value** (:func:`exact_p_value`), two-sided: with the mask's value ``x_0`` and the K null values
``x_1..x_K``, and ``c`` the median of all K + 1 of them,

    p = (1 + #{k >= 1 : |x_k - c| >= |x_0 - c|}) / (K + 1).

Under the null hypothesis that the mask's tokens are as good as any count-matched random set of
positive-advantage tokens, the K + 1 values are exchangeable; ``c`` is a symmetric function of all of them, so the
mask's distance from it is as likely to hold any rank among the K + 1 distances, and ``P(p <= a) <= a`` exactly
(ties count against the mask: conservative). Two-sided because neither the paper nor the issue fixes a direction
for every measure: STAPO says silencing spurious tokens steadies entropy, the first-order formula below predicts
its sign per state, and the sign is what is in question (docs/audit.md).

**The one-sided p-value** (:func:`upper_p_value`), for ``rlstab audit --mechanism --from``'s gradient shares, where
the claim has a direction (STAPO: the mask's few tokens carry an outsized share of the update):
``p = (1 + #{k : x_k >= x_0}) / (K + 1)``, exact under the same exchangeability.

**Combining states** (:func:`fisher`): Fisher's method, ``X = -2 sum_s ln p_s`` over the S states where the mask
silenced a token, against chi-squared with 2S degrees of freedom,

    P(X' >= X) = exp(-X/2) sum_{i=0}^{S-1} (X/2)^i / i!.

Each state's p is valid on its own and the states' null draws are independent, so the p-values are independent
valid p-values under the null; with discrete p-values (multiples of 1/(K+1)) the chi-squared tail is conservative.
Fisher's needs no direction either (a mask that moves entropy up in one state and down in another still counts as
acting), and it has a closed form one can check by hand. Holm (``rlstab.lab.statistics.holm``) then adjusts the
combined p-values over the audit's measures.

**The first-order prediction** (:func:`silenced_covariance`): issue 39 states STAPO's (arXiv 2602.15620)
first-order reading of a policy-gradient step, ``Delta H ~= -eta Cov(log pi, A)`` over the step's tokens. The
project's reference sheet does not hold the equation; the formula is Cui et al.'s ("The Entropy Mechanism of RL
for Reasoning LMs", arXiv 2505.22617) for a natural-policy-gradient step of size eta on a softmax policy, where the
covariance runs over the actions at one state; here, as in the issue and in Clip-Cov, over the update's tokens. Over the update's N valid tokens, with means over all of them,
Cov = (1/N) sum_t (log pi_t - mean log pi)(A_t - mean A); silencing a set S removes its terms, so the predicted
change of Delta H from silencing S is ``+eta * c_S`` with

    c_S = (1/N) sum_{t in S} (log pi_t - mean log pi)(A_t - mean A),

whose sign is the prediction (the same centring as Clip-Cov's ``rlstab.clipping.covariance``). A spurious token
(A > 0, log pi far below the mean) has c_t < 0: silencing it is predicted to *lower* the entropy change.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from rlstab.lazy import torch


def random_sets(candidates: torch.Tensor, m: int, draws: int, generator: torch.Generator) -> list[torch.Tensor]:
    """``draws`` sets of ``m`` distinct candidates each (flat indices, sorted), uniformly without replacement.

    ``candidates``: ``[n]`` flat indices of the positive-advantage tokens. ``m`` is at most ``n``.
    """
    n = int(candidates.numel())
    if not 0 <= m <= n:
        raise ValueError(f"cannot draw {m} of {n} candidates")
    return [candidates[torch.randperm(n, generator=generator)[:m]].sort().values for _ in range(draws)]


def lowest_probability_set(logprobs: torch.Tensor, candidates: torch.Tensor, m: int) -> torch.Tensor:
    """The ``m`` candidates (flat indices, sorted) of lowest log-probability; ties go to the earlier index.

    ``logprobs``: ``[N*T]`` flat log-probabilities; ``candidates``: flat indices of the positive-advantage tokens.
    """
    order = torch.sort(logprobs[candidates], stable=True).indices[:m]
    return candidates[order].sort().values


def exact_p_value(observed: float, null: Sequence[float]) -> float:
    """Two-sided exact p of ``observed`` against its ``null`` draws: ``(1 + #{|x_k - c| >= |x_0 - c|}) / (K + 1)``,
    ``c`` the median of all K + 1 values (the mean of the two middle ones for an even count)."""
    values = sorted([observed, *null])
    n = len(values)
    centre = values[n // 2] if n % 2 else (values[n // 2 - 1] + values[n // 2]) / 2
    distance = abs(observed - centre)
    return (1 + sum(abs(x - centre) >= distance for x in null)) / (len(null) + 1)


def upper_p_value(observed: float, null: Sequence[float]) -> float:
    """One-sided exact p of ``observed`` against its ``null`` draws, large values counting as extreme:
    ``(1 + #{k : x_k >= x_0}) / (K + 1)`` (ties count against the observed value: conservative)."""
    return (1 + sum(x >= observed for x in null)) / (len(null) + 1)


def rank(observed: float, null: Sequence[float]) -> float:
    """The mask's mid-rank among the K + 1 values, from the lowest (1) to the highest (K + 1)."""
    below = sum(x < observed for x in null)
    ties = sum(x == observed for x in null)
    return 1 + below + ties / 2


def fisher(pvalues: Sequence[float]) -> tuple[float, float] | tuple[None, None]:
    """Fisher's combination ``(X, p)``: ``X = -2 sum ln p_s``, ``p = exp(-X/2) sum_{i<S} (X/2)^i / i!``;
    ``(None, None)`` without any p-value."""
    if not pvalues:
        return None, None
    x = -2.0 * sum(math.log(p) for p in pvalues)
    half = x / 2
    term, total = 1.0, 1.0
    for i in range(1, len(pvalues)):
        term *= half / i
        total += term
    return x, min(1.0, math.exp(-half) * total)


def silenced_covariance(logprobs: torch.Tensor, advantages: torch.Tensor, valid: torch.Tensor,
                        silenced: torch.Tensor) -> float:
    """``c_S = (1/N) sum_{t in S} (log pi_t - mean log pi)(A_t - mean A)``, means over the ``N`` valid tokens.

    ``logprobs``, ``advantages`` (per token), ``valid`` and ``silenced`` (bool) are ``[N, T]`` (or flat), in float64.
    """
    valid = valid.bool()
    lp = logprobs.double()[valid]
    adv = advantages.double()[valid]
    n = lp.numel()
    if n == 0:
        return 0.0
    products = (lp - lp.mean()) * (adv - adv.mean())
    return float(products[silenced.bool()[valid]].sum() / n)


def sign(x: float) -> int:
    """-1, 0 or +1."""
    return (x > 0) - (x < 0)
