"""``rlstab.compiler.inputs``: a batch checked against what the objective reads, and its tokens."""

import warnings

import pytest
import torch

import rlstab
from rlstab.batch import BatchError, TokenBatch
from rlstab.compiler.inputs import Inputs
from rlstab.compiler.plan import Plan

MASK = torch.tensor([[True, True], [True, False]])


def inputs_of(objective):
    return Inputs(objective, Plan.of(objective))


def batch(**fields):
    return TokenBatch(logprobs=torch.full((2, 2), -1.0), response_mask=MASK, **fields)


def test_something_else_than_a_token_batch_is_refused():
    with pytest.raises(BatchError, match="expected an rlstab.TokenBatch, got dict"):
        inputs_of(rlstab.load("grpo")).check({"logprobs": None})


def test_a_field_a_component_reads_must_be_there():
    # stapo's S2T mask reads the entropy.
    with pytest.raises(BatchError, match=r"masks\[0\] \(s2t\) reads TokenBatch.entropy, which this batch does not carry"):
        inputs_of(rlstab.load("stapo")).check(batch(advantages=torch.ones(2)))


def test_without_advantages_the_estimator_needs_its_inputs():
    given = rlstab.load({"extends": "grpo", "advantage": {"kind": "given"}})
    with pytest.raises(BatchError, match=r"advantage \(given\) needs TokenBatch.advantages"):
        inputs_of(given).check(batch(rewards=torch.ones(2), group_ids=torch.zeros(2, dtype=torch.long)))
    with pytest.raises(BatchError, match=r"advantage \(grpo\): the batch has no advantages, and estimating them needs "
                                         r"TokenBatch.group_ids, which it does not carry"):
        inputs_of(rlstab.load("grpo")).check(batch(rewards=torch.ones(2)))


def test_rewards_beside_advantages_warn_once_per_objective():
    inputs = inputs_of(rlstab.load("grpo"))
    both = batch(advantages=torch.ones(2), rewards=torch.ones(2), group_ids=torch.zeros(2, dtype=torch.long))
    with pytest.warns(UserWarning, match="the batch carries both advantages and rewards"):
        inputs.check(both)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        inputs.check(both)  # the second time: silent


def test_checked_fields_follow_the_optional_fields_of_the_batch():
    inputs = inputs_of(rlstab.load("grpo"))  # grpo's components read no optional field
    assert inputs.checked_fields(batch(advantages=torch.ones(2))) == ["logprobs", "advantages"]
    with_all = batch(old_logprobs=torch.full((2, 2), -1.0), rewards=torch.ones(2), group_ids=torch.zeros(2, dtype=torch.long),
                     is_weights=torch.ones(2), entropy=torch.ones(2, 2))
    # Without advantages the rewards are checked instead; entropy is reported (entropy/mean), so it is checked too.
    assert inputs.checked_fields(with_all) == ["logprobs", "old_logprobs", "rewards", "is_weights", "entropy"]


def test_tokens_make_rejected_tokens_padding():
    # A rollout mask with rejected: padding, k = pi_old / pi_infer in [0.5, 5]:
    # token (0, 1) has log k = -1 - (-4) = 3, k = e^3 ~ 20.1 > 5: rejected; the others k = 1.
    objective = rlstab.load({"extends": "grpo", "masks": [{"kind": "icepop", "low": 0.5, "high": 5.0, "rejected": "padding"}]})
    rollout = torch.full((2, 2), -1.0)
    rollout[0, 1] = -4.0
    t = inputs_of(objective).tokens(batch(advantages=torch.ones(2), old_logprobs=torch.full((2, 2), -1.0),
                                          rollout_logprobs=rollout))
    assert t.valid.tolist() == [[1.0, 0.0], [1.0, 0.0]]
    assert t.valid_bool.tolist() == [[True, False], [True, False]]
