"""``rlstab demo`` end to end at toy sizes: every preset runs, outputs are well formed, runs are
deterministic, and the warm start is cached and reused."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import rlstab
from rlstab.cli import main
from rlstab.trainer import models
from rlstab.trainer.tasks import get_task
from rlstab.trainer.warmstart import warm_start

# Toy sizes: a 2-step run is a fraction of a second once the warm start is cached.
WARMUP_STEPS = "6"
TOY = ["--steps", "2", "--prompts-per-step", "2", "--group-size", "4", "--micro-batch-size", "3",
       "--warmup-steps", WARMUP_STEPS, "--eval-size", "8", "--eval-every", "1", "--quiet"]

ROW_FIELDS = {"objective", "step", "reward", "accuracy", "entropy", "response_length", "grad_norm", "kept_fraction",
              "silenced", "silenced_fraction", "clip_high_fraction", "clip_low_fraction", "clip_dual_fraction",
              "masks", "loss"}


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    """One warm-start cache for the module, filled once."""
    path = tmp_path_factory.mktemp("cache")
    warm_start(get_task("add2"), seed=0, steps=int(WARMUP_STEPS), cache_dir=path)
    return path


def demo(out: Path, cache: Path, *extra: str) -> int:
    return main(["demo", *TOY, "--out", str(out), "--cache-dir", str(cache), *extra])


def rows(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("preset", rlstab.preset_names())
def test_two_step_demo_runs_for_every_preset(preset, tmp_path, cache_dir, capsys):
    assert demo(tmp_path, cache_dir, "--objective", preset) == 0
    got = rows(tmp_path)
    assert [r["step"] for r in got] == [0, 1, 2]
    assert all(r["objective"] == preset for r in got)
    for r in got[1:]:
        assert ROW_FIELDS <= set(r)
        assert 0.0 <= r["reward"] <= 1.0 and 0.0 <= r["accuracy"] <= 1.0
        assert r["grad_norm"] >= 0 and r["entropy"] >= 0 and r["response_length"] > 0
        assert 0.0 <= r["kept_fraction"] <= 1.0
        masks = rlstab.load(preset).compile().mask_labels
        assert set(r["masks"]) == set(masks)
    assert preset in capsys.readouterr().out  # the final table


def test_outputs_are_well_formed(tmp_path, cache_dir):
    assert demo(tmp_path, cache_dir) == 0  # the default objectives: grpo and stapo
    got = rows(tmp_path)
    assert [(r["objective"], r["step"]) for r in got] == [(o, s) for o in ("grpo", "stapo") for s in (0, 1, 2)]
    for r in got:
        if r["step"] == 0:
            assert set(r) == {"objective", "step", "accuracy"}
        else:
            assert ROW_FIELDS <= set(r)
            assert json.dumps(r)  # plain JSON values
    stapo = [r for r in got if r["objective"] == "stapo" and r["step"] > 0]
    assert all({"kept_fraction", "silenced"} == set(r["masks"]["s2t"]) for r in stapo)
    assert all(r["silenced"] == r["masks"]["s2t"]["silenced"] for r in stapo)

    png = (tmp_path / "curves.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000

    summary = (tmp_path / "summary.md").read_text()
    table = [line for line in summary.splitlines() if line.startswith("| ")]
    assert table[0].startswith("| objective | start acc | final acc")
    assert [line.split("|")[1].strip() for line in table[1:]] == ["grpo", "stapo"]
    assert all(len(line.split("|")) == len(table[0].split("|")) for line in table)
    assert "One seed: this shows what each objective does, not which trains better" in summary


def test_same_seed_same_metrics(tmp_path, cache_dir):
    a, b, c = tmp_path / "a", tmp_path / "b", tmp_path / "c"
    assert demo(a, cache_dir, "--seed", "0") == 0
    assert demo(b, cache_dir, "--seed", "0") == 0
    assert (a / "metrics.jsonl").read_bytes() == (b / "metrics.jsonl").read_bytes()
    # A different seed changes the run (another warm start, other prompts and samples).
    assert demo(c, cache_dir, "--seed", "1") == 0
    assert (a / "metrics.jsonl").read_bytes() != (c / "metrics.jsonl").read_bytes()


def test_objectives_start_from_the_same_policy_and_prompts(tmp_path, cache_dir):
    """The same objective twice gives the same rows: each gets a fresh copy and the same RNG streams."""
    assert demo(tmp_path, cache_dir, "--objective", "grpo", "--objective", "grpo") == 0
    got = rows(tmp_path)
    first = [dict(r, objective=None) for r in got if r["objective"] == "grpo#1"]
    second = [dict(r, objective=None) for r in got if r["objective"] == "grpo#2"]
    assert first == second and len(first) == 3


def test_warm_start_cache_is_reused(tmp_path, capsys):
    task = get_task("add2")
    first = warm_start(task, seed=0, steps=3, cache_dir=tmp_path)
    assert first.warm_start.cache_hit is False
    path = first.warm_start.path
    assert path.is_file() and path.is_relative_to(tmp_path)
    stamp = path.stat().st_mtime_ns
    second = warm_start(task, seed=0, steps=3, cache_dir=tmp_path)
    assert second.warm_start.cache_hit is True
    assert second.warm_start.path == path and path.stat().st_mtime_ns == stamp
    for a, b in zip(first.trainable_parameters(), second.trainable_parameters()):
        assert torch.equal(a, b)
    # The key covers the recipe: other steps or another seed train (and cache) anew.
    assert warm_start(task, seed=0, steps=4, cache_dir=tmp_path).warm_start.cache_hit is False
    assert warm_start(task, seed=1, steps=3, cache_dir=tmp_path).warm_start.cache_hit is False
    assert len(list((tmp_path / "warmstart").glob("*.pt"))) == 3
    # The command says so too.
    capsys.readouterr()
    argv = [a for a in TOY if a != "--quiet"]
    for flag, value in (("--warmup-steps", "3"), ("--steps", "1")):  # each flag once: a repeat is refused
        argv[argv.index(flag) + 1] = value
    main(["demo", *argv, "--out", str(tmp_path / "run"), "--cache-dir", str(tmp_path), "--objective", "grpo"])
    assert "warm start: loaded from cache" in capsys.readouterr().err
    assert path.stat().st_mtime_ns == stamp


def test_objective_from_a_yaml_file(tmp_path, cache_dir):
    path = tmp_path / "mine.yaml"
    path.write_text("extends: stapo\nname: my-stapo\nmasks:\n  - {kind: s2t, tau_p: 0.01}\n")
    assert demo(tmp_path / "out", cache_dir, "--objective", str(path)) == 0
    assert {r["objective"] for r in rows(tmp_path / "out")} == {"my-stapo"}


def test_progress_line_counts_the_silenced_tokens_so_far(tmp_path, cache_dir, capsys):
    # 20-entropy silences 80% of the valid tokens of every step. Each step's line shows the count so far and
    # the step's own; the last line's count so far is the summary table's "silenced tokens".
    toy = [flag for flag in TOY if flag != "--quiet"]
    assert main(["demo", *toy, "--out", str(tmp_path), "--cache-dir", str(cache_dir), "--objective", "20-entropy"]) == 0
    captured = capsys.readouterr()
    lines = [line for line in captured.err.splitlines() if line.startswith("[20-entropy]")]
    per_step = [int(r["silenced"]) for r in rows(tmp_path)[1:]]
    assert len(lines) == len(per_step) == 2 and sum(per_step) > 0
    for i, line in enumerate(lines):
        assert line.endswith(f"silenced {sum(per_step[:i + 1])} so far ({per_step[i]} this step)"), line
    table_row = next(line for line in captured.out.splitlines() if line.startswith("| 20-entropy |"))
    assert table_row.split("|")[7].strip() == str(sum(per_step))  # the summary's "silenced tokens"


def test_bad_objective_is_reported_before_training(tmp_path, cache_dir, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("extends: stapo\nmasks:\n  - {kind: s2t, tau_p: 1.5}\n")
    assert demo(tmp_path / "out", cache_dir, "--objective", str(bad)) == 2
    err = capsys.readouterr().err
    assert "masks[0].tau_p" in err and "Traceback" not in err
    assert not (tmp_path / "out" / "metrics.jsonl").exists()


def test_unknown_task_and_model(tmp_path, cache_dir, capsys):
    assert demo(tmp_path, cache_dir, "--task", "add9") == 2
    assert "add2" in capsys.readouterr().err
    assert demo(tmp_path, cache_dir, "--model", "gpt5") == 2
    assert "tiny" in capsys.readouterr().err


def test_smollm2_without_its_extra_is_a_clear_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "rlstab.trainer.smollm2", None)  # as if it could not be imported
    with pytest.raises(RuntimeError, match="smollm2.*not installed"):
        models.load_policy("smollm2", "add2", seed=0, cache_dir=None, progress=None)


def test_help_lists_the_flags():
    out = subprocess.run([sys.executable, "-m", "rlstab", "demo", "--help"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0
    for flag in ("--objective", "--steps", "--seed", "--group-size", "--task", "--out", "--model", "--cache-dir",
                 "--prompts-per-step", "--warmup-steps", "--eval-size", "--eval-every"):
        assert flag in out.stdout


def test_an_unknown_model_is_refused_before_any_folder(tmp_path, monkeypatch, capsys):
    """Issue 38: ``rlstab demo --model gpt5`` left an empty ``runs/demo`` behind."""
    monkeypatch.chdir(tmp_path)
    assert main(["demo", "--model", "gpt5"]) == 2
    assert capsys.readouterr().err == "rlstab demo: unknown model 'gpt5'; choose one of tiny, smollm2\n"
    assert list(tmp_path.iterdir()) == []


def test_a_model_that_cannot_load_leaves_no_folder(tmp_path, monkeypatch, capsys):
    """The output folder is created once the model is loaded: smollm2 without its extra leaves nothing behind."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setitem(sys.modules, "rlstab.trainer.smollm2", None)  # as if it could not be imported
    assert main(["demo", "--model", "smollm2", "--task", "add1", "--quiet"]) == 2
    assert "--model smollm2 needs the smollm2 extra, which is not installed" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_the_model_names_are_the_trainers():
    from rlstab.command_line import MODEL_NAMES

    assert MODEL_NAMES == models.MODEL_NAMES  # the command's copy: the trainer's module imports torch
