"""Every preset on CUDA tensors gives the CPU's loss, gradients and metrics, in whole-step and frozen-step calls.

On a card the compiled loss takes its GPU paths by itself: checks deferred to the metrics' read, quantile
selection on the device. The CPU runs the reference paths on the same batch.
"""

import math

import pytest
import torch

import rlstab
from rlstab.testing import make_batch
from rlstab.testing.batches import DIFFERENTIABLE, on_device

PRESETS = rlstab.preset_names()


def call(name, batch, frozen):
    """(loss, the differentiable fields' gradients, metrics) of one call + backward, all on the CPU."""
    loss_fn = rlstab.load(name).compile()
    torch.manual_seed(0)  # Clip-Cov's draw: torch's CPU generator, the same on both devices
    if frozen:
        out = loss_fn(batch, step=loss_fn.gather([batch]))
    else:
        out = loss_fn(batch)
    out.loss.backward()
    grads = {f: getattr(batch, f).grad.cpu() for f in DIFFERENTIABLE
             if getattr(batch, f, None) is not None and getattr(batch, f).grad is not None}
    return out.loss.detach().cpu(), grads, dict(out.metrics)


@pytest.mark.parametrize("frozen", [False, True], ids=["whole-step", "frozen-step"])
@pytest.mark.parametrize("name", PRESETS)
def test_cuda_equals_cpu(cuda, name, frozen):
    loss_fn = rlstab.load(name).compile()
    batch = make_batch(loss_fn, seed=7, B=16, T=24)
    cpu_loss, cpu_grads, cpu_metrics = call(name, on_device(batch, "cpu"), frozen)
    loss, grads, metrics = call(name, on_device(batch, cuda), frozen)
    # float32 on both; sums in another order on the card: a few ulps of the largest term.
    torch.testing.assert_close(loss, cpu_loss, rtol=1e-5, atol=1e-6)
    assert grads.keys() == cpu_grads.keys() and "logprobs" in grads
    for field in grads:
        torch.testing.assert_close(grads[field], cpu_grads[field], rtol=1e-5, atol=1e-6, msg=field)
    assert metrics.keys() == cpu_metrics.keys()
    for key, value in metrics.items():
        want = cpu_metrics[key]
        if isinstance(want, float) and math.isnan(want):
            assert math.isnan(value), key
        else:
            assert value == pytest.approx(want, rel=1e-5, abs=1e-6), key
