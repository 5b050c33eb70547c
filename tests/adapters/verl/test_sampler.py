"""Goldilocks prompt selection through veRL 0.9.1's own dataset factory, dataloader and step hook.

veRL 0.9.1 has no curriculum-sampler hook (its ``create_rl_sampler`` reads no ``data.sampler``);
``GoldilocksDataset`` is a ``data.custom_cls`` instead, trained from ``RayPPOTrainer.fit``'s
``train_dataset.on_batch_end(batch=batch)``. Everything here is veRL's real code on CPU without
model weights: Hydra composes veRL's ``ppo_trainer.yaml``; ``create_rl_dataset`` (through
``get_dataset_class``) builds the dataset from a small JSON-lines file; the ``StatefulDataLoader``
gets the arguments ``RayPPOTrainer._create_dataloader`` gives it, with ``create_rl_sampler``'s
sampler; each step's batch is a real ``DataProto`` shaped as ``fit`` shapes it (a uid per prompt,
the generation keys popped, ``repeat(interleave=True)``, ``union`` with the rollout's output,
rows reordered as ``_balance_batch`` may, ``token_level_scores``) and handed to ``on_batch_end``.
``verl.trainer.ppo.ray_trainer`` itself is not imported: it needs the rollout server's dependencies
(cachetools), which this environment does not install.
"""
from __future__ import annotations

import io
import json
import uuid
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import verl
from hydra import compose, initialize_config_dir
from torchdata.stateful_dataloader import StatefulDataLoader
from verl import DataProto
from verl.trainer.ppo.utils import create_rl_dataset, create_rl_sampler
from verl.utils.dataset.rl_dataset import collate_fn

from rlstab.adapters.verl.sampler import GoldilocksDataset, prompt_outcomes, prompt_text
from rlstab.errors import ConfigError

CONFIG_DIR = str(Path(verl.__file__).parent / "trainer" / "config")
N_PROMPTS, BATCH, ROLLOUT_N = 12, 2, 4
PROMPTS = [f"Compute {a} * {b}." for a, b in zip(range(3, 15), range(20, 32))]
# The objective's sampler: pool = 6 x 2 = 12 rows = the whole dataset, greedy (epsilon 0), so the
# batch the teacher takes is exactly the two prompts it rates highest.
OBJECTIVE = "extends: grpo\nsampler: {kind: goldilocks, candidates: 6, epsilon: 0.0, teacher_lr: 0.05, teacher_steps: 8}\n"
# Success patterns of the responses: prompts 0 and 1 are solved half the time (utility 0.5), the
# others never or always (utility 0).
HALF = {PROMPTS[0], PROMPTS[1]}
SYSTEM = "Answer with a number."
TEXTS = [f"{SYSTEM}\n{p}" for p in PROMPTS]  # what the teacher reads: every message's text, joined by newlines


def rewards_of(text: str) -> list[float]:
    if text in HALF:
        return [1.0, 0.0, 1.0, 0.0]
    return [1.0] * ROLLOUT_N if PROMPTS.index(text) % 2 else [0.0] * ROLLOUT_N


@pytest.fixture
def files(tmp_path):
    """A veRL-format training file (data_source, prompt messages, reward_model, extra_info) and the objective."""
    data = tmp_path / "train.jsonl"
    with data.open("w") as f:
        for i, text in enumerate(PROMPTS):
            row = {
                "data_source": "toy",
                "prompt": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": text}],
                "ability": "math",
                "reward_model": {"style": "rule", "ground_truth": "0"},
                "extra_info": {"index": i},
            }
            f.write(json.dumps(row) + "\n")
    objective = tmp_path / "goldilocks.yaml"
    objective.write_text(OBJECTIVE)
    return SimpleNamespace(data=str(data), objective=str(objective))


def config(files, *overrides, objective: bool = True):
    base = [
        "trainer.use_v1=False",
        f"data.train_files={files.data}",
        f"data.val_files={files.data}",
        "data.filter_overlong_prompts=False",
        f"data.train_batch_size={BATCH}",
        "data.dataloader_num_workers=0",
        "data.seed=7",
        "data.custom_cls.path=pkg://rlstab.adapters.verl.sampler",
        "data.custom_cls.name=GoldilocksDataset",
        f"actor_rollout_ref.rollout.n={ROLLOUT_N}",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
    ]
    if objective:
        base.append(f"+data.goldilocks.objective={files.objective}")
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base=None):
        return compose("ppo_trainer", overrides=base + list(overrides))


