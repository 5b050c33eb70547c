"""``report.md`` and ``curves.png`` of a comparison, from ``results.json`` and each run's ``metrics.jsonl``.

The report gives, per regime, a leaderboard (mean and 95% interval over seeds of each summary
metric, ordered by the accuracy AUC), the protocol's firing gates with their outcomes (and its
fallback when one fails), and every paired comparison of an objective with its baseline: the
difference with its 95% interval, wins/ties/losses, the effective n (the seeds where the two runs
differ), the raw p of the paired t-test, the Holm-adjusted p over the comparison's family (all the
report's comparisons, or its primary and its secondary ones when the protocol names primary metrics),
and the minimum detectable effect at 80% power under Holm, from the t-test's exact (noncentral t) power
(``rlstab.lab.statistics``, ``rlstab.lab.power``); then the protocol's trend test, and the (objective,
seed) runs identical to their baseline's. In words, it calls a difference distinguishable only when its
Holm p is below 0.05.
The curves show, per regime (one column each), the mean over seeds of held-out accuracy, the
rollouts' reward, entropy, gradient norm and silenced tokens with a band: the 95% t interval of the
mean at each step (``differences.png``, in ``rlstab.lab.difference_figure``, shows the paired
differences). matplotlib is imported only here and there.
"""

from __future__ import annotations

import math
from pathlib import Path

from rlstab.errors import count_phrase
from rlstab.lab.axes import integer_steps, percent_axis
from rlstab.lab.checkpoint import read_rows
from rlstab.lab.no_ops import ROWS
from rlstab.lab.paired import NAMES, pairing_of
from rlstab.lab.power import mde_factor
from rlstab.lab.statistics import ALPHA, POWER, mean_interval
from rlstab.lab.summary import COLLAPSE_RATIO, TAIL

REPORT_FILE = "report.md"
CURVES_FILE = "curves.png"

_LEADERBOARD = (
    ("acc AUC", "accuracy_auc", 3, 1.0),
    ("final acc", "final_accuracy", 3, 1.0),
    ("entropy ratio", "entropy_ratio", 3, 1.0),
    ("final entropy", "final_entropy", 3, 1.0),
    ("min entropy", "min_entropy", 3, 1.0),
    ("grad norm", "mean_grad_norm", 3, 1.0),
    ("silenced %", "mean_silenced_fraction", 3, 100.0),
    ("clipped %", "mean_clip_fraction", 3, 100.0),
    ("ESS/N", "mean_ess_fraction", 3, 1.0),
    ("wall s", "wall_time", 0, 1.0),
)
_COLLAPSED_AFTER = "entropy_ratio"  # the collapse count sits beside the ratio it thresholds


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


def p_value(p: float | None) -> str:
    """``0.0253``, ``<0.0001``, or ``–``."""
    if p is None or math.isnan(p):
        return "–"
    return "<0.0001" if p < 0.0001 else f"{p:.4f}"


def _collapsed(stat: dict) -> str:
    return "–" if stat["mean"] is None else f"{round(stat['mean'] * stat['n'])}/{stat['n']}"


