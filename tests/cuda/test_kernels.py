"""The Triton kernels of token_stats_from_logits on a card, against float64 and the CPU path.

Shapes and inputs a trainer hands them: bf16, fp16 and float32 logits; an odd vocabulary (ragged last
tile, scalar loads); more than 2^31 elements (64-bit offsets); logits shifted by one token (a row stride
that is not V), 3-D, and a column stride; temperature; ignored labels; a row entirely -inf.
"""

import math

import pytest
import torch

from rlstab.stats import token_stats_from_logits
from rlstab.stats.from_logits import runs_fused

# The gradient's bound: half-precision gradients are written in the logits' dtype (2 of its ulps of the
# largest entry); float32 ones carry the rounding of the kernels' exp2 and sums (1e-5 relative, 1e-6 absolute).
HALF_ULP = {torch.bfloat16: 2.0**-7, torch.float16: 2.0**-10}


def assert_grad_close(got, ref):
    if got.dtype == torch.float32:
        torch.testing.assert_close(got.double(), ref, rtol=1e-5, atol=1e-6)
    else:
        torch.testing.assert_close(got.double(), ref, rtol=0, atol=2 * HALF_ULP[got.dtype] * ref.abs().max().item())


def reference(logits, labels, temperature=1.0, ignore_index=-100):
    """float64 log-prob of the label (0 where ignored) and entropy, from the logits' own values."""
    logp = torch.log_softmax(logits.double() / temperature, -1)
    keep = labels != ignore_index
    lp = logp.gather(-1, torch.where(keep, labels, 0).unsqueeze(-1)).squeeze(-1)
    entropy = -torch.where(logp.isfinite(), logp.exp() * logp, 0.0).sum(-1)
    return torch.where(keep, lp, 0.0), entropy


def upstream(shape, device, seed):
    g = torch.Generator(device="cpu").manual_seed(seed)
    return torch.randn(shape, generator=g).to(device), torch.randn(shape, generator=g).to(device)


def check(logits, labels, temperature=1.0):
    """Values (float32 sums of the logits' values: within 1e-5 of float64) and gradient of the kernels,
    against float64."""
    x = logits.detach().clone().requires_grad_()
    assert runs_fused(x)
    lp, ent = token_stats_from_logits(x, labels, temperature=temperature, entropy_grad=True)
    g1, g2 = upstream(lp.shape, lp.device, seed=1)
    ((lp * g1).sum() + (ent * g2).sum()).backward()
    ref = logits.detach().double().requires_grad_()
    ref_lp, ref_ent = reference(ref, labels, temperature)
    ((ref_lp * g1.double()).sum() + (ref_ent * g2.double()).sum()).backward()
    torch.testing.assert_close(lp.double(), ref_lp.detach(), rtol=0, atol=1e-5)
    torch.testing.assert_close(ent.double(), ref_ent.detach(), rtol=0, atol=1e-5)
    assert x.grad.dtype == logits.dtype
    assert_grad_close(x.grad, ref.grad)
    return lp.detach(), ent.detach()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_against_float64_and_the_cpu_path(cuda, dtype, temperature):
    g = torch.Generator(device="cpu").manual_seed(0)
    n, vocab = 64, 32003  # odd: 7 full tiles of 4,096 and a ragged one, scalar loads
    logits = (torch.randn(n, vocab, generator=g) * 3).to(cuda, dtype)
    labels = torch.randint(0, vocab, (n,), generator=g)
    labels[:4] = torch.tensor([0, vocab - 1, 4095, 4096])  # the vocabulary's and a tile's edges
    labels[5:8] = -100  # ignored: log-prob 0, no one-hot term
    labels = labels.to(cuda)
    lp, ent = check(logits, labels, temperature)
    assert (lp[5:8] == 0).all()
    cpu_lp, cpu_ent = token_stats_from_logits(logits.cpu(), labels.cpu(), temperature=temperature)
    torch.testing.assert_close(lp.cpu(), cpu_lp, rtol=0, atol=1e-5)
    torch.testing.assert_close(ent.cpu(), cpu_ent, rtol=0, atol=1e-5)


