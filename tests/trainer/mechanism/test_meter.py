"""rlstab.trainer.mechanism.meter: the mask-free full loss, its coefficients c_t = dL/dlogp_t, and a step meter's
result on a hand-checkable two-token policy."""

import math

import pytest
import torch

import rlstab
from rlstab.batch import TokenBatch
from rlstab.trainer.mechanism.meter import SPACE, StepMeter, full_coefficients, mask_free
from rlstab.trainer.policy import Rollout

# l = -A r, token-mean over valid tokens; one mask silencing every token, a KL regulariser
OBJECTIVE = {
    "advantage": {"kind": "given"}, "surrogate": {"kind": "none"}, "aggregation": {"kind": "token-mean", "count": "valid"},
    "masks": [{"kind": "expression", "silence": "position >= 0"}], "regularisers": [{"kind": "kl", "coef": 0.5}],
    "shadow_masks": [{"kind": "s2t"}],
}


class LinearPolicy:
    """Logits z_t = W x_t, one input x_t per response position."""

    def __init__(self, weight, inputs):
        self.weight = torch.nn.Parameter(weight.clone())
        self.inputs = inputs

    def trainable_parameters(self):
        return [self.weight]

    def token_distribution(self, rollout):
        logp = torch.log_softmax(self.inputs[: rollout.response_ids.shape[0]] @ self.weight.T, dim=-1)
        logprobs = logp.gather(-1, rollout.response_ids[..., None]).squeeze(-1)
        with torch.no_grad():
            p = logp.exp()
            return logprobs, -(p * logp).sum(-1), (p * p).sum(-1)


def test_mask_free_drops_masks_shadow_masks_and_regularisers_only():
    objective = rlstab.load(OBJECTIVE)
    full = mask_free(objective)
    assert (full.masks, full.shadow_masks, full.regularisers) == ([], [], [])
    assert (full.advantage, full.surrogate, full.aggregation) == (objective.advantage, objective.surrogate, objective.aggregation)
    assert len(objective.masks) == 1 and len(objective.regularisers) == 1  # the original is untouched


def test_full_coefficients_are_the_gradient_of_the_full_loss():
    full = mask_free(rlstab.load(OBJECTIVE)).compile()
    old = torch.tensor([[-1.0, -2.0], [-0.5, -3.0]])
    mask = torch.tensor([[True, True], [True, False]])
    advantages = torch.tensor([2.0, -1.0])

    def batch_of(rows, logprobs, entropy):
        return TokenBatch(logprobs=logprobs, old_logprobs=old[rows], advantages=advantages[rows],
                          response_mask=mask[rows], entropy=entropy, ref_logprobs=old[rows])

    stats = full.gather([batch_of([0, 1], old, torch.zeros(2, 2))])
    c = full_coefficients(full, batch_of, [0, 1], old.clone(), torch.zeros(2, 2), stats)
    # L = -(1/3) sum A r over the 3 valid tokens (no KL: the full loss has no regulariser), r = 1:
    # c_t = -A_i / 3 = (-2/3, -2/3 | 1/3, 0 on padding)
    assert torch.allclose(c, torch.tensor([[-2 / 3, -2 / 3], [1 / 3, 0.0]]))
    assert not c.requires_grad


def test_a_step_meter_on_two_tokens():
    # W = 0 (2 classes, 1 input): p = (1/2, 1/2); token 1: y = 0, x = 1; token 2: y = 1, x = 2; A = 1
    policy = LinearPolicy(torch.zeros(2, 1), torch.tensor([[[1.0], [2.0]]]))
    rollout = Rollout([[0]], torch.tensor([[0, 1]]), torch.tensor([[True, True]]))
    old, entropy, _ = policy.token_distribution(rollout)
    old, entropy = old.detach(), entropy.detach()
    loss_fn = rlstab.load({**OBJECTIVE, "regularisers": [], "shadow_masks": []}).compile()

    def batch_of(rows, logprobs, entropy):
        return TokenBatch(logprobs=logprobs, old_logprobs=old[rows], advantages=torch.ones(len(rows)),
                          response_mask=rollout.response_mask[rows], entropy=entropy)

    before = loss_fn.state_dict()
    stats = loss_fn.gather([batch_of([0], old, entropy)])
    meter = StepMeter(loss_fn)
    meter.measure(policy, rollout, [[0]], batch_of, (old, entropy), stats, before)
    result = meter.result()
    # c_t = -A r / 2 = -1/2; d logp_y / dW_k = (1[k = y] - p_k) x:
    # token 1: (1/2, -1/2); token 2: 2 * (-1/2, 1/2) = (-1, 1); g_full = -1/2 ((1/2, -1/2) + (-1, 1)) = (1/4, -1/4)
    assert result["space"] == SPACE == "parameters"
    assert result["full_grad_norm"] == pytest.approx(math.sqrt(2 * 0.25**2), rel=1e-6)  # 0.353553
    (share,) = result["masks"].values()
    assert share["silenced"] == 2 and share["share"] == pytest.approx(1.0)  # the mask silences both tokens
    assert result["logit_grad"]["tokens"] == 2
    assert policy.weight.grad is None  # nothing touched the parameters' .grad
