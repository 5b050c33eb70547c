"""Padding rows (responses without a response token) never enter the advantage estimator, and get A = 0.

Their reward and group id may hold anything — NaN, infinity, an id no other row has — and change
nothing, on both paths (``loss_fn(batch)``; ``gather`` + micro-batch calls), as padded tokens
change nothing. Before, a NaN reward on a fully masked response gave a finite loss on the single
call (its padding was zeroed, then entered the group statistics as a reward of 0) but a
FloatingPointError through ``gather`` (the NaN reached the group mean). Non-finite rewards of
responses *with* tokens stay a FloatingPointError naming ``TokenBatch.rewards``, on both paths.
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import rlstab
from rlstab import TokenBatch
from rlstab.advantages import GRPO, RLOO, ReinforcePP
from rlstab.step import uniform_groups

NAN, INF = float("nan"), float("inf")
REAL = torch.tensor([True, True, True, False])  # the last response is a padding row


def estimate(estimator, rewards, groups, lengths, responses=REAL):
    return estimator.apply(estimator.fit(rewards, groups, lengths, responses), rewards, groups, responses)


# ----------------------------------------------------------------------------- by hand


@pytest.mark.parametrize("reward", [NAN, INF, 5.0])
@pytest.mark.parametrize("group", [0, 7])  # the real rows' group, or an id no other row has
def test_grpo_by_hand(reward, group):
    rewards = torch.tensor([1.0, 0.0, 1.0, reward])
    groups = torch.tensor([0, 0, 0, group])
    # real rows 1, 0, 1: mean 2/3; deviations 1/3, -2/3, 1/3; unbiased var (1/9 + 4/9 + 1/9) / 2 = 1/3
    std = math.sqrt(1 / 3)
    expected = torch.tensor([(1 / 3) / (std + 1e-6), (-2 / 3) / (std + 1e-6), (1 / 3) / (std + 1e-6), 0.0])
    a = estimate(GRPO(), rewards, groups, torch.tensor([3.0, 2.0, 1.0, 0.0]))
    torch.testing.assert_close(a, expected)


def test_rloo_by_hand():
    rewards, groups = torch.tensor([1.0, 0.0, 1.0, NAN]), torch.tensor([0, 0, 0, 0])
    # n = 3 real responses (not 4): 3/2 (R - 2/3) = 0.5, -1, 0.5
    a = estimate(RLOO(), rewards, groups, torch.tensor([3.0, 2.0, 1.0, 0.0]))
    torch.testing.assert_close(a, torch.tensor([0.5, -1.0, 0.5, 0.0]))


def test_a_real_response_alone_with_padding_is_a_group_of_one():
    rewards, groups = torch.tensor([1.0, 0.0, 2.0, 9.0]), torch.tensor([0, 0, 1, 1])
    # group 1 holds one real response (R = 2) and the padding row: a group of one, A = R (veRL's convention)
    a = estimate(GRPO(normalize_std=False), rewards, groups, torch.tensor([1.0, 1.0, 1.0, 0.0]))
    torch.testing.assert_close(a, torch.tensor([0.5, -0.5, 2.0, 0.0]))


@pytest.mark.parametrize("baseline", [False, True])
def test_reinforce_pp_by_hand(baseline):
    rewards, groups = torch.tensor([1.0, 0.0, 1.0, NAN]), torch.tensor([0, 0, 1, 0])
    lengths = torch.tensor([3.0, 1.0, 2.0, 0.0])
    if baseline:
        # group 0 real: 1, 0 -> mean 0.5: x = 0.5, -0.5; group 1: one response, mean 0: x = 1
        x = [0.5, -0.5, 1.0]
    else:
        x = [1.0, 0.0, 1.0]
    n = 6.0
    mean = (3 * x[0] + 1 * x[1] + 2 * x[2]) / n
    var = (3 * (x[0] - mean) ** 2 + (x[1] - mean) ** 2 + 2 * (x[2] - mean) ** 2) / (n - 1)
    expected = torch.tensor([(v - mean) / math.sqrt(var + 1e-8) for v in x] + [0.0])
    a = estimate(ReinforcePP(subtract_group_mean=baseline), rewards, groups, lengths)
    torch.testing.assert_close(a, expected)


def test_without_a_responses_mask_every_row_counts():
    """The estimators' own API, unchanged for callers that pass no mask (fit and apply as before)."""
    rewards, groups = torch.tensor([1.0, 0.0, 1.0, 0.0]), torch.tensor([0, 0, 0, 0])
    est = GRPO(normalize_std=False)
    a = est.apply(est.fit(rewards, groups, torch.ones(4)), rewards, groups)
    torch.testing.assert_close(a, torch.tensor([0.5, -0.5, 0.5, -0.5]))  # mean 0.5 over all four


