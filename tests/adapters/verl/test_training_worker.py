"""A real veRL 0.9.1 actor update on CPU: ``TrainingWorker``, the fsdp2 engine and ``ppo_loss``.

The other adapter tests call ``ppo_loss`` with hand-made model outputs. Here the whole update path
of veRL's trainer runs: Hydra composes ``ppo_trainer.yaml``, the actor's ``TrainingWorkerConfig`` is
built as ``ActorRolloutRefWorker.init_model`` builds it, the batch goes through
``RayPPOTrainer._update_actor``'s conversion, and ``TrainingWorker.train_mini_batch`` (what the Ray
``update_actor`` call ends in) trains a tiny Llama sharded by FSDP2 over gloo ranks. Only the Ray
layer is left out: each rank is a spawned process that builds its own worker.

veRL has no CPU platform; ``training_worker_rank`` registers one through veRL's platform and engine
registries (see its docstrings for the one place veRL's own code path is worked around).
"""

from __future__ import annotations

import io
import os
import sys
import time

import pytest
import torch
import torch.multiprocessing as mp

sys.path.insert(0, os.path.dirname(__file__))  # spawned ranks import the helper by this path

import training_worker_rank as worker_rank  # noqa: E402

LOSSES = {
    "vanilla": ["actor_rollout_ref.actor.policy_loss.loss_mode=vanilla"],
    "rlstab": [
        "actor_rollout_ref.actor.policy_loss._target_=rlstab.adapters.verl.RlstabPolicyLossConfig",
        "actor_rollout_ref.actor.policy_loss.loss_mode=rlstab",
        "+actor_rollout_ref.actor.policy_loss.objective=stapo",
        "actor_rollout_ref.actor.calculate_entropy=true",
    ],
}

RANK_TIMEOUT_S = 240


@pytest.fixture(scope="module")
def model_path(tmp_path_factory) -> str:
    path = str(tmp_path_factory.mktemp("tiny-llama"))
    worker_rank.save_tiny_llama(path)
    return path


def run_update(world_size: int, model_path: str, loss: str) -> list[dict]:
    """One actor update on ``world_size`` spawned gloo ranks; each rank's result, by rank."""
    port = 20000 + (os.getpid() * 7 + world_size * 101 + len(loss)) % 20000
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [
        ctx.Process(target=worker_rank.run_rank, args=(r, world_size, port, model_path, LOSSES[loss], queue))
        for r in range(world_size)
    ]
    for p in procs:
        p.start()
    try:
        results = dict(queue.get(timeout=RANK_TIMEOUT_S) for _ in procs)
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
    for rank in range(world_size):
        if isinstance(results[rank], str):
            pytest.fail(f"rank {rank} failed:\n{results[rank]}")
    return [torch.load(io.BytesIO(results[r])) for r in range(world_size)]


def check_update(result: dict, loss: str) -> None:
    """Every parameter moved; veRL's metrics are there, and rlstab's for the rlstab loss."""
    unchanged = [k for k in result["before"] if torch.equal(result["before"][k], result["after"][k])]
    assert not unchanged, f"parameters not updated: {unchanged}"
    metrics = result["metrics"]
    for key in ("actor/pg_loss", "actor/pg_clipfrac", "actor/ppo_kl", "grad_norm", "loss"):
        assert key in metrics, f"{key} missing from {sorted(metrics)}"
        assert len(metrics[key]) == worker_rank.BATCH // worker_rank.MINI_BATCH  # one per optimizer step
    assert all(g > 0 for g in metrics["grad_norm"])
    # The old log-probs are the initial model's: the first optimizer step starts at ratio 1. This
    # holds only if veRL's packed forward (use_remove_padding, sdpa on CPU) keeps sequences apart.
    assert abs(metrics["actor/ppo_kl"][0]) < 5e-3
    rlstab_keys = [k for k in metrics if k.startswith("actor/rlstab/")]
    if loss == "rlstab":
        # STAPO's S2T mask reads the entropy, so the loss raises unless the engine's entropy reached it.
        assert "actor/rlstab/mask/s2t/silenced" in metrics, sorted(metrics)
    else:
        assert not rlstab_keys


@pytest.mark.parametrize("loss", ["vanilla", "rlstab"])
def test_single_rank_actor_update(model_path, loss):
    start = time.perf_counter()
    (result,) = run_update(1, model_path, loss)
    check_update(result, loss)
    print(f"1 rank, {loss}: {time.perf_counter() - start:.1f}s")


def test_two_ranks_shard_and_match_one_rank(model_path):
    """FSDP2 over two gloo ranks, rlstab's STAPO: each rank holds half the model and the update equals one rank's.

    Both runs see the same global mini-batches and micro-batches (``worker_rank.rank_rows``); veRL
    all-reduces the token count the loss divides by, and the gradients.
    """
    start = time.perf_counter()
    ranks = run_update(2, model_path, "rlstab")
    (single,) = run_update(1, model_path, "rlstab")
    total = sum(p.numel() for p in single["before"].values())
    assert sum(r["local_numel"] for r in ranks) == total
    assert all(r["local_numel"] < total for r in ranks)
    for r in ranks:
        check_update(r, "rlstab")
        for k in single["after"]:
            torch.testing.assert_close(r["after"][k], single["after"][k], rtol=1e-4, atol=1e-5, msg=k)
    print(f"2 ranks + 1 rank, rlstab: {time.perf_counter() - start:.1f}s")
