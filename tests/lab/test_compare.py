"""The grid: same per-run metrics whatever the worker count, reruns skip, every bad input is one line up front."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rlstab.errors import ConfigError
from rlstab.lab import LabError, compare
from rlstab.lab.checkpoint import read_rows

from quick_regimes import QUICK_LAG, without_time

GRID = {"seeds": 2, "steps": 3, "regimes": [QUICK_LAG], "checkpoint_every": 2, "progress": False}


def per_run_rows(out: Path, data: dict) -> dict:
    return {r["folder"]: without_time(read_rows(out / r["folder"])) for r in data["runs"]}


def comparable(data: dict) -> dict:
    """results.json without what is measured (wall times), for identity checks."""
    text = json.dumps({k: v for k, v in data.items() if k != "command"})
    data = json.loads(text)
    for run in data["runs"]:
        run["summary"].pop("wall_time")
    for regime in data["aggregates"].values():
        for metrics in regime.values():
            metrics.pop("wall_time")
    return data


@pytest.fixture(scope="module")
def serial(tmp_path_factory):
    out = tmp_path_factory.mktemp("serial")
    cache = tmp_path_factory.getbasetemp() / "lab-warmstart-cache"
    data = compare(["grpo", "tis"], out=out, workers=1, cache_dir=cache, **GRID)
    return out, data, cache


def test_outputs_and_their_shape(serial):
    out, data, _ = serial
    for name in ("results.json", "steps.json", "report.md", "curves.png", "differences.png"):
        assert (out / name).stat().st_size > 0
    assert json.loads((out / "results.json").read_text()) == data
    assert [(r["objective"], r["seed"]) for r in data["runs"]] == [("grpo", 0), ("grpo", 1), ("tis", 0), ("tis", 1)]
    assert all(len(read_rows(out / r["folder"])) == 4 for r in data["runs"])  # step 0 and 3 steps
    tis = data["paired"]["quick-lag"]["tis"]["final_accuracy"]
    assert tis["n"] == 2 and tis["wins"] + tis["ties"] + tis["losses"] == 2
    assert {"p", "p_holm", "mde", "sd", "n_effective", "mde_uncorrected", "family", "m"} <= set(tis)
    assert data["settings"]["pairs"] == {"tis": "grpo"} and "protocol" not in data["settings"]
    # tis and grpo differ on every seed (their per-step rows were compared): 4 metrics x 1 pair, one family
    assert data["no_ops"] == {"compared": "per-step rows", "seeds": {"quick-lag": {"tis": []}}}
    assert tis["n_effective"] == 2 and tis["family"] == "all" and tis["m"] == 4
    report = (out / "report.md").read_text()
    assert "## Regime `quick-lag`" in report and "| tis | grpo | acc AUC |" in report and "Paired by seed" in report
    assert ("| objective | baseline | metric | difference [95% interval] | W/T/L | n eff | p | Holm p | "
            "MDE (Holm, m = 4) |") in report
    # the per-step rows of every run are stored with the grid
    steps = json.loads((out / "steps.json").read_text())
    assert [(r["objective"], r["seed"]) for r in steps["runs"]] == [(r["objective"], r["seed"]) for r in data["runs"]]
    assert steps["runs"][0]["rows"] == read_rows(out / data["runs"][0]["folder"])


def test_two_workers_give_the_same_runs_as_one(serial, tmp_path):
    out, data, cache = serial
    parallel = compare(["grpo", "tis"], out=tmp_path, workers=2, cache_dir=cache, **GRID)
    assert per_run_rows(tmp_path, parallel) == per_run_rows(out, data)
    assert comparable(parallel) == comparable(data)


def test_a_rerun_trains_nothing_and_gives_identical_results(serial, monkeypatch):
    out, data, cache = serial
    import rlstab.lab.run as run

    monkeypatch.setattr(run, "_train", lambda *a, **k: pytest.fail("a finished run was retrained"))
    again = compare(["grpo", "tis"], out=out, workers=2, cache_dir=cache, **GRID)
    assert again == data


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"objectives": ["grpo", "nope"]}, ConfigError, "nope: not a preset"),
        ({"regimes": ["nope"]}, ConfigError, "nope: not a regime name or a .yaml file"),
        ({"regimes": [{"name": "x", "lr": -1}]}, ConfigError, "<regime dict>: lr = -1: Input should be greater than 0"),
        ({"regimes": [{"name": "x", "task": "add9"}]}, LabError, "regime x: unknown task 'add9'"),
        ({"baseline": "ppo"}, LabError, "baseline 'ppo' is not one of the objectives (grpo, tis)"),
        ({"model": "gpt5"}, LabError, "model 'gpt5': one of tiny, smollm2"),
        ({"seeds": 0}, LabError, "seeds = 0"),
        ({"steps": 4}, LabError, "holds a run with another steps (3, now 4); use another --out or delete that folder"),
        ({"objectives": ["grpo", "stapo"], "regimes": [{**QUICK_LAG, "lr": 1e-4}]}, LabError, "another regime"),
    ],
)
def test_bad_inputs_fail_before_anything_trains(serial, monkeypatch, kwargs, error, message):
    out, _, cache = serial
    import rlstab.lab.run as run

    monkeypatch.setattr(run, "_train", lambda *a, **k: pytest.fail("trained before checking its inputs"))
    args = {**GRID, "cache_dir": cache, "objectives": ["grpo", "tis"], **kwargs}
    with pytest.raises(error) as err:
        compare(args.pop("objectives"), out=out, **args)
    assert message in str(err.value)
    assert len(str(err.value).splitlines()) == 1


def test_a_protocol_decides_the_families_and_a_misfit_writes_nothing(serial, tmp_path, monkeypatch):
    import shutil

    import rlstab.lab.run as run
    from rlstab.lab.protocol import Protocol

    out, data, cache = serial
    shutil.copytree(out, tmp_path / "out")
    monkeypatch.setattr(run, "_train", lambda *a, **k: pytest.fail("a finished run was retrained"))
    results = tmp_path / "out" / "results.json"
    # a primary metric no run measured (pass@k without pass_k): one line, and results.json is left as it was
    with pytest.raises(LabError, match=r"^protocol primary\[0\] = 'final_pass_at_k': no run measured it$"):
        compare(["grpo", "tis"], out=tmp_path / "out", workers=1, cache_dir=cache, protocol=Protocol(primary=["final_pass_at_k"]),
                **GRID)
    assert json.loads(results.read_text()) == data
    again = compare(["grpo", "tis"], out=tmp_path / "out", workers=1, cache_dir=cache,
                    protocol=Protocol(baseline="grpo", primary=["accuracy_auc"]), **GRID)
    assert again["settings"]["protocol"]["primary"] == ["accuracy_auc"]
    tis = again["paired"]["quick-lag"]["tis"]
    assert (tis["accuracy_auc"]["family"], tis["accuracy_auc"]["m"], tis["final_accuracy"]["m"]) == ("primary", 1, 3)
    assert tis["accuracy_auc"]["p"] == data["paired"]["quick-lag"]["tis"]["accuracy_auc"]["p"]  # only Holm's family moved
    report = (tmp_path / "out" / "report.md").read_text()
    assert "Primary comparisons: Holm's family of the protocol's primary metrics, m = 1 over the report:" in report


def _damage_summary(run: Path) -> Path:
    (run / "summary.json").write_text('{"final_accuracy": 0.5')  # cut short
    return run / "summary.json"


def _damage_metrics(run: Path) -> Path:
    with open(run / "metrics.jsonl", "a") as f:
        f.write("[1, 2]\n")  # JSON, but not a row
    return run / "metrics.jsonl"


def _damage_checkpoint(run: Path) -> Path:
    (run / "summary.json").unlink()  # an unfinished run ...
    (run / "checkpoint.pt").write_bytes(b"\x80\x04not a checkpoint")  # ... whose checkpoint is garbage
    return run / "checkpoint.pt"


def _foreign_checkpoint(run: Path) -> Path:
    import torch

    (run / "summary.json").unlink()
    torch.save({"step": 2}, run / "checkpoint.pt")  # loadable, but not the lab's
    return run / "checkpoint.pt"


@pytest.mark.parametrize("damage", [_damage_summary, _damage_metrics, _damage_checkpoint, _foreign_checkpoint])
def test_a_damaged_run_folder_is_one_line_before_anything_trains(serial, tmp_path, monkeypatch, damage):
    import shutil

    import rlstab.lab.run as run

    out, data, cache = serial
    shutil.copytree(out, tmp_path / "out")
    path = damage(tmp_path / "out" / data["runs"][1]["folder"])
    monkeypatch.setattr(run, "_train", lambda *a, **k: pytest.fail("trained before checking the run folders"))
    with pytest.raises(LabError) as err:
        compare(["grpo", "tis"], out=tmp_path / "out", workers=1, cache_dir=cache, **GRID)
    message = str(err.value)
    assert message.startswith(f"{path} is unreadable (") and message.endswith("to rerun that run")
    assert len(message.splitlines()) == 1


def _cli(out: Path, cache: Path, *extra: str) -> list[str]:
    regime = out.parent / "quick-lag.yaml"
    regime.write_text(json.dumps(QUICK_LAG))  # JSON is YAML
    return [sys.executable, "-m", "rlstab", "compare", "--objective", "grpo", "--objective", "bapo", "--seeds", "2",
            "--steps", "6", "--regime", str(regime), "--checkpoint-every", "2", "--cache-dir", str(cache),
            "--out", str(out), "--quiet", *extra]


@pytest.mark.parametrize("workers", ["1", "2"])
def test_sigkill_in_the_middle_then_rerun_equals_an_uninterrupted_grid(tmp_path, cache, workers):
    whole, cut = tmp_path / "whole" / "out", tmp_path / "cut" / "out"
    for folder in (whole, cut):
        folder.parent.mkdir()
    subprocess.run(_cli(whole, cache, "--workers", workers), check=True, capture_output=True, timeout=600)

    process = subprocess.Popen(_cli(cut, cache, "--workers", workers), start_new_session=True,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    first = cut / "runs" / "quick-lag" / "grpo" / "seed0"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:  # past the first checkpoint (step 2), before the run ends (step 6)
        if (first / "metrics.jsonl").exists() and len(read_rows(first)) >= 4:
            break
        assert process.poll() is None, "the grid ended before it could be killed"
        time.sleep(0.05)
    os.killpg(process.pid, signal.SIGKILL)
    process.wait()
    assert not (first / "summary.json").exists(), "killed too late to test a resume"
    assert (first / "checkpoint.pt").exists()

    subprocess.run(_cli(cut, cache, "--workers", workers), check=True, capture_output=True, timeout=600)
    a = json.loads((whole / "results.json").read_text())
    b = json.loads((cut / "results.json").read_text())
    assert per_run_rows(cut, b) == per_run_rows(whole, a)
    assert comparable(b) == comparable(a)


def test_the_cli_prints_one_line_for_a_bad_input(tmp_path, cache):
    result = subprocess.run(
        [sys.executable, "-m", "rlstab", "compare", "--objective", "grpo", "--regime", "policy_lag", "--out", str(tmp_path)],
        capture_output=True, text=True, timeout=120,
    )
    assert result.returncode == 2
    assert result.stderr == "policy_lag: not a regime name or a .yaml file (did you mean 'policy-lag'?)\n"
    assert not any(tmp_path.iterdir())


def test_the_plan_of_a_grid_is_a_grid_plan(tmp_path):
    """``plan`` returns a GridPlan: one (RunSpec, folder) per regime x objective x seed, nothing trained."""
    from rlstab.lab.compare import GridPlan, plan

    p = plan(["grpo", "stapo"], out=tmp_path, seeds=3, steps=2)
    assert type(p) is GridPlan
    assert (p.labels, p.baseline, p.seeds) == (["grpo", "stapo"], "grpo", [0, 1, 2])
    assert len(p.jobs) == 6  # 1 regime x 2 objectives x 3 seeds
    assert list(tmp_path.iterdir()) == []  # planning writes nothing
