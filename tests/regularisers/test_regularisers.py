"""KL estimators and the entropy bonus."""

import math

import pytest
import torch

import rlstab


def kl_loss(estimator, delta):
    logprobs = torch.tensor([[-1.0 + delta]], requires_grad=True)
    batch = rlstab.TokenBatch(
        logprobs=logprobs, advantages=torch.zeros(1), response_mask=torch.ones(1, 1, dtype=torch.bool),
        ref_logprobs=torch.tensor([[-1.0]]),
    )
    objective = rlstab.load({"aggregation": {"kind": "token-mean", "count": "valid"},
                             "regularisers": [{"kind": "kl", "coef": 0.5, "estimator": estimator}]})
    out = objective.compile()(batch)
    out.loss.backward()
    return out, logprobs.grad.item()


@pytest.mark.parametrize(
    "estimator, value, grad",
    [
        ("k1", 0.3, 1.0),  # k = delta; dk/dlogp = 1
        ("k2", 0.5 * 0.3**2, 0.3),  # k = delta^2 / 2; dk/dlogp = delta
        ("k3", math.exp(-0.3) + 0.3 - 1, 1 - math.exp(-0.3)),  # k = e^-delta + delta - 1
    ],
)
def test_kl_estimators(estimator, value, grad):
    out, g = kl_loss(estimator, 0.3)
    # A = 0, so the loss is coef * k alone.
    assert out.loss.item() == pytest.approx(0.5 * value, rel=1e-5)
    assert out.metrics["loss/kl"] == pytest.approx(value, rel=1e-5)
    assert g == pytest.approx(0.5 * grad, rel=1e-4)


def test_entropy_bonus_needs_entropy_with_gradient(make_batch):
    batch = make_batch(advantages="sequence")
    batch.entropy = batch.entropy.detach()
    objective = rlstab.load({"extends": "grpo", "regularisers": [{"kind": "entropy_bonus", "coef": 0.01}]})
    with pytest.raises(ValueError, match="entropy with gradient"):
        objective.compile()(batch)


def test_entropy_bonus_pushes_entropy_up(make_batch):
    batch = make_batch(advantages="sequence")
    entropy = batch.entropy.detach().clone().requires_grad_()
    fields = {f: getattr(batch, f) for f in ("logprobs", "old_logprobs", "response_mask", "advantages")}
    objective = rlstab.load({"extends": "grpo", "regularisers": [{"kind": "entropy_bonus", "coef": 0.01}]})
    out = objective.compile()(rlstab.TokenBatch(**fields, entropy=entropy))
    out.loss.backward()
    valid = batch.response_mask
    n = valid.sum()
    # loss += 0.01 * sum(-H) / n over valid tokens: dL/dH = -0.01 / n there, 0 on padding
    assert torch.allclose(entropy.grad[valid], torch.full((int(n),), -0.01 / n))
    assert (entropy.grad[~valid] == 0).all()


def anchored_kl_loss(**kl):
    # One response, A = 0 (the loss is the KL term alone), two tokens: log p = (-1.0, -2.0), old = (-1.5, -1.0),
    # rollout = (-1.5, -2.5), ref = (-1.0, -1.0); a mask that keeps token 1 (old/rollout ratio 1) and silences
    # token 2 (ratio e^1.5 above 1.1).
    logprobs = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    batch = rlstab.TokenBatch(
        logprobs=logprobs, old_logprobs=torch.tensor([[-1.5, -1.0]]), rollout_logprobs=torch.tensor([[-1.5, -2.5]]),
        ref_logprobs=torch.tensor([[-1.0, -1.0]]), advantages=torch.zeros(1),
        response_mask=torch.ones(1, 2, dtype=torch.bool),
    )
    objective = rlstab.load({
        "aggregation": {"kind": "token-mean", "count": "valid"},
        "masks": [{"kind": "rollout_rejection", "level": "token", "divergence": "k1", "high": 1.1, "rejected": "masked"}],
        "regularisers": [{"kind": "kl", "coef": 0.5, **kl}],
    })
    out = objective.compile()(batch)
    out.loss.backward()
    return out.loss.item(), logprobs.grad[0].tolist()


