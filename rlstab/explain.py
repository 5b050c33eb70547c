"""The composed objective as a readable formula with every parameter (``rlstab explain``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the objective explains itself (Objective.explain): no import back at run time
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
        for label, m in zip(o.plan().shadow_labels, o.shadow_masks):
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
    local = o.plan().per_micro_batch
    if local:
        lines.append(f"  Computed within each micro-batch instead (as in the papers' code): {', '.join(local)}.")
    lines.append("")
    lines.append("Where each part runs:")
    lines += [f"  {layer:<8} {parts}: {where}" for layer, parts, where in placement(o)]
    return "\n".join(lines)


_EVERY_TRAINER = "the compiled loss, in any trainer (embedded, veRL, OpenRLHF, TRL)"
_EMBEDDED = "rlstab's embedded trainer (demo, lab)"


def placement(o: Objective) -> list[tuple[str, str, str]]:
    """``(layer, parts, who executes them)`` for each layer the objective uses: loss, step, sampler, rollout."""
    loss = ["surrogate", "aggregation"] + [n for n in ("masks", "shadow_masks", "reweighters", "regularisers") if getattr(o, n)]
    rows = [("loss", ", ".join(loss), _EVERY_TRAINER)]
    step = ["advantage (step statistics)"] + [n for n in ("reward_shaping", "group_filter") if getattr(o, n)]
    rows.append(("step", ", ".join(step), "gather, over every micro-batch and rank, in any trainer"))
    if o.advantage.kind == "opob":
        rows.append(("step", "advantage (opob) gradient norms", f"{_EMBEDDED}; refused by the adapters"))
    if o.advantage.kind in ("opo", "grpo_passk"):  # baselines over all of a prompt's rollouts (trainer_parts)
        rows.append(("step", f"advantage ({o.advantage.kind}) rollout groups",
                     f"{_EMBEDDED} (mini-batches of whole groups); veRL's driver (algorithm.adv_estimator="
                     f"{o.advantage.kind}); refused by OpenRLHF and TRL"))
    if o.advantage.kind in ("optimal_token_baseline", "tir_optimal_token_baseline"):  # reads sum_pi_squared
        rows.append(("step", f"advantage ({o.advantage.kind}) input sum_pi_squared",
                     f"{_EMBEDDED}'s old-policy pass; veRL's driver (algorithm.adv_estimator={o.advantage.kind}, "
                     "actor_rollout_ref.actor.calculate_sum_pi_squared=True); refused by OpenRLHF and TRL"))
    for who in o.plan().readers("proxy_logprobs"):  # Lp-Reg: the old policy's min-p proxy needs the whole vocabulary
        rows.append(("loss", f"{who} input proxy_logprobs", f"{_EMBEDDED}'s old-policy pass; refused by the adapters"))
    if o.lr_scale is not None:
        rows.append(("step", "lr_scale", f"the trainer's optimizer step: {_EMBEDDED}; refused by the adapters"))
    if o.dual_stream is not None:
        rows.append(("loss", "dual_stream", f"the compiled loss, fed branch rows: {_EMBEDDED}, or an agent loop through "
                                           "the Python API; refused by the adapters"))
    if o.sampler is not None:
        rows.append(("sampler", o.sampler.kind, f"{_EMBEDDED}; veRL's legacy trainer through its dataset hook "
                                                "(rlstab.adapters.verl.sampler.GoldilocksDataset); refused by OpenRLHF and TRL"))
    if o.rollout is not None:
        rows.append(("rollout", o.rollout.kind, f"{_EMBEDDED}; veRL needs an agent loop (the authors' recipe); "
                                                "refused by the adapters"))
    return rows
