"""Step-wide statistics in OpenRLHF 0.11.2 (``step_statistics="optimizer_step"``, the default).

OpenRLHF calls the policy loss one micro-batch at a time, so the loss alone sees one micro-batch of
one rank. ``ActorPPOTrainer`` holds more, and this module reads it there:

- ``ppo_train(kl_ctl)`` trains on this rank's whole replay buffer (the **training batch**), over
  ``--train.max_epochs`` epochs. Before its loop, the components whose state moves once per
  training batch (STARE's gate and controller by default) take their step from the whole buffer on
  every data-parallel rank ([`begin_training_batch`][rlstab.CompiledObjective.begin_training_batch]),
  from the old policy: the experiences' ``action_log_probs``, and, when such a component reads
  entropy, one no-grad forward of the actor over the buffer (OpenRLHF does not keep the old
  policy's entropy; the policy has not moved yet, so the forward gives it).
- ``iter_grad_accum_global_norm`` (rebound in ``ppo_actor``) cuts the epoch's micro-batches into
  **optimizer steps** of ``accumulated_gradient`` micro-batches and all-reduces their token and
  response counts. The rebound version hands each window to OpenRLHF's own function (so the
  normalisation stays OpenRLHF's) and, before the window's first micro-batch is trained, gathers
  the step's statistics over all the window's micro-batches on every data-parallel rank
  ([`gather`][rlstab.CompiledObjective.gather]): mask thresholds, kept counts, the
  optimizer-step hooks (BAPO's bounds). The current policy's log-probs and entropy come from one
  no-grad forward per micro-batch, called exactly as ``training_step`` calls the actor (the policy
  does not change within the step: DeepSpeed steps after the last micro-batch). On the training
  batch's first step the current policy is the old one, so when nothing reads entropy the old
  log-probs are used and no forward runs.
- ``training_step(experience, ...)`` is wrapped to hand the loss the statistics of the window that
  ``experience`` belongs to (matched by identity); the loss refuses a call without them.

Every rank thus trains with the same thresholds, the same STARE gate, W and M, and the same BAPO
bounds, whatever the micro-batch size and the number of ranks. What cannot be made exact is
refused when the trainer is built (``ActorPPOTrainer.__init__``): ``--train.dynamic_batch_enable``
(its loop decides optimizer steps per micro-batch from the replay buffer, outside the window
function); ``step_statistics="local"`` with a component whose state reads the whole optimizer
step or moves once per training batch (BAPO, STARE: [`step_parts`][rlstab.adapters.step_parts]);
and ``local`` with any other stateful component on more than one data-parallel rank (each rank
would move its own state).
"""

from __future__ import annotations

import functools
from contextvars import ContextVar
from dataclasses import dataclass, field

from rlstab.adapters.global_counts import counted
from rlstab.adapters.openrlhf.entropy import detached_compute_entropy
from rlstab.adapters.openrlhf.inputs import empty_batch, experience_batch, on_device
from rlstab.adapters.patching import patch_once
from rlstab.adapters.prepared_step import PreparedStep, preparing
from rlstab.adapters.step_parts import whole_step_problem
from rlstab.lazy import torch


@dataclass
class _TrainingBatch:
    """One ``ppo_train`` call: its trainer and loss, and the current optimizer-step window."""

    trainer: object
    loss: object
    steps_done: int = 0
    window: list = field(default_factory=list)  # the experiences of the current optimizer step
    stats: PreparedStep | None = None  # their statistics


_CURRENT: ContextVar[_TrainingBatch | None] = ContextVar("rlstab_openrlhf_training_batch", default=None)


def rlstab_loss(trainer):
    """The trainer's ``RlstabPolicyLoss``, or None when it trains with another loss."""
    from rlstab.adapters.openrlhf.loss import RlstabPolicyLoss

    loss = getattr(trainer, "actor_loss_fn", None)
    return loss if isinstance(loss, RlstabPolicyLoss) else None


# ---------------------------------------------------------------------- wrapping OpenRLHF


