"""The Triton kernels of token_stats_from_logits against float64 references and the CPU path.

Run by Triton's interpreter on CPU tensors where no GPU is present (tests/conftest.py sets
``TRITON_INTERPRET=1`` before anything imports Triton), on small odd shapes: ``block_v`` of 16 or
64 makes a vocabulary of 101 several tiles with a ragged last one. Without Triton these tests fail
at the import below, on purpose: Triton comes with the ``triton`` extra (which scripts/test.sh
installs; CUDA builds of torch ship it). scripts/test.sh runs them under the newest Triton and
under Triton 3.6, the one torch 2.11 ships.
"""

import math

import pytest
import torch

from rlstab.stats import token_stats_from_logits
from rlstab.stats.triton import function, token_stats_from_logits_triton

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")  # CPU: the interpreter runs them


def kernels(logits, labels, **kw):
    """``token_stats_from_logits_triton`` on ``DEVICE``, its results back on the CPU (differentiably)."""
    lp, ent = token_stats_from_logits_triton(logits.to(DEVICE), None if labels is None else labels.to(DEVICE), **kw)
    return (None if lp is None else lp.cpu()), ent.cpu()


def naive(logits, labels, temperature=1.0):
    """float64 log_softmax: (logprob of the label, entropy, lse)."""
    x = logits.double() / temperature
    logp = torch.log_softmax(x, -1)
    lp = logp.gather(-1, labels.clamp(min=0).unsqueeze(-1)).squeeze(-1)
    return lp, -(logp.exp() * logp).sum(-1), torch.logsumexp(x, -1)


def naive_pair(logits, labels, temperature=1.0):
    return naive(logits, labels, temperature)[:2]