def test_kl_anchors_at_the_old_policy_or_the_sampler_with_the_squared_estimator():
    # squared: k = delta^2, dk/dlogp = 2 delta; coef 0.5, token mean over 2 valid tokens.
    # old: delta = (0.5, -1.0): 0.5 * (0.25 + 1.0) / 2 = 0.3125; grad 0.5 * 2 * (0.5, -1.0) / 2 = (0.25, -0.5)
    assert anchored_kl_loss(estimator="squared", anchor="old") == (pytest.approx(0.3125), pytest.approx([0.25, -0.5]))
    # rollout: delta = (0.5, 0.5): 0.5 * (0.25 + 0.25) / 2 = 0.125; grad (0.25, 0.25)
    assert anchored_kl_loss(estimator="squared", anchor="rollout") == (pytest.approx(0.125),
                                                                       pytest.approx([0.25, 0.25]))
    # reference (default): delta = (0, -1.0), k2 = delta^2 / 2: 0.5 * 0.5 / 2 = 0.125; grad (0, -0.25)
    assert anchored_kl_loss(estimator="k2") == (pytest.approx(0.125), pytest.approx([0.0, -0.25]))


def test_a_regulariser_on_kept_tokens_keeps_every_valid_token_in_its_denominator():
    # The mask silences token 2: only token 1's term remains,
    # still divided by both valid tokens: old anchor, delta 0.5: 0.5 * 0.25 / 2 = 0.0625; grad (0.25, 0).
    assert anchored_kl_loss(estimator="squared", anchor="old", tokens="kept") == (pytest.approx(0.0625),
                                                                                  pytest.approx([0.25, 0.0]))


def test_what_each_anchor_reads_and_who_adds_it():
    from rlstab.adapters.trainers import refusals
    from rlstab.regularisers import KLPenalty

    assert [KLPenalty(anchor=a).reads for a in ("reference", "old", "rollout")] == [
        frozenset({"ref_logprobs"}), frozenset(), frozenset({"rollout_logprobs"})]
    assert KLPenalty().model_dump() == {"kind": "kl", "coef": 0.001, "estimator": "k3"}  # fingerprints unchanged
    # veRL adds a KL to the reference itself (use_kl_loss) and refuses rlstab's; one at the old policy is rlstab's.
    to_reference = rlstab.load({"extends": "grpo", "regularisers": [{"kind": "kl"}]})
    to_old = rlstab.load({"extends": "grpo", "regularisers": [{"kind": "kl", "anchor": "old"}]})
    assert any("use_kl_loss" in line for _, line in refusals(to_reference, "verl"))
    assert refusals(to_old, "verl") == []


def test_average_micro_batch_weighs_each_micro_batch_mean_by_its_share_of_responses():
    # Micro-batch a: valid entropies 0.2 0.4 | 0.6 (2 responses), mean 0.4. Micro-batch b: 0.1 0.2 0.3 | (empty
    # row), mean 0.2, 1 response with a valid token. The step: 6 valid tokens, 3 responses.
    # average: micro_batch -> -(0.4 * 2/3) - (0.2 * 1/3) = -1/3; objective (token-mean) -> -(1.2 + 0.6) / 6 = -0.3.
    mask_a = torch.tensor([[1, 1, 0], [1, 0, 0]], dtype=torch.bool)
    mask_b = torch.tensor([[1, 1, 1], [0, 0, 0]], dtype=torch.bool)
    entropy_a = torch.tensor([[0.2, 0.4, 9.0], [0.6, 9.0, 9.0]])
    entropy_b = torch.tensor([[0.1, 0.2, 0.3], [9.0, 9.0, 9.0]])

    def batch(mask, entropy):
        logprobs = torch.full((2, 3), -1.0)
        return rlstab.TokenBatch(logprobs=logprobs.clone().requires_grad_(), old_logprobs=logprobs,
                                 entropy=entropy.clone().requires_grad_(), advantages=torch.zeros(2), response_mask=mask)

    totals = {}
    for average in ("micro_batch", "objective"):
        compiled = rlstab.load({"extends": "dapo", "regularisers": [
            {"kind": "entropy_bonus", "coef": 1.0, "average": average}]}).compile()
        a, b = batch(mask_a, entropy_a), batch(mask_b, entropy_b)
        step = compiled.gather([a, b])
        totals[average] = compiled(a, step=step).loss.item() + compiled(b, step=step).loss.item()
    assert totals["micro_batch"] == pytest.approx(-1 / 3)
    assert totals["objective"] == pytest.approx(-0.3)
    # a later field: left out of the dump at its default, so existing objectives keep their fingerprints
    assert "average" not in rlstab.load({"extends": "dapo", "regularisers": [{"kind": "entropy_bonus"}]}).to_yaml()
