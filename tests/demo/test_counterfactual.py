"""The counterfactual audit's updates on the tiny model: restoring the state makes an update repeat exactly, the
mask arm is the objective's own update, every null set has the mask's count of positive-advantage tokens, and the
per-state p-values and their combination are those of the stored values."""

from __future__ import annotations

import copy
import dataclasses

import pytest
import torch

import rlstab
from rlstab.batch import TokenBatch
from rlstab.demo.audit import collect
from rlstab.demo.counterfactual import MEASURES, Updater, audit_state, combine, mask_tokens, problems_of
from rlstab.demo.counterfactual_states import model_state, policy_for
from rlstab.demo.counterfactual_stats import exact_p_value, random_sets, silenced_covariance
from rlstab.loading import load
from rlstab.trainer.tasks import get_task, held_out_problems

# S2T with a large probability threshold, so that an untrained model's sample has silenced tokens.
LOOSE = {"extends": "stapo", "name": "loose-s2t", "masks": [{"kind": "s2t", "tau_p": 0.5}]}


@pytest.fixture(scope="module")
def task():
    return get_task("add2")


@pytest.fixture
def policy(task):
    torch.manual_seed(0)
    return policy_for("tiny", task)


@pytest.fixture
def state(policy):
    """The policy with Adam's moments after one step (a fresh Adam's first step is lr * sign(g), whatever g)."""
    params = policy.trainable_parameters()
    optimizer = torch.optim.Adam(params, lr=1e-3)
    sum(p.sum() for p in params).backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    s = model_state(policy, label="test", lr=1e-3, max_grad_norm=1.0)
    return dataclasses.replace(s, optimizer=optimizer.state_dict())


