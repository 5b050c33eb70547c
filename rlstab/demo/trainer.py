"""The RL loop: GRPO-family training of a policy with a compiled rlstab objective.

One RL step:

1. draw ``prompts_per_step`` training problems and sample ``group_size`` responses to each
   (one GRPO group per prompt) at ``temperature``;
2. score each response with the task's exact-match reward;
3. in a no-grad pass, record the sampling policy's log-probabilities (the PPO "old" policy) and
   entropies;
4. split the groups into ``updates_per_step`` mini-batches (whole groups each), and for each
   mini-batch run the compiled loss's step API: ``gather`` over all its micro-batches first
   (advantages are estimated there, by the objective's own estimator, from the rewards and group
   ids), then each micro-batch's loss and backward, then one clipped optimizer step.

With one mini-batch the policy is exactly on-policy and every importance ratio is 1, so the
clipping rules never act. Two mini-batches (the default, like veRL's ``ppo_mini_batch_size`` at
half the train batch) make the second update slightly off-policy, which is where the objectives'
clip ranges start to differ. For that second update the current policy's log-probabilities and
entropies are recomputed (no grad) and passed to ``gather``, so the kept-token counts and entropy
quantiles are those of the policy the update is computed for.

Every objective starts from its own copy of the same warm-started policy with the same RNG
streams (one for problems, one for sampling), so the objectives see the same prompts and differ
only through what they learn. Held-out accuracy is greedy exact match on a fixed held-out set.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from rlstab.batch import TokenBatch
from rlstab.demo.branching import concat, sample_branches
from rlstab.demo.layers import TrainerLayers
from rlstab.demo.policy import Policy, Rollout
from rlstab.demo.tasks import Problem, Task
from rlstab.exploration.deep_grpo import PivotExplorer
from rlstab.lazy import torch
from rlstab.step.ess import effective_sample_size

if TYPE_CHECKING:  # rlstab.compiled imports torch, and `rlstab demo`'s parser reads TrainConfig
    from rlstab.compiled import CompiledObjective


@dataclass(frozen=True)
class TrainConfig:
    """The RL run's knobs (the CLI's flags). Defaults: the default ``rlstab demo`` run.

    Tuned on ``add2`` so that held-out accuracy rises under grpo on every seed tried (0-3: from
    20-31% to 46-83% in 100 steps) within a few minutes on two cores. Adam at 3e-4 undoes the warm
    start within 15 steps; temperature 0.8 rather than 1 gives more groups with a correct sample.
    """

    steps: int = 100
    seed: int = 0
    group_size: int = 8
    prompts_per_step: int = 16
    micro_batch_size: int = 32
    updates_per_step: int = 2
    lr: float = 3e-5
    temperature: float = 0.8
    max_grad_norm: float = 1.0
    eval_every: int = 5


# Metrics that count tokens (summed over micro-batches); every other loss metric except the
# policy loss is a per-token fraction or mean (averaged over micro-batches weighted by valid tokens).
_COUNT_SUFFIXES = ("/kept", "/silenced")
_COUNTS = ("tokens/valid", "tokens/kept")
_STEP_VALUES = ("step/tokens_valid", "step/tokens_kept", "step/branch_tokens_valid", "step/branch_responses")
_SUMMED = ("loss", "loss/policy")


def aggregate_metrics(metrics: Sequence[dict[str, float]]) -> dict[str, float]:
    """One optimizer step's metrics from its micro-batches' ``LossOutput.metrics``.

    Counts and losses add up; fractions and means are weighted by each micro-batch's valid tokens;
    step-level values (thresholds, step token counts) are the same in every micro-batch. A metric
    some parts lack (a threshold of a step whose groups dynamic sampling all dropped) is taken from
    those that have it.
    """
    out: dict[str, float] = {}
    for name in dict.fromkeys(k for m in metrics for k in m):
        have = [m for m in metrics if name in m]
        values = [m[name] for m in have]
        if name in _COUNTS or name in _SUMMED or name.endswith(_COUNT_SUFFIXES) or name.startswith("loss/"):
            out[name] = sum(values)
        elif name in _STEP_VALUES or name.endswith("threshold"):
            out[name] = values[0]
        else:
            weights = [m["tokens/valid"] for m in have]
            out[name] = sum(v * w for v, w in zip(values, weights)) / (sum(weights) or 1.0)
    return out


def combine_updates(updates: Sequence[dict[str, float]]) -> dict[str, float]:
    """A whole RL step's loss metrics from its optimizer updates' (counts add, fractions by tokens)."""
    if len(updates) == 1:
        return dict(updates[0])
    combined = aggregate_metrics(updates)
    for name in combined:
        if name in _STEP_VALUES:
            combined[name] = sum(u.get(name, 0.0) for u in updates)
        elif name.endswith("threshold"):
            values = [u[name] for u in updates if name in u]
            combined[name] = sum(values) / len(values)
    return combined


def rows_slice(rollout: Rollout, rows: Sequence[int]) -> Rollout:
    return rollout.rows(rows)


def chunks(rows: Sequence[int], size: int) -> list[list[int]]:
    rows = list(rows)
    return [rows[i : i + size] for i in range(0, len(rows), size)]


def response_texts(policy: Policy, rollout: Rollout) -> list[str]:
    return [policy.codec.decode(ids[mask].tolist()) for ids, mask in zip(rollout.response_ids, rollout.response_mask)]


def evaluate(policy: Policy, task: Task, problems: Sequence[Problem], batch_size: int = 256) -> float:
    """Greedy exact-match accuracy on ``problems`` (``temperature=0``; no randomness is drawn)."""
    if not problems:
        return float("nan")
    with torch.no_grad():
        return _evaluate(policy, task, problems, batch_size)


def _evaluate(policy: Policy, task: Task, problems: Sequence[Problem], batch_size: int) -> float:
    correct = 0.0
    generator = torch.Generator().manual_seed(0)  # unused by greedy decoding; the protocol wants one
    for start in range(0, len(problems), batch_size):
        part = problems[start : start + batch_size]
        rollout = policy.sample(
            [policy.codec.encode(p.prompt) for p in part],
            max_new_tokens=task.max_new_tokens, temperature=0.0, generator=generator,
        )
        correct += sum(task.reward(p, text) for p, text in zip(part, response_texts(policy, rollout)))
    return correct / len(problems)


def _token_stats_no_grad(policy: Policy, rollout: Rollout, micro_batch_size: int):
    with torch.no_grad():
        parts = [policy.token_stats(rows_slice(rollout, rows)) for rows in chunks(range(len(rollout.prompt_ids)), micro_batch_size)]
    return torch.cat([p[0] for p in parts]).detach(), torch.cat([p[1] for p in parts]).detach()


def update(
    policy: Policy,
    optimizer: torch.optim.Optimizer,
    loss_fn: CompiledObjective,
    rollout: Rollout,
    rewards: torch.Tensor,
    group_ids: torch.Tensor,
    old_logprobs: torch.Tensor,
    current: tuple[torch.Tensor, torch.Tensor],
    config: TrainConfig,
    is_branch: torch.Tensor | None = None,
) -> tuple[dict[str, float], float]:
    """One optimizer step on ``rollout`` through the step API; returns (loss metrics, grad norm).

    ``current`` holds the current policy's log-probabilities and entropies (no grad) for ``gather``.
    ``is_branch`` marks DEEP-GRPO's branch rows (given when the objective has ``dual_stream``).
    When the objective's advantage reads ``grad_sq_norms`` (VCPO's baseline), each response is
    backpropagated on its own first, at the current policy (:func:`score_grad_sq_norms`).
    """
    params = policy.trainable_parameters()
    current_logprobs, current_entropy = current
    parts = chunks(range(len(rollout.prompt_ids)), config.micro_batch_size)
    grad_sq = None
    if "grad_sq_norms" in loss_fn.objective.advantage.reads:
        grad_sq = score_grad_sq_norms(policy, rollout)

    def batch(rows, logprobs, entropy) -> TokenBatch:
        idx = torch.as_tensor(rows, dtype=torch.long)
        return TokenBatch(
            logprobs=logprobs,
            old_logprobs=old_logprobs[idx],
            response_mask=rollout.response_mask[idx],
            entropy=entropy,
            rollout_logprobs=None if rollout.logprobs is None else rollout.logprobs[idx],
            rewards=rewards[idx],
            group_ids=group_ids[idx],
            grad_sq_norms=None if grad_sq is None else grad_sq[idx],
            is_branch=None if is_branch is None else is_branch[idx],
        )

    stats = loss_fn.gather([batch(rows, current_logprobs[rows], current_entropy[rows]) for rows in parts])
    optimizer.zero_grad(set_to_none=True)
    metrics = []
    for rows in parts:
        logprobs, entropy = policy.token_stats(rows_slice(rollout, rows))
        out = loss_fn(batch(rows, logprobs, entropy.detach()), step=stats)
        out.loss.backward()
        metrics.append(out.metrics)
    grad_norm = float(torch.nn.utils.clip_grad_norm_(params, config.max_grad_norm))
    scaled_step(optimizer, stats.lr_scale)
    return aggregate_metrics(metrics), grad_norm


def score_grad_sq_norms(policy: Policy, rollout: Rollout) -> torch.Tensor:
    """``[N]`` float64: ``||grad_theta sum_t log pi(y_t)||^2`` of each response, exactly (one backward per response)."""
    params = policy.trainable_parameters()
    out = torch.zeros(len(rollout.prompt_ids), dtype=torch.float64)
    for i in range(len(rollout.prompt_ids)):
        row = rollout.rows([i])
        if not bool(row.response_mask.any()):
            continue
        logprobs, _ = policy.token_stats(row)
        grads = torch.autograd.grad(logprobs[row.response_mask].sum(), params, allow_unused=True)
        out[i] = sum(float(g.double().pow(2).sum()) for g in grads if g is not None)
    return out


def scaled_step(optimizer: torch.optim.Optimizer, lr_scale: float) -> None:
    """One optimizer step with every learning rate multiplied by ``lr_scale`` (VCPO's ESS scale; 1.0 otherwise)."""
    if lr_scale == 1.0:
        optimizer.step()
        return
    base = [group["lr"] for group in optimizer.param_groups]
    for group in optimizer.param_groups:
        group["lr"] = group["lr"] * lr_scale
    try:
        optimizer.step()
    finally:
        for group, lr in zip(optimizer.param_groups, base):
            group["lr"] = lr


def rl_step(
    policy: Policy,
    optimizer: torch.optim.Optimizer,
    loss_fn: CompiledObjective,
    task: Task,
    problems: Sequence[Problem],
    sample_generator: torch.Generator,
    config: TrainConfig,
    sampler: Policy | None = None,
    explorer: PivotExplorer | None = None,
) -> dict[str, float]:
    """Sample, score and train on one step's problems; returns the step's metrics.

    ``sampler`` samples the rollouts when given (a stale copy of the policy, as an asynchronous
    trainer's inference engine); the "old" log-probabilities are still the current policy's, and
    the sampler's own log-probabilities reach the objective as ``rollout_logprobs``.

    ``explorer`` (the objective's ``rollout:``, DEEP-GRPO) adds branch rows after the G root
    responses: each pivot's K branches are one more group (ids after the prompts'), trained in the
    update of the prompt they descend from, marked ``is_branch``. The reward, entropy, length and
    ESS metrics are the root responses'.
    """
    G = config.group_size
    n = len(problems)
    prompt_ids = [policy.codec.encode(p.prompt) for p in problems for _ in range(G)]
    rollout = (sampler or policy).sample(prompt_ids, max_new_tokens=task.max_new_tokens, temperature=config.temperature,
                                         generator=sample_generator)
    texts = response_texts(policy, rollout)
    rewards = torch.tensor([task.reward(problems[i // G], text) for i, text in enumerate(texts)])
    root_rewards, roots = rewards, rollout
    group_ids = torch.arange(n).repeat_interleave(G)
    parents = group_ids
    layer_metrics: dict[str, float] = {}
    if explorer is not None:
        branches = sample_branches(explorer, sampler or policy, rollout, rewards, problems, G, task, config.temperature,
                                   sample_generator)
        layer_metrics = {f"rollout/{k}": v for k, v in branches.metrics.items()}
        if branches.rollout is not None:
            rollout = concat([rollout, branches.rollout], policy.codec.pad_id)
            rewards = torch.cat([rewards, branches.rewards])
            group_ids = torch.cat([group_ids, n + branches.pivot_ids])
            parents = torch.cat([parents, branches.parents])
    is_branch = torch.arange(len(rewards)) >= n * G
    old_logprobs, old_entropy = _token_stats_no_grad(policy, rollout, config.micro_batch_size)

    updates, grad_norms = [], []
    groups_per_update = math.ceil(n / config.updates_per_step)
    for k, groups in enumerate(chunks(range(n), groups_per_update)):
        rows = torch.isin(parents, torch.tensor(groups)).nonzero()[:, 0].tolist()
        sub = rows_slice(rollout, rows)
        idx = torch.as_tensor(rows, dtype=torch.long)
        current = (old_logprobs[idx], old_entropy[idx]) if k == 0 else _token_stats_no_grad(policy, sub, config.micro_batch_size)
        metrics, grad_norm = update(policy, optimizer, loss_fn, sub, rewards[idx], group_ids[idx], old_logprobs[idx],
                                    current, config, is_branch[idx] if loss_fn.objective.dual_stream else None)
        updates.append(metrics)
        grad_norms.append(grad_norm)

    mask = roots.response_mask
    lengths = mask.sum(-1).float()
    root_old = old_logprobs[: n * G, : mask.shape[1]]
    by_prompt = root_rewards.reshape(n, G)
    return {
        "ess_fraction": rollout_ess_fraction(root_old, roots, mask),
        "prompt_rates": by_prompt.mean(-1).tolist(),
        "zero_variance_groups": float((by_prompt == by_prompt[:, :1]).all(-1).float().mean()),
        "layers": layer_metrics,
        "reward": root_rewards.mean().item(),
        "entropy": (old_entropy[: n * G, : mask.shape[1]] * mask).sum().item() / max(1, int(mask.sum())),
        "response_length": lengths.mean().item(),
        "grad_norm": max(grad_norms),
        "loss_metrics": combine_updates(updates),
    }


def rollout_ess_fraction(old_logprobs: torch.Tensor, rollout: Rollout, mask: torch.Tensor) -> float | None:
    """ESS / N of the sequence importance weights pi_old / pi_rollout (1.0 on-policy), or None without rollout log-probs."""
    if rollout.logprobs is None:
        return None
    log_weights = ((old_logprobs - rollout.logprobs) * mask).sum(-1)
    return effective_sample_size(log_weights) / max(1, log_weights.numel())


def step_row(objective: str, step: int, metrics: dict, accuracy: float | None, mask_labels: Sequence[str]) -> dict:
    """The ``metrics.jsonl`` row of one step: fixed fields first, then the loss's own metrics."""
    loss = metrics["loss_metrics"]
    valid = loss["tokens/valid"]
    row = {
        "objective": objective,
        "step": step,
        "reward": metrics["reward"],
        "accuracy": accuracy,
        "entropy": metrics["entropy"],
        "response_length": metrics["response_length"],
        "grad_norm": metrics["grad_norm"],
        "kept_fraction": loss["tokens/kept_fraction"],
        "silenced": valid - loss["tokens/kept"],
        "silenced_fraction": (valid - loss["tokens/kept"]) / valid if valid else 0.0,
        "clip_high_fraction": loss.get("clip/high_fraction", 0.0),
        "clip_low_fraction": loss.get("clip/low_fraction", 0.0),
        "clip_dual_fraction": loss.get("clip/dual_fraction", 0.0),
        "masks": {
            label: {"kept_fraction": loss[f"mask/{label}/kept_fraction"], "silenced": loss[f"mask/{label}/silenced"]}
            for label in mask_labels
        },
        "loss": {k: v for k, v in loss.items() if not k.startswith("mask/")},
        "zero_variance_groups": metrics["zero_variance_groups"],
    }
    if metrics["layers"]:
        row["layers"] = metrics["layers"]
    return row


def add_sampler_metrics(metrics: dict, sampler_metrics: dict[str, float]) -> None:
    """Put the sampler's metrics of the step (Goldilocks' teacher) with the rollout's, under ``layers``."""
    metrics["layers"].update({f"sampler/{k}": v for k, v in sampler_metrics.items()})


def start_row(objective: str, accuracy: float) -> dict:
    """Step 0: the warm-started policy before any update (only the held-out accuracy is measured)."""
    return {"objective": objective, "step": 0, "accuracy": accuracy}


@dataclass
class ObjectiveRun:
    """What one objective's run produced."""

    objective: str
    rows: list[dict]
    wall_time: float


def train_objective(
    label: str,
    loss_fn: CompiledObjective,
    policy: Policy,
    task: Task,
    eval_problems: Sequence[Problem],
    config: TrainConfig,
    on_row: Callable[[dict], None] | None = None,
) -> ObjectiveRun:
    """RL-train ``policy`` (in place) with ``loss_fn`` for ``config.steps`` steps.

    Accuracy is measured at step 0, every ``eval_every`` steps and at the last step; other rows
    carry ``accuracy: null``.
    """
    start = time.perf_counter()
    torch.manual_seed(config.seed)
    problem_generator = torch.Generator().manual_seed(config.seed)
    sample_generator = torch.Generator().manual_seed(config.seed + 1)
    optimizer = torch.optim.Adam(policy.trainable_parameters(), lr=config.lr)
    layers = TrainerLayers(loss_fn.objective, config.seed)
    rows = [start_row(label, evaluate(policy, task, eval_problems))]
    if on_row:
        on_row(rows[-1])
    for step in range(1, config.steps + 1):
        problems = layers.problems(task, config.prompts_per_step, problem_generator)
        metrics = rl_step(policy, optimizer, loss_fn, task, problems, sample_generator, config, explorer=layers.explorer)
        add_sampler_metrics(metrics, layers.observe(problems, metrics["prompt_rates"]))
        evaluate_now = step % config.eval_every == 0 or step == config.steps
        accuracy = evaluate(policy, task, eval_problems) if evaluate_now else None
        rows.append(step_row(label, step, metrics, accuracy, loss_fn.mask_labels))
        if on_row:
            on_row(rows[-1])
    return ObjectiveRun(label, rows, time.perf_counter() - start)
