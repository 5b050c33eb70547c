"""Step-wide statistics in veRL (``step_statistics: optimizer_step``): computed before the micro-batch loop.

verl calls the policy loss one micro-batch at a time, so the loss alone can only gather statistics
over one micro-batch. The actor's ``TrainingWorker`` holds more:

- ``train_mini_batch(data)``: this rank's whole **training batch** (the rollout batch, before it is
  cut into mini-batches over ``ppo_epochs``). Here the components whose state moves once per
  training batch (STARE's gate and controller) take their step, from the old policy's values
  over the whole batch on every rank
  ([`begin_training_batch`][rlstab.CompiledObjective.begin_training_batch]), as the STARE
  authors' trainer does before its mini-batch loop.
- ``train_batch(mini_batch)``: one **optimizer step** on this rank. Here, before the first
  micro-batch's forward, the step's statistics are gathered over the whole mini-batch on every
  data-parallel rank ([`gather`][rlstab.CompiledObjective.gather]): mask thresholds, kept
  counts, advantage statistics, the optimizer-step hooks (BAPO's bounds). Every micro-batch's
  loss then uses them, so every rank trains with the same thresholds and the same state.

Where the values come from:

- log-probabilities: the step's current policy. On the training batch's first optimizer step
  that is the old policy, whose log-probs verl already has (``old_log_probs``, the actor's own
  recomputation), at no cost. On every later step the policy has moved: one no-grad forward of
  the mini-batch (verl's own ``infer_batch``, in eval mode as verl's old-log-prob pass).
- entropy (when a component reads it): the old policy's entropy is computed by verl's
  old-log-prob pass and then dropped by the trainer; the adapter keeps it in the batch as
  ``rlstab_old_entropy`` (wrapping ``RayPPOTrainer._compute_old_log_prob``), so the training
  batch's statistics and its first step cost nothing. Without it (a worker driven by another
  trainer) one no-grad forward of the training batch gives it. Later steps take it from their
  forward.

verl's own global counts (``batch_num_tokens``, ``global_batch_size``, ``dp_size``,
``loss_scale_factor``) stay the denominators (see [`counts`][rlstab.adapters.verl.counts]),
so the loss keeps verl's normalisation; the kept share comes from the whole step. The step's
statistics reach the loss through [`prepared_step`][rlstab.adapters.prepared_step.prepared_step].
"""

from __future__ import annotations

import functools
from contextvars import ContextVar
from dataclasses import dataclass
from typing import TYPE_CHECKING

from rlstab.adapters.global_counts import counted
from rlstab.adapters.patching import patch_once
from rlstab.adapters.prepared_step import PreparedStep, preparing
from rlstab.adapters.verl.config import CONFIG_PATH, RlstabPolicyLossConfig, worker_policy_loss
from rlstab.adapters.verl.inputs import field, token_batch_of
from rlstab.lazy import torch

if TYPE_CHECKING:
    from rlstab.compiled import CompiledObjective

OLD_ENTROPY = "rlstab_old_entropy"
"""The batch key under which the old policy's per-token entropy (verl's ``entropys``) is kept for the actor."""


@dataclass
class _TrainingBatch:
    """What the ``train_batch`` wrapper needs to know about the training batch it is part of."""

    steps_done: int = 0


_CURRENT_BATCH: ContextVar[_TrainingBatch | None] = ContextVar("rlstab_verl_training_batch", default=None)


def wrap_training_worker(training_worker_class: type) -> None:
    """Wrap ``train_mini_batch`` (training batch) and ``train_batch`` (optimizer step); idempotent."""
    patch_once(training_worker_class, "train_mini_batch", _with_batch_statistics, key=__name__)
    patch_once(training_worker_class, "train_batch", _with_step_statistics, key=__name__)


def _with_batch_statistics(train_mini_batch):
    @functools.wraps(train_mini_batch)  # keeps verl's dispatch registration (function attributes)
    def train_mini_batch_with_batch_statistics(self, data):
        policy_loss = worker_policy_loss(self)
        if policy_loss is None:
            return train_mini_batch(self, data)
        if policy_loss.step_statistics != "optimizer_step":
            refuse_drifting_state(policy_loss, self.engine.get_data_parallel_size())
            return train_mini_batch(self, data)
        begin_training_batch(self, policy_loss.rlstab_compiled, data)
        token = _CURRENT_BATCH.set(_TrainingBatch())
        try:
            return train_mini_batch(self, data)
        finally:
            _CURRENT_BATCH.reset(token)

    return train_mini_batch_with_batch_statistics


def _with_step_statistics(train_batch):
    @functools.wraps(train_batch)
    def train_batch_with_step_statistics(self, data):
        policy_loss = worker_policy_loss(self)
        if policy_loss is None or policy_loss.step_statistics != "optimizer_step":
            return train_batch(self, data)
        batch = _CURRENT_BATCH.get()
        step = gather_step(self, policy_loss.rlstab_compiled, data, first=batch is None or batch.steps_done == 0)
        try:
            with preparing(step):
                return train_batch(self, data)
        finally:
            if batch is not None:
                batch.steps_done += 1

    return train_batch_with_step_statistics