def markdown(data: dict) -> str:
    s = data["settings"]
    n = len(s["seeds"])
    pairing = pairing_of(data)
    own = {k: v for k, v in pairing.items() if v != s["baseline"]}
    count = sum(d.get("p") is not None for regime in data["paired"].values() for m in regime.values() for d in m.values())
    count += sum(t.get("p") is not None for t in data.get("trend", {}).values())
    found = {d["family"]: d["m"] for regime in data["paired"].values() for m in regime.values() for d in m.values()}
    found.update({t["family"]: t["m"] for t in data.get("trend", {}).values()})
    families = {name: found[name] for name in _FAMILIES if name in found}
    lines = [
        "# rlstab compare report",
        "",
        f"- command: `{data['command'] or '(from Python)'}`",
        f"- {count_phrase(len(s['objectives']), 'objective')} x {count_phrase(n, 'seed')} ({', '.join(map(str, s['seeds']))}) x "
        f"{count_phrase(len(s['regimes']), 'regime')}, {count_phrase(s['steps'], 'RL step')} each, model {s['model']}; baseline {s['baseline']}"
        + ("; paired instead: " + ", ".join(f"{k} with {v}" for k, v in own.items()) if own else ""),
        "- software: " + ", ".join(f"{k} {v}" for k, v in data["versions"].items()),
        "- objectives: " + ", ".join(f"{k} ({v['source']}, {v['fingerprint'][:12]})" for k, v in s["objectives"].items()),
    ]
    if data.get("restated"):
        lines.append(f"- statistics: {data['restated']}")
    lines += [
        "",
        f"Intervals are 95% Student-t intervals over the {count_phrase(n, 'seed')} (the mean's, not the runs' spread). "
        "Paired differences pair each objective's run with its baseline's of the same seed. "
        f"p is the two-sided paired t-test's; Holm p is Holm's step-down adjustment over {_family_words(families, count)}; "
        f"a difference is called distinguishable only when its Holm p is below {ALPHA:g}. "
        "n eff (effective n) counts the seeds where the objective's run is not identical to its baseline's "
        f"(compared by their {_no_ops(data)['compared']}); on the others the difference is a zero by construction. "
        f"MDE (Holm, m) is the smallest true difference the two-sided paired t-test of the n eff seeds would detect "
        f"with {POWER:.0%} power at Holm's first step over the comparison's family of m, two-sided alpha {ALPHA:g} / m: "
        "d x sd, sd the paired differences' standard deviation over those seeds and d the effect whose exact power, "
        "P(|T'| > t(1 - alpha / (2m), n-1)) with T' noncentral t (n-1 degrees of freedom, noncentrality d sqrt(n)), "
        f"is {POWER:.0%}.{_factor_words(data)} Holm's first step is the Bonferroni level, so this is the MDE of the "
        "comparison Holm tests first, a lower bound on the others'.",
    ]
    for regime, settings in s["regimes"].items():
        lines += ["", f"## Regime `{regime}`", ""]
        if settings.get("description"):
            lines += [settings["description"].strip(), ""]
        knobs = {k: v for k, v in settings.items() if k not in ("name", "description")}
        lines += ["Settings: " + ", ".join(f"{k} {v}" for k, v in knobs.items() if v is not None), ""]
        lines += _leaderboard(data["aggregates"][regime])
        lines += _gates_section(data, regime)
        lines += _paired_section(data["paired"][regime], pairing, n, data.get("trend", {}).get(regime))
        lines += _no_op_lines(data, regime, pairing, n)
    lines += ["", "## Definitions", "", *_definitions(), ""]
    return "\n".join(lines)


def _leaderboard(agg: dict) -> list[str]:
    headers = []
    for h, key, *_ in _LEADERBOARD:
        headers.append(h)
        if key == _COLLAPSED_AFTER:
            headers.append(f"collapsed (ratio < {COLLAPSE_RATIO:g})")
    lines = ["| objective | " + " | ".join(headers) + " |", "|---|" + "---:|" * len(headers)]
    order = sorted(agg, key=lambda label: -(agg[label]["accuracy_auc"]["mean"] or -1))
    for label in order:
        cells = []
        for _, key, digits, scale in _LEADERBOARD:
            cells.append(interval(agg[label][key], digits, scale) if key in agg[label] else "–")
            if key == _COLLAPSED_AFTER:
                cells.append(_collapsed(agg[label]["collapsed"]))
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return lines


_FAMILIES = ("all", "primary", "secondary")
_FAMILY_TITLES = {
    "primary": "Primary comparisons: Holm's family of the protocol's primary metrics{trend}, m = {m} over the report",
    "secondary": "Secondary comparisons: a Holm family of their own, m = {m} over the report",
}


def _family_words(families: dict[str, int], count: int) -> str:
    if set(families) <= {"all"}:
        return f"all {count} paired comparisons of this report"
    parts = [f"the {m} {name} comparisons" for name, m in families.items()]
    return "each family of this report separately (" + " and ".join(parts) + ")"


def _factor_words(data: dict) -> str:
    """`` Here d is 1.995 at n = 8, m = 18; 13.895 at n = 3, m = 18.``: d at each distinct (n eff, m) of the report's
    MDEs, once each, by m and then by n descending; nothing where there is no MDE."""
    tests = [d for regime in data["paired"].values() for metrics in regime.values() for d in metrics.values()]
    tests += list(data.get("trend", {}).values())
    found = {(d["n_effective"], d["m"]) for d in tests if d.get("mde") is not None}
    if not found:
        return ""
    return " Here d is " + "; ".join(f"{mde_factor(n, ALPHA / max(m, 1)):.3f} at n = {n}, m = {m}"
                                     for n, m in sorted(found, key=lambda nm: (nm[1], -nm[0]))) + "."


def _no_ops(data: dict) -> dict:
    return data.get("no_ops") or {"compared": "run summaries", "seeds": {}}


