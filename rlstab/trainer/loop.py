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

``rlstab.trainer.run.Run`` drives it step by step, from a seed and a ``TrainConfig``. Held-out
accuracy is greedy exact match on a fixed held-out set.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

from rlstab.batch import TokenBatch
from rlstab.lazy import torch
from rlstab.metrics import EXTREMES, STEP_COUNTS, Combines, combine, extreme
from rlstab.regularisers import EntropyBonus
from rlstab.step.ess import effective_sample_size
from rlstab.trainer.branching import concat, sample_branches
from rlstab.trainer.policy import Policy, Rollout
from rlstab.trainer.tasks import Problem, Task

if TYPE_CHECKING:
    from rlstab.compiled import CompiledObjective
    from rlstab.exploration.deep_grpo import PivotExplorer
    from rlstab.trainer.config import TrainConfig
    from rlstab.trainer.mechanism import StepMeter


def combine_updates(updates: Sequence[tuple[dict[str, float], dict[str, Combines]]]) -> dict[str, float]:
    """A whole RL step's loss metrics from its optimizer updates' ``(metrics, kinds)`` (``rlstab.metrics.combine``'s
    result and each metric's kind).

    Sums add up; the step's denominators (``STEP_COUNTS``) add up too, each update being a step of
    its own; minima and maxima take the extreme over the updates with valid tokens; every other metric (means, fractions, the updates' other step values) is weighted by
    each update's valid tokens.
    """
    if len(updates) == 1:
        return dict(updates[0][0])
    out: dict[str, float] = {}
    for name in dict.fromkeys(k for metrics, _ in updates for k in metrics):
        have = [(metrics, kinds) for metrics, kinds in updates if name in metrics]
        values = [metrics[name] for metrics, _ in have]
        kind = have[0][1][name]
        if kind == "sum" or name in STEP_COUNTS:
            out[name] = sum(values)
        elif kind in EXTREMES:
            out[name] = extreme(kind, values, [metrics["tokens/valid"] for metrics, _ in have])
        else:
            weights = [metrics["tokens/valid"] for metrics, _ in have]
            out[name] = sum(v * w for v, w in zip(values, weights)) / (sum(weights) or 1.0)
    return out


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
    logprobs, entropy, _ = _old_policy_pass(policy, rollout, micro_batch_size)
    return logprobs, entropy


def _old_policy_pass(policy: Policy, rollout: Rollout, micro_batch_size: int, sum_squares: bool = False):
    """``(logprobs, entropy, sum_pi_squared or None)``, ``[N, T]`` each, without gradient, micro-batch by micro-batch.

    ``sum_squares``: also ``sum_v pi(v)^2`` at each position (``Policy.token_distribution``), which the
    optimal token baseline reads (``TokenBatch.sum_pi_squared``), from this same pass as veRL's
    ``calculate_sum_pi_squared`` takes it from its old-log-prob pass.
    """
    rows = chunks(range(len(rollout.prompt_ids)), micro_batch_size)
    with torch.no_grad():
        if sum_squares:
            parts = [policy.token_distribution(rows_slice(rollout, r)) for r in rows]
        else:
            parts = [(*policy.token_stats(rows_slice(rollout, r)), None) for r in rows]
    squares = torch.cat([p[2] for p in parts]).detach() if sum_squares else None
    return torch.cat([p[0] for p in parts]).detach(), torch.cat([p[1] for p in parts]).detach(), squares


