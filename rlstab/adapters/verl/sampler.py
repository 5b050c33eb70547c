r"""Goldilocks prompt selection in veRL 0.9.1: ``GoldilocksDataset``, a dataset class that picks each step's prompts.

$$\text{pool} \sim \text{Uniform}\binom{\text{dataset}}{c\,B},\qquad
  \text{step}_t = \text{top}_B\Bigl(f_\phi(q) = \tfrac12\,\sigma\bigl(w^\top\phi(q) + b\bigr)\Bigr)\ \text{(epsilon-greedy)},\qquad
  y_q = \sqrt{\hat p_q (1 - \hat p_q)}$$

Goldilocks (arXiv 2602.14868, [`Goldilocks`][rlstab.sampling.Goldilocks]): each step the trainer
draws a pool of ``candidates`` x B prompts (B = the prompts a step trains on), a teacher predicts
each one's utility sqrt(p (1 - p)) and the step trains on the B best, epsilon-greedily; once the
step's responses are scored, each trained prompt's success rate p over its group is its target
and the teacher takes ``teacher_steps`` Adam steps on its sliding window
([`GoldilocksCurriculum`][rlstab.sampling.GoldilocksCurriculum] does both).

Which veRL hook, and why a dataset. veRL 0.9.1 has no curriculum-sampler hook: its
``create_rl_sampler`` (``verl/trainer/ppo/utils.py``) builds a ``RandomSampler`` or a
``SequentialSampler`` and reads no ``data.sampler`` key, and the ``AbstractCurriculumSampler``
of earlier releases (``verl.experimental.dataset.sampler``) is not shipped. What 0.9.1 keeps:

- ``data.custom_cls.path`` / ``data.custom_cls.name``: the dataset class (``get_dataset_class`` in
  ``verl/utils/dataset/rl_dataset.py``);
- ``RayPPOTrainer.fit`` (``verl/trainer/ppo/ray_trainer.py``, the legacy trainer that
  ``trainer.use_v1=False`` runs through ``verl/trainer/main_ppo_v0.py``) calls
  ``train_dataset.on_batch_end(batch=batch)`` after every step but the last, with the scored
  ``DataProto``. The V1 trainer (``trainer.use_v1=True``, 0.9.1's default) calls no per-step hook
  on the dataset, so it is refused.

So the dataset does both halves. The dataloader (a ``StatefulDataLoader``, ``num_workers=0``)
hands it each step's B indices from veRL's own sampler in one ``__getitems__`` call; the pool is
those B plus ``(candidates - 1) x B`` further rows drawn uniformly without replacement from the rest
(with ``data.shuffle=True``, a uniform draw of ``candidates x B`` rows), and the B rows the teacher
chooses are returned instead. ``on_batch_end`` groups the batch's responses by ``uid``, takes each
response's reward as the sum of its ``token_level_scores`` (the task reward, before any KL penalty
in the reward; what veRL's ``critic/score`` metric sums) and each prompt's success rate as the mean
over its group, and trains the teacher.

Config (Hydra overrides)::

    trainer.use_v1=False
    data.custom_cls.path=pkg://rlstab.adapters.verl.sampler
    data.custom_cls.name=GoldilocksDataset
    data.dataloader_num_workers=0
    +data.goldilocks.objective=goldilocks   # or any preset / objective YAML with a sampler: section
    +data.goldilocks.seed=0          # optional; default data.seed, else 0

Without ``data.goldilocks.objective`` the objective of rlstab's loss
(``actor_rollout_ref.actor.policy_loss.objective`` and ``overrides``, when ``loss_mode=rlstab``)
is used, so one objective can name both the loss and the sampler. Any other setting is refused at
start-up with a [`ConfigError`][rlstab.ConfigError] naming the key.

What runs where: everything here runs in the process that owns the training dataloader (the
legacy ``TaskRunner`` actor), on CPU: hashing the pool's prompt texts, the teacher's prediction at
each fetch and its Adam steps after each step. The Ray workers only import the class (the agent loop
looks it up through ``get_dataset_class``).

Limits:

- The teacher reads the prompt's text (the messages' text contents joined by newlines; media
  parts stand as ``<image>``, ``<video>``, ``<audio>``), through the objective's ``featuriser``.
- The update is synchronous: the next fetch waits for the teacher's ``teacher_steps`` Adam steps.
- The first step trains on veRL's sampler's batch unchanged (the untrained teacher predicts 0.25
  for every prompt, so its choice would be uniform anyway); selection starts once the teacher has
  observed a step. The validation dataset (same class) never observes one, so it is never
  reordered.
- veRL logs no metrics from the dataset: each update's metrics (teacher error, selected utility,
  share of prompts without signal, ...) are kept in ``last_metrics``.
- Checkpoints: the teacher's state is the dataset's ``state_dict``, which the ``StatefulDataLoader``
  saves in ``data.pt``. veRL saves during a step, before that step's ``on_batch_end``, so a resumed
  teacher lacks the checkpointed step's observations; and veRL skips restoring ``data.pt`` at an
  epoch boundary, where the teacher starts afresh.
- It replaces ``data.custom_cls``; to combine it with a dataset class of your own, subclass
  ``GoldilocksDataset`` instead of ``RLHFDataset``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from omegaconf import DictConfig, OmegaConf
from verl import DataProto
from verl.utils.dataset.rl_dataset import RLHFDataset

from rlstab.adapters.verl.config import CONFIG_PATH, build_objective
from rlstab.errors import ConfigError
from rlstab.lazy import torch
from rlstab.loading import load
from rlstab.presets import closest_presets, preset_names
from rlstab.sampling import Sampler

SECTION = "data.goldilocks"
KEYS = ("objective", "seed")
REWARD_TOLERANCE = 1e-5
"""How far a response's summed ``token_level_scores`` may stray outside [0, 1] (float32 rounding) before it is refused."""


