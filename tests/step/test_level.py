"""``rlstab.step.level``: the step-level decisions (dropped groups, the learning-rate scale) and how they apply.

The batch: three responses, group ids [0, 0, 1], lengths 2, 6, 3 tokens (T = 6).
"""

from types import SimpleNamespace

import pytest
import torch

import rlstab
from rlstab.batch import BatchError, TokenBatch
from rlstab.comm import Comm
from rlstab.step.level import StepLevel, fit_step_level, shaped_rewards
from rlstab.tokens import Tokens

LOCAL = Comm(distributed=False)
LENGTHS = torch.tensor([2, 6, 3])
MASK = torch.arange(6) < LENGTHS[:, None]


def batch(rewards, **fields):
    return TokenBatch(logprobs=torch.full((3, 6), -1.0), response_mask=MASK, rewards=torch.tensor(rewards),
                      group_ids=torch.tensor([0, 0, 1]), **fields)


def test_shaped_rewards_add_every_shaping_term():
    plain = rlstab.load("grpo")
    assert shaped_rewards(plain, batch([1.0, 1.0, 0.0])).tolist() == [1.0, 1.0, 0.0]
    overlong = rlstab.load({"extends": "grpo", "reward_shaping": [{"kind": "overlong", "max_length": 8, "buffer": 4}]})
    # DAPO's overlong penalty: none up to 8 - 4 = 4 tokens, then -(|y| - 4) / 4: length 6 -> -0.5
    assert shaped_rewards(overlong, batch([1.0, 1.0, 0.0])).tolist() == [1.0, 0.5, 0.0]


def test_kept_rows_are_those_outside_the_dropped_groups():
    b = batch([1.0, 1.0, 0.0])
    assert StepLevel().kept_rows(b) is None
    assert StepLevel(dropped_groups=torch.tensor([], dtype=torch.int64)).kept_rows(b) is None
    assert StepLevel(dropped_groups=torch.tensor([0])).kept_rows(b).tolist() == [False, False, True]


def test_restrict_and_response_tokens_turn_the_dropped_responses_into_padding():
    level = StepLevel(dropped_groups=torch.tensor([1]))
    b = batch([1.0, 1.0, 0.0])
    t = Tokens.from_batch(b, 20.0)
    level.restrict(t)
    # row 2 (group 1) becomes padding: valid tokens 2, 6, 0
    assert t.valid.sum(-1).tolist() == [2.0, 6.0, 0.0] and t.valid_bool.sum(-1).tolist() == [2, 6, 0]
    assert level.response_tokens(b).sum(-1).tolist() == [2.0, 6.0, 0.0]
    assert StepLevel().response_tokens(b).sum(-1).tolist() == [2.0, 6.0, 3.0]


def test_metrics_report_what_the_objective_has():
    level = StepLevel(dropped_groups=torch.tensor([0]), groups=2, lr_scale=0.5, ess=3.0, responses=4)
    assert level.metrics(SimpleNamespace(group_filter=None, lr_scale=None)) == {}
    # 1 of 2 groups dropped; ESS 3 of 4 responses
    assert level.metrics(SimpleNamespace(group_filter=object(), lr_scale=object())) == {
        "step/groups_dropped": 1.0, "step/groups_dropped_fraction": 0.5,
        "step/lr_scale": 0.5, "step/ess": 3.0, "step/ess_fraction": 0.75,
    }


def test_dynamic_sampling_drops_the_groups_with_equal_rewards_over_the_step():
    objective = rlstab.load({"extends": "grpo", "group_filter": {"kind": "dynamic_sampling"}})
    # Group 0: rewards 1 (mb 1, rows 0 and 1) and 1 (mb 2, row 0): all equal -> dropped.
    # Group 1: 0 (mb 1, row 2) and 1 (mb 2, row 2): kept. It has one response in each micro-batch: only the step
    # sees it as a group of two.
    first = Tokens.from_batch(batch([1.0, 1.0, 0.0]), 20.0)
    second = Tokens.from_batch(batch([1.0, 1.0, 1.0]), 20.0)
    level = fit_step_level(objective, [first, second], LOCAL)
    assert level.dropped_groups.tolist() == [0] and level.groups == 2 and level.lr_scale == 1.0
    assert first.valid.sum(-1).tolist() == [0.0, 0.0, 3.0] and second.valid.sum(-1).tolist() == [0.0, 0.0, 3.0]


def test_without_step_level_components_nothing_changes():
    t = Tokens.from_batch(batch([1.0, 1.0, 0.0]), 20.0)
    level = fit_step_level(rlstab.load("grpo"), [t], LOCAL)
    assert level == StepLevel() and t.valid.sum().item() == 11.0  # 2 + 6 + 3


def test_reward_shaping_refuses_batches_with_advantages():
    objective = rlstab.load({"extends": "grpo", "reward_shaping": [{"kind": "overlong"}]})
    t = Tokens.from_batch(batch([1.0, 1.0, 0.0], advantages=torch.ones(3)), 20.0)
    with pytest.raises(BatchError, match=r"reward_shaping \(overlong\) shapes the rewards .* drop advantages"):
        fit_step_level(objective, [t], LOCAL)
