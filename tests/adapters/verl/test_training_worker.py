"""A real veRL 0.9.1 actor update on CPU: ``TrainingWorker``, the fsdp2 engine and ``ppo_loss``.

The other adapter tests call ``ppo_loss`` with hand-made model outputs. Here veRL's whole actor
update path runs: Hydra composes veRL's ``ppo_trainer.yaml``, the actor's ``TrainingWorkerConfig`` is
built as ``ActorRolloutRefWorker.init_model`` builds it, the batch goes through
``RayPPOTrainer._update_actor``'s conversion, and ``TrainingWorker.train_mini_batch`` (what the Ray
``update_actor`` call ends in) trains a tiny Llama, sharded by FSDP2 over gloo ranks, with the loss
the engine computes from its own forward. Only Ray is left out: each rank is a spawned process that
builds its own worker.

veRL has no CPU platform; ``training_worker_rank`` registers one through veRL's platform and engine
registries. Its docstrings say what on veRL's CPU path needed help and why.
"""

from __future__ import annotations

import os
import sys

import pytest
import torch

from rlstab.testing.spawned_ranks import RankFailure, run_ranks

sys.path.insert(0, os.path.dirname(__file__))  # spawned ranks import the helper as a top-level module

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

# rlstab's step statistics (S2T's entropy quantile, the kept-token share) over the micro-batches of the
# same index on all ranks together, instead of per rank's micro-batch.
DATA_PARALLEL_STATISTICS = ["+actor_rollout_ref.actor.policy_loss.step_statistics=data_parallel"]
LOCAL_STATISTICS = ["+actor_rollout_ref.actor.policy_loss.step_statistics=local"]
# One rank's micro-batch = both ranks' micro-batches of the same index, for world size 2.
UNION_MICRO_BATCH = [f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={2 * worker_rank.MICRO_BATCH}"]
# fp32 compute instead of veRL's default bf16 autocast. Runs whose micro-batches differ in shape
# differ in bf16 rounding, and two Adam steps at lr 1e-2 grow that to ~1e-2 in the parameters; in
# fp32 it stays ~1e-5, far below what a different mask gives (~4e-2).
FP32 = [
    "+actor_rollout_ref.actor.fsdp_config.mixed_precision={param_dtype:fp32,reduce_dtype:fp32,buffer_dtype:fp32}"
]

RANK_TIMEOUT_S = 300  # per rank: the ranks of one call together get world_size times as long


def spawn_ranks(target, world_size: int, *args) -> list:
    """``target(rank, world_size, *args)`` on ``world_size`` spawned gloo ranks; each rank's result, by rank.

    ``rlstab.testing.spawned_ranks.run_ranks``: a rank's traceback fails the test at once (the other ranks
    may wait in a collective forever), and so do a rank's death and silence: ``pytest.fail`` with what
    ``RankFailure`` says, as the tests that expect a rank to be refused match.
    """
    try:
        return run_ranks(target, *args, world=world_size, timeout_s=RANK_TIMEOUT_S * world_size)
    except RankFailure as failure:
        pytest.fail(str(failure))


def run_update(world_size: int, model_path: str, overrides: list[str]) -> list[dict]:
    """One actor update on ``world_size`` spawned gloo ranks; each rank's result, by rank."""
    return spawn_ranks(worker_rank.run_rank, world_size, model_path, overrides)


@pytest.fixture(scope="module")
def update(tmp_path_factory):
    """``update(world_size, loss, extra overrides)``: the ranks' results of one actor update, run once per module."""
    model_path = str(tmp_path_factory.mktemp("tiny-llama"))
    worker_rank.save_tiny_llama(model_path)
    done = {}

    def get(world_size: int, loss: str, extra: list[str] = ()) -> list[dict]:
        key = (world_size, loss, tuple(extra))
        if key not in done:
            done[key] = run_update(world_size, model_path, LOSSES[loss] + list(extra))
        return done[key]

    return get


def check_update(result: dict, loss: str, entropy_function: str = "rlstab") -> None:
    """Every parameter moved; veRL's metrics are there, and rlstab's with the rlstab loss."""
    assert result["plugin_loaded_by_import_verl"], "rlstab's verl.plugins entry point: reinstall rlstab"
    unchanged = [k for k in result["before"] if torch.equal(result["before"][k], result["after"][k])]
    assert not unchanged, f"parameters not updated: {unchanged}"
    metrics = result["metrics"]
    steps = worker_rank.BATCH // worker_rank.MINI_BATCH
    for key in ("actor/pg_loss", "actor/pg_clipfrac", "actor/ppo_kl", "grad_norm", "loss"):
        assert key in metrics, f"{key} missing from {sorted(metrics)}"
        assert len(metrics[key]) == steps, (key, metrics[key])  # one value per optimizer step
    assert all(g > 0 for g in metrics["grad_norm"])
    # The old log-probs are the initial model's, from a plain padded transformers forward: the first
    # optimizer step starts at ratio 1 (up to bf16 autocast). That holds only if veRL's packed forward
    # (use_remove_padding, sdpa on CPU) keeps the sequences apart; letting them attend to each other
    # moves most tokens' log-probs out of the clip range.
    assert metrics["actor/pg_clipfrac"][0] == 0.0
    assert abs(metrics["actor/ppo_kl"][0]) < 0.02
    rlstab_keys = [k for k in metrics if k.startswith("actor/rlstab/")]
    # The engine's entropy function: rlstab's chunked one (set by set_loss_fn) only under rlstab's loss.
    rlstab_entropy = result["entropy_function"] == "rlstab.adapters.verl.entropy"
    assert rlstab_entropy == (loss == "rlstab" and entropy_function == "rlstab"), result["entropy_function"]
    if loss == "rlstab":
        # STAPO's S2T mask reads the entropy the engine computed (the loss raises without it), and with
        # the peaked tiny model it silences some positive-advantage, low-probability tokens.
        assert "actor/rlstab/mask/s2t/silenced" in metrics, sorted(metrics)
        assert sum(metrics["actor/rlstab/mask/s2t/silenced"]) > 0
    else:
        assert not rlstab_keys, rlstab_keys


@pytest.mark.parametrize("loss", ["vanilla", "rlstab"])
def test_single_rank_actor_update(update, loss):
    (result,) = update(1, loss)
    check_update(result, loss)


def max_difference(a: dict, b: dict) -> float:
    return max((a["after"][k] - b["after"][k]).abs().max().item() for k in a["after"])


def test_two_ranks_shard_the_model_and_match_one_rank(update):
    """FSDP2 over two gloo ranks with rlstab's STAPO: each rank holds part of the model, and the update
    equals one rank's.

    Both runs see the same global mini-batches and micro-batches (``worker_rank.rank_rows``); veRL
    all-reduces the token count that the loss divides by, and FSDP2 reduces the gradients. The step
    statistics are ``local``: each micro-batch its own, on two ranks as on one, with no forward of
    their own (the default, ``optimizer_step``, runs a no-grad forward whose bf16 rounding depends on
    the batch shape).
    """
    ranks = update(2, "rlstab", LOCAL_STATISTICS)
    (single,) = update(1, "rlstab", LOCAL_STATISTICS)
    total = sum(p.numel() for p in single["before"].values())
    assert sum(r["local_numel"] for r in ranks) == total
    assert all(0 < r["local_numel"] < total for r in ranks)
    for r in ranks:
        check_update(r, "rlstab")
        assert max_difference(r, single) == 0.0  # same micro-batches, same bf16 rounding


def test_two_ranks_data_parallel_statistics_match_one_rank_with_the_union_micro_batch(update):
    """``step_statistics=data_parallel``: the two ranks' micro-batches share S2T's entropy threshold and
    the kept share, so the update equals that of one rank whose micro-batch is both of them (in fp32)."""
    ranks = update(2, "rlstab", FP32 + DATA_PARALLEL_STATISTICS)
    (union,) = update(1, "rlstab", FP32 + UNION_MICRO_BATCH)
    (local,) = update(1, "rlstab", FP32 + LOCAL_STATISTICS)  # one rank, per-micro-batch statistics
    for r in ranks + [union, local]:
        check_update(r, "rlstab")
    for r in ranks:
        assert r["metrics"]["actor/rlstab/mask/s2t/entropy_threshold"] == pytest.approx(
            union["metrics"]["actor/rlstab/mask/s2t/entropy_threshold"], abs=1e-5
        )
        assert max_difference(r, union) < 1e-4
    # The scope of the statistics matters on this batch: per-micro-batch statistics move the parameters elsewhere.
    assert max_difference(local, union) > 1e-2


def test_rlstab_entropy_in_the_engine_changes_nothing_but_the_memory(update):
    """The engine's entropy from ``rlstab.stats`` (default) or from veRL's ``entropy_from_logits``
    (``entropy_function=verl``): the same S2T thresholds and silenced tokens, the same update (fp32)."""
    (ours,) = update(1, "rlstab", FP32)
    (verls,) = update(1, "rlstab", FP32 + ["+actor_rollout_ref.actor.policy_loss.entropy_function=verl"])
    check_update(ours, "rlstab")
    check_update(verls, "rlstab", entropy_function="verl")
    for key in ("actor/rlstab/mask/s2t/entropy_threshold", "actor/rlstab/mask/s2t/silenced"):
        assert ours["metrics"][key] == pytest.approx(verls["metrics"][key], abs=1e-5), key
    assert max_difference(ours, verls) < 1e-5
