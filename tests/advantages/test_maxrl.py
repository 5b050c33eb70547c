"""MaxRL's advantage on hand-computed rewards (the authors' p_normalization), its options, odd inputs and metrics."""

import math

import pytest
import torch

import rlstab
from rlstab.advantages.maxrl import MaxRL

# groups: 1 = one success of four; 2 = all succeed; 3 = all fail; 4 = a single response; 5 = two of three succeed
REWARDS = torch.tensor([1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 0.0])
GROUPS = torch.tensor([1, 1, 1, 1, 2, 2, 3, 3, 4, 5, 5, 5])
LENGTHS = torch.ones(12)


def estimate(estimator, rewards=REWARDS, groups=GROUPS, responses=None):
    stats = estimator.fit(rewards, groups, LENGTHS, responses)
    return estimator.apply(stats, rewards, groups, responses), stats


def test_hand_computed_without_the_group_size():
    a, _ = estimate(MaxRL(divide_by_group_size=False))
    d1, d5 = 0.25 + 1e-6, 2 / 3 + 1e-6
    expected = [
        # group 1: mean 0.25: (1 - 0.25) / 0.250001 = 2.999988, (0 - 0.25) / 0.250001 = -0.999996 (prime-rl's [3, -1, -1, -1])
        0.75 / d1, -0.25 / d1, -0.25 / d1, -0.25 / d1,
        # group 2: mean 1: (1 - 1) / 1.000001 = 0;  group 3: mean 0: A = 0 (no success, no gradient)
        0.0, 0.0, 0.0, 0.0,
        # group 4: one response: mean 0 by convention (the authors' line 416-418): A = 0
        0.0,
        # group 5: mean 2/3: (1 - 2/3) / 0.666667 = 0.4999993, (0 - 2/3) / 0.666667 = -0.9999985
        (1 / 3) / d5, (1 / 3) / d5, -(2 / 3) / d5,
    ]
    assert torch.allclose(a, torch.tensor(expected), atol=1e-6)
    assert a[0].item() == pytest.approx(3.0, abs=1e-4) and a[1].item() == pytest.approx(-1.0, abs=1e-5)


def test_hand_computed_divided_by_the_group_size():
    # the authors' line 440: every advantage / N: group 1 (N = 4): 2.999988 / 4 = 0.749997, -0.999996 / 4 = -0.249999;
    # group 5 (N = 3): 0.4999993 / 3 = 0.1666664, -0.9999985 / 3 = -0.3333328
    a, _ = estimate(MaxRL())
    b, _ = estimate(MaxRL(divide_by_group_size=False))
    n = torch.tensor([4.0] * 4 + [2.0] * 2 + [2.0] * 2 + [1.0] + [3.0] * 3)
    assert torch.allclose(a, b / n, atol=1e-7)
    assert a[0].item() == pytest.approx(0.749997, abs=1e-6)
    assert a[11].item() == pytest.approx(-0.3333328, abs=1e-6)


def test_the_estimator_is_the_conditional_one_with_its_control_variate():
    # eq. final-estimator: the weight of response i is r_i / K - 1 / N (K successes of N), with the default options
    rewards = torch.tensor([1.0, 0.0, 1.0, 0.0, 0.0])
    a, _ = estimate(MaxRL(eps=0.0), rewards, torch.zeros(5, dtype=torch.long))
    k, n = 2.0, 5.0
    assert torch.allclose(a, rewards / k - 1 / n, atol=1e-7)  # 1/2 - 1/5 = 0.3;  -1/5 = -0.2


def test_padding_rows_are_left_out_of_the_group():
    # row 3 of group 1 is padding (and holds NaN): the group is (1, 0, 0), mean 1/3, N = 3
    rewards = REWARDS.clone()
    rewards[3] = float("nan")
    responses = torch.ones(12, dtype=torch.bool)
    responses[3] = False
    a, _ = estimate(MaxRL(), rewards, GROUPS, responses)
    d = 1 / 3 + 1e-6
    # (1 - 1/3) / 0.333334 / 3 = 0.6666660, (0 - 1/3) / 0.333334 / 3 = -0.3333330
    assert torch.allclose(a[:4], torch.tensor([(2 / 3) / d / 3, -(1 / 3) / d / 3, -(1 / 3) / d / 3, 0.0]), atol=1e-7)


@pytest.mark.parametrize("bad", [-1.0, float("nan"), float("inf")])
def test_a_negative_or_non_finite_reward_is_an_error(bad):
    rewards = REWARDS.clone()
    rewards[2] = bad
    with pytest.raises(ValueError, match="maxrl: rewards must be finite and not negative"):
        MaxRL().fit(rewards, GROUPS, LENGTHS)


def test_metrics():
    _, stats = estimate(MaxRL())
    metrics = MaxRL().step_metrics(stats)
    # 12 responses in 5 groups: truncation order 12 / 5 = 2.4; of the 4 groups of >= 2 responses, group 3 failed: 1/4
    assert metrics["truncation_order"].item() == pytest.approx(2.4)
    assert metrics["no_success_fraction"].item() == pytest.approx(0.25)


def test_loss_reports_the_metrics_and_trains_only_groups_with_a_success(make_batch):
    batch = make_batch(seed=3)
    out = rlstab.load("maxrl").compile()(batch)
    assert math.isfinite(out.loss.item())
    assert "advantage/maxrl/truncation_order" in out.metrics
    stats = MaxRL().fit(batch.rewards, batch.group_ids, None)
    adv = MaxRL().apply(stats, batch.rewards, batch.group_ids)
    for g in batch.group_ids.unique():
        rows = batch.group_ids == g
        if batch.rewards[rows].sum() == 0:
            assert torch.all(adv[rows] == 0)


def test_describe():
    assert MaxRL().describe().startswith("maxrl: A_i = (R_i - mean_g R) / (mean_g R + 1e-06) / n_g")
    assert "/ n_g" not in MaxRL(divide_by_group_size=False).describe()


def test_preset():
    o = rlstab.load("maxrl")
    assert (o.advantage.kind, o.advantage.eps, o.advantage.divide_by_group_size) == ("maxrl", 1e-6, True)
    # the rest is veRL's default loss (the authors' ppo_trainer.yaml): clip 0.2/0.2, dual-clip 3, token-mean
    assert (o.surrogate.kind, o.surrogate.eps_low, o.surrogate.eps_high, o.surrogate.dual_clip) == ("ppo_clip", 0.2, 0.2, 3.0)
    assert (o.aggregation.kind, o.aggregation.count) == ("token-mean", "valid")
    assert o.sampler is None  # MaxRL's sampling is the group size every trainer has
