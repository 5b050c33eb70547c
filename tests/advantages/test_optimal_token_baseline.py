"""The optimal token baseline (advantages ``optimal_token_baseline``, ``tir_optimal_token_baseline``): hand-computed groups.

Every hand case uses pi_old(y) = 0.5 on every token (``old_logprobs = log 0.5``), so that the
score-norm proxy is w = 1 - 2 * 0.5 + sum_pi_squared = sum_pi_squared, and ``eps: 0`` so that
the baselines are exact fractions. Conformance with veRL's own functions is in
tests/adapters/verl/test_optimal_token_baseline_conformance.py.
"""

import math

import pytest
import torch
from advantages import optimal_token_baseline_rank as rank_module

import rlstab
from rlstab.adapters.trainer_parts import unexecutable
from rlstab.advantages import GRPO, MultiTurnOptimalTokenBaseline, OptimalTokenBaseline
from rlstab.advantages.optimal_token_baseline import response_positions, score_norm_proxy
from rlstab.explain import explain
from rlstab.testing.spawned_ranks import run_ranks

NAN = float("nan")
HALF = math.log(0.5)

# Group 0: a (R = 1, 3 tokens), b (R = 0, 2 tokens), c (R = 0.5, 1 token); group 1: d alone (R = 1, 2 tokens);
# row e: a padding row (no response token) with a NaN reward. w = sum_pi_squared (pi_old = 0.5):
#   a: w = 0.5, 0.25, 0.5 -> W = 0.5, 0.75, 1.25
#   b: w = 0.25, 0.5      -> W = 0.25, 0.75
#   c: w = 0.5            -> W = 0.5
SUM_PI_SQUARED = [[0.5, 0.25, 0.5], [0.25, 0.5, 9.0], [0.5, 9.0, 9.0], [0.3, 0.4, 9.0], [9.0, 9.0, 9.0]]
MASK = [[1, 1, 1], [1, 1, 0], [1, 0, 0], [1, 1, 0], [0, 0, 0]]
REWARDS = [1.0, 0.0, 0.5, 1.0, NAN]
GROUPS = [0, 0, 0, 1, 0]


def batch(mask=MASK, sum_pi_squared=SUM_PI_SQUARED, rewards=REWARDS, groups=GROUPS, is_weights=None, rows=None):
    mask = torch.as_tensor(mask).bool()
    rows = slice(None) if rows is None else rows
    old = torch.full(mask.shape, HALF)
    return rlstab.TokenBatch(
        logprobs=old.clone()[rows].requires_grad_(), old_logprobs=old[rows], response_mask=mask[rows],
        rewards=torch.as_tensor(rewards)[rows], group_ids=torch.as_tensor(groups)[rows],
        sum_pi_squared=torch.as_tensor(sum_pi_squared)[rows], is_weights=None if is_weights is None else is_weights[rows],
    )


def objective(estimator):
    return rlstab.Objective(advantage=estimator, aggregation={"kind": "token-mean", "count": "valid"}).compile()


def advantages(estimator, *micro_batches):
    """The advantages the compiled loss trains each micro-batch on, the step gathered over all of them."""
    compiled = objective(estimator)
    stats = compiled.gather(micro_batches)
    return [compiled._micro_batch_tokens(b, stats).advantages for b in micro_batches], stats


def test_column_baseline_by_hand():
    (a,), _ = advantages(OptimalTokenBaseline(eps=0.0), batch())
    # column 0: (1 * 0.5 + 0 * 0.25 + 0.5 * 0.5) / (0.5 + 0.25 + 0.5) = 0.75 / 1.25 = 0.6
    # column 1: (1 * 0.75 + 0 * 0.75) / (0.75 + 0.75) = 0.5
    # column 2: a alone, the group's unique longest response, past the second-longest length (2): baseline 0
    # group 1: d alone, no baseline (A = R); the padding row: 0
    want = torch.tensor([[1 - 0.6, 1 - 0.5, 1.0], [-0.6, -0.5, 0.0], [0.5 - 0.6, 0.0, 0.0], [1.0, 1.0, 0.0], [0.0, 0.0, 0.0]])
    torch.testing.assert_close(a, want)


def test_without_zero_tail_the_longest_response_is_its_own_baseline():
    (a,), _ = advantages(OptimalTokenBaseline(eps=0.0, zero_tail=False), batch())
    # column 2: (1 * 1.25) / 1.25 = 1, so A = 1 - 1 = 0 there
    assert a[0, 2] == 0.0
    torch.testing.assert_close(a[:, :2], torch.tensor([[0.4, 0.5], [-0.6, -0.5], [-0.1, 0.0], [1.0, 1.0], [0.0, 0.0]]))


