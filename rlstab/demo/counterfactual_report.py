"""The counterfactual audit's presentation: ``audit.md``'s section from ``counterfactual.json``'s content
(``rlstab.demo.counterfactual.counterfactual_audit``).

Each measure but the angle is shown as the arm's value minus the all-tokens update's: the all-tokens update is
common to every arm, so the ranks and p-values are those of the raw values.
"""

from __future__ import annotations

MEASURE_NAMES = {
    "entropy_change": "held-out entropy change",
    "batch_entropy_change": "batch entropy change",
    "kl": "KL(before ‖ after)",
    "update_norm": "update norm",
    "update_angle": "angle to the all-tokens update (°)",
    "reward_change": "held-out reward change",
}
"""The measures' names in the tables, in ``MEASURES`` order."""
RELATIVE = ("entropy_change", "batch_entropy_change", "kl", "update_norm", "reward_change")
"""Measures shown relative to the all-tokens update."""


def number(x: float | None, signed: bool = True) -> str:
    """3 significant digits (``+1.23e-05``), ``—`` for None."""
    if x is None:
        return "—"
    return f"{x:+.3g}" if signed else f"{x:.3g}"


def p_text(p: float | None) -> str:
    return "—" if p is None else f"{p:.3g}"


def shown(state: dict, arm: str, measure: str) -> float:
    """The arm's value of ``measure`` as shown: minus the all-tokens update's, but for the angle."""
    value = state["arms"][arm][measure]
    return value - state["arms"]["all_tokens"][measure] if measure in RELATIVE else value


def null_shown(state: dict, measure: str, value: float) -> float:
    return value - state["arms"]["all_tokens"][measure] if measure in RELATIVE else value


def summary_line(data: dict) -> str:
    s = data["settings"]
    src = data["source"]
    where = (f"the checkpoints of {len(src['runs'])} lab run{'' if len(src['runs']) == 1 else 's'}"
             if src["kind"] == "lab" else f"`{src['model']}` as loaded, with a fresh Adam at lr {src['lr']:g}")
    states = data["states"]
    return (f"{len(states)} state{'' if len(states) == 1 else 's'} from {where}: `{src['model']}` on `{src['task']}`, "
            f"objective `{data['objective']}`. Per state, one update on {s['prompts']} prompts x {s['group_size']} "
            f"of the policy's own responses (temperature {s['temperature']:g}, seed {s['seed']}); {s['null_draws']} "
            f"count-matched null draws; held-out: {states[0]['held_out_problems'] if states else 0} problems. "
            f"{data['seconds']:.0f} s of wall time.")


def states_table(data: dict) -> str:
    """One row per state: its sample, what the mask silenced, and the mask's p-value for each measure."""
    from rlstab.demo.counterfactual import MEASURES

    head = ["state", "tokens", "A > 0", "silenced", "shared with probability-only"] + [
        f"p: {MEASURE_NAMES[m]}" for m in MEASURES]
    lines = ["| " + " | ".join(head) + " |", "|---|" + "--:|" * (len(head) - 1)]
    for s in data["states"]:
        tests = s["tests"]["mask"] if s["tests"] else {}
        lines.append("| " + " | ".join([s["label"], f"{s['tokens']:,}", f"{s['positive_tokens']:,}", str(s["silenced"]),
                                        str(s["probability_only_overlap"]),
                                        *(p_text(tests[m]["p"]) if tests else "—" for m in MEASURES)]) + " |")
    return "\n".join(lines)


def tokens_line(data: dict) -> str:
    """The token texts the mask silenced, over every state, most often first."""
    from collections import Counter

    counts = Counter()
    for s in data["states"]:
        counts.update(s["silenced_tokens"])
    if not counts:
        return "The mask silenced no token."
    ranked = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    return "Tokens the mask silenced, over every state: " + ", ".join(f"`{t}` {n}" for t, n in ranked) + "."


def measure_table(data: dict, measure: str) -> str:
    """One row per state: the all-tokens value, the mask's and the probability-only set's (relative to it, but for
    the angle) with their p-values, and the null's median and 2.5-97.5% range."""
    lines = ["| state | all tokens | mask | its rank of K + 1 | null median [2.5%, 97.5%] | p | probability-only | p |",
             "|---|--:|--:|--:|--:|--:|--:|--:|"]
    for s in data["states"]:
        base = s["arms"]["all_tokens"][measure]
        if s["tests"] is None:
            lines.append(f"| {s['label']} | {number(base)} | (nothing silenced) | — | — | — | — | — |")
            continue
        t, q = s["tests"]["mask"][measure], s["tests"]["probability_only"][measure]
        null = (f"{number(null_shown(s, measure, t['null_median']))} [{number(null_shown(s, measure, t['null_low']))}, "
                f"{number(null_shown(s, measure, t['null_high']))}]")
        lines.append(f"| {s['label']} | {number(base)} | {number(shown(s, 'mask', measure))} | {t['rank']:g} | {null} "
                     f"| {p_text(t['p'])} | {number(shown(s, 'probability_only', measure))} | {p_text(q['p'])} |")
    return "\n".join(lines)


