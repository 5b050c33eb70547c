"""The step phase: what depends on the whole optimizer step, computed once over every micro-batch and rank.

``gather`` runs, in order: the step level (dynamic sampling drops groups: their responses become
padding; VCPO's learning-rate scale), the advantage estimator's fit, the stateful components'
step (one loop, ``ComponentStates.begin``, shared
with ``begin_training_batch``), each mask's step quantile (then each shadow mask's; a counted
mask's order statistic after the mask it matches, see ``counted``), and the denominators

    tokens_valid = sum valid,  tokens_kept = sum valid * prod_m keep_m,
    sequences_valid = #{rows with a valid token},  sequences_kept = #{rows with a kept token},

summed over micro-batches and ranks in one reduction that also carries the inputs' check (how
many checked fields hold a value that is not finite or beyond its field's limits) and the deferred checks:
one host read per gather. With ``check``, an offending input anywhere (padding included) raises
``OffendingInputs`` on every rank, once the read is made (``offending_inputs``: the caller cleans and redoes the
step).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

from rlstab.aggregation import StepCounts
from rlstab.comm import Comm
from rlstab.compiler.advantages import fit_step_advantages
from rlstab.compiler.counted import counted_threshold
from rlstab.compiler.inputs import Inputs
from rlstab.compiler.keeps import kept, mask_keeps
from rlstab.compiler.offending_inputs import OffendingInputs, offending_flag
from rlstab.compiler.states import ComponentStates, Pending
from rlstab.compiler.step_stats import StepStats
from rlstab.deferred import AllFinite, deferring
from rlstab.lazy import torch
from rlstab.quantile import Population
from rlstab.step import fit_step_level
from rlstab.tokens import Tokens

if TYPE_CHECKING:
    from rlstab.objective import Objective


class Gathered(NamedTuple):
    """A step gathered, not yet committed."""

    stats: StepStats
    masked: list[tuple[list[torch.Tensor], torch.Tensor]]
    """Each micro-batch's per-mask keeps and kept tokens (reused by a micro-batch that is its own step)."""
    pending: Pending
    """The components' state updates, to commit once the step succeeded."""