def _old_proxy_pass(policy: Policy, loss_fn: CompiledObjective, rollout: Rollout, micro_batch_size: int):
    """``[N, T]`` Lp-Reg's proxy log-probabilities under the old policy (no gradient), or None when no
    component reads ``TokenBatch.proxy_logprobs``; ``min_p`` is the reading component's (``lp_reg``'s)."""
    readers = loss_fn.readers("proxy_logprobs")
    if not readers:
        return None
    surrogate = loss_fn.objective.surrogate
    if "proxy_logprobs" not in surrogate.reads:
        raise ValueError(f"{readers} read TokenBatch.proxy_logprobs, which the embedded trainer computes only for "
                         "the surrogate lp_reg (its min_p)")
    min_p = surrogate.min_p
    with torch.no_grad():
        parts = [policy.proxy_logprobs(rows_slice(rollout, r), min_p)
                 for r in chunks(range(len(rollout.prompt_ids)), micro_batch_size)]
    return torch.cat(parts).detach()


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
    meter: StepMeter | None = None,
    sum_pi_squared: torch.Tensor | None = None,
    proxy_logprobs: torch.Tensor | None = None,
) -> tuple[tuple[dict[str, float], dict[str, Combines]], float]:
    """One optimizer step on ``rollout`` through the step API; returns ((loss metrics, their kinds), grad norm).

    The loss metrics are the micro-batches' combined by their kinds (``rlstab.metrics.combine``).

    ``current`` holds the current policy's log-probabilities and entropies (no grad) for ``gather``.
    ``is_branch`` marks DEEP-GRPO's branch rows (given when the objective has ``dual_stream``).
    When the objective's advantage reads ``grad_sq_norms`` (VCPO's baseline), each response is
    backpropagated on its own first, at the current policy (:func:`score_grad_sq_norms`).
    ``meter`` (``TrainConfig.instruments``) measures the update's mechanism after ``gather``, at the
    parameters the update's gradient is taken at, touching nothing the update reads.
    ``sum_pi_squared`` (the old policy's, given when the objective's advantage reads it: the optimal
    token baseline) reaches the batches as ``TokenBatch.sum_pi_squared``; ``proxy_logprobs`` (the old
    policy's min-p proxy, given when a component reads it: Lp-Reg) as ``TokenBatch.proxy_logprobs``.
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
            sum_pi_squared=None if sum_pi_squared is None else sum_pi_squared[idx],
            proxy_logprobs=None if proxy_logprobs is None else proxy_logprobs[idx],
            token_ids=rollout.response_ids[idx],
        )

    state_before = loss_fn.state_dict() if meter is not None else None
    stats = loss_fn.gather([batch(rows, current_logprobs[rows], current_entropy[rows]) for rows in parts])
    if meter is not None:
        meter.measure(policy, rollout, parts, batch, current, stats, state_before)
    optimizer.zero_grad(set_to_none=True)
    metrics = []
    # an entropy bonus (entropy_bonus, adaptive_entropy) needs the entropy's gradient
    entropy_grad = any(isinstance(r, EntropyBonus) for r in loss_fn.objective.regularisers)
    for rows in parts:
        logprobs, entropy = policy.token_stats(rows_slice(rollout, rows), entropy_grad=entropy_grad)
        out = loss_fn(batch(rows, logprobs, entropy if entropy_grad else entropy.detach()), step=stats)
        out.loss.backward()
        metrics.append(out.metrics)
    grad_norm = float(torch.nn.utils.clip_grad_norm_(params, config.max_grad_norm))
    scaled_step(optimizer, stats.lr_scale)
    kinds = {name: part.combines(name) for part in metrics for name in part}
    return (combine(metrics), kinds), grad_norm


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
    squares = "sum_pi_squared" in loss_fn.objective.advantage.reads
    old_logprobs, old_entropy, old_squares = _old_policy_pass(policy, rollout, config.micro_batch_size, squares)
    old_proxy = _old_proxy_pass(policy, loss_fn, rollout, config.micro_batch_size)

    meter = None
    if config.instruments:
        from rlstab.trainer.mechanism import StepMeter

        meter = StepMeter(loss_fn)
    updates, grad_norms = [], []
    groups_per_update = math.ceil(n / config.updates_per_step)
    for k, groups in enumerate(chunks(range(n), groups_per_update)):
        rows = torch.isin(parents, torch.tensor(groups)).nonzero()[:, 0].tolist()
        sub = rows_slice(rollout, rows)
        idx = torch.as_tensor(rows, dtype=torch.long)
        current = (old_logprobs[idx], old_entropy[idx]) if k == 0 else _token_stats_no_grad(policy, sub, config.micro_batch_size)
        metrics, grad_norm = update(policy, optimizer, loss_fn, sub, rewards[idx], group_ids[idx], old_logprobs[idx],
                                    current, config, is_branch[idx] if loss_fn.objective.dual_stream else None, meter,
                                    None if old_squares is None else old_squares[idx],
                                    None if old_proxy is None else old_proxy[idx])
        updates.append(metrics)
        grad_norms.append(grad_norm)

    mask = roots.response_mask
    lengths = mask.sum(-1).float()
    root_old = old_logprobs[: n * G, : mask.shape[1]]
    by_prompt = root_rewards.reshape(n, G)
    mechanism = {} if meter is None else {"mechanism": meter.result()}
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
        **mechanism,
    }


def rollout_ess_fraction(old_logprobs: torch.Tensor, rollout: Rollout, mask: torch.Tensor) -> float | None:
    """ESS / N of the sequence importance weights pi_old / pi_rollout (1.0 on-policy), or None without rollout log-probs."""
    if rollout.logprobs is None:
        return None
    log_weights = ((old_logprobs - rollout.logprobs) * mask).sum(-1)
    return effective_sample_size(log_weights) / max(1, log_weights.numel())


def add_sampler_metrics(metrics: dict, sampler_metrics: dict[str, float]) -> None:
    """Put the sampler's metrics of the step (Goldilocks' teacher) with the rollout's, under ``layers``."""
    metrics["layers"].update({f"sampler/{k}": v for k, v in sampler_metrics.items()})
