"""Target PO: fit each group's sampled responses to the target q ∝ p_old e^{A/η} by cross-entropy."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Literal

from pydantic import Field

from rlstab.batch import BatchError
from rlstab.clipping.base import Surrogate, SurrogateResult
from rlstab.clipping.target import response_advantage, sequence_logps
from rlstab.comm import Comm
from rlstab.deferred import require
from rlstab.lazy import torch
from rlstab.tokens import Tokens


class TargetPO(Surrogate):
    r"""Target Policy Optimization (Kaddour, "Target Policy Optimization", arXiv 2604.06159, section 2).

    Over the $K$ sampled responses of a prompt (a group of ``group_ids``), with
    $\ell_i = \sum_t \log\pi_\theta(y_{i,t})$ the sequence log-likelihood under the current policy
    and $\ell^{old}_i$ under the behaviour policy (``old_logprobs``):

    $$p_i = \frac{e^{\ell_i}}{\sum_{j} e^{\ell_j}}\ \text{(eq. 1)}, \qquad
    q_i = \frac{p^{old}_i\, e^{u_i/\eta}}{\sum_j p^{old}_j\, e^{u_j/\eta}}\ \text{(eq. 2)}, \qquad
    L_g = -\sum_i q_i \log p_i\ \text{(eq. 3)}, \qquad \frac{\partial L_g}{\partial \ell_i} = p_i - q_i,$$

    with $q$ fixed (no gradient), so the gradient vanishes once the policy matches the target on the
    group. $u_i$ is the response's advantage $\bar A_i$ (see [`rlstab.clipping.target`][rlstab.clipping.target]):
    the paper's standardised score, the within-group z-score of the rewards with the *population*
    std and $u = 0$ for a group of equal rewards (appendix A), is the ``grpo`` estimator with
    ``std: population``, ``eps: 0``, ``std_floor: 1e-6`` (the ``target_po`` preset).

    **Aggregation.** Each response $i$ of group $g$ carries its group's cross-entropy, weighted by
    $K_g W_i$, where $W_i = \sum_t w_{i,t}$ is the response's weight in the objective's aggregation and
    $K_g$ the group's size (its responses with a valid token in the step):

    $$L = \sum_g \sum_{i \in g} K_g W_i\, (-q_i \log p_i), \qquad
    \frac{\partial L}{\partial \log\pi_\theta(y_{i,t})} = K_g W_i\, (p_i - q_i).$$

    With ``seq-mean-token-mean`` (no masks, reweighters or importance weights) $W_i = 1/S$ for the
    step's $S$ responses, so $L = \frac{1}{G}\sum_g L_g$ with $G$ groups of equal size: the paper's
    mean over groups (its code: ``-(q * log_p).sum(-1).mean()``) and TRL's
    (``-(tpo_targets * logps).sum() * num_generations / tpo_targets.numel()``). The gradient is that
    of $\sum_i K_g W_i\,\mathrm{sg}(p_i - q_i)\,\ell_i$; it is the gradient of $L$ whenever the
    responses of a group weigh the same (as above), and otherwise gives each response its own weight
    times its share $p_i - q_i$ of its group's gradient (a mask that silences part of a response
    does not silence the rest of it, as for [`GSPO`][rlstab.clipping.GSPO]'s sequence gradient).

    **Exact under any micro-batching.** $p_i$ and $q_i$ need the whole group: the step gathers, over
    every micro-batch and rank, each group's size and the two log-normalisers
    $\log\sum_j e^{\ell_j}$ and $\log\sum_j e^{\ell^{old}_j + u_j/\eta}$ (``step_totals``), and each
    micro-batch reads its responses' groups from them. $p$ comes from the ``logprobs`` handed to
    [`gather`][rlstab.CompiledObjective.gather], which rlstab's contract makes the current policy's:
    the embedded trainer and TRL's ``optimizer_step`` statistics do so exactly; a trainer that
    gathers with the old log-probabilities makes $p$ exact on the first update of a rollout batch
    only (TRL's TargetPO defaults to one optimizer step per generation batch).

    **Defaults and their sources.** ``eta = 1``: the paper ("we use $\eta = 1$ throughout",
    section 2; robust over 0.25 to 2, appendix D), the authors' code (``JeanKaddour/tpo``,
    ``src/tpo/algorithms.py``, ``tpo_target(log_scores_old, scores, eta=1.0)``) and TRL's
    ``tpo_target_temperature`` (1.0). ``length = sum``: the paper's $\ell_i$ is "the usual sum of
    per-token log-probabilities" (section 3.4; the authors' sequence-level ``make_tpo_step`` in
    ``src/tpo/experiments/_trial.py`` sums them over the tokens). ``mean`` is the length-normalised
    log-likelihood that TRL's TargetPO trainer uses by default (pull request 5591, not merged:
    ``tpo_length_normalize_logps``, for both $p$ and $p^{old}$, "so the target distribution isn't
    dominated by length variance"); the gradient on each token is then divided by the response's
    valid tokens.

    Differences from the references, outside their tested ranges: TRL's groups are its
    ``num_generations`` consecutive completions and its $K$ counts completions without a loss
    token too (here $K_g$ counts the responses with a valid token); TRL builds $q$ from the
    recomputed old-policy log-probabilities, the paper from the rollout's (pass those as
    ``old_logprobs``). No metrics (nothing is clipped).
    """

    kind: Literal["target_po"] = "target_po"
    reads: ClassVar[frozenset[str]] = frozenset({"group_ids"})
    eta: float = Field(1.0, gt=0.0, le=1e6)
    """Temperature of the target q ∝ p_old exp(A / eta) (paper, authors' code, TRL: 1.0)."""
    length: Literal["sum", "mean"] = "sum"
    """Sequence log-likelihood: ``sum`` over the response's tokens (paper) or their ``mean`` (TRL's default)."""

    # ------------------------------------------------------------------ step

    def _rows(self, t: Tokens) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(member, l, z)``, ``[B]`` each: responses with a valid token, the current sequence log-likelihood,
        and the target's logit ``l_old + A / eta``."""
        member = t.valid_rows() > 0
        ell = sequence_logps(t, t.logprobs, self.length)
        z = sequence_logps(t, t.old_logprobs, self.length) + response_advantage(t) / self.eta
        return member, ell, z

    def step_totals(self, tokens: list[Tokens], comm) -> GroupNormalisers | None:
        """Each group's size and log-normalisers over the step's micro-batches and ranks (collectively over ``comm``)."""
        if not tokens:
            return None
        rows = [self._rows(t) for t in tokens]
        ids = comm.cat(torch.cat([t.batch.group_ids.to(torch.int64).reshape(-1) for t in tokens]))
        values = torch.cat([torch.stack([m.to(torch.float32), ell, z], -1).reshape(-1) for m, ell, z in rows])
        values = comm.cat(values).reshape(-1, 3)
        return GroupNormalisers.fit(ids, values[:, 0] > 0, values[:, 1], values[:, 2])

    def begin_step(self, sums, state):
        return (GroupNormalisers.empty() if sums is None else sums), state

    def step_metrics(self, step_value) -> dict[str, float]:
        return {}

    # ------------------------------------------------------------------ loss

    def evaluate(self, t: Tokens, weight: torch.Tensor, step=None) -> SurrogateResult:
        table = step if step is not None else self.step_totals([t], Comm(distributed=False))
        member, ell, z = self._rows(t)
        size, log_z_policy, log_z_target = table.rows(t.batch.group_ids, member)
        log_p = ell - log_z_policy
        q = torch.exp(z - log_z_target)
        response_weight = torch.where(t.valid_bool, weight, 0.0).sum(-1)  # W_i; padding may hold anything
        coef = torch.where(member, size * response_weight, 0.0)  # K_g W_i
        loss = torch.where(member, coef * (-q * log_p), 0.0).sum()
        per_response = torch.where(member, coef * (torch.exp(log_p) - q), 0.0)  # dL / dl_i
        if self.length == "mean":
            per_response = per_response / t.valid_rows().clamp(min=1.0)
        grad = per_response.unsqueeze(-1) * t.valid
        return SurrogateResult(loss, grad, {})

    def describe(self) -> str:
        ell = "sum" if self.length == "sum" else "mean"
        return (
            f"target_po: l_i = {ell}_t log pi(y_i,t), p_i = softmax_g(l_i), q_i = softmax_g(l_old,i + A_i / {self.eta:g}) "
            "over the responses of the prompt's group g (q fixed); loss -sum_i q_i log p_i per group, weighted by "
            "K_g times the response's aggregation weight; gradient on l_i: p_i - q_i"
        )


@dataclass(frozen=True)
class GroupNormalisers:
    """Per group of a step (sorted ids): its size and the log-normalisers of p and of the target q."""

    keys: torch.Tensor
    """``[G]`` int64 group ids, sorted."""
    size: torch.Tensor
    """``[G]`` float32: the group's responses with a valid token."""
    log_z_policy: torch.Tensor
    """``[G]`` float32: ``log sum_j exp(l_j)`` over the group (the current policy's)."""
    log_z_target: torch.Tensor
    """``[G]`` float32: ``log sum_j exp(l_old,j + A_j / eta)`` over the group."""

    @classmethod
    def empty(cls) -> GroupNormalisers:
        none = torch.zeros(0)
        return cls(torch.zeros(0, dtype=torch.int64), none, none, none)

    @classmethod
    def fit(cls, group_ids: torch.Tensor, member: torch.Tensor, ell: torch.Tensor, z: torch.Tensor) -> GroupNormalisers:
        """From every response of the step: ``[N]`` group ids, member flags, log-likelihoods and target logits.
        Rows that are not members (padding) are left out, whatever they hold. A host read (the number of groups)."""
        keys, inverse = torch.unique(group_ids[member], sorted=True, return_inverse=True)
        n = keys.numel()
        size = torch.bincount(inverse, minlength=n).to(torch.float32)

        def log_sum_exp(x: torch.Tensor) -> torch.Tensor:  # per group, in float64
            x = x[member].to(torch.float64)
            top = torch.full((n,), -torch.inf, dtype=torch.float64, device=x.device)
            top = top.scatter_reduce(0, inverse, x, reduce="amax")
            total = torch.zeros(n, dtype=torch.float64, device=x.device).index_add_(0, inverse, torch.exp(x - top[inverse]))
            return (top + torch.log(total)).to(torch.float32)

        return cls(keys, size, log_sum_exp(ell), log_sum_exp(z))

    def rows(self, group_ids: torch.Tensor, member: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(size, log_z_policy, log_z_target)`` of each response's group, ``[B]`` each; a member response whose
        group the step did not have is an error (deferred in a frozen-step call on a GPU: ``require``)."""
        ids = group_ids.to(torch.int64).reshape(-1).contiguous()
        if self.keys.numel() == 0:
            require(~member.any(), lambda: BatchError("target_po: these group_ids were not in the step (it had no responses)"))
            zero = torch.zeros(ids.shape, device=ids.device)
            return zero, zero, zero
        idx = torch.searchsorted(self.keys, ids).clamp(max=self.keys.numel() - 1)
        found = (self.keys[idx] == ids) | ~member

        def missing() -> BatchError:
            return BatchError(f"target_po: group_ids {ids[~found].unique().tolist()[:5]} were not in the step's gather")

        require(found.all(), missing)
        return self.size[idx], self.log_z_policy[idx], self.log_z_target[idx]
