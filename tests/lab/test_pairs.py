"""Each objective against the baseline it names: ``--pair OBJECTIVE=BASELINE``, its one-line errors, Holm over a
whole report or over its primary and secondary families (a stored grid's restatement: tests/lab/test_analysis.py)."""

import subprocess
import sys

import pytest

from rlstab.cli import build_parser
from rlstab.lab import LabError, plan
from rlstab.lab.paired import PAIRED_METRICS, PairError, pairs, tables
from rlstab.lab.summary import value

LABELS = ["grpo", "dapo", "stapo", "20-entropy", "stare"]


def test_the_global_baseline_then_each_pair():
    assert pairs(LABELS, "grpo") == {"dapo": "grpo", "stapo": "grpo", "20-entropy": "grpo", "stare": "grpo"}
    given = ["stapo=dapo", " 20-entropy = dapo ", "stare=dapo"]
    assert pairs(LABELS, "grpo", given) == {"dapo": "grpo", "stapo": "dapo", "20-entropy": "dapo", "stare": "dapo"}
    # the baseline itself can be paired with another objective
    assert pairs(["grpo", "dapo"], "grpo", ["grpo=dapo"]) == {"grpo": "dapo", "dapo": "grpo"}


@pytest.mark.parametrize(("item", "message"), [
    ("stapo", "--pair 'stapo': OBJECTIVE=BASELINE, e.g. stapo=dapo"),
    ("=dapo", "--pair '=dapo': OBJECTIVE=BASELINE, e.g. stapo=dapo"),
    ("stapo=", "--pair 'stapo=': OBJECTIVE=BASELINE, e.g. stapo=dapo"),
    ("ppo=dapo", "--pair ppo=dapo: 'ppo' is not one of the objectives (grpo, dapo, stapo, 20-entropy, stare)"),
    ("stapo=ppo", "--pair stapo=ppo: 'ppo' is not one of the objectives"),
    ("stapo=dapo=grpo", "--pair stapo=dapo=grpo: 'dapo=grpo' is not one of the objectives"),
    ("dapo=dapo", "--pair dapo=dapo: an objective is not paired with itself"),
    ("stapo=dapo\nx", "--pair stapo=dapo\nx: 'dapo\nx' is not one of the objectives"),
])
def test_a_bad_pair_is_one_line(item, message):
    with pytest.raises(PairError) as err:
        pairs(LABELS, "grpo", [item])
    assert str(err.value).startswith(message.split("\n")[0])
    assert len(repr(str(err.value)).splitlines()) == 1  # printed through one_line by the command


def test_an_objective_paired_twice_is_refused():
    with pytest.raises(PairError, match=r"^--pair stapo=grpo: stapo is paired twice$"):
        pairs(LABELS, "grpo", ["stapo=dapo", "stapo=grpo"])


def test_the_command_line_pairs_reach_the_plan(tmp_path):
    args = build_parser().parse_args(["compare", "--objective", "grpo", "--objective", "dapo", "--objective", "stapo",
                                      "--pair", "stapo=dapo", "--out", str(tmp_path)])
    assert args.pair == ["stapo=dapo"]
    p = plan(args.objective, out=tmp_path, pair=args.pair, seeds=2, steps=3)
    assert p.pairs == {"dapo": "grpo", "stapo": "dapo"}
    with pytest.raises(LabError, match=r"^--pair stapo=ppo: 'ppo' is not one of the objectives \(grpo, dapo, stapo\)$"):
        plan(args.objective, out=tmp_path, pair=["stapo=ppo"], seeds=2, steps=3)