def prompt_text(messages: Any) -> str:
    """The text the teacher reads for a prompt: its messages' text contents, joined by newlines.

    Takes a dataset row's ``prompt`` (a list of ``{"role", "content"}``) or the ``raw_prompt`` veRL
    builds from it, where media placeholders have become ``{"type": "image", ...}`` parts; those
    are written back as ``<image>`` (``<video>``, ``<audio>``), so both give the same text.
    """
    if isinstance(messages, str):
        return messages
    return "\n".join(_content_text(m.get("content") if isinstance(m, dict) else m) for m in messages)


def _content_text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    parts = []
    for part in content:
        if isinstance(part, dict):
            kind = part.get("type", "text")
            parts.append(str(part.get("text", "")) if kind == "text" else f"<{kind}>")
        else:
            parts.append(str(part))
    return "".join(parts)


def prompt_outcomes(batch: DataProto) -> tuple[list[str], list[float]]:
    """Each prompt of a scored veRL batch, as its text, and its success rate over its responses.

    Responses are grouped by ``non_tensor_batch["uid"]`` (one uid per prompt, repeated over its
    ``rollout.n`` responses; the rows may be in any order); a response's reward is the sum of its
    ``token_level_scores``, which must lie in [0, 1]; the rate is the group's mean. Prompts come in
    order of first appearance.
    """
    missing = [k for k in ("uid", "raw_prompt") if k not in batch.non_tensor_batch]
    if batch.batch is None or "token_level_scores" not in batch.batch.keys():
        missing.append("token_level_scores")
    if missing:
        raise ValueError(
            f"GoldilocksDataset.on_batch_end: the batch has no {', '.join(missing)}; veRL's RayPPOTrainer.fit "
            "passes the scored batch (uid, raw_prompt, token_level_scores)"
        )
    rewards = batch.batch["token_level_scores"].double().sum(-1).tolist()
    bad = [r for r in rewards if not -REWARD_TOLERANCE <= r <= 1.0 + REWARD_TOLERANCE]
    if bad:
        raise ValueError(
            f"GoldilocksDataset: response rewards {bad[:4]} lie outside [0, 1]; Goldilocks reads a prompt's success "
            "rate as the mean reward of its responses, so the reward function must score in [0, 1]"
        )
    groups: dict[Any, tuple[str, list[float]]] = {}
    for uid, messages, reward in zip(batch.non_tensor_batch["uid"], batch.non_tensor_batch["raw_prompt"], rewards):
        group = groups.get(uid)
        if group is None:
            group = groups[uid] = (prompt_text(messages), [])
        group[1].append(min(max(reward, 0.0), 1.0))  # a sum of float32 token scores may miss 1 by a rounding
    return [text for text, _ in groups.values()], [sum(r) / len(r) for _, r in groups.values()]


def sampler_settings(data_config: DictConfig) -> tuple[Sampler, int]:
    """The objective's ``sampler:`` and the seed, from veRL's ``data`` config; ``ConfigError`` naming the key otherwise."""
    root = data_config._get_root() if isinstance(data_config, DictConfig) else None
    if root is not None and OmegaConf.select(root, "trainer.use_v1", default=None):
        raise ConfigError(
            "trainer.use_v1=True",
            [
                "veRL's V1 trainer calls no per-step hook on the dataset, so the Goldilocks teacher would never "
                "learn; set trainer.use_v1=False (RayPPOTrainer, which calls train_dataset.on_batch_end)"
            ],
        )
    workers = data_config.get("dataloader_num_workers", 0)
    if workers != 0:
        raise ConfigError(
            f"data.dataloader_num_workers={workers!r}",
            ["GoldilocksDataset chooses the prompts when the batch is fetched; set data.dataloader_num_workers=0"],
        )
    section = data_config.get("goldilocks")
    section = OmegaConf.to_container(section, resolve=True) if isinstance(section, DictConfig) else section
    if section is None:
        section = {}
    if not isinstance(section, dict):
        raise ConfigError(f"{SECTION}={section!r}", [f"must be a mapping with keys {', '.join(KEYS)}"])
    unknown = sorted(set(section) - set(KEYS))
    if unknown:
        raise ConfigError(f"{SECTION}.{unknown[0]}", [f"unknown key; allowed: {', '.join(KEYS)}"])
    seed = section.get("seed")
    if seed is None:
        seed = data_config.get("seed") or 0
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ConfigError(f"{SECTION}.seed={seed!r}", ["must be an integer"])
    objective, label = _objective(section.get("objective"), root)
    if objective.sampler is None:
        raise ConfigError(
            label,
            [
                "the objective has no sampler: section, so GoldilocksDataset has nothing to execute; "
                "add `sampler: {kind: goldilocks}` to it"
            ],
        )
    return objective.sampler, seed


