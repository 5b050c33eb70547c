"""GTPO's conflict-token weights (reweighter ``gtpo_conflict``): a hand-computed case, the authors' algorithm
restated, the whole loss against the authors' per-completion loss, and exactness under micro-batching."""

from __future__ import annotations

import math

import pytest
import torch

import rlstab
from rlstab import BatchError, TokenBatch
from rlstab.adapters import trainers
from rlstab.compiler.advantages import set_micro_batch_advantages

PAD = 0  # the pad id of the restated reference; valid token ids are 1..3


def objective(**conflict) -> rlstab.Objective:
    """GTPO's loss with only the conflict weights acting: no entropy penalty, no filter."""
    spec = {"kind": "gtpo_conflict", **conflict}
    return rlstab.load({
        "extends": "gtpo", "advantage": {"kind": "grpo", "normalize_std": False}, "masks": [], "reweighters": [spec],
    })


def weights_of(loss_fn, batches: list[TokenBatch]) -> list[torch.Tensor]:
    """Each micro-batch's weights, with the step gathered over all of them."""
    step = loss_fn.gather(batches)
    conflict = loss_fn.objective.reweighters[0]
    weights = []
    for b in batches:
        t = loss_fn._inputs.tokens(b)
        set_micro_batch_advantages(loss_fn.objective, t, step)
        weights.append(conflict.weights(t, step.hooks[0]))
    return weights


# ----------------------------------------------------------------------------- the hand-computed case

# Group 0: rewards 1, 1, 0, 0, 0.5: mean 0.5, so rows 0 and 1 are positive, 2 and 3 negative, 4 (= mean) inactive.
# Group 1: rewards 1, 1: mean 1, both inactive, though row 5 holds row 2's tokens (groups never mix).
HAND_IDS = [
    [5, 6, 7, 9, 0],  # + len 4
    [5, 8, 7, 9, 9],  # + len 5
    [5, 6, 1, 9, 0],  # - len 4
    [2, 6, 7, 0, 0],  # - len 3
    [5, 6, 7, 9, 0],  # 0 len 4 (inactive: adds no key)
    [5, 6, 1, 9, 0],  # group 1, 0
    [2, 6, 7, 0, 0],  # group 1, 0
]
HAND_LENGTHS = [4, 5, 4, 3, 4, 4, 3]
HAND_REWARDS = [1.0, 1.0, 0.0, 0.0, 0.5, 1.0, 1.0]
HAND_GROUPS = [0, 0, 0, 0, 0, 1, 1]
# Keys from the start, group 0: positive p0{5} p1{6,8} p2{7} p3{9} p4{9}; negative p0{5,2} p1{6} p2{1,7} p3{9}:
# conflicts p0:5, p1:6, p2:7, p3:9. Runs from the start: row 0 5,6,7,9 (all 4); row 1 5 then 8 breaks (1);
# row 2 5,6 then 1 breaks (2); row 3 2 breaks at once (0).
# Keys from the end: row 0 e0..e3 = 9,7,6,5; row 1 = 9,9,7,8,5; row 2 = 9,1,6,5; row 3 = 7,6,2. Positive e0{9}
# e1{7,9} e2{6,7} e3{5,8} e4{5}; negative e0{9,7} e1{1,6} e2{6,2} e3{5}: conflicts e0:9, e2:6, e3:5 (e1 none).
# Runs from the end: rows 0, 1, 2 their last token only (e1 breaks); row 3 none (7 at e0 is no conflict).
# Weights, w = 2 on a positive row's run and 0 on a negative row's, the two directions multiplied:
HAND_WEIGHTS = [
    [2, 2, 2, 2 * 2],  # row 0: all four from the start, the last also from the end
    [2, 1, 1, 1, 2],  # row 1: first from the start, last from the end
    [0, 0, 1, 0],  # row 2: two from the start, the last from the end
    [1, 1, 1],  # row 3: no run
    [1, 1, 1, 1],  # row 4: inactive
    [1, 1, 1, 1],  # group 1: no positive and negative response
    [1, 1, 1],
]
# normalise: conflict_count divides each row by max(1, forward run, backward run): row 0 by max(4, 1) = 4, row 1 by
# max(1, 1) = 1, row 2 by max(2, 1) = 2, the others by 1.
HAND_DIVISORS = [4, 1, 2, 1, 1, 1, 1]


