"""The optimal token baseline (OTB): a group baseline per token, weighted by each response's accumulated score norm.

Two kinds, as veRL 0.9.1 ships them (``verl/trainer/ppo/core_algos.py``):

- ``optimal_token_baseline`` (``compute_optimal_token_baseline_advantage``, lines 871-987): the
  responses of a group are compared column by column of the padded response;
- ``tir_optimal_token_baseline`` (``compute_multi_turn_optimal_token_baseline_advantage``, lines
  990-1121), for tool-integrated reasoning, whose response masks have holes (the tool's output
  between two turns): the responses are compared response token by response token, each row's
  valid tokens first moved to the left.

Both are token-level: fitted on the whole step like every estimator, they return ``[B, T]``
advantages (``AdvantageEstimator.micro_batch_advantages``).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import ClassVar, Literal

from pydantic import Field

from rlstab.advantages.base import AdvantageEstimator, GroupTable
from rlstab.batch import BatchError
from rlstab.deferred import require
from rlstab.lazy import torch


def score_norm_proxy(old_logprobs: torch.Tensor, sum_pi_squared: torch.Tensor) -> torch.Tensor:
    r"""``w_t = 1 - 2 pi(y_t) + sum_v pi(v)^2`` (float32): the squared norm of the score's gradient in the logits.

    $\nabla_z \log\mathrm{softmax}(z)_y = e_y - \pi$, so $\lVert e_y - \pi\rVert^2 = (1 - \pi_y)^2 +
    \sum_{v \ne y}\pi_v^2 = 1 - 2\pi_y + \sum_v \pi_v^2$: the paper's Logit-Gradient Proxy, from the
    forward pass alone, with $\pi_y = \exp$ of the old log-probability (veRL:
    ``1 - 2 * exp(old_log_probs) + sum_pi_squared``). In float32 and in veRL's order of operations, so that
    the cancellation in ``1 - 2 pi`` near ``pi = 1`` rounds as veRL's does.
    """
    return 1.0 - 2.0 * torch.exp(old_logprobs.to(torch.float32)) + sum_pi_squared.to(torch.float32)


def response_positions(valid: torch.Tensor) -> torch.Tensor:
    """``[B, T]`` long: the index of each valid token among its row's valid tokens (0, 1, ...; -1 on padding)."""
    return torch.where(valid, valid.to(torch.int64).cumsum(-1) - 1, -1)


@dataclass(frozen=True)
class TokenBaselineState:
    """The step's baselines: one per group (``table`` keys) and position.

    ``baseline`` is ``[G, P]`` float64 (``P`` the step's widest response); ``longest`` each group's
    longest response length; ``tail_from`` the position from which that response's baseline is 0
    (the second-longest length) when ``zero_tail`` applies to the group (its longest response is
    unique), else ``+inf``.
    """

    table: GroupTable
    baseline: torch.Tensor
    longest: torch.Tensor
    tail_from: torch.Tensor
    metrics: dict[str, float] = field(default_factory=dict)
    """``step_metrics``, computed once when the step is fitted."""


