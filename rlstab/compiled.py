"""A compiled objective: the torch loss, and the two-phase step API.

Phase 1, [`CompiledObjective.gather`][rlstab.CompiledObjective.gather]: over every micro-batch of an optimizer step (and every
data-parallel rank), compute what depends on the whole step — advantages' group statistics, mask
thresholds (entropy quantiles), and the denominators — and freeze them in a [`StepStats`][rlstab.StepStats].

Phase 2, ``loss_fn(micro_batch, step=stats)``: each micro-batch's share of the step loss. Summing
the micro-batch losses (and averaging gradients over ranks, as DDP/FSDP do) gives exactly the
loss and gradients of the whole step computed at once, whatever the micro-batch size and the
number of ranks.

Called without ``step``, a micro-batch is its own step (statistics local to it, no communication).

A ``StepStats`` carries the fingerprint of the objective that gathered it, and a loss of any other
objective refuses it; stateful components (STARE's controller, BAPO's bounds) advance exactly once
per step on every path, and a call or gather that raises leaves their state as it was.

The policy-gradient term never builds an autograd graph: each surrogate returns its derivative in
closed form and ``_PrecomputedGrad`` hands it to autograd, so the backward pass is a single
multiply (see ``benchmarks/loss_overhead.py``).
"""

from __future__ import annotations

import copy
import os
import sys
import warnings
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from rlstab.advantages import Given
from rlstab.aggregation import StepCounts
from rlstab.batch import BatchError, LossOutput, TokenBatch
from rlstab.comm import Comm
from rlstab.deferred import deferring
from rlstab.errors import StateError
from rlstab.lazy import torch
from rlstab.metrics import Metrics
from rlstab.non_finite import (
    extremes,
    non_finite_count,
    with_padding_zeroed,
    without_bad_padding,
    without_bad_padding_on_every_rank,
    zero_bad_padding,
)
from rlstab.quantile import Population
from rlstab.step import StepLevel, fit_step_level, shaped_rewards
from rlstab.tokens import Tokens, f32

if TYPE_CHECKING:  # the objective compiles itself (Objective.compile): no import back at run time
    from rlstab.objective import Objective


@dataclass(frozen=True)
class StepStats:
    """Statistics of a whole step, frozen before the micro-batch losses run.

    Attributes:
        counts: the denominators (kept and valid tokens and responses, padded length, world size).
        thresholds: one per mask: its threshold (0-d tensor) or None; a tuple of them (each or None)
            for a mask whose ``quantile_request`` returns a list of requests.
        advantage: the fitted estimator state, or None when the batches carried advantages.
        hooks: one step value per reweighter, then one for the surrogate (``begin_step``'s result).
        branch_counts: with ``dual_stream``, the denominators of the branch stream's rows; those of
            the main stream are ``counts`` less these. None otherwise.
        step_level: the step-level decisions (groups dropped by dynamic sampling, the ESS scale).
        fingerprint: [`Objective.fingerprint`][rlstab.Objective.fingerprint] of the objective that
            gathered them: the loss of any objective with another fingerprint refuses them (a
            BatchError), since its masks, estimator and hooks would read them wrongly. The same
            objective compiled twice, or loaded under another name, has the same fingerprint.
        objective_name: that objective's name (``"custom"`` without one), for the message.
    """

    counts: StepCounts
    thresholds: tuple[torch.Tensor | None, ...]
    advantage: object | None
    hooks: tuple = ()
    step_level: StepLevel = StepLevel()
    fingerprint: str = ""
    objective_name: str = ""
    branch_counts: StepCounts | None = None

    @property
    def lr_scale(self) -> float:
        """The factor for this step's learning rate (the objective's ``lr_scale``, VCPO); 1.0 without one."""
        return self.step_level.lr_scale


class _PrecomputedGrad(torch.autograd.Function):
    """A scalar loss whose gradient with respect to ``logprobs`` was computed in the forward pass."""

    @staticmethod
    def forward(ctx, logprobs, value, grad):
        ctx.save_for_backward(grad)
        ctx.dtype = logprobs.dtype
        return value.clone()

    @staticmethod
    def backward(ctx, grad_output):
        (grad,) = ctx.saved_tensors
        return (grad * grad_output).to(ctx.dtype), None, None


def _label_components(kinds: list[str]) -> list[str]:
    """Metric labels: the kind, suffixed with its position when a kind appears twice."""
    return [k if kinds.count(k) == 1 else f"{k}_{i}" for i, k in enumerate(kinds)]


