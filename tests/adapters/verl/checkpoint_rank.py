"""One gloo rank of test_checkpoint.py: a real veRL actor that trains, saves and loads checkpoints by a plan.

A module of its own so that ``torch.multiprocessing`` spawn can import it in a fresh process (see
``training_worker_rank``, whose CPU platform, tiny model, configs and batches this reuses). The plan is
a list of actions, run in order on every rank:

- ``("train", seed)``: one training batch as ``RayPPOTrainer`` runs it: the actor's old-log-prob pass
  (veRL's ``infer_batch``), then ``train_mini_batch``, on ``rollout_batch(model_path, seed)``;
- ``("save", folder)`` / ``("load", folder)``: ``TrainingWorker.save_checkpoint`` / ``load_checkpoint``,
  the calls ``ActorRolloutRefWorker`` makes for the actor; ``("load_fails", folder)`` expects the load
  to raise and records the exception;
- ``("snapshot", name)``: the full parameters and the objective's ``state_dict()`` under ``name``.

After every action the objective's state is recorded, with the messages the adapter's checkpoint
module logged during it.
"""

from __future__ import annotations

import logging
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(__file__))

import training_worker_rank as base  # noqa: E402


def give_the_cpu_device_an_rng() -> None:
    """``set_rng_state``/``get_rng_state`` on the test's CPU device module: torch's CPU generator.

    veRL's ``load_rng_state`` restores the accelerator's generator when the saved RNG states have
    an entry under ``get_device_name()``. With the ``cpu`` device that entry is torch's own CPU
    state (which it saves under ``"cpu"`` and restores first), so it passes it to
    ``get_torch_device().set_rng_state``, which ``training_worker_rank``'s device module lacks.
    """
    from verl.plugin.platform import get_platform

    device_module = get_platform().device_module
    device_module.get_rng_state, device_module.set_rng_state = torch.get_rng_state, torch.set_rng_state


class _Messages(logging.Handler):
    def __init__(self):
        super().__init__(logging.INFO)
        self.messages: list[tuple[str, str]] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append((record.levelname, record.getMessage()))


def run_rank(rank, world_size, model_path, overrides, plan) -> dict:
    """This rank's record (``rlstab.testing.spawned_ranks.run_ranks``)."""
    base.join_cpu_group(rank, world_size)
    give_the_cpu_device_an_rng()

    from verl.utils import tensordict_utils as tu
    from verl.workers.utils.padding import left_right_2_no_padding, no_padding_2_padding

    messages = _Messages()
    logger = logging.getLogger("rlstab.adapters.verl.checkpoint")
    logger.addHandler(messages)
    logger.setLevel(logging.INFO)

    worker, arr, actor_config = base.rlstab_training_worker(model_path, overrides)
    compiled = actor_config.policy_loss.rlstab_compiled
    params = dict(worker.engine.module.named_parameters())

    record = {"initial_state": compiled.state_dict(), "states": [], "snapshots": {}, "errors": {}, "metrics": []}
    for action, argument in plan:
        logged = len(messages.messages)
        if action == "train":
            batch = base.rollout_batch(model_path, seed=argument)[base.rank_rows(rank, world_size)]
            probe = left_right_2_no_padding(batch.to_tensordict())  # RayPPOTrainer._compute_old_log_prob
            tu.assign_non_tensor(probe, calculate_entropy=False, compute_loss=False)
            output = worker.infer_batch(probe)
            batch.batch["old_log_probs"] = no_padding_2_padding(tu.get(output, "log_probs"), probe).float()
            out = worker.train_mini_batch(base.update_actor_input(batch, arr.actor))
            metrics = tu.get(out, "metrics")
            record["metrics"].append({k: base._plain(v) for k, v in metrics.items() if k.startswith("actor/rlstab/")})
        elif action == "save":
            worker.save_checkpoint(argument, global_step=len(record["states"]))
        elif action == "load":
            worker.load_checkpoint(argument)
        elif action == "load_fails":
            try:
                worker.load_checkpoint(argument)
            except Exception as err:  # noqa: BLE001 - recorded for the test to judge
                record["errors"][argument] = (type(err).__name__, str(err))
            else:
                raise AssertionError(f"loading {argument} did not fail")
        elif action == "snapshot":
            record["snapshots"][argument] = {
                "params": {k: p.full_tensor().detach().clone() for k, p in params.items()},
                "state": compiled.state_dict(),
            }
        else:
            raise ValueError(f"unknown action {action!r}")
        record["states"].append((action, argument, compiled.state_dict(), messages.messages[logged:]))
    return record
