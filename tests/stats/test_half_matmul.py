"""The three branches of rlstab.stats.half_matmul, each under a stand-in for ``torch.mm`` and ``torch.addmm``
that behaves as one range of torch versions does (tests/torch_versions.py), and the LM head's GPU path run
through each.
"""

import pytest
import torch
import torch_versions
from torch_versions import HALF, VERSIONS

import rlstab.stats.half_matmul as half_matmul
import rlstab.stats.lm_head_gpu as gpu


@pytest.fixture
def torch_version(request, monkeypatch):
    """torch.mm and torch.addmm as the named versions have them: (the branch expected, the calls made)."""
    calls = torch_versions.install(monkeypatch, request.param)
    yield VERSIONS[request.param][2], calls
    half_matmul.branch.cache_clear()


@pytest.mark.parametrize("torch_version", list(VERSIONS), indirect=True)
@pytest.mark.parametrize("dtype", HALF)
def test_probe_finds_the_branch(torch_version, dtype):
    expected, _ = torch_version
    assert half_matmul.branch("cpu", dtype) == expected
    assert half_matmul.branch("cpu", torch.float32) == half_matmul.UPCAST  # float32 operands: a plain matmul


@pytest.mark.parametrize("torch_version", list(VERSIONS), indirect=True)
def test_products_and_accumulation_in_float32(torch_version):
    expected, calls = torch_version
    g = torch.Generator().manual_seed(0)
    a, b = (torch.randn(5, 7, generator=g).bfloat16(), torch.randn(7, 3, generator=g).bfloat16())
    acc = torch.randn(5, 3, generator=g)
    exact = a.double() @ b.double()  # bf16 x bf16 products are exact in float32; 7 terms: sums to ~1e-7
    mats = half_matmul.Matmuls(torch.bfloat16, torch.device("cpu"))
    calls.clear()
    x, y = mats.operand(a), mats.operand(b)
    assert (x.dtype == torch.float32) == (expected == half_matmul.UPCAST)
    product = mats.mm(x, y)
    assert product.dtype == torch.float32
    torch.testing.assert_close(product.double(), exact, rtol=0, atol=1e-6)
    before = acc.clone()
    assert mats.add_mm(acc, x, y) is acc  # in place, whatever the branch
    torch.testing.assert_close(acc.double(), before.double() + exact, rtol=0, atol=1e-6)
    # Which torch calls each branch made: float32 operands (UPCAST) never pass out_dtype; MM_ONLY never asks
    # addmm for it; FUSED accumulates with addmm's out_dtype.
    with_dtype = {name for name, dtype in calls if dtype is not None}
    assert with_dtype == {half_matmul.UPCAST: set(), half_matmul.MM_ONLY: {"mm"},
                          half_matmul.FUSED: {"mm", "addmm"}}[expected]


def _head(dtype, seed=0, n=37, h=16, v=53):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(n, h, generator=g).to(dtype)
    weight = (torch.randn(v, h, generator=g) * 0.5).to(dtype)
    return hidden, weight, torch.randint(0, v, (n,), generator=g)


def _run_head(hidden, weight, labels):
    h, w = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
    lp, ent = gpu.token_stats_gpu(h, w, labels, temperature=0.8, entropy_grad=True, ignore_index=-100,
                                  use_triton=False, chunk_bytes=1484)
    g = torch.Generator().manual_seed(1)
    ((lp * torch.randn(lp.shape, generator=g)).sum() + (ent * torch.randn(ent.shape, generator=g)).sum()).backward()
    return lp.detach(), ent.detach(), h.grad, w.grad


@pytest.mark.parametrize("torch_version", list(VERSIONS), indirect=True)
def test_the_lm_head_gives_the_same_numbers_on_every_branch(torch_version, monkeypatch):
    monkeypatch.setattr(gpu, "MIN_COLS", 8)
    hidden, weight, labels = _head(torch.bfloat16)
    got = _run_head(hidden, weight, labels)
    monkeypatch.undo()  # the real torch: CPU tensors take UPCAST, the reference branch
    half_matmul.branch.cache_clear()
    monkeypatch.setattr(gpu, "MIN_COLS", 8)
    ref = _run_head(hidden, weight, labels)
    # The stand-ins compute each product as UPCAST does (float32 values of the bf16 operands): only the
    # order of the float32 sums could differ, and here it does not.
    for x, r in zip(got, ref):
        assert x.dtype == r.dtype
        torch.testing.assert_close(x, r, rtol=0, atol=0)