def refuse_drifting_state(policy_loss: RlstabPolicyLossConfig, dp_size: int) -> None:
    """``local`` statistics with several ranks and a stateful component: each rank would move its own state."""
    stateful = list(policy_loss.rlstab_compiled.state_dict())
    if policy_loss.step_statistics == "local" and dp_size > 1 and stateful:
        raise ValueError(
            f"{CONFIG_PATH}.step_statistics = 'local' with {dp_size} data-parallel ranks: {', '.join(stateful)} "
            "would move its state from each rank's own micro-batches, and the ranks' states would drift apart; "
            "use step_statistics=optimizer_step (the default)"
        )


def begin_training_batch(worker, compiled: CompiledObjective, data) -> None:
    """Advance the training-batch components from this rank's whole training batch, on every rank."""
    if not compiled.training_batch_components():
        return
    entropy = field(data, OLD_ENTROPY)
    if entropy is None and set(compiled.training_batch_components()) & set(compiled.readers("entropy")):
        _, entropy = current_policy(worker, data)  # the policy has not moved yet: the old policy's entropy
    group, distributed = _dp(worker)
    compiled.begin_training_batch([token_batch_of(data, data["old_log_probs"], entropy)], group=group, distributed=distributed)


def gather_step(worker, compiled: CompiledObjective, data, first: bool) -> PreparedStep:
    """The optimizer step's statistics over this mini-batch on every data-parallel rank (collective)."""
    entropy = field(data, OLD_ENTROPY)
    needs_entropy = bool(compiled.readers("entropy"))
    if first and (entropy is not None or not needs_entropy):
        logprobs = data["old_log_probs"]  # the policy has not moved since verl's old-log-prob pass
    else:
        logprobs, entropy = current_policy(worker, data)
    group, distributed = _dp(worker)
    batches = [token_batch_of(data, logprobs, entropy)]
    stats = compiled.gather(batches, group=group, distributed=distributed)
    return PreparedStep(stats, counted(compiled, batches, group=group, distributed=distributed))


@torch.no_grad()
def current_policy(worker, data) -> tuple[torch.Tensor, torch.Tensor]:
    """``[B, T]`` log-probs and entropy of the responses under the current policy: verl's own no-grad forward.

    verl's ``TrainingWorker.infer_batch`` (what its old-log-prob pass calls), on a shallow copy
    of the batch with ``calculate_entropy`` on and no loss; eval mode, as in that pass.
    """
    from verl.utils import tensordict_utils as tu
    from verl.workers.utils.padding import no_padding_2_padding

    probe = data.copy()
    tu.assign_non_tensor(probe, calculate_entropy=True, compute_loss=False, disable_auto_offload=True)
    output = worker.infer_batch(probe)
    worker.engine.module.train()  # verl's eval context leaves the module in eval mode
    logprobs = no_padding_2_padding(tu.get(output, "log_probs"), data).float()
    entropy = no_padding_2_padding(tu.get(output, "entropy"), data).float()
    return logprobs, entropy


def _dp(worker):
    engine = worker.engine
    distributed = torch.distributed.is_initialized() and engine.get_data_parallel_size() > 1
    return (engine.get_data_parallel_group() if distributed else None), distributed


def keep_old_entropy(ray_ppo_trainer_class: type) -> None:
    """Keep verl's old-policy entropy for the actor (``rlstab_old_entropy``), for rlstab's step-wide statistics.

    ``RayPPOTrainer._compute_old_log_prob`` computes ``entropys`` with the old log-probs (always:
    it logs ``actor/entropy``), and the trainer pops them before the actor update. With rlstab's
    loss in ``optimizer_step`` mode the same tensor is also stored under ``rlstab_old_entropy``,
    which the trainer leaves in the batch: the training batch's statistics and its first step
    then need no forward of their own. Idempotent.
    """
    patch_once(ray_ppo_trainer_class, "_compute_old_log_prob", _keeping_old_entropy, key=__name__)


def _keeping_old_entropy(original):
    @functools.wraps(original)
    def compute_old_log_prob_keeping_entropy(self, batch):
        old_log_prob, *rest = original(self, batch)
        policy_loss = self.config.actor_rollout_ref.actor.get("policy_loss", {}) or {}
        if (
            policy_loss.get("loss_mode") == "rlstab"
            and policy_loss.get("step_statistics", "optimizer_step") == "optimizer_step"
            and "entropys" in old_log_prob.batch.keys()
        ):
            old_log_prob.batch[OLD_ENTROPY] = old_log_prob.batch["entropys"]
        return (old_log_prob, *rest)

    return compute_old_log_prob_keeping_entropy
