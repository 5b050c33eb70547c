"""What the trainer-executed layers cost in the embedded trainer: time per RL step against grpo's, same run.

For each objective (grpo first, the baseline), ``--steps`` RL steps of the embedded trainer on
``--task`` from the same warm start, timed per step, alternated ``--repeats`` times (medians):

- ``goldilocks``: a pool of 4x the step's prompts featurised and scored by the teacher, and the
  teacher's Adam steps over its window after the step;
- ``vcpo``: one extra forward and backward per response (each response's own gradient norm, for
  the off-policy optimal baseline), on top of grpo's batched passes;
- ``deep_grpo`` (one-token segments, as the lab runs it on arithmetic): K = 8 branches from a
  pivot of every failed response, sampled and trained with the root rows, so its cost grows with
  the failure rate (on ``mul2`` about nine in ten responses fail).

Absolute times are this machine's; the ratios to grpo are the point.

    python benchmarks/layers.py                       # mul2, 3 steps, 3 repeats
    python benchmarks/layers.py --task add2 --steps 5
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from rlstab.loading import load
from rlstab.trainer.config import TrainConfig
from rlstab.trainer.layers import TrainerLayers
from rlstab.trainer.loop import rl_step
from rlstab.trainer.models import load_policy
from rlstab.trainer.tasks import get_task

EXAMPLES = Path(__file__).resolve().parent.parent / "examples" / "lab"
OBJECTIVES = {"grpo": "grpo", "goldilocks": "goldilocks", "vcpo": "vcpo",
              "deep_grpo": str(EXAMPLES / "deep-grpo-tokens.yaml")}


def seconds_per_step(source: str, policy, task, steps: int) -> float:
    loss_fn = load(source).compile()
    policy = copy.deepcopy(policy)
    config = TrainConfig(steps=steps)
    layers = TrainerLayers(loss_fn.objective, 0)
    optimizer = torch.optim.Adam(policy.trainable_parameters(), lr=config.lr)
    problem_generator, sample_generator = torch.Generator().manual_seed(0), torch.Generator().manual_seed(1)
    start = time.perf_counter()
    for _ in range(steps):
        problems = layers.problems(task, config.prompts_per_step, problem_generator)
        metrics = rl_step(policy, optimizer, loss_fn, task, problems, sample_generator, config, explorer=layers.explorer)
        layers.observe(problems, metrics["prompt_rates"])
    return (time.perf_counter() - start) / steps


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", default="mul2")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    task = get_task(args.task)
    with tempfile.TemporaryDirectory() as cache:
        policy = load_policy("tiny", task, seed=0, cache_dir=cache)
        times: dict[str, list[float]] = {name: [] for name in OBJECTIVES}
        for r in range(args.repeats):
            for name, source in OBJECTIVES.items():
                times[name].append(seconds_per_step(source, policy, task, args.steps))
            print(f"repeat {r + 1}/{args.repeats} done", file=sys.stderr)
    base = statistics.median(times["grpo"])
    print(f"task {args.task}, {args.steps} steps x {args.repeats} repeats, one torch thread (medians)")
    print("| objective | s / step | / grpo |")
    print("|---|---:|---:|")
    for name, values in times.items():
        m = statistics.median(values)
        print(f"| {name} | {m:.2f} | {m / base:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
