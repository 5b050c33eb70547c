"""``step_statistics: data_parallel``: two gloo ranks, each with one micro-batch, through verl's real
``ppo_loss`` with ``dp_group`` — the S2T threshold and the gradient equal one process over the
whole step. With ``local`` the ranks' thresholds differ (each sees half of the step)."""

import socket

import pytest
import torch
import torch.multiprocessing as mp

import rlstab

import verl_statistics_rank


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def two_ranks(scope: str):
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=verl_statistics_rank.run_rank, args=(r, 2, port, scope, queue)) for r in range(2)]
    for p in procs:
        p.start()
    results = sorted(queue.get(timeout=240) for _ in procs)
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    return results


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