def test_eps_is_added_to_the_denominator():
    (a,), _ = advantages(OptimalTokenBaseline(eps=0.25), batch())
    # column 0: 0.75 / (1.25 + 0.25) = 0.5; column 1: 0.75 / (1.5 + 0.25) = 3/7
    torch.testing.assert_close(a[0, :2], torch.tensor([0.5, 1 - 3 / 7]))


def test_rollout_importance_weights_scale_w_by_their_square():
    weights = torch.ones(5, 3)
    weights[1, 0] = 2.0  # b's first token: w = 0.25 * 2^2 = 1, so W_b = 1, 1.5
    (a,), _ = advantages(OptimalTokenBaseline(eps=0.0), batch(is_weights=weights))
    # column 0: (1 * 0.5 + 0 * 1 + 0.5 * 0.5) / (0.5 + 1 + 0.5) = 0.375; column 1: 0.75 / (0.75 + 1.5) = 1/3
    torch.testing.assert_close(a[:3, :2], torch.tensor([[0.625, 2 / 3], [-0.375, -1 / 3], [0.125, 0.0]]))
    (ignored,), _ = advantages(OptimalTokenBaseline(eps=0.0, importance_weights=False), batch(is_weights=weights))
    (plain,), _ = advantages(OptimalTokenBaseline(eps=0.0), batch())
    torch.testing.assert_close(ignored, plain)


def test_per_response_importance_weights_apply_to_every_token():
    weights = torch.tensor([1.0, 2.0, 1.0, 1.0, NAN])  # b: w = 0.25 * 4 = 1, 0.5 * 4 = 2 -> W_b = 1, 3
    (a,), _ = advantages(OptimalTokenBaseline(eps=0.0), batch(is_weights=weights))
    # column 0: 0.75 / 2 = 0.375; column 1: 0.75 / (0.75 + 3) = 0.2
    torch.testing.assert_close(a[1, :2], torch.tensor([-0.375, -0.2]))


# Multi-turn masks: a = [1, 0, 1, 1] (a tool's output at column 1), b = [1, 1, 0, 0], c = [0, 1, 0, 0]; w as above
# on each row's valid tokens, in order.
TIR_MASK = [[1, 0, 1, 1], [1, 1, 0, 0], [0, 1, 0, 0]]
TIR_SUM_PI_SQUARED = [[0.5, 9.0, 0.25, 0.5], [0.25, 0.5, 9.0, 9.0], [9.0, 0.5, 9.0, 9.0]]


def tir_batch():
    return batch(TIR_MASK, TIR_SUM_PI_SQUARED, REWARDS[:3], GROUPS[:3])


def test_tir_compares_response_tokens_not_columns():
    (a,), _ = advantages(MultiTurnOptimalTokenBaseline(eps=0.0), tir_batch())
    # each row's valid tokens moved left: W_a = 0.5, 0.75, 1.25; W_b = 0.25, 0.75; W_c = 0.5: the column case above,
    # B(0) = 0.6, B(1) = 0.5, B(2) = 0 (a's tail); then put back at the valid columns
    want = torch.tensor([[0.4, 0.0, 0.5, 1.0], [-0.6, -0.5, 0.0, 0.0], [0.0, -0.1, 0.0, 0.0]])
    torch.testing.assert_close(a, want)


def test_the_column_kind_on_multi_turn_masks_compares_columns():
    (a,), _ = advantages(OptimalTokenBaseline(eps=0.0), tir_batch())
    # column 0: a (W 0.5), b (W 0.25): 0.5 / 0.75 = 2/3; column 1: b (W 0.75, R 0), c (W 0.5, R 0.5): 0.25 / 1.25 = 0.2
    # columns 2 and 3: a alone, from the second-longest length (2) on: baseline 0
    want = torch.tensor([[1 / 3, 0.0, 1.0, 1.0], [-2 / 3, -0.2, 0.0, 0.0], [0.0, 0.3, 0.0, 0.0]])
    torch.testing.assert_close(a, want)


def test_without_holes_both_kinds_agree():
    (column,), _ = advantages(OptimalTokenBaseline(), batch())
    (tir,), _ = advantages(MultiTurnOptimalTokenBaseline(), batch())
    torch.testing.assert_close(column, tir)


