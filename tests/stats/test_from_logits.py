"""rlstab.stats.token_stats_from_logits against the naive path in float64."""

import math

import pytest
import torch

from rlstab.stats import token_stats_from_logits


def naive(logits, labels, temperature=1.0):
    logp = torch.log_softmax(logits / temperature, -1)
    return logp.gather(-1, labels.unsqueeze(-1)).squeeze(-1), -(logp.exp() * logp).sum(-1)


def logits_and_labels(N=29, V=40, seed=0, scale=3.0):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(N, V, generator=g, dtype=torch.float64) * scale
    labels = torch.randint(0, V, (N,), generator=g)
    labels[:2] = torch.tensor([0, V - 1])
    return logits, labels


def values_and_grad(fn, logits, labels, use_entropy, seed=1, **kw):
    x = logits.detach().clone().requires_grad_()
    lp, ent = fn(x, labels, **kw)
    g = torch.Generator().manual_seed(seed)
    g1, g2 = (torch.randn(lp.shape, generator=g, dtype=torch.float64).to(lp.dtype) for _ in range(2))
    loss = (lp * g1).sum() + ((ent * g2).sum() if use_entropy else 0.0)
    (grad,) = torch.autograd.grad(loss, x)
    return lp.detach(), ent.detach(), grad


@pytest.mark.parametrize("chunk_size", [1, 7, 29, 100])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("entropy_grad", [False, True])
def test_float64_equals_naive(chunk_size, temperature, entropy_grad):
    logits, labels = logits_and_labels()
    ref = values_and_grad(naive, logits, labels, entropy_grad, temperature=temperature)
    got = values_and_grad(token_stats_from_logits, logits, labels, entropy_grad, temperature=temperature,
                          chunk_size=chunk_size, entropy_grad=entropy_grad)
    for r, x in zip(ref, got):
        assert x.dtype == torch.float64
        torch.testing.assert_close(x, r, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_lower_precision_logits(dtype):
    logits, labels = logits_and_labels(V=300)
    logits = logits.to(dtype)
    ref = values_and_grad(naive, logits.double(), labels, True)
    got = values_and_grad(token_stats_from_logits, logits, labels, True, chunk_size=8, entropy_grad=True)
    assert got[0].dtype == got[1].dtype == torch.float32 and got[2].dtype == dtype
    torch.testing.assert_close(got[0].double(), ref[0], rtol=0, atol=1e-5)
    torch.testing.assert_close(got[1].double(), ref[1], rtol=0, atol=1e-5)
    tol = 1e-6 if dtype == torch.float32 else 1e-2
    torch.testing.assert_close(got[2].double(), ref[2], rtol=tol, atol=tol)


def test_masked_vocabulary():
    # -inf logits have probability 0 and add nothing to the entropy (no 0 * inf = NaN).
    logits, labels = logits_and_labels(V=12)
    logits[:, 8:] = -math.inf
    labels = labels.clamp(max=7)
    lp, ent, grad = values_and_grad(token_stats_from_logits, logits, labels, True, entropy_grad=True, chunk_size=5)
    ref = values_and_grad(naive, logits[:, :8], labels, True)
    torch.testing.assert_close(lp, ref[0], rtol=0, atol=1e-12)
    torch.testing.assert_close(ent, ref[1], rtol=0, atol=1e-12)
    torch.testing.assert_close(grad[:, :8], ref[2], rtol=0, atol=1e-12)
    assert torch.all(grad[:, 8:] == 0)


def test_entropy_alone_and_leading_dimensions():
    logits, labels = logits_and_labels(N=24)
    x = logits.view(4, 6, -1).requires_grad_()
    lp, ent = token_stats_from_logits(x, None, chunk_size=5)
    assert lp is None and ent.shape == (4, 6) and not ent.requires_grad
    torch.testing.assert_close(ent.view(-1), naive(logits, labels)[1], rtol=0, atol=1e-12)


def test_ignore_index_and_detached_entropy():
    logits, labels = logits_and_labels()
    labels[5] = -100
    x = logits.clone().requires_grad_()
    lp, ent = token_stats_from_logits(x, labels, chunk_size=4)
    assert lp[5] == 0 and not ent.requires_grad
    (grad,) = torch.autograd.grad(lp.sum(), x)
    assert torch.all(grad[5] == 0)


def test_empty_and_no_grad():
    lp, ent = token_stats_from_logits(torch.zeros(0, 10, requires_grad=True), torch.zeros(0, dtype=torch.long))
    assert lp.shape == ent.shape == (0,)
    logits, labels = logits_and_labels()
    with torch.no_grad():
        lp, ent = token_stats_from_logits(logits.requires_grad_(), labels)
    assert not lp.requires_grad
    torch.testing.assert_close(lp, naive(logits.detach(), labels)[0], rtol=0, atol=1e-12)


def test_uniform_distribution_has_log_v_entropy():
    _, ent = token_stats_from_logits(torch.zeros(3, 16), None)
    torch.testing.assert_close(ent, torch.full((3,), math.log(16)))


def test_saves_only_the_logits_and_per_token_numbers():
    logits, labels = logits_and_labels(N=64, V=500)
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        token_stats_from_logits(logits.requires_grad_(), labels, chunk_size=16)
    big = [t for t in saved if t.numel() >= 500]
    assert len(big) == 1 and big[0].data_ptr() == logits.data_ptr()  # the input itself, no copy
    assert sum(t.numel() for t in saved) <= logits.numel() + 5 * 64