def _objective(name: Any, root: DictConfig | None):
    if name is None:
        policy_loss = OmegaConf.select(root, CONFIG_PATH, default=None) if root is not None else None
        if policy_loss is None or policy_loss.get("loss_mode") != "rlstab" or policy_loss.get("objective") is None:
            raise ConfigError(
                f"{SECTION}.objective",
                [
                    "required: a preset name or objective YAML path whose objective has a sampler: section "
                    f"(+{SECTION}.objective=...), unless rlstab's loss ({CONFIG_PATH}.objective) names it"
                ],
            )
        label = f"{CONFIG_PATH}.objective={policy_loss.objective!r}"
        return build_objective(policy_loss.objective, policy_loss.get("overrides")), label
    label = f"{SECTION}.objective={name!r}"
    if not isinstance(name, str) or (name not in preset_names() and not name.endswith((".yaml", ".yml"))):
        hint = closest_presets(name) if isinstance(name, str) else "`rlstab presets` lists them"
        raise ConfigError(label, [f"neither a preset ({hint}) nor a .yaml file"])
    try:
        return load(name), label
    except ConfigError as err:
        raise ConfigError(f"{label} -> {err.source}", err.problems) from None


class GoldilocksDataset(RLHFDataset):
    """veRL's ``RLHFDataset`` whose training batches are chosen by a Goldilocks teacher (see the module).

    Args are ``RLHFDataset``'s; ``config`` is veRL's ``data`` section, read as the module says.

    Attributes:
        curriculum: the running teacher ([`GoldilocksCurriculum`][rlstab.sampling.GoldilocksCurriculum]).
        selecting: whether fetched batches are chosen by the teacher (from its first observed step on).
        last_metrics: the metrics of the last ``on_batch_end`` (veRL does not log them).
    """

    def __init__(self, data_files, tokenizer, config: DictConfig, processor=None, max_samples: int = -1):
        sampler, seed = sampler_settings(config)  # before the files are read: a config error costs nothing
        super().__init__(data_files=data_files, tokenizer=tokenizer, config=config, processor=processor, max_samples=max_samples)
        self.curriculum = sampler.curriculum(seed)  # any sampler kind's runtime (goldilocks: GoldilocksCurriculum)
        self.selecting = False
        self.last_metrics: dict[str, float] = {}
        self._texts: dict[int, str] = {}

    def prompt_text(self, index: int) -> str:
        """The teacher's text of row ``index`` (``prompt_text`` of its prompt)."""
        index = int(index)
        text = self._texts.get(index)
        if text is None:
            row = self.dataframe.select_columns([self.prompt_key])[index]
            text = self._texts[index] = prompt_text(row[self.prompt_key])
        return text

    def pool(self, indices: Sequence[int]) -> list[int]:
        """``indices`` then ``(candidates - 1) x len(indices)`` other rows, uniformly without replacement (all rows if fewer)."""
        indices = [int(i) for i in indices]
        size = min(self.curriculum.pool_size(len(indices)), len(self))
        taken = torch.zeros(len(self), dtype=torch.bool)
        taken[indices] = True
        order = torch.randperm(len(self), generator=self.curriculum.generator)
        extra = order[~taken[order]][: max(size - len(indices), 0)]
        return indices + extra.tolist()

    def choose(self, indices: Sequence[int]) -> list[int]:
        """The rows the teacher trains on instead of veRL's ``indices``: the best ``len(indices)`` of their pool."""
        pool = self.pool(indices)
        picks = self.curriculum.choose([self.prompt_text(i) for i in pool], len(indices))
        return [pool[p] for p in picks]

    def __getitems__(self, indices: Sequence[int]) -> list[dict]:
        """One fetched batch (torch's fetcher passes the whole batch of indices here)."""
        rows = self.choose(indices) if self.selecting else [int(i) for i in indices]
        return [self[i] for i in rows]

    def on_batch_end(self, batch: DataProto) -> None:
        """Train the teacher on a finished step (``RayPPOTrainer.fit`` calls it with the scored batch)."""
        texts, rates = prompt_outcomes(batch)
        self.last_metrics = self.curriculum.observe(texts, rates)
        self.selecting = True

    def state_dict(self) -> dict:
        """The teacher and the random stream; the ``StatefulDataLoader`` saves it with its own state."""
        return {"curriculum": self.curriculum.state_dict(), "selecting": self.selecting}

    def load_state_dict(self, state: dict) -> None:
        self.curriculum.load_state_dict(state["curriculum"])
        self.selecting = bool(state["selecting"])


__all__ = ["GoldilocksDataset", "prompt_outcomes", "prompt_text", "sampler_settings"]
