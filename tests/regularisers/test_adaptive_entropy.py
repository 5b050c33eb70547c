"""Adaptive entropy control (Skywork-OR1): the coefficient's trajectory and the bonus, hand-computed."""

import json

import pytest
import torch

import rlstab

LOSS = {"surrogate": {"kind": "none"}, "aggregation": {"kind": "token-mean", "count": "valid"}}
CONTROLLER = {"kind": "adaptive_entropy", "coef": 0.01, "target_entropy": 0.2, "delta": 0.005, "coef_max": 0.012}


def step_batch(entropy: float, surprisal: float):
    """2 responses, 3 valid tokens (one padding slot holding NaN): entropy H everywhere, -log p_old = ``surprisal``."""
    mask = torch.tensor([[True, True], [True, False]])
    logp = torch.full((2, 2), -surprisal)
    logp[1, 1] = float("nan")
    ent = torch.full((2, 2), entropy)
    ent[1, 1] = float("nan")
    return rlstab.TokenBatch(logprobs=logp.requires_grad_(), old_logprobs=logp.detach().clone(),
                             advantages=torch.zeros(2), response_mask=mask, entropy=ent.requires_grad_())


def run(controller, steps, compiled=None):
    compiled = compiled or rlstab.load({**LOSS, "regularisers": [controller]}).compile()
    out = []
    for entropy, surprisal in steps:
        b = step_batch(entropy, surprisal)
        res = compiled(b)  # its own step: the controller moves once
        res.loss.backward()
        out.append((res.loss.item(), b.entropy.grad[0, 0].item(), res.metrics))
    return compiled, out


# (mean entropy H, mean -log p_old) of each step
STEPS = [(0.1, 0.5), (0.3, 0.1), (0.1, 0.5), (0.1, 0.1)]


def test_trajectory_measuring_entropy_as_trl():
    """TRL's rule (<=, gate closed before the first measurement), measuring the mean entropy H."""
    controller = {**CONTROLLER, "measure": "entropy", "boundary": "at_or_below", "first_step": "off"}
    _, out = run(controller, STEPS)
    # step | state (c_k, e_(k-1)) | applied alpha_k        | e_k | c_(k+1)
    #  1   | (0.01, none)         | 0 (gate off at first)  | 0.1 | min(0.015, 0.012) = 0.012
    #  2   | (0.012, 0.1)         | 0.012 (0.1 <= 0.2)     | 0.3 | 0.007
    #  3   | (0.007, 0.3)         | 0 (0.3 > 0.2)          | 0.1 | 0.012
    #  4   | (0.012, 0.1)         | 0.012                  | 0.1 | 0.012 (capped)
    applied = [0.0, 0.012, 0.0, 0.012]
    coef = [0.01, 0.012, 0.007, 0.012]
    for (loss, grad, metrics), a, c, (h, _) in zip(out, applied, coef, STEPS):
        assert metrics["regulariser/adaptive_entropy/applied"] == pytest.approx(a)
        assert metrics["regulariser/adaptive_entropy/coef"] == pytest.approx(c)
        # loss = alpha * token-mean(-H) (A = 0: no policy term); d loss / d H_t = -alpha / 3 on each valid token
        assert loss == pytest.approx(-a * h)
        assert grad == pytest.approx(-a / 3)


def test_trajectory_measuring_surprisal_as_skywork():
    """Skywork's rule (<, gate open at first), measuring -mean log p_old: another trajectory on the same steps."""
    _, out = run({**CONTROLLER, "measure": "surprisal"}, STEPS)
    # step | state        | applied            | e_k = -mean log p_old | c_(k+1)
    #  1   | (0.01, none) | 0.01 (gate on)     | 0.5                   | 0.005
    #  2   | (0.005, 0.5) | 0                  | 0.1                   | 0.01
    #  3   | (0.01, 0.1)  | 0.01               | 0.5                   | 0.005
    #  4   | (0.005, 0.5) | 0                  | 0.1                   | 0.01
    assert [m["regulariser/adaptive_entropy/applied"] for _, _, m in out] == pytest.approx([0.01, 0.0, 0.01, 0.0])
    assert "regulariser/adaptive_entropy/entropy" not in out[0][2]  # nothing measured before the first step
    assert [m["regulariser/adaptive_entropy/entropy"] for _, _, m in out[1:]] == pytest.approx([0.5, 0.1, 0.5])


def test_at_the_target_the_boundary_decides():
    below = {**CONTROLLER, "measure": "entropy", "coef": 0.0, "coef_max": 1.0, "target_entropy": 0.25}
    # e_1 = 0.25 exactly (a float32 value): Skywork (<) lowers the coefficient (stays at 0); TRL (<=) raises it
    compiled, _ = run(below, [(0.25, 0.0)])
    assert compiled.state_dict()["regularisers[0] (adaptive_entropy)"] == {"coef": 0.0, "entropy": 0.25}
    compiled, _ = run({**below, "boundary": "at_or_below"}, [(0.25, 0.0)])
    assert compiled.state_dict()["regularisers[0] (adaptive_entropy)"]["coef"] == pytest.approx(0.005)


def test_state_survives_a_checkpoint():
    controller = {**CONTROLLER, "measure": "entropy"}
    whole, expected = run(controller, STEPS)
    first, head = run(controller, STEPS[:2])
    saved = json.loads(json.dumps(first.state_dict()))
    resumed = rlstab.load({**LOSS, "regularisers": [controller]}).compile()
    resumed.load_state_dict(saved)
    _, tail = run(controller, STEPS[2:], compiled=resumed)
    assert [(loss, grad) for loss, grad, _ in head + tail] == [(loss, grad) for loss, grad, _ in expected]
    assert resumed.state_dict() == whole.state_dict()


def test_a_state_outside_the_bounds_is_refused():
    compiled = rlstab.load({**LOSS, "regularisers": [CONTROLLER]}).compile()
    with pytest.raises(rlstab.StateError, match="coef_max"):
        compiled.load_state_dict({"regularisers[0] (adaptive_entropy)": {"coef": 0.5, "entropy": None}})


def test_a_step_without_valid_tokens_moves_nothing():
    compiled = rlstab.load({**LOSS, "regularisers": [{**CONTROLLER, "measure": "entropy"}]}).compile()
    empty = rlstab.TokenBatch(logprobs=torch.zeros(1, 2, requires_grad=True), advantages=torch.zeros(1),
                              response_mask=torch.zeros(1, 2, dtype=torch.bool),
                              entropy=torch.zeros(1, 2, requires_grad=True))
    compiled(empty)
    assert compiled.state_dict()["regularisers[0] (adaptive_entropy)"] == {"coef": 0.01, "entropy": None}


def test_bad_bounds_are_refused():
    with pytest.raises(rlstab.ConfigError, match="coef"):
        rlstab.load({**LOSS, "regularisers": [{**CONTROLLER, "coef": 0.5}]})
    with pytest.raises(rlstab.ConfigError, match="coef_min"):
        rlstab.load({**LOSS, "regularisers": [{**CONTROLLER, "coef": 0.0, "coef_min": 0.1, "coef_max": 0.05}]})


def test_needs_the_entropy_gradient():
    compiled = rlstab.load({**LOSS, "regularisers": [CONTROLLER]}).compile()
    b = step_batch(0.1, 0.1)
    b = rlstab.TokenBatch(logprobs=b.logprobs, old_logprobs=b.old_logprobs, advantages=b.advantages,
                          response_mask=b.response_mask, entropy=b.entropy.detach())
    with pytest.raises(ValueError, match="gradient"):
        compiled(b)