def combined_table(data: dict) -> str:
    """Per measure: Fisher's combination of the states' p-values, Holm over the measures, for the mask and the
    probability-only set; how many states put the mask above and below its null's median."""
    from rlstab.demo.counterfactual import MEASURES

    c = data["combined"]
    lines = ["| measure | mask: Fisher X | p | Holm p | above / below the null median | probability-only: p | Holm p |",
             "|---|--:|--:|--:|--:|--:|--:|"]
    for m in MEASURES:
        a, b = c["mask"][m], c["probability_only"][m]
        lines.append(f"| {MEASURE_NAMES[m]} | {number(a['fisher'], signed=False)} | {p_text(a['p'])} | "
                     f"{p_text(a['p_holm'])} | {a['above_null_median']} / {a['below_null_median']} | {p_text(b['p'])} | "
                     f"{p_text(b['p_holm'])} |")
    return "\n".join(lines)


def first_order_table(data: dict) -> str:
    """Per state: the silenced tokens' covariance contribution c_S, its predicted sign, the measured entropy
    effects and whether their signs agree; the null draws' agreement."""
    lines = ["| state | c_S | predicted | measured, held-out | agrees | measured, batch | agrees "
             "| null draws agreeing: held-out | batch |",
             "|---|--:|:-:|--:|:-:|--:|:-:|--:|--:|"]
    for s in data["states"]:
        f = s["first_order"]
        if s["tests"] is None:
            lines.append(f"| {s['label']} | — | — | — | — | — | — | — | — |")
            continue
        lines.append(
            f"| {s['label']} | {number(f['covariance'])} | {_arrow(f['predicted_sign'])} | "
            f"{number(f['measured_held_out'])} | {_yes(f['agrees_held_out'])} | {number(f['measured_batch'])} | "
            f"{_yes(f['agrees_batch'])} | {f['null_agree_held_out']} of {f['null_decided_held_out']} | "
            f"{f['null_agree_batch']} of {f['null_decided_batch']} |")
    return "\n".join(lines)


def first_order_line(data: dict) -> str:
    t = data["combined"]["first_order"]
    h, b = t["held_out"], t["batch"]
    return (f"The predicted sign agrees with the measured one on {h['agree']} of {h['decided']} states held out and "
            f"{b['agree']} of {b['decided']} on the batch; over the null draws, on {h['null_agree']} of "
            f"{h['null_decided']} held out and {b['null_agree']} of {b['null_decided']} on the batch.")


def _arrow(s: int) -> str:
    return {1: "+", -1: "−", 0: "0"}[s]


def _yes(x: bool | None) -> str:
    return "—" if x is None else ("yes" if x else "no")


def document(data: dict) -> str:
    """``audit.md`` of ``rlstab audit --counterfactual``."""
    from rlstab.demo.counterfactual import MEASURES

    c = data["combined"]
    parts = [
        f"# Counterfactual audit: {data['source']['model']} on {data['source']['task']}, objective {data['objective']}",
        summary_line(data),
        "Mask: " + "; ".join(data["mask"]) + ".",
        "## Per state",
        "The mask's two-sided exact p-value within its null, per measure (shared with probability-only: the mask's "
        "tokens that are also among the as many lowest-probability positive-advantage ones):",
        states_table(data),
        tokens_line(data),
        "## Combined over states",
        combined_line(data),
    ]
    if not c["states"]:
        return "\n\n".join(parts) + "\n"
    parts += [
        combined_table(data),
        "## Each measure against its null",
        "Every value but the angle is the arm's minus the all-tokens update's. The mask's rank counts from the lowest "
        "of the K + 1 values (ties halved); the smallest p is 1/(K + 1).",
    ]
    for m in MEASURES:
        parts += [f"**{MEASURE_NAMES[m]}**", measure_table(data, m)]
    parts += [
        "## The first-order prediction",
        "ΔH ≈ −η Cov(log π, A) over the update's tokens: silencing S changes ΔH by about +η c_S, so the predicted "
        "sign of ΔH(mask) − ΔH(all tokens) is that of c_S.",
        first_order_table(data),
        first_order_line(data),
        "## How each number is made",
        "\n".join(f"- **{name}**: {text}" for name, text in data["methods"].items()),
    ]
    return "\n\n".join(parts) + "\n"


def combined_line(data: dict) -> str:
    c = data["combined"]
    untested = c["untested_states"]
    if not c["states"]:
        return ("The mask silenced no token in any state: every arm is the all-tokens update, and there is nothing "
                "to rank.")
    return (f"Over the {c['states']} state{'' if c['states'] == 1 else 's'} where the mask silenced a token"
            + (f" ({len(untested)} where it silenced none: {', '.join(untested)})" if untested else "") + ":")


def printed(data: dict) -> str:
    """What the command prints: the title, the summary line and the combined table (or why there is none)."""
    head = document(data).split("\n\n")[:2]
    return "\n\n".join(head + [combined_table(data) if data["combined"]["states"] else combined_line(data)])
