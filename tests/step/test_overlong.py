"""DAPO's overlong reward shaping, hand-computed."""

import pytest
import torch

import rlstab
from rlstab.step import overlong_penalty


def test_penalty_ramps_over_the_buffer():
    # L_max 20480, L_buf 4096: no penalty up to 16384, then -(|y| - 16384) / 4096: 18432 -> -0.5, 20480 -> -1
    lengths = torch.tensor([10, 16384, 18432, 20480, 20481])
    out = overlong_penalty(lengths)
    assert out.tolist() == pytest.approx([0.0, 0.0, -0.5, -1.0, -4097 / 4096])  # not floored, as veRL
    assert overlong_penalty(lengths, penalty_factor=2.0).tolist()[2:4] == pytest.approx([-1.0, -2.0])


def test_shaped_rewards_feed_the_estimator():
    # One group of three correct responses (R = 1) of 2, 6 and 8 tokens; L_max 8, L_buf 4: penalties 0, -0.5, -1.
    # Shaped R = 1, 0.5, 0: GRPO mean 0.5, std 0.5: A = 1, 0, -1 (eps 1e-6 aside).
    # surrogate none, r = 1, token-sum of -A: row 0: -1 * 2; row 1: 0; row 2: +1 * 8 -> 6
    mask = torch.arange(8) < torch.tensor([[2], [6], [8]])
    b = rlstab.TokenBatch(logprobs=torch.zeros(3, 8), response_mask=mask, rewards=torch.ones(3),
                          group_ids=torch.zeros(3, dtype=torch.long))
    objective = rlstab.load({"surrogate": {"kind": "none"}, "aggregation": {"kind": "token-sum", "count": "valid"},
                             "reward_shaping": [{"kind": "overlong", "max_length": 8, "buffer": 4}]})
    out = objective.compile()(b)
    assert out.loss.item() == pytest.approx(6.0, rel=1e-5)
    # and through the step API, in two micro-batches
    loss_fn = objective.compile()
    parts = [rlstab.TokenBatch(logprobs=torch.zeros(n, 8), response_mask=mask[s], rewards=torch.ones(n),
                               group_ids=torch.zeros(n, dtype=torch.long)) for s, n in ((slice(0, 1), 1), (slice(1, 3), 2))]
    stats = loss_fn.gather(parts)
    assert sum(loss_fn(p, step=stats).loss.item() for p in parts) == pytest.approx(6.0, rel=1e-5)


def test_shaping_refuses_a_batch_with_advantages():
    objective = rlstab.load({"extends": "dapo", "reward_shaping": [{"kind": "overlong"}]})
    b = rlstab.TokenBatch(logprobs=torch.zeros(1, 2), response_mask=torch.ones(1, 2, dtype=torch.bool),
                          advantages=torch.ones(1), rewards=torch.ones(1))
    with pytest.raises(rlstab.BatchError, match=r"reward_shaping \(overlong\) .* the batch carries advantages"):
        objective.compile()(b)


def test_shaping_needs_rewards():
    objective = rlstab.load({"extends": "dapo", "reward_shaping": [{"kind": "overlong"}]})
    b = rlstab.TokenBatch(logprobs=torch.zeros(1, 2), response_mask=torch.ones(1, 2, dtype=torch.bool),
                          advantages=torch.ones(1))
    with pytest.raises(rlstab.BatchError, match=r"reward_shaping\[0\] \(overlong\) reads TokenBatch\.rewards"):
        objective.compile()(b)


@pytest.mark.parametrize(
    "shaping, message",
    [
        ({"kind": "overlong", "max_length": 100, "buffer": 200}, r"buffer \(200\) must not exceed max_length \(100\)"),
        ({"kind": "overlong", "buffer": 0}, r"reward_shaping\[0\]\.buffer = 0"),
        ({"kind": "overlong", "max_length": 1.5}, r"reward_shaping\[0\]\.max_length = 1\.5"),
        ({"kind": "length"}, r"reward_shaping\[0\]\.kind = 'length'"),
    ],
)
def test_bad_fields_are_refused_with_their_path(shaping, message):
    with pytest.raises(rlstab.ConfigError, match=message):
        rlstab.load({"extends": "dapo", "reward_shaping": [shaping]})