def mixed(sample):
    """The sample with every group's rewards mixed (an untrained model answers nothing right): A > 0 on half."""
    return dataclasses.replace(sample, rewards=torch.tensor([1.0, 0.0] * (sample.responses // 2)))


@pytest.fixture
def sample(policy, task):
    return mixed(collect(policy, task, prompts=4, group_size=4, seed=3))


def test_restoring_the_state_makes_the_all_tokens_update_identical(policy, task, state, sample):
    updater = Updater(policy, task, load(LOOSE), state, sample, held_out_problems(task, 2), seed=0)
    nothing = torch.zeros_like(sample.response_mask)
    first = updater.update(nothing)
    silenced, _, _ = mask_tokens(sample, load(LOOSE))
    updater.update(silenced)  # another arm in between moves the weights and Adam's moments
    second = updater.update(nothing)
    assert float(first.norm()) > 0
    assert torch.equal(first, second)


def own_update(policy, objective, state, sample, micro_batch):
    """One update of the objective itself (its own masks acting), from ``state``, micro-batch by micro-batch."""
    from rlstab.demo.counterfactual_states import set_weights
    from rlstab.trainer.policy import Rollout

    set_weights(policy, state.weights)
    params = policy.trainable_parameters()
    before = [p.detach().clone() for p in params]
    optimizer = torch.optim.Adam(params, lr=state.lr)
    optimizer.load_state_dict(copy.deepcopy(state.optimizer))  # Adam steps its state in place
    optimizer.zero_grad(set_to_none=True)
    fn = objective.compile()
    rollout = Rollout([policy.codec.encode(sample.problems[int(g)].prompt) for g in sample.group_ids],
                      sample.response_ids, sample.response_mask, sample.rollout_logprobs)
    parts = [list(range(i, min(i + micro_batch, sample.responses))) for i in range(0, sample.responses, micro_batch)]

    def batch(rows, logprobs, entropy):
        return TokenBatch(logprobs=logprobs, old_logprobs=sample.logprobs[rows], response_mask=sample.response_mask[rows],
                          entropy=entropy, rewards=sample.rewards[rows], group_ids=sample.group_ids[rows])

    stats = fn.gather([batch(rows, sample.logprobs[rows], sample.entropy[rows]) for rows in parts])
    for rows in parts:
        logprobs, entropy = policy.token_stats(rollout.rows(rows))
        fn(batch(rows, logprobs, entropy.detach()), step=stats).loss.backward()
    torch.nn.utils.clip_grad_norm_(params, state.max_grad_norm)
    optimizer.step()
    return torch.cat([(p.detach() - b).flatten().double() for p, b in zip(params, before)])


def test_the_mask_arm_is_the_objectives_own_update_and_all_tokens_its_unmasked_one(policy, task, state, sample):
    objective = load(LOOSE)
    silenced, _, _ = mask_tokens(sample, objective)
    assert 0 < int(silenced.sum()) < sample.tokens
    updater = Updater(policy, task, objective, state, sample, held_out_problems(task, 2), seed=0, micro_batch=5)
    mask_arm = updater.update(silenced)
    all_tokens = updater.update(torch.zeros_like(silenced))
    assert torch.allclose(mask_arm, own_update(policy, objective, state, sample, 5), rtol=0, atol=1e-12)
    unmasked = load({"extends": "stapo", "name": "no-mask", "masks": {"replace": []}})
    assert torch.allclose(all_tokens, own_update(policy, unmasked, state, sample, 5), rtol=0, atol=1e-12)
    assert not torch.allclose(mask_arm, all_tokens)  # silencing changed the update


def test_a_state_audit_holds_its_null_and_its_p_values(policy, task, state, sample, monkeypatch):
    import rlstab.demo.audit as audit

    objective = load(LOOSE)
    monkeypatch.setattr(audit, "collect", lambda *args, **kwargs: sample)  # the sample with mixed rewards
    result = audit_state(policy, task, objective, state, prompts=4, group_size=4, temperature=1.0, seed=3,
                         null_draws=3, held_out=2, index=1)
    silenced, positive, advantages = mask_tokens(sample, objective)
    m = int(silenced.sum())
    assert result["silenced"] == m > 0 and result["null_draws"] == 3 and result["restore_check"] == 0.0
    assert result["positive_tokens"] == int(positive.sum())
    # the null sets the audit drew (seed * 100_000 + index): each m positive-advantage tokens
    candidates = positive.flatten().nonzero()[:, 0]
    for s in random_sets(candidates, m, 3, torch.Generator().manual_seed(3 * 100_000 + 1)):
        assert s.numel() == m and bool(positive.flatten()[s].all())
    for arm in ("mask", "probability_only"):
        for name in MEASURES:
            assert len(result["null"][name]) == 3
            assert result["tests"][arm][name]["p"] == exact_p_value(result["arms"][arm][name], result["null"][name])
    assert result["arms"]["all_tokens"]["update_angle"] == 0.0
    assert result["arms"]["mask"]["update_angle"] > 0
    first = result["first_order"]
    assert first["covariance"] == silenced_covariance(sample.logprobs, advantages, sample.response_mask, silenced)
    measured = result["arms"]["mask"]["entropy_change"] - result["arms"]["all_tokens"]["entropy_change"]
    assert first["measured_held_out"] == measured
    assert first["agrees_held_out"] == ((first["covariance"] > 0) == (measured > 0))


def test_a_slow_state_says_its_progress_at_every_draw(policy, task, state, sample, monkeypatch):
    import rlstab.demo.audit as audit
    import rlstab.demo.counterfactual as counterfactual

    monkeypatch.setattr(audit, "collect", lambda *args, **kwargs: sample)
    monkeypatch.setattr(counterfactual, "PROGRESS_EVERY_S", 0.0)  # every draw is "a minute later"
    lines = []
    audit_state(policy, task, load(LOOSE), state, prompts=4, group_size=4, temperature=1.0, seed=3,
                null_draws=3, held_out=2, index=1, log=lines.append)
    said = [line.split(": ", 2)[2].split(" (")[0] for line in lines[1:]]
    # after the header: the arms, then each of the 3 draws (not only every 10th and the last)
    assert said == ["the arms measured", "null draw 1/3", "null draw 2/3", "null draw 3/3"]


def test_a_mask_that_silences_nothing_leaves_nothing_to_test(policy, task, state, sample, monkeypatch):
    import rlstab.demo.audit as audit

    monkeypatch.setattr(audit, "collect", lambda *args, **kwargs: sample)
    strict = load({"extends": "stapo", "name": "strict", "masks": [{"kind": "s2t", "tau_p": 1e-30}]})
    result = audit_state(policy, task, strict, state, prompts=4, group_size=4, temperature=1.0, seed=3,
                         null_draws=50, held_out=2)
    assert result["silenced"] == 0 and result["tests"] is None and result["null_draws"] == 0
    assert result["arms"]["mask"] == result["arms"]["all_tokens"] == result["arms"]["probability_only"]
    assert combine([result])["states"] == 0 and combine([result])["untested_states"] == ["test"]


def fake_state(label, mask_ps, above):
    """A state's result with the mask's p-value ``mask_ps[m]`` for each measure, above its null median or not."""
    tests = {name: {"p": p, "null_median": 0.0} for name, p in zip(MEASURES, mask_ps)}
    value = 1.0 if above else -1.0
    return {"label": label, "tests": {"mask": tests, "probability_only": tests},
            "arms": {arm: dict.fromkeys(MEASURES, value) for arm in ("mask", "probability_only")},
            "first_order": {"agrees_held_out": True, "agrees_batch": False, "null_agree_held_out": 3,
                            "null_decided_held_out": 4, "null_agree_batch": 1, "null_decided_batch": 4}}


def test_combining_states_is_fishers_method_then_holm_over_the_measures():
    states = [fake_state("a", [0.1, 0.5, 1.0, 1.0, 1.0, 1.0], True),
              fake_state("b", [0.1, 0.5, 1.0, 1.0, 1.0, 1.0], False),
              {"label": "c", "tests": None}]
    c = combine(states)
    assert c["states"] == 2 and c["untested_states"] == ["c"]
    first = c["mask"][MEASURES[0]]
    # X = -2 (ln 0.1 + ln 0.1) = 9.21034; p = exp(-X/2)(1 + X/2) = 0.056052
    assert first["fisher"] == pytest.approx(9.21034, abs=1e-5) and first["p"] == pytest.approx(0.056052, abs=1e-6)
    assert (first["above_null_median"], first["below_null_median"]) == (1, 1)
    # second measure: X/2 = -2 ln 0.5 = 1.386294; p = 0.25 (1 + 1.386294) = 0.596574
    assert c["mask"][MEASURES[1]]["p"] == pytest.approx(0.596574, abs=1e-6)
    # Holm over the six measures: 6 x 0.056052, then max(that, 5 x 0.596574) capped at 1, then 1
    assert first["p_holm"] == pytest.approx(6 * 0.056052, abs=1e-5)
    assert c["mask"][MEASURES[1]]["p_holm"] == 1.0
    assert c["first_order"]["held_out"] == {"agree": 2, "decided": 2, "null_agree": 6, "null_decided": 8}
    assert c["first_order"]["batch"]["agree"] == 0


def test_what_cannot_be_audited_says_why():
    assert problems_of(rlstab.load("stapo")) == []
    assert "no mask" in problems_of(rlstab.load("dapo"))[0]
    given = load({"extends": "stapo", "name": "given", "advantage": {"kind": "given"}})
    assert any("given" in p for p in problems_of(given))
    reads_ref = load({"extends": "stapo", "name": "ref",
                      "masks": [{"kind": "expression", "silence": "ref_logprob < -5"}]})
    assert any("ref_logprobs" in p for p in problems_of(reads_ref))
