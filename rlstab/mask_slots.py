"""An objective's mask slots: the components' labels, the slots' order, and what a counted mask's ``match`` names.

A *slot* is a mask or a shadow mask: the masks first, labelled by kind (``s2t``, or ``s2t_0`` and
``s2t_1`` when a kind appears twice), then the shadow masks, labelled ``shadow/<kind>`` the same
way. The order is that of ``StepStats.thresholds``. A counted mask (``random_silence``) names the
slot it matches by index into ``masks`` or by label.

The data model (``rlstab.Objective``) validates its matches with these rules, and the compiler's
``Plan`` (``rlstab.compiler.plan``) labels its metrics and finds its matches with them:
a leaf that imports nothing of rlstab, so that the objective depends on no part of the compiler.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol


class WithMasks(Protocol):
    """What these rules read of an objective: its masks and its shadow masks (each with a ``kind``)."""

    @property
    def masks(self) -> Sequence[Any]: ...

    @property
    def shadow_masks(self) -> Sequence[Any]: ...


def component_labels(kinds: list[str]) -> tuple[str, ...]:
    """Metric labels: the kind, suffixed with its position when a kind appears twice (``s2t``, ``s2t_0``)."""
    return tuple(k if kinds.count(k) == 1 else f"{k}_{i}" for i, k in enumerate(kinds))


def shadow_labels(objective: WithMasks) -> tuple[str, ...]:
    """The shadow masks' labels: ``shadow/`` and the kind, suffixed with its position when a kind appears twice."""
    return tuple(f"shadow/{label}" for label in component_labels([m.kind for m in objective.shadow_masks]))


def mask_slots(objective: WithMasks) -> list[tuple[str, Any]]:
    """``(label, mask)`` for the masks, then the shadow masks (``shadow/<label>``): the order of ``StepStats.thresholds``."""
    o = objective
    return list(zip(component_labels([m.kind for m in o.masks]), o.masks)) + list(zip(shadow_labels(o), o.shadow_masks))


def matched_slot(objective: WithMasks, match: int | str | None) -> int | None:
    """The slot a ``match`` names: an index into ``masks``, or a label of ``mask_slots``; None when none."""
    if match is None:
        return None
    if isinstance(match, int):
        return match if 0 <= match < len(objective.masks) else None
    labels = [label for label, _ in mask_slots(objective)]
    return labels.index(match) if match in labels else None


def match_problems(objective: WithMasks) -> list[tuple[tuple, str, Any]]:
    """``(path, message, value)`` for each shadow mask that cannot be one and each ``match`` that names no matchable mask."""
    problems = []
    slots = mask_slots(objective)
    fields = [("masks", i) for i in range(len(objective.masks))] + [("shadow_masks", i) for i in range(len(objective.shadow_masks))]
    for i, m in enumerate(objective.shadow_masks):
        if getattr(m, "acts_on_valid", False):
            problems.append((("shadow_masks", i), f"a {m.kind} that turns rejected tokens into padding cannot be a shadow "
                                                  "mask (it would change every population and denominator)", m.kind))
    for (_, m), path in zip(slots, fields):
        if not getattr(m, "counted", False) or getattr(m, "match", None) is None:
            continue
        j = matched_slot(objective, m.match)
        allowed = ", ".join(repr(lb) for lb, other in slots if not getattr(other, "counted", False)) or "none"
        if j is None:
            problems.append(((*path, "match"), f"names no mask of this objective (allowed: {allowed}, or an index into masks)",
                             m.match))
        elif getattr(slots[j][1], "counted", False):
            problems.append(((*path, "match"), f"names {slots[j][0]!r}, itself a counted mask; allowed: {allowed}", m.match))
        elif getattr(slots[j][1], "acts_on_valid", False):
            problems.append(((*path, "match"), f"names {slots[j][0]!r}, a rollout rejection whose rejected tokens become "
                                               "padding, never candidates", m.match))
    return problems
