"""The plan of an objective (``Plan.of(objective)``): labels, readers, stateful components, made without torch."""

import json
import subprocess
import sys

import rlstab
from rlstab.compiler.plan import Plan


def objective(**fields):
    return rlstab.Objective.model_validate({"aggregation": {"kind": "token-mean", "count": "kept"}, **fields})


def test_by_hand():
    plan = Plan.of(objective(
        masks=[{"kind": "s2t"}, {"kind": "rollout_rejection", "high": 0.01, "rejected": "padding"}, {"kind": "s2t"}],
        reweighters=[{"kind": "stare"}, {"kind": "tis"}],
        regularisers=[{"kind": "kl", "coef": 0.1}],
        group_filter={"kind": "dynamic_sampling"},
    ))
    assert plan.mask_labels == ("s2t_0", "rollout_rejection", "s2t_2")
    assert plan.reweighter_labels == ("stare", "tis") and plan.regulariser_labels == ("kl",)
    assert plan.stateful == ("reweighters[0] (stare)", "reweighters[1] (tis)", "surrogate (ppo_clip)", "regularisers[0] (kl)")
    assert plan.training_batch == ("reweighters[0] (stare)",)
    assert plan.rejections == (1,)
    assert plan.readers("rollout_logprobs") == ["masks[1] (rollout_rejection)", "reweighters[1] (tis)"]
    assert plan.readers("rewards") == ["group_filter (dynamic_sampling)"] and plan.reads_rewards
    assert plan.readers("ref_logprobs") == ["regularisers[0] (kl)"]
    assert not Plan.of(objective()).reads_rewards


def test_the_compiled_objective_answers_from_its_plan():
    for name in rlstab.preset_names():
        loss_fn = rlstab.load(name).compile()
        plan = loss_fn.plan
        assert loss_fn.mask_labels == list(plan.mask_labels)
        assert loss_fn.per_micro_batch() == list(plan.per_micro_batch) == list(Plan.of(rlstab.load(name)).per_micro_batch)
        assert loss_fn.training_batch_components() == list(plan.training_batch)
        for field in ("rewards", "entropy", "rollout_logprobs", "ref_logprobs", "is_branch"):
            assert loss_fn.readers(field) == plan.readers(field)


def test_a_plan_imports_no_torch():
    code = """
import json, sys
import rlstab, rlstab.compiler, rlstab.compiler.plan
plans = [rlstab.compiler.plan.Plan.of(rlstab.load(name)) for name in rlstab.preset_names()]
print(json.dumps({"plans": len(plans), "torch": sorted(m for m in sys.modules if m.split(".")[0] == "torch")}))
"""
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["plans"] == len(rlstab.preset_names()) and report["torch"] == []
