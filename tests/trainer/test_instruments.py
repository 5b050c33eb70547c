"""The mechanism instruments (``rlstab.trainer.mechanism``): gradient shares of what each mask silences, the
logit-gradient norms against p and H, and the trainer's ``mechanism`` row field, which changes nothing else."""

from __future__ import annotations

import math

import pytest
import torch

from rlstab.loading import load
from rlstab.trainer.config import TrainConfig
from rlstab.trainer.mechanism import StepMeter, mask_free
from rlstab.trainer.mechanism.logit_grad import (
    DistributionError,
    TokenGradients,
    direction_norm,
    distribution_stats,
    pearson,
    spearman,
)
from rlstab.trainer.mechanism.share import GradientShares
from rlstab.trainer.policy import Rollout
from rlstab.trainer.run import Run

from quick_regimes import QUICK

# Two expression masks: one silences every valid token, one silences none.
EVERYTHING_AND_NOTHING = {
    "extends": "grpo", "name": "all-and-none",
    "masks": [{"kind": "expression", "silence": "position >= 0"}, {"kind": "expression", "keep": "position >= 0"}],
}


class LinearPolicy:
    """A one-layer linear policy: logits z_t = W x_t, one input x_t per response position (a hand-checkable Policy)."""

    def __init__(self, weight: torch.Tensor, inputs: torch.Tensor):
        self.weight = torch.nn.Parameter(weight.clone())
        self.inputs = inputs  # [N, T, D]

    def trainable_parameters(self):
        return [self.weight]

    def token_stats(self, rollout: Rollout):
        logprobs, entropy, _ = self.token_distribution(rollout)
        return logprobs, entropy

    def token_distribution(self, rollout: Rollout):
        logp = torch.log_softmax(self.inputs[: rollout.response_ids.shape[0]] @ self.weight.T, dim=-1)
        logprobs = logp.gather(-1, rollout.response_ids[..., None]).squeeze(-1)
        with torch.no_grad():
            p = logp.exp()
            entropy = -(p * logp).sum(-1)
        return logprobs, entropy, (p * p).sum(-1)


def two_tokens():
    """Two tokens under W = 0 (2 classes, 1 input): p = (1/2, 1/2) at both; y = 0 with x = 1, y = 1 with x = 2."""
    policy = LinearPolicy(torch.zeros(2, 1), torch.tensor([[[1.0], [2.0]]]))
    rollout = Rollout([[0]], torch.tensor([[0, 1]]), torch.tensor([[True, True]]))
    logprobs, _ = policy.token_stats(rollout)
    return policy, logprobs


# ----------------------------------------------------------------------------- gradient share


def test_a_hand_computed_share_shows_cancellation():
    # d logp_y / dW = (e_y - p) x^T with p = (1/2, 1/2):
    #   token 1 (y = 0, x = 1): ( 1/2, -1/2) * 1 = ( 0.5, -0.5)
    #   token 2 (y = 1, x = 2): (-1/2,  1/2) * 2 = (-1.0,  1.0)
    # with c = (1, 1): g_full = (-0.5, 0.5), ||g_full|| = sqrt(0.5).
    policy, logprobs = two_tokens()
    shares = GradientShares()
    first, second = torch.tensor([[1.0, 0.0]]), torch.tensor([[0.0, 1.0]])
    shares.add(logprobs, policy.trainable_parameters(), torch.ones(1, 2), {"first": first, "second": second})
    assert shares.full.tolist() == [-0.5, 0.5]
    out = shares.result()
    # S = {token 1}: g_S = (0.5, -0.5), ||g_S|| = sqrt(0.5): share 1, and it points against g_full:
    # <g_S, g_full> = -0.25 - 0.25 = -0.5 = -||g_S|| ||g_full||, cosine -1.
    assert out["first"]["share"] == pytest.approx(1.0)
    assert out["first"]["cosine"] == pytest.approx(-1.0)
    # S = {token 2}: g_S = (-1, 1), ||g_S|| = sqrt(2): share sqrt(2) / sqrt(0.5) = 2 (more than the whole), cosine 1.
    assert out["second"]["share"] == pytest.approx(2.0)
    assert out["second"]["cosine"] == pytest.approx(1.0)
    assert out["first"]["silenced"] == out["second"]["silenced"] == 1
    assert shares.backward_passes == 3  # g_full, then one per mask


