"""The step threshold of a counted mask (``random_silence``): an exact order statistic of its keys.

Over the step's candidates (every micro-batch and rank; n of them), the mask silences the m with the
smallest keys, m from its fraction of n or from the tokens of the candidates another mask silences
(``matched``). The cut is the (m+1)-th smallest key (0-based order statistic m, exact whatever the
objective's ``quantile_mode``), or +inf when m = n, so that ``key < cut`` holds for exactly m
candidates when their keys are distinct.

Host reads: the candidates' count (as every step quantile), and with ``match`` the matched count.
"""

from __future__ import annotations

import math
from typing import Any

from rlstab.comm import Comm
from rlstab.lazy import torch
from rlstab.quantile import Population
from rlstab.tokens import Tokens


def counted_threshold(mask: Any, tokens: list[Tokens], comm: Comm, matched: tuple[Any, Any] | None):
    """``(m, n, cut)`` as 0-d float32 tensors, or None for a step without candidates.

    ``matched``: ``(mask, its step threshold)`` whose silenced candidates fix m, or None (a fraction).
    """
    if not tokens:
        return None
    device = tokens[0].valid.device
    candidates = [mask.candidates(t) for t in tokens]
    matched_count = None
    if matched is not None:
        other, threshold = matched
        local = torch.zeros((), dtype=torch.float64, device=device)
        for t, c in zip(tokens, candidates):
            silenced = 1.0 - other.keep(t, threshold).expand_as(c)
            local = local + torch.dot(c.reshape(-1), silenced.reshape(-1)).to(torch.float64)
        matched_count = int(comm.sum(local))  # host read: the matched count fixes the order statistic
    population = Population([(mask.keys(t), c > 0) for t, c in zip(tokens, candidates)], comm)
    n = population.size
    if n == 0:
        return None
    m = mask.target(n, matched_count)
    cut = population.order_statistic(m, "exact") if m < n else torch.full((), math.inf, device=device)

    def value(x: int) -> torch.Tensor:
        return torch.full((), float(x), dtype=torch.float32, device=device)

    return value(m), value(n), cut.to(torch.float32)