def test_ties_for_the_longest_response_zero_no_tail():
    mask = [[1, 1, 1], [1, 1, 1], [1, 0, 0]]
    (a,), stats = advantages(OptimalTokenBaseline(eps=0.0), batch(mask, SUM_PI_SQUARED[:3], REWARDS[:3], GROUPS[:3]))
    # column 2: a (W 1.25, R 1) and b (W 0.75 + 9 = 9.75, R 0) both valid: 1.25 / 11 = 0.113636...
    torch.testing.assert_close(a[:2, 2], torch.tensor([1 - 1.25 / 11, -1.25 / 11]))
    assert stats.advantage.metrics["zeroed_tail_fraction"] == 0.0


def test_equal_weights_give_the_group_mean_baseline():
    # every token w = 0.3 and every response 4 tokens long: B_g(t) = mean_g R, Dr.GRPO's advantage on every token
    g = torch.Generator().manual_seed(0)
    B, T = 12, 4
    rewards = torch.randint(0, 2, (B,), generator=g).float()
    groups = torch.arange(B) % 3
    (a,), _ = advantages(OptimalTokenBaseline(), batch(torch.ones(B, T), torch.full((B, T), 0.3), rewards, groups))
    want = GRPO(normalize_std=False)
    drgrpo = want.apply(want.fit(rewards, groups, torch.full((B,), 4.0)), rewards, groups)
    torch.testing.assert_close(a, drgrpo[:, None].expand(B, T), atol=1e-6, rtol=0)


def test_padding_rows_change_nothing_whatever_they_hold():
    (clean,), _ = advantages(OptimalTokenBaseline(), batch(rows=slice(0, 4)))
    for reward, group in [(NAN, 0), (float("inf"), 7), (5.0, 1)]:
        dirty = batch(rewards=REWARDS[:4] + [reward], groups=GROUPS[:4] + [group])
        (a,), _ = advantages(OptimalTokenBaseline(), dirty)
        torch.testing.assert_close(a[:4], clean)
        assert (a[4] == 0).all()


def test_micro_batches_of_different_widths_equal_the_whole_step():
    whole = batch()
    (a,), _ = advantages(OptimalTokenBaseline(), whole)
    narrow = batch([row[:2] for row in MASK[1:4]], [row[:2] for row in SUM_PI_SQUARED[1:4]], REWARDS[1:4], GROUPS[1:4])
    parts, _ = advantages(OptimalTokenBaseline(), batch(rows=slice(0, 1)), narrow, batch(rows=slice(4, 5)))
    torch.testing.assert_close(parts[0], a[:1])
    torch.testing.assert_close(parts[1], a[1:4, :2])
    torch.testing.assert_close(parts[2], a[4:])


def test_step_metrics_by_hand():
    _, stats = advantages(OptimalTokenBaseline(eps=0.0), batch())
    # group 0 only (group 1 has one response): weights = the column sums of W (1.25, 1.5, 1.25), baselines
    # (0.6, 0.5, 1.0) against the group mean (1 + 0 + 0.5) / 3 = 0.5: (1.25 * 0.1 + 0 + 1.25 * 0.5) / 4 = 0.1875
    metrics = stats.advantage.metrics
    assert metrics["baseline_minus_mean"] == pytest.approx(0.1875)
    assert metrics["zeroed_tail_fraction"] == 1.0  # group 0's longest response (a) is unique


def test_the_loss_reports_the_step_metrics():
    out = objective(OptimalTokenBaseline(eps=0.0))(batch())
    assert out.metrics["advantage/optimal_token_baseline/baseline_minus_mean"] == pytest.approx(0.1875)


def test_a_step_without_response_tokens_gives_zero_advantages():
    (a,), _ = advantages(OptimalTokenBaseline(), batch(rows=slice(4, 5)))
    assert a.shape == (1, 3) and (a == 0).all()


def test_without_sum_pi_squared_the_batch_is_refused():
    b = batch()
    b.sum_pi_squared = None
    with pytest.raises(rlstab.BatchError, match=r"advantage \(optimal_token_baseline\).*TokenBatch.sum_pi_squared"):
        objective(OptimalTokenBaseline())(b)


def test_a_non_finite_sum_pi_squared_on_a_valid_token_is_named():
    values = [row[:] for row in SUM_PI_SQUARED]
    values[0][1] = NAN
    with pytest.raises(FloatingPointError, match="sum_pi_squared"):
        objective(OptimalTokenBaseline())(batch(sum_pi_squared=values))


def test_apply_per_response_is_refused():
    est = OptimalTokenBaseline()
    with pytest.raises(TypeError, match="one advantage per token"):
        est.apply(None, torch.ones(2), torch.zeros(2, dtype=torch.long))