def install_step_scope(ppo_actor) -> None:
    """Wrap ``ActorPPOTrainer``'s ``__init__``, ``ppo_train`` and ``training_step``, and rebind
    ``ppo_actor.iter_grad_accum_global_norm``; idempotent."""
    trainer_class = ppo_actor.ActorPPOTrainer
    patch_once(trainer_class, "__init__", _attaching_the_loss, key=__name__)
    patch_once(trainer_class, "ppo_train", _with_batch_statistics, key=__name__)
    patch_once(trainer_class, "training_step", _with_step_statistics, key=__name__)
    patch_once(ppo_actor, "iter_grad_accum_global_norm", _gathering_each_window, key=__name__)


def _attaching_the_loss(init):
    @functools.wraps(init)
    def __init__(self, *args, **kwargs):
        init(self, *args, **kwargs)
        loss = rlstab_loss(self)
        if loss is not None:
            check_trainer(self, loss)
            from rlstab.adapters.openrlhf.checkpoint import attach

            attach(self, loss)

    return __init__


def _with_batch_statistics(ppo_train):
    @functools.wraps(ppo_train)
    def ppo_train_with_step_statistics(self, *args, **kwargs):
        loss = rlstab_loss(self)
        if loss is None or loss.step_statistics != "optimizer_step":
            return ppo_train(self, *args, **kwargs)
        begin_training_batch(self, loss)
        token = _CURRENT.set(_TrainingBatch(self, loss))
        try:
            return ppo_train(self, *args, **kwargs)
        finally:
            _CURRENT.reset(token)

    return ppo_train_with_step_statistics


def _with_step_statistics(training_step):
    @functools.wraps(training_step)
    def training_step_with_step_statistics(self, experience, *args, **kwargs):
        batch = _CURRENT.get()
        if batch is None or batch.trainer is not self:
            return training_step(self, experience, *args, **kwargs)
        stats = batch.stats if any(e is experience for e in batch.window) else None
        with preparing(stats):
            return training_step(self, experience, *args, **kwargs)

    return training_step_with_step_statistics


def _gathering_each_window(windows):
    @functools.wraps(windows)
    def iter_grad_accum_global_norm(data_iter, strategy, accumulated_gradient, mask_fn):
        batch = _CURRENT.get()
        if batch is None:
            yield from windows(data_iter, strategy, accumulated_gradient, mask_fn)
            return
        gas = max(int(accumulated_gradient), 1)
        window = []
        for item in data_iter:
            window.append(item)
            if len(window) == gas:
                yield from _step(batch, windows(window, strategy, accumulated_gradient, mask_fn))
                window = []
        if window:  # OpenRLHF's trailing partial step
            yield from _step(batch, windows(window, strategy, accumulated_gradient, mask_fn))

    return iter_grad_accum_global_norm


def _step(batch: _TrainingBatch, pairs):
    """One optimizer step's ``(experience, loss_batch_info)`` pairs, its statistics gathered before the first."""
    pairs = list(pairs)  # OpenRLHF's own normalisation of the window (its all-reduce of the counts)
    experiences = [experience for experience, _ in pairs]
    batch.stats = gather_step(batch.trainer, batch.loss, experiences, first=batch.steps_done == 0)
    batch.window = experiences
    batch.steps_done += 1
    yield from pairs


# ---------------------------------------------------------------------- checks


def dp_group(strategy):
    """OpenRLHF's data-parallel group (its ``_get_dp_group``: the device mesh's ``dp`` group, None = world)."""
    from openrlhf.utils.loss_utils import _get_dp_group

    return _get_dp_group(strategy)


def dp_size(strategy) -> int:
    dist = torch.distributed
    return dist.get_world_size(group=dp_group(strategy)) if dist.is_available() and dist.is_initialized() else 1