def test_a_bad_pair_on_the_command_line_is_one_line_and_status_2(tmp_path):
    done = subprocess.run([sys.executable, "-m", "rlstab", "compare", "--objective", "grpo", "--objective", "stapo",
                           "--pair", "stapo:grpo", "--out", str(tmp_path / "out"), "--quiet"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    assert done.stderr == "rlstab compare: --pair 'stapo:grpo': OBJECTIVE=BASELINE, e.g. stapo=dapo\n"
    assert not (tmp_path / "out").exists()


def _runs(values: dict[str, list[float]]) -> list[dict]:
    return [{"regime": "r", "objective": label, "seed": seed, "summary": {"accuracy_auc": v, "final_accuracy": v,
                                                                         "final_entropy": 0.2, "start_entropy": 0.4}}
            for label, vs in values.items() for seed, v in enumerate(vs)]


def test_holm_runs_over_every_comparison_of_the_report():
    runs = _runs({"a": [0.5, 0.5, 0.5], "b": [0.6, 0.62, 0.61], "c": [0.7, 0.72, 0.71]})
    _, paired = tables(runs, ["a", "b", "c"], ["r"], {"b": "a", "c": "b"})
    family = [d for m in paired["r"].values() for d in m.values()]
    assert len(family) == 2 * 4  # the four metrics every run has; pass@k only where runs measured it (below)
    # b - a: 0.10, 0.12, 0.11 and c - b: 0.10, 0.10, 0.10 (sd 0, mean 0.1: p 0 for both accuracy metrics);
    # entropies and ratios are equal in every run, so those differences are 0 (p 1). b's accuracy: mean 0.11,
    # sd 0.01, t = 0.11 / (0.01 / sqrt 3) = 19.0526 (t^2 = 363.0), df 2, whose two-sided p is 1 - t / sqrt(2 + t^2)
    # = 1 - 19.0526 / sqrt(365.0) = 1 - 0.997257 = 0.002743. Of the 8 tests it ranks third (after the two zeros): x (8 - 3 + 1) = 6.
    b = paired["r"]["b"]["accuracy_auc"]
    assert b["p"] == pytest.approx(0.002743, abs=2e-6)
    assert b["p_holm"] == pytest.approx(min(1, 6 * b["p"]), rel=1e-9)  # two p of 0 rank first: m - j + 1 = 6
    assert b["distinguishable"] is True
    assert paired["r"]["c"]["entropy_ratio"]["p_holm"] == 1.0 and paired["r"]["c"]["entropy_ratio"]["distinguishable"] is False


def test_the_entropy_ratio_of_a_summary_stored_before_it_existed():
    assert value({"final_entropy": 0.2, "start_entropy": 0.4}, "entropy_ratio") == 0.5
    assert value({"final_entropy": 0.2, "start_entropy": 0.4, "entropy_ratio": 0.3}, "entropy_ratio") == 0.3
    assert value({"final_entropy": None, "start_entropy": 0.4}, "entropy_ratio") is None


def test_pass_at_k_joins_the_paired_metrics_only_where_runs_measured_it():
    runs = _runs({"a": [0.5, 0.5, 0.5], "b": [0.6, 0.62, 0.61]})
    for i, run in enumerate(runs):  # b's pass@k 0.1 above a's on every seed; a's distinct answers 2.0, b's 1.5
        b = run["objective"] == "b"
        run["summary"].update(final_pass_at_k=0.8 + 0.1 * b + 0.01 * (i % 3), final_distinct_correct=2.0 - 0.5 * b)
    aggregates, paired = tables(runs, ["a", "b"], ["r"], {"b": "a"})
    assert list(paired["r"]["b"]) == list(PAIRED_METRICS)
    assert paired["r"]["b"]["final_pass_at_k"]["mean"] == pytest.approx(0.1)
    assert paired["r"]["b"]["final_distinct_correct"]["mean"] == pytest.approx(-0.5)
    assert aggregates["r"]["a"]["final_distinct_correct"]["mean"] == pytest.approx(2.0)
    _, without = tables(_runs({"a": [0.5, 0.5, 0.5], "b": [0.6, 0.62, 0.61]}), ["a", "b"], ["r"], {"b": "a"})
    assert "final_pass_at_k" not in without["r"]["b"]


def test_primary_metrics_are_one_holm_family_and_the_others_another():
    runs = _runs({"a": [0.5, 0.5, 0.5], "b": [0.6, 0.62, 0.61], "c": [0.7, 0.72, 0.71]})
    _, paired = tables(runs, ["a", "b", "c"], ["r"], {"b": "a", "c": "b"}, primary=["accuracy_auc"])
    primary = [d for m in paired["r"].values() for k, d in m.items() if k == "accuracy_auc"]
    secondary = [d for m in paired["r"].values() for k, d in m.items() if k != "accuracy_auc"]
    assert {d["family"] for d in primary} == {"primary"} and {d["m"] for d in primary} == {2}
    assert {d["family"] for d in secondary} == {"secondary"} and {d["m"] for d in secondary} == {6}
    # b's AUC: p 0.002743 (above); c's: p 0 (sd 0). In the primary family of 2, b ranks second: x 1, max(0, p) = p.
    b = paired["r"]["b"]["accuracy_auc"]
    assert b["p_holm"] == pytest.approx(b["p"], rel=1e-12)
    # b's final accuracy, equal to its AUC by construction, ranks second of the secondary 6 (after c's p 0): x 5
    assert paired["r"]["b"]["final_accuracy"]["p_holm"] == pytest.approx(5 * b["p"], rel=1e-9)
    # a joined comparison (a trend test) is in the primary family: m = 3, and b's AUC now ranks second of 3: x 2
    trend = {"p": 0.5}
    _, paired = tables(runs, ["a", "b", "c"], ["r"], {"b": "a", "c": "b"}, primary=["accuracy_auc"], joined=[trend])
    assert trend["m"] == 3 and trend["family"] == "primary" and trend["p_holm"] == 0.5
    assert paired["r"]["b"]["accuracy_auc"]["p_holm"] == pytest.approx(2 * b["p"], rel=1e-9)
    # a primary metric outside the usual paired ones joins them
    runs = _runs({"a": [0.5, 0.5, 0.5], "b": [0.6, 0.62, 0.61]})
    for i, run in enumerate(runs):
        run["summary"]["mean_grad_norm"] = 1.0 + i / 10
    _, paired = tables(runs, ["a", "b"], ["r"], {"b": "a"}, primary=["mean_grad_norm"])
    assert list(paired["r"]["b"]) == ["accuracy_auc", "final_accuracy", "entropy_ratio", "final_entropy", "mean_grad_norm"]
    assert paired["r"]["b"]["mean_grad_norm"]["family"] == "primary" and paired["r"]["b"]["mean_grad_norm"]["m"] == 1


def test_the_no_op_seeds_give_the_effective_n():
    runs = _runs({"a": [0.5, 0.5, 0.5, 0.5], "b": [0.5, 0.6, 0.7, 0.5]})
    _, paired = tables(runs, ["a", "b"], ["r"], {"b": "a"}, same={("r", "b"): [0, 3]})
    d = paired["r"]["b"]["accuracy_auc"]
    assert d["n"] == 4 and d["n_effective"] == 2 and d["sd_effective"] == pytest.approx(0.1 / 2 ** 0.5)


def test_late_minus_peak_reward_is_aggregated_only_where_runs_have_it():
    runs = _runs({"a": [0.5, 0.5, 0.5], "b": [0.6, 0.62, 0.61]})
    aggregates, _ = tables(runs, ["a", "b"], ["r"], {"b": "a"})
    assert "late_minus_peak_reward" not in aggregates["r"]["a"]  # summaries stored before it existed
    for i, run in enumerate(runs):
        run["summary"]["late_minus_peak_reward"] = -0.1 * (i % 3)
    aggregates, _ = tables(runs, ["a", "b"], ["r"], {"b": "a"})
    assert aggregates["r"]["a"]["late_minus_peak_reward"]["mean"] == pytest.approx(-0.1)  # (0 - 0.1 - 0.2) / 3
