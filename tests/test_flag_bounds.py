"""Every number flag of ``rlstab demo``, ``audit`` and ``compare`` is checked like a YAML field.

Each flag is fed NaN, inf, a negative, zero, 1e20 and a non-number, in process, and gives one line
naming the flag, the text and what is allowed, exit status 2, before any work; or, where the value is
allowed (a seed of 0, no warm-up steps), the help says so and the value passes. The ranges are the
pydantic fields the trainer's config and the lab's regimes use, so a regime file refuses the same values.
"""

from __future__ import annotations

import importlib
import math

import pytest

import rlstab.trainer.models as models
from rlstab.cli import build_parser, main
from rlstab.errors import ConfigError, count_phrase
from rlstab.lab import LabError, load_regime, plan
from rlstab.lab.compare import MAX_RUNS, InputErrors
from rlstab.number_flags import check_numbers
from rlstab.trainer.config import TrainConfig

lab_compare = importlib.import_module("rlstab.lab.compare")  # the module: ``rlstab.lab.compare`` is also its function

# What each number flag allows, as its error line and its help say it (hand-written: the bounds are pinned here).
ALLOWED = {
    "demo": {
        "--steps": "an integer from 1 to 100,000",
        "--seed": "an integer from 0 to 999,999",
        "--group-size": "an integer from 2 to 256",
        "--prompts-per-step": "an integer from 1 to 1,024",
        "--micro-batch-size": "an integer from 1 to 4,096",
        "--updates-per-step": "an integer from 1 to 64",
        "--lr": "a finite number above 0, at most 1",
        "--temperature": "a finite number above 0, at most 10",
        "--max-grad-norm": "a finite number above 0, at most 1,000,000,000",
        "--warmup-steps": "an integer from 0 to 100,000",
        "--eval-size": "an integer from 1 to 4,096",
        "--eval-every": "an integer from 1 to 100,000",
        "--threads": "an integer from 1 to 1,024",
    },
    "audit": {
        "--prompts": "an integer from 1 to 65,536",
        "--group-size": "an integer from 2 to 256",
        "--seed": "an integer from 0 to 999,999",
        "--temperature": "a finite number above 0, at most 10",
        "--top-k": "an integer from 1 to 1,000",
        "--warmup-steps": "an integer from 0 to 100,000",
        "--threads": "an integer from 1 to 1,024",
        "--null-draws": "an integer from 50 to 10,000",
        "--held-out": "an integer from 1 to 4,096",
        "--lr": "a finite number above 0, at most 1",
    },
    "compare": {
        "--seeds": "an integer from 1 to 10,000",
        "--steps": "an integer from 1 to 100,000",
        "--workers": "an integer from 1 to 1,024",
        "--checkpoint-every": "an integer from 1 to 100,000",
    },
}
# The flags that are not numbers (names, files, switches): every other flag must be a checked number.
NOT_NUMBERS = {
    "demo": {"--help", "--objective", "--task", "--model", "--out", "--cache-dir", "--quiet"},
    "audit": {"--help", "--objective", "--model", "--task", "--out", "--cache-dir", "--mechanism", "--quiet",
              "--counterfactual", "--from", "--states"},
    "compare": {"--help", "--objective", "--baseline", "--pair", "--protocol", "--regime", "--task", "--model",
                "--ray-address", "--cache-dir", "--out", "--quiet", "--keep-checkpoints"},
}
REQUIRED = {"demo": [], "audit": [], "compare": ["--objective", "grpo"]}
# Flags that apply with another only: given with it, so that their number's error is the only problem.
WITH = {("audit", flag): ["--counterfactual"] for flag in ("--null-draws", "--held-out", "--lr")}
HOSTILE = ["nan", "inf", "-1", "0", "1e20", "ten"]
VALID = {("demo", "--seed", "0"), ("demo", "--warmup-steps", "0"), ("audit", "--seed", "0"), ("audit", "--warmup-steps", "0")}
"""The hostile values that a flag allows: a seed of 0, and no supervised warm-up."""


def subparser(command: str):
    actions = build_parser()._subparsers._group_actions[0]
    return actions.choices[command]


@pytest.fixture
def no_work(monkeypatch):
    """Loading a model or running a grid fails the test: the flags are checked before any work."""
    monkeypatch.setattr(models, "load_policy", lambda *a, **k: pytest.fail("loaded a model before checking the flags"))
    monkeypatch.setattr(lab_compare, "compare", lambda *a, **k: pytest.fail("ran the grid before checking the flags"))


