"""token_stats' GPU path (rlstab.stats.lm_head_gpu) run on CPU tensors: the same code as on a GPU, with the
matmuls in float32 and the Triton row kernels under Triton's interpreter (or the torch row passes).

Small chunks force several chunks of tokens in forward and of vocabulary in backward, with ragged
last ones; the references are the naive path in float64 and the CPU path of token_stats.
"""

import pytest
import torch
import torch_versions
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

import rlstab.stats.lm_head as lm_head
import rlstab.stats.lm_head_gpu as gpu
from rlstab.stats import token_stats
from rlstab.testing.syncs import host_syncs


def naive(hidden, weight, labels, temperature=1.0):
    """The reference: full logits, log_softmax, gather; entropy = -sum p log p."""
    logp = torch.log_softmax(hidden @ weight.T / temperature, -1)
    return logp.gather(-1, labels.unsqueeze(-1)).squeeze(-1), -(logp.exp() * logp).sum(-1)


def inputs(N, H, V, dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(N, H, generator=g, dtype=torch.float64).to(dtype)
    weight = torch.randn(V, H, generator=g, dtype=torch.float64).to(dtype)
    return hidden, weight, torch.randint(0, V, (N,), generator=g)


def grads(fn, hidden, weight, labels, use_entropy=False, wrt=("hidden", "weight"), **kw):
    """Values and gradients of sum(g1 * logprobs) (+ sum(g2 * entropy)) for random g1, g2."""
    h = hidden.detach().clone().requires_grad_("hidden" in wrt)
    w = weight.detach().clone().requires_grad_("weight" in wrt)
    lp, ent = fn(h, w, labels, **kw)
    g = torch.Generator().manual_seed(1)
    g1, g2 = (torch.randn(lp.shape, generator=g, dtype=torch.float64).to(lp.dtype) for _ in range(2))
    loss = (lp * g1).sum() + ((ent * g2).sum() if use_entropy else 0.0)
    return lp.detach(), ent.detach(), torch.autograd.grad(loss, [t for t in (h, w) if t.requires_grad])

# Chunks of 8-column multiples in both passes: 1484 B / (37 tokens x 4 B) = 10 -> 8 columns, 53 = 6 x 8 + 5
# (in backward, fewer tokens where some carry no gradient: wider chunks).
SMALL = 1484


@pytest.fixture(autouse=True)
def narrow_columns(monkeypatch):
    monkeypatch.setattr(gpu, "MIN_COLS", 8)


@pytest.fixture(params=[True, False], ids=["triton", "torch"])
def use_triton(request):
    return request.param


def gpu_stats(use_triton, chunk_bytes=SMALL):
    def fn(hidden, weight, labels, temperature=1.0, entropy_grad=False, ignore_index=-100):
        return gpu.token_stats_gpu(hidden, weight, labels, temperature=temperature, entropy_grad=entropy_grad,
                                   ignore_index=ignore_index, use_triton=use_triton, chunk_bytes=chunk_bytes)
    return fn


@pytest.mark.parametrize("temperature", [1.0, 0.6])
@pytest.mark.parametrize("entropy_grad", [False, True])
@pytest.mark.parametrize("wrt", [("hidden", "weight"), ("hidden",), ("weight",)], ids=["both", "hidden", "weight"])
def test_float32_against_float64(use_triton, temperature, entropy_grad, wrt):
    hidden, weight, labels = inputs(N=37, H=16, V=53)
    labels[:3] = torch.tensor([0, 52, 8])  # vocabulary edges, and a chunk edge
    ref = grads(naive, hidden, weight, labels, entropy_grad, wrt, temperature=temperature)
    got = grads(gpu_stats(use_triton), hidden.float(), weight.float(), labels, entropy_grad, wrt,
                temperature=temperature, entropy_grad=entropy_grad)
    for r, x in zip(ref[:2], got[:2]):
        assert x.dtype == torch.float32
        torch.testing.assert_close(x.double(), r, rtol=0, atol=1e-5)
    for r, x in zip(ref[2], got[2]):
        assert x.dtype == torch.float32
        torch.testing.assert_close(x.double(), r, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_against_the_cpu_path(use_triton, dtype):
    hidden, weight, labels = inputs(N=37, H=16, V=53, dtype=dtype)
    ref = grads(token_stats, hidden, weight, labels, True, entropy_grad=True)
    got = grads(gpu_stats(use_triton), hidden, weight, labels, True, entropy_grad=True)
    # Values: the same float32 arithmetic on the same half-precision numbers.
    for r, x in zip(ref[:2], got[:2]):
        torch.testing.assert_close(x, r, rtol=0, atol=1e-4)
    # Gradients: G is rounded to the head's dtype before the backward's matmuls (the CPU path keeps
    # it in float32); both results are then rounded to that dtype: a few of its ulps apart.
    ulp = 2.0**-7 if dtype == torch.bfloat16 else 2.0**-10
    for r, x in zip(ref[2], got[2]):
        assert x.dtype == dtype
        torch.testing.assert_close(x.float(), r.float(), rtol=4 * ulp, atol=4 * ulp * r.float().abs().max().item())


def test_ignored_tokens_and_zero_gradients_are_left_out(use_triton):
    hidden, weight, labels = inputs(N=37, H=16, V=53, dtype=torch.float32)
    labels[[1, 5]] = -100
    h = hidden.clone().requires_grad_()
    w = weight.clone().requires_grad_()
    lp, ent = gpu_stats(use_triton)(h, w, labels)
    assert (lp[[1, 5]] == 0).all()
    g = torch.randn(37, generator=torch.Generator().manual_seed(3))
    g[::3] = 0.0  # zero upstream gradient: left out of the backward
    (lp * g).sum().backward()
    ref_h = hidden.clone().requires_grad_()
    ref_w = weight.clone().requires_grad_()
    ref_lp, _ = token_stats(ref_h, ref_w, labels)
    (ref_lp * g).sum().backward()
    assert (h.grad[::3] == 0).all() and (h.grad[[1, 5]] == 0).all()
    torch.testing.assert_close(h.grad, ref_h.grad, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(w.grad, ref_w.grad, rtol=1e-5, atol=1e-6)


def test_routed_from_token_stats_for_gpu_tensors(monkeypatch):
    # As for CUDA tensors: token_stats flattens [B, T, H], takes the hidden states in the head's dtype,
    # and gives the GPU path's results, which equal the CPU path's.
    calls = []
    original = gpu.token_stats_gpu
    monkeypatch.setattr(lm_head, "on_gpu", lambda *tensors: True)
    monkeypatch.setattr(lm_head, "token_stats_gpu", lambda *a, **k: calls.append(k) or original(*a, **k))
    hidden, weight, labels = inputs(N=12, H=8, V=30, dtype=torch.float32)
    hidden, labels = hidden.view(3, 4, 8), labels.view(3, 4)
    got = token_stats(hidden, weight, labels, temperature=0.7, chunk_size=5)
    monkeypatch.undo()
    ref = token_stats(hidden, weight, labels, temperature=0.7)
    assert len(calls) == 1 and calls[0]["temperature"] == 0.7
    for r, x in zip(ref, got):
        assert x.shape == (3, 4)
        torch.testing.assert_close(x, r, rtol=0, atol=1e-5)


def test_on_gpu_is_cuda_and_a_kernel_dtype():
    from types import SimpleNamespace

    from rlstab.stats.backend import on_gpu

    def cuda(dtype):
        return SimpleNamespace(device=torch.device("cuda", 0), dtype=dtype)

    assert on_gpu(cuda(torch.bfloat16), cuda(torch.float32))
    assert not on_gpu(cuda(torch.bfloat16), cuda(torch.float64))
    assert not on_gpu(cuda(torch.bfloat16), torch.zeros(1))


def test_no_tokens_and_no_grad(use_triton):
    hidden, weight, labels = inputs(N=5, H=8, V=20, dtype=torch.float32)
    lp, ent = gpu_stats(use_triton)(hidden[:0].requires_grad_(), weight.requires_grad_(), labels[:0])
    assert lp.shape == ent.shape == (0,)
    lp.sum().backward()
    assert (weight.grad == 0).all()
    with torch.no_grad():
        lp, ent = gpu_stats(use_triton)(hidden, weight, labels)
    torch.testing.assert_close(ent.double(), naive(hidden.double(), weight.double(), labels)[1], rtol=0, atol=1e-5)


def test_reads_the_host_once_in_backward_and_never_in_forward():
    # The torch row passes (the Triton interpreter itself reads its CPU tensors as NumPy arrays).
    hidden, weight, labels = inputs(N=37, H=16, V=53, dtype=torch.float32)
    h, w = hidden.requires_grad_(), weight.requires_grad_()
    with host_syncs() as forward:
        lp, ent = gpu_stats(False)(h, w, labels)
    with host_syncs() as backward:
        lp.sum().backward()
    assert forward == []
    assert len(backward) == 1 and "lm_head_gpu.py" in backward[0]  # the number of tokens with a gradient


def test_tied_embedding_gets_both_gradients(use_triton):
    # The head's weight is also the embedding of the input ids: its gradient is the sum of both uses.
    _, weight, labels = inputs(N=12, H=8, V=30, dtype=torch.float32)
    ids = torch.randint(0, 30, (12,), generator=torch.Generator().manual_seed(4))
    results = []
    for fn in (token_stats, gpu_stats(use_triton)):
        w = weight.clone().requires_grad_()
        hidden = torch.tanh(torch.nn.functional.embedding(ids, w) * 2.0)  # a stand-in for the model
        lp, _ = fn(hidden, w, labels)
        lp.sum().backward()
        results.append(w.grad)
    torch.testing.assert_close(results[1], results[0], rtol=1e-5, atol=1e-6)
    assert results[0][ids].abs().sum() > 0


class Storages(TorchDispatchMode):
    """The storages the ops under it make or touch: data pointer -> (largest size seen in bytes, the ops)."""

    def __init__(self):
        super().__init__()
        self.seen: dict[int, tuple[int, set]] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor):
                storage = t.untyped_storage()
                size, ops = self.seen.get(storage.data_ptr(), (0, set()))
                self.seen[storage.data_ptr()] = (max(size, storage.nbytes()), ops | {func.__name__})
        return out


def test_working_memory_is_one_chunk_and_the_accumulator(monkeypatch):
    # The matmuls as a card's torch (2.10 and later) has them: half-precision operands, float32 results.
    torch_versions.install(monkeypatch, "torch>=2.10")
    n, width, vocab, chunk = 8, 64, 512, 8192  # 8,192 B / (8 tokens x 4 B) = 256 columns: two chunks
    hidden, weight, labels = inputs(N=n, H=width, V=vocab, dtype=torch.bfloat16)
    h, w = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
    with Storages() as made:
        lp, _ = gpu.token_stats_gpu(h, w, labels, temperature=1.0, entropy_grad=False, ignore_index=-100,
                                    use_triton=False, chunk_bytes=chunk)
        (lp * torch.linspace(-1, 1, n)).sum().backward()
    ptr = {name: t.untyped_storage().data_ptr() for name, t in (("h", h), ("w", w), ("h.grad", h.grad),
                                                                 ("w.grad", w.grad))}
    working = {p: size for p, (size, _) in made.seen.items() if p not in ptr.values()}
    # The largest: one chunk of float32 logits, 8 x 256 x 4 = 8,192 B (the float32 accumulator of grad_h is
    # 8 x 64 x 4 = 2,048 B, G in bf16 4,096 B). Before: the whole weight in float32, 512 x 64 x 4 = 131,072 B.
    assert max(working.values()) == 8192
    # The weight's gradient is made once, in the weight's dtype, and never zeroed (every chunk writes its rows).
    size, ops = made.seen[ptr["w.grad"]]
    assert size == vocab * width * 2
    assert not ops & {"zero_", "zeros_like", "fill_", "zeros"}, ops