def _mde_cell(d: dict) -> str:
    return "–" if d.get("mde") is None else f"{d['mde']:.3f}"


def _paired_section(paired: dict, pairing: dict, n: int, trend: dict | None = None) -> list[str]:
    if not paired and trend is None:
        return []
    rows: dict[str, list[tuple[str, str, dict]]] = {}
    for label, metrics in paired.items():
        for key, d in metrics.items():
            rows.setdefault(d["family"], []).append((label, key, d))
    if trend is not None:
        rows.setdefault("primary", [])
    lines = ["", "Paired by seed (difference: objective minus its baseline; wins/ties/losses over seeds):"]
    found, raw_only, none = [], [], []
    for family in _FAMILIES:
        if family not in rows:
            continue
        members = rows[family]
        m = members[0][2]["m"] if members else trend["m"]
        if family != "all":
            title = _FAMILY_TITLES[family].format(m=m, trend=" and the trend test" if family == "primary" and trend else "")
            lines += ["", title + ":"]
        if members:
            lines += [
                "",
                f"| objective | baseline | metric | difference [95% interval] | W/T/L | n eff | p | Holm p | MDE (Holm, m = {m}) |",
                "|---|---|---|---:|---:|---:|---:|---:|---:|",
            ]
        for label, key, d in members:
            lines.append(f"| {label} | {pairing.get(label, '–')} | {NAMES.get(key, key)} | {_signed(d)} | "
                         f"{d['wins']}/{d['ties']}/{d['losses']} | {d['n_effective']} | {p_value(d.get('p'))} | "
                         f"{p_value(d.get('p_holm'))} | {_mde_cell(d)} |")
        if family == "primary" and trend is not None:
            lines += _trend_table(trend)
            members = [*members, ("trend", trend["metric"], trend)]
        for label, key, d in members:
            metric = NAMES.get(key, key)
            name, plain = ((f"the {metric} dose trend",) * 2 if label == "trend"
                           else (f"{label}'s {metric}", f"{label} {metric}"))
            tag = "" if family == "all" else f"{family}: "
            if d["distinguishable"]:
                found.append(f"{name} ({tag}{_signed(d)}, Holm p {p_value(d.get('p_holm'))})")
            elif d.get("p") is not None and d["p"] < ALPHA:
                raw_only.append(f"{name} ({tag}p {p_value(d['p'])}, Holm p {p_value(d['p_holm'])})")
            elif d["distinguishable"] is False:
                none.append(plain + ("" if family == "all" else f" ({family})"))
    lines.append("")
    if n < 2:
        lines.append("One seed: no interval, so no difference can be told from noise.")
        return lines
    lines.append("Distinguishable after Holm's correction: " + ("; ".join(found) if found else "none") + ".")
    if raw_only:
        lines.append(f"Below {ALPHA:g} before the correction only, so not distinguishable: " + "; ".join(raw_only) + ".")
    lines.append("Not distinguishable, p at or above " + f"{ALPHA:g}: " + (", ".join(none) if none else "none") + ".")
    return lines


def _trend_table(t: dict) -> list[str]:
    arms = ", ".join(f"{arm} ({dose:g})" for arm, dose in zip(t["arms"], t["doses"]))
    weights = ", ".join(f"{w:+g}" for w in t["weights"])
    return [
        "",
        f"Dose trend, fixed in the protocol: per seed, the least-squares slope of the {NAMES.get(t['metric'], t['metric'])} "
        f"on the centred dose ranks ({weights}) of {arms}; a one-sample t-test of the slopes over the seeds.",
        "",
        f"| trend | metric | slope per dose step [95% interval] | W/T/L | n | p | Holm p | MDE (Holm, m = {t['m']}) |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
        f"| {' < '.join(t['arms'])} | {NAMES.get(t['metric'], t['metric'])} | {_signed(t)} | "
        f"{t['wins']}/{t['ties']}/{t['losses']} | {t['n']} | {p_value(t.get('p'))} | {p_value(t.get('p_holm'))} | {_mde_cell(t)} |",
    ]


