"""``RlstabGRPOTrainer``: TRL's ``GRPOTrainer`` with an rlstab objective as its loss.

Everything but the loss stays TRL's: generation (transformers or vLLM), rewards, advantages,
buffering of the generation batch, gradient accumulation, DDP/FSDP/DeepSpeed, logging. The loss
is ``GRPOTrainer._compute_loss(model, inputs)``, the method TRL's own GRPO variants override; a
callback cannot change it. This override keeps TRL's forward pass
(``_get_per_token_logps_and_entropies``, which always computes the per-token entropy) and
replaces what follows it: the TRL inputs become a [`TokenBatch`][rlstab.TokenBatch]
([`inputs`][rlstab.adapters.trl.inputs]), TRL's normalisers become the step's denominators
([`counts`][rlstab.adapters.trl.counts]; over a whole optimizer step with
[`step_scope`][rlstab.adapters.trl.step_scope]), the compiled objective computes the loss, and its
metrics go through TRL's logging ([`metrics`][rlstab.adapters.trl.metrics]). The objective's
state rides in TRL's checkpoints ([`checkpoint`][rlstab.adapters.trl.checkpoint]).
"""

from __future__ import annotations

from typing import Any, Literal

from trl import GRPOTrainer
from trl.models.utils import disable_gradient_checkpointing

from rlstab.adapters.trl.checkpoint import ComponentStateCheckpoints
from rlstab.adapters.trl.compat import check_version
from rlstab.adapters.trl.config import build_objective, check_accumulated_state, check_config
from rlstab.adapters.trl.counts import TrlScale, step_stats, trl_scale
from rlstab.adapters.trl.inputs import forward_kwargs, token_batch
from rlstab.adapters.trl.metrics import log_metrics
from rlstab.adapters.trl.step_scope import window_stats
from rlstab.compiled import CompiledObjective, StepStats
from rlstab.lazy import torch
from rlstab.objective import Objective
from rlstab.regularisers import EntropyBonus

StepStatistics = Literal["data_parallel", "optimizer_step"]