def test_dynamic_sampling_leaves_padding_rows_out_of_the_groups():
    # group 0: real rewards 1, 1 (uniform: dropped) and a padding row with NaN; group 5: only a padding row
    rewards, groups = torch.tensor([1.0, 1.0, NAN, 0.0]), torch.tensor([0, 0, 0, 5])
    responses = torch.tensor([True, True, False, False])
    assert uniform_groups(rewards, groups, responses).tolist() == [0]
    assert uniform_groups(rewards, groups).tolist() == []  # counted as a response, the NaN breaks the tie


# ----------------------------------------------------------------------------- both paths, by hand


def batch(padding_reward: float, padding_group: int = 0) -> TokenBatch:
    g = torch.Generator().manual_seed(0)
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0], [1, 1, 1, 1], [0, 0, 0, 0]], dtype=torch.bool)
    return TokenBatch(
        logprobs=(-torch.rand(4, 4, generator=g)).requires_grad_(),
        response_mask=mask,
        entropy=torch.rand(4, 4, generator=g),
        rewards=torch.tensor([1.0, 0.0, 1.0, padding_reward]),
        group_ids=torch.tensor([0, 0, 0, padding_group]),
    )


def split(b: TokenBatch) -> list[TokenBatch]:
    parts = []
    for lo, hi in ((0, 2), (2, 4)):
        fields = {f: getattr(b, f)[lo:hi] for f in ("logprobs", "response_mask", "entropy", "rewards", "group_ids")}
        fields["logprobs"] = fields["logprobs"].detach().clone().requires_grad_()
        parts.append(TokenBatch(**fields))
    return parts


@pytest.mark.parametrize("padding_reward", [NAN, INF, -INF, 1e30])
def test_both_paths_agree_with_a_non_finite_reward_on_a_padding_row(padding_reward):
    loss_fn = rlstab.load("grpo").compile()
    single = loss_fn(batch(padding_reward)).loss
    micro = split(batch(padding_reward))
    stats = loss_fn.gather(micro)
    stepped = sum(loss_fn(mb, step=stats).loss for mb in micro)
    reference = loss_fn(batch(0.0, padding_group=99)).loss
    assert torch.isfinite(single) and torch.isfinite(stepped)
    torch.testing.assert_close(single, reference)
    torch.testing.assert_close(stepped, reference)


@pytest.mark.parametrize("bad", [NAN, INF])
def test_a_non_finite_reward_of_a_response_with_tokens_raises_on_both_paths(bad):
    b = batch(0.0)
    b.rewards[1] = bad
    loss_fn = rlstab.load("grpo").compile()
    with pytest.raises(FloatingPointError, match=r"TokenBatch\.rewards has 1 value\(s\) .*first at index \[1\]"):
        loss_fn(b)
    with pytest.raises(FloatingPointError, match=r"TokenBatch\.rewards"):
        loss_fn.gather(split(b))


# ----------------------------------------------------------------------------- property, every preset

# Every preset estimates with GRPO; the other estimators and the group filter on top.
OBJECTIVES = {name: rlstab.load(name) for name in rlstab.preset_names()}
OBJECTIVES.update({
    "rloo": rlstab.load({"extends": "grpo", "advantage": {"kind": "rloo"}}),
    "reinforce_pp": rlstab.load({"extends": "grpo", "advantage": {"kind": "reinforce_pp"}}),
    "reinforce_pp-baseline": rlstab.load({"extends": "grpo", "advantage": {"kind": "reinforce_pp", "subtract_group_mean": True}}),
    "dapo+dynamic_sampling": rlstab.load({"extends": "dapo", "group_filter": {"kind": "dynamic_sampling"}}),
    # entropy bonuses whose coefficient is not 0 on the first step (skywork_entropy's starts at 0): a gradient on entropy
    "grpo+entropy_bonus": rlstab.load({"extends": "grpo", "regularisers": [{"kind": "entropy_bonus", "coef": 0.01}]}),
    "skywork_entropy-coef": rlstab.load({"extends": "skywork_entropy", "regularisers": [{"kind": "adaptive_entropy", "coef": 0.005}]}),
    # Lp-Reg selecting half of each sign (the preset's 1% selects nothing below 200 negative tokens): the proxy is read
    "lp_reg-half": rlstab.load({"extends": "lp_reg", "surrogate": {"kind": "lp_reg", "negative_fraction": 0.5, "positive_fraction": 0.5}}),
})
ODD = [NAN, INF, -INF, 0.0, 1.0, -3.0, 1e30]