def _no_op_lines(data: dict, regime: str, pairing: dict, n: int) -> list[str]:
    """One line per objective whose run is its baseline's on some seeds: which seeds, and its effective n."""
    no_ops = _no_ops(data)
    how = ("identical per-step rows, the wall-clock time and the fields named by mask labels aside"
           if no_ops["compared"] == ROWS else "identical run summaries, the wall time aside; the per-step rows were not stored")
    lines = []
    for label, seeds in no_ops["seeds"].get(regime, {}).items():
        if not seeds:
            continue
        left = n - len(seeds)
        what = ("it never differs from its baseline here, so these runs say nothing about its effect" if left == 0 else
                f"its MDE counts only the {count_phrase(left, 'seed')} where it differs")
        lines.append(f"No-op seeds: {label}'s runs are {pairing.get(label, '–')}'s on {count_phrase(len(seeds), 'seed')} "
                     f"({', '.join(map(str, seeds))}; {how}): effective n {left} of {n}; {what}.")
    return [""] + lines if lines else []


def _percent(x: float | None) -> str:
    return "–" if x is None else f"{100 * x:.4g}%"


def _gates_section(data: dict, regime: str) -> list[str]:
    """The protocol's gates under ``regime``: each one's outcome, and the fallback when one fails."""
    outcomes = data.get("gates", {}).get(regime)
    if not outcomes:
        return []
    lines = [
        "",
        "Gates, fixed in the protocol before the runs: each arm's mask silences at least the given share of a step's "
        "valid tokens on at least the given share of its steps (pooled over the seeds):",
        "",
        "| arm | mask | silences at least | on at least | steps where it does | median silenced | per seed | outcome |",
        "|---|---|---:|---:|---:|---:|---|---|",
    ]
    for g in outcomes:
        per_seed = ", ".join(f"{s['seed']}: {_percent(s['share'])}" for s in g["per_seed"])
        lines.append(f"| {g['arm']} | {g['mask']} | {_percent(g['at_least'])} | {_percent(g['on_share_of_steps'])} | "
                     f"{_percent(g['share'])} ({g['firing_steps']} of {g['steps']}) | {_percent(g['median_fraction'])} | "
                     f"{per_seed} | {'passed' if g['passed'] else '**failed**'} |")
    failed = [g["arm"] for g in outcomes if not g["passed"]]
    lines.append("")
    if not failed:
        lines.append("Every gate passed.")
        return lines
    fallback = (data["settings"].get("protocol") or {}).get("fallback")
    lines.append(f"Failed: {', '.join(failed)}. The protocol's fallback, written before the runs: "
                 + (" ".join(fallback.split()) if fallback else "none was written."))
    return lines


def _definitions() -> list[str]:
    return [
        "- acc AUC (the leaderboard's order, and the primary metric where the protocol names none): area under the held-out accuracy curve divided by the steps (mean accuracy "
        "over training); final acc: held-out accuracy (greedy exact match) after the last step, a single evaluation.",
        f"- final entropy: mean token entropy of the rollouts over the last {TAIL:.0%} of steps; min entropy: the "
        f"lowest step's; entropy ratio: final entropy / step 1's; collapsed: runs whose entropy ratio is below "
        f"{COLLAPSE_RATIO:g} (a threshold: read the ratio and its interval first).",
        "- grad norm: mean gradient norm before clipping; silenced %: valid tokens removed by the objective's masks; "
        "clipped %: valid tokens whose gradient the clip removed (high + low + dual); ESS/N: effective sample size of "
        "the rollouts' sequence importance weights pi_old/pi_rollout over the batch (1 on-policy); wall s: seconds "
        "of RL steps and evaluations per run (measured on the machine that ran it).",
    ]


def write(plan, data: dict) -> None:
    from rlstab.lab.difference_figure import DIFFERENCES_FILE, write_differences

    (plan.out / REPORT_FILE).write_text(markdown(data))
    write_curves(plan, data, plan.out / CURVES_FILE)
    write_differences(plan.out, data, plan.out / DIFFERENCES_FILE)


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
        percents: list[float] = []  # every value drawn on this column's silenced panel
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
                    percents += [v * scale for v in mean + high]
                ax.grid(alpha=0.3)
        # Silenced shares span 0.001% (STAPO's spurious tokens) to 80% (20-Entropy): see rlstab.lab.axes.
        percent_axis(axes[[f for f, _, _ in _PANELS].index("silenced_fraction"), col], percents)
        integer_steps(axes[-1, col])  # shared by the column: a run of 3 steps has no tick at 0.5
        axes[-1, col].set_xlabel("RL step")
    axes[0, 0].legend(fontsize=8, loc="best")
    n = len(data["settings"]["seeds"])
    # Two lines: one regime's column is too narrow for the whole title on one.
    fig.suptitle(f"rlstab compare: mean over {count_phrase(n, 'seed')}\nband = 95% t interval of the mean", fontsize=10.5)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
