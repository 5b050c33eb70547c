"""GTPO's entropy filter (mask ``gtpo_entropy_filter``), hand-computed."""

from __future__ import annotations

import math

import torch

import rlstab
from rlstab import TokenBatch


def test_responses_above_the_bound_are_silenced_and_stay_in_the_denominators():
    # Mean entropies over the valid tokens: row 0 (0.2 + 0.4) / 2 = 0.3 <= ln 2, kept; row 1 (0.9 + 0.7 + 0.8) / 3
    # = 0.8 > ln 2, silenced; row 2 exactly 0.5 on its one valid token (its padding's 9.0 is not read), kept;
    # row 3 = ln 2 itself (<=, as the authors' ``entropies <= ENT_THRESHOLD``), kept.
    entropy = torch.tensor([[0.2, 0.4, 5.0], [0.9, 0.7, 0.8], [0.5, 9.0, 9.0], [math.log(2.0)] * 3])
    mask = torch.tensor([[1, 1, 0], [1, 1, 1], [1, 0, 0], [1, 1, 1]], dtype=torch.bool)
    loss_fn = rlstab.load({"extends": "gtpo", "reweighters": [], "advantage": {"kind": "given"}}).compile()
    keeps = loss_fn.mask_keeps(TokenBatch(logprobs=torch.zeros(4, 3), response_mask=mask, entropy=entropy,
                                          advantages=torch.ones(4)))
    assert keeps["gtpo_entropy_filter"].tolist() == [[1, 1, 0], [0, 0, 0], [1, 0, 0], [1, 1, 1]]
    # seq-mean-token-mean over valid tokens: l = -A r = -1 per token (on-policy), rows 0, 2 and 3 kept: each kept
    # row's mean is -1, row 1's 0; over the S = 4 valid responses: (-1 + 0 - 1 - 1) / 4 = -0.75.
    out = loss_fn(TokenBatch(logprobs=torch.zeros(4, 3), response_mask=mask, entropy=entropy,
                             advantages=torch.ones(4)))
    assert float(out.loss) == -0.75
    assert out.metrics["mask/gtpo_entropy_filter/kept"] == 6.0
