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


# ---------------------------------------------------------------- approximate (histogram) mode


@pytest.mark.parametrize("interpolation", INTERPOLATIONS)
@pytest.mark.parametrize("dist", ["normal", "lognormal", "negative", "duplicates", "wide"])
def test_histogram_mode_within_documented_bound(dist, interpolation):
    g = torch.Generator().manual_seed(1)
    n = 50_000
    x = {
        "normal": torch.randn(n, generator=g),
        "lognormal": torch.exp(1.2 * torch.randn(n, generator=g) - 1.5),  # entropy-like
        "negative": -torch.rand(n, generator=g) * 7,
        "duplicates": torch.randint(0, 5, (n,), generator=g).float() * 0.3,
        "wide": torch.randn(n, generator=g) * 10.0 ** torch.randint(-20, 20, (n,), generator=g).float(),
    }[dist]
    ordered = x.double().sort().values
    population = Population([(x, torch.ones(n, dtype=torch.bool))])
    for q in (0.0, 1e-4, 0.2, 0.5, 0.8, 0.95, 1.0):
        approx = population.quantile(q, interpolation, mode="histogram").item()
        exact = population.quantile(q, interpolation).item()
        pos = q * (n - 1)
        neighbours = ordered[int(pos)], ordered[min(int(pos) + 1, n - 1)]
        # max(|x| / 128, 2**-133), x the order statistics used (2**-133: the subnormal bins around 0)
        bound = max(max(abs(v.item()) for v in neighbours) / 128, 2.0**-133)
        assert abs(approx - exact) <= bound, (q, approx, exact)


def test_histogram_mode_is_exact_for_sorted_populations():
    x = torch.randn(1000, generator=torch.Generator().manual_seed(2))
    assert quantile(x, 0.37, mode="histogram").item() == quantile(x, 0.37).item()


def test_histogram_mode_places_a_constant_population_within_its_bin(path):
    x = torch.full((5_000,), 2.5)
    approx = quantile(x, 0.5, mode="histogram").item()
    assert abs(approx - 2.5) <= 2.5 / 128 and (path == "radix" or approx == 2.5)


def test_unknown_mode_is_refused():
    x = torch.randn(10)
    with pytest.raises(ValueError, match="mode"):
        Population([(x, torch.ones(10, dtype=torch.bool))]).order_statistic(0, mode="approx")
