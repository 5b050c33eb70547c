"""OpenRLHF's global counts become the step's denominators; the kept counts are those times the kept share."""

import pytest
import torch

import rlstab
from rlstab.adapters.openrlhf.counts import step_stats, with_trainer_counts
from rlstab.batch import TokenBatch

LOW_PROBABILITY = {"masks": [{"kind": "low_probability"}], "surrogate": {"kind": "none"}}


def objective(aggregation: str):
    return rlstab.load({**LOW_PROBABILITY, "aggregation": {"kind": aggregation, "count": "kept"}}).compile()


def micro_batch() -> TokenBatch:
    # Row 0: 3 valid tokens, the one with p = 0.001 (< tau_p 0.002, A > 0) silenced; row 1: 2 valid tokens.
    # Valid 5, kept 4; both responses keep a token; padded length 3.
    return TokenBatch(
        logprobs=torch.log(torch.tensor([[0.5, 0.001, 0.3], [0.5, 0.5, 1.0]])),
        response_mask=torch.tensor([[True, True, True], [True, True, False]]),
        advantages=torch.ones(2),
    )


def test_token_mean_takes_batch_num_tokens_and_dp_size_and_scales_the_kept_count():
    stats = step_stats(objective("token-mean"), micro_batch(), dp_size=2,
                       batch_num_tokens=torch.tensor(40.0), global_batch_size=torch.tensor(20.0))
    c = stats.counts
    # tokens: OpenRLHF's 40, kept 40 * 4/5 = 32; sequences: 20, kept 20 * 2/2 = 20
    assert (c.tokens_valid, c.tokens_kept) == (40.0, 32.0)
    assert (c.sequences_valid, c.sequences_kept) == (20.0, 20.0)
    assert (c.max_length, c.world_size) == (3, 2)


def test_without_the_count_the_aggregation_divides_by_the_micro_batch_is_its_own_step():
    compiled = objective("token-mean")
    own = step_stats(compiled, micro_batch(), dp_size=4, batch_num_tokens=None, global_batch_size=torch.tensor(20.0))
    c = own.counts
    # batch_num_tokens is None: the micro-batch's own counts (5 valid, 4 kept, 2 responses), dp_size left out
    assert (c.tokens_valid, c.tokens_kept, c.sequences_valid, c.world_size) == (5.0, 4.0, 2.0, 1)
    assert with_trainer_counts(compiled, own, 4, None, 20) is own


def test_a_sequence_mean_takes_global_batch_size():
    compiled = objective("seq-mean-token-mean")
    # the count a sequence mean divides by (global_batch_size) is None: unchanged, whatever batch_num_tokens says
    assert step_stats(compiled, micro_batch(), dp_size=2, batch_num_tokens=40.0).counts.tokens_valid == 5.0
    c = step_stats(compiled, micro_batch(), dp_size=2, batch_num_tokens=40.0, global_batch_size=8).counts
    # sequences 8, kept 8 * 2/2 = 8; tokens 40, kept 32
    assert (c.sequences_valid, c.sequences_kept, c.tokens_valid, c.tokens_kept, c.world_size) == (8.0, 8.0, 40.0, 32.0, 2)


@pytest.mark.parametrize("update_state, steps", [(False, 0), (True, 1)])
def test_stateful_components_advance_only_when_asked(update_state, steps):
    compiled = rlstab.load("bapo").compile()
    batch = TokenBatch(
        logprobs=torch.log(torch.tensor([[0.5, 0.4], [0.3, 0.2]])),
        response_mask=torch.ones(2, 2, dtype=torch.bool),
        old_logprobs=torch.log(torch.tensor([[0.4, 0.4], [0.3, 0.3]])),
        advantages=torch.tensor([1.0, -1.0]),
    )
    step_stats(compiled, batch, batch_num_tokens=4, update_state=update_state)
    assert compiled.state_dict()["surrogate (bapo)"]["steps"] == steps
