"""rlstab.testing.syncs.host_syncs: what it counts as a host synchronisation, and what it does not."""

import torch

from rlstab.testing.syncs import host_syncs


def kinds(fn) -> list[str]:
    with host_syncs() as syncs:
        fn()
    return [s.split(":", 1)[0] for s in syncs]


def test_host_reads_are_counted():
    x = torch.randn(5)
    assert kinds(lambda: x.sum().item()) == ["host read"]
    assert kinds(lambda: bool(x[0] > 0)) == ["host read"]
    assert kinds(lambda: float(x.max())) == ["host read"]
    assert kinds(lambda: x.tolist()) == ["host read"]  # bypasses the dispatcher on the CPU: patched
    assert kinds(lambda: x.numpy()) == ["host read"]


def test_data_dependent_sizes_are_counted():
    x = torch.randn(6)
    assert kinds(lambda: x[x > 0]) == ["data-dependent size"]
    assert kinds(lambda: torch.nonzero(x > 0)) == ["data-dependent size"]
    assert kinds(lambda: torch.unique(torch.tensor([1, 1, 2]))) == ["host-to-device copy", "data-dependent size"]
    assert kinds(lambda: torch.bincount(torch.tensor([0, 3]))) == ["host-to-device copy", "data-dependent size"]
    assert kinds(lambda: torch.repeat_interleave(torch.tensor([1, 2]))).count("data-dependent size") == 1


def test_tensors_from_host_data_are_counted_but_fills_and_scalars_are_not():
    x = torch.randn(4)
    assert kinds(lambda: torch.tensor(1.5)) == ["host-to-device copy"]
    assert kinds(lambda: torch.full((), 1.5)) == []
    assert kinds(lambda: torch.where(x > 0, x, 0.0) * 2.0 + 1) == []
    assert kinds(lambda: x.topk(2).values.sort()) == []


def test_the_caller_is_named_and_patches_are_undone():
    x = torch.randn(3)
    original = torch.Tensor.tolist
    with host_syncs() as syncs:
        x.tolist()
    assert torch.Tensor.tolist is original
    assert "test_syncs.py" in syncs[0] and "(<lambda>)" not in syncs[0]
