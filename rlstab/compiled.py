"""A compiled objective: the torch loss, and the two-phase step API.

Phase 1, [`CompiledObjective.gather`][rlstab.CompiledObjective.gather]: over every micro-batch of an optimizer step (and every
data-parallel rank), compute what depends on the whole step — advantages' group statistics, mask
thresholds (entropy quantiles), and the denominators — and freeze them in a [`StepStats`][rlstab.StepStats].

Phase 2, ``loss_fn(micro_batch, step=stats)``: each micro-batch's share of the step loss. Summing
the micro-batch losses (and averaging gradients over ranks, as DDP/FSDP do) gives exactly the
loss and gradients of the whole step computed at once, whatever the micro-batch size and the
number of ranks.

Called without ``step``, a micro-batch is its own step (statistics local to it, no communication).

The policy-gradient term never builds an autograd graph: each surrogate returns its derivative in
closed form and ``_PrecomputedGrad`` hands it to autograd, so the backward pass is a single
multiply (see ``benchmarks/loss_overhead.py``).
"""

from __future__ import annotations

import copy
from collections.abc import Iterable
from dataclasses import dataclass

import torch

from rlstab.advantages import Given
from rlstab.aggregation import StepCounts
from rlstab.batch import BatchError, LossOutput, TokenBatch
from rlstab.comm import Comm
from rlstab.objective import Objective
from rlstab.quantile import Population
from rlstab.step import StepLevel, fit_step_level, shaped_rewards
from rlstab.tokens import Tokens


