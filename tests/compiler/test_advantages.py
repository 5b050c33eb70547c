"""``rlstab.compiler.advantages``: the estimator fitted once over the whole step, or the batches' own advantages."""

import pytest
import torch

import rlstab
from rlstab.aggregation import StepCounts
from rlstab.batch import BatchError, TokenBatch
from rlstab.comm import Comm
from rlstab.compiler.advantages import (
    fit_step_advantages,
    group_ids_of,
    responses,
    set_micro_batch_advantages,
    step_values,
)
from rlstab.compiler.step_stats import StepStats
from rlstab.tokens import Tokens

LOCAL = Comm(distributed=False)
# Dr.GRPO's estimator: A_i = r_i - mean of its group's rewards (no std normalisation).
DR_GRPO = rlstab.load({"extends": "grpo", "advantage": {"kind": "grpo", "normalize_std": False}})


def tokens(rewards=None, group_ids=None, advantages=None, mask=((True, True), (True, False))):
    mask = torch.tensor(mask)
    batch = TokenBatch(
        logprobs=torch.full(mask.shape, -0.5), response_mask=mask, advantages=advantages,
        rewards=None if rewards is None else torch.tensor(rewards),
        group_ids=None if group_ids is None else torch.tensor(group_ids),
    )
    return Tokens.from_batch(batch, 20.0)


def stats(advantage):
    return StepStats(StepCounts(3, 3, 2, 2, max_length=2, world_size=1), (), advantage)


def test_the_estimator_is_fitted_over_every_micro_batch_of_the_step():
    # Each micro-batch holds one response of each group: alone, every group is a singleton (A = 0).
    # Over the step: group 0 has rewards 1 (mb 1) and 0 (mb 2), mean 0.5 -> A = +0.5, -0.5;
    #                group 1 has rewards 0 (mb 1) and 1 (mb 2), mean 0.5 -> A = -0.5, +0.5.
    first, second = tokens([1.0, 0.0], [0, 1]), tokens([0.0, 1.0], [0, 1])
    state = fit_step_advantages(DR_GRPO, [first, second], LOCAL)
    assert state is not None
    assert first.advantage_per_response.tolist() == [0.5, -0.5]
    assert second.advantage_per_response.tolist() == [-0.5, 0.5]


def test_a_padding_row_leaves_its_group():
    # Row 2 has no response token: group 0 is rows 0 and 1 only, rewards 1 and 0 -> A = +0.5, -0.5.
    # Counted with its reward 1, the mean would be 2/3 and row 0's A 1/3.
    t = tokens([1.0, 0.0, 1.0], [0, 0, 0], mask=((True, True), (True, False), (False, False)))
    fit_step_advantages(DR_GRPO, [t], LOCAL)
    assert t.advantage_per_response[:2].tolist() == [0.5, -0.5]


def test_batches_with_advantages_are_trained_on_them_and_fit_nothing():
    t = tokens(advantages=torch.tensor([2.0, -1.0]))
    assert fit_step_advantages(DR_GRPO, [t], LOCAL) is None
    assert t.advantage_per_response.tolist() == [2.0, -1.0]


def test_a_step_of_batches_with_and_without_advantages_is_refused():
    with_, without = tokens(advantages=torch.tensor([2.0, -1.0])), tokens([1.0, 0.0], [0, 0])
    with pytest.raises(BatchError, match="some micro-batches of the step carry advantages and others do not"):
        fit_step_advantages(DR_GRPO, [with_, without], LOCAL)


def test_a_micro_batch_takes_the_fitted_state_of_its_step():
    # The step: rewards 1, 0 in group 0 -> mean 0.5; a later micro-batch of that step with rewards 0, 1
    # in group 0 is judged against the step's mean: A = 0 - 0.5, 1 - 0.5.
    state = fit_step_advantages(DR_GRPO, [tokens([1.0, 0.0], [0, 0])], LOCAL)
    later = tokens([0.0, 1.0], [0, 0])
    set_micro_batch_advantages(DR_GRPO, later, stats(state))
    assert later.advantage_per_response.tolist() == [-0.5, 0.5]


def test_a_micro_batch_must_match_how_its_step_got_its_advantages():
    state = fit_step_advantages(DR_GRPO, [tokens([1.0, 0.0], [0, 0])], LOCAL)
    with pytest.raises(BatchError, match="the step's advantages were estimated, but this micro-batch carries its own"):
        set_micro_batch_advantages(DR_GRPO, tokens([1.0, 0.0], [0, 0], advantages=torch.ones(2)), stats(state))
    with pytest.raises(BatchError, match="the step was gathered from batches with advantages; this one has none"):
        set_micro_batch_advantages(DR_GRPO, tokens([1.0, 0.0], [0, 0]), stats(None))
    given = tokens(advantages=torch.tensor([3.0, 4.0]))
    set_micro_batch_advantages(DR_GRPO, given, stats(None))
    assert given.advantage_per_response.tolist() == [3.0, 4.0]


def test_step_values_concatenate_responses_and_pad_token_values_on_the_right():
    assert step_values([torch.tensor([1.0, 2.0]), torch.tensor([3.0])], LOCAL, 3).tolist() == [1.0, 2.0, 3.0]
    # [1, 2] and [1, 3] values: the step's width is 3, the first padded with a zero on the right.
    out = step_values([torch.tensor([[1.0, 2.0]]), torch.tensor([[3.0, 4.0, 5.0]])], LOCAL, 2)
    assert out.tolist() == [[1.0, 2.0, 0.0], [3.0, 4.0, 5.0]]


def test_responses_are_the_rows_with_a_response_token_and_group_ids_are_contiguous_int64():
    t = tokens([1.0, 0.0, 1.0], [0, 0, 0], mask=((True, False), (False, False), (False, True)))
    assert responses(t.batch).tolist() == [True, False, True]
    strided = torch.tensor([5, 6, 7, 8, 9, 10], dtype=torch.int32)[::2]  # every other id: 5, 7, 9, stride 2
    batch = TokenBatch(logprobs=torch.zeros(3, 1), response_mask=torch.ones(3, 1, dtype=torch.bool),
                       rewards=torch.zeros(3), group_ids=strided)
    ids = group_ids_of(batch)
    assert ids.dtype == torch.int64 and ids.is_contiguous() and ids.tolist() == [5, 7, 9]
