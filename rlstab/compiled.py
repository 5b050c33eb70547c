"""A compiled objective: the torch loss, and the two-phase step API (the compiler's facade).

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

The compiler, by phase (``rlstab.compiler``): the objective's [`Plan`][rlstab.compiler.plan.Plan]
(labels, readers, stateful components; no torch), the inputs' checks and tokens (``inputs``), the
step phase (``step_phase``, ``advantages``, ``states``: the one loop of the stateful components'
step; ``keeps``: which tokens the masks keep), and the loss phase (``loss_phase``: the loss;
``loss_metrics``: the metrics and how each combines over micro-batches; ``loss_output``: the inputs'
values checked on the metrics' read). This module holds them together. Offending inputs (not finite, or
beyond their field's limits) are the business of ``rlstab.compiler.offending_inputs``: zeroed on padding
(or raised on a valid token) and the step redone, on one call path.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from rlstab.batch import BatchError, LossOutput, TokenBatch
from rlstab.comm import Comm
from rlstab.compiler.advantages import set_micro_batch_advantages
from rlstab.compiler.inputs import Inputs
from rlstab.compiler.keeps import kept, mask_keeps, shadow_keeps
from rlstab.compiler.loss_metrics import loss_metrics
from rlstab.compiler.loss_output import Deferred, loss_output
from rlstab.compiler.loss_phase import LossPhase
from rlstab.compiler.offending_inputs import (
    retried_without_bad_padding,
    without_bad_padding,
    without_bad_padding_on_every_rank,
    zeroed_up_front,
)
from rlstab.compiler.plan import Plan
from rlstab.compiler.states import ComponentStates, Pending
from rlstab.compiler.step_phase import StepPhase
from rlstab.compiler.step_stats import StepStats
from rlstab.deferred import deferring
from rlstab.lazy import torch
from rlstab.tokens import Tokens

if TYPE_CHECKING:  # Objective.compile finds this module by name: no import back at run time
    from rlstab.objective import Objective

__all__ = ["CompiledObjective", "StepStats"]


class CompiledObjective:
    """The loss of an [`Objective`][rlstab.Objective]: ``loss_fn(batch, step=None) -> LossOutput``.

    Advantages: a batch that carries ``advantages`` is trained on them; the objective's estimator
    runs only for batches without them (from ``rewards`` and ``group_ids``). With both in a batch
    the advantages take precedence and the rewards are ignored, unless a component reads them
    (``group_filter``); the compiled objective then warns once (``UserWarning``), not on every
    call. Padding rows (no response token) get advantage 0 and never enter the estimator.

    Attributes:
        plan: the objective's [`Plan`][rlstab.compiler.plan.Plan]: component labels, who reads
            which field, the stateful, training-batch and per-micro-batch components.
        mask_labels: each mask's metric label (``mask/<label>/kept``), in order.
        defer_checks: whether a call leaves its checks to the metrics' read instead of reading
            device values itself (see ``__call__``). None (default): on any device but the CPU,
            where a read costs nothing and a bad input raises in the call. Tests set it to run the
            GPU's path on CPU tensors.
    """

    defer_checks: bool | None = None  # see the class docstring

    def __init__(self, objective: Objective):
        self.objective = objective
        self.plan = Plan.of(objective)
        self.masks = list(objective.masks)
        self.mask_labels = list(self.plan.mask_labels)
        # Who gathered a StepStats: a string compared on every call with step= (it costs nothing).
        self.fingerprint = objective.fingerprint()
        self._name = objective.name or "custom"
        self._inputs = Inputs(objective, self.plan)
        self._states = ComponentStates(objective, self.plan.stateful)
        self._step_phase = StepPhase(objective, self._inputs, self._states, self.fingerprint)
        self._loss_phase = LossPhase(objective)

    def __repr__(self) -> str:
        return f"CompiledObjective({self.objective.name or 'custom'})"

    # ------------------------------------------------------------------ the plan

    def readers(self, field: str) -> list[str]:
        """The components that read ``TokenBatch.<field>`` (``["masks[0] (s2t)"]``), so adapters can say who needs what."""
        return self.plan.readers(field)

    def per_micro_batch(self) -> list[str]:
        """Components that compute their statistics within each micro-batch (``selection: micro_batch``), as
        their papers' code does, instead of over the whole step: their results depend on the micro-batch split."""
        return list(self.plan.per_micro_batch)

    def states_needing_whole_step(self) -> list[str]:
        """The stateful components whose step value reads the step's own totals (``["surrogate (bapo)"]``).

        Exact only where the whole optimizer step is gathered before its first micro-batch (an
        adapter's ``optimizer_step`` mode): taken in parts (``gather(..., part_of_step=True)``), they
        would move from the first part alone. Components whose value comes from their state alone
        (adaptive entropy) are not listed: they are exact in parts too.
        """
        return list(self.plan.whole_step)

    def training_batch_components(self) -> list[str]:
        """The components whose state moves once per training batch (``["reweighters[0] (stare)"]``)."""
        return list(self.plan.training_batch)

    # ------------------------------------------------------------------ state

    def state_dict(self) -> dict:
        """The state of stateful components (STARE's controller, BAPO's bounds), for a trainer checkpoint."""
        return self._states.state_dict()

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
        self._states.load_state_dict(state)

    # ------------------------------------------------------------------ phase 1

    def gather(
        self,
        batches: Iterable[TokenBatch],
        *,
        group=None,
        distributed: bool | None = None,
        update_state: bool = True,
        part_of_step: bool = False,
    ) -> StepStats:
        """Statistics of a whole step from all its micro-batches (and all ranks).

        ``batches`` need not carry gradients; ``logprobs`` should be the current policy's (on the
        first update of a step they equal the old log-probabilities, which is what trainers have
        before the first forward). ``distributed``: None = reduce over ``group`` whenever
        ``torch.distributed`` is initialised. Every rank must call this collectively.
        ``update_state``: advance stateful components by one step (call it once per step with
        True; an adapter that gathers per micro-batch passes False on all but the step's first).
        ``part_of_step``: ``batches`` are one part of the step (an adapter that sees one micro-batch
        at a time, passing ``update_state=True`` on the step's first part only). A stateful
        component whose value comes from its state alone (``value_from_state``: adaptive
        entropy) then stays exact: every part takes the value of the state the step began with,
        the parts' totals add up, and it moves once, from their sum, when the next step begins
        (``state_dict()`` counts the step as taken meanwhile). Any other stateful component
        (BAPO's bounds, STARE's gate) moves from the first part alone: adapters refuse it where a
        step has several parts ([`states_needing_whole_step`][rlstab.CompiledObjective.states_needing_whole_step]).

        Inputs are checked as in the loss: a NaN or infinity on a valid token (a reward on a
        response with response tokens) raises ``FloatingPointError`` naming the field, on every
        rank, and a log-prob above 0 or an entropy below 0 beyond rounding a ``BatchError``; on
        padding they are ignored. A gather that raises leaves the components' state as it was.

        An empty step: ``gather([])`` in one process returns empty statistics (zero counts, no
        thresholds, no advantage state) and the state moves as for a step without valid tokens
        (STARE's controller stays as it is; BAPO counts the step, at its starting bounds). Under
        ``torch.distributed``, ``[]`` raises ``BatchError`` before any communication: the other
        ranks would wait in collectives this rank never enters. A rank without data passes one
        empty micro-batch instead (``B = 0`` tensors), which takes part in every collective.

        One ``TokenBatch`` instead of a list raises ``BatchError`` (pass ``[batch]``).
        """
        batches = _micro_batches("gather", batches)
        comm = Comm(group, distributed)
        if not batches and comm.distributed:
            raise BatchError(
                "gather([]) under torch.distributed: this rank would skip the collectives the other ranks enter "
                "(a hang). Pass one empty micro-batch instead (TokenBatch with B = 0 tensors)"
            )

        def gather_step(micro_batches: list[TokenBatch]):
            return self._step_phase.gather(
                [self._tokens(b) for b in micro_batches], comm, update_state, check=True, part_of_step=part_of_step
            )

        def cleaned(micro_batches: list[TokenBatch]) -> list[TokenBatch]:
            return without_bad_padding_on_every_rank(micro_batches, self._inputs.checked_fields, comm)

        # Some rank has an offending input: every rank zeroes its padding (or raises) and redoes the step.
        gathered = retried_without_bad_padding(gather_step, batches, cleaned)
        self._states.commit(gathered.pending)
        return gathered.stats

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
        batches = _micro_batches("begin_training_batch", batches)
        if not self.plan.training_batch:
            return
        comm = Comm(group, distributed)
        if not batches and comm.distributed:
            raise BatchError("begin_training_batch([]) under torch.distributed: pass one empty micro-batch instead")
        self._states.begin_training_batch(self.plan.training_batch, [self._tokens(b) for b in batches], comm)

    # ------------------------------------------------------------------ phase 2

    def __call__(self, batch: TokenBatch, step: StepStats | None = None) -> LossOutput:
        """The loss of one micro-batch: its share of ``step`` (or its own step when None).

        ``step`` must come from this objective's ``gather`` (or that of an objective with the same
        fingerprint); any other raises ``BatchError``. Without ``step`` the micro-batch is its
        own step, and stateful components advance by one step once the loss is computed (not at
        all when it raises).

        On a GPU (see ``defer_checks``) the metrics stay on the device until they are read. With
        ``step``, the call then reads nothing on the host: the input checks (a non-finite value on
        a valid token, a log-prob above 0, a group id the step did not have) raise at the metrics'
        read instead of here. Without ``step``, it reads what its own step's statistics need
        (``docs/gpu.md`` lists those reads).
        """
        defer = self._defers(batch)
        if step is not None:
            self._check_step(step)
        with deferring(defer) as requirements:
            deferred = (requirements, None) if defer else None  # own step: checked by its gather; None: at the read
            if defer and step is not None and isinstance(batch, TokenBatch):
                # A frozen step on the device reads nothing on the host, so it cannot redo itself: the padding
                # zeroed up front (a NaN there changes nothing, as on the other paths), the check of the valid
                # tokens' values left to the metrics' read.
                batch, first_offence = zeroed_up_front(batch, self._inputs.checked_fields(batch))
                deferred = (requirements, first_offence)
            # An offending input (padding included) raises OffendingInputs at the read or in the own step's
            # gather: the padding's offending values zeroed (or the first on a valid token raised), and once more.
            out, pending = retried_without_bad_padding(
                lambda b: self._call(b, step, deferred),
                batch,
                lambda b: without_bad_padding(b, self._inputs.checked_fields(b)),
            )
        self._states.commit(pending)
        return out

    def mask_keeps(self, batch: TokenBatch, step: StepStats | None = None) -> dict[str, torch.Tensor]:
        """Which tokens each mask keeps: mask label -> ``[B, T]`` float, 1.0 on a valid token the mask keeps.

        With the thresholds of ``step`` (this objective's ``gather``), or, without it, of the batch
        as its own step (as ``loss_fn(batch)`` gathers it, but moving no component's state). These are the tokens the
        loss counts in ``mask/<label>/kept``, and a token trains only where every mask keeps it
        (``tokens/kept``). Valid tokens are the batch's response tokens, less those of the groups
        dynamic sampling dropped; for a rollout rejection (a mask whose rejected tokens become
        padding) they are taken before any rejection, and for every other mask after it.

        The shadow masks (``shadow_masks``: measured, not acting) follow the masks, under their
        labels ``shadow/<label>`` (``shadow/s2t``): the tokens each would keep, counted in
        ``shadow/<label>/kept``; they never change which tokens train.
        """
        return {label: counted * keep for label, counted, keep in self._mask_tokens(batch, step)}

    def mask_silences(self, batch: TokenBatch, step: StepStats | None = None) -> dict[str, torch.Tensor]:
        """Which valid tokens each mask silences (``mask/<label>/silenced``): 1.0 where ``mask_keeps`` counts a
        token and does not keep it. Arguments, valid tokens and the shadow masks' labels (``shadow/<label>``,
        the tokens each would silence) as for ``mask_keeps``."""
        return {label: counted * (1 - keep) for label, counted, keep in self._mask_tokens(batch, step)}

    def _mask_tokens(self, batch: TokenBatch, step: StepStats | None) -> list[tuple[str, torch.Tensor, torch.Tensor]]:
        """``(label, the valid tokens it is counted over, its keep)`` per mask."""
        if step is None:
            step = self._step_phase.gather([self._tokens(batch)], Comm(distributed=False)).stats  # nothing committed
        else:
            self._check_step(step)
        t = self._micro_batch_tokens(batch, step)
        rejections = set(self.plan.rejections)
        before = step.step_level.response_tokens(batch)
        keeps = mask_keeps(self.objective, t, step.thresholds)
        shadows = shadow_keeps(self.objective, t, step.thresholds)  # over the valid tokens, as their metrics
        return [(label, before if i in rejections else t.valid, keep)
                for i, (label, keep) in enumerate(zip(self.mask_labels, keeps))] + [
                (label, t.valid, keep) for label, keep in zip(self.plan.shadow_labels, shadows)]

    def _defers(self, batch: TokenBatch) -> bool:
        if self.defer_checks is not None:
            return self.defer_checks
        return isinstance(batch, TokenBatch) and batch.logprobs.device.type != "cpu"

    def _check_step(self, step: StepStats) -> None:
        if not isinstance(step, StepStats):
            raise BatchError(f"step must be the StepStats that gather returned, got {type(step).__name__}")
        if step.fingerprint != self.fingerprint:
            who = f"objective {step.objective_name!r}" if step.fingerprint else "no objective's gather"
            raise BatchError(
                f"these StepStats were gathered by {who}, not by this one ({self._name!r}): gather the step "
                "with the objective whose loss you compute"
            )

    def _call(self, batch: TokenBatch, step: StepStats | None, deferred: Deferred | None) -> tuple[LossOutput, Pending]:
        """The loss and the state updates to commit; ``OffendingInputs`` when a checked input offends (and the
        check is not ``deferred`` with its error: see ``loss_output``)."""
        pending = Pending()
        if step is None:  # its own step: the gather's keeps are this micro-batch's
            t = self._tokens(batch)
            own_check = deferred is not None  # the inputs' check rides on the step counts' transfer
            step, ((keeps, kept_tokens),), pending = self._step_phase.gather([t], Comm(distributed=False), check=own_check)
        else:
            t = self._micro_batch_tokens(batch, step)
            keeps = mask_keeps(self.objective, t, step.thresholds)
            kept_tokens = kept(t, keeps)
        terms = self._loss_phase.terms(batch, t, step, kept_tokens)
        reported = loss_metrics(self.objective, self.plan, batch, t, step, keeps, terms)
        return loss_output(batch, terms.loss, reported, self._inputs.checked_fields(batch), deferred), pending

    def _tokens(self, batch: TokenBatch) -> Tokens:
        """The batch's tokens after the input checks (rejected tokens are padding), without advantages."""
        return self._inputs.tokens(batch)

    def _micro_batch_tokens(self, batch: TokenBatch, step: StepStats) -> Tokens:
        """A micro-batch's tokens within ``step``: its dropped groups padding, its advantages set."""
        t = self._tokens(batch)
        step.step_level.restrict(t)
        self._set_micro_batch_advantages(t, step)
        return t

    def _set_micro_batch_advantages(self, t: Tokens, step: StepStats) -> None:
        set_micro_batch_advantages(self.objective, t, step)


def _micro_batches(method: str, batches: Iterable[TokenBatch]) -> list[TokenBatch]:
    """``batches`` as a list; ``BatchError`` for one ``TokenBatch`` (not iterable) or anything else not iterable."""
    if isinstance(batches, TokenBatch):
        raise BatchError(f"{method} takes a list of the step's micro-batches, got one TokenBatch: pass [batch]")
    try:
        return list(batches)
    except TypeError:
        raise BatchError(
            f"{method} takes a list of the step's micro-batches (TokenBatch), got {type(batches).__name__}"
        ) from None
