"""VCPO's off-policy optimal baseline (advantage ``opob``): hand-computed groups, the authors' helpers' semantics."""

import math

import pytest
import torch

import rlstab
from rlstab.advantages import GRPO, OffPolicyOptimalBaseline, weighted_baseline
from rlstab.errors import ConfigError

# One group of 3 responses, 2 tokens each. Sequence log ratios (old - rollout) are log 1, log 2, log 0.5,
# put on the first token; squared gradient norms 4, 1, 1.
REWARDS = torch.tensor([1.0, 0.0, 0.0])
GRAD_SQ = torch.tensor([4.0, 1.0, 1.0])
SEQ_LOG_RATIO = torch.tensor([0.0, math.log(2.0), math.log(0.5)])


def batch(rewards=REWARDS, grad_sq=GRAD_SQ, seq_log_ratio=SEQ_LOG_RATIO, groups=None, lengths=(2, 2, 2)):
    B, T = rewards.numel(), max(lengths)
    mask = torch.arange(T).expand(B, T) < torch.tensor(lengths).unsqueeze(-1)
    old = torch.full((B, T), -1.0)
    rollout = old.clone()
    rollout[:, 0] -= seq_log_ratio  # old - rollout = the sequence log ratio, on the first token
    return rlstab.TokenBatch(
        logprobs=old.clone().requires_grad_(), old_logprobs=old, response_mask=mask, rollout_logprobs=rollout,
        rewards=rewards, group_ids=torch.zeros(B, dtype=torch.long) if groups is None else groups,
        grad_sq_norms=grad_sq,
    )


def advantages(estimator, b):
    compiled = rlstab.Objective(advantage=estimator, aggregation={"kind": "token-mean", "count": "valid"}).compile()
    stats = compiled.gather([b])
    t = compiled._tokens(b)
    compiled._set_micro_batch_advantages(t, stats)
    return t.advantage_rows[:, 0], stats


def test_three_responses_by_hand():
    # W = g^2 * w^2 = (4 * 1, 1 * 4, 1 * 0.25) = (4, 4, 0.25); b = (4 * 1 + 4 * 0 + 0.25 * 0) / (8.25 + 1e-8) = 0.484848...
    a, _ = advantages(OffPolicyOptimalBaseline(), batch())
    b = 4.0 / (8.25 + 1e-8)
    assert torch.allclose(a, torch.tensor([1.0 - b, -b, -b]), atol=1e-7)


def test_normalize_std_divides_by_the_population_std():
    # rewards (1, 0, 0): mean 1/3, population std sqrt((4/9 + 1/9 + 1/9) / 3) = sqrt(2) / 3 = 0.471405
    a, _ = advantages(OffPolicyOptimalBaseline(normalize_std=True), batch())
    b, std = 4.0 / (8.25 + 1e-8), math.sqrt(2.0) / 3.0
    assert torch.allclose(a, torch.tensor([1.0 - b, -b, -b]) / std, atol=1e-6)


def test_without_importance_weights_and_by_length():
    # importance_weights off: W = g^2 = (4, 1, 1) -> b = 4 / 6 = 0.6667
    a, _ = advantages(OffPolicyOptimalBaseline(importance_weights=False), batch())
    assert torch.allclose(a, torch.tensor([1 / 3, -2 / 3, -2 / 3]), atol=1e-6)
    # lengths (1, 2, 2) and W / L^2 with g^2 only: (4 / 1, 1 / 4, 1 / 4) -> b = 4 / 4.5 = 0.8889
    b = batch(lengths=(1, 2, 2))
    a, _ = advantages(OffPolicyOptimalBaseline(importance_weights=False, normalize_by_length=True), b)
    assert torch.allclose(a, torch.tensor([1 - 8 / 9, -8 / 9, -8 / 9]), atol=1e-6)


def test_clip_caps_the_ratio_before_squaring():
    # clip 1: w = (1, 1, 0.5) -> W = (4, 1, 0.25), b = 4 / 5.25 = 0.7619
    a, _ = advantages(OffPolicyOptimalBaseline(clip=1.0), batch())
    assert torch.allclose(a, torch.tensor([1.0, 0.0, 0.0]) - 4 / 5.25, atol=1e-6)


def test_equal_weights_give_the_group_mean():
    # every W equal: b = mean R; the advantages are Dr.GRPO's R - mean
    b = batch(grad_sq=torch.full((3,), 2.5), seq_log_ratio=torch.zeros(3))
    a, _ = advantages(OffPolicyOptimalBaseline(), b)
    expected, _ = advantages(GRPO(normalize_std=False), b)
    assert torch.allclose(a, expected, atol=1e-7)


def test_groups_are_separate_and_step_scope_uses_grpo_advantages():
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 0.0])
    groups = torch.tensor([5, 5, 5, 8, 8, 8])
    grad_sq = torch.tensor([4.0, 1.0, 1.0, 1.0, 1.0, 1.0])
    log_ratio = torch.cat([SEQ_LOG_RATIO, torch.zeros(3)])
    b = batch(rewards, grad_sq, log_ratio, groups, lengths=(2,) * 6)
    a, stats = advantages(OffPolicyOptimalBaseline(), b)
    # group 5 as above; group 8: equal weights -> b = 2/3
    b5 = 4.0 / (8.25 + 1e-8)
    assert torch.allclose(a, torch.tensor([1 - b5, -b5, -b5, 1 / 3, 1 / 3, -2 / 3]), atol=1e-6)
    # step scope: v = GRPO advantages, (+-) 2/3 / std... group 5: mean 1/3, unbiased std sqrt(1/3): v = (1.1547, -0.5774, -0.5774)
    a, _ = advantages(OffPolicyOptimalBaseline(scope="step"), b)
    grpo, _ = advantages(GRPO(), b)
    weights = torch.tensor([4.0, 4.0, 0.25, 1.0, 1.0, 1.0], dtype=torch.float64)
    baseline = float((grpo.double() * weights).sum() / (weights.sum() + 1e-8))
    assert torch.allclose(a, grpo - baseline, atol=1e-6)


