"""What each adapter refuses at start-up: parts only a trainer executes, tensors it does not supply, regularisers it adds."""

import json
import subprocess
import sys

import pytest

import rlstab
from rlstab.adapters.trainer_parts import VERL_SAMPLER, added_by_trainer, unexecutable, unsupplied
from rlstab.explain import explain
from rlstab.regularisers import KLPenalty


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
    text = explain(rlstab.load("goldilocks"))
    where = text[text.index("Where each part runs"):].splitlines()[1:]
    assert [line.split()[0] for line in where] == ["loss", "step", "sampler"]
    assert where[-1].endswith("rlstab.adapters.verl.sampler): embedded, veRL; refused by OpenRLHF, TRL, TRL AsyncGRPO")


def test_a_component_reading_what_the_trainer_lacks_is_named_with_the_advice():
    objective = rlstab.load({"extends": "grpo", "masks": [
        {"kind": "rollout_rejection", "level": "token", "divergence": "k1", "high": 2.0}]})
    problems = unsupplied(objective, {"rollout_logprobs": "not given; use X", "rewards": "not given"})
    assert problems == ["masks[0] (rollout_rejection) reads TokenBatch.rollout_logprobs: not given; use X"]


def test_a_regulariser_the_trainer_adds_is_refused_once():
    objective = rlstab.load({"extends": "grpo", "regularisers": [{"kind": "kl", "coef": 0.01}]})
    refused = added_by_trainer(objective, "veRL", {KLPenalty: "set use_kl_loss"})
    assert refused == {"regularisers[0] (kl)": "regularisers[0] (kl): not available in veRL; set use_kl_loss"}
    assert unsupplied(objective, {"ref_logprobs": "not given"}, reported=refused) == []
    assert unsupplied(objective, {"ref_logprobs": "not given"}) == ["regularisers[0] (kl) reads TokenBatch.ref_logprobs: not given"]


def test_the_checks_import_no_torch():
    """The adapters' config checks run before a trainer starts (the OpenRLHF launcher, in the driver): no torch."""
    code = """
import json, sys
import rlstab
from rlstab.adapters.trainer_parts import added_by_trainer, unexecutable, unsupplied
from rlstab.regularisers import EntropyBonus, KLPenalty

lines = 0
for name in rlstab.preset_names():
    objective = rlstab.load(name)
    lines += len(unexecutable(objective, "veRL", sampler_hook=True))
    refused = added_by_trainer(objective, "veRL", {EntropyBonus: "a", KLPenalty: "b"})
    fields = {"rollout_logprobs": "a", "ref_logprobs": "b", "rewards": "c", "group_ids": "d", "entropy": "e"}
    lines += len(unsupplied(objective, fields, reported=refused))
print(json.dumps({"lines": lines, "torch": sorted(m for m in sys.modules if m == "torch" or m.startswith("torch."))}))
"""
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["lines"] > 0 and report["torch"] == []


@pytest.mark.parametrize("kind", ["opo", "grpo_passk"])
def test_rollout_group_estimators_are_refused_where_the_trainer_computes_other_advantages(kind):
    """opo and grpo_passk need all of a prompt's rollouts: veRL computes them itself (adv_estimator), TRL and OpenRLHF cannot."""
    objective = rlstab.load({"extends": "grpo", "advantage": {"kind": kind}})
    for trainer in ("TRL", "OpenRLHF"):
        problems = unexecutable(objective, trainer)
        assert problems == [
            f"advantage ({kind}): its baseline needs all of a prompt's rollouts, and {trainer} computes only its own "
            f"advantages (group-normalised rewards), not {kind}'s; use veRL (algorithm.adv_estimator={kind}) or rlstab's "
            "embedded trainer"
        ]
    assert unexecutable(objective, "veRL", sampler_hook=True, token_baseline=True, rollout_groups=True) == []
    assert unexecutable(rlstab.load({"extends": "grpo", "advantage": {"kind": "gpg"}}), "TRL") == []
