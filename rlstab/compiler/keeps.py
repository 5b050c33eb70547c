"""Which tokens the masks keep: each mask evaluated on a batch's tokens, and the tokens every mask keeps.

A mask's ``keep(t, threshold)`` is ``[B, T]`` 0/1 over the tokens ``t``; with the step thresholds
of ``StepStats.thresholds`` (the masks' first, then the shadow masks'), ``mask_keeps`` and
``shadow_keeps`` evaluate them, and ``kept`` multiplies the keeps into the tokens that train:

    kept = valid * prod_m keep_m.

A rollout rejection (a mask with ``acts_on_valid``) is evaluated before any threshold, on the
batch's response tokens: ``without_rejected`` makes the tokens it rejects padding.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rlstab.lazy import torch
from rlstab.tokens import Tokens

if TYPE_CHECKING:
    from rlstab.objective import Objective


def kept(t: Tokens, keeps: list[torch.Tensor]) -> torch.Tensor:
    """``[B, T]`` float: 1.0 on the valid tokens that every one of ``keeps`` keeps (``t.valid`` itself without
    masks: never modify it in place)."""
    if not keeps:
        return t.valid
    out = t.valid * keeps[0]
    for k in keeps[1:]:
        out.mul_(k)
    return out


def without_rejected(t: Tokens, rejections: list) -> None:
    """Make the tokens that a rollout rejection of ``rejections`` rejects padding, in place (no threshold:
    a rejection's rule is its own); nothing without rejections."""
    if rejections:
        t.valid = kept(t, [m.keep(t, None) for m in rejections])
        t.valid_bool = t.valid > 0


def mask_keeps(objective: Objective, t: Tokens, thresholds) -> list[torch.Tensor]:
    """``[B, T]`` 0/1 per mask: the tokens it keeps, with its step threshold (``StepStats.thresholds``)."""
    return [m.keep(t, thr) for m, thr in zip(objective.masks, thresholds[:len(objective.masks)])]


def shadow_keeps(objective: Objective, t: Tokens, thresholds) -> list[torch.Tensor]:
    """``[B, T]`` 0/1 per shadow mask: the tokens it would keep (it does not act), with its step threshold."""
    return [m.keep(t, thr) for m, thr in zip(objective.shadow_masks, thresholds[len(objective.masks):])]