def check_trainer(trainer, loss) -> None:
    """Refuse, when the trainer is built, what the chosen mode cannot run exactly (one line each)."""
    args = trainer.args
    if loss.step_statistics == "optimizer_step" and getattr(args.train, "dynamic_batch_enable", False):
        raise ValueError(
            "rlstab: step_statistics='optimizer_step' does not support --train.dynamic_batch_enable (its micro-batch "
            "loop decides optimizer steps outside iter_grad_accum_global_norm); disable dynamic batching, or use "
            "--step-statistics local (statistics per micro-batch)"
        )
    if loss.step_statistics == "local":
        problem = whole_step_problem(
            loss.objective, "rlstab: step_statistics='local'", "--step-statistics optimizer_step (the default)",
            training_batch=True,
        )
        if problem:
            raise ValueError(problem)
    stateful = list(loss.compiled.state_dict())
    size = dp_size(trainer.strategy)
    if loss.step_statistics == "local" and stateful and size > 1:
        raise ValueError(
            f"rlstab: step_statistics='local' with {size} data-parallel ranks: {', '.join(stateful)} would move its "
            "state from each rank's own micro-batch, and the ranks' states would drift apart; use "
            "--step-statistics optimizer_step (the default)"
        )


# ---------------------------------------------------------------------- the statistics


def begin_training_batch(trainer, loss) -> None:
    """Advance the training-batch components from this rank's whole replay buffer, on every rank (collective)."""
    compiled = loss.compiled
    components = compiled.training_batch_components()
    if not components:
        return
    needs_entropy = bool(set(components) & set(compiled.readers("entropy")))
    buffer = trainer.replay_buffer
    items = list(buffer.items)
    size = max(int(trainer.micro_train_batch_size), 1)
    batches = []
    for start in range(0, len(items), size):
        experience = buffer.collate_fn(items[start : start + size])
        entropy = current_policy(trainer, experience)[1] if needs_entropy else None
        old = on_device(experience.action_log_probs)
        batches.append(experience_batch(loss, experience, old, entropy))
    if not batches:
        batches = [empty_batch()]
    compiled.begin_training_batch(batches, group=dp_group(trainer.strategy))


def gather_step(trainer, loss, experiences: list, first: bool) -> PreparedStep:
    """The optimizer step's statistics over its micro-batches on every data-parallel rank (collective).

    ``first``: the training batch's first optimizer step, where the current policy is the one that
    computed the experiences' ``action_log_probs`` (not under ``--train.async_enable``, where
    generation and training overlap).
    """
    compiled = loss.compiled
    needs_entropy = bool(compiled.readers("entropy"))
    reuse_old = first and not needs_entropy and not getattr(trainer.args.train, "async_enable", False)
    batches = []
    for experience in experiences:
        if reuse_old:
            logprobs, entropy = on_device(experience.action_log_probs), None
        else:
            logprobs, entropy = current_policy(trainer, experience)
        batches.append(experience_batch(loss, experience, logprobs, entropy))
    group = dp_group(trainer.strategy)
    return PreparedStep(compiled.gather(batches, group=group), counted(compiled, batches, group=group))


@torch.no_grad()
def current_policy(trainer, experience) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``[B, A]`` log-probs and (when the objective reads it) entropy under the current policy.

    The actor is called as ``training_step`` calls it (same arguments, same mode), under no_grad,
    with the entropy computed by [`detached_entropy`][rlstab.adapters.openrlhf.entropy.detached_entropy],
    so the values are those the micro-batch's own training forward produces.
    """
    compiled = trainer.actor_loss_fn.compiled
    needs_entropy = bool(compiled.readers("entropy"))
    sequences = on_device(experience.sequences)
    action_mask = on_device(experience.action_mask)
    mm_inputs = {}
    if getattr(experience, "mm_train_inputs", None) and getattr(trainer.actor, "is_vlm", False):
        from openrlhf.utils.vlm_utils import merge_mm_train_inputs

        mm_inputs = merge_mm_train_inputs(experience.mm_train_inputs, sequences.device)
    with detached_compute_entropy():
        log_probs, output = trainer.actor(
            sequences,
            action_mask,
            attention_mask=on_device(experience.attention_mask),
            return_output=True,
            ring_attn_group=trainer.strategy.ring_attn_group,
            packed_seq_lens=None,
            return_entropy=needs_entropy,
            **mm_inputs,
        )
    entropy = output.entropy[:, -action_mask.shape[1] :].detach() if needs_entropy else None
    return log_probs.detach(), entropy