def hand_batch(rows=None) -> TokenBatch:
    rows = list(range(len(HAND_IDS))) if rows is None else rows
    T = 5
    mask = torch.arange(T) < torch.tensor([HAND_LENGTHS[r] for r in rows])[:, None]
    return TokenBatch(
        logprobs=torch.full((len(rows), T), -0.5, requires_grad=True),
        response_mask=mask,
        rewards=torch.tensor([HAND_REWARDS[r] for r in rows]),
        group_ids=torch.tensor([HAND_GROUPS[r] for r in rows]),
        token_ids=torch.tensor([HAND_IDS[r] for r in rows], dtype=torch.int32),
    )


def as_rows(weights: torch.Tensor, rows) -> list[list[float]]:
    return [weights[i, : HAND_LENGTHS[r]].tolist() for i, r in enumerate(rows)]


def test_the_hand_computed_case():
    rows = list(range(len(HAND_IDS)))
    (weights,) = weights_of(objective().compile(), [hand_batch()])
    assert as_rows(weights, rows) == [[float(x) for x in row] for row in HAND_WEIGHTS]


def test_the_hand_computed_case_divided_by_the_conflict_count():
    rows = list(range(len(HAND_IDS)))
    (weights,) = weights_of(objective(normalise="conflict_count").compile(), [hand_batch()])
    expected = [[x / d for x in row] for row, d in zip(HAND_WEIGHTS, HAND_DIVISORS)]
    assert as_rows(weights, rows) == expected


def test_a_group_split_across_micro_batches_gets_the_whole_steps_conflicts():
    loss_fn = objective().compile()
    parts = [[0, 5], [1, 2], [3, 4, 6]]
    got = weights_of(loss_fn, [hand_batch(p) for p in parts])
    for part, weights in zip(parts, got):
        assert as_rows(weights, part) == [[float(x) for x in HAND_WEIGHTS[r]] for r in part]
    # each micro-batch as its own step sees only its own rows' keys: row 0's run from the start then ends at once
    # (no negative row in its micro-batch), so the step is what makes it exact
    (alone,) = weights_of(loss_fn, [hand_batch([0, 5])])
    assert as_rows(alone, [0, 5])[0] == [1.0, 1.0, 1.0, 1.0]


def test_the_sign_of_the_advantage_instead_of_the_rewards():
    loss_fn = rlstab.load({"extends": "gtpo", "advantage": {"kind": "given"}, "masks": [],
                           "reweighters": [{"kind": "gtpo_conflict", "sign": "advantages"}]}).compile()
    batch = hand_batch()
    advantages = torch.tensor(HAND_REWARDS) - torch.tensor([0.5] * 5 + [1.0] * 2)  # the same signs as above
    batch = TokenBatch(logprobs=batch.logprobs, response_mask=batch.response_mask, advantages=advantages,
                       group_ids=batch.group_ids, token_ids=batch.token_ids)
    (weights,) = weights_of(loss_fn, [batch])
    assert as_rows(weights, range(7)) == [[float(x) for x in row] for row in HAND_WEIGHTS]


# ----------------------------------------------------------------------------- the authors' algorithm, restated


def authors_weights(ids, lengths, rewards, groups, w: float):
    """The authors' ``build_conflict_mask`` (github winstonsmith1897/GTPO, gtpo/gtpo_training.py), restated in loops:
    right-padded rows of ``PAD``; per group, A = R - mean; the active rows' (column, id) pairs of positive and negative
    rows over every column (padding included); the run from column 0 (cumprod), tokens equal to PAD excluded; the
    rows reversed to end-alignment (PAD after the end), their run likewise, excluded where the row's *unreversed*
    token is PAD (as their ``valid_mask`` is not reversed); weights w / 0 / 1 per direction, multiplied; and their
    conflict count, the union of the two runs' indices in their own coordinates. Returns (weights, counts)."""
    B, T = len(ids), len(ids[0])
    weights = [[1.0] * T for _ in range(B)]
    counts = [0] * B
    for g in sorted(set(groups)):
        members = [i for i in range(B) if groups[i] == g]
        mean = sum(rewards[i] for i in members) / len(members)
        adv = {i: rewards[i] - mean for i in members}
        active = [i for i in members if adv[i] != 0]
        rev = {i: [ids[i][lengths[i] - 1 - u] if u < lengths[i] else PAD for u in range(T)] for i in active}
        runs = {}
        for name, rows in (("fwd", {i: ids[i] for i in active}), ("rev", rev)):
            pos = {(t, rows[i][t]) for i in active if adv[i] > 0 for t in range(T)}
            neg = {(t, rows[i][t]) for i in active if adv[i] < 0 for t in range(T)}
            for i in active:
                run, alive = [], True
                for t in range(T):
                    alive = alive and (t, rows[i][t]) in pos and (t, rows[i][t]) in neg
                    run.append(alive and ids[i][t] != PAD)  # the unreversed row's token, in both directions
                runs[name, i] = run
        for i in active:
            factor = w if adv[i] > 0 else 0.0
            fwd = [factor if c else 1.0 for c in runs["fwd", i]]
            bwd_rev = [factor if c else 1.0 for c in runs["rev", i]]
            bwd = [bwd_rev[lengths[i] - 1 - t] if t < lengths[i] else 1.0 for t in range(T)]
            weights[i] = [a * b for a, b in zip(fwd, bwd)]
            counts[i] = sum(1 for t in range(lengths[i]) if runs["fwd", i][t] or runs["rev", i][t])
    return weights, [max(c, 1) for c in counts]


