"""A reweighter whose ``weights`` returns None (every factor 1 in this step: STARE with its gate closed) gives
the loss, gradient and metrics that all-ones factors give, bit for bit, with fewer operations."""

import torch

import rlstab
from rlstab.reweighters.stare import STARE
from rlstab.testing import make_batch


def run(seed: int):
    loss_fn = rlstab.load("stare").compile()
    batch = make_batch(loss_fn, seed=seed)  # mean entropy 1, above the 0.3 target: the gate is closed
    stats = loss_fn.gather([batch])
    out = loss_fn(batch, step=stats)
    out.loss.backward()
    return out.loss.detach(), batch.logprobs.grad, dict(out.metrics)


def test_no_factors_is_all_ones(monkeypatch):
    for seed in range(3):
        closed = run(seed)
        assert closed[2]["reweight/stare/gate"] == 0.0
        weights = STARE.weights

        def ones(self, t, step, weights=weights):
            w = weights(self, t, step)
            return torch.ones_like(t.logprobs) if w is None else w

        with monkeypatch.context() as m:
            m.setattr(STARE, "weights", ones)
            reference = run(seed)
        assert torch.equal(closed[0].view(torch.int32), reference[0].view(torch.int32))
        assert torch.equal(closed[1].view(torch.int32), reference[1].view(torch.int32))
        assert closed[2] == reference[2]