def test_the_share_of_a_mask_silencing_nothing_is_0_and_of_one_silencing_everything_is_1():
    policy, logprobs = two_tokens()
    shares = GradientShares()
    c = torch.tensor([[0.7, -0.3]])
    shares.add(logprobs, policy.trainable_parameters(), c, {"none": torch.zeros(1, 2), "all": torch.ones(1, 2)})
    out = shares.result()
    assert out["none"] == {"share": 0.0, "cosine": None, "silenced": 0}
    assert out["all"] == {"share": 1.0, "cosine": 1.0, "silenced": 2}
    assert shares.backward_passes == 1  # neither mask needs a pass of its own


def test_with_no_gradient_at_all_share_and_cosine_are_undefined():
    policy, logprobs = two_tokens()
    shares = GradientShares()
    shares.add(logprobs, policy.trainable_parameters(), torch.zeros(1, 2), {"all": torch.ones(1, 2)})
    assert shares.full_norm == 0.0
    assert shares.result()["all"] == {"share": None, "cosine": None, "silenced": 2}


def test_micro_batches_add_up():
    # Token 1 alone, then token 2 alone, sum to the two together: g_full = (0.5, -0.5) + (-1, 1) = (-0.5, 0.5).
    policy, logprobs = two_tokens()
    shares = GradientShares()
    params = policy.trainable_parameters()
    shares.add(logprobs, params, torch.tensor([[1.0, 0.0]]), {"m": torch.tensor([[1.0, 0.0]])})
    shares.add(logprobs, params, torch.tensor([[0.0, 1.0]]), {"m": torch.tensor([[0.0, 0.0]])})
    assert shares.full.tolist() == [-0.5, 0.5]
    assert shares.result()["m"]["share"] == pytest.approx(1.0)  # ||(0.5, -0.5)|| / ||(-0.5, 0.5)||


# ----------------------------------------------------------------------------- logit gradients


def test_the_direction_norm_is_the_norm_of_onehot_minus_p():
    # p = (0.5, 0.25, 0.25), y = 0: e_y - p = (0.5, -0.25, -0.25), norm^2 = 0.25 + 0.0625 + 0.0625 = 0.375;
    # formula: 1 - 2 * 0.5 + (0.25 + 0.0625 + 0.0625) = 0.375.
    logprobs = torch.tensor([[math.log(0.5)]])
    assert float(direction_norm(logprobs, torch.tensor([[0.375]]))) == pytest.approx(math.sqrt(0.375))
    logits = torch.log(torch.tensor([0.5, 0.25, 0.25])).requires_grad_(True)
    torch.log_softmax(logits, -1)[0].backward()
    assert float(logits.grad.norm()) == pytest.approx(math.sqrt(0.375))


def test_the_policys_distributions_are_read_from_its_forward_pass():
    policy, _ = two_tokens()
    rollout = Rollout([[0]], torch.tensor([[0, 1]]), torch.tensor([[True, True]]))
    logprobs, entropy, sum_squares = distribution_stats(policy, rollout)
    assert sum_squares.tolist() == [[0.5, 0.5]]  # p = (1/2, 1/2): 1/4 + 1/4
    assert logprobs.requires_grad
    assert entropy[0].tolist() == pytest.approx([math.log(2)] * 2)


def test_a_policy_without_its_distributions_is_refused():
    class Opaque:
        def token_stats(self, rollout):
            return torch.zeros(1, 2), torch.zeros(1, 2)

    rollout = Rollout([[0]], torch.tensor([[0, 1]]), torch.tensor([[True, True]]))
    with pytest.raises(DistributionError, match="Opaque has no token_distribution"):
        distribution_stats(Opaque(), rollout)


