"""Step-wide statistics and checkpointed state, in OpenRLHF's real ``ActorPPOTrainer.ppo_train`` on two gloo ranks.

Two fresh processes (``openrlhf_ppo_train.py``) form a gloo group; each trains on its own data:
two training batches (``ppo_train`` calls) of 8 responses per rank, 2 epochs x 2 optimizer steps x
2 micro-batches of 2 responses. Every ``gather`` / ``begin_training_batch`` the adapter makes is
recorded on each rank with its inputs, and recomputed here in one process on both ranks' inputs
together. A second pair of fresh processes resumes from the checkpoint the first pair saved
after the first training batch, through OpenRLHF's own ``PolicyModelActor.save_checkpoint`` and
``DeepspeedStrategy.save_ckpt`` / ``load_ckpt`` (the DeepSpeed engine itself is a stand-in; see
the script's docstring). A third run, on one rank under ``local``, trains with a state-valued
controller of the tests' own.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import rlstab
from rlstab.adapters.openrlhf.config import OBJECTIVE_ENV, build_objective, objective_to_env
from rlstab.batch import TokenBatch
from rlstab.registry import isolated

import surprisal_controller
from openrlhf_gpu_stubs import subprocess_env, write_stubs

SCRIPT = Path(__file__).with_name("openrlhf_ppo_train.py")
STEPS_PER_BATCH = 4  # 2 epochs x 2 optimizer steps
OBJECTIVES = {
    "s2t": "stapo",
    # target entropy above the tiny model's (about log 48 = 3.9), so the controller moves every time it steps
    "stare": {"extends": "dapo", "reweighters": [{"kind": "stare", "adaptive": True, "target_entropy": 5.0}]},
    "bapo": {"extends": "dapo", "surrogate": {"kind": "bapo"}},
}


CONTROLLER = "reweighters[0] (surprisal_controller)"
CONTROLLED = {"extends": "dapo", "reweighters": [{"kind": "surprisal_controller"}]}  # tests/surprisal_controller.py


def yaml_of(name: str) -> str:
    return objective_to_env(build_objective(OBJECTIVES[name]))


def with_controller(use):
    """``use(objective)`` of the objective with the tests' own state-valued controller, its kind registered here
    for the call only."""
    with isolated():
        surprisal_controller.register()
        return use(build_objective(CONTROLLED))


def run_ranks(tmp: Path, tag: str, cases: list[dict], world: int = 2) -> list[dict]:
    """Every rank of a gloo group, each running ``cases``; their recorded results."""
    stubs = write_stubs(tmp / "stubs")
    env = subprocess_env(stubs, **{OBJECTIVE_ENV: yaml_of("s2t")})  # an entropy reader: the hook wraps Actor.forward
    procs, outs = [], []
    for rank in range(world):
        config, out = tmp / f"{tag}{rank}.json", tmp / f"{tag}{rank}.pt"
        config.write_text(json.dumps({"rank": rank, "world_size": world, "store": str(tmp / f"{tag}.store"),
                                      "out": str(out), "cases": cases}))
        log = open(tmp / f"{tag}{rank}.log", "w")
        procs.append(subprocess.Popen([sys.executable, str(SCRIPT), str(config)], env=env, stdout=log,
                                      stderr=subprocess.STDOUT))
        outs.append(out)
    codes = [p.wait(timeout=600) for p in procs]
    assert codes == [0] * world, "".join((tmp / f"{tag}{rank}.log").read_text()[-4000:] for rank in range(world))
    return [torch.load(out, weights_only=False) for out in outs]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ppo_train")
    stare_ckpt, bapo_ckpt = str(tmp / "stare_ckpt"), str(tmp / "bapo_ckpt")
    first = run_ranks(tmp, "first", [
        {"name": "s2t", "objective": yaml_of("s2t"), "mode": "optimizer_step", "batches": [0, 2]},
        {"name": "stare", "objective": yaml_of("stare"), "mode": "optimizer_step", "batches": [0, 2],
         "save_after": 1, "ckpt": stare_ckpt},
        {"name": "bapo", "objective": yaml_of("bapo"), "mode": "optimizer_step", "batches": [0, 2],
         "save_after": 1, "ckpt": bapo_ckpt},
        {"name": "stare-local-refused", "objective": yaml_of("stare"), "mode": "local", "expect_error": True},
        {"name": "bapo-local-refused", "objective": yaml_of("bapo"), "mode": "local", "expect_error": True},
        {"name": "stare-local", "objective": yaml_of("stare"), "mode": "local", "batches": [0, 2], "skip_check": True},
        {"name": "bapo-local", "objective": yaml_of("bapo"), "mode": "local", "batches": [0, 2], "skip_check": True},
        {"name": "skywork-local-refused", "objective": rlstab.load("skywork_entropy").to_yaml(),
         "mode": "local", "expect_error": True},
        {"name": "controller-local-refused", "objective": with_controller(objective_to_env), "mode": "local",
         "expect_error": True},
    ])
    resumed = run_ranks(tmp, "resumed", [
        {"name": "mismatch", "objective": yaml_of("bapo"), "mode": "optimizer_step", "resume": True,
         "ckpt": stare_ckpt, "expect_error": True},
        {"name": "stare", "objective": yaml_of("stare"), "mode": "optimizer_step", "batches": [1, 2], "resume": True,
         "ckpt": stare_ckpt},
        {"name": "bapo", "objective": yaml_of("bapo"), "mode": "optimizer_step", "batches": [1, 2], "resume": True,
         "ckpt": bapo_ckpt},
    ])
    return {"first": first, "resumed": resumed, "stare_ckpt": stare_ckpt}


def close(a, b) -> bool:
    """Nested values (dicts, tuples, tensors, floats) equal to 1e-6."""
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(close(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple):
        return isinstance(b, list | tuple) and len(a) == len(b) and all(map(close, a, b))
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        a, b = torch.as_tensor(a, dtype=torch.float64), torch.as_tensor(b, dtype=torch.float64)
        return a.shape == b.shape and torch.allclose(a, b, rtol=0, atol=1e-6)
    if isinstance(a, float) or isinstance(b, float):
        return a is not None and b is not None and math.isclose(a, b, rel_tol=0, abs_tol=1e-6)
    return a == b


def batches(rows: list[dict]) -> list[TokenBatch]:
    return [TokenBatch(**{k: v for k, v in row.items() if v is not None}) for row in rows]


@pytest.mark.parametrize("name", ["s2t", "stare", "bapo"])
def test_every_rank_holds_the_statistics_of_the_whole_step(runs, name):
    rank0, rank1 = (r[name] for r in runs["first"])
    events0, events1 = rank0["events"], rank1["events"]
    kinds = [e["kind"] for e in events0]
    begins = ["begin"] if name == "stare" else []  # only STARE moves once per training batch
    assert kinds == [e["kind"] for e in events1] == (begins + ["gather"] * STEPS_PER_BATCH) * 2
    # the two ranks trained on different data...
    assert not close(events0[-1]["batches"][0]["logprobs"], events1[-1]["batches"][0]["logprobs"])
    # ...and hold the same statistics and state, equal to one process computing on both ranks' inputs together
    compiled = build_objective(OBJECTIVES[name]).compile()
    for e0, e1 in zip(events0, events1):
        together = batches(e0["batches"]) + batches(e1["batches"])
        assert close(e0["state"], e1["state"])
        if e0["kind"] == "begin":
            compiled.begin_training_batch(together, distributed=False)
        else:
            stats = compiled.gather(together, distributed=False)
            assert close(e0["thresholds"], e1["thresholds"]) and close(e0["thresholds"], stats.thresholds)
            assert close(e0["hooks"], e1["hooks"]) and close(e0["hooks"], stats.hooks)
            assert e0["kept"] == pytest.approx(stats.counts.tokens_kept, abs=1e-6)
            assert e0["valid"] == e1["valid"] == stats.counts.tokens_valid == sum(
                float(b.response_mask.sum()) for b in together)  # every micro-batch of both ranks
        assert close(e0["state"], compiled.state_dict())
    assert close(rank0["params"], rank1["params"])  # the same update on both ranks


def test_s2t_thresholds_move_with_the_policy(runs):
    thresholds = [float(e["thresholds"][0]) for e in runs["first"][0]["s2t"]["events"]]
    assert len(set(round(t, 6) for t in thresholds)) == len(thresholds)  # a new quantile every step


def test_stare_controller_moves_once_per_training_batch(runs):
    states = [s["reweighters[0] (stare)"] for s in runs["first"][0]["stare"]["states"]]
    assert [s["W"] for s in states] == pytest.approx([1.11, 1.12])  # W += alpha per training batch, not per step
    assert [s["M"] for s in states] == pytest.approx([0.89, 0.88])
    events = runs["first"][0]["stare"]["events"]
    for i, e in enumerate(events):  # an optimizer step reuses its training batch's gate and weights
        if e["kind"] == "gather":
            assert e["state"] == events[i - 1]["state"]
    # without the step-wide mode each rank moves it from its own micro-batch, once per optimizer step
    local = [r["stare-local"]["states"][-1]["reweighters[0] (stare)"] for r in runs["first"]]
    assert local[0]["W"] == local[1]["W"] == pytest.approx(1.1 + 0.01 * 2 * STEPS_PER_BATCH)
    assert local[0]["H_bar"] != pytest.approx(local[1]["H_bar"], abs=1e-6)  # the ranks' states differ


def test_bapo_bounds_step_once_per_optimizer_step_from_the_whole_step(runs):
    events = runs["first"][0]["bapo"]["events"]
    assert [e["state"]["surrogate (bapo)"]["steps"] for e in events] == list(range(1, 2 * STEPS_PER_BATCH + 1))
    shares = [e["hooks"][-1][2] for e in events]  # the positive share BAPO chose its bounds from
    assert len(set(round(s, 6) for s in shares)) > 1  # it moves with the policy...
    assert len({e["hooks"][-1][:2] for e in events}) > 1  # ...and so do the bounds
    # without the step-wide mode each rank chooses its bounds from its own micro-batch
    local = [[e["hooks"][-1] for e in r["bapo-local"]["events"]] for r in runs["first"]]
    assert not close(local[0], local[1])


@pytest.mark.parametrize("name, label, scope", [
    ("stare", "reweighters[0] (stare)", "optimizer step or training batch"),
    ("bapo", "surrogate (bapo)", "optimizer step"),
])
def test_local_mode_refuses_a_state_that_reads_the_whole_step_when_the_trainer_is_built(runs, name, label, scope):
    """Every stateful component OpenRLHF can run (its own entropy bonus replaces adaptive_entropy) reads the whole
    step or training batch, which ``local`` never sees: refused by ``ActorPPOTrainer.__init__``, naming the mode."""
    for rank in runs["first"]:
        assert rank[f"{name}-local-refused"]["error"] == (
            f"ValueError: rlstab: step_statistics='local': {label} needs the whole {scope} before its first "
            "micro-batch, but this mode sees one micro-batch at a time; use --step-statistics optimizer_step (the default)"
        )


@pytest.fixture(scope="module")
def one_rank(tmp_path_factory):
    """``local`` on one rank: ``ppo_train`` over two training batches with a controller whose value is its state's."""
    case = {"name": "controller", "objective": with_controller(objective_to_env), "mode": "local", "batches": [0, 2]}
    (rank,) = run_ranks(tmp_path_factory.mktemp("one_rank"), "one", [case], world=1)
    return rank["controller"]


