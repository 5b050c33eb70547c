"""A grid's mechanism summary from its per-step rows (rlstab.lab.mechanism), by hand."""

import pytest

from rlstab.lab.mechanism import compact, mechanism_summary


def row(step, entropy, share, silenced=1):
    return {"step": step, "entropy": entropy,
            "mechanism": {"masks": {"shadow/s2t": {"share": share, "cosine": None, "silenced": silenced}},
                          "logit_grad": {"pearson": {"p": -0.5}, "probability_bins": [1, 2], "entropy_bins": [3]}}}


def test_the_mean_share_and_its_correlation_with_the_next_entropy_change():
    runs = [
        {"objective": "dapo", "rows": [{"step": 0}, row(1, 1.0, 0.1), row(2, 0.5, 0.3), row(3, 0.25, 0.0, silenced=0)]},
        {"objective": "dapo", "rows": [row(2, 0.8, 0.2), row(1, 1.0, None)]},  # rows in any order; a share of None
        {"objective": "stapo", "rows": [row(1, 1.0, 0.9)]},  # another objective: left out
    ]
    s = mechanism_summary(runs, "dapo", "shadow/s2t")
    # 5 measured steps, 4 silencing; shares 0.1, 0.3, 0.0, 0.2 (the None left out): mean 0.6 / 4 = 0.15
    assert (s["steps"], s["silencing_steps"]) == (5, 4)
    assert s["mean_share"] == pytest.approx(0.15)
    assert s["mean_share_when_silencing"] == pytest.approx(0.2)  # 0.1, 0.3, 0.2 where it silenced: 0.6 / 3
    # pairs (share_t, (H_t+1 - H_t) / H_t): (0.1, -0.5) and (0.3, -0.5) in run 1 (step 3 has no next step);
    # run 2's step 1 has no share. The changes are equal: a constant variable has no correlation.
    assert s["pairs"] == 2 and s["next_entropy_pearson"] is None
    runs[0]["rows"][3]["entropy"] = 0.45  # step 2 -> 3 now -0.1: pairs (0.1, -0.5), (0.3, -0.1): correlation +1
    assert mechanism_summary(runs, "dapo", "shadow/s2t")["next_entropy_pearson"] == pytest.approx(1.0)


def test_compact_drops_only_the_bins():
    steps = {"runs": [{"objective": "dapo", "rows": [{"step": 0}, row(1, 1.0, 0.1)]}]}
    out = compact(steps)["runs"][0]["rows"]
    assert out[0] == {"step": 0}
    assert out[1]["mechanism"]["logit_grad"] == {"pearson": {"p": -0.5}}
    assert out[1]["mechanism"]["masks"] == steps["runs"][0]["rows"][1]["mechanism"]["masks"]
    assert "probability_bins" in steps["runs"][0]["rows"][1]["mechanism"]["logit_grad"]  # the input is untouched