def test_correlations_and_ties():
    x = torch.tensor([1.0, 2.0, 3.0, 4.0])
    assert pearson(x, 2 * x + 1) == pytest.approx(1.0)
    assert spearman(x, x**3) == pytest.approx(1.0)  # monotone: ranks equal
    assert spearman(x, -x) == pytest.approx(-1.0)
    # Ties: y = (0, 0, 1, 1) ranks (0.5, 0.5, 2.5, 2.5); with x's ranks (0, 1, 2, 3), both centred:
    # (-1.5, -0.5, 0.5, 1.5) . (-1, -1, 1, 1) = 4, norms sqrt(5) and 2: 4 / (2 sqrt 5) = 2 / sqrt 5.
    assert spearman(x, torch.tensor([0.0, 0.0, 1.0, 1.0])) == pytest.approx(2 / math.sqrt(5))
    assert pearson(x, torch.ones(4)) is None
    assert spearman(x[:1], x[:1]) is None


def test_token_gradients_bin_by_probability_and_entropy():
    tokens = TokenGradients()
    # Two tokens of two-class distributions: p_y = 0.6 (sum p^2 = 0.36 + 0.16 = 0.52: direction
    # sqrt(1 - 1.2 + 0.52) = sqrt(0.32)) and p_y = 0.95 (sum p^2 = 0.9025 + 0.0025 = 0.905: direction
    # sqrt(1 - 1.9 + 0.905) = sqrt(0.005)); coefficients 2 and -1; a third position is padding.
    logprobs = torch.tensor([[math.log(0.6), math.log(0.95), 0.0]])
    tokens.add(logprobs, torch.tensor([[0.69, 0.2, 0.0]]), torch.tensor([[0.52, 0.905, 1.0]]),
               torch.tensor([[2.0, -1.0, 5.0]]), torch.tensor([[True, True, False]]))
    out = tokens.result()
    assert out["tokens"] == 2
    by_p = {(b["low"], b["high"]): b for b in out["probability_bins"]}
    assert by_p[(0.5, 0.9)]["count"] == 1
    assert by_p[(0.5, 0.9)]["mean_direction"] == pytest.approx(math.sqrt(0.32), rel=1e-5)
    assert by_p[(0.5, 0.9)]["mean_norm"] == pytest.approx(2 * math.sqrt(0.32), rel=1e-5)
    assert by_p[(0.9, 0.99)]["mean_norm"] == pytest.approx(math.sqrt(0.005), rel=1e-3)
    assert by_p[(0.0, 1e-4)] == {"low": 0.0, "high": 1e-4, "count": 0, "mean_norm": None, "mean_direction": None}
    by_h = {(b["low"], b["high"]): b["count"] for b in out["entropy_bins"]}
    assert by_h[(0.6, 1.0)] == 1 and by_h[(0.1, 0.3)] == 1 and out["entropy_bins"][-1]["high"] is None
    assert out["spearman"]["direction_vs_probability"] == pytest.approx(-1.0)


# ----------------------------------------------------------------------------- the full loss


def test_the_full_loss_drops_masks_and_regularisers_only():
    objective = load("stapo")
    full = mask_free(objective)
    assert full.masks == [] and full.regularisers == []
    assert full.surrogate == objective.surrogate and full.aggregation == objective.aggregation
    assert full.advantage == objective.advantage


# ----------------------------------------------------------------------------- in the trainer


def quick_config(instruments: bool, **extra) -> TrainConfig:
    settings = {k: v for k, v in QUICK.items() if k != "name"}
    return TrainConfig(**settings, steps=2, seed=0, instruments=instruments, **extra)


def train(objective, cache, instruments: bool):
    run = Run(load(objective), quick_config(instruments), "add2", cache_dir=cache)
    rows = [run.start()] + [run.step().row for _ in range(2)]
    return rows, [p.detach().clone() for p in run.policy.trainable_parameters()], run.optimizer.state_dict()


