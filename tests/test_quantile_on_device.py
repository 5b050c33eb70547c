"""rlstab.quantile's device path (bins as device tensors, no host read but the size) against the host path.

On a GPU the selection keeps its bins on the device (``Population.ON_DEVICE``); on the CPU it reads
them. Both are exact selections, so they must give the same float32 bits, for every mode and
interpolation, on populations that take the sort and the radix branch; and the device path reads
the host once per population (its size), whatever the quantile.
"""

import pytest
import torch

from rlstab.quantile import INTERPOLATIONS, MODES, Population
from rlstab.testing.syncs import host_syncs


def chunks_of(dist: str, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    sizes = (5, 0, 3000, 410, 7001)
    draw = {
        "normal": lambda n: torch.randn(n, generator=g) * 3,
        "entropy-like": lambda n: torch.exp(1.2 * torch.randn(n, generator=g) - 1.5),
        "duplicates": lambda n: torch.randint(0, 5, (n,), generator=g).float() * 0.3,
        "signed zeros": lambda n: torch.where(torch.rand(n, generator=g) < 0.5, -0.0, 0.0),
        "wide": lambda n: torch.randn(n, generator=g) * 10.0 ** torch.randint(-20, 20, (n,), generator=g).float(),
    }[dist]
    return [(draw(n), torch.rand(n, generator=g) < 0.6) for n in sizes]


def results(chunks, on_device: bool, monkeypatch) -> list[torch.Tensor]:
    monkeypatch.setattr(Population, "ON_DEVICE", on_device)
    population = Population(chunks)
    out = []
    for mode in MODES:
        for interpolation in INTERPOLATIONS:
            for q in (0.0, 1e-4, 0.2, 0.5, 0.8, 0.999, 1.0):
                out.append(population.quantile(q, interpolation, mode))
    return out


@pytest.mark.parametrize("branch", ["sort", "radix"])
@pytest.mark.parametrize("dist", ["normal", "entropy-like", "duplicates", "signed zeros", "wide"])
def test_device_path_gives_the_host_paths_bits(dist, branch, monkeypatch):
    if branch == "radix":
        monkeypatch.setattr(Population, "SORT_LIMIT", 0)
    chunks = chunks_of(dist)
    host, device = results(chunks, False, monkeypatch), results(chunks, True, monkeypatch)
    for a, b in zip(host, device):
        assert a.dtype == b.dtype == torch.float32 and a.shape == b.shape == ()
        assert a.item() == b.item()
        if a.item() != 0 or branch == "radix":  # a sort may order -0.0 and 0.0 either way; the radix keys do not
            assert a.view(torch.int32).item() == b.view(torch.int32).item(), (a.item(), b.item())


@pytest.mark.parametrize("branch", ["sort", "radix"])
def test_device_path_reads_only_the_size(branch, monkeypatch):
    if branch == "radix":
        monkeypatch.setattr(Population, "SORT_LIMIT", 0)
    monkeypatch.setattr(Population, "ON_DEVICE", True)
    chunks = chunks_of("entropy-like")
    with host_syncs() as syncs:
        population = Population(chunks)
        for q in (0.2, 0.8):
            population.quantile(q, "linear", "exact")
        population.quantile(0.5, "linear", "histogram")
    assert len(syncs) == 1 and "_local_scalar_dense" in syncs[0], syncs


def test_host_path_reads_its_bins(monkeypatch):
    # The counter sees what the device path avoids: the radix selection's bins read as Python ints.
    monkeypatch.setattr(Population, "SORT_LIMIT", 0)
    monkeypatch.setattr(Population, "ON_DEVICE", False)
    with host_syncs() as syncs:
        Population(chunks_of("normal")).quantile(0.5, "linear", "exact")
    assert len(syncs) > 1


@pytest.mark.parametrize("mode", MODES)
def test_neighbours_in_two_high_bins(mode, monkeypatch):
    # linear interpolation takes two neighbouring order statistics in one pass: here 1.0 and 2.0, whose keys lie in
    # different high bins (and, at q = 0.25, two of the same bin), as the host path takes them one at a time.
    monkeypatch.setattr(Population, "SORT_LIMIT", 0)
    values = torch.cat([torch.full((5000,), 1.0), torch.full((5000,), 2.0), torch.linspace(3.0, 4.0, 3)])
    chunks = [(values, torch.ones_like(values, dtype=torch.bool))]
    for q in (0.25, 4999.5 / 10002, 0.9999):
        host, device = (results_at(chunks, on_device, q, mode, monkeypatch) for on_device in (False, True))
        assert host.view(torch.int32).item() == device.view(torch.int32).item(), (q, host.item(), device.item())
        if mode == "exact":
            assert device.item() == torch.quantile(values.double(), q).float().item()


def results_at(chunks, on_device: bool, q: float, mode: str, monkeypatch) -> torch.Tensor:
    monkeypatch.setattr(Population, "ON_DEVICE", on_device)
    return Population(chunks).quantile(q, "linear", mode)
