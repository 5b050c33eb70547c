"""rlstab's outcome advantage estimators against veRL 0.9.1's own functions, within 1e-6.

veRL's estimators take ``token_level_rewards`` ``[B, T]`` (the outcome reward on one token of the
response), ``response_mask`` and the prompt index (a numpy array of uids), over the whole training
batch, and return ``[B, T]`` advantages (the response's value on its tokens, 0 elsewhere). The
same responses go through rlstab twice:

- the estimator's step API: ``fit`` on the whole step, ``apply`` to each of three micro-batches
  (so a group split across micro-batches is exact);
- end to end, through a compiled objective's ``gather`` over the micro-batches and each
  micro-batch's loss: with ``surrogate: none`` on-policy (ratio 1) and ``token-sum`` aggregation,
  the gradient of the loss with respect to a token's log-probability is minus its advantage.

rlstab's batches also carry padding rows (no response token) with junk rewards and group ids,
which veRL never sees: they get advantage 0 and change nothing else. Group sizes are uneven, with
groups of one (except for ``grpo_passk``, which needs two), rewards are 0/1 or continuous, and
responses have uneven lengths.

Mapping: veRL ``gpg`` = ``{kind: gpg, alpha: nonzero_rewards}``; ``opo`` = ``{kind: opo}``;
``grpo_passk`` = ``{kind: grpo_passk}`` (``normalize_std`` = ``norm_adv_by_std_in_grpo``);
``reinforce_plus_plus_baseline`` = ``{kind: reinforce_pp, subtract_group_mean: true}``;
``reinforce_plus_plus`` (gamma 1) = ``{kind: reinforce_pp}``; ``gdpo`` = ``{kind: gdpo}``
with ``TokenBatch.reward_components`` holding the columns of ``algorithm.gdpo_reward_keys``
(weights ``algorithm.gdpo_reward_weights``), or ``{kind: gdpo, source: rewards}`` for veRL's
fallback on ``token_level_rewards``.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch
from verl.trainer.config import AlgoConfig
from verl.trainer.ppo import core_algos

import rlstab
from rlstab import TokenBatch
from rlstab.advantages import GDPO, GPG, OPO, GRPOPassK, ReinforcePP

SEEDS = range(6)
SPLITS = (0, 4, 9)  # three micro-batches: rows [0, 4), [4, 9), [9, B)


def random_step(seed: int, *, min_group: int = 1, continuous: bool = False, dims: int = 0, B: int = 14, T: int = 9):
    """Responses of uneven groups and lengths, in shuffled order; returns veRL's view and rlstab's rows.

    rlstab's rows are veRL's plus two padding rows (inserted at rows 3 and 10) with a NaN reward and
    a group id no response has.
    """
    g = torch.Generator().manual_seed(seed)
    sizes = []
    while sum(sizes) < B:
        sizes.append(int(torch.randint(min_group, 5, (1,), generator=g)))
    sizes[-1] -= sum(sizes) - B
    if sizes[-1] < min_group:
        sizes[-2] += sizes.pop()
    groups = torch.cat([torch.full((n,), 100 + k) for k, n in enumerate(sizes)])[torch.randperm(B, generator=g)]
    if continuous:
        rewards = torch.randn(B, generator=g).round(decimals=1)
    else:
        rewards = torch.randint(0, 2, (B,), generator=g).float()
    components = torch.randint(0, 3, (B, dims), generator=g).float() * torch.rand(dims, generator=g) if dims else None
    lengths = torch.randint(1, T + 1, (B,), generator=g)
    mask = torch.arange(T) < lengths[:, None]
    return {"rewards": rewards, "groups": groups, "mask": mask, "components": components}


def verl_rewards(step) -> torch.Tensor:
    """``token_level_rewards``: the outcome reward on the last response token, as veRL's reward manager puts it."""
    mask = step["mask"]
    last = mask.sum(-1) - 1
    out = torch.zeros(mask.shape)
    out[torch.arange(mask.shape[0]), last] = step["rewards"]
    return out


def with_padding(step):
    """rlstab's rows: veRL's, with padding rows inserted at rows 3 and 10."""
    B, T = step["mask"].shape
    order = list(range(B))
    order.insert(3, B)
    order.insert(10, B + 1)
    index = torch.tensor(order)
    rewards = torch.cat([step["rewards"], torch.tensor([float("nan"), float("nan")])])[index]
    groups = torch.cat([step["groups"], torch.tensor([7, 8])])[index]
    mask = torch.cat([step["mask"], torch.zeros(2, T, dtype=torch.bool)])[index]
    components = step["components"]
    if components is not None:
        components = torch.cat([components, torch.full((2, components.shape[1]), float("nan"))])[index]
    real = torch.tensor([i < B for i in order])
    return {"rewards": rewards, "groups": groups, "mask": mask, "components": components, "real": real}


