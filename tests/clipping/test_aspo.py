"""ASPO: hand-computed cases from the released code's rules, and gradients against autograd of that code's formula."""

import math

import pytest
import torch
from clipping.cases import off_policy_batch, one_row, ratio, rlstab_loss_and_grad, token_mean_reference

import rlstab
from rlstab.clipping.aspo import _row_quantile

ASPO = {"kind": "aspo", "eps_low": 0.2, "eps_high": 0.2, "dual_clip": 3.0}


def test_hand_computed_every_branch():
    adv = [1.0, 1.0, 2.0, -1.0, -1.0, -0.5, 0.0]
    log_r = [0.1, 0.5, -1.5, 0.2, -0.5, 1.5, 0.3]
    out, grad = one_row(log_r, adv, ASPO, old=-2.0)
    # token  A     r         branch                          l                              dl/dlogp
    # 1      +1    1.10517   flipped, unclipped              -A / r = -0.9048374            -A / r = -0.9048374
    # 2      +1    1.64872   flipped, clipped at 1.2         -1 / 1.2 = -0.8333333          0
    # 3      +2    0.22313   1/r = 4.48 > 3: soft dual-clip  -A c log p = -2*3*(-3.5) = 21  -A c = -6
    # 4      -1    1.22140   unclipped                       -A r = 1.2214028               -A r = 1.2214028
    # 5      -1    0.60653   clipped at 0.8                  -A 0.8 = 0.8                   0
    # 6      -0.5  4.48169   r > 3: soft dual-clip           -A c log p = 1.5*(-0.5) = -0.75   -A c = 1.5
    # 7      0     1.34986   -                               0                              0
    # token-mean: 20.5332320 / 7 = 2.9333189
    assert out.loss.item() == pytest.approx(2.9333189, abs=1e-5)
    expected = torch.tensor([-0.9048374, 0.0, -6.0, 1.2214028, 0.0, 1.5, 0.0]) / 7
    assert torch.allclose(grad, expected, atol=1e-6)
    assert out.metrics["clip/high_fraction"] == pytest.approx(1 / 7)  # token 2
    assert out.metrics["clip/low_fraction"] == pytest.approx(1 / 7)  # token 5
    assert out.metrics["clip/dual_fraction"] == pytest.approx(2 / 7)  # tokens 3 and 6


def test_positive_weight_is_flipped_compared_with_ppo():
    # Same token (A = +1, r = 1.10517) under PPO and ASPO: gradient weight r versus 1 / r.
    _, ppo = one_row([0.1], [1.0], {"kind": "ppo_clip"})
    _, aspo = one_row([0.1], [1.0], ASPO)
    assert ppo.item() == pytest.approx(-math.exp(0.1), abs=1e-6)
    assert aspo.item() == pytest.approx(-math.exp(-0.1), abs=1e-6)


def test_high_entropy_tokens_get_the_wider_range():
    # One response, entropies [0.1, 0.5, 2.0, 0.3, 1.0]: sorted [0.1, 0.3, 0.5, 1.0, 2.0], the 0.8 quantile sits
    # at position 0.8 * 4 = 3.2 -> 1.0 + 0.2 * (2.0 - 1.0) = 1.2; only token 3 (2.0 > 1.2) is high-entropy.
    # Tokens 1 and 3: A = +1, r = e^0.3 = 1.34986. Token 1 (low entropy): clipped at 1.2 -> no gradient.
    # Token 3 (high entropy, range 0.4): 1.34986 <= 1.4, unclipped -> -1 / r = -0.7408182.
    surrogate = {**ASPO, "high_entropy": {"quantile": 0.8, "eps_low": 0.4, "eps_high": 0.4}}
    out, grad = one_row([0.3, 0.0, 0.3, 0.0, 0.0], [1.0, 0.0, 1.0, 0.0, 0.0], surrogate, entropy=[0.1, 0.5, 2.0, 0.3, 1.0])
    assert torch.allclose(grad, torch.tensor([0.0, 0.0, -0.7408182, 0.0, 0.0]) / 5, atol=1e-6)
    assert out.metrics["clip/high_fraction"] == pytest.approx(1 / 5)
    # Without the entropy split token 3 is clipped too.
    _, grad = one_row([0.3, 0.0, 0.3, 0.0, 0.0], [1.0, 0.0, 1.0, 0.0, 0.0], ASPO)
    assert torch.equal(grad, torch.zeros(5))


