"""rlstab's metrics under veRL's names, in veRL's own logging.

The policy loss returns ``(loss, metrics)``; verl averages every metric over micro-batches and
ranks and logs it with its own loggers. So verl's standard policy metrics are filled from the
objective's, and every rlstab metric is added under ``actor/rlstab/``.
"""

from __future__ import annotations

PREFIX = "actor/rlstab/"


def verl_metrics(metrics: dict[str, float]) -> dict[str, float]:
    """verl's standard policy metrics, then every rlstab metric under ``actor/rlstab/``.

    ``actor/pg_clipfrac``: tokens clipped by the PPO range (either side); ``actor/pg_clipfrac_lower``:
    negative-advantage tokens bounded by dual-clip; ``actor/ppo_kl``: mean of -log r. verl averages
    these over micro-batches and ranks, so counts under ``actor/rlstab/`` are per micro-batch.
    """
    out = {
        "actor/pg_clipfrac": metrics.get("clip/high_fraction", 0.0) + metrics.get("clip/low_fraction", 0.0),
        "actor/ppo_kl": metrics["approx_kl"],
        "actor/pg_clipfrac_lower": metrics.get("clip/dual_fraction", 0.0),
    }
    out.update({f"{PREFIX}{name}": value for name, value in metrics.items() if name != "loss"})
    return out
