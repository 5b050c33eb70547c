"""rlstab.testing.checks: which checks apply to which component, and check_component, which runs them and
reports every failure with the component's name."""

import pytest

from rlstab.exploration.deep_grpo import DeepGRPO
from rlstab.masks.expression import Expression
from rlstab.masks.s2t import S2T
from rlstab.regularisers.kl import KLPenalty
from rlstab.reweighters.stare import STARE
from rlstab.testing.checks import CHECKS, applicable_checks, check_component

STATIC = ["yaml_round_trip", "describe_and_explain", "json_schema"]
IN_LOSS = ["reads_are_declared", "padding_changes_nothing", "no_valid_token_gives_zero_loss",
           "micro_batches_equal_whole_step", "two_ranks_equal_one_process"]


def test_each_check_is_the_function_of_its_name():
    assert [check.__name__ for check, _ in CHECKS.values()] == [f"check_{name}" for name in CHECKS]


def test_a_mask_gets_the_silenced_token_check():
    assert applicable_checks(S2T()) == [*STATIC, *IN_LOSS[:3], "silenced_tokens_get_zero_gradient", *IN_LOSS[3:]]


def test_a_regulariser_without_state_gets_the_loss_checks_only():
    assert applicable_checks(KLPenalty()) == [*STATIC, *IN_LOSS]


def test_a_stateful_reweighter_gets_the_state_check():
    assert applicable_checks(STARE(variant="C2", adaptive=True)) == [*STATIC, *IN_LOSS, "state_round_trip"]


def test_a_trainer_executed_component_gets_no_loss_check():
    assert applicable_checks(DeepGRPO()) == [*STATIC, "state_round_trip"]


def test_a_class_of_no_family_is_refused():
    with pytest.raises(AssertionError, match="derives from no family's base class"):
        applicable_checks(object())


def test_an_unknown_check_is_refused_before_any_runs():
    with pytest.raises(ValueError, match=r"unknown checks \['padding'\]; the checks are yaml_round_trip, "):
        check_component(S2T(), checks=["yaml_round_trip", "padding"])


def test_check_component_runs_the_named_checks_and_passes_a_conforming_component():
    check_component(S2T(), checks=["yaml_round_trip", "silenced_tokens_get_zero_gradient"])


def test_check_component_lists_every_failed_check_with_the_component():
    # keep every token: the silenced-token check refuses a mask that silences nothing; the YAML check passes
    keep_all = Expression(keep="position >= 0")
    with pytest.raises(AssertionError) as caught:
        check_component(keep_all, checks=["yaml_round_trip", "silenced_tokens_get_zero_gradient"])
    lines = str(caught.value).splitlines()
    assert lines[0] == "masks kind 'expression' (rlstab.masks.expression.Expression) fails 1 check(s):"
    assert "check_silenced_tokens_get_zero_gradient: silences no valid token" in lines[1]
    assert len(lines) == 2
