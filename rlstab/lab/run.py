"""One run of the lab: an objective trained under a regime from a seed, checkpointed and resumable.

The loop is the embedded trainer's (``rlstab.demo.trainer``): each RL step samples, scores and
trains through the compiled objective's step API. Around it, the lab adds what a long grid needs:

- **policy lag**: with ``regime.policy_lag = k`` the rollouts of step ``s`` are sampled by the
  policy as it was after step ``s - 1 - k`` (the warm start while ``s <= k + 1``), as an asynchronous
  trainer's inference engine lags its trainer. The "old" log-probabilities are still recomputed by
  the current policy (as veRL does), and the sampler's own log-probabilities reach the objective
  as ``rollout_logprobs``: the mismatch TIS, IcePop, rollout rejection and VCPO's ESS scale read;
- **checkpoints** every ``checkpoint_every`` steps, atomically: the trainable weights, Adam's
  state, the compiled objective's ``state_dict()``, the three random streams (problems, sampling,
  torch's global one), the lagged weights and every metrics row so far. A rerun resumes from the
  last one and ends with the same rows as a run never interrupted (the per-step ``time`` is the
  only field that differs: it is measured, not computed);
- one torch thread per run, so its numbers do not depend on how many runs share the machine.
"""

from __future__ import annotations

import collections
import copy
import json
import time
from collections.abc import Callable
from pathlib import Path

from rlstab.demo.layers import TrainerLayers
from rlstab.demo.models import load_policy
from rlstab.demo.tasks import get_task, held_out_problems
from rlstab.demo.trainer import TrainConfig, add_sampler_metrics, evaluate, rl_step, start_row, step_row
from rlstab.lab.checkpoint import (
    SUMMARY_FILE,
    append_row,
    load_checkpoint,
    read_rows,
    save_checkpoint,
    write_json,
    write_rows,
)
from rlstab.lab.spec import RunSpec, write_spec
from rlstab.lab.summary import run_summary
from rlstab.lazy import torch
from rlstab.loading import load

CHECKPOINT_EVERY = 10


def train_config(spec: RunSpec) -> TrainConfig:
    r = spec.regime
    return TrainConfig(
        steps=spec.steps, seed=spec.seed, group_size=r.group_size, prompts_per_step=r.prompts_per_step,
        micro_batch_size=r.micro_batch_size, updates_per_step=r.updates_per_step, lr=r.lr,
        temperature=r.temperature, max_grad_norm=r.max_grad_norm, eval_every=r.eval_every,
    )


def _weights(policy) -> list[torch.Tensor]:
    return [p.detach().clone() for p in policy.trainable_parameters()]


@torch.no_grad()
def _set_weights(policy, weights: list[torch.Tensor]) -> None:
    for p, w in zip(policy.trainable_parameters(), weights, strict=True):
        p.copy_(w)


def execute(
    spec: RunSpec,
    folder: Path | str,
    *,
    cache_dir: Path | str | None = None,
    checkpoint_every: int = CHECKPOINT_EVERY,
    on_step: Callable[[int], None] | None = None,
) -> dict:
    """Run (or finish, or just read) ``spec``'s run in ``folder``; returns ``{"summary", "rows"}``.

    A finished run (``summary.json`` present) is read, not retrained; an interrupted one resumes from
    its checkpoint. The caller checks ``folder``'s ``spec.json`` against ``spec`` first
    (``rlstab.lab.spec.mismatch``).
    """
    folder = Path(folder)
    if (folder / SUMMARY_FILE).exists():
        return {"summary": json.loads((folder / SUMMARY_FILE).read_text()), "rows": read_rows(folder)}
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _train(spec, folder, cache_dir, checkpoint_every, on_step)
    finally:
        torch.set_num_threads(threads)


def _train(spec: RunSpec, folder: Path, cache_dir, checkpoint_every: int, on_step) -> dict:
    write_spec(spec, folder)
    config = train_config(spec)
    task = get_task(spec.task)
    policy = load_policy(spec.model, task, seed=spec.seed, cache_dir=cache_dir, warm_start_steps=spec.regime.warmup_steps)
    loss_fn = load(spec.objective).compile()
    eval_problems = held_out_problems(task, spec.regime.eval_size)
    lag = spec.regime.policy_lag
    sampler = copy.deepcopy(policy) if lag else None

    torch.manual_seed(spec.seed)
    problem_generator = torch.Generator().manual_seed(spec.seed)
    sample_generator = torch.Generator().manual_seed(spec.seed + 1)
    optimizer = torch.optim.Adam(policy.trainable_parameters(), lr=config.lr)
    snapshots: collections.deque[list[torch.Tensor]] = collections.deque(maxlen=lag + 1)
    layers = TrainerLayers(loss_fn.objective, spec.seed)

    saved = load_checkpoint(folder)
    if saved is None:
        first = 1
        rows = [start_row(spec.label, evaluate(policy, task, eval_problems))]
        snapshots.append(_weights(policy))
        write_rows(folder, rows)
    else:
        first = saved["step"] + 1
        rows = saved["rows"]
        _set_weights(policy, saved["weights"])
        optimizer.load_state_dict(saved["optimizer"])
        loss_fn.load_state_dict(saved["objective_state"])
        problem_generator.set_state(saved["problem_rng"])
        sample_generator.set_state(saved["sample_rng"])
        torch.set_rng_state(saved["torch_rng"])
        snapshots.extend(saved["snapshots"])
        layers.load_state_dict(saved["layers"])
        write_rows(folder, rows)  # drop rows a killed run wrote after its last checkpoint

    for step in range(first, spec.steps + 1):
        started = time.perf_counter()
        if sampler is not None:
            _set_weights(sampler, snapshots[0])
        problems = layers.problems(task, config.prompts_per_step, problem_generator)
        metrics = rl_step(policy, optimizer, loss_fn, task, problems, sample_generator, config, sampler=sampler,
                          explorer=layers.explorer)
        add_sampler_metrics(metrics, layers.observe(problems, metrics["prompt_rates"]))
        evaluate_now = step % config.eval_every == 0 or step == spec.steps
        accuracy = evaluate(policy, task, eval_problems) if evaluate_now else None
        row = step_row(spec.label, step, metrics, accuracy, loss_fn.mask_labels)
        row["ess_fraction"] = metrics["ess_fraction"]
        row["time"] = time.perf_counter() - started
        rows.append(row)
        append_row(folder, row)
        if lag:
            snapshots.append(_weights(policy))
        if step % checkpoint_every == 0 and step < spec.steps:
            save_checkpoint(folder, {
                "step": step, "rows": rows, "weights": _weights(policy), "optimizer": optimizer.state_dict(),
                "objective_state": loss_fn.state_dict(), "problem_rng": problem_generator.get_state(),
                "sample_rng": sample_generator.get_state(), "torch_rng": torch.get_rng_state(),
                "snapshots": list(snapshots), "layers": layers.state_dict(),
            })
        if on_step:
            on_step(step)

    summary = run_summary(rows)
    write_json(folder / SUMMARY_FILE, summary)
    (folder / "checkpoint.pt").unlink(missing_ok=True)
    return {"summary": summary, "rows": rows}
