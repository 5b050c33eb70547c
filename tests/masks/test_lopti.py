"""Lopti: the two phases, their denominators, and a two-update step against the authors' procedure."""

import math

import pytest
import torch

import rlstab
from rlstab.compiler.lopti_phases import lopti_phases
from rlstab.masks import Lopti

MASK = torch.tensor([[True, True, True], [True, True, False]])
# p_old: row 0 = 0.1, 0.5, 0.9; row 1 = 0.49, 0.7 (and padding)
P_OLD = torch.tensor([[0.1, 0.5, 0.9], [0.49, 0.7, 0.2]])


def phase_keep(phase: str) -> list:
    objective = rlstab.load({"masks": [{"kind": "lopti", "phase": phase}], "surrogate": {"kind": "none"},
                             "aggregation": {"kind": "token-sum", "count": "valid"}})
    logprobs = P_OLD.log().requires_grad_()
    out = objective.compile()(rlstab.TokenBatch(logprobs=logprobs, advantages=torch.ones(2), response_mask=MASK))
    out.loss.backward()
    return (-logprobs.grad).tolist()  # 1 where the token trains (A = 1, r = 1)


def test_low_phase_keeps_p_old_below_eta_and_high_the_rest():
    # eta = 0.5: 0.1 and 0.49 are low; 0.5 (not < 0.5, as the authors' strict test), 0.9 and 0.7 are high
    assert phase_keep("low") == [[1, 0, 0], [1, 0, 0]]
    assert phase_keep("high") == [[0, 1, 1], [0, 1, 0]]


def test_the_partition_uses_the_old_policy():
    # current p = 0.9 everywhere, p_old = 0.1: the token is low-probability for Lopti
    objective = rlstab.load({"masks": [{"kind": "lopti"}], "surrogate": {"kind": "none"},
                             "aggregation": {"kind": "token-sum", "count": "valid"}})
    b = rlstab.TokenBatch(logprobs=torch.full((1, 1), math.log(0.9)), old_logprobs=torch.full((1, 1), math.log(0.1)),
                          advantages=torch.ones(1), response_mask=torch.ones(1, 1, dtype=torch.bool))
    assert objective.compile()(b).metrics["tokens/kept"] == 1


def test_each_phase_divides_by_all_valid_tokens():
    # lopti preset: token-mean over the 5 valid tokens. On-policy, A = +1: l = -1 per kept token.
    # low: 2 tokens -> -2/5; high: 3 tokens -> -3/5; together the plain loss -5/5.
    low, high = (o.compile() for o in lopti_phases(rlstab.load("lopti")))
    b = rlstab.TokenBatch(logprobs=P_OLD.log(), advantages=torch.ones(2), response_mask=MASK)
    assert low(b).loss.item() == pytest.approx(-0.4)
    assert high(b).loss.item() == pytest.approx(-0.6)


def test_lopti_phases_sets_every_lopti_mask_and_keeps_the_rest():
    o = rlstab.load({"extends": "lopti", "masks": [{"kind": "s2t"}, {"kind": "lopti", "eta": 0.3, "phase": "high"}]})
    low, high = lopti_phases(o)
    assert [m.kind for m in low.masks] == ["s2t", "lopti"]
    assert (low.masks[1].phase, high.masks[1].phase) == ("low", "high")
    assert low.masks[1].eta == high.masks[1].eta == 0.3
    assert low.surrogate == high.surrogate == o.surrogate
    with pytest.raises(ValueError, match="has no lopti mask"):
        lopti_phases(rlstab.load("grpo"))


def test_the_lopti_preset():
    o = rlstab.load("lopti")
    (m,) = o.masks
    assert (m.kind, m.eta, m.phase) == ("lopti", 0.5, "low")
    assert (o.aggregation.kind, o.aggregation.count) == ("token-mean", "valid")
    assert (o.surrogate.eps_low, o.surrogate.eps_high, o.surrogate.dual_clip) == (0.2, 0.24, 10.0)


def test_bad_eta_is_refused():
    with pytest.raises(rlstab.ConfigError, match=r"masks\[0\]\.eta = 1\.0"):
        rlstab.load({"extends": "lopti", "masks": [{"kind": "lopti", "eta": 1.0}]})
    with pytest.raises(rlstab.ConfigError, match=r"masks\[0\]\.phase = 'both'"):
        rlstab.load({"extends": "lopti", "masks": [{"kind": "lopti", "phase": "both"}]})


# ---------------------------------------------------------------- a two-update step


def textbook_loss(logp, old, adv, valid, eps_low=0.2, eps_high=0.24, c=10.0):
    """veRL's dual-clip PPO token loss with autograd, token-mean over all valid tokens."""
    r = torch.exp(logp - old)
    clipped = torch.maximum(-adv * r, -adv * torch.clamp(r, 1 - eps_low, 1 + eps_high))
    loss = torch.where(adv < 0, torch.minimum(clipped, -adv * c), clipped)
    return (loss * valid).sum() / valid.sum()


def test_two_phase_step_matches_the_authors_procedure():
    """The authors zero the other phase's advantages and run update_actor twice; lopti_phases does the same."""
    g = torch.Generator().manual_seed(0)
    B, T, V = 4, 6, 5
    logits0 = torch.randn(B, T, V, generator=g) * 2.0
    tokens = torch.randint(0, V, (B, T), generator=g)
    valid = torch.arange(T) < torch.tensor([6, 4, 5, 2]).unsqueeze(-1)
    adv = torch.tensor([1.0, -0.5, 2.0, -1.5])

    def logp_of(logits):
        return torch.log_softmax(logits, -1).gather(-1, tokens.unsqueeze(-1)).squeeze(-1)

    old = logp_of(logits0).detach()
    low_tokens = old.exp() < 0.5
    assert 0 < int((low_tokens & valid).sum()) < int(valid.sum())  # both phases have tokens
    lr = 3.0  # large steps: the second phase sees ratios far from 1, clipped on both sides

    # Reference: the authors' two update_actor calls with zeroed advantages.
    ref = logits0.clone().requires_grad_()
    opt = torch.optim.SGD([ref], lr=lr)
    for phase_tokens in (low_tokens, ~low_tokens):
        opt.zero_grad()
        a = torch.where(phase_tokens, adv.unsqueeze(-1).expand(B, T), 0.0)
        textbook_loss(logp_of(ref), old, a, valid.float()).backward()
        opt.step()

    # rlstab: the two phases of the lopti preset, each a full update.
    ours = logits0.clone().requires_grad_()
    opt = torch.optim.SGD([ours], lr=lr)
    clipped = []
    for objective in lopti_phases(rlstab.load("lopti")):
        loss_fn = objective.compile()
        opt.zero_grad()
        batch = rlstab.TokenBatch(logprobs=logp_of(ours), old_logprobs=old, advantages=adv, response_mask=valid)
        stats = loss_fn.gather([rlstab.TokenBatch(logprobs=logp_of(ours).detach(), old_logprobs=old,
                                                  advantages=adv, response_mask=valid)])
        out = loss_fn(batch, step=stats)
        out.loss.backward()
        clipped.append(out.metrics["clip/high_fraction"] + out.metrics["clip/low_fraction"])
        opt.step()
    assert clipped[0] == 0 and clipped[1] > 0  # the second phase runs on the moved policy
    torch.testing.assert_close(ours.detach(), ref.detach(), rtol=0, atol=1e-5)
    assert not torch.allclose(ours.detach(), logits0)


def test_lopti_is_a_mask_component():
    assert Lopti().describe() == "lopti (low): keep iff p_old < 0.5 (the first of two updates per step)"