def by_step_api(estimator, rows) -> torch.Tensor:
    """``[B]`` advantages: ``fit`` on the whole step, then each micro-batch's (as the compiler does)."""
    mask, real = rows["mask"], rows["real"]
    extra = {}
    if rows["components"] is not None and "reward_components" in estimator.reads:
        extra = {f"reward_{k}": rows["components"][:, k] for k in range(rows["components"].shape[1])}
    state = estimator.fit(rows["rewards"], rows["groups"], mask.sum(-1).float(), real, **extra)
    edges = [*SPLITS, mask.shape[0]]
    parts = []
    for lo, hi in zip(edges[:-1], edges[1:]):
        components = None if rows["components"] is None else rows["components"][lo:hi]
        t = SimpleNamespace(batch=SimpleNamespace(reward_components=components))  # what GDPO reads of the micro-batch
        parts.append(estimator.micro_batch_advantages(state, t, rows["rewards"][lo:hi], rows["groups"][lo:hi], real[lo:hi]))
    return torch.cat(parts)


def by_compiled_loss(advantage: dict, rows) -> torch.Tensor:
    """``[B, T]`` advantages read off the gradient of an on-policy ``token-sum`` loss, through ``gather``."""
    objective = rlstab.load({"advantage": advantage, "surrogate": {"kind": "none"}, "aggregation": {"kind": "token-sum", "count": "valid"}})
    loss_fn = objective.compile()
    mask = rows["mask"]
    logprobs = (-torch.rand(mask.shape, generator=torch.Generator().manual_seed(1))).requires_grad_()
    edges = [*SPLITS, mask.shape[0]]

    def batch(lo, hi):
        extra = {} if rows["components"] is None else {"reward_components": rows["components"][lo:hi]}
        return TokenBatch(logprobs=logprobs[lo:hi], response_mask=mask[lo:hi], rewards=rows["rewards"][lo:hi],
                          group_ids=rows["groups"][lo:hi], **extra)

    micro = [batch(lo, hi) for lo, hi in zip(edges[:-1], edges[1:])]
    stats = loss_fn.gather(micro)
    for b in micro:
        loss_fn(b, step=stats).loss.backward()
    return -logprobs.grad


