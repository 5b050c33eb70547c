"""The composed objective as a readable formula with every parameter (``rlstab explain``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rlstab.compiler.plan import Plan

if TYPE_CHECKING:
    from rlstab.objective import Objective

UNNAMED = "no name: set `name:` and `description:`; an objective that `extends:` another does not take its parent's"


def explain(objective: Objective, source: str | None = None, trainer: str | None = None) -> str:
    """The composed objective as a readable formula with every parameter (what ``rlstab explain`` prints).

    Its first line is the objective's name, or ``source`` (where it was loaded from, a file) and how to
    name it. ``trainer`` (``verl``, ``trl``, ``trl-async``, ``openrlhf``): where each part runs with that trainer, and
    what its adapter refuses and needs. Reads the objective and its [`Plan`][rlstab.compiler.plan.Plan]:
    no torch.
    """
    o, plan = objective, Plan.of(objective)
    lines = [o.name or f"{source or 'objective'} ({UNNAMED})"]
    if o.description:
        lines.append(f"  {o.description}")
    lines += [str(dropped) for dropped in o.dropped]  # what a list of its extends chain replaced without keeping
    lines.append("")
    term = ("M * " if o.masks else "") + ("W * " if o.reweighters else "") + "l(r, A)"
    regs = "".join(f" + {getattr(r, 'coefficient_symbol', f'{r.coef:g}')} * Agg_valid(R{i})" for i, r in enumerate(o.regularisers))
    lines.append(f"L = Agg[ {term} ]{regs}")
    lines.append(f"  r   = exp(clamp(logp - old_logp, -{o.log_ratio_clamp:g}, {o.log_ratio_clamp:g}))")
    lines.append(f"  A   = {o.advantage.describe()}")
    lines.append("        (used when the trainer supplies no advantages)")
    if o.masks:
        lines.append("  M   = AND of:")
        for i, m in enumerate(o.masks):
            lines.append(f"        masks[{i}] {m.describe()}")
    if o.shadow_masks:
        lines.append("  shadow masks (measured, not acting: shadow/<label>/kept, /silenced):")
        for label, m in zip(plan.shadow_labels, o.shadow_masks):
            lines.append(f"        {label} {m.describe()}")
    if o.reweighters:
        lines.append("  W   = product of:")
        for i, w in enumerate(o.reweighters):
            lines.append(f"        reweighters[{i}] {w.describe()}")
    lines.append(f"  l   = {o.surrogate.describe()}")
    lines.append(f"  Agg = {o.aggregation.describe()}")
    for i, r in enumerate(o.regularisers):
        lines.append(f"  R{i}  = {r.describe()}")
    for i, shaping in enumerate(o.reward_shaping):
        lines.append(f"  reward_shaping[{i}] {shaping.describe()}")
    if o.group_filter is not None:
        lines.append(f"  group_filter {o.group_filter.describe()}")
    if o.lr_scale is not None:
        lines.append(f"  lr_scale {o.lr_scale.describe()}")
    if o.dual_stream is not None:
        lines.append(f"  dual_stream {o.dual_stream.describe()}")
    if o.sampler is not None:
        lines.append(f"  sampler {o.sampler.describe()}")
    if o.rollout is not None:
        lines.append(f"  rollout {o.rollout.describe()}")
    lines.append("  Step statistics (quantiles, group statistics, denominators) span every micro-batch and rank of the step.")
    local = plan.per_micro_batch
    if local:
        lines.append(f"  Computed within each micro-batch instead (as in the papers' code): {', '.join(local)}.")
    lines.append("")
    lines += trainer_lines(o, trainer)
    return "\n".join(lines)


def trainer_lines(o: Objective, trainer: str | None = None) -> list[str]:
    """The batch fields ``o`` reads, where each part runs, and with ``trainer`` what that trainer refuses and needs."""
    from rlstab.adapters import trainers
    from rlstab.adapters.placement import LEGEND, batch_fields, placement

    lines = ["Batch fields it reads (TokenBatch):"]
    lines += [f"  {line}" for line in batch_fields(o)]
    lines.append("")
    if trainer is None:
        lines.append(f"Where each part runs ({LEGEND}):")
    else:
        lines.append(f"Where each part runs with {trainers.trainer(trainer).name}:")
    lines += [f"  {layer:<8} {parts}: {where}" for layer, parts, where in placement(o, trainer)]
    if trainer is not None:
        name = trainers.trainer(trainer).name
        problems, settings = trainers.problems(o, trainer), trainers.settings(o, trainer)
        lines.append("")
        lines.append(f"{name} refuses:" if problems else f"{name} refuses nothing of it.")
        lines += [f"  {line}" for line in problems]
        if settings:
            lines.append(f"{name} needs:")
            lines += [f"  {line}" for line in settings]
            lines += trainers.paste_block(o, trainer)
    return lines
