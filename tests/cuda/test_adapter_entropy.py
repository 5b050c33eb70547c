"""The entropy the veRL and OpenRLHF adapters give their trainers, on CUDA logits: the Triton kernels, right.

veRL's engine calls ``rlstab.adapters.verl.entropy.entropy_from_logits`` (with its gradient, for an
entropy bonus); OpenRLHF's actor ``rlstab.adapters.openrlhf.entropy.detached_entropy``. On a card with
veRL installed the veRL adapter is imported as veRL imports it. A bare card lacks veRL's own imports
(ray, tensordict); there the module is loaded alone, without the adapter package's ``__init__``, which
installs rlstab into veRL: the function under test is the same file either way, and its Triton route
needs nothing from veRL.
"""

import importlib
import math
import sys
import types
from pathlib import Path

import pytest
import torch

import rlstab.adapters
import rlstab.stats.triton.function as kernels
from rlstab.adapters.openrlhf.entropy import detached_entropy


@pytest.fixture
def verl_entropy():
    try:
        module = importlib.import_module("rlstab.adapters.verl.entropy")
    except ImportError:  # veRL or one of its imports is missing on this card
        module = None
    if module is not None:
        yield module
        return
    before = set(sys.modules)
    package = types.ModuleType("rlstab.adapters.verl")
    package.__path__ = [str(Path(rlstab.adapters.__file__).parent / "verl")]
    sys.modules["rlstab.adapters.verl"] = package
    try:
        yield importlib.import_module("rlstab.adapters.verl.entropy")
    finally:
        for name in set(sys.modules) - before:
            if name.startswith("rlstab.adapters.verl"):
                del sys.modules[name]


@pytest.fixture
def launches(monkeypatch):
    """How many times the Triton forward kernel was launched."""
    count = []
    original = kernels.forward
    monkeypatch.setattr(kernels, "forward", lambda *a, **k: count.append(1) or original(*a, **k))
    return count


def logits_of(cuda, dtype, n=48, vocab=32003):
    g = torch.Generator(device="cpu").manual_seed(5)
    return (torch.randn(n, vocab, generator=g) * 2).to(cuda, dtype)


def entropy64(logits):
    logp = torch.log_softmax(logits.double(), -1)
    return -(logp.exp() * logp).sum(-1)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_verl_engine_entropy_runs_the_kernels_with_its_gradient(cuda, verl_entropy, launches, dtype):
    logits = logits_of(cuda, dtype)
    x = logits.clone().requires_grad_()
    entropy = verl_entropy.entropy_from_logits(x, chunk_size=2048)
    assert launches and entropy.dtype == torch.float32
    g = torch.linspace(-1, 1, len(entropy), device=cuda)
    (entropy * g).sum().backward()
    ref = logits.double().requires_grad_()
    ref_entropy = entropy64(ref)
    (ref_entropy * g.double()).sum().backward()
    torch.testing.assert_close(entropy.double(), ref_entropy.detach(), rtol=0, atol=1e-5)
    ulp = 2.0**-7 if dtype == torch.bfloat16 else 2.0**-20
    torch.testing.assert_close(x.grad.double(), ref.grad, rtol=0, atol=2 * ulp * ref.grad.abs().max().item())


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_openrlhf_detached_entropy_runs_the_kernels(cuda, launches, dtype):
    logits = logits_of(cuda, dtype).requires_grad_()
    entropy = detached_entropy(logits, chunk_rows=8)
    assert launches
    assert entropy.dtype == dtype and not entropy.requires_grad  # OpenRLHF's dtype, detached
    tol = 1e-5 if dtype == torch.float32 else 2.0**-8 * math.log(32003)  # returned in bf16: its rounding
    torch.testing.assert_close(entropy.double(), entropy64(logits.detach()), rtol=0, atol=tol)


def test_float64_logits_stay_on_the_exact_torch_path(cuda, launches):
    logits = logits_of(cuda, torch.float64)
    entropy = detached_entropy(logits)
    assert not launches  # float64: the torch path, exactly
    torch.testing.assert_close(entropy, entropy64(logits), rtol=0, atol=1e-12)