def compare(verl_fn, estimator, advantage: dict, step, **verl_kwargs):
    index = np.array([f"uid-{int(i)}" for i in step["groups"]], dtype=object)
    expected, _ = verl_fn(token_level_rewards=verl_rewards(step), response_mask=step["mask"].float(), index=index,
                          **verl_kwargs)
    rows = with_padding(step)
    real = rows["real"]
    per_response = by_step_api(estimator, rows)
    torch.testing.assert_close(per_response[~real], torch.zeros(2), rtol=0, atol=0)
    got = per_response[real][:, None] * step["mask"]
    torch.testing.assert_close(got, expected.float(), rtol=1e-6, atol=1e-6)
    through_loss = by_compiled_loss(advantage, rows)
    torch.testing.assert_close(through_loss[~real], torch.zeros(2, step["mask"].shape[1]), rtol=0, atol=0)
    torch.testing.assert_close(through_loss[real], expected.float(), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("continuous", [False, True])
@pytest.mark.parametrize("seed", SEEDS)
def test_gpg(seed, continuous):
    step = random_step(seed, continuous=continuous)
    compare(core_algos.compute_gpg_outcome_advantage, GPG(alpha="nonzero_rewards"),
            {"kind": "gpg", "alpha": "nonzero_rewards"}, step)


@pytest.mark.parametrize("continuous", [False, True])
@pytest.mark.parametrize("seed", SEEDS)
def test_opo(seed, continuous):
    step = random_step(seed, continuous=continuous)
    compare(core_algos.compute_opo_outcome_advantage, OPO(), {"kind": "opo"}, step)


@pytest.mark.parametrize("normalize_std", [True, False])
@pytest.mark.parametrize("continuous", [False, True])
@pytest.mark.parametrize("seed", SEEDS)
def test_grpo_passk(seed, continuous, normalize_std):
    step = random_step(seed, min_group=2, continuous=continuous)
    config = AlgoConfig(norm_adv_by_std_in_grpo=normalize_std)
    compare(core_algos.compute_grpo_passk_outcome_advantage, GRPOPassK(normalize_std=normalize_std),
            {"kind": "grpo_passk", "normalize_std": normalize_std}, step, config=config)


def test_grpo_passk_refuses_a_group_of_one_as_verl_does():
    step = random_step(0, min_group=2)
    step["groups"][0] = 999  # a group of one
    index = np.array([str(int(i)) for i in step["groups"]], dtype=object)
    with pytest.raises(ValueError, match="at least 2 samples"):
        core_algos.compute_grpo_passk_outcome_advantage(verl_rewards(step), step["mask"].float(), index, config=AlgoConfig())
    rows = with_padding(step)
    with pytest.raises(ValueError, match=r"groups \[999\] hold one response"):
        by_step_api(GRPOPassK(), rows)


@pytest.mark.parametrize("continuous", [False, True])
@pytest.mark.parametrize("seed", SEEDS)
def test_reinforce_plus_plus_baseline(seed, continuous):
    step = random_step(seed, continuous=continuous)
    compare(core_algos.compute_reinforce_plus_plus_baseline_outcome_advantage, ReinforcePP(subtract_group_mean=True),
            {"kind": "reinforce_pp", "subtract_group_mean": True}, step)


@pytest.mark.parametrize("seed", SEEDS)
def test_reinforce_plus_plus(seed):
    step = random_step(seed, continuous=True)
    compare(core_algos.compute_reinforce_plus_plus_outcome_advantage, ReinforcePP(), {"kind": "reinforce_pp"}, step,
            config=AlgoConfig(gamma=1.0))


def gdpo_call(step, weights=None):
    """veRL's GDPO as its trainer calls it: the dimensions as non-tensor entries named by ``gdpo_reward_keys``."""
    components = step["components"]
    keys = [f"dim_{k}" for k in range(components.shape[1])]
    mask = step["mask"]
    B, T = mask.shape
    prompt = torch.ones(B, 2, dtype=torch.long)  # two prompt columns; verl finds each response's last token from these
    config = AlgoConfig(gdpo_reward_keys=keys, gdpo_reward_weights=weights)
    non_tensor = {key: components[:, k].numpy() for k, key in enumerate(keys)}
    batch = {"prompts": prompt, "attention_mask": torch.cat([prompt, mask.long()], -1)}

    def call(token_level_rewards, response_mask, index):
        return core_algos.compute_gdpo_outcome_advantage(
            token_level_rewards=token_level_rewards, response_mask=response_mask, index=index, config=config,
            non_tensor_batch=non_tensor, batch=batch,
        )

    return call


@pytest.mark.parametrize("weights", [None, (1.0, 0.5, 2.0)])
@pytest.mark.parametrize("seed", SEEDS)
def test_gdpo_reward_components(seed, weights):
    step = random_step(seed, dims=3)
    advantage = {"kind": "gdpo"} | ({} if weights is None else {"weights": list(weights)})
    weights = None if weights is None else list(weights)
    compare(gdpo_call(step, weights), GDPO(weights=weights), advantage, step)


@pytest.mark.parametrize("continuous", [False, True])
@pytest.mark.parametrize("seed", SEEDS)
def test_gdpo_with_one_reward_key_holding_the_reward(seed, continuous):
    """As veRL's trainer runs GDPO: one key in ``algorithm.gdpo_reward_keys`` whose column is the reward is ``source: rewards``."""
    step = random_step(seed, continuous=continuous)
    one_key = dict(step, components=step["rewards"][:, None])  # the reward function's result under one key
    compare(gdpo_call(one_key), GDPO(source="rewards"), {"kind": "gdpo", "source": "rewards"}, step)


def test_gdpo_in_verls_trainer_needs_reward_keys():
    """veRL's trainer always passes its batch to GDPO (``compute_advantage``), which then asserts the reward keys."""
    step = random_step(0)
    index = np.array([f"uid-{int(i)}" for i in step["groups"]], dtype=object)
    mask = step["mask"]
    prompt = torch.ones(mask.shape[0], 2, dtype=torch.long)
    with pytest.raises(AssertionError, match="GDPO requires 'algorithm.gdpo_reward_keys'"):
        core_algos.compute_gdpo_outcome_advantage(
            token_level_rewards=verl_rewards(step), response_mask=mask.float(), index=index, config=AlgoConfig(),
            non_tensor_batch={"score": step["rewards"].numpy()},
            batch={"prompts": prompt, "attention_mask": torch.cat([prompt, mask.long()], -1)},
        )


@pytest.mark.parametrize("continuous", [False, True])
@pytest.mark.parametrize("seed", SEEDS)
def test_gdpo_on_rewards_alone(seed, continuous):
    """Called without its trainer's batch, veRL's GDPO normalises token_level_rewards as one dimension: ``source: rewards``."""
    step = random_step(seed, continuous=continuous)
    compare(core_algos.compute_gdpo_outcome_advantage, GDPO(source="rewards"), {"kind": "gdpo", "source": "rewards"}, step)