class StepPhase:
    """Gathers the step statistics of one objective (its ``inputs``, component ``states`` and ``fingerprint``)."""

    def __init__(self, objective: Objective, inputs: Inputs, states: ComponentStates, fingerprint: str):
        self.objective = objective
        self.inputs = inputs
        self.states = states
        self.fingerprint = fingerprint

    def gather(
        self, tokens: list[Tokens], comm: Comm, update_state: bool = True, check: bool = False, part_of_step: bool = False
    ) -> Gathered:
        """The step's statistics from its micro-batches' ``tokens`` on this rank (collectively over ``comm``).

        ``check``: raise ``OffendingInputs`` on every rank when a checked input of some micro-batch on some rank
        holds a value that is not finite or beyond its field's limits (padding included: the caller cleans the
        batches and gathers again)."""
        obj = self.objective
        with deferring() as requirements:  # checks (a group id the step lacks) ride on the counts' transfer
            step_level = fit_step_level(obj, tokens, comm)  # first: dropped groups become padding
            advantage_state = fit_step_advantages(obj, tokens, comm)
            values, pending = self.states.begin(
                self.states.components, tokens, comm, update_state=update_state, part_of_step=part_of_step
            )
            thresholds = self._thresholds(tokens, comm)
            masked = [(keeps, kept(t, keeps)) for t in tokens for keeps in [mask_keeps(obj, t, thresholds)]]
            totals = self._totals(tokens, masked, comm, check)
            if requirements:  # 0-d bools, 1.0 or 0.0 among the float64 totals
                totals = torch.cat([totals, torch.stack([_on_device(holds) for holds, _ in requirements])])
        # Host sync: the step's denominators and the input check, all in one transfer (once per gather).
        totals = totals.tolist()
        for (_, error), holds in zip(requirements, totals[len(totals) - len(requirements):]):
            if not holds:
                raise error()
        del totals[len(totals) - len(requirements):]
        if totals[4] > 0:  # the offending inputs' count, 0 without ``check``
            raise OffendingInputs
        max_length = int(totals.pop()) if comm.distributed else max((t.valid.shape[-1] for t in tokens), default=0)
        counts = StepCounts(*totals[:4], max_length=max_length, world_size=comm.world_size)
        branch_counts = None
        if obj.dual_stream is not None:
            branch_counts = StepCounts(*totals[5:9], max_length=max_length, world_size=comm.world_size)
        stats = StepStats(
            counts, tuple(thresholds), advantage_state, tuple(values.values()), step_level, self.fingerprint,
            obj.name or "custom", branch_counts,
        )
        return Gathered(stats, masked, pending)

    def _thresholds(self, tokens: list[Tokens], comm: Comm) -> list:
        """Each mask's, then each shadow mask's, step threshold(s) over every micro-batch and rank: a 0-d tensor,
        a tuple of them, or None. Counted masks last: a ``match`` reads the matched mask's threshold."""
        slots = list(self.objective.masks) + list(self.objective.shadow_masks)
        thresholds = [None if m.counted else self._quantiles(m, tokens, comm) for m in slots]
        for i, (mask, j) in enumerate(zip(slots, self.inputs.plan.matches)):
            if mask.counted:
                matched = None if j is None else (slots[j], thresholds[j])
                thresholds[i] = counted_threshold(mask, tokens, comm, matched)
        return thresholds

    def _quantiles(self, mask, tokens: list[Tokens], comm: Comm):
        """A mask's step quantile(s) (``quantile_request``): a 0-d tensor, a tuple of them, or None."""
        requests = [mask.quantile_request(t) for t in tokens]
        if not tokens or requests[0] is None:
            return None
        several = isinstance(requests[0], list)  # a list of requests: keep() gets a tuple of thresholds
        found = tuple(
            Population([(v, inc) for v, inc, _ in chunks], comm).quantile(
                chunks[0][2], getattr(mask, "interpolation", "linear"), self.objective.quantile_mode
            )
            for chunks in (zip(*requests) if several else [requests])
        )
        return found if several else found[0]

    def _totals(self, tokens: list[Tokens], masked: list, comm: Comm, check: bool) -> torch.Tensor:
        """float64 ``[valid tokens, kept tokens, valid rows, kept rows, offending inputs]`` (then the branch
        stream's four with ``dual_stream``), summed over ranks; under ``torch.distributed`` the longest
        response over ranks after them. Offending inputs: the micro-batches with a checked input that is not
        finite or beyond its field's limits (with ``check``; 0 without).

        Each micro-batch's counts are one float64 sum of its rows' counts (integers: the same numbers
        whatever the order they are added in)."""
        dual = self.objective.dual_stream is not None
        device = tokens[0].valid.device if tokens else torch.device("cpu")
        local = None
        for t, (_, kept_tokens) in zip(tokens, masked):
            valid_rows = t.valid_rows()
            kept_rows = valid_rows if kept_tokens is t.valid else kept_tokens.sum(-1)  # without masks, the same
            rows = [valid_rows, kept_rows, valid_rows > 0, kept_rows > 0]
            if dual:  # the branch stream's own denominators
                branch = t.batch.is_branch.to(valid_rows.dtype)
                rows += [r * branch for r in rows]
            sums = torch.stack(rows).sum(-1, dtype=torch.float64)
            if check:
                flag = offending_flag(t.batch, self.inputs.checked_fields(t.batch))
            else:
                flag = torch.zeros(1, dtype=torch.bool, device=device)
            sums = torch.cat([sums[:4], flag, sums[4:]] if dual else [sums, flag])
            local = sums if local is None else local + sums
        if local is None:
            local = torch.zeros(9 if dual else 5, dtype=torch.float64, device=device)
        totals = comm.sum(local)
        if comm.distributed:  # the longest response over ranks rides on the same transfer
            longest = max((t.valid.shape[-1] for t in tokens), default=0)
            totals = torch.cat([totals, comm.max(torch.full((1,), longest, dtype=torch.float64, device=device))])
        return totals


def _on_device(holds: torch.Tensor | AllFinite) -> torch.Tensor:
    """A requirement's condition as a 0-d bool tensor."""
    return holds.on_device() if isinstance(holds, AllFinite) else holds
