"""``report.md`` and ``curves.png`` of a comparison, from ``results.json`` and each run's ``metrics.jsonl``.

The report gives, per regime, a leaderboard (mean and 95% interval over seeds of each summary
metric) and the paired differences against the baseline, and says in words which differences are
distinguishable from zero and which are not. The curves show, per regime (one column each), the
mean over seeds of held-out accuracy, the rollouts' reward, entropy, gradient norm and silenced
tokens with a band: the 95% t interval of the mean at each step. matplotlib is imported only here.
"""

from __future__ import annotations

import math
from pathlib import Path

from rlstab.lab.checkpoint import read_rows
from rlstab.lab.statistics import mean_interval
from rlstab.lab.summary import COLLAPSE_RATIO, TAIL

REPORT_FILE = "report.md"
CURVES_FILE = "curves.png"

_LEADERBOARD = (
    ("final acc", "final_accuracy", 3, 1.0),
    ("acc AUC", "accuracy_auc", 3, 1.0),
    ("final entropy", "final_entropy", 3, 1.0),
    ("min entropy", "min_entropy", 3, 1.0),
    ("grad norm", "mean_grad_norm", 3, 1.0),
    ("silenced %", "mean_silenced_fraction", 3, 100.0),
    ("clipped %", "mean_clip_fraction", 3, 100.0),
    ("ESS/N", "mean_ess_fraction", 3, 1.0),
    ("wall s", "wall_time", 0, 1.0),
)
_PAIRED = (("final acc", "final_accuracy"), ("acc AUC", "accuracy_auc"), ("final entropy", "final_entropy"))


def _num(x, digits: int, scale: float = 1.0) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "–"
    return f"{x * scale:.{digits}f}"


def interval(stat: dict, digits: int = 3, scale: float = 1.0) -> str:
    """``0.512 [0.471, 0.553]``, or the mean alone with one seed, or ``–``."""
    if stat["mean"] is None:
        return "–"
    if stat["low"] is None:
        return _num(stat["mean"], digits, scale)
    return f"{_num(stat['mean'], digits, scale)} [{_num(stat['low'], digits, scale)}, {_num(stat['high'], digits, scale)}]"


def _signed(stat: dict) -> str:
    if stat["mean"] is None:
        return "–"
    if stat["low"] is None:
        return f"{stat['mean']:+.3f}"
    return f"{stat['mean']:+.3f} [{stat['low']:+.3f}, {stat['high']:+.3f}]"


def markdown(data: dict) -> str:
    s = data["settings"]
    n = len(s["seeds"])
    lines = [
        "# rlstab compare report",
        "",
        f"- command: `{data['command'] or '(from Python)'}`",
        f"- {len(s['objectives'])} objectives x {n} seeds ({', '.join(map(str, s['seeds']))}) x {len(s['regimes'])} "
        f"regimes, {s['steps']} RL steps each, model {s['model']}; baseline {s['baseline']}",
        "- software: " + ", ".join(f"{k} {v}" for k, v in data["versions"].items()),
        "- objectives: " + ", ".join(f"{k} ({v['source']}, {v['fingerprint'][:12]})" for k, v in s["objectives"].items()),
        "",
        f"Intervals are 95% Student-t intervals over the {n} seeds (the mean's, not the runs' spread). "
        "Paired differences pair each objective's run with the baseline's of the same seed.",
    ]
    for regime, settings in s["regimes"].items():
        lines += ["", f"## Regime `{regime}`", ""]
        if settings.get("description"):
            lines += [settings["description"].strip(), ""]
        knobs = {k: v for k, v in settings.items() if k not in ("name", "description")}
        lines += ["Settings: " + ", ".join(f"{k} {v}" for k, v in knobs.items() if v is not None), ""]
        agg = data["aggregates"][regime]
        order = sorted(agg, key=lambda label: -(agg[label]["final_accuracy"]["mean"] or -1))
        lines += [
            "| objective | " + " | ".join(h for h, *_ in _LEADERBOARD) + " | collapsed |",
            "|---|" + "---:|" * (len(_LEADERBOARD) + 1),
        ]
        for label in order:
            cells = [interval(agg[label][key], d, scale) for _, key, d, scale in _LEADERBOARD]
            collapsed = agg[label]["collapsed"]
            count = "–" if collapsed["mean"] is None else f"{round(collapsed['mean'] * collapsed['n'])}/{collapsed['n']}"
            lines.append(f"| {label} | " + " | ".join(cells) + f" | {count} |")
        lines += _paired_section(data["paired"][regime], s["baseline"], n)
    lines += ["", "## Definitions", "", *_definitions(), ""]
    return "\n".join(lines)


