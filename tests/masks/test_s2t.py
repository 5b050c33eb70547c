"""S2T and its ablations on a hand-built batch.

Two responses, A = (+1, -1), on-policy (r = 1, so l = -A on every kept token).
Valid entropies, sorted: 0.1 0.2 0.3 0.4 0.5 0.6 0.7 0.8 0.9 (9 tokens; row 1's last is padding).
Q_0.8: position 0.8 * 8 = 6.4 -> 0.7 + 0.4 * (0.8 - 0.7) = 0.74.
"""

import math

import pytest
import torch

import rlstab
from rlstab.explain import explain

H = torch.tensor([[0.1, 0.7, 0.8, 0.4, 0.5], [0.6, 0.2, 0.3, 0.9, 5.0]])
P = torch.tensor([[0.5, 0.001, 0.001, 0.0021, 0.0019], [0.5, 0.001, 0.5, 0.5, 0.5]])
MASK = torch.tensor([[True] * 5, [True] * 4 + [False]])
A = torch.tensor([1.0, -1.0])


def run(masks, count="kept"):
    logprobs = P.log().requires_grad_()
    batch = rlstab.TokenBatch(logprobs=logprobs, advantages=A, response_mask=MASK, entropy=H)
    objective = rlstab.load(
        {"masks": masks, "surrogate": {"kind": "ppo_clip"}, "aggregation": {"kind": "token-mean", "count": count}}
    )
    out = objective.compile()(batch)
    out.loss.backward()
    return out, logprobs.grad


def test_s2t_silences_low_probability_low_entropy_positive_tokens():
    out, grad = run([{"kind": "s2t"}])
    # Row 0: t1 (p 0.001, H 0.7 < 0.74) and t4 (p 0.0019, H 0.5) are silenced; t2 (H 0.8 >= 0.74) is
    # the quantile boundary and trains; t3 (p 0.0021 >= 0.002) trains. Row 1 has A < 0: nothing silenced.
    assert out.metrics["mask/s2t/entropy_threshold"] == pytest.approx(0.74)
    assert out.metrics["mask/s2t/silenced"] == 2
    assert out.metrics["mask/s2t/kept"] == 7
    # Kept tokens: row 0 t0 t2 t3 (l = -1 each), row 1 t0..t3 (l = +1 each): (-3 + 4) / 7 kept.
    assert out.loss.item() == pytest.approx(1 / 7)
    expected = torch.tensor([[-1, 0, -1, -1, 0], [1, 1, 1, 1, 0]]) / 7
    assert torch.allclose(grad, expected.float(), atol=1e-7)
    assert grad[0, 1].item() == 0.0 and grad[0, 4].item() == 0.0  # exactly zero, not small


def test_s2t_with_valid_token_denominator():
    out, _ = run([{"kind": "s2t"}], count="valid")
    assert out.loss.item() == pytest.approx(1 / 9)  # same sum, divided by the 9 valid tokens


def test_s2t_population_of_positive_tokens():
    # Row 0's entropies sorted: 0.1 0.4 0.5 0.7 0.8; position 0.8 * 4 = 3.2 -> 0.7 + 0.2 * 0.1 = 0.72.
    out, _ = run([{"kind": "s2t", "population": "positive"}])
    assert out.metrics["mask/s2t/entropy_threshold"] == pytest.approx(0.72)
    assert out.metrics["mask/s2t/silenced"] == 2


def test_s2t_old_policy_probability():
    logprobs = P.log().requires_grad_()
    old = torch.full_like(P, math.log(0.5))  # under the old policy nothing is unlikely
    batch = rlstab.TokenBatch(logprobs=logprobs, old_logprobs=old, advantages=A, response_mask=MASK, entropy=H)
    out_current = rlstab.load("stapo").compile()(batch)
    old_mask = rlstab.load({"extends": "stapo", "masks": [{"kind": "s2t", "prob_source": "old"}]})
    out_old = old_mask.compile()(batch)
    assert out_current.metrics["mask/s2t/silenced"] == 2
    assert out_old.metrics["mask/s2t/silenced"] == 0


def test_high_entropy_ablation_silences_the_other_side():
    out, grad = run([{"kind": "s2t", "entropy_side": "high"}])
    # Only row 0 t2 (p 0.001, H 0.8 >= 0.74) is silenced.
    assert out.metrics["mask/s2t/silenced"] == 1
    assert grad[0, 2].item() == 0.0
    # Kept: row 0 t0 t1 t3 t4 (l = -1), row 1 t0..t3 (l = +1): 8 kept tokens.
    expected = torch.tensor([[-1, -1, 0, -1, -1], [1, 1, 1, 1, 0]]) / 8
    assert torch.allclose(grad, expected.float(), atol=1e-7)


def test_probability_only_ablation():
    out, grad = run([{"kind": "low_probability"}])
    # Row 0 t1 t2 t4 have p < 0.002 and A > 0; t3 (0.0021) does not.
    assert out.metrics["mask/low_probability/silenced"] == 3
    assert out.loss.item() == pytest.approx((-2 + 4) / 6)
    assert torch.equal(grad[0] == 0, torch.tensor([False, True, True, False, True]))


def test_preset_stapo_is_s2t_with_kept_denominator():
    o = rlstab.load("stapo")
    (s2t,) = o.masks
    assert (s2t.kind, s2t.tau_p, s2t.entropy_quantile, s2t.population, s2t.prob_source) == (
        "s2t", 0.002, 0.8, "valid", "current"
    )
    assert (o.aggregation.kind, o.aggregation.count) == ("token-mean", "kept")
    assert (o.surrogate.eps_low, o.surrogate.eps_high, o.surrogate.dual_clip) == (0.2, 0.28, 10.0)


def test_the_dose_tau_p_as_an_arm_extending_stapo(tmp_path):
    # tau_p is S2T's dose: the arm replaces stapo's masks with one S2T at tau_p = 0.02. On the hand-built
    # batch, row 0's candidates (A > 0, H < 0.74) are t1 (p 0.001), t3 (H 0.4, p 0.0021), t4 (p 0.0019):
    # at 0.002, t1 and t4 (2 silenced); at 0.02, t3 too (0.0021 < 0.02): 3 silenced.
    (tmp_path / "dose.yaml").write_text("extends: stapo\nmasks:\n- {kind: s2t, tau_p: 0.02}\n")
    arm = rlstab.load(tmp_path / "dose.yaml")
    assert arm.masks == [rlstab.load("stapo").masks[0].model_copy(update={"tau_p": 0.02})]
    assert arm.aggregation == rlstab.load("stapo").aggregation  # the rest is stapo's
    batch = rlstab.TokenBatch(logprobs=P.log(), advantages=A, response_mask=MASK, entropy=H)
    assert arm.compile()(batch).metrics["mask/s2t/silenced"] == 3
    assert rlstab.load("stapo").compile()(batch).metrics["mask/s2t/silenced"] == 2
    assert "p < 0.02 and" in explain(arm)
