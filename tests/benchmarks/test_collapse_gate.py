"""``benchmarks/collapse_gate.py``'s firing rule, on hand-made rows (the gate's training runs are not run here)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

SCRIPT = Path(__file__).parents[2] / "benchmarks" / "collapse_gate.py"
_spec = importlib.util.spec_from_file_location("collapse_gate", SCRIPT)
gate = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(gate)


def _row(step: int, valid: float, acting: float, shadow: float) -> dict:
    return {"step": step, "masks": {"s2t": {"kept_fraction": None, "silenced": acting}},
            "loss": {"tokens/valid": valid, "shadow/s2t_2/silenced": shadow, "shadow/s2t_2/kept": valid - shadow}}


ROWS = [{"step": 0, "accuracy": 0.5}, _row(1, 1000.0, 0.0, 1.0), _row(2, 20000.0, 1.0, 1.0), _row(3, 1000.0, 2.0, 0.0)]


def test_a_masks_silenced_share_is_of_the_steps_valid_tokens():
    assert gate.silenced_fraction(ROWS[1], "shadow/s2t_2") == pytest.approx(1e-3)  # 1 of 1000 valid tokens
    assert gate.silenced_fraction(ROWS[2], "s2t") == pytest.approx(5e-5)  # 1 of 20000
    assert gate.silenced_fraction(_row(1, 0.0, 0.0, 0.0), "s2t") == 0.0  # no valid token: nothing silenced


def test_a_mask_fires_on_a_step_where_it_silences_at_least_the_share():
    # shadow/s2t_2: 1/1000 = 1e-3 (fires), 1/20000 = 5e-5 (under 1e-4), 0 -> 1 step of 3; step 0 is no RL step
    assert gate.fired_steps(ROWS, "shadow/s2t_2") == 1
    # s2t: 0, 5e-5, 2e-3 -> 1 step at 1e-4; 2 at 5e-5, the threshold included
    assert gate.fired_steps(ROWS, "s2t") == 1
    assert gate.fired_steps(ROWS, "s2t", at_least=5e-5) == 2
