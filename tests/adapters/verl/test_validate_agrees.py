"""``rlstab validate --trainer verl`` and the veRL adapter's start-up check agree on every preset.

The adapter side is what veRL's driver runs before any worker starts: the actor section composed
from veRL's own ``ppo_trainer.yaml`` with the documented overrides, converted as ``validate_config``
converts it (``RlstabPolicyLossConfig`` loads and checks the objective; ``check_actor`` checks the
actor around it). A refused preset must be refused with the very lines the command prints; an
accepted one must start once the settings the command names are made, and not before.
"""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path

import pytest
import verl
from hydra import compose, initialize_config_dir
from verl.utils.config import omega_conf_to_dataclass

import rlstab
from rlstab.adapters import trainers
from rlstab.cli import main

CONFIG_DIR = str(Path(verl.__file__).parent / "trainer" / "config")
ACTOR = "actor_rollout_ref.actor"

SETTINGS = {"actor_rollout_ref.actor.calculate_entropy=True": f"{ACTOR}.calculate_entropy=True"}


def actor(*overrides):
    """The actor section as veRL's driver converts it in ``validate_config`` (as in test_config.py)."""
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base=None):
        config = compose("ppo_trainer", overrides=[f"{ACTOR}.ppo_micro_batch_size_per_gpu=2", *overrides])
    return omega_conf_to_dataclass(config.actor_rollout_ref.actor)


def select(name: str) -> list[str]:
    return [
        f"{ACTOR}.policy_loss._target_=rlstab.adapters.verl.RlstabPolicyLossConfig",
        f"{ACTOR}.policy_loss.loss_mode=rlstab",
        f"+{ACTOR}.policy_loss.objective={name}",
    ]


def command(capsys, name: str) -> tuple[int, list[str], list[str]]:
    """The command's exit status, the problems it prints (without the source) and the settings it names."""
    code = main(["validate", "--trainer", "verl", name])
    captured = capsys.readouterr()
    prefix = f"{name} (with veRL): "
    assert all(line.startswith(prefix) for line in captured.err.splitlines()), captured.err
    problems = [line[len(prefix):] for line in captured.err.splitlines()]
    needs = [line.split(" needs ", 1)[1].split(" (", 1)[0] for line in captured.out.splitlines() if " needs " in line]
    return code, problems, needs


def start_up(*overrides: str) -> list[str]:
    """The adapter's start-up check on the composed actor section: [] when it builds, else its problem lines."""
    try:
        actor(*overrides)
    except Exception as err:  # noqa: BLE001 - Hydra wraps the ConfigError; its lines are in the message
        cause = err
        while cause.__cause__ is not None or cause.__context__ is not None:
            if isinstance(cause, rlstab.ConfigError):
                break
            cause = cause.__cause__ or cause.__context__
        if isinstance(cause, rlstab.ConfigError):
            return cause.problems
        return [str(err).splitlines()[-1] or str(err)]
    return []


@pytest.mark.parametrize("name", rlstab.preset_names())
def test_the_command_and_the_start_up_check_agree(capsys, name):
    code, problems, needs = command(capsys, name)
    named = [line.split(" (", 1)[0] for line in trainers.settings(rlstab.load(name), "verl")]
    assert needs == ([] if problems else named)  # an objective it refuses is answered with its problems only
    settings = [SETTINGS[need] for need in named if need in SETTINGS]
    adapter = start_up(*select(name), *settings)
    assert adapter == problems, name
    assert code == (1 if problems else 0)
    if not problems and settings:  # what the command names is needed: without it the start-up check refuses
        assert start_up(*select(name)) != []


def test_the_test_sees_both_outcomes(capsys):
    """Not vacuous: presets the adapter refuses and presets it runs, some of them only with a named setting."""
    outcomes = {name: command(capsys, name) for name in ("tis", "grpo", "stapo")}
    assert outcomes["tis"][0] == 1 and outcomes["grpo"] == (0, [], []) and outcomes["stapo"][2]


def test_the_overridden_clip_flags_warn_one_line_each(caplog):
    caplog.set_level(logging.WARNING, logger="rlstab.adapters.verl.config")
    actor(*select("stapo"), f"{ACTOR}.calculate_entropy=True", f"{ACTOR}.clip_ratio_low=0.1",
          f"{ACTOR}.clip_ratio_high=0.3", f"{ACTOR}.clip_ratio_c=10.0", f"{ACTOR}.clip_ratio=0.25")
    lines = [r.getMessage() for r in caplog.records]
    assert f"rlstab: {ACTOR}.clip_ratio_low = 0.1 is not used under loss_mode=rlstab: the objective has " \
           "surrogate.eps_low = 0.2; change it in the objective" in lines
    assert f"rlstab: {ACTOR}.clip_ratio_high = 0.3 is not used under loss_mode=rlstab: the objective has " \
           "surrogate.eps_high = 0.28; change it in the objective" in lines
    assert f"rlstab: {ACTOR}.clip_ratio = 0.25 is not used under loss_mode=rlstab: the objective's surrogate " \
           "(ppo_clip) decides the policy loss" in lines
    assert not any("clip_ratio_c" in line for line in lines)  # 10.0 is stapo's dual_clip: nothing is lost


def test_a_flag_at_veRLs_default_or_at_the_objectives_value_is_silent(caplog):
    caplog.set_level(logging.WARNING, logger="rlstab.adapters.verl.config")
    actor(*select("grpo"), f"{ACTOR}.clip_ratio_c=3.0", f"{ACTOR}.clip_ratio_high=0.2")
    assert [r.getMessage() for r in caplog.records if "is not used" in r.getMessage()] == []


TERMS = "its entropy bonus (entropy_coeff), its KL loss (use_kl_loss) and its actor/entropy metric"


