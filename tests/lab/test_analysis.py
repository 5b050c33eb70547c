"""A grid's statistics under its protocol (no-op seeds, gates, families, the trend test), and the stored grids
restated by this version: each published results file is its own restatement."""

import gzip
import json
from pathlib import Path

import pytest

from rlstab.lab.analysis import analyse, published_steps, restate, restate_published
from rlstab.lab.protocol import Gate, Protocol, ProtocolMismatch, Trend

from protocol_grid import LABELS, PROTOCOL, grid

ROOT = Path(__file__).parents[2]
PUBLISHED = sorted((ROOT / "docs" / "lab").glob("**/*.json"))


@pytest.mark.parametrize("path", PUBLISHED, ids=[p.stem for p in PUBLISHED])
def test_the_published_statistics_are_this_versions(path):
    data = json.loads(path.read_text())
    again = json.loads(json.dumps(restate_published(path)))
    assert again == data
    # the grids whose per-step rows were kept are compared by their rows
    assert data["no_ops"]["compared"] == ("per-step rows" if path.stem in ("collapse", "collapse-rerun", "policy-lag-ratio", "spurious") else "run summaries")


def test_the_kept_rows_are_found_beside_the_results(tmp_path):
    assert published_steps(ROOT / "docs" / "lab" / "token.json") is None
    assert len(published_steps(ROOT / "docs" / "lab" / "collapse.json")) == 32
    (tmp_path / "results.json").write_text("{}")
    (tmp_path / "steps.json").write_text(json.dumps({"runs": [{"rows": []}]}))  # as compare writes them
    assert published_steps(tmp_path / "results.json") == [{"rows": []}]
    (tmp_path / "grid.json").write_text("{}")
    (tmp_path / "grid").mkdir()
    (tmp_path / "grid" / "steps.json.gz").write_bytes(gzip.compress(json.dumps({"runs": [1]}).encode()))
    (tmp_path / "steps.json").unlink()
    assert published_steps(tmp_path / "grid.json") == [1]


def test_analyse_under_a_protocol():
    runs, rows = grid()
    pairing = {"low": "dapo", "stapo": "dapo", "high": "dapo"}
    out = analyse(runs, LABELS, ["r"], pairing, PROTOCOL, rows)
    assert out["no_ops"] == {"compared": "per-step rows", "seeds": {"r": {"low": [0], "stapo": [], "high": []}}}
    low = out["paired"]["r"]["low"]
    assert low["entropy_ratio"]["n"] == 3 and low["entropy_ratio"]["n_effective"] == 2
    # primary: 3 entropy-ratio comparisons and the trend test; secondary: the other 3 metrics x 3 arms
    assert {d["m"] for d in (low["entropy_ratio"], out["trend"]["r"])} == {4}
    assert {d["family"] for d in (low["entropy_ratio"], out["trend"]["r"])} == {"primary"}
    assert low["accuracy_auc"]["family"] == "secondary" and low["accuracy_auc"]["m"] == 9
    # trend per seed: seed s's ratio is level + (0.01 + 0.001 s) x rank, except low's on seed 0 (0 instead of rank 1 x 0.01):
    # weights -1.5, -0.5, 0.5, 1.5 / 5: seed 1 and 2 give 0.011, 0.012; seed 0: (0.5 x 0.02 + 1.5 x 0.03) / 5 = 0.011
    trend = out["trend"]["r"]
    assert trend["arms"] == LABELS and trend["metric"] == "entropy_ratio"
    assert trend["slopes"] == pytest.approx([0.011, 0.011, 0.012])
    # the gate: stapo silences 1 of 1000 tokens on step 1 of 2 of every seed: 3 of 6 steps, 0.5 >= 0.5
    (gate,) = out["gates"]["r"]
    assert (gate["arm"], gate["steps"], gate["firing_steps"], gate["passed"]) == ("stapo", 6, 3, True)
    assert gate["median_fraction"] == pytest.approx(0.0005)
    # by summaries instead of rows, the same seed is the no-op (its summaries are equal, wall time aside)
    summaries = analyse(runs, LABELS, ["r"], pairing, Protocol(primary=["entropy_ratio"]))
    assert summaries["no_ops"]["seeds"]["r"]["low"] == [0] and summaries["no_ops"]["compared"] == "run summaries"
    assert "gates" not in summaries and "trend" not in summaries
    # without a protocol: one family of all 12 comparisons
    plain = analyse(runs, LABELS, ["r"], pairing)
    assert {d["family"] for m in plain["paired"]["r"].values() for d in m.values()} == {"all"}
    assert {d["m"] for m in plain["paired"]["r"].values() for d in m.values()} == {12}


def test_a_trend_alone_makes_it_the_primary_family():
    runs, rows = grid()
    out = analyse(runs, LABELS, ["r"], {"stapo": "dapo"}, Protocol(trend=PROTOCOL.trend), rows)
    assert out["trend"]["r"]["family"] == "primary" and out["trend"]["r"]["m"] == 1
    assert {d["family"] for d in out["paired"]["r"]["stapo"].values()} == {"secondary"}


@pytest.mark.parametrize(("protocol", "rows", "message"), [
    (Protocol(gates={"stapo": Gate(mask="s2t", at_least=1e-3, on_share_of_steps=0.5)}), False,
     "protocol gates: checking them needs every run's per-step rows (steps.json), which these results do not have"),
    (Protocol(gates={"stapo": Gate(mask="s2t_1", at_least=1e-3, on_share_of_steps=0.5)}), True,
     "protocol gates.stapo.mask = 's2t_1': no step of stapo's runs reports that mask (reported: s2t)"),
    (Protocol(gates={"ppo": Gate(mask="s2t", at_least=1e-3, on_share_of_steps=0.5)}), True,
     "protocol gates.ppo: 'ppo' is not one of the objectives (dapo, low, stapo, high)"),
    (Protocol(primary=["final_pass_at_k"]), True, "protocol primary[0] = 'final_pass_at_k': no run measured it"),
    (Protocol(trend=Trend(arms=["dapo", "low", "ppo"], doses=[0, 1, 2], metric="entropy_ratio")), True,
     "protocol trend.arms[2] = 'ppo': not one of the objectives (dapo, low, stapo, high)"),
])
def test_a_protocol_that_does_not_fit_the_runs_is_one_line(protocol, rows, message):
    runs, all_rows = grid()
    with pytest.raises(ProtocolMismatch) as err:
        analyse(runs, LABELS, ["r"], {"stapo": "dapo"}, protocol, all_rows if rows else None)
    assert str(err.value) == message


def test_restate_keeps_the_protocol_it_was_given():
    runs, rows = grid()
    data = {"command": None, "versions": {}, "settings": {"objectives": dict.fromkeys(LABELS, {}), "baseline": "dapo",
                                                            "regimes": {"r": {}}}, "runs": runs}
    steps = [{"regime": r, "objective": o, "seed": s, "rows": v} for (r, o, s), v in rows.items()]
    once = restate(data, [], steps, PROTOCOL)
    assert once["settings"]["protocol"] == PROTOCOL.model_dump() and "gates" in once and "trend" in once
    assert "per-step rows and summaries" in once["restated"]
    again = restate(json.loads(json.dumps(once)), [], steps)  # the stored protocol is used again
    assert json.loads(json.dumps(again)) == json.loads(json.dumps(once))