def trainer_loader(cfg):
    """The train dataset and dataloader as veRL's legacy TaskRunner (main_ppo_v0) and RayPPOTrainer build them."""
    train = create_rl_dataset(cfg.data.train_files, cfg.data, None, None, is_train=True)
    loader = StatefulDataLoader(
        dataset=train,
        batch_size=cfg.data.get("gen_batch_size", None) or cfg.data.train_batch_size,
        num_workers=cfg.data["dataloader_num_workers"],
        drop_last=True,
        collate_fn=collate_fn,
        sampler=create_rl_sampler(cfg.data, train),
    )
    return train, loader


# The non-tensor keys fit keeps in the driver's batch while generating; the others (raw_prompt among
# them) go to the rollout, and raw_prompt comes back among the agent loop's extra fields.
KEPT_FOR_REWARD = ("data_source", "reward_model", "extra_info", "uid")


def scored_batch(batch_dict: dict, seed: int = 0) -> DataProto:
    """The batch ``RayPPOTrainer.fit`` hands to ``on_batch_end``, with the rewards of ``rewards_of``."""
    batch = DataProto.from_single_dict(batch_dict)
    batch.non_tensor_batch["uid"] = np.array([str(uuid.uuid4()) for _ in range(len(batch.batch))], dtype=object)
    to_rollout = [key for key in batch.non_tensor_batch if key not in KEPT_FOR_REWARD]
    gen_batch = batch.pop(batch_keys=[], non_tensor_batch_keys=to_rollout)
    assert "raw_prompt" not in batch.non_tensor_batch
    gen_batch_output = gen_batch.repeat(repeat_times=ROLLOUT_N, interleave=True)
    rows, response_len = len(gen_batch_output), 5
    # What the agent loop returns: responses, their mask, and raw_prompt among its extra fields.
    rollout = DataProto.from_dict(
        tensors={
            "responses": torch.ones(rows, response_len, dtype=torch.long),
            "response_mask": torch.ones(rows, response_len, dtype=torch.long),
        },
        non_tensors={"raw_prompt": gen_batch_output.non_tensor_batch["raw_prompt"]},
    )
    batch = batch.repeat(repeat_times=ROLLOUT_N, interleave=True).union(rollout)
    batch.reorder(torch.randperm(rows, generator=torch.Generator().manual_seed(seed)))  # as _balance_batch may
    scores = torch.zeros(rows, response_len)
    left: dict[str, list[float]] = {}
    for row, messages in enumerate(batch.non_tensor_batch["raw_prompt"]):
        text = messages[-1]["content"]
        reward = left.setdefault(text, list(rewards_of(text))).pop()
        # Split over two tokens: a response's reward is the sum of its token_level_scores.
        scores[row, 1], scores[row, -1] = 0.25 * reward, 0.75 * reward
    batch.batch["token_level_scores"] = scores
    return batch


def all_prompts(dataset) -> dict:
    """One collated batch of every row, as the dataloader would fetch it."""
    return collate_fn([dataset[i] for i in range(len(dataset))])


def user_texts(batch_dict: dict) -> list[str]:
    return [messages[-1]["content"] for messages in batch_dict["raw_prompt"]]


def test_verl_builds_the_dataset_and_the_first_batch_is_its_own_samplers(files):
    cfg = config(files)
    train, loader = trainer_loader(cfg)
    assert type(train) is GoldilocksDataset and len(train) == N_PROMPTS
    assert loader.batch_size == BATCH and len(loader) == N_PROMPTS // BATCH
    # Before the teacher has observed a step, a fetch is veRL's sampler's batch unchanged (data.seed=7).
    expected = list(create_rl_sampler(cfg.data, train))[:BATCH]
    first = next(iter(loader))
    assert [info["index"] for info in first["extra_info"]] == expected
    assert not train.selecting


def test_prompt_outcomes_group_a_reordered_verl_batch_by_uid(files):
    train, _ = trainer_loader(config(files))
    batch = scored_batch(collate_fn([train[i] for i in (0, 2, 3)]), seed=3)
    assert len(batch) == 3 * ROLLOUT_N and len(set(batch.non_tensor_batch["uid"])) == 3
    texts, rates = prompt_outcomes(batch)
    # Rewards (each the sum of its two tokens, 0.25 r + 0.75 r): prompt 0 [1, 0, 1, 0] -> 2 / 4 = 0.5;
    # prompt 2 [0, 0, 0, 0] -> 0; prompt 3 [1, 1, 1, 1] -> 1.
    assert dict(zip(texts, rates)) == {TEXTS[0]: 0.5, TEXTS[2]: 0.0, TEXTS[3]: 1.0}


