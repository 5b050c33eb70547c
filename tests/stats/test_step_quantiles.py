"""Step quantiles and counts over two gloo ranks equal one process on the concatenated step.

tests/compiled/test_step.py checks thresholds and counts through the step API on two ranks, but with 384
tokens, so its quantiles take the gather-and-sort path. Here each rank holds uneven micro-batches
and an empty one, and the populations are large enough for the radix selection (the all-reduced
65,536-bin histograms) as well as small enough for the gathered sort, in both the exact and the
histogram mode; the step API is run on a ~10,000-token step.
"""

from pathlib import Path

import pytest
import torch

from rlstab.testing.spawned_ranks import run_ranks


@pytest.fixture(scope="module")
def two_ranks():
    """What each of two gloo ranks computed, and the module that computes it in one process."""
    with pytest.MonkeyPatch.context() as mp_patch:
        # The spawned ranks import quantile_rank from here (spawn passes sys.path on).
        mp_patch.syspath_prepend(str(Path(__file__).parent))
        import quantile_rank

        results = dict(enumerate(run_ranks(quantile_rank.run_rank, world=2)))
    return results, quantile_rank


@pytest.mark.parametrize("path", ["radix", "sorted"])
def test_population_quantiles_equal_one_process(two_ranks, path):
    results, quantile_rank = two_ranks
    size, expected = quantile_rank.local_results(None)[path]
    assert size > (8192 if path == "radix" else 0) and (path == "radix" or size <= 8192)
    for rank in (0, 1):
        got_size, got = results[rank][0][path]
        assert got_size == size
        assert got == expected  # exact float equality, every q, interpolation and mode


@pytest.mark.parametrize("path", ["radix", "sorted"])
def test_device_selection_over_ranks_equals_one_process(two_ranks, path):
    # The selection a GPU runs (Population.ON_DEVICE) gives, over two ranks, the one-process host values.
    results, quantile_rank = two_ranks
    size, expected = quantile_rank.local_results(None)[path]
    for rank in (0, 1):
        assert results[rank][0][f"{path} on device"] == (size, expected)


def test_exact_quantiles_match_torch(two_ranks):
    _, quantile_rank = two_ranks
    x, include = quantile_rank.values()
    _, got = quantile_rank.local_results(None)["radix"]
    members = x[include].double()
    for q in quantile_rank.QS:
        for interpolation in ("lower", "higher", "linear"):
            expected = torch.quantile(members, q, interpolation=interpolation).item()
            assert got[q, interpolation, "exact"] == pytest.approx(expected, rel=1e-6, abs=1e-7)


@pytest.mark.parametrize("preset", ["20-entropy", "stapo"])
def test_step_statistics_equal_one_process(two_ranks, preset):
    results, quantile_rank = two_ranks
    expected = quantile_rank.step_results(None)[preset]
    assert expected["counts"][0] > 8192  # the entropy quantile takes the radix path
    assert any(t is not None for t in expected["thresholds"])
    for rank in (0, 1):
        got = results[rank][1][preset]
        assert got["thresholds"] == expected["thresholds"]
        assert got["counts"] == expected["counts"]
        assert got["loss"] == pytest.approx(expected["loss"], abs=1e-6)
        assert torch.allclose(torch.tensor(got["grad"]), torch.tensor(expected["grad"]), atol=1e-6, rtol=0)
