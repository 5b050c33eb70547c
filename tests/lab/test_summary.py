import pytest

from rlstab.lab.summary import accuracy_auc, late_minus_peak, run_summary


def _row(step, entropy, accuracy=None, reward=0.5, grad=1.0, silenced=0.0, clip=(0.0, 0.0, 0.0), ess=1.0):
    return {"step": step, "entropy": entropy, "accuracy": accuracy, "reward": reward, "grad_norm": grad,
            "silenced_fraction": silenced, "clip_high_fraction": clip[0], "clip_low_fraction": clip[1],
            "clip_dual_fraction": clip[2], "ess_fraction": ess, "time": 0.5}


def test_accuracy_auc_is_the_trapezoid_mean():
    # points (0, 0.2), (2, 0.4), (4, 0.4): area 2 * 0.3 + 2 * 0.4 = 1.4 over 4 steps = 0.35
    rows = [{"step": 0, "accuracy": 0.2}, {"step": 1, "accuracy": None}, {"step": 2, "accuracy": 0.4},
            {"step": 3}, {"step": 4, "accuracy": 0.4}]
    assert accuracy_auc(rows) == pytest.approx(0.35)
    assert accuracy_auc(rows[:1]) is None


def test_run_summary_by_hand():
    rows = [{"step": 0, "accuracy": 0.25}]
    entropies = [0.40, 0.38, 0.30, 0.25, 0.22, 0.20, 0.18, 0.16, 0.14, 0.12, 0.10]
    for step, h in enumerate(entropies, start=1):
        rows.append(_row(step, h, accuracy=0.5 if step == 11 else None, reward=step / 11, grad=step,
                         silenced=0.01, clip=(0.02, 0.01, 0.0), ess=1.0 - step / 100))
    s = run_summary(rows)
    assert s["steps"] == 11
    assert (s["start_accuracy"], s["final_accuracy"]) == (0.25, 0.5)
    # tail: ceil(0.1 * 11) = 2 steps: entropy (0.12 + 0.10) / 2 = 0.11 < 0.5 * 0.40: collapsed
    assert s["final_entropy"] == pytest.approx(0.11)
    assert s["collapsed"] == 1.0
    assert s["min_entropy"] == 0.10 and s["start_entropy"] == 0.40
    assert s["final_reward"] == pytest.approx((10 / 11 + 11 / 11) / 2)
    assert s["mean_grad_norm"] == pytest.approx(6.0) and s["max_grad_norm"] == 11
    assert s["mean_clip_fraction"] == pytest.approx(0.03)
    assert s["min_ess_fraction"] == pytest.approx(0.89)
    assert s["wall_time"] == pytest.approx(5.5)
    # (0 -> 11) one trapezoid: (0.25 + 0.5) / 2
    assert s["accuracy_auc"] == pytest.approx(0.375)


def test_entropy_held_is_not_a_collapse_and_missing_ess_stays_missing():
    rows = [{"step": 0, "accuracy": 0.3}] + [_row(s, 0.3, ess=None) for s in (1, 2)]
    s = run_summary(rows)
    assert s["collapsed"] == 0.0
    assert s["mean_ess_fraction"] is None and s["min_ess_fraction"] is None
    assert s["final_accuracy"] is None  # never evaluated after step 0


def test_zero_variance_groups_and_layer_metrics_are_averaged_over_the_steps_that_report_them():
    rows = [{"step": 0, "accuracy": 0.3}] + [_row(s, 0.3) for s in (1, 2, 3)]
    rows[1]["zero_variance_groups"], rows[2]["zero_variance_groups"] = 0.5, 0.25  # step 3 predates the field
    rows[1]["layers"] = {"rollout/pivots": 4.0, "rollout/branch_success": 0.5}
    rows[3]["layers"] = {"rollout/pivots": 0.0}
    s = run_summary(rows)
    assert s["mean_zero_variance_groups"] == pytest.approx(0.375)  # (0.5 + 0.25) / 2
    # pivots: (4 + 0) / 2 steps that report it; branch success: only step 1 reports it
    assert s["layers"] == {"rollout/pivots": 2.0, "rollout/branch_success": 0.5}
    assert "layers" not in run_summary(rows[:1] + [_row(1, 0.3)])


def test_pass_at_k_is_summarised_from_the_first_and_last_measured_rows():
    rows = [
        {"step": 0, "accuracy": 0.5, "pass_at_k": {"k": 4, "n": 16, "pass_at_k": 0.8, "distinct_correct": 3.0}},
        {"step": 1, "accuracy": None, "reward": 0.5, "entropy": 1.0, "grad_norm": 1.0, "silenced_fraction": 0.0,
         "clip_high_fraction": 0.0, "clip_low_fraction": 0.0, "clip_dual_fraction": 0.0},
        {"step": 2, "accuracy": 0.9, "reward": 0.9, "entropy": 0.2, "grad_norm": 1.0, "silenced_fraction": 0.0,
         "clip_high_fraction": 0.0, "clip_low_fraction": 0.0, "clip_dual_fraction": 0.0,
         "pass_at_k": {"k": 4, "n": 16, "pass_at_k": 0.95, "distinct_correct": 1.25}},
    ]
    s = run_summary(rows)
    assert (s["start_pass_at_k"], s["final_pass_at_k"]) == (0.8, 0.95)
    assert (s["start_distinct_correct"], s["final_distinct_correct"]) == (3.0, 1.25)
    assert "final_pass_at_k" not in run_summary([{k: v for k, v in r.items() if k != "pass_at_k"} for r in rows])


def test_late_minus_peak_reward_by_hand():
    rewards = [0.2, 0.4, 0.6, 0.8, 1.0, 0.6, 0.4, 0.2, 0.2, 0.2]
    # moving means of 5: steps 1-5 (0.2+0.4+0.6+0.8+1.0)/5 = 0.60, 2-6 3.4/5 = 0.68, 3-7 3.4/5 = 0.68,
    # 4-8 3.0/5 = 0.60, 5-9 2.4/5 = 0.48, 6-10 (0.6+0.4+0.2+0.2+0.2)/5 = 0.32: late 0.32 - peak 0.68 = -0.36
    assert late_minus_peak(rewards) == pytest.approx(-0.36)
    rows = [{"step": 0, "accuracy": 0.3}] + [_row(step, 0.3, reward=r) for step, r in enumerate(rewards, start=1)]
    assert run_summary(rows)["late_minus_peak_reward"] == pytest.approx(-0.36)
    assert late_minus_peak([0.1, 0.2, 0.3, 0.4, 0.5, 0.6]) == 0.0  # rising: the last window is the best
    assert late_minus_peak([0.5] * 5) == 0.0  # one window: late is the peak
    assert late_minus_peak([0.5] * 4) is None  # fewer steps than the window
    assert run_summary(rows[:5])["late_minus_peak_reward"] is None