def test_score_norm_proxy_is_the_squared_logit_gradient():
    # ||e_y - softmax(z)||^2 = 1 - 2 pi_y + sum pi^2, for logits z = (0, 1, 2) and y = 1
    z = torch.tensor([0.0, 1.0, 2.0])
    pi = torch.softmax(z, -1)
    direct = ((torch.nn.functional.one_hot(torch.tensor(1), 3) - pi) ** 2).sum()
    proxy = score_norm_proxy(pi[1].log(), (pi**2).sum())
    assert float(proxy) == pytest.approx(float(direct))


def test_response_positions():
    valid = torch.tensor([[True, False, True, True], [False, False, False, False]])
    assert response_positions(valid).tolist() == [[0, -1, 1, 2], [-1, -1, -1, -1]]


def test_describe():
    assert OptimalTokenBaseline().describe().startswith("optimal_token_baseline: A_i,t = R_i - B_g(t)")
    assert "response token" in MultiTurnOptimalTokenBaseline().describe()
    assert "2nd-longest" not in OptimalTokenBaseline(zero_tail=False).describe()


def test_yaml_names_both_kinds():
    for kind in ("optimal_token_baseline", "tir_optimal_token_baseline"):
        obj = rlstab.load({"extends": "grpo", "advantage": {"kind": kind, "eps": 0.0}})
        assert obj.advantage.kind == kind and obj.advantage.eps == 0.0


@pytest.mark.parametrize("trainer", ["TRL", "OpenRLHF"])
def test_trainers_without_sum_pi_squared_refuse_it(trainer):
    obj = rlstab.load({"extends": "grpo", "advantage": {"kind": "tir_optimal_token_baseline"}})
    (problem,) = unexecutable(obj, trainer)
    assert problem.startswith("advantage (tir_optimal_token_baseline): needs the old policy's sum_v pi(v)^2")
    assert "algorithm.adv_estimator=tir_optimal_token_baseline" in problem
    assert unexecutable(obj, "veRL", sampler_hook=True, token_baseline=True) == []


# ----------------------------------------------------------------------------- two ranks


@pytest.mark.parametrize("kind", ["optimal_token_baseline", "tir_optimal_token_baseline"])
def test_two_ranks_of_different_widths_equal_one_process(kind):
    results = dict(enumerate(run_ranks(rank_module.run_rank, kind, world=2)))
    whole, split = rank_module.one_process(kind)
    assert results[0]["width"] == results[1]["width"] == whole["width"]
    for r in range(2):
        torch.testing.assert_close(torch.tensor(results[r]["baseline"], dtype=torch.float64), whole["baseline"])
        torch.testing.assert_close(torch.tensor(results[r]["advantages"]), split[r])


# ----------------------------------------------------------------------------- the embedded trainer


def test_grpo_with_the_token_baseline_runs_two_steps_in_the_embedded_trainer(tmp_path_factory):
    from rlstab.lab.regimes import load_regime
    from rlstab.trainer.run import Run

    # no warm start (the untrained model's rewards are mostly 0): this checks that the trainer supplies sum_pi_squared
    smoke = {"name": "otb-smoke", "prompts_per_step": 2, "group_size": 4, "eval_size": 4, "eval_every": 2, "warmup_steps": 0}
    config = load_regime(smoke).train_config(steps=2, seed=0)
    objective = rlstab.load({"extends": "grpo", "advantage": {"kind": "optimal_token_baseline"}})
    run = Run(objective, config, "add2", cache_dir=tmp_path_factory.getbasetemp() / "lab-warmstart-cache")
    run.start()
    rows = [run.step().row for _ in range(2)]
    assert [r["step"] for r in rows] == [1, 2]
    assert all(math.isfinite(r["loss"]["loss"]) for r in rows)
    assert "advantage/optimal_token_baseline/baseline_minus_mean" in rows[-1]["loss"]


def test_explain_says_who_supplies_sum_pi_squared():
    text = explain(rlstab.load({"extends": "grpo", "advantage": {"kind": "optimal_token_baseline"}}))
    assert "A   = optimal_token_baseline: A_i,t = R_i - B_g(t)" in text
    assert "sum_pi_squared: advantage (optimal_token_baseline), only for a batch without advantages" in text
    assert ("  step     advantage (optimal_token_baseline): the estimator: embedded; veRL computes it in its driver "
            "(algorithm.adv_estimator=optimal_token_baseline, actor_rollout_ref.actor.calculate_sum_pi_squared=True); "
            "refused by OpenRLHF, TRL") in text
