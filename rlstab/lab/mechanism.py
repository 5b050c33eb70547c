"""What a grid's per-step rows say about a mask's mechanism: the gradient share of its silenced tokens, and
whether it predicts the next step's entropy change.

From ``steps.json``'s rows of one objective (runs with ``instruments`` on: each step's row has
``mechanism.masks[label] = {"share", "cosine", "silenced"}``, ``rlstab.trainer.mechanism``):

- ``mean_share``: the mean over every step of every seed of ``share`` (the norm of the silenced
  tokens' summed gradient over the full gradient's, in the trained parameters), over the steps
  where it is defined (a full gradient of norm 0 leaves it None); ``silencing_steps``: the steps
  where the mask silenced at least one token, of ``steps`` in all; ``mean_share_when_silencing``: the
  mean share over those steps only (what the silenced tokens carry when there are any);
- ``next_entropy_pearson``: Pearson's correlation, over the steps t of every seed pooled, of the
  share at step t with the relative change of the rollouts' entropy from step t to t + 1,
  ``(H_{t+1} - H_t) / H_t``; ``pairs``: how many steps entered it. A negative value means a larger
  share goes with a larger entropy drop next step.

``compact`` drops the per-step logit-gradient bins (their correlations stay), which make up most
of a grid's rows, for publishing ``steps.json`` beside its results.
"""

from __future__ import annotations

from collections.abc import Sequence

from rlstab.lazy import torch
from rlstab.trainer.mechanism.logit_grad import pearson


def mechanism_summary(runs: Sequence[dict], objective: str, label: str) -> dict:
    """The summary above of mask ``label`` (``"shadow/s2t_0"``) in ``objective``'s runs of ``steps.json``."""
    shares, when, pairs, steps, silencing = [], [], [], 0, 0
    for run in runs:
        if run["objective"] != objective:
            continue
        rows = sorted((r for r in run["rows"] if r["step"] > 0), key=lambda r: r["step"])
        for row, after in zip(rows, rows[1:] + [None]):
            measured = row.get("mechanism", {}).get("masks", {}).get(label)
            if measured is None:
                continue
            steps += 1
            silencing += measured["silenced"] > 0
            share = measured["share"]
            if share is None:
                continue
            shares.append(share)
            if measured["silenced"] > 0:
                when.append(share)
            if after is not None and row["entropy"]:
                pairs.append((share, (after["entropy"] - row["entropy"]) / row["entropy"]))
    x = torch.tensor([p[0] for p in pairs], dtype=torch.float64)
    y = torch.tensor([p[1] for p in pairs], dtype=torch.float64)
    return {
        "steps": steps,
        "silencing_steps": silencing,
        "mean_share": sum(shares) / len(shares) if shares else None,
        "mean_share_when_silencing": sum(when) / len(when) if when else None,
        "next_entropy_pearson": pearson(x, y),
        "pairs": len(pairs),
    }


def compact(steps: dict) -> dict:
    """``steps.json`` without the per-step logit-gradient bins (their Pearson and Spearman correlations stay)."""
    runs = []
    for run in steps["runs"]:
        rows = []
        for row in run["rows"]:
            grad = row.get("mechanism", {}).get("logit_grad")
            if grad is not None:
                kept = {k: v for k, v in grad.items() if k not in ("probability_bins", "entropy_bins")}
                row = {**row, "mechanism": {**row["mechanism"], "logit_grad": kept}}
            rows.append(row)
        runs.append({**run, "rows": rows})
    return {**steps, "runs": runs}
