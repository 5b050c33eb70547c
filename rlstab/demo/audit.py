"""The token audit: which tokens would each mask of an objective silence, on a policy's own responses?

STAPO (arXiv 2602.15620) grounds its S2T mask in an analysis of real runs: about 0.01% of
response tokens are "spurious" — a positive advantage on a token the policy found both
unlikely (p < 0.002) and certain (low entropy) — and their gradients dominate the update. This
module repeats that analysis on any policy of the demo (the tiny character model, SmolLM2) and
any objective: it samples ``group_size`` responses to each of ``prompts`` problems, computes each
token's probability and entropy and the objective's own advantages, and asks the objective's real
masks which tokens they silence. Nothing here re-implements a mask rule: the counts come from the
compiled objective (``CompiledObjective.mask_silences``, with the thresholds of its ``gather``) and
are checked against the metrics the compiled loss reports.

Each mask is also asked what it would silence if every response had a positive advantage (the
same tokens, advantages set to +1): a policy that rarely succeeds (SmolLM2-135M on the demo's
arithmetic) gives few positive advantages, and that column shows the tokens the mask would catch
once it does.

With ``mechanism`` (``rlstab audit --mechanism``), :func:`audit_mechanism` also measures STAPO's
mechanism on the sample as one step (``rlstab.trainer.mechanism``): the share of the policy
gradient, in the policy's trainable parameters, carried by the tokens each mask (and shadow mask)
silences, and each token's logit-gradient norm binned by probability and entropy.

This module computes (:func:`collect`, :func:`audit_objective`, :func:`audit_mechanism`); ``rlstab.demo.audit_report``
lays the results out (tables, the figure), and ``rlstab audit`` (``rlstab.demo.audit_command``)
does the file I/O.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from rlstab.batch import TokenBatch
from rlstab.compiled import CompiledObjective
from rlstab.lazy import torch
from rlstab.objective import Objective
from rlstab.tokens import Tokens
from rlstab.trainer.policy import Policy, Rollout
from rlstab.trainer.tasks import Problem, Task

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
    mechanism: dict | None = None
    """:func:`audit_mechanism`'s result (``StepMeter.result()``), when the audit measured it."""


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


def _step_silences(loss_fn: CompiledObjective, batch: TokenBatch) -> tuple[list[torch.Tensor], object, dict[str, float]]:
    """Each mask's silenced tokens (``[N, T]`` bool) on ``batch`` as one step, the step statistics, and the
    compiled loss's metrics (``CompiledObjective.mask_silences``, the tokens the loss counts as silenced)."""
    stats = loss_fn.gather([batch], distributed=False)
    metrics = dict(loss_fn(batch, step=stats).metrics)
    silences = loss_fn.mask_silences(batch, stats)
    for label, silenced in silences.items():  # acting masks by their label, shadow masks as shadow/<label>
        metric = f"{label}/silenced" if label.startswith("shadow/") else f"mask/{label}/silenced"
        count, reported = int(silenced.sum()), metrics[metric]
        if count != reported:  # the audit and the loss must agree on every count
            raise AssertionError(f"mask {label}: the audit counts {count} silenced tokens, the loss {reported:g}")
    return [silences[label] > 0 for label in loss_fn.mask_labels], stats, metrics


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
        rollout_logprobs=sample.rollout_logprobs, token_ids=sample.response_ids,
    )
    if obj.dual_stream is not None:
        fields["is_branch"] = torch.zeros(sample.responses, dtype=torch.bool)
    norms = torch.ones(sample.responses) if "grad_sq_norms" in obj.advantage.reads else None
    batch = TokenBatch(**fields, rewards=sample.rewards, group_ids=sample.group_ids, grad_sq_norms=norms)
    silences, stats, metrics = _step_silences(loss_fn, batch)
    groups = dict(rewards=sample.rewards, group_ids=sample.group_ids) if loss_fn.readers("group_ids") else {}
    rewarded = TokenBatch(**fields, advantages=torch.ones(sample.responses), **groups)  # group_filter still reads them
    silences_if_rewarded, _, _ = _step_silences(loss_fn, rewarded)

    valid = sample.response_mask
    # through the micro-batch path: an estimator may read the batch's tokens (GTPO: each response's entropy)
    advantages = obj.advantage.micro_batch_advantages(stats.advantage, Tokens.from_batch(batch, obj.log_ratio_clamp),
                                                      sample.rewards, sample.group_ids, sample.response_mask.any(-1))
    positive_tokens = int(valid[advantages > 0].sum())
    masks = []
    for i, (label, mask) in enumerate(zip(loss_fn.mask_labels, loss_fn.masks)):
        silenced, silenced_if_rewarded = silences[i], silences_if_rewarded[i]
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