@dataclass(frozen=True)
class StepStats:
    """Statistics of a whole step, frozen before the micro-batch losses run.

    Attributes:
        counts: the denominators (kept and valid tokens and responses, padded length, world size).
        thresholds: one per mask: its threshold (0-d tensor) or None; a tuple of them (each or None)
            for a mask whose ``quantile_request`` returns a list of requests.
        advantage: the fitted estimator state, or None when the batches carried advantages.
        hooks: one step value per reweighter, then one for the surrogate (``begin_step``'s result).
        step_level: the step-level decisions (groups dropped by dynamic sampling, the ESS scale).
    """

    counts: StepCounts
    thresholds: tuple[torch.Tensor | None, ...]
    advantage: object | None
    hooks: tuple = ()
    step_level: StepLevel = StepLevel()

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
    """The loss of an [`Objective`][rlstab.Objective]: ``loss_fn(batch, step=None) -> LossOutput``."""

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
        for name in ("group_filter", "lr_scale"):
            if getattr(objective, name) is not None:
                step_level.append((f"{name} ({getattr(objective, name).kind})", getattr(objective, name)))
        for who, c in step_level:
            self._reads += [(who, f) for f in sorted(c.reads)]

    def __repr__(self) -> str:
        return f"CompiledObjective({self.objective.name or 'custom'})"

    # ------------------------------------------------------------------ state

    def state_dict(self) -> dict:
        """The state of stateful components (STARE's controller, BAPO's bounds), for a trainer checkpoint."""
        return {label: copy.deepcopy(state) for label, state in self._states.items() if state is not None}

    def load_state_dict(self, state: dict) -> None:
        """Restore ``state_dict()``; refuses a state saved from a different objective."""
        expected = {label for label, s in self._states.items() if s is not None}
        if set(state) != expected:
            raise ValueError(
                f"state of components {sorted(state)} does not fit this objective's stateful components {sorted(expected)}"
            )
        for label, value in state.items():
            self._states[label] = copy.deepcopy(value)
            self._step_start_states[label] = copy.deepcopy(value)

    def per_micro_batch(self) -> list[str]:
        """Components that compute their statistics within each micro-batch (``selection: micro_batch``), as
        their papers' code does, instead of over the whole step: their results depend on the micro-batch split."""
        components = [(f"masks[{i}] ({m.kind})", m) for i, m in enumerate(self.masks)]
        components += self._hooked
        return [label for label, c in components if getattr(c, "selection", None) == "micro_batch"]

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

    def _checked_fields(self, batch: TokenBatch) -> list[str]:
        names = ["logprobs"]
        if batch.old_logprobs is not None:
            names.append("old_logprobs")
        names.append("advantages" if batch.advantages is not None else "rewards")
        if batch.is_weights is not None:
            names.append("is_weights")
        read = {f for _, f in self._reads} - {"advantages"}
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
        """
        tokens = [self._tokens(b) for b in batches]
        stats, _ = self._gather_tokens(tokens, Comm(group, distributed), update_state)
        return stats

    def _gather_tokens(self, tokens: list[Tokens], comm: Comm, update_state: bool = True):
        """Step statistics, plus each micro-batch's per-mask keeps and kept tokens (reused by the own-step path)."""
        step_level = fit_step_level(self.objective, tokens, comm)  # first: dropped groups become padding
        advantage_state = self._set_step_advantages(tokens, comm)
        hooks = self._begin_step(tokens, comm, update_state)
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
        masked, local = [], torch.zeros(4, dtype=torch.float64)
        max_length = 0
        for t in tokens:
            keeps = self._mask_keeps(t, thresholds)
            kept = _kept(t, keeps)
            masked.append((keeps, kept))
            valid_rows, kept_rows = t.valid.sum(-1), kept.sum(-1)
            local += torch.stack(
                [valid_rows.sum(), kept_rows.sum(), (valid_rows > 0).sum(), (kept_rows > 0).sum()]
            ).to(device="cpu", dtype=torch.float64)
            max_length = max(max_length, t.valid.shape[-1])
        device = tokens[0].valid.device if tokens else torch.device("cpu")
        totals = comm.sum(local.to(device)).tolist()
        max_length = int(comm.max(torch.tensor(max_length, device=device)))
        counts = StepCounts(*totals, max_length=max_length, world_size=comm.world_size)
        return StepStats(counts, tuple(thresholds), advantage_state, hooks, step_level), masked

    def _begin_step(self, tokens: list[Tokens], comm: Comm, update_state: bool) -> tuple:
        values = []
        for label, component in self._hooked:
            parts = [component.step_sums(t) for t in tokens]
            sums = None
            if tokens and parts[0] is not None:
                sums = comm.sum(torch.stack(parts).sum(0))
            # A later gather of the same step (update_state=False) starts from the state the step started from.
            before = self._states[label] if update_state else self._step_start_states.get(label, self._states[label])
            value, state = component.begin_step(sums, before)
            if update_state:
                self._step_start_states[label] = before
                self._states[label] = state
            values.append(value)
        return tuple(values)

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
        lengths = comm.cat(torch.cat([t.valid.sum(-1) for t in tokens]))
        state = est.fit(rewards, group_ids, lengths)
        for t in tokens:
            t.set_advantages(est.apply(state, shaped_rewards(self.objective, t.batch), t.batch.group_ids))
        return state

    def _mask_keeps(self, t: Tokens, thresholds) -> list[torch.Tensor]:
        return [m.keep(t, thr) for m, thr in zip(self.masks, thresholds)]

    # ------------------------------------------------------------------ phase 2

    def __call__(self, batch: TokenBatch, step: StepStats | None = None) -> LossOutput:
        """The loss of one micro-batch: its share of ``step`` (or its own step when None)."""
        out = self._call(batch, step)
        if isinstance(out, LossOutput):
            return out
        out = self._call(self._without_bad_padding(batch, out), step)
        assert isinstance(out, LossOutput), "non-finite inputs remained after zeroing the padding"
        return out

    def _call(self, batch: TokenBatch, step: StepStats | None) -> LossOutput | list[str]:
        t = self._tokens(batch)
        if step is None:
            step, ((keeps, kept),) = self._gather_tokens([t], Comm(distributed=False))
        else:
            step.step_level.restrict(t)
            self._set_micro_batch_advantages(t, step)
            keeps = self._mask_keeps(t, step.thresholds)
            kept = _kept(t, keeps)
        return self._loss(batch, t, step, keeps, kept)

    def _set_micro_batch_advantages(self, t: Tokens, step: StepStats) -> None:
        batch = t.batch
        if step.advantage is not None:
            if batch.advantages is not None:
                raise BatchError("the step's advantages were estimated, but this micro-batch carries its own")
            rewards = shaped_rewards(self.objective, batch)
            t.set_advantages(self.objective.advantage.apply(step.advantage, rewards, batch.group_ids))
        else:
            if batch.advantages is None:
                raise BatchError("the step was gathered from batches with advantages; this one has none")
            t.set_advantages(batch.advantages)

    def _loss(self, batch: TokenBatch, t: Tokens, step: StepStats, keeps, kept) -> LossOutput | list[str]:
        """The loss and metrics; the list of checked fields instead when an input is not finite."""
        obj = self.objective
        counts = step.counts
        names: list[str] = []
        values: list[torch.Tensor] = []

        def metric(name: str, value) -> None:
            names.append(name)
            values.append(value if isinstance(value, torch.Tensor) else torch.tensor(float(value)))

        n_valid = t.valid.sum()
        n_valid_safe = n_valid.clamp(min=1.0)
        valid_flat = t.valid.view(-1)
        if self._rejections:  # their counts are over the tokens before any rejection
            before_flat = step.step_level.response_tokens(batch).view(-1)
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
        weight = kept * agg.scale(counts, row_tokens)
        if batch.is_weights is not None:
            w = batch.is_weights.detach().to(torch.float32)
            weight = weight * (w.unsqueeze(-1) if w.dim() == 1 else w)
        if len(step.hooks) != len(self._hooked):
            raise BatchError("these StepStats were not gathered by this objective (their component hooks differ)")
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
            reg_weight = t.valid * self._regulariser_aggregation.scale(counts, t.valid.sum(-1))
            for label, reg in zip(self.regulariser_labels, obj.regularisers):
                value = (reg.term(batch, t) * reg_weight).sum()
                loss = loss + reg.coef * value
                metric(f"loss/{label}", value.detach())

        metric("tokens/valid", n_valid)
        metric("tokens/kept", n_kept)
        metric("tokens/kept_fraction", n_kept / n_valid_safe)
        metric("step/tokens_valid", counts.tokens_valid)
        metric("step/tokens_kept", counts.tokens_kept)
        for name, value in step.step_level.metrics(obj).items():
            metric(name, value)
        for name, count in result.counts.items():
            metric(name, count / n_valid_safe)
        metric("approx_kl", -torch.dot(valid_flat, t.log_ratio.reshape(-1)) / n_valid_safe)
        adv = t.advantage_rows  # [B, 1]: sum over rows of valid tokens x advantage, without a [B, T] copy
        adv_sum = torch.dot(t.valid.sum(-1), adv[:, 0]) if adv.shape[-1] == 1 else torch.dot(valid_flat, adv.reshape(-1))
        metric("advantage/mean", adv_sum / n_valid_safe)
        if t.entropy is not None:
            metric("entropy/mean", torch.dot(valid_flat, t.entropy.reshape(-1)) / n_valid_safe)

        # Input checks ride on the metrics' host transfer: one sync per micro-batch.
        checked = self._checked_fields(batch)
        # min and max are finite iff every value is (NaN propagates); a sum could overflow.
        tensors = [getattr(batch, f).detach() for f in checked]
        extremes = [v for x in tensors if x.numel() for v in torch.aminmax(x)]
        device = t.valid.device
        host = torch.stack([v.detach().to(device, torch.float32).reshape(()) for v in values + [loss] + extremes])
        host = host.tolist()
        if not all(map(_finite, host[len(names) + 1 :])):
            return checked
        metrics = dict(zip(names, host[: len(names)]))
        metrics["loss"] = host[len(names)]
        if not _finite(metrics["loss"]):
            raise FloatingPointError(f"the loss is not finite although every input is; metrics: {metrics}")
        return LossOutput(loss=loss, metrics=metrics)

    @staticmethod
    def _without_bad_padding(batch: TokenBatch, checked: list[str]) -> TokenBatch:
        """Zero non-finite inputs on padding; non-finite inputs on valid tokens are an error."""
        mask = batch.response_mask
        replace = {}
        for name in checked:
            value = getattr(batch, name)
            bad = ~torch.isfinite(value.detach().to(torch.float32))  # as the loss will see it
            if not bad.any():
                continue
            on_valid = bad & (mask.any(-1) if value.dim() == 1 else mask)
            if on_valid.any():
                where = on_valid.nonzero()[0].tolist()
                raise FloatingPointError(
                    f"TokenBatch.{name} has {int(on_valid.sum())} value(s) on valid tokens that are not finite in float32 "
                    f"(first at index {where}: {value[tuple(where)].item()})"
                )
            replace[name] = torch.where(bad, torch.zeros((), dtype=value.dtype, device=value.device), value)
        fields = {f: getattr(batch, f) for f in batch.__dataclass_fields__}
        fields.update(replace)
        return TokenBatch(**fields)


def _kept(t: Tokens, keeps: list[torch.Tensor]) -> torch.Tensor:
    """1.0 on valid tokens that every mask keeps."""
    kept = t.valid.clone()
    for k in keeps:
        kept.mul_(k)
    return kept


def _finite(x: float) -> bool:
    return x == x and x not in (float("inf"), float("-inf"))
