"""The plan of an objective: what its compiled loss will read, label and keep state for, without torch.

Made once from an [`Objective`][rlstab.Objective] (``Plan.of(objective)``), immutable. The compiled
loss holds it, ``rlstab explain`` reads it, and the adapters' config checks ask it which
components read a trainer's tensor, so that checking a config imports no torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rlstab.mask_slots import component_labels, mask_slots, matched_slot, shadow_labels

if TYPE_CHECKING:
    from rlstab.objective import Objective


@dataclass(frozen=True)
class Plan:
    """What an objective's loss reads and keeps, by component (labels as in error messages: ``masks[0] (s2t)``).

    Attributes:
        mask_labels: the masks' metric labels, in order (``mask/<label>/kept``): the kind, suffixed
            with the position when two masks have the same kind.
        reweighter_labels: the reweighters' (``reweight/<label>/mean``).
        regulariser_labels: the regularisers' (``loss/<label>``).
        reads: ``(component, TokenBatch field)`` for every field a component of the loss or of the
            step level reads (the advantage estimator's own inputs are not in it: it runs only for
            batches without advantages).
        stateful: the components with step-level behaviour, in ``StepStats.hooks`` order: every
            reweighter, then the surrogate, then every regulariser.
        training_batch: those of them whose state moves once per training batch.
        whole_step: those of them with a state whose step value reads the step's own totals (not
            ``value_from_state``): exact only when the whole step is gathered before its first micro-batch.
        per_micro_batch: components that compute their statistics within each micro-batch.
        rejections: indices of the masks whose rejected tokens become padding (``acts_on_valid``).
        shadow_labels: the shadow masks' labels, in order, with their prefix (``shadow/s2t``): their
            metrics are ``shadow/<label>/kept``, and ``mask_keeps`` returns them under these labels.
        matches: per mask slot (the masks, then the shadow masks): the slot whose silenced tokens a
            counted mask matches (``random_silence``'s ``match``), or None.
    """

    mask_labels: tuple[str, ...]
    reweighter_labels: tuple[str, ...]
    regulariser_labels: tuple[str, ...]
    reads: tuple[tuple[str, str], ...]
    stateful: tuple[str, ...]
    training_batch: tuple[str, ...]
    per_micro_batch: tuple[str, ...]
    rejections: tuple[int, ...]
    whole_step: tuple[str, ...] = ()
    shadow_labels: tuple[str, ...] = ()
    matches: tuple[int | None, ...] = ()

    @classmethod
    def of(cls, objective: Objective) -> Plan:
        """The plan of ``objective``, from its components' declarations (``reads``, ``state_cadence``, ...)."""
        o = objective
        masks = [(f"masks[{i}] ({m.kind})", m) for i, m in enumerate(o.masks)]
        reweighters = [(f"reweighters[{i}] ({w.kind})", w) for i, w in enumerate(o.reweighters)]
        surrogate = (f"surrogate ({o.surrogate.kind})", o.surrogate)
        regularisers = [(f"regularisers[{i}] ({r.kind})", r) for i, r in enumerate(o.regularisers)]
        shadows = [(f"shadow_masks[{i}] ({m.kind})", m) for i, m in enumerate(o.shadow_masks)]
        step_level = [(f"reward_shaping[{i}] ({c.kind})", c) for i, c in enumerate(o.reward_shaping)]
        step_level += [(f"{name} ({getattr(o, name).kind})", getattr(o, name))
                       for name in ("group_filter", "lr_scale", "dual_stream") if getattr(o, name) is not None]
        readers = masks + shadows + reweighters + [surrogate] + regularisers + step_level
        hooked = reweighters + [surrogate] + regularisers
        return cls(
            mask_labels=component_labels([m.kind for m in o.masks]),
            reweighter_labels=component_labels([w.kind for w in o.reweighters]),
            regulariser_labels=component_labels([r.kind for r in o.regularisers]),
            reads=tuple((who, field) for who, c in readers for field in sorted(c.reads)),
            stateful=tuple(label for label, _ in hooked),
            training_batch=tuple(label for label, c in hooked if c.state_cadence() == "training_batch"),
            per_micro_batch=tuple(label for label, c in masks + shadows + reweighters + [surrogate]
                                  if _selection(c) == "micro_batch"),
            rejections=tuple(i for i, m in enumerate(o.masks) if getattr(m, "acts_on_valid", False)),
            whole_step=tuple(label for label, c in hooked if c.initial_state() is not None and not c.value_from_state()),
            shadow_labels=shadow_labels(o),
            matches=tuple(matched_slot(o, m.match) if getattr(m, "counted", False) else None for _, m in mask_slots(o)),
        )

    def readers(self, field: str) -> list[str]:
        """The components that read ``TokenBatch.<field>`` (``["masks[0] (s2t)"]``), so adapters can say who needs what."""
        return [who for who, name in self.reads if name == field]

    @property
    def reads_rewards(self) -> bool:
        """Whether a component reads ``rewards`` (otherwise rewards beside advantages are ignored)."""
        return bool(self.readers("rewards"))


def _selection(component: Any) -> str | None:
    return getattr(component, "selection", None)
