"""The token audit: which tokens would each mask of an objective silence, on a policy's own responses?

STAPO (arXiv 2602.15620) grounds its S2T mask in an analysis of real runs: about 0.01% of
response tokens are "spurious" — a positive advantage on a token the policy found both
unlikely (p < 0.002) and certain (low entropy) — and their gradients dominate the update. This
module repeats that analysis on any policy of the demo (the tiny character model, SmolLM2) and
any objective: it samples ``group_size`` responses to each of ``prompts`` problems, computes each
token's probability and entropy and the objective's own advantages, and asks the objective's real
masks which tokens they silence. Nothing here re-implements a mask rule: the counts come from the
masks' ``keep`` (with the thresholds of the compiled objective's ``gather``) and are checked
against the metrics the compiled loss reports.

Each mask is also asked what it would silence if every response had a positive advantage (the
same tokens, advantages set to +1): a policy that rarely succeeds (SmolLM2-135M on the demo's
arithmetic) gives few positive advantages, and that column shows the tokens the mask would catch
once it does.

The computation (:func:`collect`, :func:`audit_objective`) is separate from the presentation
(:func:`markdown_table`, :func:`summary_line`, :func:`figure`) and from any file I/O, which
``rlstab audit`` (``rlstab.demo.audit_command``) does.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from rlstab.batch import TokenBatch
from rlstab.compiled import CompiledObjective
from rlstab.demo.policy import Policy, Rollout
from rlstab.demo.tasks import Problem, Task
from rlstab.lazy import torch
from rlstab.objective import Objective
from rlstab.tokens import Tokens

DEFAULT_OBJECTIVES = ("stapo", "stapo-probability-only", "stapo-high-entropy")
"""STAPO and its two ablations from the paper, side by side."""

# Responses sampled, and scored, per policy call (whole groups at a time).
_CHUNK_ROWS = 64


@dataclass
class Sample:
    """Responses of a policy to a task, with every token's probability and entropy (all detached).

    ``logprobs``, ``entropy``, ``response_ids`` and ``response_mask`` are ``[N, T]``; ``rewards``
    and ``group_ids`` are ``[N]``; row ``i`` answers ``problems[group_ids[i]]``.
    """

    model: str
    task: str
    problems: list[Problem]
    group_size: int
    temperature: float
    seed: int
    response_ids: torch.Tensor
    response_mask: torch.Tensor
    logprobs: torch.Tensor
    entropy: torch.Tensor
    rewards: torch.Tensor
    group_ids: torch.Tensor
    texts: list[str]
    token_texts: dict[int, str]
    rollout_logprobs: torch.Tensor | None = None
    """``[N, T]`` the sampler's log-probabilities (rollout mismatch corrections read them), or None."""

    @property
    def responses(self) -> int:
        return int(self.response_ids.shape[0])

    @property
    def tokens(self) -> int:
        """Valid response tokens (EOS included)."""
        return int(self.response_mask.sum())

    @property
    def mixed_groups(self) -> int:
        """Groups whose rewards are not all equal: the only ones with non-zero GRPO advantages."""
        out = 0
        for g in self.group_ids.unique():
            r = self.rewards[self.group_ids == g]
            out += int(bool((r != r[0]).any()))
        return out


def _pad_cat(parts: list[torch.Tensor], value) -> torch.Tensor:
    T = max(p.shape[1] for p in parts)
    return torch.cat([torch.nn.functional.pad(p, (0, T - p.shape[1]), value=value) for p in parts])


