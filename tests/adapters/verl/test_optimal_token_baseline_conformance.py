"""The optimal token baseline against verl 0.9.1's own estimators, advantages, loss and gradients within 1e-6.

``optimal_token_baseline`` against ``compute_optimal_token_baseline_advantage`` and
``tir_optimal_token_baseline`` against ``compute_multi_turn_optimal_token_baseline_advantage``
(``verl/trainer/ppo/core_algos.py``), on random batches with uneven lengths, a group of one, a
full-width row, multi-turn masks (holes inside responses), with and without verl's
``rollout_is_weights``, under both ``handle_zero_tail`` values. rlstab's side is the compiled
objective's step scope: the step gathered over three micro-batches of uneven sizes, each
micro-batch's advantages compared with verl's on the whole batch. verl's estimators take
token-level rewards: the outcome reward sits on the last response token.

The loss and its gradient: the objective with the estimator equals the same objective trained on
verl's advantages (``advantage: given``), so rlstab's loss in verl (which trains on the advantages
verl's driver computed) and in the embedded trainer (which estimates them) are the same.

One documented difference, left out of the random batches: veRL's single-turn estimator counts a
row without response tokens (padding) in its group's size. rlstab leaves padding rows out of every
group; with ``zero_tail`` on (veRL's default) the two agree (the test's batches hold such a row),
with it off a lone response beside padding rows gets ``A = R`` in rlstab and ``A = R eps / (W + eps)``
in veRL.
"""

import numpy as np
import pytest
import torch
from verl.trainer.ppo.core_algos import (
    compute_multi_turn_optimal_token_baseline_advantage,
    compute_optimal_token_baseline_advantage,
)
from verl.utils.torch_functional import calculate_sum_pi_squared_from_logits

import rlstab

from verl_batches import actor_config

VERL = {
    "optimal_token_baseline": compute_optimal_token_baseline_advantage,
    "tir_optimal_token_baseline": compute_multi_turn_optimal_token_baseline_advantage,
}
SPLITS = [(0, 3), (3, 9), (9, 16)]
B, T = 16, 13


