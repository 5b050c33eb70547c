"""What each adapter refuses of the parts only a trainer can execute (the adapters call this at start-up)."""

import pytest

import rlstab
from rlstab.adapters.trainer_parts import VERL_SAMPLER, unexecutable


def test_a_loss_only_objective_is_executable_everywhere():
    for name in ("grpo", "stapo", "tis"):
        assert unexecutable(rlstab.load(name), "TRL") == []


def test_the_four_layers_are_refused_one_line_each():
    problems = unexecutable(rlstab.load("four_layers"), "OpenRLHF")
    assert [p.split(" ")[0] for p in problems] == ["lr_scale", "advantage", "sampler", "rollout", "dual_stream"]
    assert all("\n" not in p for p in problems)
    assert "TokenBatch.grad_sq_norms" in problems[1]
    assert VERL_SAMPLER in problems[2]  # names the trainer that can run it
    assert "AgentCombo/DEEP-GRPO" in problems[3]


@pytest.mark.parametrize("name", ["goldilocks", "four_layers"])
def test_verl_runs_the_sampler_through_its_hook(name):
    problems = unexecutable(rlstab.load(name), "veRL", sampler_hook=True)
    assert not any(p.startswith("sampler") for p in problems)


def test_explain_says_where_each_part_runs():
    text = rlstab.load("goldilocks").explain()
    where = text[text.index("Where each part runs:"):].splitlines()[1:]
    assert [line.split()[0] for line in where] == ["loss", "step", "sampler"]
    assert "GoldilocksDataset" in where[-1] and "refused by OpenRLHF and TRL" in where[-1]
