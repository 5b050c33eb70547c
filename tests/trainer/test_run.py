"""``Run``: a run restored from its state takes the steps of one never interrupted; the demo and the lab drive the same run."""

import io
import json

import pytest
import torch

from rlstab.cli import main
from rlstab.lab.regimes import load_regime
from rlstab.lab.run import execute
from rlstab.lab.spec import RunSpec
from rlstab.loading import load
from rlstab.trainer.run import STATE_KEYS, Run

from quick_regimes import QUICK, QUICK_LAG, without_time


def quick_run(objective, regime, cache, steps=4, seed=0) -> Run:
    config = load_regime(regime).train_config(steps=steps, seed=seed)
    return Run(load(objective), config, "add2", cache_dir=cache)


@pytest.mark.parametrize(("objective", "regime"), [("four_layers", QUICK_LAG), ("stare", QUICK)])
def test_a_run_restored_from_its_state_takes_the_same_steps(cache, objective, regime):
    whole = quick_run(objective, regime, cache)
    rows = [whole.start()] + [whole.step().row for _ in range(4)]

    first = quick_run(objective, regime, cache)
    first.start()
    first.step()
    first.step()
    saved = io.BytesIO()
    torch.save(first.state_dict(), saved)  # what a checkpoint holds, through torch's safe loader
    saved.seek(0)
    state = torch.load(saved, weights_only=True)
    assert set(state) == STATE_KEYS and state["step"] == 2

    restored = quick_run(objective, regime, cache)  # a fresh process would build it the same way
    restored.load_state_dict(state)
    later = []
    while not restored.done:
        later.append(restored.step().row)
    assert [r["step"] for r in later] == [3, 4]
    assert later == rows[3:]


def test_a_state_without_the_runs_keys_is_refused(cache):
    run = quick_run("grpo", QUICK, cache, steps=1)
    state = run.state_dict()
    del state["layers"]
    with pytest.raises(KeyError, match=r"not a Run's state: it lacks \['layers'\]"):
        run.load_state_dict(state)


def test_a_finished_run_takes_no_more_steps(cache):
    run = quick_run("grpo", QUICK, cache, steps=1)
    run.step()
    assert run.done
    with pytest.raises(RuntimeError, match="has taken its 1 steps"):
        run.step()


def test_the_demo_and_the_lab_write_the_same_rows(tmp_path, cache, capsys):
    """The same objective, seed and settings: the demo's rows are the lab's, less ess_fraction and time."""
    pytest.importorskip("matplotlib", reason="the demo draws curves.png: the demo extra")
    flags = ["--prompts-per-step", "4", "--group-size", "8", "--eval-size", "16", "--eval-every", "2",
             "--warmup-steps", "100", "--steps", "3", "--cache-dir", str(cache), "--quiet"]
    assert main(["demo", "--objective", "stapo", *flags, "--out", str(tmp_path / "demo")]) == 0
    capsys.readouterr()
    demo_rows = [json.loads(line) for line in (tmp_path / "demo" / "metrics.jsonl").read_text().splitlines()]

    objective = load("stapo")
    spec = RunSpec("stapo", objective.to_yaml(), objective.fingerprint(), load_regime(QUICK), "add2", "tiny", 0, 3)
    lab_rows = execute(spec, tmp_path / "lab", cache_dir=cache)["rows"]
    assert all("ess_fraction" in row for row in lab_rows[1:])
    assert [{k: v for k, v in row.items() if k != "ess_fraction"} for row in without_time(lab_rows)] == demo_rows


def test_the_demo_names_a_flag_out_of_the_trainers_range(tmp_path, capsys):
    assert main(["demo", "--group-size", "1", "--steps", "1", "--out", str(tmp_path)]) == 2
    assert capsys.readouterr().err == "rlstab demo: --group-size 1: must be an integer from 2 to 256\n"
