"""The mechanism along training on the tiny model: the null sets are count-matched (null A among the positive-advantage
tokens, null B among the probability condition's), S's share is StepMeter's, the batched and looped null shares are
equal, and a state where the mask silences nothing is reported and left out of the combination."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from rlstab.demo.audit import audit_mechanism, collect
from rlstab.demo.counterfactual import mask_tokens
from rlstab.demo.counterfactual_states import policy_for
from rlstab.demo.mechanism_along import combine, measure_sample, null_sets, probability_condition, state_seed
from rlstab.loading import load
from rlstab.trainer.tasks import get_task

# S2T with thresholds an untrained model's near-uniform probabilities (about 0.03 to 0.2) cross: S is a part of
# the probability condition's tokens, which are a part of the positive-advantage ones.
LOOSE = {"extends": "stapo", "name": "loose-s2t", "masks": [{"kind": "s2t", "tau_p": 0.06, "entropy_quantile": 0.5}]}


@pytest.fixture(scope="module")
def policy():
    torch.manual_seed(0)
    return policy_for("tiny", get_task("add2"))


@pytest.fixture(scope="module")
def sample(policy):
    """Two problems x four responses, every group's rewards mixed (an untrained model answers nothing right)."""
    s = collect(policy, get_task("add2"), prompts=2, group_size=4, seed=3)
    return dataclasses.replace(s, rewards=torch.tensor([1.0, 0.0] * (s.responses // 2)))


def test_null_sets_are_count_matched_within_their_pools(sample):
    objective = load(LOOSE)
    silenced, positive, _ = mask_tokens(sample, objective)
    admitted, why = probability_condition(objective, sample, positive)
    m = int(silenced.sum())
    # null B's pool, by hand: A > 0 and p < tau_p; it holds S, and is smaller than null A's
    assert why == "" and torch.equal(admitted, positive & (sample.logprobs.exp() < 0.06))
    assert bool((silenced <= admitted).all()) and 0 < m < int(admitted.sum()) < int(positive.sum())
    sets = null_sets({"a": positive, "b": admitted}, m, 20, torch.Generator().manual_seed(0))
    assert len(sets["a"]) == len(sets["b"]) == 20
    for name, pool in (("a", positive), ("b", admitted)):
        for s in sets[name]:
            assert int(s.sum()) == m and bool((s <= pool).all()), name
    assert len({tuple(s.flatten().nonzero()[:, 0].tolist()) for s in sets["a"]}) > 1  # random, not one set
    assert null_sets({"a": positive, "b": None}, 0, 20, torch.Generator()) == {"a": [], "b": []}


def test_null_b_is_undefined_for_a_mask_of_another_kind(sample):
    objective = load({"extends": "stapo", "name": "low-p", "masks": {"replace": [{"kind": "low_probability"}]}})
    silenced, positive, _ = mask_tokens(sample, objective)
    admitted, why = probability_condition(objective, sample, positive)
    assert admitted is None and why.endswith("this objective's masks are low_probability")
    assert null_sets({"a": positive, "b": admitted}, 3, 5, torch.Generator().manual_seed(0))["b"] == []


def test_the_masks_share_is_step_meters_and_batched_null_shares_equal_the_loops(policy, sample):
    objective = load(LOOSE)
    looped, _ = measure_sample(policy, sample, objective, null_draws=3, generator=torch.Generator().manual_seed(1))
    batched, _ = measure_sample(policy, sample, objective, null_draws=3, generator=torch.Generator().manual_seed(1),
                                batched=True, chunk=2)
    meter = audit_mechanism(sample, policy, objective)["masks"]["s2t"]
    assert looped["informative"] and looped["silenced"] == meter["silenced"] > 0
    assert looped["share"] == pytest.approx(meter["share"], rel=1e-6)
    assert looped["cosine"] == pytest.approx(meter["cosine"], rel=1e-6, abs=1e-9)
    for name in ("null_a", "null_b"):
        assert len(looped[name]["shares"]) == 3 and looped[name]["shares"] != [looped["share"]] * 3
        assert batched[name]["shares"] == pytest.approx(looped[name]["shares"], rel=1e-9)
        # the p-value is the rank of S's share among its null's, by hand
        above = sum(x >= looped["share"] for x in looped[name]["shares"])
        assert looped[name]["p"] == (1 + above) / 4
    assert batched["backward_passes"] < looped["backward_passes"]


def test_a_state_where_the_mask_silences_nothing_is_uninformative(policy, sample):
    strict = load({"extends": "stapo", "name": "strict", "masks": [{"kind": "s2t", "tau_p": 1e-30}]})
    out, _ = measure_sample(policy, sample, strict, null_draws=3, generator=torch.Generator())
    assert (out["silenced"], out["informative"], out["share"], out["null_a"], out["null_b"]) == (0, False, None, None, None)
    assert out["uninformative_reason"] == "m = 0: the mask silenced no token"
    assert out["fixed_p"]["tokens"] > 0  # the correlation is measured in every state


def test_the_combination_leaves_uninformative_states_out():
    def state(label, informative, pa=None, pb=None):
        return {"label": label, "informative": informative, "null_a": None if pa is None else {"p": pa},
                "null_b": None if pb is None else {"p": pb}}

    out = combine([state("s1", True, 0.1, 0.5), state("s2", False), state("s3", True, 0.2, None)])
    assert out["informative_states"] == 2 and out["uninformative_states"] == ["s2"]
    # Fisher over 0.1 and 0.2: X = -2 ln(0.02) = 7.824; p = e^{-X/2} (1 + X/2) = 0.02 (1 + 3.912) = 0.09824
    assert out["null_a"]["states"] == 2 and out["null_a"]["fisher"] == pytest.approx(-2 * math.log(0.02))
    assert out["null_a"]["p"] == pytest.approx(0.02 * (1 - math.log(0.02)))
    assert out["null_b"] == {"states": 1, "fisher": pytest.approx(-2 * math.log(0.5)), "p": pytest.approx(0.5)}


def test_each_state_gets_its_own_batch_seed():
    assert state_seed(0, 0, 5) == state_seed(0, 0, 5)
    assert len({state_seed(0, 0, 5), state_seed(0, 0, 10), state_seed(0, 1, 5), state_seed(1, 0, 5)}) == 4
