import pytest
import torch

from rlstab.quantile import INTERPOLATIONS, Population, quantile


def test_hand_computed_linear():
    # sorted 1..5, q = 0.8: position 0.8 * 4 = 3.2 -> 4 + 0.2 * (5 - 4) = 4.2
    assert quantile(torch.tensor([5.0, 1.0, 4.0, 2.0, 3.0]), 0.8).item() == pytest.approx(4.2)


@pytest.mark.parametrize("interpolation", INTERPOLATIONS)
@pytest.mark.parametrize("n", [1, 2, 7, 1000, 70_001])
def test_equals_torch_quantile(n, interpolation):
    g = torch.Generator().manual_seed(n)
    x = torch.randn(n, generator=g) * 3
    x[: n // 4] = x[n // 2 : n // 2 + n // 4]  # duplicates
    for q in (0.0, 0.2, 0.5, 0.8, 0.999, 1.0):
        # float64 reference: torch.quantile computes the rank position in the input dtype.
        expected = torch.quantile(x.double(), q, interpolation=interpolation)
        assert quantile(x, q, interpolation=interpolation).item() == pytest.approx(expected.item(), rel=1e-6, abs=1e-7)


@pytest.fixture(params=["sort", "radix"])
def path(request, monkeypatch):
    """Run a test through both selection paths (the radix one is normally for > 65,536 values)."""
    if request.param == "radix":
        monkeypatch.setattr(Population, "SORT_LIMIT", 0)
    return request.param


def test_include_selects_members_and_chunks_add_up(path):
    g = torch.Generator().manual_seed(0)
    chunks = [(torch.randn(n, generator=g).abs(), torch.rand(n, generator=g) < 0.7) for n in (5, 0, 300, 41)]
    members = torch.cat([v[inc] for v, inc in chunks])
    pop = Population(chunks)
    assert pop.size == members.numel()
    for k in (0, 17, members.numel() - 1):
        assert pop.order_statistic(k).item() == members.sort().values[k].item()


def test_negative_values_and_signed_zero(path):
    x = torch.tensor([-0.0, 0.0, -3.5, 2.0, -1e-30, 1e30])
    population = Population([(x, torch.ones(6, dtype=torch.bool))])
    got = torch.stack([population.order_statistic(k) for k in range(6)])
    assert torch.equal(got, x.sort().values)


def test_empty_population_has_no_quantile(path):
    assert quantile(torch.ones(3), 0.5, include=torch.zeros(3, dtype=torch.bool)) is None


def test_beyond_torch_quantile_limit():
    # torch.quantile refuses more than 16M elements; the radix selection does not.
    n = (1 << 24) + 3
    x = torch.arange(n, dtype=torch.float32)
    x = x[torch.randperm(n, generator=torch.Generator().manual_seed(0))]
    # position 0.5 * (n - 1) = 8388609.0 exactly; values are their own ranks
    assert quantile(x, 0.5).item() == 8388609.0
