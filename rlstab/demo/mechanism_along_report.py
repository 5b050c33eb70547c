"""``audit.md`` of ``rlstab audit --mechanism --from``: the per-state table, the combination, the fixed-p correlation
(``rlstab.demo.mechanism_along`` computes them)."""

from __future__ import annotations

from pathlib import PurePath


def _num(x, digits: int = 3) -> str:
    return "—" if x is None else f"{x:.{digits}g}"


def _run(state: dict) -> str:
    return "/".join(PurePath(state["run"]).parts[-2:]) if state["run"] else state["label"]


def _null(null: dict | None) -> list[str]:
    return ["—", "—", "—"] if null is None else [_num(null["median"]), _num(null["p95"]), _num(null["p"])]


def state_table(data: dict) -> str:
    head = ("| run | step | tokens | A > 0 | A > 0, p < tau_p | m | share | cosine | null A median | null A 95th | p_A | "
            "null B median | null B 95th | p_B |")
    rows = [head, "|" + "---|" * 14]
    for s in data["states"]:
        if s["informative"]:
            cells = [_num(s["share"]), _num(s["cosine"]), *_null(s["null_a"]), *_null(s["null_b"])]
        else:
            cells = [f"uninformative: {s['uninformative_reason']}", *["—"] * 7]
        pool = "—" if s["probability_condition_tokens"] is None else s["probability_condition_tokens"]
        rows.append(f"| {_run(s)} | {s['step']} | {s['tokens']} | {s['positive_tokens']} | {pool} | {s['silenced']} | "
                    + " | ".join(cells) + " |")
    return "\n".join(rows)


def combined_lines(data: dict) -> list[str]:
    c = data["combined"]
    out = []
    skipped = c["uninformative_states"]
    left_out = f"; {len(skipped)} uninformative, left out ({', '.join(skipped)})" if skipped else ""
    for name, text in (("a", "null A (random positive-advantage tokens)"),
                       ("b", "null B (p-matched, without the entropy condition)")):
        n = c[f"null_{name}"]
        if n["states"] == 0:
            out.append(f"- {text}: no informative state{left_out}")
        else:
            out.append(f"- {text}: Fisher over {n['states']} informative states, X = {n['fisher']:.3f}, "
                       f"p = {_num(n['p'])}{left_out}")
    undefined = next((s["null_b_undefined"] for s in data["states"] if s["null_b_undefined"]), None)
    if undefined:
        out.append(f"- {undefined}: null B is not defined for it and is skipped")
    return out


def fixed_p_table(data: dict) -> str:
    rows = ["| run | step | tokens in bins | bins | direction vs H | norm vs H |", "|---|---|---|---|---|---|"]
    for s in data["states"]:
        f = s["fixed_p"]
        rows.append(f"| {_run(s)} | {s['step']} | {f['tokens']} | {len(f['bins'])} | {_num(f['direction'])} | "
                    f"{_num(f['norm'])} |")
    pooled = data["combined"]["fixed_p_pooled"]
    if pooled is not None:
        rows.append(f"| pooled | all | {pooled['tokens']} | {len(pooled['bins'])} | {_num(pooled['direction'])} | "
                    f"{_num(pooled['norm'])} |")
    return "\n".join(rows)


def printed(data: dict) -> str:
    """What the command prints: the heading, the table and the combination."""
    src, s = data["source"], data["settings"]
    return "\n\n".join([
        f"# Mechanism along training: {src['model']} on {src['task']}, objective {data['objective']}",
        f"{len(data['states'])} states; per state {s['prompts']} x {s['group_size']} responses of its own, "
        f"{s['null_draws']} draws per null, seed {s['seed']}. Mask: {'; '.join(data['mask'])}.",
        state_table(data),
        "Combined (one-sided p: the mask's share above its null's):\n\n" + "\n".join(combined_lines(data)),
    ])


def document(data: dict) -> str:
    """``audit.md``: :func:`printed`, then the correlation with entropy at fixed probability and the definitions."""
    methods = "\n".join(f"- **{name}**: {text}" for name, text in data["methods"].items())
    return "\n\n".join([
        printed(data),
        "## Correlation with entropy at fixed probability\n\nSpearman of the logit-gradient norm with the entropy "
        "within each probability bin of at least 10 tokens, weighted by the bins' token counts; direction = "
        "||e_y - pi||, norm = |c_t| ||e_y - pi||.\n\n" + fixed_p_table(data),
        "## How each number is made\n\n" + methods,
    ]) + "\n"
