"""``rlstab.trainer.layers.TrainerLayers``: the sampler and the rollout around the loss, seeded, saved, restored."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from rlstab.trainer.layers import TrainerLayers
from rlstab.trainer.tasks import get_task, training_problems

TASK = get_task("add2")


class Curriculum:
    """A sampler's runtime that draws a pool of 2n and picks its last and first prompts, in that order."""

    def __init__(self, seed):
        self.seed, self.seen, self.state = seed, [], {"observed": 0}

    def pool_size(self, n):
        return 2 * n

    def choose(self, prompts, n):
        self.seen.append(list(prompts))
        return [len(prompts) - 1, 0][:n]

    def observe(self, prompts, rates):
        self.state["observed"] += len(prompts)
        return {"sampler/mean_rate": sum(rates) / len(rates)}

    def state_dict(self):
        return dict(self.state)

    def load_state_dict(self, state):
        self.state = dict(state)


class Explorer:
    def __init__(self, seed):
        self.seed, self.state = seed, {"branches": 0}

    def state_dict(self):
        return dict(self.state)

    def load_state_dict(self, state):
        self.state = dict(state)


def objective(sampler=False, rollout=False):
    return SimpleNamespace(
        sampler=SimpleNamespace(curriculum=Curriculum) if sampler else None,
        rollout=SimpleNamespace(explorer=Explorer) if rollout else None,
    )


def test_without_a_sampler_the_prompts_are_drawn_uniformly():
    layers = TrainerLayers(objective(), seed=7)
    assert layers.curriculum is None and layers.explorer is None
    drawn = layers.problems(TASK, 3, torch.Generator().manual_seed(0))
    assert drawn == training_problems(TASK, 3, torch.Generator().manual_seed(0))
    assert layers.observe(drawn, [1.0, 0.0, 0.5]) == {}
    assert layers.state_dict() == {"sampler": None, "rollout": None}
    layers.load_state_dict({})  # nothing to restore: no key is read


def test_the_sampler_and_the_rollout_are_seeded_apart_from_the_run():
    layers = TrainerLayers(objective(sampler=True, rollout=True), seed=7)
    assert (layers.curriculum.seed, layers.explorer.seed) == (9, 10)  # the run's seed + 2 and + 3


def test_the_sampler_chooses_from_a_pool_drawn_uniformly():
    layers = TrainerLayers(objective(sampler=True), seed=0)
    chosen = layers.problems(TASK, 2, torch.Generator().manual_seed(0))
    pool = training_problems(TASK, 4, torch.Generator().manual_seed(0))  # pool_size(2) = 4
    assert layers.curriculum.seen == [[p.prompt for p in pool]]
    assert chosen == [pool[3], pool[0]]  # choose() gave indices 3 and 0
    assert layers.observe(chosen, [1.0, 0.0]) == {"sampler/mean_rate": 0.5}  # (1 + 0) / 2


def test_the_state_of_both_round_trips():
    layers = TrainerLayers(objective(sampler=True, rollout=True), seed=0)
    layers.observe(layers.problems(TASK, 2, torch.Generator().manual_seed(0)), [1.0, 1.0])
    layers.explorer.state["branches"] = 5
    saved = layers.state_dict()
    assert saved == {"sampler": {"observed": 2}, "rollout": {"branches": 5}}

    restored = TrainerLayers(objective(sampler=True, rollout=True), seed=0)
    assert restored.state_dict() != saved  # not vacuous: a fresh one starts elsewhere
    restored.load_state_dict(saved)
    assert restored.state_dict() == saved


def test_the_presets_layers_are_built_from_their_yaml():
    """goldilocks has a sampler and no rollout; deep_grpo a rollout and no sampler; grpo neither."""
    from rlstab.loading import load

    built = {name: TrainerLayers(load(name), seed=0) for name in ("goldilocks", "deep_grpo", "grpo")}
    assert [(layers.curriculum is not None, layers.explorer is not None) for layers in built.values()] == [
        (True, False), (False, True), (False, False)]
    chosen = built["goldilocks"].problems(TASK, 3, torch.Generator().manual_seed(0))
    pool = training_problems(TASK, built["goldilocks"].curriculum.pool_size(3), torch.Generator().manual_seed(0))
    assert len(chosen) == 3 and all(p in pool for p in chosen)