def logits_and_labels(N=29, V=101, seed=0, scale=3.0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    logits = (torch.randn(N, V, generator=g, dtype=torch.float64) * scale).to(dtype)
    labels = torch.randint(0, V, (N,), generator=g)
    labels[:2] = torch.tensor([0, V - 1])  # the first and the last column (the ragged tile)
    return logits, labels


def upstream(n, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, generator=g, dtype=torch.float64), torch.randn(n, generator=g, dtype=torch.float64)


def values_and_grad(fn, logits, labels, wrt=("logprob",), seed=1, **kw):
    """(logprob, entropy, d(g1 . logprob + g2 . entropy)/dlogits) with the terms named in ``wrt``."""
    x = logits.detach().clone().requires_grad_()
    lp, ent = fn(x, labels, **kw)
    g1, g2 = upstream(ent.numel(), seed)
    loss = 0.0
    if "logprob" in wrt:
        loss = loss + (lp.reshape(-1) * g1.to(lp.dtype)).sum()
    if "entropy" in wrt:
        loss = loss + (ent.reshape(-1) * g2.to(ent.dtype)).sum()
    (grad,) = torch.autograd.grad(loss, x)
    return (None if lp is None else lp.detach()), ent.detach(), grad


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("block_v", [16, 64])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_values_within_1e_5_of_float64(dtype, block_v, temperature):
    logits, labels = logits_and_labels(dtype=dtype)
    lp, ent, row_max, log2sum = (t.cpu() for t in function.forward(logits.to(DEVICE), labels.to(DEVICE), temperature, -100, block_v))
    ref_lp, ref_ent, ref_lse = naive(logits, labels, temperature)  # of the logits as rounded to dtype
    assert lp.dtype == ent.dtype == torch.float32
    torch.testing.assert_close(lp.double(), ref_lp, rtol=0, atol=1e-5)
    torch.testing.assert_close(ent.double(), ref_ent, rtol=0, atol=1e-5)
    lse = (row_max.double() + log2sum.double()) * math.log(2)  # lse = ln2 (m + log2 S)
    torch.testing.assert_close(lse, ref_lse, rtol=0, atol=1e-5)


@pytest.mark.parametrize(
    "entropy_grad, wrt",
    [(False, ("logprob",)), (True, ("logprob",)), (True, ("entropy",)), (True, ("logprob", "entropy"))],
)
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_float32_gradients_against_float64(entropy_grad, wrt, temperature):
    logits, labels = logits_and_labels()
    ref = values_and_grad(naive_pair, logits.double(), labels, wrt, temperature=temperature)
    got = values_and_grad(kernels, logits, labels, wrt, temperature=temperature,
                          entropy_grad=entropy_grad, block_v=32)
    assert got[2].dtype == torch.float32
    torch.testing.assert_close(got[2].double(), ref[2], rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("wrt", [("logprob",), ("entropy",), ("logprob", "entropy")])
def test_low_precision_gradients_match_the_cpu_path(dtype, wrt):
    logits, labels = logits_and_labels(dtype=dtype)
    kw = dict(temperature=0.7, entropy_grad=True)
    ref = values_and_grad(token_stats_from_logits, logits, labels, wrt, **kw)
    got = values_and_grad(kernels, logits, labels, wrt, block_v=16, **kw)
    assert got[2].dtype == dtype
    torch.testing.assert_close(got[0], ref[0], rtol=0, atol=2e-6)
    torch.testing.assert_close(got[1], ref[1], rtol=0, atol=2e-6)
    # Both round the same float32 gradient (up to float32 rounding) to the dtype: one ulp at most.
    torch.testing.assert_close(got[2].float(), ref[2].float(), rtol=2**-7, atol=1e-7)


def test_two_logits_by_hand():
    # logits [0, ln 3]: p = [1, 3] / 4. logprob(1) = ln(3/4); entropy = -(1/4 ln 1/4 + 3/4 ln 3/4)
    # = ln 4 - (3/4) ln 3. d logprob(1) / dlogits = onehot - p = [-1/4, 1/4]; d entropy / dlogit_v
    # = -p_v (ln p_v + H): v=0: -(1/4)(-ln 4 + ln 4 - (3/4) ln 3) = (3/16) ln 3, v=1: -(3/16) ln 3.
    x = torch.tensor([[0.0, math.log(3.0)]], requires_grad=True)
    lp, ent = kernels(x, torch.tensor([1]), entropy_grad=True)
    torch.testing.assert_close(lp, torch.tensor([math.log(0.75)]))
    torch.testing.assert_close(ent, torch.tensor([math.log(4.0) - 0.75 * math.log(3.0)]))
    (g_lp,) = torch.autograd.grad(lp.sum(), x, retain_graph=True)
    torch.testing.assert_close(g_lp, torch.tensor([[-0.25, 0.25]]))
    (g_ent,) = torch.autograd.grad(ent.sum(), x)
    c = 3 / 16 * math.log(3.0)
    torch.testing.assert_close(g_ent, torch.tensor([[c, -c]]))


def test_uniform_rows_have_log_v_entropy():
    # 37 equal logits over three tiles of 16: p_v = 1/37, entropy ln 37, logprob -ln 37.
    lp, ent = kernels(torch.full((3, 37), 2.5), torch.tensor([0, 20, 36]), block_v=16)
    torch.testing.assert_close(ent, torch.full((3,), math.log(37)))
    torch.testing.assert_close(lp, torch.full((3,), -math.log(37)))


def test_vocabulary_of_one():
    # p = 1: logprob 0, entropy 0, and both gradients vanish (1 - p = 0; -p (ln p + H) = 0).
    x = torch.randn(5, 1, requires_grad=True)
    lp, ent = kernels(x, torch.zeros(5, dtype=torch.long), entropy_grad=True)
    assert torch.all(lp == 0) and torch.all(ent == 0)
    (grad,) = torch.autograd.grad(lp.sum() + ent.sum(), x)
    assert torch.all(grad == 0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_one_finite_logit_per_row(dtype):
    # Every logit -inf but one, at a different column (and tile) per row: p = onehot, entropy 0.
    # Labels on the finite logit: logprob 0 and no gradient. Labels on a masked one: the CPU
    # path's logprob (ln2 times the lowest float, finite) and a gradient +g there, -g on the finite one.
    N, V = 12, 70
    x = torch.full((N, V), -math.inf, dtype=dtype)
    finite = torch.arange(N) * 6
    x[torch.arange(N), finite] = torch.randn(N).to(dtype)
    labels = torch.where(torch.arange(N) % 2 == 0, finite, (finite + 1) % V)
    wrt = ("logprob", "entropy")
    ref = values_and_grad(token_stats_from_logits, x, labels, wrt, entropy_grad=True)
    got = values_and_grad(kernels, x, labels, wrt, entropy_grad=True, block_v=16)
    assert torch.all(got[1] == 0)
    assert torch.all(got[0][0::2] == 0) and torch.all(torch.isfinite(got[0]))
    torch.testing.assert_close(got[0], ref[0], rtol=1e-6, atol=0)
    assert torch.all(got[2][0::2] == 0)
    g1 = upstream(N)[0].to(torch.float32).to(dtype)
    torch.testing.assert_close(got[2], ref[2])
    torch.testing.assert_close(got[2][1::2, :].sum(1), torch.zeros(N // 2, dtype=dtype))
    torch.testing.assert_close(got[2][torch.arange(1, N, 2), labels[1::2]], g1[1::2])


def test_masked_tail_of_the_vocabulary():
    # -inf logits from column 40 on (tiles 3-6 of 16 partly and wholly masked) have probability 0.
    logits, labels = logits_and_labels(V=101)
    logits[:, 40:] = -math.inf
    labels = labels % 40
    wrt = ("logprob", "entropy")
    got = values_and_grad(kernels, logits, labels, wrt, entropy_grad=True, block_v=16)
    ref = values_and_grad(naive_pair, logits[:, :40].double(), labels, wrt)
    torch.testing.assert_close(got[0].double(), ref[0], rtol=0, atol=1e-5)
    torch.testing.assert_close(got[1].double(), ref[1], rtol=0, atol=1e-5)
    torch.testing.assert_close(got[2][:, :40].double(), ref[2], rtol=1e-6, atol=1e-6)
    assert torch.all(got[2][:, 40:] == 0)


def test_masked_head_of_the_vocabulary():
    # -inf logits before column 50: whole tiles at the lowest float come first, then the maximum
    # rises by ~3.4e38 and the sums move to it (the 2^(m - m') (m - m') S term must stay 0).
    logits, labels = logits_and_labels(V=101)
    logits[:, :50] = -math.inf
    labels = 50 + labels % 51
    got = values_and_grad(kernels, logits, labels, ("logprob", "entropy"),
                          entropy_grad=True, block_v=16)
    ref = values_and_grad(naive_pair, logits[:, 50:].double(), labels - 50, ("logprob", "entropy"))
    torch.testing.assert_close(got[0].double(), ref[0], rtol=0, atol=1e-5)
    torch.testing.assert_close(got[1].double(), ref[1], rtol=0, atol=1e-5)
    torch.testing.assert_close(got[2][:, 50:].double(), ref[2], rtol=1e-6, atol=1e-6)
    assert torch.all(got[2][:, :50] == 0)


def test_row_of_minus_inf_is_uniform():
    # Every logit at the lowest float: as on the CPU path, the row is uniform over V = 23 (entropy
    # ln 23, logprob -ln 23). The gradient is the uniform distribution's, g (onehot - 1/23) (the
    # entropy term -p (ln p + H) = -(1/23)(-ln 23 + ln 23) = 0). The CPU path's backward gives
    # p = 0 there instead (its log-sum-exp, kept in nats, rounds at the lowest float), so the
    # gradient is compared with the formula, not with it.
    V = 23
    x = torch.full((2, V), -math.inf)
    x[1] = torch.randn(V)
    labels = torch.tensor([4, 5])
    lp, ent, grad = values_and_grad(kernels, x, labels, ("logprob", "entropy"),
                                    entropy_grad=True, block_v=16)
    ref_lp, ref_ent, _ = values_and_grad(token_stats_from_logits, x, labels, ("logprob", "entropy"), entropy_grad=True)
    torch.testing.assert_close(lp, ref_lp)
    torch.testing.assert_close(ent, ref_ent)
    torch.testing.assert_close(ent[0], torch.tensor(math.log(V)))
    torch.testing.assert_close(lp[0], torch.tensor(-math.log(V)))
    g1 = upstream(2)[0].float()
    expected = torch.full((V,), -1.0 / V) * g1[0]
    expected[4] += g1[0]
    torch.testing.assert_close(grad[0], expected)


@pytest.mark.parametrize("ignore_index", [-100, -1])
def test_ignored_labels(ignore_index):
    logits, labels = logits_and_labels()
    labels[[3, 17]] = ignore_index
    got = values_and_grad(kernels, logits, labels, ("logprob",), ignore_index=ignore_index,
                          block_v=32)
    ref = values_and_grad(token_stats_from_logits, logits, labels, ("logprob",), ignore_index=ignore_index)
    assert got[0][3] == 0 and got[0][17] == 0
    assert torch.all(got[2][[3, 17]] == 0)
    torch.testing.assert_close(got[0], ref[0], rtol=0, atol=2e-6)
    torch.testing.assert_close(got[1], ref[1], rtol=0, atol=2e-6)
    torch.testing.assert_close(got[2], ref[2], rtol=1e-6, atol=1e-6)


def test_label_outside_the_vocabulary_gives_nan():
    logits, labels = logits_and_labels(N=4, V=10)
    labels[1], labels[2] = 10, -3
    lp, _ = kernels(logits, labels)
    assert torch.isnan(lp[1]) and torch.isnan(lp[2]) and torch.isfinite(lp[[0, 3]]).all()


def test_entropy_alone_detached_and_with_gradient():
    logits, labels = logits_and_labels()
    x = logits.clone().requires_grad_()
    lp, ent = kernels(x, None, block_v=32)
    assert lp is None and not ent.requires_grad
    got = values_and_grad(kernels, logits, None, ("entropy",), entropy_grad=True, block_v=32)
    ref = values_and_grad(naive_pair, logits.double(), labels, ("entropy",))
    assert got[0] is None
    torch.testing.assert_close(got[1].double(), ref[1], rtol=0, atol=1e-5)
    torch.testing.assert_close(got[2].double(), ref[2], rtol=1e-6, atol=1e-6)


def test_entropy_detached_unless_asked():
    logits, labels = logits_and_labels()
    lp, ent = kernels(logits.requires_grad_(), labels)
    assert lp.requires_grad and not ent.requires_grad


@pytest.mark.parametrize("layout", ["transposed", "strided columns"])
def test_non_contiguous_logits(layout):
    logits, labels = logits_and_labels(N=13, V=45)
    if layout == "transposed":
        x = logits.to(DEVICE).t().contiguous().t()  # strides (1, 13)
    else:
        x = torch.zeros(13, 90, device=DEVICE).index_copy_(1, torch.arange(0, 90, 2, device=DEVICE), logits.to(DEVICE))
        x = x[:, ::2]  # strides (90, 2)
    assert not x.is_contiguous() and torch.equal(x.cpu(), logits)
    x.requires_grad_()
    lp, ent = token_stats_from_logits_triton(x, labels.to(DEVICE), entropy_grad=True, block_v=16)
    g1, g2 = upstream(13)
    (grad,) = torch.autograd.grad((lp * g1.float().to(DEVICE)).sum() + (ent * g2.float().to(DEVICE)).sum(), x)
    ref = values_and_grad(token_stats_from_logits, logits, labels, ("logprob", "entropy"), entropy_grad=True)
    for g, r in zip((lp, ent, grad), ref):
        torch.testing.assert_close(g.detach().cpu(), r, rtol=1e-6, atol=2e-6)


def test_leading_dimensions():
    logits, labels = logits_and_labels(N=24, V=33)
    for x, y in [(logits.view(4, 6, 33), labels.view(4, 6)),
                 (logits.view(6, 4, 33).transpose(0, 1), labels.view(6, 4).t())]:  # 3-D, not viewable as 2-D
        got = values_and_grad(kernels, x, y, ("logprob", "entropy"), entropy_grad=True,
                              block_v=16)
        ref = values_and_grad(token_stats_from_logits, x, y, ("logprob", "entropy"), entropy_grad=True)
        assert got[0].shape == got[1].shape == y.shape and got[2].shape == x.shape
        for g, r in zip(got, ref):
            torch.testing.assert_close(g, r, rtol=1e-6, atol=2e-6)


def test_no_tokens():
    x = torch.zeros(0, 10, requires_grad=True)
    lp, ent = kernels(x, torch.zeros(0, dtype=torch.long), entropy_grad=True)
    assert lp.shape == ent.shape == (0,)
    (grad,) = torch.autograd.grad(lp.sum() + ent.sum(), x)
    assert grad.shape == (0, 10)


def test_no_grad_mode():
    logits, labels = logits_and_labels()
    with torch.no_grad():
        lp, ent = kernels(logits.requires_grad_(), labels, entropy_grad=True)
    assert not lp.requires_grad and not ent.requires_grad
    torch.testing.assert_close(lp.double(), naive(logits.detach(), labels)[0], rtol=0, atol=1e-5)


def test_saves_only_the_logits_and_per_token_numbers():
    logits, labels = logits_and_labels(N=16, V=300)
    logits, labels = logits.to(DEVICE).requires_grad_(), labels.to(DEVICE)
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        token_stats_from_logits_triton(logits, labels, block_v=64)
    big = [t for t in saved if t.numel() >= 300]
    assert len(big) == 1 and big[0].data_ptr() == logits.data_ptr()  # the input itself, no copy
    assert sum(t.numel() for t in saved) <= logits.numel() + 4 * 16  # labels, m, log2 S, entropy


def test_arguments_checked():
    logits, labels = logits_and_labels(N=3, V=8)
    with pytest.raises(ValueError, match="temperature"):
        kernels(logits, labels, temperature=0.0)
    with pytest.raises(ValueError, match="chunk_size"):
        kernels(logits, labels, chunk_size=0)
    with pytest.raises(ValueError, match="labels"):
        kernels(logits, labels[:2])
    with pytest.raises(ValueError, match="power of 2"):
        kernels(logits, labels, block_v=24)
    with pytest.raises(TypeError, match="float64"):
        kernels(logits.double(), labels)
    with pytest.raises(ValueError, match="labels are on meta"):
        token_stats_from_logits_triton(logits, labels.to("meta"))
    with pytest.raises(ValueError, match="empty vocabulary"):
        kernels(torch.zeros(3, 0), labels)