@pytest.mark.parametrize("objective", ["stapo", EVERYTHING_AND_NOTHING])
def test_instruments_change_nothing_but_add_the_mechanism_field(cache, objective):
    plain_rows, plain_weights, plain_adam = train(objective, cache, False)
    rows, weights, adam = train(objective, cache, True)
    assert all("mechanism" not in row for row in plain_rows)
    assert [{k: v for k, v in row.items() if k != "mechanism"} for row in rows] == plain_rows
    assert all(torch.equal(a, b) for a, b in zip(weights, plain_weights))
    assert all(torch.equal(a, b) for a, b in zip(adam["state"][0].values(), plain_adam["state"][0].values()))
    labels = rows[1]["masks"].keys()
    for row in rows[1:]:
        mechanism = row["mechanism"]
        assert mechanism["space"] == "parameters"
        assert set(mechanism["masks"]) == set(labels)
        for label, share in mechanism["masks"].items():
            assert share["silenced"] == row["masks"][label]["silenced"]
        assert mechanism["logit_grad"]["tokens"] > 0


def test_in_the_trainer_silencing_nothing_shares_0_and_everything_1(cache):
    rows, _, _ = train(EVERYTHING_AND_NOTHING, cache, True)
    for row in rows[1:]:
        mechanism = row["mechanism"]
        assert mechanism["full_grad_norm"] > 0  # the quick warm start gives mixed groups
        everything, nothing = mechanism["masks"]["expression_0"], mechanism["masks"]["expression_1"]
        assert everything["share"] == 1.0 and everything["cosine"] == pytest.approx(1.0)
        assert nothing == {"share": 0.0, "cosine": None, "silenced": 0}


def test_a_step_meter_on_one_micro_batch_matches_the_full_losss_own_backward(cache):
    # g_full is the gradient of the mask-free loss: compare with plain autograd through that loss.
    run = Run(load("stapo"), quick_config(True, updates_per_step=1), "add2", cache_dir=cache)
    policy = run.policy
    problems = run.task.problems(2, torch.Generator().manual_seed(5))
    rollout = policy.sample([policy.codec.encode(p.prompt) for p in problems for _ in range(4)], max_new_tokens=6,
                            temperature=1.0, generator=torch.Generator().manual_seed(6))
    from rlstab.batch import TokenBatch

    rewards = torch.tensor([1.0, 0.0] * 4)
    group_ids = torch.arange(2).repeat_interleave(4)
    with torch.no_grad():
        old, old_entropy = policy.token_stats(rollout)

    def batch_of(rows, logprobs, entropy):
        return TokenBatch(logprobs=logprobs, old_logprobs=old[rows], response_mask=rollout.response_mask[rows],
                          entropy=entropy, rewards=rewards[rows], group_ids=group_ids[rows])

    rows = list(range(8))
    gathered = [batch_of(rows, old, old_entropy)]
    before = run.loss_fn.state_dict()
    stats = run.loss_fn.gather(gathered)
    meter = StepMeter(run.loss_fn)
    meter.measure(policy, rollout, [rows], batch_of, (old, old_entropy), stats, before)

    full = mask_free(run.loss_fn.objective).compile()
    full_stats = full.gather(gathered)
    logprobs, entropy = policy.token_stats(rollout)
    loss = full(batch_of(rows, logprobs, entropy.detach()), step=full_stats).loss
    expected = torch.cat([g.reshape(-1).double() for g in torch.autograd.grad(loss, policy.trainable_parameters())])
    assert torch.allclose(meter.shares.full, expected, rtol=1e-5, atol=1e-9)
    assert meter.result()["full_grad_norm"] == pytest.approx(float(expected.norm()), rel=1e-5)


def test_dapos_run_reports_what_s2t_would_have_silenced(cache):
    # A shadow S2T (loose threshold, so the quick run has tokens to catch) is measured while dapo trains.
    shadowed = {"extends": "dapo", "name": "dapo", "shadow_masks": [{"kind": "s2t", "tau_p": 0.5}]}
    rows, weights, _ = train(shadowed, cache, True)
    _, dapo_weights, _ = train("dapo", cache, False)
    assert all(torch.equal(a, b) for a, b in zip(weights, dapo_weights))  # the shadow mask does not act
    for row in rows[1:]:
        s2t = row["mechanism"]["masks"]["shadow/s2t"]
        assert s2t["silenced"] == row["loss"]["shadow/s2t/silenced"]
        if s2t["silenced"]:
            assert 0 < s2t["share"] and -1 <= s2t["cosine"] <= 1
