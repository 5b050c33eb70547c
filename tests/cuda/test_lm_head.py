"""The LM head's GPU path (rlstab.stats.lm_head_gpu) on a card, through each of half_matmul's branches.

The card's torch takes one branch by itself (``FUSED`` from torch 2.10); the other two are forced here, so
that the code a user of torch 2.8-2.9 (``MM_ONLY``) or 2.7 and older (``UPCAST``) runs has run on CUDA too.
"""

import pytest
import torch

import rlstab.stats.half_matmul as half_matmul
import rlstab.stats.lm_head_gpu as gpu
from rlstab.stats import token_stats

HALF_ULP = {torch.bfloat16: 2.0**-7, torch.float16: 2.0**-10}
BRANCHES = [half_matmul.FUSED, half_matmul.MM_ONLY, half_matmul.UPCAST]


def torch_version() -> tuple[int, int]:
    major, minor = torch.__version__.split("+")[0].split(".")[:2]
    return int(major), int(minor)


def test_the_cards_torch_takes_its_branch():
    expected = (half_matmul.FUSED if torch_version() >= (2, 10) else
                half_matmul.MM_ONLY if torch_version() >= (2, 8) else half_matmul.UPCAST)
    half_matmul.branch.cache_clear()
    assert half_matmul.branch("cuda", torch.bfloat16) == expected
    assert half_matmul.branch("cuda", torch.float16) == expected


@pytest.fixture(params=BRANCHES)
def branch(request, monkeypatch):
    def forced(device_type, dtype):
        return request.param if dtype in HALF_ULP else half_matmul.UPCAST

    monkeypatch.setattr(half_matmul, "branch", forced)
    return request.param


def head(cuda, dtype, n=300, width=256, vocab=5003, seed=0):
    g = torch.Generator(device="cpu").manual_seed(seed)
    hidden = torch.randn(n, width, generator=g).to(cuda, dtype)
    weight = (torch.randn(vocab, width, generator=g) * 0.2).to(cuda, dtype)
    labels = torch.randint(0, vocab, (n,), generator=g)
    labels[:3] = torch.tensor([0, vocab - 1, 1234])
    labels[3:6] = -100
    return hidden, weight, labels.to(cuda)


def reference(hidden, weight, labels, temperature):
    """float64 log-prob (0 where ignored) and entropy from the inputs' own values, differentiable."""
    logp = torch.log_softmax(hidden @ weight.t() / temperature, -1)
    keep = labels != -100
    lp = logp.gather(-1, torch.where(keep, labels, 0).unsqueeze(-1)).squeeze(-1)
    return torch.where(keep, lp, 0.0), -(logp.exp() * logp).sum(-1)


def run(fn, hidden, weight, labels, g1, g2, **kw):
    h, w = hidden.detach().clone().requires_grad_(), weight.detach().clone().requires_grad_()
    lp, ent = fn(h, w, labels, **kw)
    loss = (lp.double() * g1).sum() + ((ent.double() * g2).sum() if g2 is not None else 0.0)
    loss.backward()
    return lp.detach(), ent.detach(), h.grad, w.grad


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("entropy_grad", [False, True])
@pytest.mark.parametrize("active", [1.0, 0.2])
def test_each_branch_against_float64(cuda, branch, dtype, entropy_grad, active, monkeypatch):
    monkeypatch.setattr(gpu, "MIN_COLS", 128)  # narrower chunks than a card's default: several of them
    hidden, weight, labels = head(cuda, dtype)
    g = torch.Generator(device="cpu").manual_seed(1)
    g1 = torch.randn(len(labels), generator=g, dtype=torch.float64)
    g1 = torch.where(torch.rand(len(labels), generator=g) < active, g1, 0.0).to(cuda)  # 20%: as under 20-Entropy
    g2 = torch.randn(len(labels), generator=g, dtype=torch.float64).to(cuda) if entropy_grad else None
    got = run(gpu.token_stats_gpu, hidden, weight, labels, g1, g2, temperature=0.8, entropy_grad=entropy_grad,
              ignore_index=-100, use_triton=True, chunk_bytes=300 * 4 * 512)  # 512 columns: 10 chunks, a ragged one
    ref = run(reference, hidden.double(), weight.double(), labels, g1, g2, temperature=0.8)
    for x, r in zip(got[:2], ref[:2]):
        torch.testing.assert_close(x.double(), r, rtol=0, atol=2e-5)
    assert (got[0][3:6] == 0).all()
    # Gradients: G rounded to the head's dtype before the backward's matmuls, the results rounded to it.
    for x, r in zip(got[2:], ref[2:]):
        assert x.dtype == dtype
        ulp = HALF_ULP[dtype]
        torch.testing.assert_close(x.double(), r, rtol=4 * ulp, atol=4 * ulp * r.abs().max().item())
    if active < 1.0 and not entropy_grad:
        assert (got[2][g1 == 0] == 0).all()  # tokens without an upstream gradient: left out, exactly 0


def test_float32_head_against_the_cpu_path(cuda):
    hidden, weight, labels = head(cuda, torch.float32, n=64, width=128, vocab=3001)
    g1 = torch.linspace(-1, 1, 64, dtype=torch.float64, device=cuda)
    got = run(token_stats, hidden, weight, labels, g1, None)
    cpu = run(token_stats, hidden.cpu(), weight.cpu(), labels.cpu(), g1.cpu(), None)
    for x, r in zip(got, cpu):
        torch.testing.assert_close(x.cpu(), r, rtol=1e-4, atol=1e-5)  # TF32 as the user set it; float32 sums


def test_production_size_on_the_cards_branch(cuda):
    # N = 4,096 tokens of a 4,096-wide model with Qwen3's 151,936-entry vocabulary, bf16.
    half_matmul.branch.cache_clear()
    g = torch.Generator(device="cpu").manual_seed(3)
    n, width, vocab = 4096, 4096, 151_936
    hidden = torch.randn(n, width, generator=g).to(cuda, torch.bfloat16)
    weight = (torch.randn(vocab, width, generator=g) * (2.0 / width**0.5)).to(cuda, torch.bfloat16)
    labels = torch.randint(0, vocab, (n,), generator=g).to(cuda)
    h, w = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
    lp, ent = token_stats(h, w, labels)
    lp.sum().backward()
    ref_lp, ref_ent = reference(hidden[:64].double(), weight.double(), labels[:64], 1.0)
    torch.testing.assert_close(lp[:64].double(), ref_lp, rtol=0, atol=1e-4)
    torch.testing.assert_close(ent[:64].double(), ref_ent, rtol=0, atol=1e-4)
    assert torch.isfinite(h.grad).all() and torch.isfinite(w.grad).all()
    assert h.grad.dtype == w.grad.dtype == torch.bfloat16
