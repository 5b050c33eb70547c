"""W-REINFORCE's positive-sample weight as an rlstab reweighter: hand-computed losses and gradients, padding.

The first tests call the component directly (``WReinforce().weights(tokens, None)``); the others run
it through ``rlstab.load``, which finds it through the ``rlstab.components`` entry point of this
distribution (installed: ``pip install ./examples/rlstab-wreinforce``).
"""

from __future__ import annotations

import math
from importlib.metadata import entry_points

import pytest
import rlstab
import torch
from pydantic import ValidationError
from rlstab.reweighters import Reweighter
from rlstab.testing import check_component
from rlstab.tokens import Tokens

from rlstab_wreinforce import WReinforce

NO_DUAL = {"kind": "ppo_clip", "eps_low": 0.2, "eps_high": 0.2, "dual_clip": None}


def tokens(advantages, T: int = 2) -> Tokens:
    adv = torch.as_tensor(advantages, dtype=torch.float32)
    lp = torch.full((adv.shape[0], T), -1.0)
    batch = rlstab.TokenBatch(logprobs=lp, old_logprobs=lp, advantages=adv, response_mask=torch.ones_like(lp, dtype=torch.bool))
    t = Tokens.from_batch(batch, 20.0)
    t.set_advantages(adv)
    return t


def test_the_weight_is_lambda_on_positive_advantages_and_one_elsewhere():
    w = WReinforce().weights(tokens([2.0, -0.5, 0.0]), None)
    assert w.dtype == torch.float32
    assert torch.equal(w, torch.tensor([[0.1], [1.0], [1.0]]))  # per response: [B, 1]
    w = WReinforce(positive_weight=0.25).weights(tokens([[1.0, -1.0]]), None)
    assert torch.equal(w, torch.tensor([[0.25, 1.0]]))  # per-token advantages: [B, T]


def test_hand_computed_loss_and_gradient():
    # Two one-token responses, token-mean over N = 2, PPO clip 0.2, no dual-clip.
    # Row 0: A = +1, log r = log 1.1 (inside [0.8, 1.2]): l = -A r = -1.1, dl/dlogp = -A r = -1.1; weight 0.1
    # Row 1: A = -2, log r = log 0.5 (below 0.8; for A < 0 the unclipped branch is the max):
    #        l = max(-A r, -A clip(r)) = max(1.0, 1.6) = 1.6 (clipped: no gradient); weight 1
    # loss = (0.1 * -1.1 + 1 * 1.6) / 2 = (-0.11 + 1.6) / 2 = 0.745
    # grad = [0.1 * -1.1 / 2, 0] = [-0.055, 0]
    old = torch.tensor([[-1.0], [-1.0]])
    lp = (old + torch.log(torch.tensor([[1.1], [0.5]]))).requires_grad_()
    batch = rlstab.TokenBatch(logprobs=lp, old_logprobs=old, advantages=torch.tensor([1.0, -2.0]),
                              response_mask=torch.ones(2, 1, dtype=torch.bool))
    objective = rlstab.load({"extends": "grpo", "surrogate": NO_DUAL, "reweighters": [{"kind": "w_reinforce"}]})
    out = objective.compile()(batch)
    out.loss.backward()
    assert out.loss.item() == pytest.approx(0.745, abs=1e-6)
    assert torch.allclose(lp.grad, torch.tensor([[-0.055], [0.0]]), atol=1e-7)
    # without the weight: (-1.1 + 1.6) / 2 = 0.25
    plain = rlstab.load({"extends": "grpo", "surrogate": NO_DUAL}).compile()(batch)
    assert plain.loss.item() == pytest.approx(0.25, abs=1e-6)


def test_it_is_the_authors_weighted_advantage():
    """compute_psr_nsr_outcome_advantage('weighted'), restated: A = lambda R for R = 1, R - 1 for R = 0;
    the surrogate on those advantages equals the reweighter on advantages +-1 (2R - 1)."""
    g = torch.Generator().manual_seed(0)
    rewards = torch.tensor([1.0, 0.0, 1.0, 0.0, 0.0, 1.0])
    old = -torch.rand(6, 5, generator=g) * 3
    lp = old + 0.3 * torch.randn(6, 5, generator=g)  # ratios inside and outside the clip range
    mask = torch.arange(5) < torch.tensor([5, 3, 1, 4, 5, 2])[:, None]
    authors = torch.where(rewards == 1, 0.1 * rewards, rewards - 1)  # lambda for correct, -1 for wrong

    def run(advantages, reweighters):
        logprobs = lp.clone().requires_grad_()
        batch = rlstab.TokenBatch(logprobs=logprobs, old_logprobs=old, advantages=advantages, response_mask=mask)
        loss = rlstab.load({"extends": "grpo", "surrogate": NO_DUAL, "reweighters": reweighters}).compile()(batch).loss
        loss.backward()
        return loss.detach(), logprobs.grad

    theirs, their_grad = run(authors, [])
    ours, our_grad = run(2 * rewards - 1, [{"kind": "w_reinforce", "positive_weight": 0.1}])
    assert ours.item() == pytest.approx(theirs.item(), abs=1e-7)
    assert torch.allclose(our_grad, their_grad, atol=1e-8)
    assert their_grad.abs().sum() > 0


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_padding_gets_a_finite_weight(value):
    t = tokens([[1.0, value], [-1.0, value]])
    w = WReinforce().weights(t, None)
    assert torch.isfinite(w).all()
    assert torch.equal(w[:, 0], torch.tensor([0.1, 1.0]))


# ---------------------------------------------------------------------------------------------------- the component


def test_default_and_description():
    w = WReinforce()
    assert isinstance(w, Reweighter) and w.kind == "w_reinforce" and w.positive_weight == 0.1
    assert w.reads == frozenset()
    assert WReinforce(positive_weight=0.25).describe() == "w_reinforce: w = 0.25 if A > 0 else 1"
    assert WReinforce.model_fields["positive_weight"].description


@pytest.mark.parametrize("fields", [{"positive_weight": 0.0}, {"positive_weight": 1.5}, {"positive_weight": "0.1"},
                                    {"lambda": 0.1}])
def test_invalid_fields_are_refused(fields):
    with pytest.raises(ValidationError):
        WReinforce(**fields)


def test_the_entry_point_names_the_class_and_its_kind():
    (ep,) = entry_points(group="rlstab.components", name="w_reinforce")  # installed: pip install ./examples/rlstab-wreinforce
    assert ep.value == "rlstab_wreinforce:WReinforce"
    assert ep.load() is WReinforce
    assert ep.name == WReinforce.model_fields["kind"].default


def test_the_example_objective_loads_and_explains(capsys):
    from pathlib import Path

    from rlstab.cli import main

    path = Path(__file__).parents[1] / "w_reinforce.yaml"
    objective = rlstab.load(path)
    assert list(objective.reweighters) == [WReinforce(positive_weight=0.1)]
    assert main(["explain", str(path)]) == 0
    assert "w_reinforce: w = 0.1 if A > 0 else 1" in capsys.readouterr().out


def test_w_reinforce_passes_rlstabs_conformance_kit():
    # YAML round trip, describe/explain, JSON Schema, padding, micro-batches == step, 2 gloo ranks == 1 process.
    check_component(WReinforce())
    check_component(WReinforce(positive_weight=0.5))
