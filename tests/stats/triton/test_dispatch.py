"""Which path token_stats_from_logits takes: Triton for CUDA logits when Triton imports, torch otherwise.

No GPU here: the CUDA side is checked on stand-ins (an object with a CUDA device) and by forcing
the route on CPU tensors, which the interpreter then runs.
"""

import json
import subprocess
import sys
import warnings
from types import SimpleNamespace

import pytest
import torch

import rlstab.stats.triton
from rlstab.stats import from_logits, token_stats_from_logits


def logits_and_labels(N=9, V=37, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(N, V, generator=g) * 3, torch.randint(0, V, (N,), generator=g)


def refuse(*args, **kwargs):
    raise AssertionError("the Triton path was called")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_cpu_tensors_never_reach_triton(monkeypatch, dtype):
    monkeypatch.setattr(rlstab.stats.triton, "token_stats_from_logits_triton", refuse)
    monkeypatch.setattr(rlstab.stats.triton.function, "forward", refuse)
    monkeypatch.setattr(rlstab.stats.triton.function, "backward", refuse)
    logits, labels = logits_and_labels()
    x = logits.to(dtype).requires_grad_()
    lp, ent = token_stats_from_logits(x, labels, entropy_grad=True)
    (lp.sum() + ent.sum()).backward()
    assert x.grad is not None


def test_cpu_path_imports_no_triton():
    """In a fresh interpreter: importing rlstab.stats and running it on CPU tensors leaves Triton unimported."""
    code = """
import json, sys, torch
from rlstab.stats import token_stats_from_logits
x = torch.randn(4, 10, requires_grad=True)
lp, ent = token_stats_from_logits(x, torch.tensor([1, 2, 3, 4]), entropy_grad=True)
(lp.sum() + ent.sum()).backward()
print(json.dumps(sorted(m for m in sys.modules if m.split(".")[0] == "triton" or m.startswith("rlstab.stats.triton"))))
"""
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout.strip().splitlines()[-1]) == []


def cuda(dtype):
    return SimpleNamespace(device=torch.device("cuda", 0), dtype=dtype)


def test_routing_predicate():
    assert from_logits._triton_imports()  # Triton comes with the triton extra
    for dtype in (torch.float16, torch.bfloat16, torch.float32):
        assert from_logits._use_triton(cuda(dtype))
        assert not from_logits._use_triton(torch.zeros(1, 2, dtype=dtype))  # CPU
    assert not from_logits._use_triton(cuda(torch.float64))  # float64 stays on the exact torch path


def without_kernel_modules(monkeypatch):
    for name in [m for m in sys.modules if m.startswith("rlstab.stats.triton")]:
        monkeypatch.delitem(sys.modules, name)


def test_no_triton_means_the_torch_path(monkeypatch):
    from_logits._triton_imports.cache_clear()
    try:
        without_kernel_modules(monkeypatch)
        monkeypatch.setitem(sys.modules, "triton", None)  # `import triton` now fails, as where it is not installed
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # a machine without Triton is not warned about
            assert not from_logits._triton_imports()
        assert not from_logits._use_triton(cuda(torch.bfloat16))
    finally:
        monkeypatch.undo()
        from_logits._triton_imports.cache_clear()
    assert from_logits._use_triton(cuda(torch.bfloat16))


def test_a_triton_the_kernels_cannot_use_is_warned_about(monkeypatch):
    from_logits._triton_imports.cache_clear()
    try:
        without_kernel_modules(monkeypatch)
        monkeypatch.setitem(sys.modules, "triton", SimpleNamespace())  # a Triton without `jit`
        with pytest.warns(RuntimeWarning, match="the Triton kernels do not import .*slower torch path"):
            assert not from_logits._triton_imports()
    finally:
        monkeypatch.undo()
        from_logits._triton_imports.cache_clear()


def test_routed_call_runs_the_kernels_with_the_same_results(monkeypatch):
    # Route as if the logits were CUDA ones (on a machine without a GPU they are CPU tensors, which
    # the interpreter runs): the public function calls the Triton entry (chunk_size accepted and
    # ignored) and gives the CPU path's values and gradient.
    device = "cuda" if torch.cuda.is_available() else "cpu"
    logits, labels = logits_and_labels()
    labels[4] = -100
    ref_x, x = logits.clone().requires_grad_(), logits.to(device).requires_grad_()
    ref = token_stats_from_logits(ref_x, labels, temperature=0.8, entropy_grad=True, chunk_size=4)
    calls = []
    entry = rlstab.stats.triton.token_stats_from_logits_triton

    def spy(*args, **kwargs):
        calls.append(kwargs)
        return entry(*args, **kwargs)

    monkeypatch.setattr(from_logits, "_use_triton", lambda logits: True)
    monkeypatch.setattr(rlstab.stats.triton, "token_stats_from_logits_triton", spy)
    got = token_stats_from_logits(x, labels.to(device), temperature=0.8, entropy_grad=True, chunk_size=4)
    assert calls == [dict(temperature=0.8, entropy_grad=True, ignore_index=-100)]
    for r, g in zip(ref, got):
        torch.testing.assert_close(g.detach().cpu(), r.detach(), rtol=0, atol=2e-6)
    (ref_grad,) = torch.autograd.grad(ref[0].sum() + ref[1].sum(), ref_x)
    (grad,) = torch.autograd.grad(got[0].sum() + got[1].sum(), x)
    torch.testing.assert_close(grad.cpu(), ref_grad, rtol=1e-6, atol=1e-6)


def test_torch_path_chunks_are_gpu_sized_off_the_cpu(monkeypatch):
    # 151,936 float32 logits a token: 16 MiB / (151,936 x 4 B) = 27 rows on CPU (as before),
    # 256 MiB / (151,936 x 4 B) = 441 rows on a GPU without Triton.
    assert from_logits.default_chunk_rows(151_936) == 27
    assert from_logits.default_chunk_rows(151_936, 4, from_logits.GPU_CHUNK_BYTES) == 441
    seen = []
    rows = from_logits.default_chunk_rows
    monkeypatch.setattr(from_logits, "default_chunk_rows", lambda *a: seen.append(a[2]) or rows(*a))
    for device in ("cpu", "meta"):  # meta: a device that is not the CPU, without a GPU
        token_stats_from_logits(torch.zeros(3, 50, device=device), torch.zeros(3, dtype=torch.long, device=device))
    assert seen == [from_logits.CHUNK_BYTES, from_logits.GPU_CHUNK_BYTES]