@pytest.mark.parametrize("command", sorted(ALLOWED))
def test_every_flag_is_a_checked_number_or_not_a_number(command):
    flags = {flag for action in subparser(command)._actions for flag in action.option_strings if flag.startswith("--")}
    assert flags == set(ALLOWED[command]) | NOT_NUMBERS[command]
    assert set(subparser(command).get_default("_number_flags")) == {f[2:].replace("-", "_") for f in ALLOWED[command]}


@pytest.mark.parametrize("command", sorted(ALLOWED))
def test_each_flags_help_states_its_range(command):
    text = " ".join(subparser(command).format_help().split())
    for flag, allowed in ALLOWED[command].items():
        assert f"{flag} {'X' if 'number' in allowed else 'N'} " in text
        assert allowed in text, flag


CASES = [(command, flag, value) for command in sorted(ALLOWED) for flag in ALLOWED[command] for value in HOSTILE]


@pytest.mark.parametrize(("command", "flag", "value"), CASES, ids=[" ".join(c) for c in CASES])
def test_a_hostile_number_is_one_line_and_status_2(command, flag, value, tmp_path, capsys, no_work):
    out = tmp_path / "out"
    argv = [command, *REQUIRED[command], *WITH.get((command, flag), []), f"{flag}={value}", "--out", str(out)]
    if (command, flag, value) in VALID:
        args = build_parser().parse_args(argv)
        assert check_numbers(args, f"rlstab {command}")
        assert getattr(args, flag[2:].replace("-", "_")) == 0
        assert "from 0 to" in ALLOWED[command][flag]  # documented in the help (test above)
        return
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == f"rlstab {command}: {flag} {value}: must be {ALLOWED[command][flag]}\n"
    assert not out.exists()


def test_every_bad_flag_is_one_line_each_in_one_go(tmp_path, capsys, no_work):
    argv = ["demo", "--lr", "nan", "--group-size", "1", "--seed", "99999999999999999999", "--threads", "1.5",
            "--max-grad-norm", "inf", "--out", str(tmp_path / "out")]
    assert main(argv) == 2
    assert capsys.readouterr().err.splitlines() == [  # in the order of the command's flags
        "rlstab demo: --seed 99999999999999999999: must be an integer from 0 to 999,999",
        "rlstab demo: --group-size 1: must be an integer from 2 to 256",
        "rlstab demo: --lr nan: must be a finite number above 0, at most 1",
        "rlstab demo: --max-grad-norm inf: must be a finite number above 0, at most 1,000,000,000",
        "rlstab demo: --threads 1.5: must be an integer from 1 to 1,024",
    ]


def test_bad_flags_and_bad_inputs_are_all_reported(tmp_path, capsys, no_work):
    assert main(["demo", "--objective", "nope", "--task", "add9", "--steps", "0", "--out", str(tmp_path)]) == 2
    assert capsys.readouterr().err.splitlines() == [
        "rlstab demo: --steps 0: must be an integer from 1 to 100,000",
        "nope: not a preset (`rlstab presets` lists them), a .yaml file, or YAML text",
        "rlstab demo: unknown task 'add9'; choose one of add2, add3, mul2, add1, perm3, perm3-echo",
    ]
    assert main(["compare", "--objective", "grpo", "--workers", "1e20", "--seeds", "99999999999999999999",
                 "--regime", "policy_lag", "--model", "gpt5", "--out", str(tmp_path / "out")]) == 2
    assert capsys.readouterr().err.splitlines() == [
        "rlstab compare: --seeds 99999999999999999999: must be an integer from 1 to 10,000",
        "rlstab compare: --workers 1e20: must be an integer from 1 to 1,024",
        "policy_lag: not a regime name or a .yaml file (did you mean 'policy-lag'?)",
        "rlstab compare: model 'gpt5': one of tiny, smollm2",
    ]
    assert not (tmp_path / "out").exists()


def test_a_text_that_is_not_printable_stays_on_one_line(tmp_path, capsys, no_work):
    assert main(["audit", "--top-k", "3\n4", "--out", str(tmp_path)]) == 2
    assert capsys.readouterr().err == "rlstab audit: --top-k '3\\n4': must be an integer from 1 to 1,000\n"