def random_case(seed: int, B: int = 12, T: int = 7, vocab: int = 2):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, T + 1, (B,), generator=g).tolist()
    ids = (torch.randint(1, vocab + 1, (B, T), generator=g) * (torch.arange(T) < torch.tensor(lengths)[:, None])).tolist()
    rewards = torch.randint(0, 3, (B,), generator=g).float().div(2).tolist()
    groups = (torch.randperm(B, generator=g) % 3).tolist()
    return ids, lengths, rewards, groups


@pytest.mark.parametrize("seed", range(12))
@pytest.mark.parametrize("normalise", ["none", "conflict_count"])
def test_the_authors_algorithm(seed, normalise):
    ids, lengths, rewards, groups = random_case(seed)
    expected, counts = authors_weights(ids, lengths, rewards, groups, 2.0)
    if normalise == "conflict_count":
        expected = [[x / c for x in row] for row, c in zip(expected, counts)]
    T = len(ids[0])
    batch = TokenBatch(
        logprobs=torch.full((len(ids), T), -0.5), response_mask=torch.arange(T) < torch.tensor(lengths)[:, None],
        rewards=torch.tensor(rewards), group_ids=torch.tensor(groups), token_ids=torch.tensor(ids),
    )
    (weights,) = weights_of(objective(normalise=normalise).compile(), [batch])
    mask = batch.response_mask
    assert torch.equal(torch.where(mask, weights, 0.0), torch.where(mask, torch.tensor(expected), 0.0))


# ----------------------------------------------------------------------------- the whole loss


@pytest.mark.parametrize("seed", range(6))
def test_loss_and_gradient_against_the_authors_per_completion_loss(seed):
    """The preset with their conflict count against ``gtpo_compute_loss`` summed over completions (their
    ``acc_loss``), on-policy (ratio exp(logp - sg(logp)) = 1): sum_i -(1/|o_i|) sum_t A'_i delta_{i,t} / n_i with
    A'_i = (R_i - mean_g R - 0.1 <H>_i) if <H>_i <= ln 2 else 0. rlstab averages over the S responses (the paper's
    1/G): times S, the same loss and gradient."""
    ids, lengths, rewards, groups = random_case(100 + seed)
    B, T = len(ids), len(ids[0])
    g = torch.Generator().manual_seed(seed)
    entropy = torch.rand(B, T, generator=g, dtype=torch.float64) * 1.4
    logprobs = -torch.rand(B, T, generator=g, dtype=torch.float64)
    mask = torch.arange(T) < torch.tensor(lengths)[:, None]
    delta, counts = authors_weights(ids, lengths, rewards, groups, 2.0)
    total = torch.zeros((), dtype=torch.float64)
    grad = torch.zeros(B, T, dtype=torch.float64)
    for i in range(B):
        n = lengths[i]
        members = [j for j in range(B) if groups[j] == groups[i]]
        centred = rewards[i] - sum(rewards[j] for j in members) / len(members)
        h = float(entropy[i, :n].mean())
        a = centred - 0.1 * h if h <= math.log(2.0) else 0.0
        for t in range(n):
            total -= a * delta[i][t] / n / counts[i]
            grad[i, t] = -a * delta[i][t] / n / counts[i]
    loss_fn = rlstab.load({"extends": "gtpo", "reweighters": [{"kind": "gtpo_conflict", "normalise": "conflict_count"}]}).compile()
    leaf = logprobs.float().requires_grad_()
    batch = TokenBatch(logprobs=leaf, response_mask=mask, entropy=entropy.float(), rewards=torch.tensor(rewards),
                       group_ids=torch.tensor(groups), token_ids=torch.tensor(ids))
    out = loss_fn(batch, step=loss_fn.gather([batch]))
    out.loss.backward()
    S = sum(1 for n in lengths if n > 0)
    assert abs(float(out.loss.detach()) * S - float(total)) < 1e-6
    assert torch.allclose(leaf.grad.double() * S, grad, atol=1e-6, rtol=0)