def _paired_section(paired: dict, baseline: str, n: int) -> list[str]:
    if not paired:
        return []
    lines = [
        "",
        f"Against {baseline}, paired by seed (difference: objective minus baseline; wins/ties/losses over seeds):",
        "",
        "| objective | " + " | ".join(f"Δ {h}" for h, _ in _PAIRED) + " | final acc W/T/L |",
        "|---|" + "---:|" * (len(_PAIRED) + 1),
    ]
    found, none = [], []
    for label, metrics in paired.items():
        acc = metrics["final_accuracy"]
        lines.append(f"| {label} | " + " | ".join(_signed(metrics[k]) for _, k in _PAIRED)
                     + f" | {acc['wins']}/{acc['ties']}/{acc['losses']} |")
        for h, k in _PAIRED:
            d = metrics[k]
            if d["distinguishable"]:
                found.append(f"{label}'s {h} ({_signed(d)})")
            elif d["distinguishable"] is False:
                none.append(f"{label} {h}")
    lines.append("")
    if n < 2:
        lines.append("One seed: no interval, so no difference can be told from noise.")
    elif found:
        lines.append("Distinguishable from zero (95% interval excludes 0): " + "; ".join(found) + ". "
                     f"With {len(paired) * len(_PAIRED)} comparisons here, about {len(paired) * len(_PAIRED) / 20:.1f} "
                     "would be expected by chance alone if no objective differed.")
        lines.append("Not distinguishable from zero: " + (", ".join(none) if none else "none") + ".")
    else:
        lines.append(f"No difference from {baseline} is distinguishable from zero at this number of seeds.")
    return lines


def _definitions() -> list[str]:
    return [
        "- final acc: held-out accuracy (greedy exact match) after the last step; acc AUC: area under the "
        "held-out accuracy curve divided by the steps (mean accuracy over training).",
        f"- final entropy: mean token entropy of the rollouts over the last {TAIL:.0%} of steps; min entropy: the "
        f"lowest step's; collapsed: runs whose final entropy fell below {COLLAPSE_RATIO:g} x the first step's.",
        "- grad norm: mean gradient norm before clipping; silenced %: valid tokens removed by the objective's masks; "
        "clipped %: valid tokens whose gradient the clip removed (high + low + dual); ESS/N: effective sample size of "
        "the rollouts' sequence importance weights pi_old/pi_rollout over the batch (1 on-policy); wall s: seconds "
        "of RL steps and evaluations per run (measured on the machine that ran it).",
    ]


def write(plan, data: dict) -> None:
    (plan.out / REPORT_FILE).write_text(markdown(data))
    write_curves(plan, data, plan.out / CURVES_FILE)


_PANELS = (
    ("accuracy", "held-out accuracy", 1.0),
    ("reward", "mean reward of the step's rollouts", 1.0),
    ("entropy", "entropy (nats/token)", 1.0),
    ("grad_norm", "gradient norm", 1.0),
    ("silenced_fraction", "silenced tokens (%)", 100.0),
)


def curve(rows_by_seed: list[list[dict]], field: str) -> tuple[list[int], list[float], list[float], list[float]]:
    """Steps, mean over seeds, and the 95% interval bounds (the mean where there is one seed)."""
    by_step: dict[int, list[float]] = {}
    for rows in rows_by_seed:
        for r in rows:
            if r.get(field) is not None:
                by_step.setdefault(r["step"], []).append(r[field])
    steps = sorted(by_step)
    stats = [mean_interval(by_step[s]) for s in steps]
    mean = [st["mean"] for st in stats]
    low = [st["low"] if st["low"] is not None else st["mean"] for st in stats]
    high = [st["high"] if st["high"] is not None else st["mean"] for st in stats]
    return steps, mean, low, high


def write_curves(plan, data: dict, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    regimes = list(data["settings"]["regimes"])
    fig, axes = plt.subplots(len(_PANELS), len(regimes), figsize=(4.6 * len(regimes) + 1, 2.6 * len(_PANELS) + 0.6),
                             squeeze=False, sharex="col")
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for col, regime in enumerate(regimes):
        for i, label in enumerate(plan.labels):
            rows_by_seed = [read_rows(plan.out / r["folder"]) for r in data["runs"]
                            if r["regime"] == regime and r["objective"] == label]
            colour = colours[i % len(colours)]
            for row, (field, title, scale) in enumerate(_PANELS):
                ax = axes[row, col]
                x, mean, low, high = curve(rows_by_seed, field)
                ax.plot(x, [m * scale for m in mean], color=colour, linewidth=1.6, label=label,
                        marker="o" if field == "accuracy" else None, markersize=2.5)
                ax.fill_between(x, [v * scale for v in low], [v * scale for v in high], color=colour, alpha=0.18, linewidth=0)
                ax.set_title(f"{regime}: {title}" if row == 0 else title, fontsize=9.5)
                if field == "silenced_fraction":
                    # Silenced shares span 0.001% (STAPO's spurious tokens) to 80% (20-Entropy): a
                    # linear axis shows the small ones as zero. Linear below 0.01%, logarithmic above.
                    ax.set_yscale("symlog", linthresh=0.01)
                ax.grid(alpha=0.3)
        axes[-1, col].set_xlabel("RL step")
    axes[0, 0].legend(fontsize=8, loc="best")
    n = len(data["settings"]["seeds"])
    # Two lines: one regime's column is too narrow for the whole title on one.
    fig.suptitle(f"rlstab compare: mean over {n} seeds\nband = 95% t interval of the mean", fontsize=10.5)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