def test_flags_and_regime_files_share_one_definition():
    """The trainer's fields refuse what the flags refuse, so a regime file does too."""
    for field, value in [("lr", math.nan), ("temperature", math.inf), ("max_grad_norm", 1e20), ("group_size", 1),
                         ("steps", 10**20), ("seed", -1)]:
        with pytest.raises(ValueError):
            TrainConfig(**{field: value})
    for field, value in [("lr", math.nan), ("max_grad_norm", math.inf), ("eval_every", 10**20)]:
        with pytest.raises(ConfigError, match=f"^<regime dict>: {field} = "):
            load_regime({"name": "x", field: value})


def test_a_grid_above_the_limit_is_refused_before_planning(tmp_path):
    assert MAX_RUNS == 10_000
    with pytest.raises(LabError) as err:
        plan(["grpo", "stapo"], out=tmp_path, seeds=MAX_RUNS, steps=3)
    assert str(err.value) == ("2 objectives x 1 regime x 10,000 seeds = 20,000 runs: at most 10,000 in one grid; "
                              "split it over several --out folders")
    with pytest.raises(LabError, match=r"^seeds = 100000000000000000000: a count from 1 to 10,000$"):
        plan(["grpo"], out=tmp_path, seeds=10**20, steps=3)
    with pytest.raises(LabError, match=r"^workers = 1e\+20: an integer of at least 1$"):
        lab_compare.compare(["grpo"], out=tmp_path, seeds=1, steps=3, workers=1e20)
    assert not any(tmp_path.iterdir())


def test_a_large_grid_says_it_is_planning(tmp_path):
    lines = []
    p = plan(["grpo"], out=tmp_path, seeds=1000, steps=3, log=lines.append)
    assert len(p.jobs) == 1000
    assert lines == [f"[compare] planning 1,000 runs: checking their folders under {tmp_path}"]
    plan(["grpo"], out=tmp_path, seeds=999, steps=3, log=lines.append)
    assert len(lines) == 1  # a small grid plans quietly


def test_several_bad_inputs_of_plan_are_raised_together(tmp_path):
    with pytest.raises(InputErrors) as err:
        plan(["grpo", "nope"], out=tmp_path, seeds=0, steps=0, model="gpt5")
    assert [type(e) for e in err.value.errors] == [LabError, LabError, ConfigError, LabError]
    assert str(err.value).splitlines() == [
        "steps = 0: an integer from 1 to 100,000",
        "seeds = 0: a count from 1 to 10,000",
        "nope: not a preset (`rlstab presets` lists them), a .yaml file, or YAML text",
        "model 'gpt5': one of tiny, smollm2",
    ]


@pytest.mark.parametrize("command", ["demo", "audit", "compare"])
def test_the_help_shows_percent_signs_once(command):
    text = subparser(command).format_help()
    assert "%%" not in text and "invalid" not in text
    if command == "compare":
        assert "95% intervals" in text


def test_counts_are_pluralised(tmp_path, monkeypatch, capsys):
    assert [count_phrase(1, "seed"), count_phrase(2, "seed"), count_phrase(0, "run")] == ["1 seed", "2 seeds", "0 runs"]
    monkeypatch.setattr(lab_compare, "compare", lambda *a, **k: {"runs": [{}], "settings": {"pairs": {}}})
    assert main(["compare", "--objective", "grpo", "--seeds", "1", "--out", "o"]) == 0
    assert capsys.readouterr().out.startswith("1 run; wrote o/results.json")


def test_run_folders_with_one_problem_are_one_line(tmp_path):
    from rlstab.lab.spec import write_spec

    first = plan(["grpo"], out=tmp_path, seeds=3, steps=3)
    for spec, folder in first.jobs:
        folder.mkdir(parents=True)
        write_spec(spec, folder)
    with pytest.raises(LabError) as err:
        plan(["grpo"], out=tmp_path, seeds=3, steps=4)
    assert str(err.value) == (f"{first.jobs[0][1]} holds a run with another steps (3, now 4); use another --out or "
                              "delete that folder (and 2 more run folders with a problem)")


def test_the_limits_are_the_fields_bounds():
    from rlstab.trainer.config import MAX_SEED, MAX_STEPS

    def le(field):
        return next(m.le for m in TrainConfig.model_fields[field].metadata if hasattr(m, "le"))

    assert (MAX_STEPS, MAX_SEED) == (le("steps"), le("seed")) == (le("eval_every"), 999_999)
