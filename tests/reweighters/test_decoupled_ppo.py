"""AReaL's decoupled PPO: hand-computed values, AReaL's loss restated against the preset, its cap, what it reads."""

import math

import pytest
import torch

import rlstab
from rlstab.adapters.trainer_parts import unsupplied

# One response of four tokens. Proximal policy = old_logprobs (the trainer's recomputation), behaviour
# policy = rollout_logprobs (the inference engine's), current = proximal + the PPO log-ratio.
PROX = torch.tensor([[-1.0, -1.0, -1.0, -1.0]])
BEHAV = torch.tensor([[-1.5, -1.0, -3.0, -0.5]])  # log w = prox - behav = [0.5, 0, 2, -0.5]
LOG_U = torch.tensor([[0.3, -0.1, 0.0, 0.5]])  # log u = log pi - log pi_prox
ADV = torch.tensor([[1.0, -1.0, 1.0, -1.0]])


def run(reweighter, surrogate=None):
    objective = rlstab.load({
        "reweighters": [reweighter],
        "surrogate": surrogate or {"kind": "ppo_clip", "eps_low": 0.2, "eps_high": 0.2},
        "aggregation": {"kind": "token-mean", "count": "valid"},
    })
    current = (PROX + LOG_U).requires_grad_()
    batch = rlstab.TokenBatch(
        logprobs=current, old_logprobs=PROX, rollout_logprobs=BEHAV, advantages=ADV, response_mask=torch.ones(1, 4, dtype=torch.bool)
    )
    out = objective.compile()(batch)
    out.loss.backward()
    return out, current.grad[0]


def test_hand_computed_drop():
    out, grad = run({"kind": "decoupled_ppo", "cap": 5.0})
    # w = [e^0.5, 1, e^2 = 7.389 > 5 -> 0, e^-0.5] = [1.6487213, 1, 0, 0.6065307]
    # PPO clip 0.2 on u = [e^0.3 = 1.3498588, e^-0.1 = 0.9048374, 1, e^0.5 = 1.6487213]:
    #   A = 1, u > 1.2: l = -1.2 (clipped, no gradient);  A = -1, u = 0.905: l = 0.9048374, dl/dlogp = 0.9048374
    #   A = 1, u = 1: l = -1, dl/dlogp = -1;  A = -1, u = 1.649: l = max(1.6487213, 1.2) = 1.6487213, gradient 1.6487213
    # weighted: -1.2 * 1.6487213 = -1.9784655;  0.9048374;  0 (dropped);  1.6487213 * 0.6065307 = 1
    # token-mean over all 4 tokens (the dropped one still counts, AReaL's line 219): (-1.9784655 + 0.9048374 + 1) / 4
    assert out.loss.item() == pytest.approx(-0.0736281 / 4, abs=1e-6)
    assert torch.allclose(grad, torch.tensor([0.0, 0.9048374, 0.0, 1.0]) / 4, atol=1e-6)
    assert out.metrics["reweight/decoupled_ppo/capped_fraction"] == pytest.approx(0.25)


def test_hand_computed_clamp():
    out, grad = run({"kind": "decoupled_ppo", "cap": 5.0, "above_cap": "clamp"})
    # token 3 now keeps min(7.389, 5) = 5: l = -1 * 5 = -5, dl/dlogp = -5
    assert out.loss.item() == pytest.approx((-1.9784655 + 0.9048374 - 5.0 + 1.0) / 4, abs=1e-6)
    assert torch.allclose(grad, torch.tensor([0.0, 0.9048374, -5.0, 1.0]) / 4, atol=1e-6)


def test_uncapped():
    out, _ = run({"kind": "decoupled_ppo", "cap": None})
    # token 3 keeps w = e^2 = 7.3890561: l = -7.3890561
    assert out.loss.item() == pytest.approx((-1.9784655 + 0.9048374 - math.exp(2.0) + 1.0) / 4, abs=1e-6)
    assert out.metrics["reweight/decoupled_ppo/capped_fraction"] == 0.0


def test_the_cap_is_inclusive():
    # AReaL keeps behav_imp_weight <= cap: a weight of exactly e^2 with cap e^2 is kept
    out, _ = run({"kind": "decoupled_ppo", "cap": float(torch.tensor(2.0).exp())})
    assert out.metrics["reweight/decoupled_ppo/capped_fraction"] == 0.0


def areal_loss(batch, cap, eps=0.2):
    """AReaL's ppo_actor_loss_fn (behav_imp_weight_cap version, token level, no dual clip), restated:
    u = pi / pi_prox, w = pi_prox / pi_behav dropped above the cap, loss = sum(w max(-A u, -A clip(u))) / |mask|."""
    lp = batch.logprobs.detach().clone().requires_grad_()
    mask = batch.response_mask
    adv = batch.advantages
    u = torch.where(mask, torch.exp(lp - batch.old_logprobs), 0.0)
    pg = torch.max(-adv * u, -adv * u.clamp(1 - eps, 1 + eps))
    w = torch.exp(batch.old_logprobs - batch.rollout_logprobs)
    keep = (w <= cap) & mask
    pg = pg * torch.where(keep, w, 0.0)
    loss = torch.where(mask, pg, 0.0).sum() / mask.count_nonzero()
    (grad,) = torch.autograd.grad(loss, lp)
    return loss.detach(), grad


