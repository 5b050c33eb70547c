"""rlstab.stats.token_stats against the naive path in float64: values, gradients, edge cases."""

import pytest
import torch

import rlstab.stats.lm_head as ts
from rlstab.stats import token_stats


def naive(hidden, weight, labels, temperature=1.0):
    """The reference: full logits, log_softmax, gather; entropy = -sum p log p."""
    logp = torch.log_softmax(hidden @ weight.T / temperature, -1)
    return logp.gather(-1, labels.unsqueeze(-1)).squeeze(-1), -(logp.exp() * logp).sum(-1)


def inputs(N=37, H=16, V=50, seed=0, dtype=torch.float64, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    hidden = (torch.randn(N, H, generator=g, dtype=torch.float64) * scale).to(dtype)
    weight = torch.randn(V, H, generator=g, dtype=torch.float64).to(dtype)
    labels = torch.randint(0, V, (N,), generator=g)
    return hidden, weight, labels


def grads(fn, hidden, weight, labels, use_entropy=False, wrt=("hidden", "weight"), seed=1, **kw):
    """Values and gradients of sum(g1 * logprobs) (+ sum(g2 * entropy)) for random g1, g2."""
    h = hidden.detach().clone().requires_grad_("hidden" in wrt)
    w = weight.detach().clone().requires_grad_("weight" in wrt)
    lp, ent = fn(h, w, labels, **kw)
    g = torch.Generator().manual_seed(seed)
    g1, g2 = (torch.randn(lp.shape, generator=g, dtype=torch.float64).to(lp.dtype) for _ in range(2))
    loss = (lp * g1).sum() + ((ent * g2).sum() if use_entropy else 0.0)
    leaves = [t for t in (h, w) if t.requires_grad]
    return lp.detach(), ent.detach(), torch.autograd.grad(loss, leaves)


@pytest.fixture(params=[(7, 13), (37, 50), (64, 8)], ids=["small-tiles", "one-tile", "tile-8"])
def tiling(request, monkeypatch):
    """(rows per block, vocabulary tile): sizes that divide neither N nor V, a single tile, and V % tile == 2."""
    rows, tile = request.param
    monkeypatch.setattr(ts, "VOCAB_TILE", tile)
    return rows


@pytest.mark.parametrize("temperature", [1.0, 0.6])
@pytest.mark.parametrize("entropy_grad", [False, True])
@pytest.mark.parametrize("wrt", [("hidden", "weight"), ("hidden",), ("weight",)], ids=["both", "hidden", "weight"])
def test_float64_equals_naive(tiling, temperature, entropy_grad, wrt):
    hidden, weight, labels = inputs(V=50)
    labels[:3] = torch.tensor([0, 49, 13])  # vocabulary edges, and a tile edge
    ref = grads(naive, hidden, weight, labels, entropy_grad, wrt, temperature=temperature)
    got = grads(token_stats, hidden, weight, labels, entropy_grad, wrt, temperature=temperature,
                chunk_size=tiling, entropy_grad=entropy_grad)
    for r, x in zip(ref[:2], got[:2]):
        assert x.dtype == torch.float64
        torch.testing.assert_close(x, r, rtol=0, atol=1e-12)
    for r, x in zip(ref[2], got[2]):
        torch.testing.assert_close(x, r, rtol=1e-10, atol=1e-11)


@pytest.mark.parametrize("entropy_grad", [False, True])
def test_tokens_with_zero_upstream_gradient_are_left_out_of_the_backward(monkeypatch, entropy_grad):
    # A masked token (upstream gradient 0) adds exactly 0 to both gradients, so the backward's
    # tiles run on the others only; the gradients still equal the naive path's.
    hidden, weight, labels = inputs(N=12, V=50)
    g1 = torch.randn(12, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    g1[[0, 4, 5, 11]] = 0.0
    g2 = torch.zeros(12, dtype=torch.float64)
    g2[[4, 7]] = 0.5  # token 4: no log-prob gradient but an entropy gradient
    seen = []
    backward = ts._backward
    monkeypatch.setattr(ts, "_backward", lambda h, *a: seen.append(h.shape[0]) or backward(h, *a))

    def run(fn, **kw):
        h, w = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
        lp, ent = fn(h, w, labels, **kw)
        loss = (lp * g1).sum() + ((ent * g2).sum() if entropy_grad else 0.0)
        return torch.autograd.grad(loss, [h, w])

    ref = run(naive)
    got = run(token_stats, chunk_size=5, entropy_grad=entropy_grad)
    assert seen == [9 if entropy_grad else 8]  # 12 tokens - 4 zeros (+ token 4 for its entropy)
    for r, x in zip(ref, got):
        torch.testing.assert_close(x, r, rtol=1e-10, atol=1e-11)
    skipped = [0, 5, 11] if entropy_grad else [0, 4, 5, 11]
    assert torch.all(got[0][skipped] == 0)


def test_all_upstream_gradients_zero():
    hidden, weight, labels = inputs()
    h, w = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
    lp, _ = token_stats(h, w, labels)
    gh, gw = torch.autograd.grad((lp * 0.0).sum(), [h, w])
    assert gh.shape == h.shape and gw.shape == w.shape
    assert torch.all(gh == 0) and torch.all(gw == 0)


def test_entropy_is_detached_by_default():
    hidden, weight, labels = inputs()
    lp, ent = token_stats(hidden.requires_grad_(), weight, labels)
    assert lp.requires_grad and not ent.requires_grad


def test_float32_inputs_within_float32_rounding(tiling):
    hidden, weight, labels = inputs(N=40, H=32, V=300, scale=0.5)
    ref = grads(naive, hidden, weight, labels, use_entropy=True)
    got = grads(token_stats, hidden.float(), weight.float(), labels, True, chunk_size=tiling, entropy_grad=True)
    assert got[0].dtype == torch.float32 and got[2][0].dtype == torch.float32
    for r, x in zip(ref[:2], got[:2]):
        torch.testing.assert_close(x.double(), r, rtol=0, atol=2e-5)
    for r, x in zip(ref[2], got[2]):
        torch.testing.assert_close(x.double(), r, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_inputs_accumulate_in_float32(dtype):
    # The reference takes the same (rounded) inputs in float64: any difference beyond float32
    # rounding would mean the chunks computed or accumulated in half precision.
    hidden, weight, labels = inputs(N=45, H=64, V=400, scale=0.3)
    hidden, weight = hidden.to(dtype), weight.to(dtype)
    ref = grads(naive, hidden.double(), weight.double(), labels, use_entropy=True)
    got = grads(token_stats, hidden, weight, labels, True, chunk_size=16, entropy_grad=True)
    assert got[0].dtype == torch.float32 and got[1].dtype == torch.float32
    for r, x in zip(ref[:2], got[:2]):
        torch.testing.assert_close(x.double(), r, rtol=0, atol=1e-4)
    for r, x in zip(ref[2], got[2]):
        assert x.dtype == dtype  # returned in the input's dtype, rounded once
        torch.testing.assert_close(x.double(), r, rtol=1e-2, atol=1e-3)


def test_leading_dimensions_and_ignore_index():
    hidden, weight, labels = inputs(N=24)
    hidden, labels = hidden.view(4, 6, -1), labels.view(4, 6).clone()
    labels[1, 4:] = -100
    h = hidden.clone().requires_grad_()
    lp, ent = token_stats(h, weight, labels, chunk_size=5)
    assert lp.shape == ent.shape == (4, 6)
    ref_lp, ref_ent = naive(hidden, weight, labels.clamp(min=0))
    assert torch.all(lp[1, 4:] == 0)
    torch.testing.assert_close(lp[labels != -100], ref_lp[labels != -100], rtol=0, atol=1e-12)
    torch.testing.assert_close(ent, ref_ent, rtol=0, atol=1e-12)  # ignored tokens still have an entropy
    (grad,) = torch.autograd.grad(lp.sum(), h)
    assert torch.all(grad[1, 4:] == 0)


def test_empty_input():
    hidden, weight, labels = inputs(N=0)
    h, w = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
    lp, ent = token_stats(h, w, labels)
    assert lp.shape == ent.shape == (0,)
    gh, gw = torch.autograd.grad(lp.sum(), [h, w])
    assert gh.shape == (0, 16) and torch.all(gw == 0)


def test_no_grad_and_no_leaf_requiring_grad():
    hidden, weight, labels = inputs()
    ref = naive(hidden, weight, labels)
    with torch.no_grad():
        got = token_stats(hidden.clone().requires_grad_(), weight, labels, chunk_size=8)
    assert not got[0].requires_grad
    for r, x in zip(ref, got):
        torch.testing.assert_close(x, r, rtol=0, atol=1e-12)
    assert not token_stats(hidden, weight, labels)[0].requires_grad


def test_only_entropy_used_with_entropy_grad():
    hidden, weight, labels = inputs()
    h = hidden.clone().requires_grad_()
    _, ent = token_stats(h, weight, labels, entropy_grad=True, chunk_size=10)
    (got,) = torch.autograd.grad(ent.sum(), h)
    h2 = hidden.clone().requires_grad_()
    (ref,) = torch.autograd.grad(naive(h2, weight, labels)[1].sum(), h2)
    torch.testing.assert_close(got, ref, rtol=1e-10, atol=1e-12)


def test_gradcheck():
    hidden, weight, labels = inputs(N=6, H=3, V=7)
    hidden.requires_grad_(), weight.requires_grad_()

    def fn(h, w):
        return token_stats(h, w, labels, chunk_size=4, entropy_grad=True, temperature=0.8)

    assert torch.autograd.gradcheck(fn, (hidden, weight))


def test_large_logits_do_not_overflow():
    # Logits of several hundred: exp would overflow without the running maximum.
    hidden, weight, labels = inputs(scale=40.0)
    ref = grads(naive, hidden, weight, labels, use_entropy=True)
    got = grads(token_stats, hidden.float(), weight.float(), labels, True, chunk_size=8, entropy_grad=True)
    for x in got[:2] + tuple(got[2]):
        assert torch.isfinite(x).all()
    torch.testing.assert_close(got[0].double(), ref[0], rtol=1e-5, atol=1e-3)


def test_saves_no_logits():
    # What autograd keeps between forward and backward: the inputs and O(N) per-token numbers.
    hidden, weight, labels = inputs(N=64, H=8, V=1000)
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t.numel()) or t, lambda t: t):
        token_stats(hidden.requires_grad_(), weight.requires_grad_(), labels, chunk_size=16)
    inputs_numel = hidden.numel() + weight.numel()
    assert sum(saved) <= inputs_numel + 5 * 64
    assert max(saved) < 64 * 1000


def test_errors():
    hidden, weight, labels = inputs()
    with pytest.raises(ValueError, match="labels"):
        token_stats(hidden, weight, labels[:-1])
    with pytest.raises(ValueError, match="weight"):
        token_stats(hidden, weight.T, labels)
    with pytest.raises(ValueError, match="temperature"):
        token_stats(hidden, weight, labels, temperature=0.0)
