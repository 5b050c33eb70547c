"""``RlstabAsyncGRPOTrainer``: TRL's ``AsyncGRPOTrainer`` with an rlstab objective as its loss.

``trl.experimental.async_grpo.AsyncGRPOTrainer`` does not subclass ``GRPOTrainer``: rollouts come
from a vLLM server through its rollout worker, micro-batches are packed into prefix trees, and
``compute_loss(model, inputs)`` forwards a packed row and computes a fixed PPO-clip loss.
Everything but that loss stays TRL's: the rollout worker, staleness filtering, batching and
packing, weight sync, gradient accumulation, FSDP, logging, checkpoints. This override keeps
TRL's fused forward and replaces what follows it: the packed row becomes a
[`TokenBatch`][rlstab.TokenBatch] ([`async_inputs`][rlstab.adapters.trl.async_inputs]), TRL's
normalisers the step's denominators ([`async_counts`][rlstab.adapters.trl.async_counts]; over a
whole optimizer step with [`async_step_scope`][rlstab.adapters.trl.async_step_scope]), the compiled
objective computes the loss, and its metrics go through TRL's logging
([`async_metrics`][rlstab.adapters.trl.async_metrics]). The objective's state rides in TRL's
checkpoints ([`checkpoint`][rlstab.adapters.trl.checkpoint], shared with ``RlstabGRPOTrainer``).
"""

from __future__ import annotations

import time
from typing import Any, Literal

from trl.experimental.async_grpo import AsyncGRPOTrainer

from rlstab.adapters.trl.async_config import LABEL, check_async_config
from rlstab.adapters.trl.async_counts import async_scale, step_stats
from rlstab.adapters.trl.async_inputs import forward, token_batch, unpack
from rlstab.adapters.trl.async_metrics import log_async_metrics
from rlstab.adapters.trl.async_step_scope import Window, window_stats
from rlstab.adapters.trl.checkpoint import ComponentStateCheckpoints
from rlstab.adapters.trl.compat import check_version
from rlstab.adapters.trl.config import build_objective, check_accumulated_state
from rlstab.adapters.trl.counts import TrlScale
from rlstab.compiled import CompiledObjective, StepStats
from rlstab.lazy import torch
from rlstab.objective import Objective
from rlstab.regularisers import EntropyBonus

StepStatistics = Literal["data_parallel", "optimizer_step"]
OldLogprobs = Literal["sampler", "proximal"]