@pytest.mark.parametrize("seed", range(5))
def test_preset_matches_areal_on_random_batches(make_batch, seed):
    batch = make_batch(B=12, T=16, seed=seed, advantages="token")
    # a stale behaviour policy: weights far from 1, so that the cap drops tokens
    noise = torch.randn(batch.logprobs.shape, generator=torch.Generator().manual_seed(seed)) * 1.5
    batch = rlstab.TokenBatch(
        logprobs=batch.logprobs, old_logprobs=batch.old_logprobs, rollout_logprobs=(batch.old_logprobs + noise).abs().neg(),
        advantages=batch.advantages, response_mask=batch.response_mask,
    )
    out = rlstab.load("decoupled_ppo").compile()(batch)
    (grad,) = torch.autograd.grad(out.loss, batch.logprobs)
    ref, ref_grad = areal_loss(batch, cap=5.0)
    assert out.loss.item() == pytest.approx(ref.item(), abs=1e-6)
    assert torch.allclose(grad, ref_grad, atol=1e-6)
    assert 0.0 < out.metrics["reweight/decoupled_ppo/capped_fraction"] < 1.0


@pytest.mark.parametrize("seed", range(3))
def test_drop_is_icepop_without_a_floor_with_tis(make_batch, seed):
    """IcePop's band is decoupled PPO's cap with a lower bound: with the floor at ~0 the two agree under count: valid."""
    batch = make_batch(seed=seed, advantages="token")
    noise = torch.randn(batch.logprobs.shape, generator=torch.Generator().manual_seed(seed)) * 1.5
    batch = rlstab.TokenBatch(
        logprobs=batch.logprobs, old_logprobs=batch.old_logprobs, rollout_logprobs=(batch.old_logprobs + noise).abs().neg(),
        advantages=batch.advantages, response_mask=batch.response_mask,
    )
    ours = rlstab.load({"extends": "decoupled_ppo"}).compile()(batch)
    theirs = rlstab.load({
        "extends": "decoupled_ppo",
        "masks": [{"kind": "icepop", "low": 1e-12, "high": 5.0, "rejected": "masked"}],
        "reweighters": [{"kind": "tis", "level": "token", "cap": 5.0}],
    }).compile()(batch)
    assert ours.loss.item() == pytest.approx(theirs.loss.item(), abs=1e-6)


def test_padding_holding_anything_changes_nothing(make_batch):
    batch = make_batch(seed=4, advantages="token")
    pad = ~batch.response_mask
    noisy = rlstab.TokenBatch(
        logprobs=batch.logprobs, old_logprobs=batch.old_logprobs.masked_fill(pad, float("inf")),
        rollout_logprobs=batch.rollout_logprobs.masked_fill(pad, float("nan")),
        advantages=batch.advantages, response_mask=batch.response_mask,
    )
    clean = rlstab.TokenBatch(
        logprobs=batch.logprobs, old_logprobs=batch.old_logprobs, rollout_logprobs=batch.rollout_logprobs,
        advantages=batch.advantages, response_mask=batch.response_mask,
    )
    a = rlstab.load("decoupled_ppo").compile()(clean).loss.item()
    b = rlstab.load("decoupled_ppo").compile()(noisy).loss.item()
    assert a == pytest.approx(b, abs=1e-7)


def test_needs_the_behaviour_policys_logprobs():
    objective = rlstab.load("decoupled_ppo")
    batch = rlstab.TokenBatch(logprobs=PROX, old_logprobs=PROX, advantages=ADV, response_mask=torch.ones(1, 4, dtype=torch.bool))
    with pytest.raises(rlstab.BatchError, match=r"reweighters\[0\] \(decoupled_ppo\) reads TokenBatch\.rollout_logprobs"):
        objective.compile()(batch)
    # an adapter whose trainer cannot supply them refuses at start-up, with one line naming the component
    lines = unsupplied(objective, {"rollout_logprobs": "the trainer has no inference-engine log-probabilities"})
    assert lines == [
        "reweighters[0] (decoupled_ppo) reads TokenBatch.rollout_logprobs: the trainer has no inference-engine log-probabilities"
    ]


@pytest.mark.parametrize("cap", [1.0, 0.5, -1.0])
def test_the_cap_must_exceed_one(cap):
    with pytest.raises(rlstab.ConfigError, match=r"reweighters.*cap"):
        rlstab.load({"extends": "decoupled_ppo", "reweighters": [{"kind": "decoupled_ppo", "cap": cap}]})


def test_describe_and_preset():
    o = rlstab.load("decoupled_ppo")
    (w,) = o.reweighters
    assert (w.kind, w.cap, w.above_cap) == ("decoupled_ppo", 5.0, "drop")
    assert (o.surrogate.kind, o.surrogate.eps_low, o.surrogate.eps_high, o.surrogate.dual_clip) == ("ppo_clip", 0.2, 0.2, None)
    assert (o.aggregation.kind, o.aggregation.count) == ("token-mean", "valid")
    assert "0 where w > 5" in w.describe()
