"""One gloo rank of test_step_scope.py: several real veRL actor updates, recording rlstab's step statistics.

Each training batch goes as ``RayPPOTrainer`` sends it: the old-log-prob pass first (veRL's own
``infer_batch`` with ``calculate_entropy``, whose entropy the adapter keeps as
``rlstab_old_entropy``), then ``train_mini_batch``. The compiled objective's ``gather`` and
``begin_training_batch`` are wrapped on this rank's instance to record what they were given and
what they produced; the objective itself runs unchanged.
"""

from __future__ import annotations

import os
import sys

import torch

sys.path.insert(0, os.path.dirname(__file__))

import surprisal_controller  # noqa: E402
import training_worker_rank as base  # noqa: E402

TRAINING_BATCHES = 2


def run_rank(rank, world_size, model_path, overrides, keep_entropy) -> dict:
    """This rank's record (``rlstab.testing.spawned_ranks.run_ranks``)."""
    base.join_cpu_group(rank, world_size)
    surprisal_controller.register()  # a kind of the tests' own, for objectives that name it

    from verl.utils import tensordict_utils as tu
    from verl.workers.utils.padding import left_right_2_no_padding, no_padding_2_padding

    from rlstab.adapters.verl.step_scope import OLD_ENTROPY

    worker, arr, actor_config = base.rlstab_training_worker(model_path, overrides)
    compiled = actor_config.policy_loss.rlstab_compiled
    calls = _record(compiled)

    metrics = []
    for seed in range(TRAINING_BATCHES):
        batch = base.rollout_batch(model_path, seed=seed)[base.rank_rows(rank, world_size)]
        # RayPPOTrainer._compute_old_log_prob: the actor's own no-grad pass, with entropy
        probe = left_right_2_no_padding(batch.to_tensordict())
        tu.assign_non_tensor(probe, calculate_entropy=True, compute_loss=False)
        output = worker.infer_batch(probe)
        batch.batch["old_log_probs"] = no_padding_2_padding(tu.get(output, "log_probs"), probe).float()
        if keep_entropy:  # what the adapter's wrap of _compute_old_log_prob keeps for the actor
            batch.batch[OLD_ENTROPY] = no_padding_2_padding(tu.get(output, "entropy"), probe).float()
        out = worker.train_mini_batch(base.update_actor_input(batch, arr.actor))
        metrics.append({k: _plain(v) for k, v in tu.get(out, "metrics").items()})
    return {"calls": calls, "metrics": metrics}


def _record(compiled) -> list[dict]:
    """Wrap this instance's gather and begin_training_batch to record inputs, results and state."""
    calls = []

    def inputs(batches):
        fields = ("logprobs", "old_logprobs", "advantages", "response_mask", "entropy")
        return [{f: getattr(b, f).detach().clone() for f in fields if getattr(b, f) is not None} for b in batches]

    gather, begin = compiled.gather, compiled.begin_training_batch

    def recording_gather(batches, **kwargs):
        batches = list(batches)
        stats = gather(batches, **kwargs)
        calls.append({"call": "gather", "inputs": inputs(batches), "thresholds": stats.thresholds,
                      "hooks": stats.hooks, "counts": stats.counts, "state": compiled.state_dict(),
                      "update_state": kwargs.get("update_state", True), "part_of_step": kwargs.get("part_of_step", False)})
        return stats

    def recording_begin(batches, **kwargs):
        batches = list(batches)
        begin(batches, **kwargs)
        calls.append({"call": "begin_training_batch", "inputs": inputs(batches), "state": compiled.state_dict()})

    compiled.gather, compiled.begin_training_batch = recording_gather, recording_begin
    return calls


def _plain(value):
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, torch.Tensor):
        return value.tolist()
    try:
        return float(value)
    except (TypeError, ValueError):
        return value
