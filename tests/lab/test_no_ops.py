"""No-op runs: which fields of a metrics row say that two runs are the same run, and which are the arm's own."""

import gzip
import json
import math
from pathlib import Path

import pytest

from rlstab.lab.no_ops import ROW_SKIPPED, no_op_seeds, rows_by_run, same_record, same_rows, same_summaries

ROOT = Path(__file__).parents[2]


def _row(step: int, **changes) -> dict:
    row = {
        "objective": "dapo-shadow", "step": step, "reward": 0.25, "accuracy": None, "entropy": 1.0, "grad_norm": 2.5,
        "kept_fraction": 1.0, "silenced": 0.0, "silenced_fraction": 0.0, "masks": {},
        "loss": {"shadow/s2t/kept": 500.0, "shadow/s2t/silenced": 0.0, "shadow/s2t/entropy_threshold": 1.5,
                 "loss/policy": -0.02, "tokens/valid": 500.0, "tokens/kept": 500.0},
        "mechanism": {"full_grad_norm": 4.9, "masks": {"shadow/s2t": {"share": 0.0, "silenced": 0}}},
        "ess_fraction": 1.0, "time": 0.58,
    }
    for path, value in changes.items():
        node = row
        *parents, last = path.split("__")
        for key in parents:
            node = node[key]
        node[last] = value
    return row


def test_what_is_the_arms_own_is_left_out():
    base = _row(1)
    # stapo's row of the same step: its own name, its acting mask by label instead of a shadow mask, other thresholds,
    # another wall-clock time; the training itself (loss, gradient, rollouts) the same floats
    arm = _row(1, objective="stapo", masks={"s2t": {"kept_fraction": 1.0, "silenced": 0.0}}, time=0.61,
               loss={"loss/policy": -0.02, "tokens/valid": 500.0, "tokens/kept": 500.0},
               mechanism={"full_grad_norm": 4.9, "masks": {"s2t": {"share": 0.0, "silenced": 0}}})
    assert same_record(arm, base)
    assert same_record(_row(1, time=9.9), base)
    # what the training did is compared: a different loss, gradient, silenced count or rollout entropy is another run
    for change in ({"loss__loss/policy": -0.021}, {"grad_norm": 2.5000001}, {"silenced": 1.0},
                   {"silenced_fraction": 0.002}, {"loss__tokens/kept": 499.0}, {"entropy": 1.0 + 1e-12},
                   {"mechanism__full_grad_norm": 4.8}):
        assert not same_record(_row(1, **change), base), change
    # without the exclusions the same training would count as different runs
    assert not same_record(arm, base, skipped=("time",))
    assert set(ROW_SKIPPED) == {"time", "objective", "masks", "mechanism.masks"}


def test_a_field_only_one_run_reports_is_not_compared_and_nan_equals_nan():
    base = _row(1, entropy=math.nan)
    arm = _row(1, entropy=math.nan, loss__tis_weight=3.0, layers={"sampler/teacher_mse": 0.1})
    assert same_record(arm, base)


def test_same_rows_needs_the_same_steps():
    a = [_row(0), _row(1), _row(2)]
    assert same_rows(a, [_row(2), _row(0), _row(1)])  # order does not matter
    assert not same_rows(a, [_row(0), _row(1)])
    assert not same_rows(a[:2], [_row(0), _row(1), _row(2)])
    assert not same_rows(a, [_row(0), _row(1), _row(2, reward=0.3)])


def test_summaries_are_compared_without_their_wall_time():
    a = {"accuracy_auc": 0.5, "mean_grad_norm": 1.2, "wall_time": 30.0, "layers": {"sampler/x": 1.0}}
    assert same_summaries(a, {"accuracy_auc": 0.5, "mean_grad_norm": 1.2, "wall_time": 31.0})
    assert not same_summaries(a, {"accuracy_auc": 0.5, "mean_grad_norm": 1.3, "wall_time": 30.0})


def test_no_op_seeds_by_rows_and_by_summaries():
    runs = [{"regime": "r", "objective": o, "seed": s, "summary": {"x": 1.0 if (o, s) != ("b", 1) else 2.0}}
            for o in ("a", "b") for s in (0, 1)]
    rows = {("r", o, s): [_row(1, reward=0.5 if (o, s) == ("b", 0) else 0.25)] for o in ("a", "b") for s in (0, 1)}
    assert no_op_seeds(runs, "r", "b", "a") == [0]  # summaries: seed 1 differs
    assert no_op_seeds(runs, "r", "b", "a", rows) == [1]  # rows: seed 0 differs


def test_the_collapse_experiments_stapo_is_dapo_shadow_on_five_seeds():
    """The stored runs: S2T never fired on seeds 0, 1, 3, 5, 6, so stapo's runs are dapo-shadow's there, by rows
    and by summaries alike; but not with only the wall-clock time left out (their mask fields differ)."""
    data = json.loads((ROOT / "docs" / "lab" / "collapse.json").read_text())
    steps = json.loads(gzip.decompress((ROOT / "docs" / "lab" / "collapse" / "steps.json.gz").read_bytes()))["runs"]
    rows = rows_by_run(steps)
    assert no_op_seeds(data["runs"], "collapse", "stapo", "dapo-shadow", rows) == [0, 1, 3, 5, 6]
    assert no_op_seeds(data["runs"], "collapse", "stapo", "dapo-shadow") == [0, 1, 3, 5, 6]
    for arm in ("stapo-dose", "random-matched"):
        assert no_op_seeds(data["runs"], "collapse", arm, "dapo-shadow", rows) == []
    stapo, dapo = rows["collapse", "stapo", 0], rows["collapse", "dapo-shadow", 0]
    assert not all(same_record(a, b, skipped=("time",)) for a, b in zip(stapo, dapo))


@pytest.mark.parametrize(("grid", "regime", "arm", "base", "seeds"), [
    ("sparse", "sparse", "dapo", "grpo", [0, 1, 2, 3, 4]),  # the page: dapo's runs are grpo's at every step
    ("sparse", "sparse", "stapo", "dapo", [0, 1, 4]),  # the page: stapo fired on seeds 2 and 3 only
])
def test_the_sparse_grids_no_ops_are_what_the_page_says(grid, regime, arm, base, seeds):
    data = json.loads((ROOT / "docs" / "lab" / f"{grid}.json").read_text())
    assert no_op_seeds(data["runs"], regime, arm, base) == seeds
