"""The token audit's presentation: Markdown tables, the summary line and the figure of ``rlstab.demo.audit``'s results.

matplotlib is imported inside :func:`figure` only.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rlstab.demo.audit import ObjectiveAudit, Sample, TokenCount


def _percent(x: float) -> str:
    if x == 0:
        return "0%"
    if x < 0.001:
        return f"{100 * x:.3f}%"
    return f"{100 * x:.2f}%" if x < 0.1 else f"{100 * x:.1f}%"


def _code(text: str) -> str:
    """A token's text as inline code in a Markdown table cell."""
    text = text.replace("|", "\\|")
    return f"`` {text} ``" if "`" in text else f"`{text}`"


def _top_cell(top: list[TokenCount], limit: int) -> str:
    if not top:
        return "—"
    return ", ".join(f"{_code(c.text)} {c.count:,} ({c.share:.0%})" for c in top[:limit])


def summary_line(sample: Sample) -> str:
    """One sentence on what the sample is: responses, tokens, rewards."""
    groups = len(sample.problems)
    return (
        f"{sample.responses} responses ({groups} prompts x {sample.group_size}) of `{sample.model or 'a policy'}` "
        f"on `{sample.task}`, temperature {sample.temperature:g}, seed {sample.seed}: {sample.tokens:,} response "
        f"tokens, mean reward {float(sample.rewards.mean()) if sample.responses else 0.0:.3f}, "
        f"{sample.mixed_groups} of {groups} groups with mixed rewards."
    )


def table_rows(audits: list[ObjectiveAudit], *, top: int = 5) -> list[list[str]]:
    """The audit table's header and rows (one per mask of each objective; one for a maskless objective)."""
    rows = [["objective", "mask", "silenced", "fraction", "tokens with A > 0", "entropy threshold",
             "most silenced (count, share)", "silenced if every A > 0", "most silenced if every A > 0"]]
    for a in audits:
        if not a.masks:
            rows.append([a.name, "(no mask)", "0", "0%", f"{a.positive_tokens:,}", "—", "—", "0", "—"])
        for m in a.masks:
            rows.append([
                m.objective,
                m.label,
                f"{m.silenced:,} of {m.tokens:,}",
                _percent(m.fraction),
                f"{a.positive_tokens:,}",
                "—" if m.threshold is None else f"{m.threshold:.3f}",
                _top_cell(m.top, top),
                f"{m.silenced_if_rewarded:,} ({_percent(m.fraction_if_rewarded)})",
                _top_cell(m.top_if_rewarded, top),
            ])
    return rows


def markdown_table(audits: list[ObjectiveAudit], *, top: int = 5) -> str:
    """The audit as a Markdown table, columns padded so that it also reads as plain text."""
    rows = table_rows(audits, top=top)
    widths = [max(len(r[c]) for r in rows) for c in range(len(rows[0]))]
    numeric = {2, 3, 4, 5, 7}

    def line(cells):
        return "| " + " | ".join(c.rjust(w) if i in numeric else c.ljust(w) for i, (c, w) in enumerate(zip(cells, widths))) + " |"

    rule = "|" + "|".join(("-" * (w + 1) + ":") if i in numeric else "-" * (w + 2) for i, w in enumerate(widths)) + "|"
    return "\n".join([line(rows[0]), rule] + [line(r) for r in rows[1:]])


def examples_table(audits: list[ObjectiveAudit]) -> str:
    """The silenced tokens in their responses, as a Markdown table ("" when no mask silenced any)."""
    lines = []
    for a in audits:
        for m in a.masks:
            for e in m.examples:
                context = e.context.replace("|", "\\|").replace("`", "ˋ")
                lines.append(f"| {m.objective} / {m.label} | {_code(e.text)} | {e.probability:.3g} | {e.entropy:.3f} "
                             f"| {e.advantage:.2f} | `{context}` |")
    if not lines:
        return ""
    return "\n".join(["| mask | token | p | entropy | A | in its response |", "|---|---|--:|--:|--:|---|", *lines])


def rules(audits: list[ObjectiveAudit]) -> list[str]:
    """One line per distinct mask rule: what each row of the table applies."""
    out = []
    for a in audits:
        for m in a.masks:
            line = f"{a.name} / {m.label}: {m.rule}"
            if line not in out:
                out.append(line)
    return out


