"""``rlstab.compiler.loss_phase``: one micro-batch's loss from the step's frozen statistics, worked out by hand.

The micro-batch: response_mask [[1, 1], [1, 0]] (3 valid tokens), on-policy (r = 1, inside every clip
interval), advantages A = [1, 2] per response. PPO's loss per token is then -A r = -A.
"""

import pytest
import torch

import rlstab
from rlstab.aggregation import StepCounts
from rlstab.batch import TokenBatch
from rlstab.compiler.loss_phase import LossPhase, LossTerms
from rlstab.compiler.step_stats import StepStats
from rlstab.tokens import Tokens

MASK = torch.tensor([[True, True], [True, False]])


def micro_batch(**fields):
    batch = TokenBatch(logprobs=torch.full((2, 2), -1.0).requires_grad_(), response_mask=MASK,
                       advantages=torch.tensor([1.0, 2.0]), **fields)
    t = Tokens.from_batch(batch, 20.0)
    t.set_advantages(batch.advantages)
    return batch, t


def step(valid=3, kept=3, hooks=(None,), branch=None):
    return StepStats(StepCounts(valid, kept, 2, 2, max_length=2, world_size=1), (), None, hooks, branch_counts=branch)


def test_token_mean_over_the_steps_valid_tokens():
    batch, t = micro_batch()
    terms = LossPhase(rlstab.load("grpo")).terms(batch, t, step(), t.valid)
    # L = sum_t (1/3) * (-A): -(1 + 1 + 2) / 3 = -4/3
    assert isinstance(terms, LossTerms)
    assert terms.loss.item() == pytest.approx(-4 / 3)
    assert terms.policy.item() == pytest.approx(-4 / 3)
    assert terms.n_kept.item() == 3.0 and terms.reweighted == [] and terms.regularisers == []


def test_the_gradient_is_the_closed_form_one():
    batch, t = micro_batch()
    LossPhase(rlstab.load("grpo")).terms(batch, t, step(), t.valid).loss.backward()
    # dL/dlogp = (1/3) * (-A) * r on valid tokens: row 0: -1/3, row 1: -2/3; padding 0.
    assert batch.logprobs.grad.flatten().tolist() == pytest.approx([-1 / 3, -1 / 3, -2 / 3, 0.0])


def test_the_denominator_is_the_steps_not_the_micro_batchs():
    batch, t = micro_batch()
    # The step has 6 valid tokens (another micro-batch holds 3): L = -(1 + 1 + 2) / 6 = -2/3.
    assert LossPhase(rlstab.load("grpo")).terms(batch, t, step(valid=6, kept=6), t.valid).loss.item() == pytest.approx(-2 / 3)


def test_only_kept_tokens_count_and_is_weights_multiply():
    batch, t = micro_batch(is_weights=torch.tensor([0.5, 1.0]))
    kept = torch.tensor([[0.0, 1.0], [1.0, 0.0]])  # a mask silences (0, 0)
    terms = LossPhase(rlstab.load("grpo")).terms(batch, t, step(), kept)
    # L = (1/3) * (-(0.5 * 1) - (1 * 2)) = -2.5 / 3
    assert terms.loss.item() == pytest.approx(-2.5 / 3)
    assert terms.n_kept.item() == 2.0


def test_regularisers_average_over_every_valid_token():
    objective = rlstab.load({"extends": "grpo", "aggregation": {"kind": "token-mean", "count": "kept"},
                             "regularisers": [{"kind": "entropy_bonus", "coef": 0.1}]})
    entropy = torch.tensor([[1.0, 2.0], [3.0, 4.0]], requires_grad=True)
    batch, t = micro_batch(entropy=entropy)
    kept = torch.tensor([[0.0, 1.0], [1.0, 0.0]])
    terms = LossPhase(objective).terms(batch, t, step(valid=3, kept=2, hooks=(None, None)), kept)
    # policy: count kept, -(1 * 1 + 2 * 1) / 2 = -1.5
    # entropy bonus: R = -H averaged over the 3 valid tokens (not the 2 kept): -(1 + 2 + 3) / 3 = -2; L += 0.1 * -2
    assert terms.policy.item() == pytest.approx(-1.5)
    assert [r.item() for r in terms.regularisers] == pytest.approx([-2.0])
    assert terms.loss.item() == pytest.approx(-1.7)


def test_dual_stream_gives_each_stream_its_own_denominator_the_branchs_times_lambda():
    objective = rlstab.load({"extends": "grpo", "dual_stream": {"kind": "dual-stream", "branch_weight": 0.25}})
    batch, t = micro_batch(is_branch=torch.tensor([False, True]))
    branch = StepCounts(1, 1, 1, 1, max_length=2, world_size=1)  # row 1, the branch row: 1 valid token
    terms = LossPhase(objective).terms(batch, t, step(branch=branch), t.valid)
    # main stream: 3 - 1 = 2 valid tokens, scale 1/2; branch: 0.25 * 1/1.
    # L = -(1 * 0.5 + 1 * 0.5) - 2 * 0.25 = -1.5
    assert terms.loss.item() == pytest.approx(-1.5)
