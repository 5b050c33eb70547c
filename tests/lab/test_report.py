"""report.md: the MDE under Holm with its m, the effective n, the no-op seeds, the gates (and the fallback when one
fails), the primary and secondary families and the trend test, as the report prints them."""

import json

from rlstab.lab.analysis import restate
from rlstab.lab.power import mde_factor
from rlstab.lab.protocol import Gate, Protocol
from rlstab.lab.report import markdown

from protocol_grid import LABELS, PROTOCOL, grid


def _report(protocol: Protocol | None, with_rows: bool = True) -> str:
    runs, rows = grid()
    data = {"command": "rlstab compare ...", "versions": {"rlstab": "x"},
            "settings": {"objectives": {label: {"source": label, "fingerprint": "0" * 12} for label in LABELS},
                         "baseline": "dapo", "seeds": [0, 1, 2], "steps": 2, "model": "tiny", "regimes": {"r": {}}},
            "runs": runs}
    steps = [{"regime": r, "objective": o, "seed": s, "rows": v} for (r, o, s), v in rows.items()] if with_rows else None
    return markdown(json.loads(json.dumps(restate(data, [], steps, protocol))))


def test_one_family_the_holm_mde_and_the_effective_n():
    text = _report(None)
    assert "| objective | baseline | metric | difference [95% interval] | W/T/L | n eff | p | Holm p | MDE (Holm, m = 12) |" in text
    assert "| low | dapo | entropy ratio | " in text and "Primary comparisons" not in text
    row = next(line for line in text.splitlines() if line.startswith("| low | dapo | acc AUC |"))
    assert row.split(" | ")[5] == "2"  # n eff: seed 0 is dapo's run
    assert ("No-op seeds: low's runs are dapo's on 1 seed (0; identical per-step rows, the wall-clock time and the "
            "fields named by mask labels aside): effective n 2 of 3; its MDE counts only the 2 seeds where it differs.") in text
    assert "over all 12 paired comparisons of this report" in text
    # the MDE's factor d at each (n eff, m) of the report, once each: n = 3 (df 2), where the t-test's exact power has a
    # closed form (tests/lab/test_power.py), 80% at lambda^2 = 2 / (alpha (2 - alpha)) ln((1 - alpha) / 0.2), alpha =
    # 0.05 / 12: 240.50104 x ln(4.979167) = 240.50104 x 1.6052625 = 386.0673, d = sqrt(386.0673 / 3) = 11.344 (the normal
    # approximation's (15.443 + 1.061) / sqrt(3) = 9.529 is 16% low); and low's n eff of 2 (df 1)
    assert f"is 80%. Here d is 11.344 at n = 3, m = 12; {mde_factor(2, 0.05 / 12):.3f} at n = 2, m = 12. Holm's" in text
    assert "normal-approximation" not in text and "t(0.80, n-1)" not in text
    assert "the per-step rows were not stored" in _report(None, with_rows=False)


def test_families_the_trend_and_the_gates():
    text = _report(PROTOCOL)
    assert "Primary comparisons: Holm's family of the protocol's primary metrics and the trend test, m = 4 over the report:" in text
    assert "Secondary comparisons: a Holm family of their own, m = 9 over the report:" in text
    assert "MDE (Holm, m = 4) |" in text and "MDE (Holm, m = 9) |" in text
    assert "the centred dose ranks (-1.5, -0.5, +0.5, +1.5) of dapo (0), low (0.002), stapo (0.01), high (0.05)" in text
    assert "| dapo < low < stapo < high | entropy ratio | +0.011 [" in text
    assert "each family of this report separately (the 4 primary comparisons and the 9 secondary comparisons)" in text
    # which family each reading belongs to
    assert ("Distinguishable after Holm's correction: stapo's entropy ratio (primary: +0.022 [+0.017, +0.027], Holm p "
            "0.0082); high's entropy ratio (primary: ") in text
    assert "the entropy ratio dose trend (primary: +0.011 [" in text and "low acc AUC (secondary)" in text
    assert "| stapo | s2t | 0.1% | 50% | 50% (3 of 6) | 0.05% | 0: 50%, 1: 50%, 2: 50% | passed |" in text
    assert "Every gate passed." in text and "fallback" not in text


def test_each_distinct_n_and_m_of_the_mde_is_named_once():
    # two families of the same size (primary: 2 metrics x 3 arms; secondary: the other 2 x 3): m = 6 in both, so
    # n = 3 and low's n eff of 2 at m = 6 are the two factors, each named once. d at n = 3, alpha 0.05 / 6 (the closed
    # form above): 2 / (0.008333 x 1.991667) x ln(0.991667 / 0.2) = 120.5021 x 1.6010697 = 192.9322, sqrt(192.9322 / 3) = 8.019
    text = _report(PROTOCOL.model_copy(update={"primary": ["entropy_ratio", "final_entropy"], "trend": None}))
    assert "the 6 primary comparisons and the 6 secondary comparisons" in text
    assert f"Here d is 8.019 at n = 3, m = 6; {mde_factor(2, 0.05 / 6):.3f} at n = 2, m = 6. Holm's" in text
    assert text.count("at n = 3, m = 6") == 1


def test_a_failed_gate_prints_the_protocols_fallback():
    protocol = PROTOCOL.model_copy(update={"gates": {"stapo": Gate(mask="s2t", at_least=1e-3, on_share_of_steps=0.6)},
                                           "fallback": "if a gate fails:\n  rerun at tau_p 0.05."})
    text = _report(protocol)
    assert "| stapo | s2t | 0.1% | 60% | 50% (3 of 6) | 0.05% | 0: 50%, 1: 50%, 2: 50% | **failed** |" in text
    assert "Failed: stapo. The protocol's fallback, written before the runs: if a gate fails: rerun at tau_p 0.05." in text