# ----------------------------------------------------------------------------- the mechanism


def silenced_texts(sample: Sample, silenced: torch.Tensor) -> dict[str, int]:
    """How often each token text is among the ``silenced`` tokens (``[N, T]`` bool), most often first."""
    counts = Counter(sample.token_texts.get(int(t), str(int(t))) for t in sample.response_ids[silenced].tolist())
    return dict(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))


def rollout_of(sample: Sample, policy: Policy) -> Rollout:
    """``sample``'s responses as a :class:`Rollout` of ``policy`` (its prompts encoded again), to score them with grad."""
    return Rollout([policy.codec.encode(sample.problems[int(g)].prompt) for g in sample.group_ids],
                   sample.response_ids, sample.response_mask, sample.rollout_logprobs)


def step_batches(sample: Sample, objective: Objective):
    """``batch_of(rows, logprobs, entropy) -> TokenBatch``: micro-batches of ``sample`` as one on-policy step of
    ``objective`` (old log-probabilities the sample's; root rollouts for ``dual_stream``; equal per-response gradient
    norms where the advantage reads them), with the given current log-probabilities and entropies."""
    branch = torch.zeros(sample.responses, dtype=torch.bool) if objective.dual_stream is not None else None
    norms = torch.ones(sample.responses) if "grad_sq_norms" in objective.advantage.reads else None

    def batch_of(rows: list[int], logprobs: torch.Tensor, entropy: torch.Tensor) -> TokenBatch:
        idx = torch.as_tensor(rows, dtype=torch.long)
        return TokenBatch(
            logprobs=logprobs, old_logprobs=sample.logprobs[idx], response_mask=sample.response_mask[idx],
            entropy=entropy, rollout_logprobs=None if sample.rollout_logprobs is None else sample.rollout_logprobs[idx],
            rewards=sample.rewards[idx], group_ids=sample.group_ids[idx],
            grad_sq_norms=None if norms is None else norms[idx], is_branch=None if branch is None else branch[idx],
            token_ids=sample.response_ids[idx],
        )

    return batch_of


def audit_mechanism(sample: Sample, policy: Policy, objective: Objective | CompiledObjective, *,
                    micro_batch: int = _CHUNK_ROWS) -> dict:
    """STAPO's mechanism on ``sample`` as one step of ``objective`` (``rlstab.trainer.mechanism.StepMeter``).

    The sample's responses are re-scored by ``policy`` (with gradient, ``micro_batch`` rows at a
    time) at the parameters that sampled them, so the step is on-policy (old = current
    log-probabilities); batches, advantages and thresholds are those of :func:`audit_objective`,
    from a fresh compile of the objective (its components' starting state). Returns
    ``StepMeter.result()``: ``space``, ``full_grad_norm``, ``masks`` (label -> share, cosine,
    silenced, shadow masks as ``shadow/<label>``) and ``logit_grad`` (the p and H bins).
    """
    from rlstab.trainer.mechanism import StepMeter

    if not sample.problems:
        raise ValueError("the mechanism needs the sample's problems (their prompts), to score its responses again")
    loss_fn = (objective.objective if isinstance(objective, CompiledObjective) else objective).compile()
    rollout = rollout_of(sample, policy)
    batch_of = step_batches(sample, loss_fn.objective)
    parts = [list(range(i, min(i + micro_batch, sample.responses))) for i in range(0, sample.responses, micro_batch)]
    gathered = [batch_of(rows, sample.logprobs[rows], sample.entropy[rows]) for rows in parts]
    before = loss_fn.state_dict()
    stats = loss_fn.gather(gathered, distributed=False)
    meter = StepMeter(loss_fn)
    meter.measure(policy, rollout, parts, batch_of, (sample.logprobs, sample.entropy), stats, before)
    return meter.result()