def test_local_mode_moves_a_state_valued_controller_once_per_step_from_every_micro_batch(one_rank):
    """Each micro-batch applies the value of the state its optimizer step began with; the state moves once per
    step, from the measure of both micro-batches, as one process gathering the whole step."""
    events = one_rank["events"]
    assert [e["kind"] for e in events] == ["gather"] * 2 * 2 * STEPS_PER_BATCH  # micro-batches x steps x batches
    assert [e["update_state"] for e in events] == [True, False] * 2 * STEPS_PER_BATCH
    assert all(e["part_of_step"] for e in events)
    compiled = with_controller(lambda objective: objective.compile())
    for first, last in zip(events[::2], events[1::2]):
        step = batches(first["batches"]) + batches(last["batches"])
        stats = compiled.gather(step, distributed=False)
        assert close(first["hooks"][0], stats.hooks[0]) and close(last["hooks"][0], stats.hooks[0])
        assert close(last["state"], compiled.state_dict())
        # the measure is of the whole step: the two micro-batches' mean surprisals differ
        surprisal = [-b.old_logprobs[b.response_mask.bool()].double().mean().item() for b in step]
        assert abs(surprisal[0] - surprisal[1]) > 1e-3
    assert [s[CONTROLLER]["steps"] for s in one_rank["states"]] == [STEPS_PER_BATCH, 2 * STEPS_PER_BATCH]
    assert events[0]["hooks"][0] == 1.0 and all(e["hooks"][0] > 1.1 for e in events[2:])  # it acted


