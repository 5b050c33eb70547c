"""The step threshold of a counted mask (``random_silence``): an exact order statistic of its keys.

Over the step's candidates (every micro-batch and rank; n of them), the mask silences the m with the
smallest keys, m from its fraction of n or from the tokens of the candidates another mask silences
(``matched``). The cut is the m-th smallest key (0-based order statistic m - 1, exact whatever the
objective's ``quantile_mode``): the candidates with ``key < cut`` (``below`` of them) are silenced,
and the ``tied`` candidates with ``key == cut`` share the remaining ``m - below``, each silenced by
``share = (m - below) / tied``. With distinct keys ``tied`` is 1 and ``share`` 1; with ties (identical
responses draw identical keys) the silenced mass is still exactly m. For m = 0 the cut is 0, below
every key (keys are positive), and nothing is silenced.

Host reads: the candidates' count (as every step quantile), and with ``match`` the matched count;
``below`` and ``tied`` stay on the device (one more sum across ranks).
"""

from __future__ import annotations

from typing import Any

from rlstab.comm import Comm
from rlstab.lazy import torch
from rlstab.quantile import Population
from rlstab.tokens import Tokens


def counted_threshold(mask: Any, tokens: list[Tokens], comm: Comm, matched: tuple[Any, Any] | None):
    """``(m, n, cut, share)`` as 0-d float32 tensors, or None for a step without candidates.

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
    chunks = [(mask.keys(t), c > 0) for t, c in zip(tokens, candidates)]
    population = Population(chunks, comm)
    n = population.size
    if n == 0:
        return None
    m = mask.target(n, matched_count)

    def value(x: int) -> torch.Tensor:
        return torch.full((), float(x), dtype=torch.float32, device=device)

    if m == 0:
        return value(0), value(n), value(0), value(0)
    cut = population.order_statistic(m - 1, "exact").to(torch.float32)
    local = torch.zeros(2, dtype=torch.float64, device=device)
    for keys, include in chunks:
        local = local + torch.stack([(include & (keys < cut)).sum(), (include & (keys == cut)).sum()]).to(torch.float64)
    below, tied = comm.sum(local).unbind()  # tied >= 1: the cut is a candidate's key
    share = ((m - below) / tied).to(torch.float32)
    return value(m), value(n), cut, share
