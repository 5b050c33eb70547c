"""Where each part of an objective runs, and which batch fields it reads: the end of ``rlstab explain``.

Read from [`trainers`][rlstab.adapters.trainers], the description the adapters' start-up checks
use, so ``explain`` never says a trainer runs what its adapter refuses. Torch-free.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rlstab.adapters import trainers
from rlstab.adapters.trainer_parts import ROLLOUT_GROUP_ESTIMATORS, TOKEN_BASELINES
from rlstab.compiler.plan import Plan

if TYPE_CHECKING:
    from rlstab.objective import Objective

EMBEDDED = "embedded"
LEGEND = "embedded is rlstab's own trainer, as in demo, audit and lab"
ALWAYS = "logprobs, response_mask, old_logprobs, advantages"


def batch_fields(o: Objective) -> list[str]:
    """One line per group of ``TokenBatch`` fields the objective reads, with who reads them."""
    lines = [f"{ALWAYS}: every objective (and is_weights, when a trainer passes them)"]
    readers: dict[str, list[str]] = {}
    for who, field in Plan.of(o).reads:
        if who not in readers.setdefault(field, []):
            readers[field].append(who)
    fields: dict[tuple[str, ...], list[str]] = {}  # fields read by the same components on one line
    for field, who in readers.items():
        fields.setdefault(tuple(who), []).append(field)
    lines += [f"{', '.join(names)}: {', '.join(who)}" for who, names in fields.items()]
    own = sorted(set(o.advantage.reads) - {"advantages"})
    if own:
        lines.append(f"{', '.join(own)}: advantage ({o.advantage.kind}), only for a batch without advantages")
    return lines


def placement(o: Objective, trainer: str | None = None) -> list[tuple[str, str, str]]:
    """``(layer, parts, who executes them)`` per group of parts: the loss, the step, the sampler, the rollout.

    Without ``trainer``: the trainers that run the parts (``embedded`` and each adapter that
    does not refuse them) and those that refuse them. With ``trainer`` (``verl``, ``trl``, ``trl-async``,
    ``openrlhf``): whether that trainer runs them.
    """
    chosen = trainers.trainer(trainer) if trainer is not None else None
    refused = {t.name: {part for part, _ in trainers.refusals(o, t.key)} for t in trainers.TRAINERS.values()}

    def refusing(parts: list[str]) -> list[str]:
        return [name for name, labels in refused.items() if labels.intersection(parts)]

    def where(how: str, parts: list[str]) -> str:
        names = refusing(parts)
        if chosen is not None:
            return f"refused by {chosen.name} (below)" if chosen.name in names else f"{how}, in {chosen.name}"
        ok = [EMBEDDED] + [name for name in refused if name not in names]
        return f"{how}: {', '.join(ok)}" + (f"; refused by {', '.join(names)}" if names else "")

    loss = [f"surrogate ({o.surrogate.kind})", f"aggregation ({o.aggregation.kind})"]
    loss += [f"masks[{i}] ({m.kind})" for i, m in enumerate(o.masks)]
    loss += [f"shadow_masks[{i}] ({m.kind})" for i, m in enumerate(o.shadow_masks)]
    loss += [f"reweighters[{i}] ({w.kind})" for i, w in enumerate(o.reweighters)]
    loss += [f"regularisers[{i}] ({r.kind})" for i, r in enumerate(o.regularisers)]
    if o.dual_stream is not None:
        loss.append(f"dual_stream ({o.dual_stream.kind})")
    if chosen is not None:  # one trainer: group by whether it refuses
        def grouping(parts: list[str]) -> bool:
            return chosen.name in refusing(parts)
    else:
        grouping = refusing
    rows = [("loss", ", ".join(group), where("the compiled loss", group)) for group in _grouped(loss, grouping)]
    if chosen is not None:  # its step scopes (without a trainer the formula's last line says where they span)
        default, *others = chosen.step_statistics
        rows.append(("step", "step statistics", f"{chosen.name}'s step_statistics: {default} (default), "
                     f"{', '.join(others)}; optimizer_step spans every micro-batch and rank of the step"))
    advantage = f"advantage ({o.advantage.kind})"
    rows.append(("step", advantage, _advantage_where(o.advantage.kind, chosen, refusing([advantage]))))
    step = [f"reward_shaping[{i}] ({c.kind})" for i, c in enumerate(o.reward_shaping)]
    step += [f"{name} ({getattr(o, name).kind})" for name in ("group_filter", "lr_scale") if getattr(o, name) is not None]
    rows += [("step", ", ".join(group), where("the trainer's step", group)) for group in _grouped(step, grouping)]
    if o.sampler is not None:
        how = "which prompts each step draws (veRL: its dataset hook, rlstab.adapters.verl.sampler)"
        rows.append(("sampler", o.sampler.kind, where(how, [f"sampler ({o.sampler.kind})"])))
    if o.rollout is not None:
        rows.append(("rollout", o.rollout.kind, where("how rollouts are generated", [f"rollout ({o.rollout.kind})"])))
    return rows


def _grouped(parts: list[str], key) -> list[list[str]]:
    """``parts`` in order, consecutive ones with the same ``key([part])`` (the trainers refusing it) in one group."""
    groups: list[list[str]] = []
    last = None
    for part in parts:
        value = key([part])
        if groups and value == last:
            groups[-1].append(part)
        else:
            groups.append([part])
        last = value
    return groups


def _advantage_where(kind: str, chosen, names: list[str]) -> str:
    """Who computes the advantages: the embedded trainer runs the estimator; an adapter's trainer passes its own."""

    verl_own = kind in TOKEN_BASELINES or kind in ROLLOUT_GROUP_ESTIMATORS
    extra = ", actor_rollout_ref.actor.calculate_sum_pi_squared=True" if kind in TOKEN_BASELINES else ""
    verl = f"veRL computes it in its driver (algorithm.adv_estimator={kind}{extra})"
    if chosen is not None:
        if chosen.name in names:
            return f"refused by {chosen.name} (below)"
        if chosen.key == "verl" and verl_own:
            return verl
        return f"{chosen.name} computes its own advantages and passes them; the estimator runs only for a batch without them"
    ok = [t.name for t in trainers.TRAINERS.values() if t.name not in names]
    parts = [f"the estimator: {EMBEDDED}"]
    if verl_own and "veRL" in ok:
        parts.append(verl)
        ok.remove("veRL")
    if ok:
        parts.append(f"{', '.join(ok)} compute{'s' if len(ok) == 1 else ''} {'its' if len(ok) == 1 else 'their'} own "
                     f"advantages and pass{'es' if len(ok) == 1 else ''} them")
    return "; ".join(parts) + (f"; refused by {', '.join(names)}" if names else "")
