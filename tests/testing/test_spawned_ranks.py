"""rlstab.testing.spawned_ranks: results by value, and a failing, dying or silent rank named."""

import pytest
import torch
from testing import spawned_rank_targets as targets

from rlstab.testing.spawned_ranks import RankFailure, free_port, run_ranks


def test_tensors_come_back_by_value_after_the_ranks_exited():
    # 100,000 floats: past the size the pipe holds, and kept in shared memory were they sent as tensors,
    # which would be gone when the parent unpickles them (after the ranks exited). The all-reduce over
    # ranks 0 and 1 gives 0 + 1 = 1 everywhere.
    results = run_ranks(targets.all_reduced_tensor, 100_000, world=2)
    assert [r["rank"] for r in results] == [0, 1]
    for r in results:
        assert torch.equal(r["values"], torch.ones(100_000))


def test_a_rank_that_raises_is_named_with_its_traceback():
    with pytest.raises(RankFailure, match=r"(?s)rank 1 of 2 raised:\n.*ValueError: rank one's own error") as err:
        run_ranks(targets.raises_on_rank_one, world=2)
    assert err.value.rank == 1


def test_a_rank_that_exits_without_a_result_is_named_with_its_exit_code():
    with pytest.raises(RankFailure, match=r"^rank 0 of 1 exited \(exit code 3\) without a result$"):
        run_ranks(targets.exits_without_a_result, world=1)


def test_a_silent_rank_is_named_when_time_is_up():
    with pytest.raises(RankFailure, match=r"^rank 0 of 1 gave no result in 0.5 s$"):
        run_ranks(targets.sleeps, world=1, timeout_s=0.5)


def test_the_free_port_can_be_bound():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", free_port()))