def random_batch(seed: int, multi_turn: bool, padding_row: bool, is_weights: bool) -> rlstab.TokenBatch:
    """Uneven lengths, one full row, groups of 1 to 5 responses, optionally holes and a padding row."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, T + 1, (B,), generator=g)
    lengths[2] = T
    if padding_row:
        lengths[5] = 0
    mask = torch.arange(T) < lengths[:, None]
    if multi_turn:  # a tool's output inside the response: never the first token, so no response empties
        mask &= ~((torch.rand(B, T, generator=g) < 0.3) & (torch.arange(T) > 0))
    old = -torch.rand(B, T, generator=g).pow(2) * 4.0
    p = old.exp()  # sum_v pi(v)^2 between its bounds given pi(y): pi(y)^2 and pi(y)^2 + (1 - pi(y))^2
    sum_pi_squared = p**2 + torch.rand(B, T, generator=g) * (1 - p) ** 2
    return rlstab.TokenBatch(
        logprobs=(old + 0.3 * torch.randn(B, T, generator=g)).abs().neg().requires_grad_(),  # reflected: at most 0
        old_logprobs=old,
        response_mask=mask,
        rewards=torch.randint(0, 3, (B,), generator=g).float() * 0.5,
        group_ids=torch.tensor([0, 0, 0, 1, 1, 2, 2, 2, 2, 2, 3, 4, 4, 4, 4, 1]),  # group 3: one response
        sum_pi_squared=sum_pi_squared,
        is_weights=torch.rand(B, T, generator=g) * 2.0 if is_weights else None,
    )


def verl_advantages(kind: str, batch: rlstab.TokenBatch, zero_tail: bool) -> torch.Tensor:
    mask = batch.response_mask
    last = torch.where(mask, torch.arange(T), -1).max(-1).values
    rewards = torch.zeros(B, T)
    has = last >= 0
    rewards[has, last[has]] = batch.rewards[has]  # the outcome reward on the last response token
    advantages, _ = VERL[kind](
        token_level_rewards=rewards, response_mask=mask.float(), index=np.array(batch.group_ids.tolist()),
        old_log_probs=batch.old_logprobs, sum_pi_squared=batch.sum_pi_squared, rollout_is_weights=batch.is_weights,
        handle_zero_tail=zero_tail,
    )
    return advantages


def take(batch: rlstab.TokenBatch, lo: int, hi: int) -> rlstab.TokenBatch:
    fields = {f: getattr(batch, f) for f in batch.__dataclass_fields__}
    return rlstab.TokenBatch(**{k: (v[lo:hi] if isinstance(v, torch.Tensor) else v) for k, v in fields.items()})


def objective(advantage: dict) -> rlstab.Objective:
    return rlstab.load({"extends": "grpo", "advantage": advantage})


def rlstab_advantages(advantage: dict, batch: rlstab.TokenBatch) -> torch.Tensor:
    loss_fn = objective(advantage).compile()
    micro = [take(batch, lo, hi) for lo, hi in SPLITS]
    stats = loss_fn.gather(micro)
    return torch.cat([loss_fn._micro_batch_tokens(m, stats).advantages for m in micro])


def loss_and_grad(obj: rlstab.Objective, batch: rlstab.TokenBatch) -> tuple[float, torch.Tensor]:
    loss_fn = obj.compile()
    leaf = batch.logprobs.detach().clone().requires_grad_()
    micro = []
    for lo, hi in SPLITS:
        m = take(batch, lo, hi)
        m.logprobs = leaf[lo:hi]
        micro.append(m)
    stats = loss_fn.gather(micro)
    total = 0.0
    for m in micro:
        loss = loss_fn(m, step=stats).loss
        loss.backward()
        total += float(loss)
    return total, leaf.grad


CASES = [
    (kind, multi_turn, zero_tail, is_weights)
    for kind in VERL
    for multi_turn in (False, True)
    for zero_tail in (True, False)
    for is_weights in (False, True)
]


@pytest.mark.parametrize(("kind", "multi_turn", "zero_tail", "is_weights"), CASES)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_advantages_equal_verl(kind, multi_turn, zero_tail, is_weights, seed):
    padding_row = zero_tail or kind == "tir_optimal_token_baseline"  # see the module's docstring
    batch = random_batch(seed, multi_turn, padding_row, is_weights)
    want = verl_advantages(kind, batch, zero_tail)
    got = rlstab_advantages({"kind": kind, "zero_tail": zero_tail}, batch)
    torch.testing.assert_close(got, want, atol=1e-6, rtol=0)
    assert want[batch.response_mask].abs().sum() > 0  # the case is not vacuous


@pytest.mark.parametrize("kind", list(VERL))
@pytest.mark.parametrize("seed", [3, 4])
def test_loss_and_gradient_equal_training_on_verls_advantages(kind, seed):
    batch = random_batch(seed, multi_turn=True, padding_row=True, is_weights=True)
    given = take(batch, 0, B)
    given.advantages = verl_advantages(kind, batch, zero_tail=True)
    given.rewards = given.group_ids = given.sum_pi_squared = None
    loss, grad = loss_and_grad(objective({"kind": kind}), batch)
    want_loss, want_grad = loss_and_grad(objective({"kind": "given"}), given)
    assert abs(loss - want_loss) <= 1e-6
    torch.testing.assert_close(grad, want_grad, atol=1e-6, rtol=0)
    assert grad.abs().sum() > 0


def test_without_rollout_weights_in_the_batch_the_option_changes_nothing():
    batch = random_batch(5, multi_turn=False, padding_row=True, is_weights=False)
    on = rlstab_advantages({"kind": "optimal_token_baseline"}, batch)
    off = rlstab_advantages({"kind": "optimal_token_baseline", "importance_weights": False}, batch)
    torch.testing.assert_close(on, off)


def test_sum_pi_squared_is_verls_from_the_logits():
    # veRL's exp(logsumexp(2z) - 2 logsumexp(z)) is sum_v softmax(z)_v^2, what rlstab's embedded trainer computes
    z = torch.randn(5, 9, 31, generator=torch.Generator().manual_seed(0), dtype=torch.float64) * 3.0
    torch.testing.assert_close(calculate_sum_pi_squared_from_logits(z), torch.softmax(z, -1).pow(2).sum(-1))


@pytest.mark.parametrize("kind", list(VERL))
def test_verl_actor_needs_calculate_sum_pi_squared(kind):
    overrides = {"advantage": {"kind": kind}}
    with pytest.raises(ValueError, match=rf"advantage \({kind}\) is computed by veRL from the actor's sum_pi_squared; "
                                         rf"set actor_rollout_ref\.actor\.calculate_sum_pi_squared=True and "
                                         rf"algorithm\.adv_estimator={kind}"):
        actor_config(overrides=overrides)
    config = actor_config(overrides=overrides, calculate_sum_pi_squared=True)
    assert config.policy_loss.rlstab_objective.advantage.kind == kind