def test_rewards_outside_unit_interval_are_refused(files):
    train, _ = trainer_loader(config(files))
    batch = scored_batch(collate_fn([train[1]]))  # rewards [1, 0, 1, 0]
    batch.batch["token_level_scores"] *= 2.0  # [2, 0, 2, 0]: the mean, 1, would pass, the rewards do not
    with pytest.raises(ValueError, match=r"response rewards \[2\.0, 2\.0\] lie outside \[0, 1\]"):
        train.on_batch_end(batch=batch)
    assert not train.selecting and len(train.curriculum.window) == 0  # nothing observed
    batch = scored_batch(collate_fn([train[1]]))
    batch.pop(non_tensor_batch_keys=["raw_prompt"])  # an agent loop that does not return it
    with pytest.raises(ValueError, match=r"the batch has no raw_prompt"):
        train.on_batch_end(batch=batch)


def test_prompt_text_is_the_same_for_the_row_and_for_verls_structured_raw_prompt():
    row = [{"role": "user", "content": "<image>What is shown?"}]
    raw = [{"role": "user", "content": [{"type": "image", "image": "x.png"}, {"type": "text", "text": "What is shown?"}]}]
    assert prompt_text(row) == prompt_text(raw) == "<image>What is shown?"
    assert prompt_text([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"}]) == "Be brief.\n2+2?"


def test_teacher_learns_from_verl_batches_then_chooses_the_useful_prompts(files):
    train, loader = trainer_loader(config(files))
    it = iter(loader)
    first = next(it)  # step 1: veRL's own batch
    train.on_batch_end(batch=scored_batch(first))  # what RayPPOTrainer.fit calls after the step
    rates = [sum(rewards_of(t)) / ROLLOUT_N for t in user_texts(first)]
    assert train.last_metrics["selected_utility"] == pytest.approx(sum((p * (1 - p)) ** 0.5 for p in rates) / BATCH)
    assert train.last_metrics["window"] == 2.0
    assert "teacher_mse" not in train.last_metrics  # the teacher did not choose step 1
    assert train.selecting
    for step in range(5):  # five steps over every prompt
        train.on_batch_end(batch=scored_batch(all_prompts(train), seed=step))
    # Rates: prompts 0 and 1 p = 0.5 (utility sqrt(0.25) = 0.5), the ten others p = 0 or 1 (utility 0):
    # selected utility (0.5 + 0.5) / 12 = 1/12; without signal 10/12; window 2 + 5 x 12 = 62.
    assert train.last_metrics["selected_utility"] == pytest.approx(1 / 12)
    assert train.last_metrics["selected_without_signal"] == pytest.approx(10 / 12)
    assert train.last_metrics["window"] == 62.0
    predicted = train.curriculum.predict(TEXTS)
    half = [PROMPTS.index(t) for t in sorted(HALF)]
    others = [i for i in range(N_PROMPTS) if i not in half]
    assert float(predicted[half].min()) > float(predicted[others].max())
    # Step 2: the pool is the whole dataset (6 x 2 = 12 rows) and epsilon 0, so the batch is the two
    # p = 0.5 prompts, the higher prediction first.
    chosen = user_texts(next(it))
    best_first = sorted(half, key=lambda i: -float(predicted[i]))
    assert chosen == [PROMPTS[i] for i in best_first]
    train.on_batch_end(batch=scored_batch(collate_fn([train[PROMPTS.index(t)] for t in chosen])))
    # Both chosen prompts had p = 0.5: selected utility 0.5, none without signal; the teacher's
    # predictions at the choice are in the metrics.
    metrics = train.last_metrics
    assert metrics["selected_utility"] == pytest.approx(0.5) and metrics["selected_without_signal"] == 0.0
    assert metrics["pool_predicted_utility"] == pytest.approx(float(predicted.mean()))
    assert metrics["selected_predicted_utility"] == pytest.approx(float(predicted[half].mean()))
    assert metrics["teacher_mse"] == pytest.approx(float(((predicted[half] - 0.5) ** 2).mean()))


def test_the_pool_is_the_fetched_rows_then_distinct_others(files, tmp_path):
    objective = tmp_path / "pool.yaml"
    objective.write_text("extends: grpo\nsampler: {kind: goldilocks, candidates: 3}\n")
    train, _ = trainer_loader(config(files, f"+data.goldilocks.objective={objective}", objective=False))
    pool = train.pool([4, 9])
    # 3 x 2 = 6 rows: the two fetched, then four others, all distinct.
    assert pool[:2] == [4, 9] and len(pool) == 6 and len(set(pool)) == 6
    assert all(0 <= i < N_PROMPTS for i in pool)
    chosen = train.choose([4, 9])
    assert len(chosen) == 2 and len(set(chosen)) == 2


RLSTAB_LOSS = [
    "actor_rollout_ref.actor.policy_loss._target_=rlstab.adapters.verl.RlstabPolicyLossConfig",
    "actor_rollout_ref.actor.policy_loss.loss_mode=rlstab",
    "+actor_rollout_ref.actor.policy_loss.objective=grpo",
]


def test_without_data_key_the_objective_of_rlstabs_loss_is_used(files):
    sampler = "+actor_rollout_ref.actor.policy_loss.overrides={sampler:{kind:goldilocks,epsilon:0.25}}"
    cfg = config(files, *RLSTAB_LOSS, sampler, objective=False)
    train, _ = trainer_loader(cfg)
    assert train.curriculum.config.epsilon == 0.25


@pytest.mark.parametrize(
    ("overrides", "objective", "message"),
    [
        ((), False, r"data\.goldilocks\.objective: required: a preset name or objective YAML path"),
        (RLSTAB_LOSS, False, r"actor_rollout_ref\.actor\.policy_loss\.objective='grpo': the objective has no sampler: section"),
        (("+data.goldilocks.objective=grpo",), False, r"data\.goldilocks\.objective='grpo': the objective has no sampler: section"),
        (("+data.goldilocks.objective=grpoo",), False, r"data\.goldilocks\.objective='grpoo': neither a preset \(did you mean 'grpo'"),
        (("+data.goldilocks.objectiv=grpo",), True, r"data\.goldilocks\.objectiv: unknown key; allowed: objective, seed"),
        (("+data.goldilocks.seed=one",), True, r"data\.goldilocks\.seed='one': must be an integer"),
        (("trainer.use_v1=True",), True, r"trainer\.use_v1=True: veRL's V1 trainer calls no per-step hook"),
        (("data.dataloader_num_workers=8",), True, r"data\.dataloader_num_workers=8: .*set data\.dataloader_num_workers=0"),
    ],
)
def test_config_errors_are_one_line_naming_the_key(files, overrides, objective, message):
    cfg = config(files, *overrides, objective=objective)
    with pytest.raises(ConfigError, match="^" + message) as err:
        create_rl_dataset(cfg.data.train_files, cfg.data, None, None)
    assert "\n" not in str(err.value)


def test_objective_yaml_errors_name_the_key_and_the_file(files, tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("extends: grpo\nsampler: {kind: goldilocks, epsilon: 2}\n")
    cfg = config(files, f"+data.goldilocks.objective={bad}", objective=False)
    with pytest.raises(ConfigError, match=r"^data\.goldilocks\.objective='.*bad\.yaml' -> .*bad\.yaml: sampler\.epsilon = 2"):
        create_rl_dataset(cfg.data.train_files, cfg.data, None, None)


def run_steps(train, it, steps: int, seed: int) -> list[list[str]]:
    """``steps`` of fetch, score, ``on_batch_end``; the user prompts of each batch."""
    out = []
    for step in range(steps):
        batch_dict = next(it)
        out.append(user_texts(batch_dict))
        train.on_batch_end(batch=scored_batch(batch_dict, seed=seed + step))
    return out


def test_checkpoint_round_trip_through_the_stateful_dataloader_continues_identically(files, tmp_path):
    # A random pool (2 x 2 of 12 rows) and exploration, so the random stream matters as well as the teacher.
    objective = tmp_path / "explore.yaml"
    objective.write_text("extends: grpo\nsampler: {kind: goldilocks, candidates: 2, epsilon: 0.5}\n")
    cfg = config(files, f"+data.goldilocks.objective={objective}", objective=False)
    train, loader = trainer_loader(cfg)
    it = iter(loader)
    run_steps(train, it, 2, seed=0)
    # What RayPPOTrainer._save_checkpoint / _load_checkpoint do: torch.save(loader.state_dict()) to data.pt.
    buffer = io.BytesIO()
    torch.save(loader.state_dict(), buffer)
    assert loader.state_dict()["dataset_state"]["selecting"] is True  # the dataset's state is in the loader's
    uninterrupted = run_steps(train, it, 3, seed=10)

    buffer.seek(0)
    resumed_train, resumed_loader = trainer_loader(config(files, f"+data.goldilocks.objective={objective}", objective=False))
    resumed_loader.load_state_dict(torch.load(buffer, weights_only=False))
    resumed = run_steps(resumed_train, iter(resumed_loader), 3, seed=10)
    assert resumed == uninterrupted
    for name, value in train.curriculum.state_dict().items():
        if isinstance(value, torch.Tensor):
            assert torch.equal(value, resumed_train.curriculum.state_dict()[name])