def test_metrics_report_the_baseline_and_its_gap_to_the_mean():
    compiled = rlstab.Objective(advantage=OffPolicyOptimalBaseline(), aggregation={"kind": "token-mean", "count": "valid"}).compile()
    m = compiled(batch()).metrics
    b = 4.0 / 8.25
    assert m["advantage/opob/baseline"] == pytest.approx(b)
    assert m["advantage/opob/baseline_minus_mean"] == pytest.approx(b - 1 / 3)
    # ESS of W = (4, 4, 0.25): 8.25^2 / 32.0625 / 3 = 0.70760
    assert m["advantage/opob/weight_ess_fraction"] == pytest.approx(8.25**2 / 32.0625 / 3)


def test_a_heavy_tailed_ratio_does_not_overflow():
    # log w = 500 on one response: W ~ e^1000 is past float64, but log W is clamped at 700 -> that response's reward
    b = batch(seq_log_ratio=torch.tensor([500.0, 0.0, 0.0]))
    a, stats = advantages(OffPolicyOptimalBaseline(), b)
    assert torch.allclose(a, torch.tensor([0.0, -1.0, -1.0]), atol=1e-6)


def test_padding_rows_leave_the_group():
    rewards = torch.tensor([1.0, 0.0, 0.0, float("nan")])
    b = batch(rewards, torch.tensor([4.0, 1.0, 1.0, float("nan")]), torch.cat([SEQ_LOG_RATIO, torch.zeros(1)]),
              lengths=(2, 2, 2, 0))
    a, _ = advantages(OffPolicyOptimalBaseline(), b)
    b_ = 4.0 / (8.25 + 1e-8)
    assert torch.allclose(a, torch.tensor([1 - b_, -b_, -b_, 0.0]), atol=1e-6)


def test_missing_gradient_norms_name_the_field():
    b = batch()
    b.grad_sq_norms = None
    compiled = rlstab.Objective(advantage=OffPolicyOptimalBaseline(), aggregation={"kind": "token-mean", "count": "valid"}).compile()
    with pytest.raises(rlstab.BatchError, match=r"advantage \(opob\).*TokenBatch.grad_sq_norms"):
        compiled(b)


def test_a_negative_squared_norm_is_refused_but_not_on_padding():
    compiled = rlstab.Objective(advantage=OffPolicyOptimalBaseline(), aggregation={"kind": "token-mean", "count": "valid"}).compile()
    with pytest.raises(rlstab.BatchError, match=r"grad_sq_norms must be squared norms \(>= 0\); row 1 holds -1.0"):
        compiled(batch(grad_sq=torch.tensor([4.0, -1.0, 1.0])))
    padded = batch(torch.tensor([1.0, 0.0, 0.0, 1.0]), torch.tensor([4.0, 1.0, 1.0, -7.0]),
                   torch.cat([SEQ_LOG_RATIO, torch.zeros(1)]), lengths=(2, 2, 2, 0))
    a, _ = advantages(OffPolicyOptimalBaseline(), padded)
    assert torch.allclose(a[:3], advantages(OffPolicyOptimalBaseline(), batch())[0], atol=1e-7) and a[3] == 0


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"scope": "step", "normalize_std": True}, "needs scope: group"),
        ({"importance_weights": False, "clip": 2.0}, "importance_weights: false"),
        ({"aggregate": "winsorized_mean", "winsor_lower": 0.9, "winsor_upper": 0.1}, "lower <= upper"),
    ],
)
def test_contradictory_options_are_refused(fields, message):
    with pytest.raises(ConfigError, match=message):
        rlstab.load({"advantage": {"kind": "opob", **fields}, "aggregation": {"kind": "token-mean", "count": "valid"}})


# ------------------------------------------------- the authors' helpers (vcpo staleness_utils), by their semantics

def test_weighted_median_is_the_first_value_reaching_half_the_weight():
    values = torch.tensor([3.0, 1.0, 2.0], dtype=torch.float64)
    # sorted (1, 2, 3), weights (1, 1, 2): cumulative (1, 2, 4); half of 4 is 2 -> the value 2 (cumulative >= 2)
    assert float(weighted_baseline(values, torch.tensor([2.0, 1.0, 1.0], dtype=torch.float64), "median")) == 2.0
    # zero total weight: 0, as get_weighted_median
    assert float(weighted_baseline(values, torch.zeros(3, dtype=torch.float64), "median")) == 0.0


def test_weighted_winsorized_mean_clips_to_the_weighted_quantiles():
    values = torch.arange(20, dtype=torch.float64)  # 0..19, equal weights 1: cumulative 1..20
    weights = torch.ones(20, dtype=torch.float64)
    # 5% of 20 = 1 -> first cumulative >= 1 is value 0; 95% = 19 -> value 18: clipped mean = (sum 0..18 + 18) / 20
    expected = (sum(range(19)) + 18) / (20 + 1e-8)
    assert float(weighted_baseline(values, weights, "winsorized_mean")) == pytest.approx(expected)


def test_weighted_mean_adds_eps_to_the_weights():
    # get_weighted_mean: sum W v / (sum W + 1e-8); all weights 0 -> 0
    v = torch.tensor([1.0, 3.0], dtype=torch.float64)
    assert float(weighted_baseline(v, torch.tensor([1.0, 3.0], dtype=torch.float64))) == pytest.approx(10 / (4 + 1e-8))
    assert float(weighted_baseline(v, torch.zeros(2, dtype=torch.float64))) == 0.0
