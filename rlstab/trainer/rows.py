"""The rows of ``metrics.jsonl``: one for the start (step 0) and one per RL step, the same in the demo and the lab."""

from __future__ import annotations

from collections.abc import Sequence


def step_row(objective: str, step: int, metrics: dict, accuracy: float | None, mask_labels: Sequence[str]) -> dict:
    """The ``metrics.jsonl`` row of one step: fixed fields first, then the loss's own metrics."""
    loss = metrics["loss_metrics"]
    valid = loss["tokens/valid"]
    row = {
        "objective": objective,
        "step": step,
        "reward": metrics["reward"],
        "accuracy": accuracy,
        "entropy": metrics["entropy"],
        "response_length": metrics["response_length"],
        "grad_norm": metrics["grad_norm"],
        "kept_fraction": loss["tokens/kept_fraction"],
        "silenced": valid - loss["tokens/kept"],
        "silenced_fraction": (valid - loss["tokens/kept"]) / valid if valid else 0.0,
        "clip_high_fraction": loss.get("clip/high_fraction", 0.0),
        "clip_low_fraction": loss.get("clip/low_fraction", 0.0),
        "clip_dual_fraction": loss.get("clip/dual_fraction", 0.0),
        "masks": {
            label: {"kept_fraction": loss[f"mask/{label}/kept_fraction"], "silenced": loss[f"mask/{label}/silenced"]}
            for label in mask_labels
        },
        "loss": {k: v for k, v in loss.items() if not k.startswith("mask/")},
        "zero_variance_groups": metrics["zero_variance_groups"],
    }
    if metrics["layers"]:
        row["layers"] = metrics["layers"]
    if "mechanism" in metrics:  # TrainConfig.instruments
        row["mechanism"] = metrics["mechanism"]
    return row


def start_row(objective: str, accuracy: float) -> dict:
    """Step 0: the warm-started policy before any update (only the held-out accuracy is measured)."""
    return {"objective": objective, "step": 0, "accuracy": accuracy}