def test_row_quantile_is_torch_nanquantile_per_row():
    g = torch.Generator().manual_seed(0)
    values = torch.rand(7, 13, generator=g)
    valid = torch.rand(7, 13, generator=g) < 0.6
    valid[0] = True
    valid[1] = False
    valid[2] = False
    valid[2, 4] = True
    ours = _row_quantile(values, valid, 0.8)
    theirs = torch.nanquantile(torch.where(valid, values, torch.nan), 0.8, dim=-1, keepdim=True)
    assert torch.isinf(ours[1]).all() and torch.isnan(theirs[1]).all()  # empty row: nothing is above it
    keep = torch.arange(7) != 1
    assert torch.allclose(ours[keep], theirs[keep], atol=1e-6)


def released_code_loss(lp, batch, eps_low, eps_high, c):
    """Archer2.0's ``compute_policy_loss_archer`` per-token loss, written out with its stop-gradients."""
    A = batch.advantages
    r = ratio(lp, batch)
    ncr = torch.maximum(r, 1 - eps_low)
    pcr = torch.minimum(r, 1 + eps_high)
    neg_clip = -A * ncr
    pos_clip = -A * (pcr / pcr.detach()) / pcr.detach()
    neg = torch.where(ncr > c, -A * ncr.clamp(max=c).detach() * lp, neg_clip)
    pos = torch.where(1 / pcr > c, -A * (1 / pcr).clamp(max=c).detach() * lp, pos_clip)
    return torch.where(A < 0, neg, pos)


@pytest.mark.parametrize("entropy_split", [False, True])
@pytest.mark.parametrize("seed", range(4))
def test_value_and_gradient_match_the_released_formula(seed, entropy_split):
    batch = off_policy_batch(seed)
    surrogate = dict(ASPO)
    eps_low = eps_high = torch.tensor(0.2)
    if entropy_split:
        surrogate["high_entropy"] = {"quantile": 0.8, "eps_low": 0.4, "eps_high": 0.4}
        masked = torch.where(batch.response_mask, batch.entropy, torch.nan)
        q = torch.nanquantile(masked, 0.8, dim=-1, keepdim=True)
        high = batch.entropy > q
        eps_low = eps_high = torch.where(high, 0.4, 0.2)
    out, grad = rlstab_loss_and_grad(surrogate, batch)
    ref, ref_grad = token_mean_reference(lambda lp: released_code_loss(lp, batch, eps_low, eps_high, 3.0), batch)
    assert out.loss.item() == pytest.approx(ref.item(), abs=1e-5)
    assert torch.allclose(grad, ref_grad, atol=1e-6)
    assert out.metrics["clip/dual_fraction"] > 0 and out.metrics["clip/high_fraction"] > 0


def test_entropy_is_read_only_with_the_entropy_split():
    plain = rlstab.load({"surrogate": ASPO, "aggregation": {"kind": "token-mean", "count": "valid"}}).compile()
    assert plain.readers("entropy") == []
    assert rlstab.load("aspo").compile().readers("entropy") == ["surrogate (aspo)"]
    batch = off_policy_batch(0)
    batch.entropy = None
    with pytest.raises(rlstab.BatchError, match="surrogate \\(aspo\\) reads TokenBatch.entropy"):
        rlstab.load("aspo").compile()(batch)


def test_preset():
    s = rlstab.load("aspo").surrogate
    assert (s.eps_low, s.eps_high, s.dual_clip) == (0.2, 0.2, 3.0)
    assert (s.high_entropy.quantile, s.high_entropy.eps_low, s.high_entropy.eps_high) == (0.8, 0.4, 0.4)


def test_unknown_nested_field_is_refused():
    with pytest.raises(rlstab.ConfigError, match="high_entropy.*quantil"):
        rlstab.load({"surrogate": {**ASPO, "high_entropy": {"quantil": 0.8}}, "aggregation": {"kind": "token-mean", "count": "valid"}})