class CompiledObjective:
    """The loss of an [`Objective`][rlstab.Objective]: ``loss_fn(batch, step=None) -> LossOutput``.

    Advantages: a batch that carries ``advantages`` is trained on them; the objective's estimator
    runs only for batches without them (from ``rewards`` and ``group_ids``). With both in a batch
    the advantages take precedence and the rewards are ignored, unless a component reads them
    (``group_filter``); the compiled objective then warns once (``UserWarning``), not on every
    call. Padding rows (no response token) get advantage 0 and never enter the estimator.

    Attributes:
        defer_checks: whether a call leaves its checks to the metrics' read instead of reading
            device values itself (see ``__call__``). None (default): on any device but the CPU,
            where a read costs nothing and a bad input raises in the call. Tests set it to run the
            GPU's path on CPU tensors.
    """

    defer_checks: bool | None = None  # see the class docstring

    def __init__(self, objective: Objective):
        self.objective = objective
        self.masks = list(objective.masks)
        self.mask_labels = _label_components([m.kind for m in self.masks])
        self.regulariser_labels = _label_components([r.kind for r in objective.regularisers])
        self.reweighters = list(objective.reweighters)
        self.reweighter_labels = _label_components([w.kind for w in self.reweighters])
        # Components with step-level behaviour, in StepStats.hooks order, and their state.
        self._hooked = [(f"reweighters[{i}] ({w.kind})", w) for i, w in enumerate(self.reweighters)]
        self._hooked.append((f"surrogate ({objective.surrogate.kind})", objective.surrogate))
        self._states = {label: c.initial_state() for label, c in self._hooked}
        self._step_start_states = dict(self._states)  # before the current step's update (for update_state=False)
        # Step values of training-batch-cadence components, frozen by begin_training_batch for the batch's steps.
        self._batch_values: dict[str, object] = {}
        # Who gathered a StepStats: a string compared on every call with step= (it costs nothing).
        self.fingerprint = objective.fingerprint()
        self._name = objective.name or "custom"
        # Masks whose rejected tokens become padding (rollout rejection): they restrict what counts as valid.
        self._rejections = [m for m in self.masks if getattr(m, "acts_on_valid", False)]
        # Regularisers average over every valid token, with the objective's aggregation kind.
        self._regulariser_aggregation = objective.aggregation.model_copy(update={"count": "valid"})
        self._reads: list[tuple[str, str]] = []
        for i, m in enumerate(self.masks):
            self._reads += [(f"masks[{i}] ({m.kind})", f) for f in sorted(m.reads)]
        for i, w in enumerate(self.reweighters):
            self._reads += [(f"reweighters[{i}] ({w.kind})", f) for f in sorted(w.reads)]
        self._reads += [(f"surrogate ({objective.surrogate.kind})", f) for f in sorted(objective.surrogate.reads)]
        for i, r in enumerate(objective.regularisers):
            self._reads += [(f"regularisers[{i}] ({r.kind})", f) for f in sorted(r.reads)]
        step_level = [(f"reward_shaping[{i}] ({c.kind})", c) for i, c in enumerate(objective.reward_shaping)]
        for name in ("group_filter", "lr_scale", "dual_stream"):
            if getattr(objective, name) is not None:
                step_level.append((f"{name} ({getattr(objective, name).kind})", getattr(objective, name)))
        for who, c in step_level:
            self._reads += [(who, f) for f in sorted(c.reads)]
        # Advantages in the batch take precedence over rewards: rewards nobody reads are worth one warning.
        self._reads_rewards = any(f == "rewards" for _, f in self._reads)
        self._warned_ignored_rewards = False

    def __repr__(self) -> str:
        return f"CompiledObjective({self.objective.name or 'custom'})"

    # ------------------------------------------------------------------ state

    def state_dict(self) -> dict:
        """The state of stateful components (STARE's controller, BAPO's bounds), for a trainer checkpoint."""
        return {label: copy.deepcopy(state) for label, state in self._states.items() if state is not None}

    def load_state_dict(self, state: dict) -> None:
        """Restore ``state_dict()``, after checking it: nothing changes when it raises.

        Raises [`StateError`][rlstab.StateError] for a state saved from a different objective
        (other stateful components), for a state that is not a dict, and for a component state
        that a run of this objective cannot have produced: each component validates its own
        (``StepHook.state_model``: the fields and their types, finite values, bounds that depend
        on its configuration), and the message names the component, the field and the value
        (``state['surrogate (bapo)'].steps = -5: ...``). Integers are accepted for float fields
        (a JSON round trip may turn ``1.0`` into ``1``) and stored as floats, so the loaded state
        behaves exactly as the saved one.
        """
        if not isinstance(state, dict):
            raise StateError(
                f"load_state_dict needs a dict of component states, as state_dict() returns, got {type(state).__name__}"
            )
        components = {label: c for label, c in self._hooked if self._states[label] is not None}
        if set(state) != set(components):
            raise StateError(
                f"state of components {sorted(map(str, state))} does not fit this objective's stateful components "
                f"{sorted(components)}"
            )
        loaded = {label: components[label].validated_state(label, value) for label, value in state.items()}
        for label, value in loaded.items():
            self._states[label] = value
            self._step_start_states[label] = copy.deepcopy(value)
        self._batch_values = {}  # a training batch begun before the restore is not the restored run's

    def _commit(self, pending: dict) -> None:
        """Apply the state updates of a step that succeeded (``_begin_step``'s pending updates)."""
        for label, (before, after) in pending.items():
            self._step_start_states[label] = before
            self._states[label] = after

    def per_micro_batch(self) -> list[str]:
        """Components that compute their statistics within each micro-batch (``selection: micro_batch``), as
        their papers' code does, instead of over the whole step: their results depend on the micro-batch split."""
        return self.objective.per_micro_batch()

    def readers(self, field: str) -> list[str]:
        """The components that read ``TokenBatch.<field>`` (``["masks[0] (s2t)"]``), so adapters can say who needs what."""
        return [who for who, name in self._reads if name == field]

    # ------------------------------------------------------------------ inputs

    def _check_reads(self, batch: TokenBatch) -> None:
        if not isinstance(batch, TokenBatch):
            raise BatchError(f"expected an rlstab.TokenBatch, got {type(batch).__name__}")
        for who, name in self._reads:
            if getattr(batch, name) is None:
                raise BatchError(f"{who} reads TokenBatch.{name}, which this batch does not carry")
        if batch.advantages is not None and batch.rewards is not None and not self._reads_rewards:
            self._warn_ignored_rewards()
        if batch.advantages is None:
            est = self.objective.advantage
            if isinstance(est, Given):
                raise BatchError("advantage (given) needs TokenBatch.advantages, which this batch does not carry")
            for name in sorted(est.reads):
                if getattr(batch, name) is None:
                    raise BatchError(
                        f"advantage ({est.kind}): the batch has no advantages, and estimating them needs "
                        f"TokenBatch.{name}, which it does not carry"
                    )

    def _warn_ignored_rewards(self) -> None:
        """Once per compiled objective: a batch with advantages and rewards, whose rewards nothing reads."""
        if self._warned_ignored_rewards:
            return
        self._warned_ignored_rewards = True
        warnings.warn(
            f"objective {self._name!r}: the batch carries both advantages and rewards; the advantages take "
            f"precedence, so the advantage estimator ({self.objective.advantage.kind}) does not run and the rewards "
            "are ignored (no component of this objective reads them). Leave rewards out of the TokenBatch, or "
            "leave advantages out to have them estimated. (Warned once per compiled objective.)",
            UserWarning,
            stacklevel=_caller_level(),
        )

    def _checked_fields(self, batch: TokenBatch) -> list[str]:
        names = ["logprobs"]
        if batch.old_logprobs is not None:
            names.append("old_logprobs")
        names.append("advantages" if batch.advantages is not None else "rewards")
        if batch.is_weights is not None:
            names.append("is_weights")
        read = {f for _, f in self._reads} - {"advantages", "is_branch"}  # a bool cannot be non-finite
        if batch.advantages is None:
            read |= set(self.objective.advantage.reads) - {"rewards", "group_ids"}
        if batch.entropy is not None:
            read.add("entropy")  # reported as entropy/mean even when no component reads it
        return names + sorted(read)

    def _tokens(self, batch: TokenBatch) -> Tokens:
        self._check_reads(batch)
        t = Tokens.from_batch(batch, self.objective.log_ratio_clamp)
        if self._rejections:  # rejected tokens become padding: they leave every population and denominator
            t.valid = _kept(t, [m.keep(t, None) for m in self._rejections])
            t.valid_bool = t.valid > 0
        return t

    # ------------------------------------------------------------------ phase 1

    def gather(
        self, batches: Iterable[TokenBatch], *, group=None, distributed: bool | None = None, update_state: bool = True
    ) -> StepStats:
        """Statistics of a whole step from all its micro-batches (and all ranks).

        ``batches`` need not carry gradients; ``logprobs`` should be the current policy's (on the
        first update of a step they equal the old log-probabilities, which is what trainers have
        before the first forward). ``distributed``: None = reduce over ``group`` whenever
        ``torch.distributed`` is initialised. Every rank must call this collectively.
        ``update_state``: advance stateful components by one step (call it once per step with
        True; an adapter that gathers per micro-batch passes False on all but the step's first).

        Inputs are checked as in the loss: a NaN or infinity on a valid token (a reward on a
        response with response tokens) raises ``FloatingPointError`` naming the field, on every
        rank; on padding it is ignored. A gather that raises leaves the components' state as it was.

        An empty step: ``gather([])`` in one process returns empty statistics (zero counts, no
        thresholds, no advantage state) and the state moves as for a step without valid tokens
        (STARE's controller stays as it is; BAPO counts the step, at its starting bounds). Under
        ``torch.distributed``, ``[]`` raises ``BatchError`` before any communication: the other
        ranks would wait in collectives this rank never enters. A rank without data passes one
        empty micro-batch instead (``B = 0`` tensors), which takes part in every collective.
        """
        batches = list(batches)
        comm = Comm(group, distributed)
        if not batches and comm.distributed:
            raise BatchError(
                "gather([]) under torch.distributed: this rank would skip the collectives the other ranks enter "
                "(a hang). Pass one empty micro-batch instead (TokenBatch with B = 0 tensors)"
            )
        tokens = [self._tokens(b) for b in batches]
        stats, _, pending, non_finite = self._gather_tokens(tokens, comm, update_state, check=True)
        if non_finite:  # some rank has a non-finite input: every rank zeroes its padding (or raises) and redoes the step
            cleaned = without_bad_padding_on_every_rank(batches, self._checked_fields, comm)
            stats, _, pending, _ = self._gather_tokens([self._tokens(b) for b in cleaned], comm, update_state)
        self._commit(pending)
        return stats

    def training_batch_components(self) -> list[str]:
        """The components whose state moves once per training batch (``["reweighters[0] (stare)"]``)."""
        return [label for label, c in self._hooked if c.state_cadence() == "training_batch"]

    def begin_training_batch(self, batches: Iterable[TokenBatch], *, group=None, distributed: bool | None = None) -> None:
        """Advance the components whose state moves once per training batch, from the whole batch.

        A training batch is what a trainer splits into optimizer steps (veRL's and OpenRLHF's
        rollout batch: its mini-batches, over its epochs). ``batches``: all of it on this rank
        (every rank calls this collectively, as ``gather``), with the log-probabilities and
        entropy the components read from before the first update (the old policy's pass).
        Components with ``state_cadence() == "training_batch"`` (STARE's gate and controller by
        default) take one step from the sums over every batch and rank, and each later
        ``gather`` until the next call reuses that step value instead of moving them again.
        Other components are untouched. Without this call every gather is its own training batch.
        """
        batched = [(label, c) for label, c in self._hooked if label in self.training_batch_components()]
        if not batched:
            return
        batches = list(batches)
        comm = Comm(group, distributed)
        if not batches and comm.distributed:
            raise BatchError("begin_training_batch([]) under torch.distributed: pass one empty micro-batch instead")
        tokens = [self._tokens(b) for b in batches]
        values, states = {}, {}
        for label, component in batched:
            parts = [component.step_sums(t) for t in tokens]
            sums = comm.sum(torch.stack(parts).sum(0)) if tokens and parts[0] is not None else None
            values[label], states[label] = component.begin_step(sums, self._states[label])
        for label in states:  # only once every component succeeded
            self._states[label] = self._step_start_states[label] = states[label]
        self._batch_values = values

    def _gather_tokens(self, tokens: list[Tokens], comm: Comm, update_state: bool = True, check: bool = False):
        """Step statistics, each micro-batch's per-mask keeps and kept tokens (reused by the own-step path),
        the state updates to commit once the step succeeded, and (``check``) the number of non-finite
        checked inputs over every micro-batch and rank (it rides on the counts' reduction)."""
        with deferring() as requirements:  # checks (a group id the step lacks) ride on the counts' transfer
            step_level = fit_step_level(self.objective, tokens, comm)  # first: dropped groups become padding
            advantage_state = self._set_step_advantages(tokens, comm)
            hooks, pending = self._begin_step(tokens, comm, update_state)
            thresholds = []
            for mask in self.masks:
                requests = [mask.quantile_request(t) for t in tokens]
                if not tokens or requests[0] is None:
                    thresholds.append(None)
                    continue
                several = isinstance(requests[0], list)  # a list of requests: keep() gets a tuple of thresholds
                found = tuple(
                    Population([(v, inc) for v, inc, _ in chunks], comm).quantile(
                        chunks[0][2], getattr(mask, "interpolation", "linear"), self.objective.quantile_mode
                    )
                    for chunks in (zip(*requests) if several else [requests])
                )
                thresholds.append(found if several else found[0])
            device = tokens[0].valid.device if tokens else torch.device("cpu")
            masked, local = [], torch.zeros(5 if self.objective.dual_stream is None else 9, dtype=torch.float64, device=device)
            max_length = 0
            for t in tokens:
                keeps = self._mask_keeps(t, thresholds)
                kept = _kept(t, keeps)
                masked.append((keeps, kept))
                valid_rows, kept_rows = t.valid.sum(-1), kept.sum(-1)
                sums = [valid_rows.sum(), kept_rows.sum(), (valid_rows > 0).sum(), (kept_rows > 0).sum()]
                sums.append(non_finite_count(t.batch, self._checked_fields(t.batch)) if check else torch.zeros((), device=device))
                if self.objective.dual_stream is not None:  # the branch stream's own denominators
                    branch = t.batch.is_branch.to(valid_rows.dtype)
                    sums += [(valid_rows * branch).sum(), (kept_rows * branch).sum(), ((valid_rows > 0) * branch).sum(),
                             ((kept_rows > 0) * branch).sum()]
                local = local + torch.stack([s.to(torch.float64) for s in sums])
                max_length = max(max_length, t.valid.shape[-1])
            totals = comm.sum(local)
            if comm.distributed:  # the longest response over ranks rides on the same transfer
                longest = comm.max(torch.full((1,), max_length, dtype=torch.float64, device=device))
                totals = torch.cat([totals, longest])
            totals = torch.cat([totals] + [holds.reshape(1).to(torch.float64) for holds, _ in requirements])
        # Host sync: the step's denominators and the input check, all in one transfer (once per gather).
        totals = totals.tolist()
        for (_, error), holds in zip(requirements, totals[len(totals) - len(requirements):]):
            if not holds:
                raise error()
        del totals[len(totals) - len(requirements):]
        if comm.distributed:
            max_length = int(totals.pop())
        counts = StepCounts(*totals[:4], max_length=max_length, world_size=comm.world_size)
        branch_counts = None
        if self.objective.dual_stream is not None:
            branch_counts = StepCounts(*totals[5:9], max_length=max_length, world_size=comm.world_size)
        stats = StepStats(
            counts, tuple(thresholds), advantage_state, hooks, step_level, self.fingerprint, self._name, branch_counts
        )
        return stats, masked, pending, totals[4] > 0

    def _begin_step(self, tokens: list[Tokens], comm: Comm, update_state: bool) -> tuple[tuple, dict]:
        """Each hooked component's step value, and the state updates to commit when the step succeeds."""
        values, pending = [], {}
        for label, component in self._hooked:
            if label in self._batch_values:  # moved by begin_training_batch: this step reuses the batch's value
                values.append(self._batch_values[label])
                continue
            parts = [component.step_sums(t) for t in tokens]
            sums = None
            if tokens and parts[0] is not None:
                sums = comm.sum(torch.stack(parts).sum(0))
            # A later gather of the same step (update_state=False) starts from the state the step started from.
            before = self._states[label] if update_state else self._step_start_states.get(label, self._states[label])
            value, state = component.begin_step(sums, before)
            if update_state:
                pending[label] = (before, state)
            values.append(value)
        return tuple(values), pending

    def _set_step_advantages(self, tokens: list[Tokens], comm: Comm) -> object | None:
        given = [t.batch.advantages is not None for t in tokens]
        if all(given):
            for t in tokens:
                t.set_advantages(t.batch.advantages)
            return None
        if any(given):
            raise BatchError("some micro-batches of the step carry advantages and others do not")
        est = self.objective.advantage
        rewards = comm.cat(torch.cat([shaped_rewards(self.objective, t.batch) for t in tokens]))
        group_ids = comm.cat(torch.cat([t.batch.group_ids.to(torch.int64) for t in tokens]))
        # Per response: its valid tokens, and whether it has any response token at all (a padding row,
        # which the estimator leaves out, has none), interleaved so that one concatenation carries both.
        rows = comm.cat(torch.cat([
            torch.stack([t.valid.sum(-1), _responses(t.batch).to(torch.float32)], -1).reshape(-1) for t in tokens
        ])).reshape(-1, 2)
        lengths, responses = rows[:, 0], rows[:, 1] > 0
        parts = [est.sequence_inputs(t) for t in tokens]
        inputs = {name: comm.cat(torch.cat([p[name] for p in parts])) for name in (parts[0] if parts else {})}
        state = est.fit(rewards, group_ids, lengths, responses, **inputs)
        for t in tokens:
            rewards = shaped_rewards(self.objective, t.batch)
            t.set_advantages(est.apply(state, rewards, _group_ids(t.batch), _responses(t.batch)))
        return state

    def _mask_keeps(self, t: Tokens, thresholds) -> list[torch.Tensor]:
        return [m.keep(t, thr) for m, thr in zip(self.masks, thresholds)]

    # ------------------------------------------------------------------ phase 2

    def __call__(self, batch: TokenBatch, step: StepStats | None = None) -> LossOutput:
        """The loss of one micro-batch: its share of ``step`` (or its own step when None).

        ``step`` must come from this objective's ``gather`` (or that of an objective with the same
        fingerprint); any other raises ``BatchError``. Without ``step`` the micro-batch is its
        own step, and stateful components advance by one step once the loss is computed (not at
        all when it raises).

        On a GPU (see ``defer_checks``) the metrics stay on the device until they are read. With
        ``step``, the call then reads nothing on the host: the input checks (a non-finite value on
        a valid token, a group id the step did not have) raise at the metrics' read instead of
        here. Without ``step``, it reads what its own step's statistics need (``docs/gpu.md``
        lists those reads).
        """
        defer = self._defers(batch)
        if step is not None:
            self._check_step(step)
            if defer and isinstance(batch, TokenBatch):
                return self._call_deferred(batch, step)
        with deferring(defer) as requirements:
            deferred = (requirements, None) if defer else None  # None: inputs checked by the own step's gather
            out, pending = self._call(batch, step, deferred)
            if not isinstance(out, LossOutput):  # non-finite inputs: zero those on padding (or raise) and redo the step
                out, pending = self._call(without_bad_padding(batch, out), step, deferred)
                assert isinstance(out, LossOutput), "non-finite inputs remained after zeroing the padding"
        self._commit(pending)
        return out

    def _defers(self, batch: TokenBatch) -> bool:
        if self.defer_checks is not None:
            return self.defer_checks
        return isinstance(batch, TokenBatch) and batch.logprobs.device.type != "cpu"

    def _call_deferred(self, batch: TokenBatch, step: StepStats) -> LossOutput:
        """A frozen-step call without a host synchronisation: padding zeroed up front (so a NaN there changes
        nothing, as on the checked path), every check left to the metrics' read."""
        checked = self._checked_fields(batch)

        def first_offence() -> Exception:  # called at the read, only when a valid token's value is not finite
            _, offences = zero_bad_padding(batch, checked)
            name, count, where = offences[0]
            return FloatingPointError(f"TokenBatch.{name} has {count} {where}")

        with deferring() as requirements:
            out, _ = self._call(with_padding_zeroed(batch, checked), step, (requirements, first_offence))
        return out

    def _check_step(self, step: StepStats) -> None:
        if not isinstance(step, StepStats):
            raise BatchError(f"step must be the StepStats that gather returned, got {type(step).__name__}")
        if step.fingerprint != self.fingerprint:
            who = f"objective {step.objective_name!r}" if step.fingerprint else "no objective's gather"
            raise BatchError(
                f"these StepStats were gathered by {who}, not by this one ({self._name!r}): gather the step "
                "with the objective whose loss you compute"
            )

    def _call(
        self, batch: TokenBatch, step: StepStats | None, deferred: tuple | None = None
    ) -> tuple[LossOutput | list[str], dict]:
        t = self._tokens(batch)
        pending = {}
        if step is None:
            own_check = deferred is not None  # the inputs' check rides on the step counts' transfer
            step, ((keeps, kept),), pending, non_finite = self._gather_tokens([t], Comm(distributed=False), check=own_check)
            if non_finite:
                return self._checked_fields(batch), pending
        else:
            step.step_level.restrict(t)
            self._set_micro_batch_advantages(t, step)
            keeps = self._mask_keeps(t, step.thresholds)
            kept = _kept(t, keeps)
        return self._loss(batch, t, step, keeps, kept, deferred), pending

    def _set_micro_batch_advantages(self, t: Tokens, step: StepStats) -> None:
        batch = t.batch
        if step.advantage is not None:
            if batch.advantages is not None:
                raise BatchError("the step's advantages were estimated, but this micro-batch carries its own")
            rewards = shaped_rewards(self.objective, batch)
            t.set_advantages(self.objective.advantage.apply(step.advantage, rewards, _group_ids(batch), _responses(batch)))
        else:
            if batch.advantages is None:
                raise BatchError("the step was gathered from batches with advantages; this one has none")
            t.set_advantages(batch.advantages)

    def _scale(self, agg, step: StepStats, t: Tokens, row_tokens: torch.Tensor):
        """``agg``'s per-token weight; with ``dual_stream``, each stream's own, the branch stream's times lambda."""
        if step.branch_counts is None:
            return agg.scale(step.counts, row_tokens)
        main = _minus(step.counts, step.branch_counts)
        lam = self.objective.dual_stream.branch_weight
        def as_tensor(x):  # a float32 tensor without a host-to-device copy (a fill)
            return x if isinstance(x, torch.Tensor) else torch.full((), x, dtype=torch.float32, device=row_tokens.device)

        main_scale, branch_scale = as_tensor(agg.scale(main, row_tokens)), as_tensor(agg.scale(step.branch_counts, row_tokens))
        return torch.where(t.batch.is_branch.unsqueeze(-1), lam * branch_scale, main_scale)

    def _loss(
        self, batch: TokenBatch, t: Tokens, step: StepStats, keeps, kept, deferred: tuple | None = None
    ) -> LossOutput | list[str]:
        """The loss and metrics; the list of checked fields instead when an input is not finite.

        ``deferred``: ``(requirements, input_error)`` of a deferred call: the inputs' finiteness (failing
        with ``input_error()``) joins the deferred checks, all left to the metrics' read. Without it
        everything is read here, with the metrics.
        """
        obj = self.objective
        counts = step.counts
        names: list[str] = []
        values: list[torch.Tensor | float] = []

        def metric(name: str, value) -> None:
            names.append(name)
            values.append(value)  # a 0-d tensor stays on its device, a number on the host, until read

        n_valid = t.valid.sum()
        n_valid_safe = n_valid.clamp(min=1.0)
        valid_flat = t.valid.reshape(-1)
        if self._rejections:  # their counts are over the tokens before any rejection
            before_flat = step.step_level.response_tokens(batch).reshape(-1)
            n_before = before_flat.sum()
        for label, mask, k, thr in zip(self.mask_labels, self.masks, keeps, step.thresholds):
            base, n_base = (before_flat, n_before) if mask in self._rejections else (valid_flat, n_valid)
            n_kept_by_mask = torch.dot(base, k.reshape(-1))
            metric(f"mask/{label}/kept", n_kept_by_mask)
            metric(f"mask/{label}/silenced", n_base - n_kept_by_mask)
            metric(f"mask/{label}/kept_fraction", n_kept_by_mask / n_base.clamp(min=1.0))
            if isinstance(thr, tuple):  # several step quantiles, named by the mask
                for name, value in zip(mask.threshold_names, thr):
                    if value is not None:
                        metric(f"mask/{label}/{name}", value)
            elif thr is not None:
                metric(f"mask/{label}/{mask.threshold_name}", thr)

        agg = obj.aggregation
        row_tokens = (kept if agg.count == "kept" else t.valid).sum(-1)
        weight = kept * self._scale(agg, step, t, row_tokens)
        if batch.is_weights is not None:
            w = f32(batch.is_weights)
            weight = weight * (w.unsqueeze(-1) if w.dim() == 1 else w)
        n_kept = kept.sum()
        for label, reweighter, value in zip(self.reweighter_labels, self.reweighters, step.hooks):
            factor = reweighter.weights(t, value)
            weight = weight * factor
            # mean factor over kept tokens (factor may be [B, 1]): sum_i factor_i * kept tokens of i
            kept_factor = (kept * factor).sum()
            metric(f"reweight/{label}/mean", kept_factor / n_kept.clamp(min=1.0))
            for name, v in reweighter.step_metrics(value).items():
                metric(f"reweight/{label}/{name}", v)
        for name, v in obj.surrogate.step_metrics(step.hooks[-1]).items():
            metric(f"surrogate/{name}", v)
        result = obj.surrogate.evaluate(t, weight, step.hooks[-1])
        loss = result.loss
        if batch.logprobs.requires_grad:
            loss = _PrecomputedGrad.apply(batch.logprobs, result.loss, result.grad)
        metric("loss/policy", result.loss)

        if obj.regularisers:
            reg_weight = t.valid * self._scale(self._regulariser_aggregation, step, t, t.valid.sum(-1))
            for label, reg in zip(self.regulariser_labels, obj.regularisers):
                value = (reg.term(batch, t) * reg_weight).sum()
                loss = loss + reg.coef * value
                metric(f"loss/{label}", value.detach())

        metric("tokens/valid", n_valid)
        metric("tokens/kept", n_kept)
        metric("tokens/kept_fraction", n_kept / n_valid_safe)
        metric("step/tokens_valid", counts.tokens_valid)
        metric("step/tokens_kept", counts.tokens_kept)
        if step.branch_counts is not None:
            metric("step/branch_tokens_valid", step.branch_counts.tokens_valid)
            metric("step/branch_responses", step.branch_counts.sequences_valid)
        for name, value in step.step_level.metrics(obj).items():
            metric(name, value)
        if step.advantage is not None:
            for name, value in obj.advantage.step_metrics(step.advantage).items():
                metric(f"advantage/{obj.advantage.kind}/{name}", value)
        for name, count in result.counts.items():
            metric(name, count / n_valid_safe)
        metric("approx_kl", -torch.dot(valid_flat, t.log_ratio.reshape(-1)) / n_valid_safe)
        adv = t.advantage_rows  # [B, 1]: sum over rows of valid tokens x advantage, without a [B, T] copy
        adv_sum = torch.dot(t.valid.sum(-1), adv[:, 0]) if adv.shape[-1] == 1 else torch.dot(valid_flat, adv.reshape(-1))
        metric("advantage/mean", adv_sum / n_valid_safe)
        if t.entropy is not None:
            metric("entropy/mean", torch.dot(valid_flat, t.entropy.reshape(-1)) / n_valid_safe)

        names.append("loss")
        values.append(loss)
        if deferred is not None:  # read with the metrics, whenever they are read
            requirements, input_error = deferred
            inputs_finite = None if input_error is None else _inputs_finite(batch, self._checked_fields(batch))
            if inputs_finite is not None:
                requirements.append((inputs_finite, input_error))
            return LossOutput(loss=loss, metrics=Metrics(names, values, requirements))
        checked = self._checked_fields(batch)
        inputs_finite = _inputs_finite(batch, checked)  # rides on the metrics' transfer
        metrics = Metrics(names, values, [] if inputs_finite is None else [(inputs_finite, _NonFiniteInputs)])
        try:
            metrics.read()  # one host synchronisation per micro-batch (free on the CPU)
        except _NonFiniteInputs:
            return checked
        return LossOutput(loss=loss, metrics=metrics)


