"""STARE: surprisal-guided token-level advantage reweighting, with its entropy gate and controller."""

from __future__ import annotations

import math
from typing import Any, ClassVar, Literal

from pydantic import Field, ValidationInfo, field_validator, model_validator

from rlstab.components import ComponentState, configured
from rlstab.lazy import torch
from rlstab.reweighters.base import Reweighter
from rlstab.tokens import Tokens

# The authors' k = int(P * n + 0.999999): a ceiling that forgives float noise (0.07 * 100 = 7.000000000000001 gives 7, not 8).
_CEIL_TOLERANCE = 0.999999


def top_count(n: int, p: float) -> int:
    """How many of ``n`` candidates STARE selects: ``min(n, max(1, ceil(p * n)))``, 0 when n = 0 or p = 0.

    The ceiling is the authors' ``int(p * n + 0.999999)``, so that float noise in ``p * n`` does
    not add a token (``0.07 * 100`` is ``7.000000000000001`` in floating point: 7, not 8).
    """
    if n == 0 or p <= 0.0:
        return 0
    return min(n, max(1, int(n * p + _CEIL_TOLERANCE)))


def _top_surprisal(surprisal: torch.Tensor, candidates: torch.Tensor, p: float) -> torch.Tensor:
    """Float 0/1 ``[B, T]``: the top-``p`` candidates by surprisal (ties broken by position, first wins)."""
    # A fresh row-major tensor (zeros_like would copy the strides of a strided input), so that
    # view(-1)[i] writes the i-th token in row-major order, the order of ``flat``.
    selected = torch.zeros(surprisal.shape, dtype=surprisal.dtype, device=surprisal.device)
    flat = candidates.reshape(-1).nonzero().squeeze(-1)
    k = top_count(flat.numel(), p)
    if k == 0:
        return selected
    order = torch.sort(surprisal.reshape(-1)[flat], descending=True, stable=True).indices[:k]
    selected.view(-1)[flat[order]] = 1.0
    return selected


class STAREState(ComponentState):
    """STARE's controller between steps, as ``state_dict()`` saves it.

    Only values the controller can reach are accepted: W within ``[1, w_max]`` and M within
    ``[m_min, 1]`` (the controller clips them there, and the configuration's own ``w``/``m`` lie
    inside), finite; ``H_bar`` a finite mean entropy, or None before the first step with valid tokens.
    """

    gate: bool
    """Whether the weights apply (the last step's mean entropy was below the target)."""
    W: float
    """The weight of the selected positive-advantage tokens."""
    M: float
    """The weight of the selected negative-advantage tokens (variant C2)."""
    H_bar: float | None
    """The last step's mean entropy over its valid tokens; None before the first."""

    @field_validator("W")
    @classmethod
    def _w_within_the_controller_bounds(cls, value: float, info: ValidationInfo) -> float:
        stare = configured(info)
        if stare is not None and not 1.0 <= value <= stare.w_max:
            raise ValueError(f"W must lie within [1, w_max = {stare.w_max!r}], where the controller keeps it")
        return value

    @field_validator("M")
    @classmethod
    def _m_within_the_controller_bounds(cls, value: float, info: ValidationInfo) -> float:
        stare = configured(info)
        if stare is not None and not stare.m_min <= value <= 1.0:
            raise ValueError(f"M must lie within [m_min = {stare.m_min!r}, 1], where the controller keeps it")
        return value


