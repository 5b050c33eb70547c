"""Adaptive entropy control (Skywork-OR1): an entropy bonus whose coefficient a controller moves each step."""

from __future__ import annotations

import math
from typing import Any, ClassVar, Literal

from pydantic import Field, ValidationInfo, field_validator, model_validator

from rlstab.components import ComponentState, configured
from rlstab.lazy import torch
from rlstab.regularisers.entropy_bonus import EntropyBonus
from rlstab.tokens import Tokens


class AdaptiveEntropyState(ComponentState):
    """The controller between steps, as ``state_dict()`` saves it."""

    coef: float
    """c_k: the coefficient the next step applies (if its gate is open)."""
    entropy: float | None
    """The last step's measured entropy (the next step's gate reads it); None before the first."""

    @field_validator("coef")
    @classmethod
    def _coef_within_bounds(cls, value: float, info: ValidationInfo) -> float:
        component = configured(info)
        if component is not None and not component.coef_min <= value <= component.coef_max:
            raise ValueError(
                f"coef must lie within [coef_min = {component.coef_min!r}, coef_max = {component.coef_max!r}], "
                "where the controller keeps it"
            )
        return value


class AdaptiveEntropy(EntropyBonus):
    r"""Entropy bonus $-\alpha_k\,\mathrm{Agg}(H)$ whose coefficient follows a target entropy (Skywork-OR1).

    Skywork Open Reasoner 1 (arXiv 2505.22312, "Adaptive Entropy Control" in its MAGIC loss; code
    github SkyworkAI/Skywork-OR1: ``EntController`` in ``verl/trainer/ppo/core_algos.py``, its
    ``update`` called in ``verl/trainer/ppo/ray_trainer.py`` after each training step, applied in
    ``verl/workers/actor/dp_actor.py`` ``update_policy``). With $e_k$ the entropy measured at step
    $k$ and $H^*$ the target:

    $$c_{k+1} = \mathrm{clip}\bigl(c_k + \Delta\,[e_k < H^*] - \Delta\,[e_k \ge H^*],\ c_{min},\ c_{max}\bigr),
      \qquad \alpha_{k+1} = c_{k+1}\,[e_k < H^*],$$

    and step $k+1$'s loss adds $-\alpha_{k+1}\,\mathrm{Agg}(H)$, the entropy (with its gradient)
    aggregated over every valid token like any regulariser. The controller raises the bonus while
    entropy sits below the target and lowers it otherwise; the gate switches the bonus off
    whenever entropy is above target, so it only ever pushes entropy *up* toward $H^*$.

    Both implementations apply, during step $k$, the coefficient and gate fixed by step $k-1$'s
    measurement (Skywork: the controller's dict is handed to the actor before its update and
    ``update`` runs after it; TRL 1.16: ``apply_coef`` from ``GRPOTrainer._last_world_entropy``, then the
    update at the optimizer-step boundary, ``trl/trainer/grpo_trainer.py`` ``GRPOTrainer._compute_loss``).
    rlstab does the same: at the start of step $k$ the step value is $(c_k, \text{gate}(e_{k-1}))$,
    and the state moves to $(c_{k+1}, e_k)$, with $e_k$ gathered over the step's micro-batches
    and ranks (``gather``), so it is exact at any micro-batch size and number of ranks. Where a
    trainer's adapter sees one micro-batch at a time (TRL's default ``data_parallel``; veRL and
    OpenRLHF add their own entropy bonus and refuse this one), every micro-batch applies
    $(c_k, \text{gate}(e_{k-1}))$, their sums add up to the step's, and the state moves once
    after the step (``gather(..., part_of_step=True)``), as TRL's own controller does.

    Where the two implementations differ, an option (default: the authors' code):

    - ``measure``: what $e_k$ is. ``surprisal`` (Skywork's ``get_entropy_metric``:
      ``entropy = -masked_mean(old_log_probs)``, a sampled estimate of the entropy from the
      old-policy pass over the training batch): $e_k = -\frac1N\sum \log\pi_{old}(y_t)$ over the
      step's valid tokens. ``entropy`` (TRL: the window-global token mean of its per-token
      entropies): $e_k = \frac1N\sum H_t$ from ``TokenBatch.entropy``.
    - ``boundary``: ``below`` (Skywork: ``current_ent < target_ent`` both for the gate and the
      increment); ``at_or_below`` (TRL: ``world_entropy <= entropy_target``).
    - ``first_step``: the gate before any measurement. ``on`` (Skywork: ``entropy_loss_enabled = 1``);
      ``off`` (TRL: ``GRPOTrainer._last_world_entropy = inf``, no bonus until the first measurement).
    - ``cadence``: ``optimizer_step`` (default; TRL: every optimizer step) or ``training_batch``
      (Skywork's trainer updates once per training batch; its scripts use one optimizer step per
      batch, ``ppo_mini_batch_size`` = ``train_batch_size``, where the two agree).

    Defaults from the authors' training scripts (``or1_scripts/train/7b_16k.sh`` and the other
    ``or1_scripts/train/*.sh``: ``ENTROPY_COEFF=0.0``, ``TGT_ENTROPY=0.2``, ``MAX_ENT_COEF=0.005``,
    ``MIN_ENT_COEF=0``, ``DELTA_ENT_COEF=0.0001``): ``coef = 0`` (the initial $c_0$),
    ``target_entropy = 0.2``, ``coef_max = 0.005``, ``coef_min = 0``, ``delta = 1e-4``. TRL's
    defaults differ: ``entropy_coef_delta = 0.005``, ``entropy_coef_max = 1.0``.

    Differences from the trainers that remain: the bonus is aggregated with the objective's
    aggregation over the step's valid tokens (TRL: each micro-batch's token mean divided by the
    accumulation steps; Skywork: each micro-batch's ``masked_mean``), the same number when a step
    is one micro-batch; TRL restricts bonus and measurement to the ``top_entropy_quantile`` tokens
    when that mask is on, rlstab's regularisers act on every valid token. A step without valid
    tokens leaves the controller unchanged (TRL would read an entropy of 0).

    The controller $(c_k, e_{k-1})$ is state: it lives in the compiled objective's
    ``state_dict()`` and survives a checkpoint. Metrics (``regulariser/adaptive_entropy/...``):
    ``coef`` ($c_k$), ``applied`` ($\alpha_k$), ``entropy`` (the measurement the gate read; absent before the first).
    """

    kind: Literal["adaptive_entropy"] = "adaptive_entropy"
    coef: float = Field(0.0, ge=0.0, le=1.0)
    """c_0: the initial coefficient (Skywork's scripts: 0)."""
    target_entropy: float = Field(0.2, gt=0.0)
    """H*: the bonus applies, and its coefficient grows, while the measured entropy is below it."""
    delta: float = Field(1e-4, ge=0.0, le=1.0)
    """Delta: how far the coefficient moves each step."""
    coef_min: float = Field(0.0, ge=0.0, le=1.0)
    """Lower bound of the coefficient."""
    coef_max: float = Field(0.005, ge=0.0, le=1.0)
    """Upper bound of the coefficient."""
    measure: Literal["surprisal", "entropy"] = "surprisal"
    """What the controller measures: -mean log pi_old of the sampled tokens (Skywork) or the mean entropy H (TRL)."""
    boundary: Literal["below", "at_or_below"] = "below"
    """When entropy counts as below target: strictly (Skywork) or also at the target (TRL)."""
    first_step: Literal["on", "off"] = "on"
    """The gate before the first measurement: open (Skywork) or closed (TRL)."""
    cadence: Literal["optimizer_step", "training_batch"] = "optimizer_step"
    """When the controller moves: every optimizer step (TRL), or once per training batch (Skywork's trainer)."""

    state_model: ClassVar[type[AdaptiveEntropyState]] = AdaptiveEntropyState

    @model_validator(mode="after")
    def _coef_within_bounds(self):
        if self.coef_min > self.coef_max:
            raise ValueError(f"coef_min ({self.coef_min}) must not exceed coef_max ({self.coef_max})")
        if not self.coef_min <= self.coef <= self.coef_max:
            raise ValueError(f"coef ({self.coef}) must lie within [coef_min, coef_max] = [{self.coef_min}, {self.coef_max}]")
        return self

    # ---------------------------------------------------------------- step

    def state_cadence(self) -> str:
        return self.cadence

    def value_from_state(self) -> bool:
        """True: the step's coefficient and gate come from the last measurement (TRL's "coefficient and gating
        from the end of the previous optimizer step"), so a trainer's micro-batches can add up the measure."""
        return True

    def step_sums(self, t: Tokens) -> torch.Tensor:
        """The measured quantity summed over the valid tokens, and their count (padding may hold anything)."""
        values = t.entropy if self.measure == "entropy" else t.old_logprobs.neg()
        total = torch.where(t.valid_bool, values, 0.0).to(torch.float64).sum()
        return torch.stack([total, t.valid.to(torch.float64).sum()])

    def initial_state(self) -> dict[str, Any]:
        return {"coef": float(self.coef), "entropy": None}

    def _below(self, entropy: float) -> bool:
        return entropy < self.target_entropy if self.boundary == "below" else entropy <= self.target_entropy

    def begin_step(self, sums, state):
        """This step's ``(coef, gate, entropy)`` from the state; then the controller's move from this step's measure."""
        state = dict(self.initial_state() if state is None else state)
        last = state["entropy"]
        gate = (self.first_step == "on") if last is None else self._below(last)
        value = {"coef": state["coef"], "gate": gate, "entropy": last}
        if sums is None:  # a step without micro-batches: nothing measured, nothing moves
            return value, state
        total, count = (float(x) for x in sums.tolist())  # host sync: the controller's state is host numbers
        if count > 0 and math.isfinite(total):
            entropy = total / count
            move = self.delta if self._below(entropy) else -self.delta
            state["coef"] = min(max(state["coef"] + move, self.coef_min), self.coef_max)
            state["entropy"] = entropy
        return value, state

    @property
    def coefficient_symbol(self) -> str:
        """How ``rlstab explain`` writes the coefficient: it changes every step."""
        return "alpha_k"

    def coefficient(self, step=None) -> float:
        if step is None:  # no step value: the initial coefficient, gated as before the first measurement
            return self.coef if self.first_step == "on" else 0.0
        return step["coef"] if step["gate"] else 0.0

    def step_metrics(self, step) -> dict[str, float]:
        metrics = {"coef": step["coef"], "applied": self.coefficient(step)}
        if step["entropy"] is not None:  # none before the first measurement
            metrics["entropy"] = step["entropy"]
        return metrics

    def term(self, batch, t):
        # contiguous: the regulariser's sum then runs in one order whatever the entropy's layout
        return super().term(batch, t).contiguous()

    def describe(self) -> str:
        measure = "mean H" if self.measure == "entropy" else "-mean log p_old"
        below = "<" if self.boundary == "below" else "<="
        return (
            f"adaptive_entropy: + alpha_k * Agg(-H), alpha_k = c_k if e_(k-1) {below} {self.target_entropy:g} else 0; "
            f"c_(k+1) = clip(c_k +/- {self.delta:g}, {self.coef_min:g}, {self.coef_max:g}) by e_k = {measure} over the "
            f"step's valid tokens; c_0 = {self.coef:g}, gate before the first step {self.first_step}, every {self.cadence}"
            f"{self._on_tokens()}"
        )
