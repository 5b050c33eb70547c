"""GTPO's advantage (estimator ``gtpo``), hand-computed."""

from __future__ import annotations

import pytest
import torch

import rlstab
from rlstab import TokenBatch
from rlstab.compiler.advantages import set_micro_batch_advantages


def advantages(spec: dict, batches: list[TokenBatch]) -> list[torch.Tensor]:
    loss_fn = rlstab.load({"extends": "gtpo", "advantage": spec, "masks": [], "reweighters": []}).compile()
    step = loss_fn.gather(batches)
    out = []
    for b in batches:
        t = loss_fn._inputs.tokens(b)
        set_micro_batch_advantages(loss_fn.objective, t, step)
        out.append(t.advantage_per_response)
    return out


def batch(rows) -> TokenBatch:
    # Group 0: rewards 1, 0, 0 (mean 1/3); group 1: rewards 1, 1 (mean 1). Mean entropies over the valid tokens:
    # 0.5, (0.2 + 0.4) / 2 = 0.3, 1.0, 0.0, 0.6 (padding's 7.0 not read).
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0])
    groups = torch.tensor([0, 0, 0, 1, 1])
    entropy = torch.tensor([[0.5, 0.5], [0.2, 0.4], [1.0, 7.0], [0.0, 0.0], [0.6, 7.0]])
    mask = torch.tensor([[1, 1], [1, 1], [1, 0], [1, 1], [1, 0]], dtype=torch.bool)
    r = torch.tensor(rows)
    return TokenBatch(logprobs=torch.zeros(len(rows), 2), response_mask=mask[r], entropy=entropy[r],
                      rewards=rewards[r], group_ids=groups[r])


# A_i = R_i - mean_g R - 0.1 <H>_i: 1 - 1/3 - 0.05, 0 - 1/3 - 0.03, 0 - 1/3 - 0.1, 1 - 1 - 0, 1 - 1 - 0.06
EXPECTED = [2 / 3 - 0.05, -1 / 3 - 0.03, -1 / 3 - 0.1, 0.0, -0.06]


def test_the_hand_computed_case():
    (got,) = advantages({"kind": "gtpo"}, [batch(range(5))])
    assert got.tolist() == pytest.approx(EXPECTED, abs=1e-7)


def test_a_group_split_across_micro_batches():
    got = advantages({"kind": "gtpo"}, [batch([0, 3]), batch([1, 4]), batch([2])])
    assert torch.cat(got).tolist() == pytest.approx([EXPECTED[i] for i in (0, 3, 1, 4, 2)], abs=1e-7)


def test_with_the_groups_std():
    # group 0's unbiased std: sqrt(((2/3)^2 + 2 (1/3)^2) / 2) = sqrt(1/3); group 1's 0 (eps 1e-6 keeps 0 / eps = 0)
    (got,) = advantages({"kind": "gtpo", "normalize_std": True}, [batch(range(5))])
    s = (1 / 3) ** 0.5 + 1e-6
    assert got.tolist() == pytest.approx([2 / 3 / s - 0.05, -1 / 3 / s - 0.03, -1 / 3 / s - 0.1, 0.0, -0.06], abs=1e-6)