class RlstabGRPOTrainer(ComponentStateCheckpoints, GRPOTrainer):
    """A ``trl.GRPOTrainer`` whose policy loss is an rlstab objective.

    Args:
        objective: a preset name (``"stapo"``; ``rlstab presets`` lists them), the path of an
            objective YAML file, YAML text, a dict (``{"extends": "stapo", "surrogate": {"eps_high": 0.3}}``)
            or an [`Objective`][rlstab.Objective]. Loaded and checked against ``args`` before TRL
            loads anything (see [`check_config`][rlstab.adapters.trl.config.check_config]).
        step_statistics: where step-wide statistics come from.
            ``"data_parallel"`` (default): TRL's denominators, which are exact over the optimizer
            step, and mask thresholds (entropy quantiles) of each micro-batch gathered over the
            same micro-batch of every process, as TRL's ``top_entropy_quantile`` does (and as
            the veRL adapter's ``step_statistics=data_parallel``). Adaptive entropy's controller
            measures every micro-batch and moves once per optimizer step, as TRL's own; with
            ``gradient_accumulation_steps`` > 1, BAPO and STARE (whose step values read the whole
            step) are refused ([`step_parts`][rlstab.adapters.step_parts]).
            ``"optimizer_step"``: in addition, before the first micro-batch of each optimizer
            step, one no-grad forward pass over all the step's micro-batches (they are already
            generated and buffered) makes thresholds and kept-token counts exact over the whole
            step and every process. Costs that extra forward pass; needs
            ``steps_per_generation`` to be a multiple of ``gradient_accumulation_steps``.
        **kwargs: every ``GRPOTrainer`` argument (``model``, ``reward_funcs``, ``args``, ``train_dataset``, ...).

    Raises:
        rlstab.ConfigError: the objective does not load, or ``args`` asks TRL to add a term
            the objective would have to carry (the message says which field and what to set).
        ValueError: ``step_statistics`` cannot run the objective exactly with ``args`` (one line
            naming the setting to use).
    """

    def __init__(
        self,
        *args: Any,
        objective: Any = None,
        step_statistics: StepStatistics = "data_parallel",
        **kwargs: Any,
    ):
        check_version()
        if step_statistics not in ("data_parallel", "optimizer_step"):
            raise ValueError(
                f"RlstabGRPOTrainer(step_statistics={step_statistics!r}): must be 'data_parallel' or 'optimizer_step'"
            )
        loaded = build_objective(objective)
        config = kwargs.get("args", args[2] if len(args) > 2 else None)
        if config is not None:  # checked before TRL loads the model and the reference model
            check_config(loaded, config)
            _check_step_statistics(step_statistics, config, loaded)
        self.rlstab_objective: Objective = loaded
        """The validated objective."""
        self.rlstab_compiled: CompiledObjective = loaded.compile()
        """The compiled loss."""
        self.rlstab_step_statistics: StepStatistics = step_statistics
        self._rlstab_window: tuple[int, StepStats] | None = None
        self._rlstab_state_step: int | None = None
        super().__init__(*args, **kwargs)
        if config is None:  # TRL built its default GRPOConfig
            check_config(loaded, self.args)
            _check_step_statistics(step_statistics, self.args, loaded)

    # ------------------------------------------------------------------ the loss

    def _compute_loss(self, model, inputs):
        """One micro-batch's share of the step loss: TRL's forward, then the rlstab objective."""
        mode = "train" if self.model.training else "eval"
        per_token_logps, entropies, aux_loss = self._rlstab_forward(model, inputs, self.aux_loss_enabled)
        batch = self._rlstab_batch(inputs, per_token_logps, entropies)
        scale = self._rlstab_scale(inputs, batch, mode)
        if mode == "train" and self.rlstab_step_statistics == "optimizer_step":
            step = self._rlstab_window_stats(model, scale)
        else:
            step = step_stats(
                self.rlstab_compiled,
                batch,
                scale,
                update_state=self._rlstab_first_of_step(mode),
                part_of_step=mode == "train",
            )
        out = self.rlstab_compiled(batch, step=step)
        loss = out.loss
        if self.aux_loss_enabled:  # the MoE load-balancing loss, scaled for accumulation as TRL does
            loss = loss + self.router_aux_loss_coef * aux_loss / scale.accumulation
            self._metrics[mode]["aux_loss"].append(
                self.accelerator.gather_for_metrics(aux_loss).mean().item()
            )
        log_metrics(self, mode, out, batch, self.rlstab_objective)
        return loss

    def _rlstab_forward(self, model, inputs, aux: bool = False):
        """TRL's own forward: per-token log-probabilities and entropies of the completion tokens."""
        prompt_ids, completion_ids = inputs["prompt_ids"], inputs["completion_ids"]
        input_ids = torch.cat([prompt_ids, completion_ids], dim=1)
        attention_mask = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1)
        return self._get_per_token_logps_and_entropies(
            model,
            input_ids,
            attention_mask,
            completion_ids.size(1),
            compute_entropy=True,
            compute_aux_loss=aux,
            **forward_kwargs(inputs),
        )

    def _rlstab_batch(self, inputs, per_token_logps, entropies):
        compiled = self.rlstab_compiled
        return token_batch(
            inputs,
            per_token_logps,
            entropies,
            entropy_grad=any(isinstance(r, EntropyBonus) for r in self.rlstab_objective.regularisers),
            is_correction=bool(self.use_vllm and self.vllm_importance_sampling_correction),
            rollout=bool(compiled.readers("rollout_logprobs")),
            reference=bool(compiled.readers("ref_logprobs")),
        )

    def _rlstab_scale(self, inputs, batch, mode: str) -> TrlScale:
        if "num_items_in_batch" not in inputs:
            raise KeyError(
                "RlstabGRPOTrainer: the micro-batch has no 'num_items_in_batch' (TRL's count of loss tokens in the "
                "generation batch); a custom _generate_and_score_completions must keep it"
            )
        return trl_scale(
            num_items_in_batch=float(inputs["num_items_in_batch"]),
            micro_batch_size=batch.shape[0],
            padded_length=batch.shape[1],
            num_processes=self.accelerator.num_processes,
            accumulation_steps=self.current_gradient_accumulation_steps if mode == "train" else 1,
            steps_per_generation=self.args.steps_per_generation,
            max_completion_length=self.max_completion_length,
            training=mode == "train",
        )

    def _rlstab_first_of_step(self, mode: str) -> bool:
        """Whether this micro-batch starts an optimizer step (stateful components advance once per step, never in eval)."""
        if mode != "train":
            return False
        first = self._rlstab_state_step != self.state.global_step
        self._rlstab_state_step = self.state.global_step
        return first

    # ------------------------------------------------------------------ exact step statistics

    def _rlstab_window_stats(self, model, scale: TrlScale) -> StepStats:
        """The optimizer step's statistics, computed at its first micro-batch and reused until the optimizer steps.

        Keyed by ``state.global_step``, which TRL's loop increments after each optimizer step: a
        new key is a new step, also after an interrupted one or a resumed run.
        """
        step = self.state.global_step
        if self._rlstab_window is None or self._rlstab_window[0] != step:
            self._rlstab_window = (step, window_stats(self, model, scale))
        return self._rlstab_window[1]

    @torch.no_grad()
    def _rlstab_probe(self, model, inputs) -> Any:
        """A micro-batch's TokenBatch from a no-grad forward of the current policy."""
        with disable_gradient_checkpointing(self.model, self.args.gradient_checkpointing_kwargs):
            per_token_logps, entropies, _ = self._rlstab_forward(model, inputs)
        return self._rlstab_batch(inputs, per_token_logps, entropies)


def _check_step_statistics(step_statistics: str, args, objective: Objective) -> None:
    check_accumulated_state(objective, "RlstabGRPOTrainer", step_statistics, args.gradient_accumulation_steps)
    if (
        step_statistics == "optimizer_step"
        and args.steps_per_generation % args.gradient_accumulation_steps != 0
    ):
        raise ValueError(
            f"RlstabGRPOTrainer(step_statistics='optimizer_step'): GRPOConfig.steps_per_generation = "
            f"{args.steps_per_generation} is not a multiple of gradient_accumulation_steps = "
            f"{args.gradient_accumulation_steps}, so an optimizer step's micro-batches are not generated together; "
            "leave steps_per_generation unset (it defaults to gradient_accumulation_steps)"
        )


__all__ = ["RlstabGRPOTrainer"]