def _inputs_finite(batch: TokenBatch, fields: list[str]) -> torch.Tensor | None:
    """0-d bool: every value of ``fields`` is finite (min and max of each field are finite iff every value is)."""
    bounds = extremes(batch, fields)
    return torch.isfinite(torch.stack([b.to(torch.float32) for b in bounds])).all() if bounds else None


class _NonFiniteInputs(Exception):
    """An input of the checked path is not finite: the call zeroes the padding (or raises) and runs again."""


def _responses(batch: TokenBatch) -> torch.Tensor:
    """``[B]`` bool: the responses with at least one response token; the others are padding rows."""
    return batch.response_mask.any(-1)


def _group_ids(batch: TokenBatch) -> torch.Tensor:
    """``[B]`` int64, contiguous (``searchsorted`` copies, and warns about, a strided input)."""
    return batch.group_ids.to(torch.int64).contiguous()


def _caller_level() -> int:
    """The ``stacklevel`` of the first frame outside rlstab, as seen from a function that calls ``warnings.warn``."""
    package = os.path.dirname(os.path.abspath(__file__)) + os.sep
    frame, level = sys._getframe(1), 1
    while frame is not None and frame.f_code.co_filename.startswith(package):
        frame, level = frame.f_back, level + 1
    return level


def _minus(total: StepCounts, part: StepCounts) -> StepCounts:
    """The denominators of the rows not in ``part`` (the main stream)."""
    return StepCounts(
        total.tokens_valid - part.tokens_valid, total.tokens_kept - part.tokens_kept,
        total.sequences_valid - part.sequences_valid, total.sequences_kept - part.sequences_kept,
        max_length=total.max_length, world_size=total.world_size,
    )


def _kept(t: Tokens, keeps: list[torch.Tensor]) -> torch.Tensor:
    """1.0 on valid tokens that every mask keeps."""
    kept = t.valid.clone()
    for k in keeps:
        kept.mul_(k)
    return kept
