"""A warm start calibrated per seed into a held-out accuracy band, cached like the plain one.

A fixed number of supervised steps leaves different seeds at very different accuracies (on
``add2``, 400 steps gave 80% on seed 0 and 98-100% on seeds 2-4). The calibrated warm start
instead stops each seed where its accuracy enters a band chosen before the experiment.

**The band rule.** Train exactly as the plain warm start does (``rlstab.trainer.warmstart.train``:
the same initial weights, problem stream and AdamW recipe from the seed), and after every
``CHECK_EVERY`` supervised steps measure the greedy exact-match accuracy on the task's held-out
problems (``held_out_problems(task, eval_size)``, the set the RL run evaluates on). The warm start
is the policy at the first check whose accuracy ``a`` satisfies ``low <= a <= high``. When no check
up to ``max_steps`` does, it is the policy at the check nearest the band (distance
``low - a`` below it, ``a - high`` above it; the earliest on a tie), and its facts say
``in_band: False``. The rule draws no randomness of its own, so it is deterministic given the seed;
the band, the check interval, the evaluation size and ``max_steps`` are part of the cache key.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path

from rlstab.lazy import torch
from rlstab.trainer.loop import evaluate
from rlstab.trainer.tasks import CharCodec, Task, held_out_problems
from rlstab.trainer.tiny_model import TinyConfig, TinyPolicy
from rlstab.trainer.warmstart import WarmStartRecipe, cache_key, cached, supervised_step

CHECK_EVERY = 5
"""Supervised steps between two accuracy checks."""
MAX_STEPS = 1000
"""The most supervised steps when no maximum is given."""


def distance(accuracy: float, band: tuple[float, float]) -> float:
    """How far ``accuracy`` lies outside ``band``: 0 inside, ``low - a`` below, ``a - high`` above."""
    low, high = band
    return max(0.0, low - accuracy, accuracy - high)


def train_into_band(task: Task, *, seed: int, band: tuple[float, float], max_steps: int, eval_size: int = 256,
                    config: TinyConfig | None = None, recipe: WarmStartRecipe | None = None,
                    progress: Callable[[str], None] | None = None) -> tuple[TinyPolicy, dict]:
    """The policy the band rule picks, and its facts ``{"steps", "accuracy", "in_band"}``."""
    codec = CharCodec()
    recipe = recipe or WarmStartRecipe()
    torch.manual_seed(seed)  # the initial weights, as rlstab.trainer.warmstart.train
    policy = TinyPolicy.create(codec, config)
    generator = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.AdamW(policy.trainable_parameters(), lr=recipe.lr, weight_decay=recipe.weight_decay)
    held_out = held_out_problems(task, eval_size)
    best: tuple[float, int, float, dict] | None = None  # (distance, step, accuracy, weights)
    for step in range(1, max_steps + 1):
        supervised_step(policy, optimizer, task, codec, recipe.batch_size, generator)
        if step % CHECK_EVERY and step != max_steps:
            continue
        accuracy = evaluate(policy, task, held_out)
        if progress:
            progress(f"warm start: step {step}, held-out accuracy {accuracy:.3f} (band {band[0]:g}-{band[1]:g})")
        if distance(accuracy, band) == 0.0:
            return policy, {"steps": step, "accuracy": accuracy, "in_band": True}
        if best is None or distance(accuracy, band) < best[0]:
            best = (distance(accuracy, band), step, accuracy, copy.deepcopy(policy.model.state_dict()))
    assert best is not None  # max_steps >= 1, so there was a check
    policy.model.load_state_dict(best[3])
    return policy, {"steps": best[1], "accuracy": best[2], "in_band": False}


def banded_warm_start(task: Task, *, seed: int = 0, band: tuple[float, float], max_steps: int | None = None,
                      eval_size: int = 256, cache_dir: Path | str | None = None,
                      progress: Callable[[str], None] | None = None, config: TinyConfig | None = None) -> TinyPolicy:
    """The tiny policy for ``task`` warm-started into ``band`` by the band rule: loaded from the cache, or trained
    and cached. ``policy.warm_start.facts`` holds the steps it took and its held-out accuracy."""
    low, high = band
    if not 0.0 <= low <= high <= 1.0:
        raise ValueError(f"a warm-start band is (low, high) with 0 <= low <= high <= 1, not {band}")
    config = config or TinyConfig(vocab_size=CharCodec().vocab_size)
    max_steps = max_steps or MAX_STEPS
    recipe = WarmStartRecipe(steps=max_steps)
    rule = {"band": [low, high], "check_every": CHECK_EVERY, "eval_size": eval_size}
    key = cache_key(task, seed, config, recipe, rule)
    name = f"{task.name}-tiny-seed{seed}-band{low:g}-{high:g}-{key}.pt"

    def build():
        return train_into_band(task, seed=seed, band=(low, high), max_steps=max_steps, eval_size=eval_size,
                               config=config, recipe=recipe, progress=progress)

    return cached(name, key, build, config=config, cache_dir=cache_dir, progress=progress)