@torch.no_grad()
def collect(
    policy: Policy,
    task: Task,
    *,
    prompts: int,
    group_size: int,
    seed: int = 0,
    temperature: float = 1.0,
    max_new_tokens: int | None = None,
    model: str = "",
) -> Sample:
    """Sample ``group_size`` responses to each of ``prompts`` problems of ``task`` and measure every token.

    The problems come from one generator seeded with ``seed`` and the sampling from another, so a
    seed fixes the whole sample. Probabilities and entropies are at temperature 1 (the policy's
    own distribution), whatever the sampling ``temperature``.
    """
    problems = task.problems(prompts, torch.Generator().manual_seed(seed))
    sampler = torch.Generator().manual_seed(seed + 1)
    max_new_tokens = max_new_tokens or task.max_new_tokens
    groups_per_chunk = max(1, _CHUNK_ROWS // group_size)
    ids, masks, logprobs, entropy, texts, rewards, sampled = [], [], [], [], [], [], []
    for start in range(0, len(problems), groups_per_chunk):
        part = problems[start : start + groups_per_chunk]
        prompt_ids = [policy.codec.encode(p.prompt) for p in part for _ in range(group_size)]
        rollout = policy.sample(prompt_ids, max_new_tokens=max_new_tokens, temperature=temperature, generator=sampler)
        lp, ent = policy.token_stats(rollout)
        ids.append(rollout.response_ids)
        masks.append(rollout.response_mask)
        logprobs.append(lp.detach().float())
        entropy.append(ent.detach().float())
        sampled.append(rollout.logprobs)
        for i, (row, mask) in enumerate(zip(rollout.response_ids, rollout.response_mask)):
            text = policy.codec.decode(row[mask].tolist())
            texts.append(text)
            rewards.append(task.reward(part[i // group_size], text))
    response_ids = _pad_cat(ids, policy.codec.pad_id)
    response_mask = _pad_cat(masks, False)
    token_texts = {int(t): policy.codec.token_text(int(t)) for t in response_ids[response_mask].unique()}
    return Sample(
        model=model,
        task=task.name,
        problems=problems,
        group_size=group_size,
        temperature=temperature,
        seed=seed,
        response_ids=response_ids,
        response_mask=response_mask,
        logprobs=_pad_cat(logprobs, 0.0),
        entropy=_pad_cat(entropy, 0.0),
        rollout_logprobs=None if any(x is None for x in sampled) else _pad_cat(sampled, 0.0),
        rewards=torch.tensor(rewards, dtype=torch.float32),
        group_ids=torch.arange(len(problems)).repeat_interleave(group_size),
        texts=texts,
        token_texts=token_texts,
    )


def sample_from_rollout(
    rollout: Rollout, logprobs: torch.Tensor, entropy: torch.Tensor, rewards: torch.Tensor, group_ids: torch.Tensor,
    *, token_texts: dict[int, str], texts: list[str] | None = None, problems: list[Problem] | None = None,
    model: str = "", task: str = "", group_size: int = 0, temperature: float = 1.0, seed: int = 0,
) -> Sample:
    """A :class:`Sample` from tensors a trainer already has (one RL step's rollout), for :func:`audit_objective`."""
    return Sample(
        model=model, task=task, problems=list(problems or []), group_size=group_size, temperature=temperature,
        seed=seed, response_ids=rollout.response_ids, response_mask=rollout.response_mask,
        logprobs=logprobs.detach().float(), entropy=entropy.detach().float(), rewards=rewards.float(),
        group_ids=group_ids, texts=list(texts or []), token_texts=token_texts, rollout_logprobs=rollout.logprobs,
    )


# ----------------------------------------------------------------------------- the audit


@dataclass(frozen=True)
class TokenCount:
    """How often one token was silenced: ``count`` times, ``share`` of the mask's silenced tokens,
    ``rate`` of the token's own occurrences."""

    token_id: int
    text: str
    count: int
    share: float
    rate: float


@dataclass(frozen=True)
class SilencedToken:
    """One silenced token in its response: where, its probability, entropy and advantage, and context."""

    row: int
    position: int
    text: str
    probability: float
    entropy: float
    advantage: float
    context: str
    """The response's tokens around it, the silenced one in brackets: ``7+8=1⟦5⟧,4+3``."""


@dataclass
class MaskAudit:
    """What one mask of an objective silences in a :class:`Sample`."""

    objective: str
    label: str
    """The mask's metric label (``s2t``, ``entropy_quantile``...), as in ``mask/<label>/silenced``."""
    rule: str
    """The mask's own description of its rule."""
    tokens: int
    """Valid tokens of the sample."""
    silenced: int
    threshold: float | None
    """The step threshold the mask used (an entropy quantile), or None (also for an expression with several quantiles, whose rule names them)."""
    top: list[TokenCount]
    silenced_if_rewarded: int
    """Tokens it would silence if every response had a positive advantage."""
    top_if_rewarded: list[TokenCount]
    examples: list[SilencedToken]
    """The first silenced tokens (with the real advantages), in their responses."""
    counts: dict[int, int] = field(repr=False)
    """How often each token id was silenced."""
    counts_if_rewarded: dict[int, int] = field(repr=False)
    silenced_mask: torch.Tensor = field(repr=False)
    """``[N, T]`` bool, True where the mask silences a valid token."""
    silenced_mask_if_rewarded: torch.Tensor = field(repr=False)

    @property
    def fraction(self) -> float:
        return self.silenced / self.tokens if self.tokens else 0.0

    @property
    def fraction_if_rewarded(self) -> float:
        return self.silenced_if_rewarded / self.tokens if self.tokens else 0.0


@dataclass
class ObjectiveAudit:
    """One objective's masks on a :class:`Sample`, with the compiled loss's metrics on it."""

    name: str
    advantage: str
    """The objective's advantage estimator (its ``kind``)."""
    positive_tokens: int
    """Valid tokens whose advantage (by this objective's estimator) is positive."""
    kept: int
    """Valid tokens every mask keeps (``tokens/kept``)."""
    masks: list[MaskAudit]
    metrics: dict[str, float]
    """``LossOutput.metrics`` of the compiled objective on the whole sample as one step."""


def _token_counts(sample: Sample, silenced: torch.Tensor, top_k: int) -> list[TokenCount]:
    total = int(silenced.sum())
    if total == 0:
        return []
    valid_ids = sample.response_ids[sample.response_mask]
    occurrences = Counter(valid_ids.tolist())
    counts = Counter(sample.response_ids[silenced].tolist())
    ranked = sorted(counts.items(), key=lambda kv: (-kv[1], sample.token_texts.get(kv[0], ""), kv[0]))[:top_k]
    return [
        TokenCount(tid, sample.token_texts.get(tid, str(tid)), n, n / total, n / occurrences[tid]) for tid, n in ranked
    ]


def _examples(sample: Sample, silenced: torch.Tensor, advantages: torch.Tensor, limit: int,
              width: int = 12) -> list[SilencedToken]:
    out = []
    for row, position in silenced.nonzero().tolist()[:limit]:
        ids = sample.response_ids[row][sample.response_mask[row]].tolist()
        text = [sample.token_texts.get(t, str(t)) for t in ids]
        before = "".join(text[max(0, position - width) : position])
        after = "".join(text[position + 1 : position + 1 + width])
        out.append(SilencedToken(
            row=row,
            position=position,
            text=text[position],
            probability=float(sample.logprobs[row, position].exp()),
            entropy=float(sample.entropy[row, position]),
            advantage=float(advantages[row]),
            context=f"{'…' if position > width else ''}{before}⟦{text[position]}⟧{after}"
                    f"{'…' if position + 1 + width < len(text) else ''}",
        ))
    return out


def _step_keeps(loss_fn: CompiledObjective, batch: TokenBatch) -> tuple[list[torch.Tensor], object, dict[str, float]]:
    """Each mask's ``keep`` on ``batch`` as one step, the step statistics, and the compiled loss's metrics."""
    objective = loss_fn.objective
    stats = loss_fn.gather([batch], distributed=False)
    metrics = dict(loss_fn(batch, step=stats).metrics)
    t = Tokens.from_batch(batch, objective.log_ratio_clamp)
    if stats.advantage is not None:
        t.set_advantages(objective.advantage.apply(
            stats.advantage, batch.rewards, batch.group_ids, batch.response_mask.any(-1)))
    else:
        t.set_advantages(batch.advantages)
    keeps = [mask.keep(t, threshold) for mask, threshold in zip(loss_fn.masks, stats.thresholds)]
    for label, keep in zip(loss_fn.mask_labels, keeps):
        silenced = int((batch.response_mask & (keep == 0)).sum())
        reported = metrics[f"mask/{label}/silenced"]
        if silenced != reported:  # the audit and the loss must agree on every count
            raise AssertionError(f"mask {label}: the audit counts {silenced} silenced tokens, the loss {reported:g}")
    return keeps, stats, metrics


def audit_objective(sample: Sample, objective: Objective | CompiledObjective, *, name: str | None = None,
                    top_k: int = 8, examples: int = 10) -> ObjectiveAudit:
    """Which tokens of ``sample`` each mask of ``objective`` silences, treating the sample as one step.

    Advantages come from the objective's own estimator (rewards and group ids); thresholds from its
    ``gather``; every count is checked against the compiled loss's ``mask/<label>/silenced``.
    The sample's rows are root rollouts (``is_branch`` False for ``dual_stream``); the sample has no
    per-response gradient norms, so VCPO's baseline (``opob``) is audited with equal weights, where
    it is the group mean.
    """
    loss_fn = objective if isinstance(objective, CompiledObjective) else objective.compile()
    obj = loss_fn.objective
    fields = dict(
        logprobs=sample.logprobs, response_mask=sample.response_mask, entropy=sample.entropy,
        rollout_logprobs=sample.rollout_logprobs,
    )
    if obj.dual_stream is not None:
        fields["is_branch"] = torch.zeros(sample.responses, dtype=torch.bool)
    norms = torch.ones(sample.responses) if "grad_sq_norms" in obj.advantage.reads else None
    batch = TokenBatch(**fields, rewards=sample.rewards, group_ids=sample.group_ids, grad_sq_norms=norms)
    keeps, stats, metrics = _step_keeps(loss_fn, batch)
    groups = dict(rewards=sample.rewards, group_ids=sample.group_ids) if loss_fn.readers("group_ids") else {}
    rewarded = TokenBatch(**fields, advantages=torch.ones(sample.responses), **groups)  # group_filter still reads them
    keeps_if_rewarded, _, _ = _step_keeps(loss_fn, rewarded)

    valid = sample.response_mask
    advantages = obj.advantage.apply(stats.advantage, sample.rewards, sample.group_ids, sample.response_mask.any(-1))
    positive_tokens = int(valid[advantages > 0].sum())
    masks = []
    for i, (label, mask) in enumerate(zip(loss_fn.mask_labels, loss_fn.masks)):
        silenced = valid & (keeps[i] == 0)
        silenced_if_rewarded = valid & (keeps_if_rewarded[i] == 0)
        threshold = stats.thresholds[i]
        masks.append(MaskAudit(
            objective=name or obj.name or "objective",
            label=label,
            rule=mask.describe(),
            tokens=sample.tokens,
            silenced=int(silenced.sum()),
            threshold=None if threshold is None or isinstance(threshold, tuple) else float(threshold),
            top=_token_counts(sample, silenced, top_k),
            silenced_if_rewarded=int(silenced_if_rewarded.sum()),
            top_if_rewarded=_token_counts(sample, silenced_if_rewarded, top_k),
            examples=_examples(sample, silenced, advantages, examples),
            counts=dict(Counter(sample.response_ids[silenced].tolist())),
            counts_if_rewarded=dict(Counter(sample.response_ids[silenced_if_rewarded].tolist())),
            silenced_mask=silenced,
            silenced_mask_if_rewarded=silenced_if_rewarded,
        ))
    return ObjectiveAudit(
        name=name or obj.name or "objective",
        advantage=obj.advantage.kind,
        positive_tokens=positive_tokens,
        kept=int(metrics["tokens/kept"]),
        masks=masks,
        metrics=metrics,
    )


# ----------------------------------------------------------------------------- presentation


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
