"""Firing gates: the share of steps on which a mask silences at least a given fraction of the valid tokens."""

import pytest

from rlstab.lab.gates import gate_outcome, gate_outcomes, reported_masks, silenced_fraction
from rlstab.lab.protocol import Gate, ProtocolMismatch


def _rows(silenced: list[float], valid: float = 1000.0, shadow: bool = False) -> list[dict]:
    """Step 0 (no loss), then one row per step with the mask ``s2t`` (acting, or as ``shadow/s2t``) silencing ``silenced``."""
    rows = [{"step": 0, "accuracy": 0.5}]
    for step, count in enumerate(silenced, start=1):
        if shadow:
            rows.append({"step": step, "masks": {}, "loss": {"tokens/valid": valid, "shadow/s2t/silenced": count}})
        else:
            rows.append({"step": step, "masks": {"s2t": {"kept_fraction": 1 - count / (valid or 1), "silenced": count}},
                         "loss": {"tokens/valid": valid}})
    return rows


def test_the_silenced_fraction_of_a_step():
    (_, row), (_, shadow) = _rows([3.0])[:2], _rows([3.0], shadow=True)[:2]
    assert silenced_fraction(row, "s2t") == pytest.approx(0.003)
    assert silenced_fraction(shadow, "shadow/s2t") == pytest.approx(0.003)
    assert silenced_fraction(row, "shadow/s2t") is None and silenced_fraction(shadow, "s2t") is None
    assert silenced_fraction(_rows([0.0], valid=0.0)[1], "s2t") == 0.0  # no valid token: nothing silenced


@pytest.mark.parametrize("shadow", [False, True])
def test_a_gate_pooled_over_seeds_and_per_seed(shadow):
    # Seed 0 silences 0, 1, 2, 0 of 1000 tokens; seed 1: 3, 1, 0, 0. Fractions 0, .001, .002, 0, .003, .001, 0, 0.
    # At least 0.0015: .002 and .003, 2 of the 8 steps = 0.25 (>= 0.2: passed); one of 4 steps on each seed.
    # Median of the sorted 0, 0, 0, 0, .001, .001, .002, .003: (0 + .001) / 2 = 0.0005.
    mask = "shadow/s2t" if shadow else "s2t"
    gate = Gate(mask=mask, at_least=0.0015, on_share_of_steps=0.2)
    out = gate_outcome("stapo", gate, {0: _rows([0, 1, 2, 0], shadow=shadow), 1: _rows([3, 1, 0, 0], shadow=shadow)})
    assert (out["arm"], out["mask"], out["at_least"], out["on_share_of_steps"]) == ("stapo", mask, 0.0015, 0.2)
    assert (out["steps"], out["firing_steps"], out["share"]) == (8, 2, 0.25)
    assert out["median_fraction"] == pytest.approx(0.0005)
    assert out["per_seed"] == [{"seed": 0, "steps": 4, "firing_steps": 1, "share": 0.25},
                               {"seed": 1, "steps": 4, "firing_steps": 1, "share": 0.25}]
    assert out["passed"] is True
    # the same runs fail a gate asking for 30% of the steps, and a step exactly at the threshold fires
    assert gate_outcome("stapo", gate.model_copy(update={"on_share_of_steps": 0.3}), {0: _rows([0, 1, 2, 0], shadow=shadow)})[
        "passed"] is False
    assert gate_outcome("stapo", gate.model_copy(update={"at_least": 0.002}), {0: _rows([2], shadow=shadow)})["share"] == 1.0


def test_a_mask_no_row_reports_is_a_mismatch_not_a_failed_gate():
    gate = Gate(mask="s2t_0", at_least=1e-4, on_share_of_steps=0.2)
    with pytest.raises(ProtocolMismatch, match=r"^protocol gates\.stapo\.mask = 's2t_0': no step of stapo's runs reports "
                                               r"that mask \(reported: s2t\)$"):
        gate_outcome("stapo", gate, {0: _rows([1, 0])})
    assert reported_masks({0: _rows([1.0]), 1: _rows([0.0], shadow=True)}) == ["s2t", "shadow/s2t"]


def test_gate_outcomes_of_a_grid():
    runs = [{"regime": "r", "objective": "stapo", "seed": s} for s in (0, 1)]
    rows = {("r", "stapo", 0): _rows([1, 0]), ("r", "stapo", 1): _rows([0, 0])}
    (out,) = gate_outcomes({"stapo": Gate(mask="s2t", at_least=1e-3, on_share_of_steps=0.5)}, runs, "r", rows)
    assert out["share"] == 0.25 and out["passed"] is False
    with pytest.raises(ProtocolMismatch, match=r"^protocol gates\.dapo: 'dapo' has no runs under regime r$"):
        gate_outcomes({"dapo": Gate(mask="s2t", at_least=1e-3, on_share_of_steps=0.5)}, runs, "r", rows)
