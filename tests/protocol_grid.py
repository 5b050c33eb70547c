"""A small grid under a protocol, for the lab's analysis and report tests: four arms of a dose-response x 3 seeds,
with their summaries and per-step rows, and a protocol with a gate, a primary metric and a trend test."""

from rlstab.lab.protocol import Gate, Protocol, Trend

LABELS = ["dapo", "low", "stapo", "high"]
DOSES = {"dapo": 0.0, "low": 0.002, "stapo": 0.01, "high": 0.05}


def grid():
    """Four arms x 3 seeds: the metric rises by 0.01 per dose rank on every seed (plus the seed's own level), except
    that `low` is dapo's very run on seed 0. Each run's rows: 2 steps, stapo's mask `s2t` silencing 1 and 0 of 1000."""
    runs, rows = [], {}
    for label in LABELS:
        rank = LABELS.index(label)
        for seed in range(3):
            same = label == "low" and seed == 0
            ratio = 0.3 + 0.1 * seed + (0.0 if same else 0.01 * rank + 0.001 * seed * rank)
            runs.append({"regime": "r", "objective": label, "seed": seed, "folder": f"runs/r/{label}/seed{seed}",
                         "summary": {"accuracy_auc": 0.5 + (0 if same else 0.01 * rank * (seed + 1)),
                                     "final_accuracy": 0.5, "entropy_ratio": ratio,
                                     "final_entropy": 0.2, "start_entropy": 0.4, "wall_time": 1.0 + seed}})
            masks = {"s2t": {"kept_fraction": 0.999, "silenced": 1.0}} if label == "stapo" else {}
            step_rows = [{"step": 0, "accuracy": 0.5}]
            for step in (1, 2):
                silenced = masks and step == 1
                step_rows.append({"objective": label, "step": step, "reward": ratio if not same else 0.3 + 0.1 * seed,
                                  "masks": {k: {**v, "silenced": 1.0 if silenced else 0.0} for k, v in masks.items()},
                                  "loss": {"tokens/valid": 1000.0}, "time": 0.1 * step})
            rows["r", label, seed] = step_rows
    return runs, rows


PROTOCOL = Protocol(baseline="dapo", gates={"stapo": Gate(mask="s2t", at_least=1e-3, on_share_of_steps=0.5)},
                    primary=["entropy_ratio"],
                    trend=Trend(arms=LABELS, doses=[DOSES[a] for a in LABELS], metric="entropy_ratio"))