class _TokenBaseline(AdvantageEstimator):
    r"""What both kinds share: the fit over the step and the advantage of each token."""

    reads: ClassVar[frozenset[str]] = frozenset({"rewards", "group_ids", "sum_pi_squared"})
    aligned: ClassVar[str] = "column"
    """``column``: position = column of the padded response; ``response_token``: index among the row's valid tokens."""

    importance_weights: bool = True
    """Multiply each ``w_t`` by the square of the trainer's rollout importance weight (``TokenBatch.is_weights``,
    veRL's ``rollout_is_weights``) when the batch carries one; false: ignore it."""
    zero_tail: bool = True
    """Zero the baseline of a group's unique longest response past the second-longest length (``handle_zero_tail``)."""
    eps: float = Field(1e-8, ge=0.0, le=1.0)
    """Added to the sum of weights in the baseline's denominator (veRL's ``epsilon``)."""

    def positions(self, valid: torch.Tensor) -> torch.Tensor:
        """``[B, T]`` long: each token's position in the group comparison (-1 or anything on padding)."""
        if self.aligned == "column":
            return torch.arange(valid.shape[-1], device=valid.device).expand(valid.shape)
        return response_positions(valid)

    def sequence_inputs(self, t) -> dict[str, torch.Tensor]:
        """``path_weight``: ``[B, T]`` float64 ``W_t = sum_{j <= t} w_j`` over each row's valid tokens, at each
        valid token's position (0 elsewhere); summed in float32, as veRL does."""
        w = score_norm_proxy(t.old_logprobs, t.batch.sum_pi_squared.detach())
        weights = t.batch.is_weights
        if self.importance_weights and weights is not None:
            weights = weights.detach().to(torch.float32)
            w = w * (weights if weights.dim() == 2 else weights[:, None]) ** 2
        valid = t.valid_bool
        cumulative = torch.where(valid, w, 0.0).cumsum(-1)  # a where, not a product: padding may hold inf
        path = torch.where(valid, cumulative, 0.0).to(torch.float64)
        if self.aligned == "response_token":
            B, T = valid.shape
            index = torch.where(valid, response_positions(valid), T)  # padding goes to a column dropped below
            path = path.new_zeros(B, T + 1).scatter_(1, index, path)[:, :T]
        return {"path_weight": path}

    def _responses(self, responses: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """The rows that take part in the groups (the multi-turn kind also leaves out responses left without tokens)."""
        return responses if self.aligned == "column" else responses & (lengths > 0)

    def fit(self, rewards, group_ids, lengths, responses=None, *, path_weight=None):
        responses = torch.ones_like(rewards, dtype=torch.bool) if responses is None else responses
        responses = self._responses(responses, lengths)
        table = GroupTable.fit(rewards, group_ids, responses)
        G, P = table.keys.numel(), path_weight.shape[-1]
        group = torch.searchsorted(table.keys, group_ids)
        weight = torch.where(responses[:, None], path_weight.to(torch.float64), 0.0)
        reward = torch.where(responses, rewards.to(torch.float64), 0.0)
        numerator = weight.new_zeros(G, P).index_add_(0, group, reward[:, None] * weight)
        denominator = weight.new_zeros(G, P).index_add_(0, group, weight)
        baseline = torch.where(denominator > 0, numerator / (denominator + self.eps), 0.0)  # 0 / 0 with eps 0
        baseline = torch.where(table.count[:, None] > 1, baseline, 0.0)  # a group of one: no baseline, A = R
        length = torch.where(responses, lengths.to(torch.float64), -1.0)
        longest = length.new_full((G,), -1.0).scatter_reduce_(0, group, length, "amax")
        at_longest = responses & (length == longest[group])
        ties = length.new_zeros(G).index_add_(0, group, at_longest.to(torch.float64))
        second = length.new_full((G,), -1.0).scatter_reduce_(0, group, torch.where(at_longest, -1.0, length), "amax")
        unique = (ties == 1) & (table.count > 1)
        tail_from = torch.where(unique, second, torch.inf) if self.zero_tail else torch.full_like(second, torch.inf)
        state = TokenBaselineState(table, baseline, longest, tail_from)
        return replace(state, metrics=self._metrics(state, denominator))

    def apply(self, stats, rewards, group_ids, responses=None):
        raise TypeError(
            f"advantage ({self.kind}) gives one advantage per token: call micro_batch_advantages(stats, tokens, ...)"
        )

    def micro_batch_advantages(self, stats: TokenBaselineState, t, rewards, group_ids, responses=None):
        """``[B, T]``: ``R_i - B_g(position)`` on valid tokens, 0 on padding tokens and padding rows."""
        valid = t.valid_bool
        B, T = valid.shape
        responses = valid.any(-1) if responses is None else responses
        P = stats.baseline.shape[-1]
        if stats.table.keys.numel() == 0 or P == 0:  # a step without response tokens
            return torch.zeros(B, T, device=valid.device)
        rows = self._responses(responses, t.valid.sum(-1))
        index = stats.table.lookup(group_ids, rows).clamp(min=0)
        position = self.positions(valid)
        require(((position < P) | ~valid).all(), lambda: BatchError(
            f"advantage ({self.kind}): this micro-batch has response tokens past position {P - 1}, the last of the "
            "step the advantages were fitted on (gather the step from the same batches)"
        ))
        baseline = stats.baseline[index].gather(1, position.clamp(0, P - 1))
        length = t.valid.sum(-1).to(torch.float64)
        tail = rows & (length == stats.longest[index])
        baseline = torch.where(tail[:, None] & (position >= stats.tail_from[index][:, None]), 0.0, baseline)
        advantages = rewards.to(torch.float64)[:, None] - baseline
        return torch.where(valid & responses[:, None], advantages, 0.0).to(torch.float32)

    def step_metrics(self, stats: TokenBaselineState) -> dict[str, float]:
        """``baseline_minus_mean``: the W-weighted mean over the step's groups of two or more responses and their
        positions of ``B_g(t) - mean_g R``, how far the token baseline moves from the group mean;
        ``zeroed_tail_fraction``: the fraction of those groups whose longest response is unique, and has its
        tail baseline zeroed (``zero_tail``).
        Computed when the step is fitted: each micro-batch's loss reports them without reading the device."""
        return stats.metrics

    def _metrics(self, stats: TokenBaselineState, denominator: torch.Tensor) -> dict[str, float]:
        sized = stats.table.count > 1
        weight = torch.where(sized[:, None], denominator, 0.0)
        total = float(weight.sum())
        if total <= 0:
            return {}
        gap = stats.baseline - stats.table.mean.to(torch.float64)[:, None]
        return {
            "baseline_minus_mean": float((weight * gap).sum()) / total,
            "zeroed_tail_fraction": float(torch.isfinite(stats.tail_from).sum()) / float(sized.sum()),
        }

    def _describe(self, where: str) -> str:
        w = "(1 - 2 pi_old(y_j) + sum_v pi_old(v)^2)" + (" * is_weight_j^2" if self.importance_weights else "")
        tail = "; 0 past the 2nd-longest length for a group's unique longest response" if self.zero_tail else ""
        return (f"{self.kind}: A_i,t = R_i - B_g(t), B_g(t) = sum_i R_i W_i,t / (sum_i W_i,t + {self.eps:g}) over the "
                f"group's responses valid at {where} t (0 for a group of one{tail}), W_i,t = sum_(j<=t) {w}")


class OptimalTokenBaseline(_TokenBaseline):
    r"""The optimal token baseline (OTB): per prompt group and per token, the reward weighted by the path's score norm.

    $$A_{i,t} = R_i - B_g(t),\qquad
      B_g(t) = \frac{\sum_{i \in g} R_i\, W_{i,t}}{\sum_{i \in g} W_{i,t} + \epsilon},\qquad
      W_{i,t} = \sum_{j \le t} \rho_{i,j}^2\,\bigl(1 - 2\pi_{old}(y_{i,j}) + \textstyle\sum_v \pi_{old,j}(v)^2\bigr)$$

    "The Optimal Token Baseline: Variance Reduction for Long-Horizon LLM-RL" (Li, Xu et al., arXiv
    2602.07078; blog richardli.xyz/optimal-token-baseline). The variance of
    $\sum_t (G_t - b_t)\nabla\log\pi(y_t)$ is smallest at $b_t = E[G_t W_t] / E[W_t]$, where
    $W_t = \lVert\sum_{j \le t}\nabla\log\pi(y_j)\rVert^2$, approximated by the sum of the
    per-token squared norms of the score's gradient in the logits, $\lVert e_y - \pi\rVert^2 =
    1 - 2\pi_y + \sum_v \pi_v^2$ (the paper's Logit-Gradient Proxy: forward probabilities only).
    The sums run over the responses of the group valid at column t of the padded response (veRL's
    ``compute_optimal_token_baseline_advantage``, ``verl/trainer/ppo/core_algos.py`` lines 871-987).

    - ``G_t = R_i``: the return-to-go of an outcome reward at the response's last token (veRL's
      ``token_level_rewards`` with the score there, the rewards rlstab's batches carry), on every
      response token; the advantage is not divided by any std.
    - ``pi_old(y_j) = exp(old_logprobs)`` and ``sum_v pi_old,j(v)^2`` is ``TokenBatch.sum_pi_squared``,
      both from the old policy's pass, at its sampling temperature (veRL: ``calculate_sum_pi_squared``
      in ``compute_log_prob``, ``exp(logsumexp(2z) - 2 logsumexp(z))`` of the temperature-scaled
      logits, ``verl/utils/torch_functional.py`` ``calculate_sum_pi_squared_from_logits``).
    - ``rho`` is the trainer's rollout importance weight (``TokenBatch.is_weights``: veRL's
      ``rollout_is_weights``, truncated IS from its rollout correction), squared, "to minimise MSE
      under truncated IS" (veRL), when the batch carries it and ``importance_weights`` is on.
      An objective's own ``tis`` reweighter acts inside the loss and does not reach the baseline.
    - A group of one response has no baseline (``A = R``). With ``zero_tail`` (veRL's
      ``handle_zero_tail``, on by default) the unique longest response of a group gets baseline 0
      from column L_2 on (L_2 the second-longest length): past it the response is alone, and its
      own reward would otherwise be its baseline (``A ~ 0``).

    Defaults are veRL's (``handle_zero_tail=True``, ``epsilon=1e-8``; ``compute_advantage`` in
    ``verl/trainer/ppo/ray_trainer.py`` passes ``rollout_is_weights`` whenever the batch has them).
    Responses without a response token (padding rows) are left out of the groups and get 0: veRL
    counts them in a group's size, which changes nothing with ``zero_tail`` on. Needs
    ``TokenBatch.sum_pi_squared``: rlstab's embedded trainer supplies it; in veRL run
    ``algorithm.adv_estimator=optimal_token_baseline`` with
    ``actor_rollout_ref.actor.calculate_sum_pi_squared=True`` (veRL computes these advantages in its
    driver and rlstab's loss trains on them); OpenRLHF and TRL compute neither.
    """

    kind: Literal["optimal_token_baseline"] = "optimal_token_baseline"
    aligned: ClassVar[str] = "column"

    def describe(self) -> str:
        return self._describe("column")


class MultiTurnOptimalTokenBaseline(_TokenBaseline):
    r"""The optimal token baseline for tool-integrated reasoning: responses compared response token by response token.

    $$A_{i,t} = R_i - B_g(k_{i,t}),\qquad
      B_g(k) = \frac{\sum_{i \in g} R_i\, W_i(k)}{\sum_{i \in g} W_i(k) + \epsilon}$$

    with ``k_{i,t}`` the index of token t among response i's valid tokens and ``W_i(k)`` its
    accumulated score norm at its k-th valid token (as in
    [`OptimalTokenBaseline`][rlstab.advantages.OptimalTokenBaseline]). A multi-turn response's mask
    has holes (a tool's output between two turns, not trained): the kind above would compare
    different responses' k-th tokens at different columns; this one moves each response's valid
    tokens to the left first (veRL's ``compute_multi_turn_optimal_token_baseline_advantage``,
    ``verl/trainer/ppo/core_algos.py`` lines 990-1121). For responses without holes both kinds
    give the same advantages.

    Responses left without a response token (padding rows, or all rejected) are left out of the
    groups (as veRL's ``response_lengths[i] == 0`` rows); ``zero_tail`` acts from the
    second-longest response's token count on. Paper, defaults and what supplies
    ``sum_pi_squared`` as for ``optimal_token_baseline`` (in veRL:
    ``algorithm.adv_estimator=tir_optimal_token_baseline``).
    """

    kind: Literal["tir_optimal_token_baseline"] = "tir_optimal_token_baseline"
    aligned: ClassVar[str] = "response_token"

    def describe(self) -> str:
        return self._describe("response token")