@st.composite
def steps(draw):
    """A batch whose every response has tokens, and the same with padding rows inserted anywhere (odd rewards and ids)."""
    B, T, P = draw(st.integers(1, 6)), draw(st.integers(1, 6)), draw(st.integers(1, 3))
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    lengths = torch.randint(1, T + 1, (B,), generator=g)
    real = dict(
        logprobs=-torch.rand(B, T, generator=g) * 3,
        response_mask=torch.arange(T) < lengths[:, None],
        old_logprobs=-torch.rand(B, T, generator=g) * 3,
        entropy=torch.rand(B, T, generator=g) * 2,
        rollout_logprobs=-torch.rand(B, T, generator=g) * 3,
        ref_logprobs=-torch.rand(B, T, generator=g) * 3,
        rewards=torch.randint(0, 2, (B,), generator=g).float(),
        group_ids=torch.randint(0, 3, (B,), generator=g),
        grad_sq_norms=torch.rand(B, generator=g) * 4 + 0.1,
        token_ids=torch.randint(0, 3, (B, T), generator=g),  # GTPO's conflict tokens: few ids, so rows share some
    )
    real["is_branch"] = real["group_ids"] == 2
    # Lp-Reg's min-p proxy of the old policy: at or above its log-probability (renormalised over the kept tokens)
    real["proxy_logprobs"] = real["old_logprobs"] + torch.rand(B, T, generator=g) * 0.5
    padding = {k: torch.rand((P, T) if v.dim() == 2 else (P,), generator=g) for k, v in real.items()}
    padding["is_branch"] = padding["is_branch"] < 0.5
    padding["response_mask"] = torch.zeros(P, T, dtype=torch.bool)
    padding["rewards"] = torch.tensor(draw(st.lists(st.sampled_from(ODD), min_size=P, max_size=P)))
    padding["group_ids"] = torch.tensor(draw(st.lists(st.integers(0, 50), min_size=P, max_size=P)))
    padding["token_ids"] = torch.randint(0, 3, (P, T), generator=g)
    # where the padding rows go; the real rows keep their order (ties in a top-k selection are broken by position)
    slots = torch.randperm(B + P, generator=g)[:P].sort().values
    is_padding = torch.zeros(B + P, dtype=torch.bool)
    is_padding[slots] = True
    order = torch.empty(B + P, dtype=torch.int64)  # padded row k holds row order[k] of cat(real, padding)
    order[~is_padding] = torch.arange(B)
    order[is_padding] = torch.arange(B, B + P)
    padded = {k: torch.cat([real[k], padding[k].to(real[k].dtype)])[order] for k in real}
    return real, padded, order


def losses(objective: rlstab.Objective, fields: dict, split_at: int | None):
    """``(loss, gradient of logprobs, gradient of entropy)`` of one call (split_at None) or of gather + two micro-batch calls.

    The entropy comes with gradient, as a trainer computes it from the logits (an entropy bonus needs
    it); its gradient is zero where nothing reads it with gradient.
    """
    loss_fn = objective.compile()
    leaves = {name: fields[name].clone().requires_grad_() for name in ("logprobs", "entropy")}
    fields = {**fields, **leaves}

    def grads():
        return tuple(torch.zeros_like(leaf) if leaf.grad is None else leaf.grad for leaf in leaves.values())

    if split_at is None:
        out = loss_fn(TokenBatch(**fields))
        out.loss.backward()
        return out.loss, *grads()
    parts = [{k: v[lo:hi] for k, v in fields.items()} for lo, hi in ((0, split_at), (split_at, None))]
    micro = [TokenBatch(**p) for p in parts]
    stats = loss_fn.gather(micro)
    total = sum(loss_fn(mb, step=stats).loss for mb in micro)
    total.backward()
    return total, *grads()


@pytest.mark.parametrize("name", list(OBJECTIVES))
@settings(max_examples=8, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(step=steps(), split=st.booleans())
def test_padding_rows_change_nothing(name, step, split):
    real, padded, order = step
    if OBJECTIVES[name].compile().per_micro_batch():
        split = False  # selection within each micro-batch: the split itself changes the loss, by design
    B = real["logprobs"].shape[0]
    loss, grad, hgrad = losses(OBJECTIVES[name], real, B // 2 if split else None)
    ploss, pgrad, phgrad = losses(OBJECTIVES[name], padded, len(order) // 2 if split else None)
    assert torch.isfinite(ploss), name
    torch.testing.assert_close(ploss, loss, rtol=1e-5, atol=1e-6)
    inverse = torch.argsort(order)  # where each row of cat(real, padding) went
    torch.testing.assert_close(pgrad[inverse[:B]], grad, rtol=1e-5, atol=1e-6)
    assert torch.all(pgrad[inverse[B:]] == 0)
    torch.testing.assert_close(phgrad[inverse[:B]], hgrad, rtol=1e-5, atol=1e-6)
    assert torch.all(phgrad[inverse[B:]] == 0)
