"""A mask whose rejected tokens become padding (``acts_on_valid``) at veRL's dp_size 2, against the whole step at once.

Rollout rejection with ``rejected: padding`` removes the rejected tokens, and a rejected response,
from every denominator, in the loss of the whole step computed at once. veRL hands the loss its
global counts (``batch_num_tokens``, ``global_batch_size``), made from ``response_mask``, which
still holds them. The adapter's count mapping must therefore take the valid counts too as a
share of veRL's: over what veRL counts in the gathered micro-batches
([`Counted`][rlstab.adapters.global_counts.Counted]). Two gloo ranks run veRL's count mapping
(``rlstab.adapters.verl.counts``) in both modes that use veRL's counts; the loss and gradients
equal one process on the whole step, and the mapping without the share (what veRL's and
OpenRLHF's counts did before) does not.

veRL's loss is not given ``rollout_logprobs`` (its config refuses a component that reads them, and
veRL's own ``rollout_rs`` edits ``response_mask`` before the counts), so the batches carry them
here; the mapping is the one every veRL loss call goes through.
"""

from __future__ import annotations

import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))  # spawned ranks import the helpers as top-level modules

import rejection_rank  # noqa: E402
from test_training_worker import spawn_ranks  # noqa: E402

import rlstab  # noqa: E402

REJECTION = [
    {"kind": "rollout_rejection", "level": "token", "divergence": "k1", "high": 2.0, "rejected": "padding"},
    {"kind": "rollout_rejection", "level": "sequence_mean", "divergence": "k3", "high": 0.02, "rejected": "padding"},
]
OBJECTIVES = {
    "token-mean valid": {"extends": "grpo", "masks": REJECTION},
    "token-mean kept, S2T": {"extends": "stapo", "masks": [{"kind": "s2t", "tau_p": 0.002, "entropy_quantile": 0.8},
                                                            *REJECTION]},
    "seq-mean-token-mean": {"extends": "grpo", "masks": REJECTION,
                            "aggregation": {"kind": "seq-mean-token-mean", "count": "valid"}},
}


def whole_step(name: str):
    step = rejection_rank.full_step()
    leaf = step["log_prob"].clone().requires_grad_()
    out = rlstab.load(OBJECTIVES[name]).compile()(rejection_rank.batch_of(step, slice(None), leaf))
    out.loss.backward()
    return out, leaf.grad


@pytest.mark.parametrize("scope", ["optimizer_step", "data_parallel"])
@pytest.mark.parametrize("name", list(OBJECTIVES))
def test_rejection_at_dp_size_2_equals_the_whole_step(name, scope):
    out, grad = whole_step(name)
    response_tokens = rejection_rank.full_step()["response_mask"].sum().item()
    assert 0 < out.metrics["tokens/valid"] < response_tokens - 7  # tokens and response 5 (6 tokens) were rejected
    ranks = spawn_ranks(rejection_rank.run_rank, 2, OBJECTIVES[name], scope)
    ((loss0, unshared0), g0), ((loss1, _), g1) = ranks[0], ranks[1]
    assert loss0 == pytest.approx(out.loss.item(), rel=1e-5) and loss1 == loss0
    torch.testing.assert_close(g0, grad, rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(g1, g0)
    assert torch.count_nonzero(grad) > 0
    assert unshared0 != pytest.approx(out.loss.item(), rel=1e-3)  # veRL's counts as they are: another loss