def figure(audits: list[ObjectiveAudit], *, top_k: int = 8, title: str = ""):
    """A matplotlib figure: per mask, its most silenced tokens by count (needs matplotlib; Agg is enough).

    Solid bars: silenced with the sample's real advantages. Light bars: silenced if every response
    had a positive advantage.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [m for a in audits for m in a.masks]
    if not panels:
        fig, ax = plt.subplots(figsize=(7, 2))
        ax.axis("off")
        ax.text(0.5, 0.5, "no objective has a mask", ha="center", va="center")
        return fig
    cols = min(3, len(panels))
    rows = -(-len(panels) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.6 * cols, 0.42 * top_k * rows + 1.6 * rows + 0.6), squeeze=False)
    for ax in axes.flat[len(panels):]:
        ax.axis("off")
    for ax, m in zip(axes.flat, panels):
        ids = [c.token_id for c in m.top]
        ids += [c.token_id for c in m.top_if_rewarded if c.token_id not in ids][: max(0, top_k - len(ids))]
        texts = {c.token_id: c.text for c in m.top_if_rewarded + m.top}
        y = list(range(len(ids)))[::-1]
        real_counts = [m.counts.get(t, 0) for t in ids]
        cf_counts = [m.counts_if_rewarded.get(t, 0) for t in ids]
        h = 0.38
        bars = ax.barh([v + h / 2 for v in y], real_counts, height=h, color="#1f4e79", label="silenced")
        ax.bar_label(bars, labels=[str(c) if c else "" for c in real_counts], padding=2, fontsize=8, color="#1f4e79")
        bars = ax.barh([v - h / 2 for v in y], cf_counts, height=h, color="#9dc3e6", label="if every A > 0")
        ax.bar_label(bars, labels=[str(c) if c else "" for c in cf_counts], padding=2, fontsize=8, color="#4a7fb0")
        ax.margins(x=0.12)
        ax.set_yticks(y)
        ax.set_yticklabels([repr_token(texts[t]) for t in ids], fontfamily="monospace", fontsize=10)
        ax.set_xlabel("tokens silenced")
        ax.xaxis.get_major_locator().set_params(integer=True)
        head = f"{m.objective} / {m.label}"
        sub = f"{m.silenced:,} of {m.tokens:,} silenced ({_percent(m.fraction)}); if every A > 0: {m.silenced_if_rewarded:,}"
        ax.set_title(f"{head}\n{sub}", fontsize=9.5)
        if not ids:
            ax.set_yticks([])
            ax.text(0.5, 0.5, "no token silenced", ha="center", va="center", transform=ax.transAxes, color="#555555")
        ax.grid(axis="x", alpha=0.3)
    handles, labels = axes.flat[0].get_legend_handles_labels()
    if handles:
        fig.legend(handles, labels, loc="lower center", ncol=2, frameon=False, fontsize=9)
    if title:
        fig.suptitle(title, fontsize=11)
    fig.tight_layout(rect=(0, 0.05, 1, 1))
    return fig


def repr_token(text: str) -> str:
    """A token's text quoted for an axis label."""
    return f"'{text}'"


# ----------------------------------------------------------------------------- the mechanism


def _number(x: float | None, digits: int = 3) -> str:
    return "—" if x is None else f"{x:.{digits}g}"


def _edges(low: float, high: float | None) -> str:
    return f"[{low:g}, {high:g})" if high is not None else f"≥ {low:g}"


def _bins_table(measured: list[ObjectiveAudit], key: str, name: str) -> str:
    """One row per bin: the count and mean ||e_y - p|| (the same for every objective: the sample's), then each
    objective's mean ||dL/dz||."""
    first = measured[0].mechanism["logit_grad"][key]
    head = [name, "tokens", "mean ‖e_y − p‖"] + [f"{a.name}: mean ‖dL/dz‖" for a in measured]
    lines = ["| " + " | ".join(head) + " |", "|---|" + "--:|" * (len(head) - 1)]
    for i, b in enumerate(first):
        norms = [_number(a.mechanism["logit_grad"][key][i]["mean_norm"]) for a in measured]
        lines.append("| " + " | ".join([_edges(b["low"], b["high"]), f"{b['count']:,}", _number(b["mean_direction"]),
                                        *norms]) + " |")
    return "\n".join(lines)


def mechanism_section(audits: list[ObjectiveAudit]) -> str:
    """The audit's mechanism section (``rlstab audit --mechanism``): gradient shares, then the logit-gradient
    bins and correlations; "" when no audit measured it."""
    measured = [a for a in audits if a.mechanism is not None]
    if not measured:
        return ""
    share_lines = ["| objective | mask | silenced | gradient share ‖g_S‖/‖g_full‖ | cosine(g_S, g_full) | ‖g_full‖ |",
                   "|---|---|--:|--:|--:|--:|"]
    for a in measured:
        m = a.mechanism
        if not m["masks"]:
            share_lines.append(f"| {a.name} | (no mask) | 0 | — | — | {_number(m['full_grad_norm'])} |")
        for label, s in m["masks"].items():
            share_lines.append(f"| {a.name} | {label} | {s['silenced']:,} | {_number(s['share'])} | "
                               f"{_number(s['cosine'])} | {_number(m['full_grad_norm'])} |")
    correlation_lines = ["| objective | Spearman ‖dL/dz‖ vs p | vs H | Spearman ‖e_y − p‖ vs p | vs H |",
                         "|---|--:|--:|--:|--:|"]
    for a in measured:
        r = a.mechanism["logit_grad"]["spearman"]
        correlation_lines.append(
            f"| {a.name} | {_number(r['norm_vs_probability'])} | {_number(r['norm_vs_entropy'])} | "
            f"{_number(r['direction_vs_probability'])} | {_number(r['direction_vs_entropy'])} |")
    return "\n\n".join([
        "## Mechanism",
        "The sample as one on-policy step of each objective, measured in the parameter space of the policy's "
        "trainable parameters. g_full: the gradient of the objective without its masks and regularisers; g_S: the "
        "summed contribution of the tokens a mask silences (shadow masks as `shadow/<label>`). A share above 1 means "
        "the other tokens' contributions cancel part of the silenced ones'; — where undefined (nothing silenced, "
        "or no gradient).",
        "\n".join(share_lines),
        "Logit-gradient norm of each response token by its probability p (‖e_y − p‖ of the distribution alone; "
        "‖dL/dz‖ = |dL/dlogp| ‖e_y − p‖ with each objective's mask-free coefficient):",
        _bins_table(measured, "probability_bins", "p"),
        "By its entropy H (nats):",
        _bins_table(measured, "entropy_bins", "H"),
        "Rank correlations over every response token:",
        "\n".join(correlation_lines),
    ])