def test_adaptive_entropy_is_refused_when_the_trainer_is_built(runs):
    """skywork_entropy, the other stateful preset, set in the environment without the launcher (which refuses it
    first): OpenRLHF adds its own fixed entropy bonus, in every mode."""
    for rank in runs["first"]:
        assert rank["skywork-local-refused"]["error"].startswith(
            "ConfigError: $RLSTAB_OPENRLHF_OBJECTIVE: regularisers[0] (adaptive_entropy): not available in OpenRLHF; "
        )


def test_local_mode_on_several_ranks_refuses_a_state_valued_controller(runs):
    """Each rank would move its own state from its own micro-batches: refused when the trainer is built."""
    for rank in runs["first"]:
        assert rank["controller-local-refused"]["error"] == (
            f"ValueError: rlstab: step_statistics='local' with 2 data-parallel ranks: {CONTROLLER} would move its "
            "state from each rank's own micro-batch, and the ranks' states would drift apart; use "
            "--step-statistics optimizer_step (the default)"
        )


@pytest.mark.parametrize("name", ["stare", "bapo"])
def test_resuming_from_openrlhfs_checkpoint_continues_the_run_exactly(runs, name):
    uninterrupted = runs["first"][0][name]
    for rank in runs["resumed"]:
        resumed = rank[name]
        # the state restored from the checkpoint is the one the first run had after its first training batch
        assert resumed["states"][-1] == uninterrupted["states"][-1] or close(resumed["states"][-1],
                                                                             uninterrupted["states"][-1])
        assert close(resumed["events"][0]["state"], uninterrupted["events"][len(uninterrupted["events"]) // 2]["state"])
        assert close(resumed["params"], uninterrupted["params"])
    assert uninterrupted["states"][0] != uninterrupted["states"][1]  # the state moved after the save


def test_a_checkpoint_of_another_objective_is_refused_naming_it(runs):
    for rank in runs["resumed"]:
        error = rank["mismatch"]["error"]
        assert error.startswith(f"StateError: the rlstab state in OpenRLHF checkpoint {runs['stare_ckpt']}/_actor/"
                                "global_step1 (saved by objective 'custom') does not fit objective 'custom'")
        assert "reweighters[0] (stare)" in error and "surrogate (bapo)" in error