def test_more_than_2_31_elements(cuda):
    # 14,200 x 151,936 = 2,157,491,200 > 2^31 = 2,147,483,648: offsets past the last rows need 64 bits.
    n, vocab = 14_200, 151_936
    assert n * vocab > 2**31
    logits = torch.randn(n, vocab, device=cuda, dtype=torch.bfloat16)
    labels = torch.randint(0, vocab, (n,), device=cuda)
    rows = torch.tensor([0, 1, n - 2, n - 1], device=cuda)
    x = logits.requires_grad_()
    lp, ent = token_stats_from_logits(x, labels, entropy_grad=True)
    g = torch.zeros(n, device=cuda)
    g[rows] = torch.tensor([1.0, -0.5, 0.25, 2.0], device=cuda)
    ((lp * g).sum() + (ent * g).sum()).backward()
    part = logits.detach()[rows].double().requires_grad_()
    ref_lp, ref_ent = reference(part, labels[rows])
    ((ref_lp * g[rows].double()).sum() + (ref_ent * g[rows].double()).sum()).backward()
    torch.testing.assert_close(lp[rows].double(), ref_lp.detach(), rtol=0, atol=1e-5)
    torch.testing.assert_close(ent[rows].double(), ref_ent.detach(), rtol=0, atol=1e-5)
    assert_grad_close(x.grad[rows], part.grad)
    assert (x.grad[2 : n - 2].abs().amax(-1) == 0).all()  # rows without an upstream gradient: exactly 0


def test_shifted_three_dimensional_and_column_strided_logits(cuda):
    g = torch.Generator(device="cpu").manual_seed(2)
    B, T, vocab = 3, 17, 5000
    full = torch.randn(B, T + 1, vocab, generator=g).to(cuda, torch.bfloat16)
    labels = torch.randint(0, vocab, (B, T), generator=g).to(cuda)
    shifted = full[:, :-1]  # the model's logits for the next token: row stride (T + 1) V, not V
    assert not shifted.is_contiguous()
    lp, ent = token_stats_from_logits(shifted, labels)
    ref_lp, ref_ent = reference(shifted, labels)
    assert lp.shape == ent.shape == (B, T)
    torch.testing.assert_close(lp.double(), ref_lp, rtol=0, atol=1e-5)
    torch.testing.assert_close(ent.double(), ref_ent, rtol=0, atol=1e-5)
    every_other = full.reshape(-1, vocab)[:, ::2]  # column stride 2, 2,500 columns
    check(every_other, torch.randint(0, vocab // 2, (every_other.shape[0],), generator=g).to(cuda))


def test_a_row_entirely_minus_infinity_is_uniform(cuda):
    vocab = 1000
    logits = torch.randn(4, vocab, device=cuda)
    logits[1] = -math.inf  # every entry masked: the kernels take it as uniform (docs: the CPU path's convention)
    logits[2, 500:] = -math.inf  # half masked: those entries have probability 0
    labels = torch.tensor([3, 7, 10, 20], device=cuda)
    x = logits.clone().requires_grad_()
    lp, ent = token_stats_from_logits(x, labels, entropy_grad=True)
    (lp.sum() + ent.sum()).backward()
    assert ent[1].item() == pytest.approx(math.log(vocab), abs=1e-5)
    assert lp[1].item() == pytest.approx(-math.log(vocab), abs=1e-5)
    # Uniform p = 1 / V: d logprob / dz = onehot - p; d entropy / dz = -p (log p + H) = 0.
    expected = torch.full((vocab,), -1.0 / vocab, device=cuda)
    expected[7] += 1.0
    torch.testing.assert_close(x.grad[1], expected, rtol=0, atol=1e-6)
    ref_lp, ref_ent = reference(logits[[0, 2, 3]], labels[[0, 2, 3]])
    torch.testing.assert_close(lp[[0, 2, 3]].double(), ref_lp, rtol=0, atol=1e-5)
    torch.testing.assert_close(ent[[0, 2, 3]].double(), ref_ent, rtol=0, atol=1e-5)
    assert (x.grad[2, 500:] == 0).all() and torch.isfinite(x.grad).all()
