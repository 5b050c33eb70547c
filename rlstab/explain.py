"""The composed objective as a readable formula with every parameter (``rlstab explain``)."""

from __future__ import annotations

from rlstab.objective import Objective


def explain(objective: Objective) -> str:
    o = objective
    lines = []
    if o.name:
        lines.append(o.name)
    if o.description:
        lines.append(f"  {o.description}")
    lines.append("")
    term = ("M * " if o.masks else "") + ("W * " if o.reweighters else "") + "l(r, A)"
    regs = "".join(f" + {r.coef:g} * Agg_valid(R{i})" for i, r in enumerate(o.regularisers))
    lines.append(f"L = Agg[ {term} ]{regs}")
    lines.append(f"  r   = exp(clamp(logp - old_logp, -{o.log_ratio_clamp:g}, {o.log_ratio_clamp:g}))")
    lines.append(f"  A   = {o.advantage.describe()}")
    lines.append("        (used when the trainer supplies no advantages)")
    if o.masks:
        lines.append("  M   = AND of:")
        for i, m in enumerate(o.masks):
            lines.append(f"        masks[{i}] {m.describe()}")
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
    lines.append("  Step statistics (quantiles, group statistics, denominators) span every micro-batch and rank of the step.")
    local = o.compile().per_micro_batch()
    if local:
        lines.append(f"  Computed within each micro-batch instead (as in the papers' code): {', '.join(local)}.")
    return "\n".join(lines)
