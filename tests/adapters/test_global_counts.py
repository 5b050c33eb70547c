"""A trainer's counts as the step's denominators: the trainer's valid counts, the gathered shares."""

import pytest
import torch

import rlstab
from rlstab.adapters.global_counts import Counted, counted, with_global_counts
from rlstab.aggregation import StepCounts
from rlstab.compiled import StepStats

REJECTION = {"kind": "rollout_rejection", "level": "token", "divergence": "k1", "high": 2.0, "rejected": "padding"}


def gathered(tokens_valid, tokens_kept, sequences_valid, sequences_kept) -> StepStats:
    return StepStats(StepCounts(tokens_valid, tokens_kept, sequences_valid, sequences_kept, 5, 1), (), None)


def test_valid_counts_are_the_trainers_and_kept_counts_its_share():
    counts = with_global_counts(gathered(10, 5, 4, 2), tokens=40, sequences=16, max_length=7, world_size=2).counts
    assert counts == StepCounts(40, 20, 16, 8, 7, 2)


def test_without_a_trainer_count_the_gathered_one_stays():
    counts = with_global_counts(gathered(10, 5, 4, 2), tokens=None, sequences=16, max_length=7, world_size=2).counts
    assert (counts.tokens_valid, counts.tokens_kept) == (10, 5)


def test_a_rejection_into_padding_shares_the_valid_counts_over_what_the_trainer_counts():
    # 12 response tokens in 4 responses were gathered; rejection left 10 tokens in 3 responses, 5 of them kept
    scope = Counted(tokens=12, sequences=4, rejects=True)
    counts = with_global_counts(gathered(10, 5, 3, 2), tokens=48, sequences=16, max_length=7, world_size=2,
                                counted=scope).counts
    assert counts == StepCounts(40, 20, 12, 8, 7, 2)


def test_counted_counts_response_tokens_only_for_an_objective_that_rejects_into_padding():
    batch = rlstab.TokenBatch(logprobs=torch.zeros(2, 3), old_logprobs=torch.zeros(2, 3), advantages=torch.ones(2),
                              response_mask=torch.tensor([[True, True, False], [False, False, False]]),
                              rollout_logprobs=torch.zeros(2, 3))
    assert counted(rlstab.load("grpo").compile(), [batch]) is None
    rejecting = rlstab.load({"extends": "grpo", "masks": [REJECTION]}).compile()
    assert counted(rejecting, [batch]) == Counted(tokens=pytest.approx(2.0), sequences=pytest.approx(1.0), rejects=True)
