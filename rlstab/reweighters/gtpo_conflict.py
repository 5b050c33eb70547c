r"""GTPO's conflict tokens: shared by positive and negative responses of a group, amplified or skipped."""

from __future__ import annotations

from typing import Any, Literal, NamedTuple

from pydantic import Field

from rlstab.advantages.base import GroupTable
from rlstab.advantages.optimal_token_baseline import response_positions
from rlstab.batch import BatchError
from rlstab.comm import Comm
from rlstab.lazy import torch
from rlstab.reweighters.base import Reweighter
from rlstab.tokens import Tokens

_KEY_LIMIT = 2**62  # keys are int64: (group, direction, position, token) packed below this


class ConflictStep(NamedTuple):
    """The step's conflict keys, frozen before the micro-batch losses run.

    ``keys``: sorted int64 keys ``((group * 2 + direction) * width + position) * vocab + token`` present in
    both a positive and a negative response of the group (direction 0: position from the response's first
    token; 1: from its last). ``groups``: the step's sorted group ids (a key's group is an index into them).
    ``table``: the group reward table (``sign: rewards``), else None.
    """

    keys: torch.Tensor
    groups: torch.Tensor
    width: int
    vocab: int
    table: GroupTable | None


class GTPOConflict(Reweighter):
    r"""GTPO's conflict-token weight (Simoni et al., arXiv 2508.03772): amplify A > 0, skip A < 0.

    A *conflict token* of response $i$ is a token that responses of the same prompt group with opposite
    advantage signs both hold at the same position: the pair (position, token id) appears in at least one
    positive and at least one negative response of the group. The weight multiplies the token's loss:

    $$\lambda_{i,t} = \lambda^{\rightarrow}_{i,t}\,\lambda^{\leftarrow}_{i,t},\qquad
    \lambda^{d}_{i,t} = \begin{cases} w & A_i > 0 \text{ and } t \in C^d_i \\ 0 & A_i < 0 \text{ and } t \in C^d_i \\
    1 & \text{otherwise} \end{cases}$$

    $C^{\rightarrow}_i$ is the longest run of conflict tokens that starts at the response's first token,
    positions counted from the start; $C^{\leftarrow}_i$ the longest run that ends at its last token, positions
    counted from the end (so that responses of different lengths align on their endings). $\lambda_{i,t}$ is the
    $\lambda_{i,t}$ of the objective the authors state (README of github winstonsmith1897/GTPO), restated from
    their code (``gtpo/gtpo_training.py``, ``build_conflict_mask``): keys (position, token) of the group's
    positive and negative responses (``bincount`` over ``position * vocab + token``, ``freq_pos & freq_neg``),
    the run from the start by ``cumprod`` (``conflict_fwd``), the run from the end likewise on the responses
    reversed to end-alignment (``conflict_rev``), $w$ = ``W_RAW`` = 2.0 (``amplify``) on positive responses and 0
    on negative ones, and the two directions multiplied (``delta_fwd * delta_bw_use``: a positive token in both
    runs weighs $w^2$). Responses with $A_i = 0$ take no part (``active_flags``) and keep weight 1.

    Choices, and where they come from:

    - ``sign``: which sign decides positive and negative. ``rewards`` (default): the sign of
      $R_i - \operatorname{mean}_g R$ over the step's group (``TokenBatch.rewards``, the raw rewards), which
      is the sign of the authors' advantage (``rewards - mean_grouped_rewards``) *before* GTPO's entropy
      shaping and filter: their ``pos_flags`` / ``neg_flags`` read it, so a response the entropy filter drops
      still marks its tokens. ``advantages``: the sign of the per-response advantage the loss trains on (for
      trainer-given advantages; with ``advantage: gtpo`` it differs from the authors' where the entropy
      penalty flips a small advantage's sign).
    - positions: the index among the row's valid tokens (``response_mask``), from the first and from the
      last valid token. The authors' code counts columns of right-padded completions and excludes tokens
      equal to its ``PAD_ID`` (Llama's 128004) from the runs; rlstab excludes padding by the response mask
      instead (for a response whose mask is one run of tokens from column 0, as every trainer lays them out,
      the same positions).
    - ``normalise``: ``none`` (default) follows the objective the authors state, where $\lambda_{i,t}$ enters
      $\frac{1}{|o_i|}\sum_t$ and nothing else. ``conflict_count`` also divides each response's loss by
      $\max(1, n_i)$ as their code does (``gtpo_compute_loss``: ``loss_disp / n_conflict.clamp(min=1)``),
      where their $n_i$ counts the union of the forward run (columns from the start) and the backward run
      in its reversed coordinates (``total_conflict = conflict_fwd | conflict_rev``): both are runs from
      index 0, so $n_i = \max(|C^{\rightarrow}_i|, |C^{\leftarrow}_i|)$.

    Scope: the keys of every response of the step (every micro-batch, every rank) are gathered once per step
    (``step_totals``), so a group split across micro-batches and ranks gets the same conflict tokens as one
    process on the whole batch; the weights of a micro-batch are then looked up on the device, with no host
    read. Without a step (``loss_fn(batch)``) the micro-batch is its own step, as for every step statistic.
    The gather reads on the host the step's longest response and largest token id (to size the keys), and
    selects the active responses' keys by boolean indexing. Needs ``TokenBatch.token_ids``, which only
    rlstab's embedded trainer supplies.

    Metrics: ``reweight/gtpo_conflict/mean`` (the mean weight over kept tokens), ``conflict_keys`` (the
    step's distinct conflicting (group, direction, position, token) keys).
    """

    kind: Literal["gtpo_conflict"] = "gtpo_conflict"
    amplify: float = Field(2.0, ge=0.0)
    """w: the weight of a conflict token of a positive response (the authors' W_RAW); a negative response's is 0."""
    sign: Literal["rewards", "advantages"] = "rewards"
    """What decides a response's sign: its reward against the group mean (the authors'), or its advantage."""
    normalise: Literal["none", "conflict_count"] = "none"
    """``conflict_count``: also divide each response's loss by its number of conflict tokens, as the authors' code does."""

    @property
    def reads(self) -> frozenset[str]:  # type: ignore[override]
        if self.sign == "rewards":
            return frozenset({"token_ids", "rewards", "group_ids"})
        return frozenset({"token_ids", "group_ids"})

    # ---------------------------------------------------------------- step

    def step_totals(self, tokens: list[Tokens], comm: Any) -> ConflictStep | None:
        """The step's conflict keys from every micro-batch on every rank (collective over ``comm``)."""
        if not tokens:
            return None
        device = tokens[0].valid.device
        responses = comm.cat(torch.cat([t.valid_bool.any(-1) for t in tokens]).to(torch.int64)) > 0
        group_ids = comm.cat(torch.cat([t.batch.group_ids.to(torch.int64) for t in tokens]))
        table = None
        if self.sign == "rewards":
            rewards = comm.cat(torch.cat([t.batch.rewards.to(torch.float32) for t in tokens]))
            table = GroupTable.fit(rewards, group_ids, responses)
        groups = torch.unique(group_ids)
        longest = torch.stack([t.valid_rows().max() if t.valid.numel() else t.valid.new_zeros(()) for t in tokens]).max()
        extremes = []
        for t in tokens:
            ids = t.batch.token_ids.to(torch.int64)
            extremes.append(torch.where(t.valid_bool, ids, 0).amax() if ids.numel() else ids.new_zeros(()))
            extremes.append(torch.where(t.valid_bool, ids, 0).amin().neg() if ids.numel() else ids.new_zeros(()))
        sizes = torch.stack([longest.to(torch.float64), *[e.to(torch.float64) for e in extremes]])
        sizes = comm.max(sizes)
        width = int(sizes[0])  # host read: the keys' sizes
        highest, lowest = int(sizes[1::2].max()), -int(sizes[2::2].max())
        if lowest < 0:
            raise BatchError(f"reweighters (gtpo_conflict): TokenBatch.token_ids holds {lowest} on a valid token; "
                             "token ids are at least 0")
        vocab = highest + 1
        if groups.numel() * 2 * max(width, 1) * vocab >= _KEY_LIMIT:
            raise BatchError(
                f"reweighters (gtpo_conflict): {groups.numel()} groups x {width} positions x {vocab} token ids do "
                "not fit the int64 keys"
            )
        step = ConflictStep(torch.zeros(0, dtype=torch.int64, device=device), groups, width, vocab, table)
        positive, negative = [], []
        for t in tokens:
            sign = self._signs(t, step)
            keys = self._keys(t, step)  # [2, B, T]
            valid = t.valid_bool
            positive.append(keys[:, valid & (sign > 0)[:, None]].reshape(-1))
            negative.append(keys[:, valid & (sign < 0)[:, None]].reshape(-1))
        positive = torch.unique(comm.cat(torch.cat(positive)))
        negative = torch.unique(comm.cat(torch.cat(negative)))
        both, count = torch.unique(torch.cat([positive, negative]), return_counts=True)
        return step._replace(keys=both[count == 2])

    def begin_step(self, sums, state):
        return sums, state

    def step_metrics(self, step) -> dict[str, float]:
        return {} if step is None else {"conflict_keys": float(step.keys.numel())}

    # ---------------------------------------------------------------- tokens

    def _signs(self, t: Tokens, step: ConflictStep) -> torch.Tensor:
        """``[B]`` float: +1, -1 or 0, each response's sign (0 on padding rows)."""
        responses = t.valid_bool.any(-1)
        if self.sign == "rewards":
            mean, _, _ = step.table.rows(t.batch.group_ids.to(torch.int64).contiguous(), responses, count=False)
            value = t.batch.rewards.to(torch.float32) - mean
        else:
            value = t.advantage_per_response
            if value is None:
                raise BatchError("reweighters (gtpo_conflict): sign: advantages needs one advantage per response "
                                 "([B]), and this batch's are per token")
        return torch.where(responses, torch.sign(value), 0.0)

    def _keys(self, t: Tokens, step: ConflictStep) -> torch.Tensor:
        """``[2, B, T]`` int64: each token's key from the start (0) and from the end (1); anything on padding."""
        valid = t.valid_bool
        forward = response_positions(valid)
        backward = t.valid_rows().to(torch.int64)[:, None] - 1 - forward
        group = torch.searchsorted(step.groups, t.batch.group_ids.to(torch.int64).contiguous())
        group = group.clamp(max=max(step.groups.numel() - 1, 0))[:, None]
        ids = torch.where(valid, t.batch.token_ids.to(torch.int64), 0)
        position = torch.stack([forward, backward]).clamp(min=0)
        direction = torch.arange(2, device=valid.device)[:, None, None]
        return ((group * 2 + direction) * step.width + position) * step.vocab + ids

    def weights(self, t: Tokens, step) -> torch.Tensor:
        if step is None:  # no step value: the micro-batch is its own step
            step = self.step_totals([t], Comm(distributed=False))
        valid = t.valid_bool
        sign = self._signs(t, step)[:, None]
        keys = self._keys(t, step)
        if step.keys.numel():
            found = torch.searchsorted(step.keys, keys).clamp(max=step.keys.numel() - 1)
            member = step.keys[found] == keys
        else:
            member = torch.zeros_like(keys, dtype=torch.bool)
        member = member & (sign != 0)
        # The run from the start and the run from the end: padding passes through (where: True), then leaves.
        forward = torch.where(valid, member[0], True).to(torch.int64).cumprod(-1).bool() & valid
        backward = torch.where(valid, member[1], True).to(torch.int64).flip(-1).cumprod(-1).flip(-1).bool() & valid
        conflict_weight = torch.where(sign > 0, self.amplify, 0.0)
        weights = torch.where(forward, conflict_weight, 1.0) * torch.where(backward, conflict_weight, 1.0)
        if self.normalise == "conflict_count":
            count = torch.maximum(forward.sum(-1), backward.sum(-1)).clamp(min=1)
            weights = weights / count[:, None].to(weights.dtype)
        return weights

    def describe(self) -> str:
        sign = "R_i - mean_g R" if self.sign == "rewards" else "A_i"
        scale = "; divided by max(1, the response's conflict tokens)" if self.normalise == "conflict_count" else ""
        return (
            f"gtpo_conflict: w = {self.amplify:g} (sign({sign}) > 0) or 0 (< 0) on each conflict run, 1 elsewhere, "
            "the runs from the start and from the end multiplied; a conflict token holds a (position, token) that "
            f"a positive and a negative response of its group both hold, over the whole step{scale}"
        )
