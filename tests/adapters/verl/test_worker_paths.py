"""What docs/adapters/verl.md says about veRL 0.9.1's worker paths and entry points, checked against veRL itself.

- Every trainer entry point builds its actor from ``verl.workers.engine_workers``; there is no legacy
  ``fsdp_workers`` / ``megatron_workers`` module to hook.
- The rlstab hooks sit on that worker: ``TrainingWorker.train_mini_batch`` and ``train_batch`` are wrapped
  once ``verl.workers.engine_workers`` is imported, and ``ppo_loss`` calls the registered loss.
- A path that calls the loss outside ``TrainingWorker.train_batch`` (veRL's Tinker-style
  ``TinkerTrainingWorker.forward_backward``) is refused when its loss is set (the worker's start-up),
  with the default ``step_statistics: optimizer_step``, in one line that names the setting to change;
  ``local`` runs it. A loss called outside ``train_batch`` by any other path stops at its first
  micro-batch with the same advice.
"""

import importlib.util
import inspect
from pathlib import Path

import pytest
import torch
import verl
from verl.trainer.ppo.core_algos import get_policy_loss_fn

import rlstab.adapters.verl  # noqa: F401 - installs the hooks (as `import verl` does through the plugin group)

from verl_batches import actor_config, random_verl_batch


@pytest.mark.parametrize("module", ["verl.workers.fsdp_workers", "verl.workers.megatron_workers"])
def test_verl_091_has_no_legacy_worker_modules(module):
    assert importlib.util.find_spec(module) is None


@pytest.mark.parametrize("module", ["trainer/main_ppo_v0.py", "trainer/ppo/v1/trainer_base.py"])
def test_both_trainers_build_their_actor_from_the_engine_workers(module):
    source = (Path(verl.__file__).parent / module).read_text()  # read, not imported: the V1 trainer needs TransferQueue
    assert "from verl.workers.engine_workers import ActorRolloutRefWorker" in source


def test_the_engine_workers_training_path_is_wrapped_and_the_tinker_path_is_not():
    from verl.workers import engine_workers
    from verl.workers.engine_workers_tinker import TinkerTrainingWorker

    assert engine_workers.TrainingWorker.train_batch.__rlstab_wrapped__
    assert engine_workers.TrainingWorker.train_mini_batch.__rlstab_wrapped__
    assert "self.actor.train_mini_batch" in inspect.getsource(engine_workers.ActorRolloutRefWorker.update_actor)
    # the Tinker worker's forward/backward calls the engine directly, not train_batch
    source = inspect.getsource(TinkerTrainingWorker.forward_backward)
    assert "forward_backward_batch(data, loss_function=self.loss_fn" in source and "train_batch(" not in source


def call_loss(step_statistics):
    x = random_verl_batch(0)
    config = actor_config("grpo", step_statistics=step_statistics)
    return get_policy_loss_fn("rlstab")(
        old_log_prob=x["old_log_prob"], log_prob=x["log_prob"].requires_grad_(), advantages=x["advantages"],
        response_mask=x["response_mask"], loss_agg_mode="token-mean", config=config,
    )


def test_a_loss_call_outside_train_batch_stops_at_its_first_micro_batch_naming_the_setting():
    with pytest.raises(RuntimeError, match=r"step_statistics = 'optimizer_step'.*set step_statistics=local"):
        call_loss("optimizer_step")
    loss, _ = call_loss("local")
    assert torch.isfinite(loss)


def test_the_tinker_worker_refuses_optimizer_step_statistics_when_its_loss_is_set():
    from functools import partial

    from verl.workers.engine_workers_tinker import TinkerTrainingWorker
    from verl.workers.utils.losses import ppo_loss

    from rlstab.adapters.verl.tinker import refusal

    loss_fn = partial(ppo_loss, config=actor_config("grpo", step_statistics="optimizer_step"))
    with pytest.raises(RuntimeError, match=r"Tinker-style worker.*set step_statistics=local"):
        TinkerTrainingWorker.set_loss_fn(object(), loss_fn)  # refused before veRL's own set_loss_fn runs
    assert refusal(partial(ppo_loss, config=actor_config("grpo", step_statistics="local"))) is None
    assert refusal(partial(ppo_loss, config=actor_config("grpo", step_statistics="data_parallel"))) is None