class STARE(Reweighter):
    r"""STARE: up-weight the most surprising tokens of positive-advantage responses while entropy is low.

    Surprisal-guided Token-level Advantage REweighting (the authors' code: github hp-luo/STARE, a
    veRL fork: ``compute_stare_token_weights`` and ``STAREController`` in
    ``verl/trainer/ppo/core_algos.py``; paper sections 4.1-4.4). With surprisal
    $s_{i,t} = -\log \pi_\theta(y_{i,t})$ (current policy, detached):

    1. **Partition** (4.1): $T^+$ = valid tokens with $A > 0$, $T^-$ = valid tokens with $A < 0$.
       $L^+$ = the top-$P$ tokens of $T^+$ by surprisal, $k = \max(1, \lceil P\,|T^+|\rceil)$
       (capped at $|T^+|$; the ceiling is the authors' ``int(P n + 0.999999)``); $L^-$ likewise in $T^-$.
    2. **Weights** (4.2): $\omega = W$ on $L^+$, 1 elsewhere (variant ``O1``); variant ``C2``
       also sets $\omega = M$ on $L^-$. $\omega$ multiplies the already-clipped token loss:
       $J = \frac{1}{N}\sum \omega_{i,t}\, J^{clip}_{i,t}$.
    3. **Gate** (4.3): once per step, $\bar H$ = the mean entropy of the step's valid tokens
       (``TokenBatch.entropy`` of the gathered batches: the old policy's on the first update, as the
       authors' trainer takes it from the old-log-prob pass). The weights apply iff
       $\bar H < H_{tgt}$; otherwise $\omega = 1$ (plain clipped loss).
    4. **Controller** (4.4, ``adaptive: true``): after computing the gate, each step
       $W \leftarrow \mathrm{clip}(W + \alpha\,\mathrm{sgn}(H_{tgt} - \bar H), [1, W_{max}])$,
       $M \leftarrow \mathrm{clip}(M - \alpha\,\mathrm{sgn}(H_{tgt} - \bar H), [M_{min}, 1])$,
       and this step already uses the updated values (the authors update, then train).

    Defaults are the paper's main configuration (``STAREConfig`` and the authors' script):
    ``P = 0.1``, ``W = 1.1``, ``M = 0.9`` (used by ``C2`` only), ``H_tgt = 0.3``, variant ``O1``,
    fixed weights (``adaptive: false``), ``alpha = 0.01``, ``W_max = 1.5``, ``M_min = 0.5``.

    The controller (gate, W, M, last $\bar H$) is state: it lives in the compiled objective's
    ``state_dict()`` and survives a checkpoint. Before the first step the gate is open (the
    authors' initial ``gate_on = True``); a step without valid tokens leaves the state unchanged
    (their controller skips a non-finite entropy).

    ``cadence`` (when steps 3 and 4 run): ``training_batch`` (default) once per training batch,
    from the mean entropy of the whole batch (every mini-batch, every rank), as the authors'
    trainer does (``STAREController.update`` once per training step, on the old-log-prob pass's
    entropy, before the mini-batch loop); every optimizer step of the batch uses the same gate,
    W and M. ``optimizer_step``: once per optimizer step, from that step's tokens. The two agree
    when a training batch is one optimizer step (``ppo_mini_batch_size`` = the batch, as in the
    authors' script). The veRL and OpenRLHF adapters mark training batches
    ([`begin_training_batch`][rlstab.CompiledObjective.begin_training_batch]); elsewhere (TRL,
    the embedded trainer, a bare ``gather``) each optimizer step is its own training batch.

    ``selection: micro_batch``: the top-P sets are chosen within each micro-batch, as the
    authors' loss does (it runs per veRL micro-batch), so they depend on the micro-batch size; the
    gate and controller are exact over the whole step (every micro-batch and rank). Candidates are
    the valid tokens: masks that silence tokens do not change the selection, rollout rejection
    that acts on validity does (as veRL's rejection edits the response mask the authors' loss reads).
    Ties at the k-th surprisal are broken by position (the first token wins); the authors'
    ``torch.topk`` leaves them unspecified.

    Metrics (``reweight/stare/...``): ``gate`` (1 open, 0 closed), ``H_bar``, ``W``, ``M``.
    """

    kind: Literal["stare"] = "stare"
    variant: Literal["O1", "C2"] = "O1"
    """``O1``: weight W on high-surprisal positive tokens only. ``C2``: also M on high-surprisal negative tokens."""
    top_p: float = Field(0.1, ge=0.0, le=1.0)
    """P: the fraction of each advantage sign's tokens selected by surprisal."""
    w: float = Field(1.1, ge=1.0)
    """W: the (initial) weight of the selected positive-advantage tokens."""
    m: float = Field(0.9, gt=0.0, le=1.0)
    """M: the (initial) weight of the selected negative-advantage tokens (variant C2)."""
    target_entropy: float = Field(0.3, gt=0.0)
    """H_tgt: the weights apply only while the step's mean token entropy is below it."""
    adaptive: bool = False
    """Move W and M by alpha each step toward more (entropy below target) or less reweighting."""
    alpha: float = Field(0.01, ge=0.0, le=1.0)
    """Step size of the adaptive controller."""
    w_max: float = Field(1.5, ge=1.0)
    """Upper bound of W under the adaptive controller."""
    m_min: float = Field(0.5, gt=0.0, le=1.0)
    """Lower bound of M under the adaptive controller."""
    selection: Literal["micro_batch"] = "micro_batch"
    """Where the top-P sets are chosen: within each micro-batch, as the authors' loss does."""
    cadence: Literal["training_batch", "optimizer_step"] = "training_batch"
    """When the gate and controller move: once per training batch, from its mean entropy (the authors'), or once per optimizer step."""

    reads: ClassVar[frozenset[str]] = frozenset({"entropy"})
    state_model: ClassVar[type[STAREState]] = STAREState

    @model_validator(mode="after")
    def _weights_inside_the_controller_bounds(self):
        if self.w > self.w_max:
            raise ValueError(f"w ({self.w}) must not exceed w_max ({self.w_max})")
        if self.m < self.m_min:
            raise ValueError(f"m ({self.m}) must not be below m_min ({self.m_min})")
        return self

    # ---------------------------------------------------------------- step

    def state_cadence(self) -> str:
        return self.cadence

    def step_sums(self, t: Tokens) -> torch.Tensor:
        """Entropy sum and count of the valid tokens (padding may hold anything, NaN included)."""
        entropy = torch.where(t.valid_bool, t.entropy, 0.0).to(torch.float64).sum()
        return torch.stack([entropy, t.valid.to(torch.float64).sum()])

    def initial_state(self) -> dict[str, Any]:
        return {"gate": True, "W": float(self.w), "M": float(self.m), "H_bar": None}

    def begin_step(self, sums, state):
        """Gate from this step's mean entropy, then (adaptive) the controller's move; returns (value, new state)."""
        state = dict(self.initial_state() if state is None else state)
        if sums is None:  # a step without micro-batches: as a step without valid tokens, nothing moves
            return dict(state), state
        entropy_sum, count = (float(x) for x in sums.tolist())  # host sync: the controller's state is host numbers
        if count > 0 and math.isfinite(entropy_sum):
            h_bar = entropy_sum / count
            state["H_bar"] = h_bar
            state["gate"] = h_bar < self.target_entropy
            if self.adaptive and self.alpha != 0.0:
                sign = (self.target_entropy > h_bar) - (self.target_entropy < h_bar)
                state["W"] = min(max(state["W"] + self.alpha * sign, 1.0), self.w_max)
                state["M"] = min(max(state["M"] - self.alpha * sign, self.m_min), 1.0)
        return dict(state), state

    def step_metrics(self, step) -> dict[str, float]:
        h_bar = step["H_bar"]
        return {
            "gate": float(step["gate"]),
            "H_bar": float("nan") if h_bar is None else h_bar,
            "W": step["W"],
            "M": step["M"],
        }

    # ---------------------------------------------------------------- tokens

    def weights(self, t: Tokens, step) -> torch.Tensor | None:
        if step is None:  # no step value: the gate is open with the configured weights
            step = self.initial_state()
        if not step["gate"]:
            return None  # every weight 1
        weights = torch.ones_like(t.logprobs)
        surprisal = t.logprobs.neg()
        valid = t.valid_bool
        plus = _top_surprisal(surprisal, valid & (t.advantages > 0), self.top_p)
        weights.add_(plus, alpha=step["W"] - 1.0)
        if self.variant == "C2":
            minus = _top_surprisal(surprisal, valid & (t.advantages < 0), self.top_p)
            weights.add_(minus, alpha=step["M"] - 1.0)
        return weights

    def describe(self) -> str:
        sides = f"W on the top {self.top_p:g} of A > 0 tokens by surprisal -log p"
        if self.variant == "C2":
            sides += f", M on the top {self.top_p:g} of A < 0 tokens"
        controller = (
            f"; adaptive: W += {self.alpha:g} sgn(H_tgt - H_bar) in [1, {self.w_max:g}], "
            f"M -= {self.alpha:g} sgn(H_tgt - H_bar) in [{self.m_min:g}, 1]"
            if self.adaptive else ""
        )
        return (
            f"stare ({self.variant}): w = {sides}, 1 elsewhere, per micro-batch; W = {self.w:g}, M = {self.m:g}; "
            f"only while the step's mean entropy H_bar < {self.target_entropy:g}{controller}"
        )
