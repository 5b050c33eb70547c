"""Firing gates: the protocol's check, written before the runs, that a treatment's mask acts in its arm's runs.

A gate ``{mask, at_least, on_share_of_steps}`` of arm A (``rlstab.lab.protocol.Gate``) passes when, over
the RL steps of A's runs pooled over the seeds, the share of steps on which the mask silences at least
``at_least`` of the step's valid tokens is at least ``on_share_of_steps``. From each step's metrics row
(``rlstab.trainer.rows``):

- the step's silenced fraction is ``silenced / tokens/valid``: an acting mask's ``masks[<label>].silenced``,
  a shadow mask's ``loss["shadow/<label>/silenced"]``, over ``loss["tokens/valid"]`` (both summed over
  the step's micro-batches and optimizer updates, so the fraction is the step's); a step without valid
  tokens silences nothing;
- a step *fires* when that fraction is at least ``at_least``.

The outcome gives the pooled share of firing steps, the same per seed, and the median silenced
fraction over the pooled steps (half the steps silence at most that much). A gate's mask that no row
of its arm reports (a label the objective does not have, or runs recorded without it) is a
``ProtocolMismatch``, not a failed gate.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence

from rlstab.lab.protocol import Gate, ProtocolMismatch


def silenced_fraction(row: dict, mask: str) -> float | None:
    """The share of the step's valid tokens ``mask`` silenced in metrics row ``row``; None when the row does not report it."""
    loss = row.get("loss", {})
    if mask.startswith("shadow/"):
        count = loss.get(f"{mask}/silenced")
    else:
        count = row.get("masks", {}).get(mask, {}).get("silenced")
    if count is None:
        return None
    valid = loss.get("tokens/valid")
    return count / valid if valid else 0.0


def gate_outcome(arm: str, gate: Gate, rows_by_seed: dict[int, Sequence[dict]]) -> dict:
    """The outcome of ``arm``'s ``gate`` over its runs' rows ``{seed: rows}``: passed, the pooled and per-seed share of
    firing steps and the median silenced fraction."""
    pooled: list[float] = []
    per_seed = []
    for seed in sorted(rows_by_seed):
        fractions = [f for r in rows_by_seed[seed] if r["step"] > 0
                     for f in [silenced_fraction(r, gate.mask)] if f is not None]
        firing = sum(f >= gate.at_least for f in fractions)
        per_seed.append({"seed": seed, "steps": len(fractions), "firing_steps": firing,
                         "share": firing / len(fractions) if fractions else None})
        pooled += fractions
    if not pooled:
        raise ProtocolMismatch(f"protocol gates.{arm}.mask = {gate.mask!r}: no step of {arm}'s runs reports that mask "
                               f"(reported: {', '.join(reported_masks(rows_by_seed)) or 'none'})")
    firing = sum(f >= gate.at_least for f in pooled)
    share = firing / len(pooled)
    return {
        "arm": arm, **gate.model_dump(),
        "steps": len(pooled), "firing_steps": firing, "share": share,
        "median_fraction": statistics.median(pooled),
        "per_seed": per_seed,
        "passed": share >= gate.on_share_of_steps,
    }


def reported_masks(rows_by_seed: dict[int, Sequence[dict]]) -> list[str]:
    """Every mask label the rows report: acting masks by label, shadow masks as ``shadow/<label>``."""
    labels: dict[str, None] = {}
    for rows in rows_by_seed.values():
        for r in rows:
            labels.update(dict.fromkeys(r.get("masks", {})))
            labels.update(dict.fromkeys(k.removesuffix("/silenced") for k in r.get("loss", {})
                                        if k.startswith("shadow/") and k.endswith("/silenced")))
    return list(labels)


def gate_outcomes(gates: dict[str, Gate], runs: Sequence[dict], regime: str,
                  rows: dict[tuple[str, str, int], list[dict]]) -> list[dict]:
    """Every gate's outcome under ``regime``, from ``results.json``'s ``runs`` and their rows by ``(regime, objective, seed)``."""
    out = []
    for arm, gate in gates.items():
        seeds = [r["seed"] for r in runs if r["regime"] == regime and r["objective"] == arm]
        if not seeds:
            raise ProtocolMismatch(f"protocol gates.{arm}: {arm!r} has no runs under regime {regime}")
        out.append(gate_outcome(arm, gate, {seed: rows[regime, arm, seed] for seed in seeds}))
    return out
