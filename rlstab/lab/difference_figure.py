"""``differences.png``: each objective minus its baseline, paired by seed, at every step.

Unpaired bands (``curves.png``) carry each seed's own level, which the pairing removes: two objectives
whose bands overlap almost entirely can still differ on every seed. Here, per regime (one column
each) and per panel (held-out accuracy, entropy), each objective's paired difference from its
baseline is drawn as thin lines, one per seed, and as their mean with its 95% t band (the same
interval as the report's). matplotlib is imported only here and in ``report``.
"""

from __future__ import annotations

from pathlib import Path

from rlstab.errors import count_phrase
from rlstab.lab.axes import integer_steps
from rlstab.lab.checkpoint import read_rows
from rlstab.lab.paired import pairing_of
from rlstab.lab.statistics import mean_interval

DIFFERENCES_FILE = "differences.png"
_PANELS = (("accuracy", "held-out accuracy"), ("entropy", "entropy (nats/token)"))


def paired_curve(rows: dict[int, list[dict]], base: dict[int, list[dict]], field: str) -> dict:
    """``{"steps", "per_seed": {seed: [difference per step]}, "mean", "low", "high"}`` over the steps both runs of a seed report."""
    per_step: dict[int, dict[int, float]] = {}
    for seed, seed_rows in rows.items():
        theirs = {r["step"]: r.get(field) for r in base.get(seed, [])}
        for r in seed_rows:
            if r.get(field) is not None and theirs.get(r["step"]) is not None:
                per_step.setdefault(r["step"], {})[seed] = r[field] - theirs[r["step"]]
    steps = sorted(per_step)
    stats = [mean_interval(list(per_step[s].values())) for s in steps]
    return {
        "steps": steps,
        "per_seed": {seed: [(s, per_step[s][seed]) for s in steps if seed in per_step[s]] for seed in rows},
        "mean": [st["mean"] for st in stats],
        "low": [st["mean"] if st["low"] is None else st["low"] for st in stats],
        "high": [st["mean"] if st["high"] is None else st["high"] for st in stats],
    }


def write_differences(out: Path, data: dict, path: Path) -> Path | None:
    """Draw the figure from the runs' rows under ``out``; None (nothing written) when no objective has a baseline."""
    pairing = pairing_of(data)
    if not pairing:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    regimes = list(data["settings"]["regimes"])
    fig, axes = plt.subplots(len(_PANELS), len(regimes), figsize=(4.6 * len(regimes) + 1, 2.8 * len(_PANELS) + 0.8),
                             squeeze=False, sharex="col")
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]

    def rows_of(regime, label):
        return {r["seed"]: read_rows(Path(out) / r["folder"]) for r in data["runs"]
                if r["regime"] == regime and r["objective"] == label}

    for col, regime in enumerate(regimes):
        for i, (label, base) in enumerate(pairing.items()):
            mine, theirs = rows_of(regime, label), rows_of(regime, base)
            colour = colours[i % len(colours)]
            for row, (field, title) in enumerate(_PANELS):
                ax = axes[row, col]
                c = paired_curve(mine, theirs, field)
                for points in c["per_seed"].values():
                    ax.plot([s for s, _ in points], [d for _, d in points], color=colour, linewidth=0.6, alpha=0.35)
                ax.plot(c["steps"], c["mean"], color=colour, linewidth=1.6, label=f"{label} - {base}")
                ax.fill_between(c["steps"], c["low"], c["high"], color=colour, alpha=0.18, linewidth=0)
                ax.axhline(0.0, color="black", linewidth=0.8)
                ax.set_title(f"{regime}: {title}" if row == 0 else title, fontsize=9.5)
                ax.grid(alpha=0.3)
        integer_steps(axes[-1, col])  # shared by the column: a run of 3 steps has no tick at 0.5
        axes[-1, col].set_xlabel("RL step")
    axes[0, 0].legend(fontsize=8, loc="best")
    n = len(data["settings"]["seeds"])
    fig.suptitle(f"rlstab compare: objective minus its baseline, paired by seed ({count_phrase(n, 'seed')})\n"
                 "thin: each seed; thick: mean, band = 95% paired t interval", fontsize=10.5)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