class RlstabAsyncGRPOTrainer(ComponentStateCheckpoints, AsyncGRPOTrainer):
    """A ``trl.experimental.async_grpo.AsyncGRPOTrainer`` whose policy loss is an rlstab objective.

    Args:
        objective: a preset name, an objective YAML path or text, a dict or an
            [`Objective`][rlstab.Objective]; loaded and checked before TRL loads the model
            ([`check_async_config`][rlstab.adapters.trl.async_config.check_async_config]).
        step_statistics: ``"data_parallel"`` (default): TRL's denominators (each micro-batch's
            trained tokens over all ranks, times the accumulation steps: TRL's own async
            normalisation), mask thresholds gathered over the ranks' rows of each micro-batch.
            Adaptive entropy's controller measures every micro-batch and moves once per optimizer
            step; with ``gradient_accumulation_steps`` > 1, BAPO and STARE (whose step values read
            the whole step) are refused ([`step_parts`][rlstab.adapters.step_parts]).
            ``"optimizer_step"``: before the first micro-batch of each optimizer step, one no-grad
            forward over the step's micro-batches (transformers fetches them together) makes
            thresholds and token counts exact over the whole step and every rank.
        old_logprobs: ``"sampler"`` (default): the ratio's old policy is the sampler's
            log-probabilities, as in TRL's own loss; components that read ``rollout_logprobs``
            are refused. ``"proximal"``: the ratio is taken against the policy being trained and
            the sampler's log-probabilities are ``rollout_logprobs``, for TIS, IcePop and
            decoupled PPO (see [`async_inputs`][rlstab.adapters.trl.async_inputs]).
        **kwargs: every ``AsyncGRPOTrainer`` argument (``model``, ``reward_funcs``, ``args``, ``train_dataset``, ...).

    Raises:
        rlstab.ConfigError: the objective does not load, or reads what the async trainer cannot
            supply (the message says which component, which field and what to do).
    """

    def __init__(
        self,
        *args: Any,
        objective: Any = None,
        step_statistics: StepStatistics = "data_parallel",
        old_logprobs: OldLogprobs = "sampler",
        **kwargs: Any,
    ):
        check_version()
        if step_statistics not in ("data_parallel", "optimizer_step"):
            raise ValueError(
                f"{LABEL}(step_statistics={step_statistics!r}): must be 'data_parallel' or 'optimizer_step'"
            )
        loaded = build_objective(objective, LABEL)
        config = kwargs.get("args", args[2] if len(args) > 2 else None)
        check_async_config(loaded, config, old_logprobs)
        check_accumulated_state(loaded, LABEL, step_statistics, getattr(config, "gradient_accumulation_steps", 1))
        self.rlstab_objective: Objective = loaded
        self.rlstab_compiled: CompiledObjective = loaded.compile()
        """The compiled loss."""
        self.rlstab_step_statistics: StepStatistics = step_statistics
        self.rlstab_old_logprobs: OldLogprobs = old_logprobs
        self._rlstab_window: Window | None = None
        self._rlstab_window_step: tuple[int, StepStats] | None = None
        self._rlstab_state_step: int | None = None
        super().__init__(*args, **kwargs)

    # ------------------------------------------------------------------ the loss

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        """One micro-batch's share of the step loss: TRL's packed forward, then the rlstab objective."""
        packed = unpack(inputs)
        start = time.time()
        log_probs, entropy, aux_loss = forward(model, packed, self.aux_loss_enabled)
        self._last_forward_time_s = time.time() - start
        batch = self._rlstab_batch(packed, log_probs, entropy)
        scale = async_scale(
            inputs,
            num_processes=self.accelerator.num_processes,
            accumulation=self.current_gradient_accumulation_steps,
            max_completion_length=self.args.max_completion_length,
        )
        if self.rlstab_step_statistics == "optimizer_step":
            step = self._rlstab_window_stats(model, inputs, scale)
        else:
            step = step_stats(self.rlstab_compiled, batch, inputs, scale, update_state=self._rlstab_first_of_step())
        out = self.rlstab_compiled(batch, step=step)
        loss = out.loss
        if self.aux_loss_enabled:  # TRL's MoE load-balancing loss, scaled for accumulation as TRL does
            loss = loss + self.router_aux_loss_coef * aux_loss / scale.accumulation
            aux = self.accelerator.reduce(aux_loss.detach().to(torch.float32), reduction="sum")
            self._metrics["train"]["aux_loss"].append((aux / scale.world_size).item())
        log_async_metrics(self, out, batch, self.rlstab_objective)
        self._rlstab_account(inputs)
        return loss

    def _rlstab_batch(self, packed, log_probs, entropy):
        return token_batch(
            packed,
            log_probs,
            entropy,
            old_logprobs=self.rlstab_old_logprobs,
            entropy_grad=any(isinstance(r, EntropyBonus) for r in self.rlstab_objective.regularisers),
        )

    def _rlstab_account(self, inputs) -> None:
        """TRL's per-step accounting (``_log_step_metrics`` reads it), as its ``compute_loss`` keeps it."""
        n_forward_tokens = float(inputs["global_n_forward_tokens"][0])
        mean_seq_len = float(inputs["mean_seq_len"][0])
        self._step_forward_tokens += n_forward_tokens
        self._step_trained_tokens += float(inputs["global_n_tokens"][0])
        self._step_seq_len_weighted += mean_seq_len * n_forward_tokens
        self._step_samples += n_forward_tokens / mean_seq_len
        self._step_forward_s += self._last_forward_time_s

    def _rlstab_first_of_step(self) -> bool:
        """Whether this micro-batch starts an optimizer step (stateful components advance once per step)."""
        first = self._rlstab_state_step != self.state.global_step
        self._rlstab_state_step = self.state.global_step
        return first

    # ------------------------------------------------------------------ exact step statistics

    def get_batch_samples(self, epoch_iterator, num_batches, device):
        """transformers' fetch of one optimizer step's micro-batches, kept for the step scope."""
        batch_samples, num_items_in_batch = super().get_batch_samples(epoch_iterator, num_batches, device)
        self._rlstab_window = Window(step=self.state.global_step, inputs=list(batch_samples))
        return batch_samples, num_items_in_batch

    def _rlstab_window_stats(self, model, inputs, scale: TrlScale) -> StepStats:
        """The optimizer step's statistics, computed at its first micro-batch and reused until the optimizer steps."""
        step = self.state.global_step
        if self._rlstab_window_step is None or self._rlstab_window_step[0] != step:
            window = self._rlstab_window
            if window is None or window.step != step:
                raise RuntimeError(
                    f"{LABEL}(step_statistics='optimizer_step'): the loss of optimizer step {step} ran without that "
                    "step's micro-batches from Trainer.get_batch_samples (a custom training loop?); use "
                    "step_statistics='data_parallel'"
                )
            self._rlstab_window_step = (step, window_stats(self, model, window, scale))
        return self._rlstab_window_step[1]

    @torch.no_grad()
    def _rlstab_probe(self, model, inputs) -> Any:
        """A micro-batch's TokenBatch from a no-grad forward of the current policy."""
        packed = unpack(inputs)
        log_probs, entropy, _ = forward(model, packed)
        return self._rlstab_batch(packed, log_probs, entropy)


__all__ = ["RlstabAsyncGRPOTrainer"]
