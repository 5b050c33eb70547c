"""A frozen-step call and its backward make no host synchronisation on a card, by CUDA's own count
(``torch.cuda.set_sync_debug_mode("error")`` raises at the first one), for every preset but the two whose
selection is sized by the micro-batch (docs/gpu.md, "Host synchronisations")."""

import pytest
import torch

import rlstab
from rlstab.testing import make_batch
from rlstab.testing.batches import on_device

PRESETS = rlstab.preset_names()
SIZED_BY_THE_MICRO_BATCH = {"clip_cov", "kl_cov"}  # max(floor(f N), 1) tokens of the micro-batch's N


@pytest.mark.parametrize("name", PRESETS)
def test_frozen_step_call_and_backward_never_synchronise(cuda, name):
    loss_fn = rlstab.load(name).compile()
    batch = on_device(make_batch(loss_fn, seed=3, B=16, T=24), cuda)
    stats = loss_fn.gather([batch])  # the step's statistics: read before the micro-batches, by design
    loss_fn(batch, step=stats).loss.backward()  # warm-up: library handles, first launches
    batch.logprobs.grad = None
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        if name in SIZED_BY_THE_MICRO_BATCH:
            with pytest.raises(RuntimeError, match="synchroniz"):
                loss_fn(batch, step=stats).loss.backward()
            return
        out = loss_fn(batch, step=stats)
        out.loss.backward()
    finally:
        torch.cuda.set_sync_debug_mode(0)
    assert torch.isfinite(torch.tensor(out.metrics["loss"]))  # the one read, after the backward
