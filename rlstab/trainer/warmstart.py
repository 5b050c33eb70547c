"""The supervised warm start of the tiny policy, cached on disk.

RL from a random character model never sees a reward: it has to be able to answer sometimes
first. The warm start trains the tiny transformer by teacher forcing on the task's demonstrations
for a few dozen steps — deliberately short, so the policy answers a modest fraction of held-out
problems (roughly a quarter to a half on ``add2``) and RL has room to improve it.

The result is cached, keyed by everything that determines it (task, seed, model shape, the
warm-start recipe and its number of steps), so every objective of a run, and every later run,
starts from exactly the same weights without retraining. Files are written atomically.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from rlstab.lazy import torch
from rlstab.trainer.policy import Rollout
from rlstab.trainer.tasks import CharCodec, Task, training_problems
from rlstab.trainer.tiny_model import TinyConfig, TinyPolicy

# Bump when the recipe below changes in a way the key does not capture.
RECIPE_VERSION = 1


@dataclass(frozen=True)
class WarmStartRecipe:
    """Supervised training of the warm start; part of the cache key."""

    steps: int = 100
    batch_size: int = 64
    lr: float = 1e-3
    weight_decay: float = 0.0


@dataclass(frozen=True)
class WarmStartInfo:
    """Where a warm start came from. ``cache_hit`` is True when the weights were loaded, not trained."""

    path: Path
    cache_hit: bool
    key: str
    facts: dict = field(default_factory=dict)
    """What the training found out, e.g. a calibrated warm start's ``steps`` and ``accuracy``."""


def default_cache_dir() -> Path:
    """``$XDG_CACHE_HOME/rlstab``, else ``~/.cache/rlstab``."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "rlstab"


def cache_key(task: Task, seed: int, config: TinyConfig, recipe: WarmStartRecipe, extra: dict | None = None) -> str:
    """A short hash of everything that determines the warm-started weights (``extra``: a calibration's rule)."""
    spec = {**(extra or {}),
        "version": RECIPE_VERSION,
        "task": task.name,
        "seed": seed,
        "model": config.as_dict(),
        "recipe": asdict(recipe),
        "torch": torch.__version__.split("+")[0],
    }
    return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:16]


def demonstrations(task: Task, problems, generator: torch.Generator) -> list[str]:
    """The warm start's responses to ``problems``: a task with several right answers draws each one
    (``random_demonstration``, from ``generator``); any other gives its one demonstration (drawing nothing)."""
    draw = getattr(task, "random_demonstration", None)
    if draw is None:
        return [task.demonstration(p) for p in problems]
    return [draw(p, generator) for p in problems]


def teacher_forcing_rollout(task: Task, codec: CharCodec, problems, texts: list[str] | None = None) -> Rollout:
    """The demonstrations of ``problems`` (or ``texts``), each followed by EOS, laid out as a rollout."""
    texts = texts if texts is not None else [task.demonstration(p) for p in problems]
    responses = [codec.encode(t) + [codec.eos_id] for t in texts]
    T = max(map(len, responses))
    ids = torch.full((len(responses), T), codec.pad_id, dtype=torch.long)
    mask = torch.zeros((len(responses), T), dtype=torch.bool)
    for i, r in enumerate(responses):
        ids[i, : len(r)] = torch.tensor(r)
        mask[i, : len(r)] = True
    return Rollout([codec.encode(p.prompt) for p in problems], ids, mask)


def train(task: Task, *, seed: int, recipe: WarmStartRecipe, config: TinyConfig | None = None,
          progress: Callable[[str], None] | None = None) -> TinyPolicy:
    """A freshly initialised tiny policy after ``recipe.steps`` supervised steps on ``task``."""
    codec = CharCodec()
    torch.manual_seed(seed)  # the initial weights
    policy = TinyPolicy.create(codec, config)
    generator = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.AdamW(policy.trainable_parameters(), lr=recipe.lr, weight_decay=recipe.weight_decay)
    every = max(1, recipe.steps // 10)
    for step in range(1, recipe.steps + 1):
        loss = supervised_step(policy, optimizer, task, codec, recipe.batch_size, generator)
        if progress and (step % every == 0 or step == recipe.steps):
            progress(f"warm start: step {step}/{recipe.steps}, loss {loss:.3f}")
    return policy


def supervised_step(policy: TinyPolicy, optimizer, task: Task, codec: CharCodec, batch_size: int,
                    generator: torch.Generator) -> float:
    """One teacher-forced step on ``batch_size`` fresh training problems; returns the step's loss."""
    problems = training_problems(task, batch_size, generator)
    batch = teacher_forcing_rollout(task, codec, problems, demonstrations(task, problems, generator))
    logprobs, _ = policy.token_stats(batch)
    mask = batch.response_mask
    loss = -(logprobs * mask).sum() / mask.sum()
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    return loss.item()


def warm_start(task: Task, *, seed: int = 0, steps: int = 100, cache_dir: Path | str | None = None,
               progress: Callable[[str], None] | None = None, config: TinyConfig | None = None) -> TinyPolicy:
    """The warm-started tiny policy for ``task``: loaded from the cache, or trained and cached.

    The returned policy's ``warm_start`` attribute is a :class:`WarmStartInfo`.
    """
    config = config or TinyConfig(vocab_size=CharCodec().vocab_size)
    recipe = WarmStartRecipe(steps=steps)
    key = cache_key(task, seed, config, recipe)
    name = f"{task.name}-tiny-seed{seed}-steps{steps}-{key}.pt"

    def build() -> tuple[TinyPolicy, dict]:
        return train(task, seed=seed, recipe=recipe, config=config, progress=progress), {}

    return cached(name, key, build, config=config, cache_dir=cache_dir, progress=progress)


def cached(name: str, key: str, build: Callable[[], tuple[TinyPolicy, dict]], *, config: TinyConfig,
           cache_dir: Path | str | None, progress: Callable[[str], None] | None) -> TinyPolicy:
    """The policy cached as ``name``, or ``build()``'s (weights and extra facts, e.g. the calibrated step count)
    saved there atomically. The policy's ``warm_start`` attribute says which, with the extra facts."""
    codec = CharCodec()
    directory = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    path = directory / "warmstart" / name
    if path.is_file():
        saved = torch.load(path, map_location="cpu", weights_only=True)
        policy = TinyPolicy.create(codec, config)
        policy.model.load_state_dict(saved["state_dict"])
        facts = saved.get("facts", {})
        if progress:
            progress(f"warm start: loaded from cache ({path.name})")
        hit = True
    else:
        policy, facts = build()
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
        os.close(fd)
        saved = {"state_dict": policy.model.state_dict(), "key": key}
        if facts:
            saved["facts"] = facts
        try:
            torch.save(saved, tmp)
            os.chmod(tmp, 0o644)  # mkstemp makes it private; a cache is not a secret
            os.replace(tmp, path)  # atomic: a concurrent or interrupted run never sees half a file
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
        if progress:
            progress(f"warm start: trained and cached ({path.name})")
        hit = False
    policy.warm_start = WarmStartInfo(path=path, cache_hit=hit, key=key, facts=dict(facts))
    return policy
