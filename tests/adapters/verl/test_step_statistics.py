"""``step_statistics: data_parallel``: two gloo ranks, each with one micro-batch, through verl's real
``ppo_loss`` with ``dp_group`` — the S2T threshold and the gradient equal one process over the
whole step. With ``local`` the ranks' thresholds differ (each sees half of the step)."""

import pytest
import torch

import rlstab
from rlstab.testing.spawned_ranks import run_ranks

import verl_statistics_rank


def two_ranks(scope: str):
    return run_ranks(verl_statistics_rank.run_rank, scope, world=2)


def one_process():
    logprobs, entropy, advantages, lengths = verl_statistics_rank.full_step()
    mask = torch.arange(logprobs.shape[1]) < torch.tensor(lengths).unsqueeze(-1)
    leaf = logprobs.clone().requires_grad_()
    batch = rlstab.TokenBatch(logprobs=leaf, old_logprobs=logprobs, advantages=advantages, response_mask=mask, entropy=entropy)
    out = rlstab.load("stapo").compile()(batch)
    out.loss.backward()
    assert out.metrics["mask/s2t/silenced"] > 0  # the threshold decides something in this step
    return out.metrics["mask/s2t/entropy_threshold"], leaf.grad * mask


def test_data_parallel_statistics_equal_one_process():
    threshold, grad = one_process()
    (_, t0, g0), (_, t1, g1) = two_ranks("data_parallel")
    assert t0 == pytest.approx(threshold, abs=1e-7) and t1 == pytest.approx(threshold, abs=1e-7)
    torch.testing.assert_close(g0, grad, rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(g1, g0)
    assert torch.count_nonzero(grad) > 0


def test_local_statistics_are_per_rank():
    threshold, _ = one_process()
    (_, t0, _), (_, t1, _) = two_ranks("local")
    assert t0 != pytest.approx(t1) and threshold not in (t0, t1)
