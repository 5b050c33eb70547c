"""``rlstab validate --trainer trl`` and the TRL adapter's start-up check agree on every preset.

The adapter side is ``RlstabGRPOTrainer.__init__``, which checks the objective against its
``GRPOConfig`` before TRL loads a model (the model named here does not exist, so a trainer that
passes the check fails later, at loading, with another error). The ``GRPOConfig`` is made with the
settings the command names: a refused preset must be refused with the very lines the command
prints, an accepted one must pass, and, where the command names a setting, fail without it.
"""

from __future__ import annotations

import warnings

import pytest

import rlstab
from rlstab import ConfigError
from rlstab.adapters import trainers
from rlstab.adapters.trl import RlstabGRPOTrainer
from rlstab.cli import main

from trl_tiny import dataset, grpo_config, length_reward, tokenizer

MISSING_MODEL = "no-such-org/no-such-model"  # loading it would fail: the check must come first

ROLLOUT = "use_vllm=True and vllm_importance_sampling_correction=False"
REFERENCE = "beta = the kl regulariser's coef and use_bias_correction_kl=False"
CADENCE = "steps_per_generation x num_iterations = gradient_accumulation_steps"


def construct(tmp_path, objective, **config):
    return RlstabGRPOTrainer(
        objective=objective,
        model=MISSING_MODEL,
        reward_funcs=length_reward,
        args=grpo_config(tmp_path, **config),
        train_dataset=dataset(),
        processing_class=tokenizer(),
    )


def command(capsys, name: str) -> tuple[int, list[str], list[str]]:
    """The command's exit status, the problems it prints (without the source) and the settings it names."""
    code = main(["validate", "--trainer", "trl", name])
    captured = capsys.readouterr()
    prefix = f"{name} (with TRL): "
    assert all(line.startswith(prefix) for line in captured.err.splitlines()), captured.err
    problems = [line[len(prefix):] for line in captured.err.splitlines()]
    needs = [line.split(" needs ", 1)[1].split(" (", 1)[0] for line in captured.out.splitlines() if " needs " in line]
    return code, problems, needs


def config_for(objective, needs: list[str]) -> dict:
    """GRPOConfig fields that make each setting the command names (the defaults already keep the cadence)."""
    fields: dict = {}
    for need in needs:
        if need == ROLLOUT:
            fields.update(use_vllm=True, vllm_importance_sampling_correction=False)
        elif need == REFERENCE:
            (coef,) = {r.coef for r in objective.regularisers if r.kind == "kl"}
            fields.update(beta=coef, use_bias_correction_kl=False)
        else:
            assert need == CADENCE, need
    return fields


def start_up(tmp_path, name: str, **config) -> list[str]:
    """The adapter's start-up check: [] when it passes (the missing model fails later), else its problem lines."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            construct(tmp_path, name, **config)
        except ConfigError as err:
            return err.problems
        except Exception:  # noqa: BLE001 - past the check: loading the missing model fails
            return []
    raise AssertionError("the trainer was built from a model that does not exist")


@pytest.mark.parametrize("name", rlstab.preset_names())
def test_the_command_and_the_start_up_check_agree(tmp_path, capsys, name):
    code, problems, needs = command(capsys, name)
    objective = rlstab.load(name)
    settings = [line.split(" (", 1)[0] for line in trainers.settings(objective, "trl")]
    assert needs == ([] if problems else settings)  # an objective it refuses is answered with its problems only
    config = config_for(objective, settings)
    assert start_up(tmp_path, name, **config) == problems, name
    assert code == (1 if problems else 0)
    if not problems and config:  # what the command names is needed: without it the start-up check refuses
        assert start_up(tmp_path, name) != []


def test_a_kl_objective_needs_beta_as_the_command_says(tmp_path, capsys):
    path = tmp_path / "kl.yaml"
    path.write_text("extends: grpo\nname: kl\nregularisers: [{kind: kl, coef: 0.02}]\n")
    code, problems, needs = command(capsys, str(path))
    assert (code, problems, needs) == (0, [], [REFERENCE])
    assert start_up(tmp_path, str(path), beta=0.02, use_bias_correction_kl=False) == []
    assert start_up(tmp_path, str(path)) != []


def test_the_test_sees_both_outcomes(capsys):
    """Not vacuous: presets the adapter refuses and presets it runs, some of them only with a named setting."""
    outcomes = {name: command(capsys, name) for name in ("vcpo", "grpo", "tis")}
    assert outcomes["vcpo"][0] == 1 and outcomes["grpo"] == (0, [], []) and outcomes["tis"][2] == [ROLLOUT]
