"""rlstab.advantages.given: the trainer's advantages, used as they are; their absence is an error, not a fallback."""

import pytest
import torch

import rlstab
from rlstab.advantages.given import Given
from rlstab.batch import BatchError, TokenBatch

# l = -A r summed over valid tokens, r = 1 (log p = old log p)
OBJECTIVE = {"surrogate": {"kind": "none"}, "aggregation": {"kind": "token-sum", "count": "valid"}}
LOGP = torch.tensor([[-1.0, -2.0], [-0.5, -3.0]])
MASK = torch.tensor([[True, True], [True, False]])


def loss(advantage: str, **fields) -> float:
    objective = rlstab.load({**OBJECTIVE, "advantage": {"kind": advantage}})
    batch = TokenBatch(logprobs=LOGP, old_logprobs=LOGP.clone(), response_mask=MASK, **fields)
    return objective.compile()(batch).loss.item()


def test_reads_the_advantages_only():
    assert Given().reads == frozenset({"advantages"})
    assert Given().describe() == "given: A = the advantages the trainer supplies"


def test_the_advantages_are_used_as_given():
    # L = -(3 + 3 + (-1)) = -5: row 0's A = 3 on its 2 tokens, row 1's A = -1 on its 1 token
    assert loss("given", advantages=torch.tensor([3.0, -1.0])) == pytest.approx(-5.0)


def test_rewards_are_ignored_when_advantages_are_given():
    # with grpo the rewards (1, 0) in one group would give A = (+0.707, -0.707); the given advantages win
    fields = {"advantages": torch.tensor([3.0, -1.0]), "rewards": torch.tensor([1.0, 0.0]), "group_ids": torch.tensor([0, 0])}
    for advantage in ("given", "grpo"):  # any estimator uses advantages present in the batch
        with pytest.warns(UserWarning, match=rf"the advantages take precedence, so the advantage estimator \({advantage}\)"):
            assert loss(advantage, **fields) == pytest.approx(-5.0)


def test_a_batch_without_advantages_is_refused_even_with_rewards():
    with pytest.raises(BatchError, match="advantages"):
        loss("given", rewards=torch.tensor([1.0, 0.0]), group_ids=torch.tensor([0, 0]))