def test_the_other_loss_modes_flags_and_loss_agg_mode_warn(caplog):
    caplog.set_level(logging.WARNING, logger="rlstab.adapters.verl.config")
    actor(*select("grpo"), f"{ACTOR}.tau_pos=2.0", f"{ACTOR}.policy_loss.clip_cov_ratio=0.01",
          f"{ACTOR}.loss_agg_mode=seq-mean-token-mean")
    lines = [r.getMessage() for r in caplog.records]
    assert f"rlstab: {ACTOR}.tau_pos = 2.0 is not used under loss_mode=rlstab: the objective's surrogate " \
           "(ppo_clip) decides the policy loss" in lines
    assert f"rlstab: {ACTOR}.policy_loss.clip_cov_ratio = 0.01 is not used under loss_mode=rlstab: the objective's " \
           "surrogate (ppo_clip) decides the policy loss" in lines
    assert f"rlstab: the objective aggregates the policy loss with token-mean, but veRL aggregates {TERMS} with " \
           f"{ACTOR}.loss_agg_mode=seq-mean-token-mean; set {ACTOR}.loss_agg_mode=token-mean to aggregate them as " \
           "the policy loss, or change aggregation in the objective" in lines


def aggregation_warnings(caplog, *overrides: str) -> list[str]:
    caplog.clear()
    caplog.set_level(logging.WARNING, logger="rlstab.adapters.verl.config")
    actor(*overrides)
    return [r.getMessage() for r in caplog.records if "aggregates the policy loss" in r.getMessage()]


def test_veRLs_default_loss_agg_mode_warns_when_the_objective_aggregates_otherwise(caplog):
    """Issue 38: gspo under veRL's defaults was silent, while veRL aggregated its own terms with token-mean."""
    assert aggregation_warnings(caplog, *select("gspo")) == [
        f"rlstab: the objective aggregates the policy loss with seq-mean-token-mean, but veRL aggregates {TERMS} with "
        f"{ACTOR}.loss_agg_mode=token-mean (veRL's default); set {ACTOR}.loss_agg_mode=seq-mean-token-mean to "
        "aggregate them as the policy loss, or change aggregation in the objective"]
    assert aggregation_warnings(caplog, *select("grpo")) == []  # token-mean, as veRL's default
    assert aggregation_warnings(caplog, *select("gspo"), f"{ACTOR}.loss_agg_mode=seq-mean-token-mean") == []
    assert aggregation_warnings(caplog, *select("dppo_tv"), f"{ACTOR}.loss_agg_mode=seq-mean-token-sum-norm",
                                f"{ACTOR}.loss_scale_factor=4096") == [
        "rlstab: the objective aggregates the policy loss with seq-mean-token-sum-norm (norm max_length), but veRL "
        f"aggregates {TERMS} with {ACTOR}.loss_agg_mode=seq-mean-token-sum-norm with loss_scale_factor=4096; set "
        f"{ACTOR}.loss_scale_factor=null to aggregate them as the policy loss, or change aggregation in the objective"]


def test_rlstabs_idea_of_veRLs_aggregation_modes_is_veRLs():
    """The torch-free description (``rlstab.adapters.trainer_aggregation``) against veRL 0.9.1's ActorConfig."""
    from verl.workers.config import ActorConfig

    from rlstab.adapters.trainer_aggregation import VERL_DEFAULT_MODE, VERL_MODES

    from verl_batches import vanilla_config

    defaults = {f.name: f.default for f in dataclasses.fields(ActorConfig)}
    assert (defaults["loss_agg_mode"], defaults["loss_scale_factor"]) == (VERL_DEFAULT_MODE, None)
    for mode in VERL_MODES:
        assert vanilla_config(loss_agg_mode=mode).loss_agg_mode == mode
    with pytest.raises(ValueError, match="Invalid loss_agg_mode"):
        vanilla_config(loss_agg_mode="seq-mean-token-max")


@pytest.mark.parametrize("name", rlstab.preset_names())
def test_what_validate_prints_to_paste_is_what_the_start_up_check_needs(capsys, caplog, name):
    """The block `rlstab validate --trainer verl` prints, pasted as Hydra overrides: veRL starts, nothing warned."""
    main(["validate", "--trainer", "verl", name])
    out = capsys.readouterr().out.splitlines()
    heading = [i for i, line in enumerate(out) if line.endswith(", to paste:")]
    pasted = [line.strip().removesuffix(" \\") for line in out[heading[0] + 1:]] if heading else []
    if trainers.problems(rlstab.load(name), "verl"):  # a refused objective is answered with its problems only
        assert pasted == []
        return
    assert pasted == trainers.overrides(rlstab.load(name), "verl")
    caplog.set_level(logging.WARNING, logger="rlstab.adapters.verl.config")
    assert start_up(*select(name), *pasted) == []
    assert [r.getMessage() for r in caplog.records if "aggregates the policy loss" in r.getMessage()] == []
    if any("loss_agg_mode" in line for line in pasted):  # and without the block, the start-up check warns
        assert aggregation_warnings(caplog, *select(name)) != []


def test_the_paste_test_sees_blocks_of_several_kinds(capsys):
    """Not vacuous: presets whose block names entropy, the aggregation, the sampler; one without a block."""
    blocks = {name: trainers.overrides(rlstab.load(name), "verl") for name in ("stapo", "dppo_tv", "goldilocks", "grpo")}
    assert blocks["stapo"] == [f"{ACTOR}.calculate_entropy=True"]
    assert blocks["dppo_tv"] == [f"{ACTOR}.loss_agg_mode=seq-mean-token-sum-norm"]
    assert "data.custom_cls.name=GoldilocksDataset" in blocks["goldilocks"] and blocks["grpo"] == []