@pytest.mark.parametrize("seed", range(4))
def test_micro_batches_give_the_whole_batchs_loss_and_gradient(seed):
    ids, lengths, rewards, groups = random_case(200 + seed, B=15)
    B, T = len(ids), len(ids[0])
    g = torch.Generator().manual_seed(seed)
    entropy = torch.rand(B, T, generator=g) * 1.4
    logprobs = -torch.rand(B, T, generator=g)
    mask = torch.arange(T) < torch.tensor(lengths)[:, None]
    loss_fn = rlstab.load("gtpo").compile()

    def batch(rows, leaf):
        r = torch.tensor(rows)
        return TokenBatch(logprobs=leaf[r] if leaf.requires_grad else leaf, response_mask=mask[r], entropy=entropy[r],
                          rewards=torch.tensor(rewards)[r], group_ids=torch.tensor(groups)[r],
                          token_ids=torch.tensor(ids)[r])

    whole_leaf = logprobs.clone().requires_grad_()
    whole = batch(list(range(B)), whole_leaf)
    out = loss_fn(whole, step=loss_fn.gather([whole]))
    out.loss.backward()
    split_leaf = logprobs.clone().requires_grad_()
    parts = [list(range(0, B, 3)), list(range(1, B, 3)), list(range(2, B, 3))]  # every group across micro-batches
    batches = [batch(p, split_leaf) for p in parts]
    step = loss_fn.gather(batches)
    total = sum(loss_fn(b, step=step).loss for b in batches)
    total.backward()
    assert abs(float(total.detach()) - float(out.loss.detach())) < 1e-6
    assert torch.allclose(split_leaf.grad, whole_leaf.grad, atol=1e-7, rtol=0)


# ----------------------------------------------------------------------------- inputs and trainers


def test_token_ids_must_be_integers_of_the_batchs_shape():
    mask = torch.ones(2, 3, dtype=torch.bool)
    with pytest.raises(BatchError, match="token_ids must be an integer tensor"):
        TokenBatch(logprobs=torch.zeros(2, 3), response_mask=mask, token_ids=torch.zeros(2, 3))
    with pytest.raises(BatchError, match=r"token_ids must be \[B, T\]"):
        TokenBatch(logprobs=torch.zeros(2, 3), response_mask=mask, token_ids=torch.zeros(2, 4, dtype=torch.int64))


def test_a_batch_without_token_ids_is_refused_naming_the_field():
    batch = hand_batch()
    batch = TokenBatch(logprobs=batch.logprobs, response_mask=batch.response_mask, rewards=batch.rewards,
                       group_ids=batch.group_ids)
    with pytest.raises(BatchError, match=r"reweighters\[0\] \(gtpo_conflict\) reads TokenBatch.token_ids"):
        objective().compile()(batch)


def test_a_negative_token_id_on_a_valid_token_is_refused():
    batch = hand_batch()
    ids = batch.token_ids.clone()
    ids[0, 0] = -1
    ids[0, 4] = -7  # padding may hold anything
    batch = TokenBatch(logprobs=batch.logprobs, response_mask=batch.response_mask, rewards=batch.rewards,
                       group_ids=batch.group_ids, token_ids=ids)
    with pytest.raises(BatchError, match="holds -1 on a valid token"):
        objective().compile().gather([batch])


@pytest.mark.parametrize("trainer", ["verl", "trl", "openrlhf"])
def test_every_adapter_refuses_gtpo(trainer):
    problems = trainers.problems(rlstab.load("gtpo"), trainer)
    assert any("gtpo_conflict) reads TokenBatch.token_ids" in p for p in problems)
    assert any(p.startswith("advantage (gtpo)") for p in problems)
