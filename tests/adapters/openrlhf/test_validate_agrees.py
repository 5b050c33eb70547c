"""``rlstab validate --trainer openrlhf`` and the OpenRLHF adapter's start-up checks agree on every preset.

The adapter side is what runs before any rollout: the launcher's check in the driver
(``python -m rlstab.adapters.openrlhf --objective NAME ...``, which exits with status 2 and its
problems before OpenRLHF starts) and the ``RlstabPolicyLoss`` that OpenRLHF's actor builds when it
starts, with the ``--algo.advantage.is_correction_level`` it was given. A refused preset must be
refused with the very lines the command prints; an accepted one must start with the settings the
command names, and, where it names one, be refused without it.
"""

from __future__ import annotations

import logging
import subprocess
import sys

import pytest

import rlstab
from rlstab import ConfigError
from rlstab.adapters import trainers
from rlstab.adapters.openrlhf.config import CORRECTION_FLAG
from rlstab.adapters.openrlhf.loss import RlstabPolicyLoss
from rlstab.cli import main
from rlstab.compiler.plan import Plan

from openrlhf_gpu_stubs import subprocess_env

OPENRLHF_ARGS = ["--actor.model_name_or_path", "Qwen/Qwen3-8B-Base", "--reward.remote_url", "/r.py"]

CORRECTION = f"{CORRECTION_FLAG} token|seq"
NEUTRAL = "--algo.advantage.is_correction_mode clip --algo.advantage.is_correction_threshold 1 1"


def command(capsys, name: str) -> tuple[int, list[str], list[str]]:
    """The command's exit status, the problems it prints (without the source) and the settings it names."""
    code = main(["validate", "--trainer", "openrlhf", name])
    captured = capsys.readouterr()
    prefix = f"{name} (with OpenRLHF): "
    assert all(line.startswith(prefix) for line in captured.err.splitlines()), captured.err
    problems = [line[len(prefix):] for line in captured.err.splitlines()]
    needs = [line.split(" needs ", 1)[1].split(" (", 1)[0] for line in captured.out.splitlines() if " needs " in line]
    return code, problems, needs


def launch(tmp_path, name: str, *openrlhf_args: str) -> tuple[int, list[str]]:
    """``python -m rlstab.adapters.openrlhf --objective NAME ...`` where it refuses: its status and problem lines."""
    proc = subprocess.run([sys.executable, "-m", "rlstab.adapters.openrlhf", "--objective", name, *OPENRLHF_ARGS,
                           *openrlhf_args], env=subprocess_env(), cwd=tmp_path, capture_output=True, text=True,
                          timeout=120)
    return proc.returncode, [line.removeprefix("rlstab: ").removeprefix("--objective: ")
                             for line in proc.stderr.splitlines()]


def worker(name: str, level: str = "off", neutral: bool = False) -> list[str]:
    """The loss OpenRLHF's actor builds when it starts: [] when it builds, else its problem lines."""
    correction = {"is_correction_mode": "clip", "is_correction_threshold": (1.0, 1.0)} if neutral else {}
    try:
        RlstabPolicyLoss(objective=name, step_statistics="local", is_correction_level=level, **correction)
    except ConfigError as err:
        return err.problems
    return []


def twice_warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if "corrected twice" in r.getMessage()]


@pytest.mark.parametrize("name", rlstab.preset_names())
def test_the_command_and_the_start_up_checks_agree(capsys, caplog, name):
    caplog.set_level(logging.WARNING, logger="rlstab.adapters.openrlhf.loss")
    code, problems, needs = command(capsys, name)
    named = [line.split(" (", 1)[0] for line in trainers.settings(rlstab.load(name), "openrlhf")]
    assert needs == ([] if problems else named)  # an objective it refuses is answered with its problems only
    args = [CORRECTION_FLAG, "token"] if CORRECTION in named else []
    assert worker(name, "token" if args else "off", neutral=NEUTRAL in named) == problems, name
    assert twice_warnings(caplog) == []  # with the settings named, nothing is corrected twice
    assert code == (1 if problems else 0)
    if not problems and args:  # what the command names is needed: without it both checks refuse
        assert worker(name) != []
    if not problems and NEUTRAL in named:  # and without OpenRLHF's coefficient made 1, the loss warns
        worker(name, "token")
        assert len(twice_warnings(caplog)) == 1


def test_the_loss_warns_when_openrlhfs_coefficient_would_correct_tis_a_second_time(caplog):
    """Issue 38: tis under OpenRLHF's default correction (mode mask) is corrected twice; the warning says which flags."""
    caplog.set_level(logging.WARNING, logger="rlstab.adapters.openrlhf.loss")
    RlstabPolicyLoss(objective="tis", step_statistics="local", is_correction_level="token")
    assert twice_warnings(caplog) == [
        f"rlstab: {CORRECTION_FLAG} token with --algo.advantage.is_correction_mode mask and "
        f"--algo.advantage.is_correction_threshold 0.5 5: {trainers.openrlhf_double_correction(['reweighters[0] (tis)'])}"
        f"; set {NEUTRAL}"]


@pytest.mark.parametrize("name", ["vcpo", "skywork_entropy", "tis"])
def test_the_launcher_refuses_in_the_driver_what_the_command_refuses_or_needs(tmp_path, capsys, name):
    """Before Ray or OpenRLHF starts: the command's problem lines, or the setting it names when it is missing."""
    code, problems, needs = command(capsys, name)
    rc, lines = launch(tmp_path, name)
    assert rc == 2
    if problems:
        assert lines == problems
    else:
        assert needs == [CORRECTION, NEUTRAL]
        readers = ", ".join(Plan.of(rlstab.load(name)).readers("rollout_logprobs"))
        assert lines == [f"{readers} reads TokenBatch.rollout_logprobs: OpenRLHF records vLLM's log-probabilities "
                         f"only with {CORRECTION_FLAG} token|seq (its correction then applies too); {CORRECTION_FLAG} is off"]


def test_the_test_sees_both_outcomes(capsys):
    """Not vacuous: presets the adapter refuses and presets it runs, some of them only with a named setting."""
    outcomes = {name: command(capsys, name) for name in ("skywork_entropy", "grpo", "tis")}
    assert outcomes["skywork_entropy"][0] == 1 and outcomes["grpo"] == (0, [], []) and outcomes["tis"][2] == [CORRECTION, NEUTRAL]


def test_the_overridden_openrlhf_flags_warn_when_the_actor_builds_the_loss(caplog):
    """OpenRLHF's clip range, dual-clip and aggregation flags are not read: one warning names each that disagrees."""
    caplog.set_level(logging.WARNING, logger="rlstab.adapters.openrlhf.loss")
    RlstabPolicyLoss(clip_eps_low=0.1, clip_eps_high=0.3, dual_clip=5.0, token_level_loss=False,
                     objective="stapo", step_statistics="local")
    assert [r.getMessage() for r in caplog.records] == [
        "rlstab objective 'stapo' replaces OpenRLHF's policy loss; ignored: clip range 0.1/0.3 (the objective's is "
        "0.2/0.28); dual_clip=5.0 (the objective's is 10.0); loss_agg_mode seq-mean-token-mean (the objective "
        "aggregates with token-mean)"
    ]
    caplog.clear()
    RlstabPolicyLoss(clip_eps_low=0.2, clip_eps_high=0.28, dual_clip=10.0, objective="stapo", step_statistics="local")
    assert caplog.records == []  # OpenRLHF's flags at the objective's values: nothing is lost, nothing said
