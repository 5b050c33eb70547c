"""``step_statistics: optimizer_step`` (the default) through veRL's real ``TrainingWorker`` on two gloo ranks.

Two training batches, each two optimizer steps (mini-batches) of two micro-batches per rank, with
different rows on each rank. One objective carries all three kinds of step state: S2T's
thresholds (stapo), STARE's gate and adaptive controller, BAPO's bounds. Each rank records what its
compiled objective gathered; the test replays the same calls in this process on both ranks' inputs
concatenated and compares. Then the per-micro-batch modes: STARE, BAPO and adaptive entropy refused
when the worker is built, and a state-valued controller of the tests' own exact under ``data_parallel``.
"""

from __future__ import annotations

import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))

from test_training_worker import FP32, LOSSES, spawn_ranks  # noqa: E402

import rlstab  # noqa: E402
from rlstab.registry import isolated  # noqa: E402

import step_scope_rank  # noqa: E402
import surprisal_controller  # noqa: E402
import training_worker_rank as base  # noqa: E402

OBJECTIVE = """\
extends: stapo
surrogate: {kind: bapo}
reweighters:
  # H_tgt far above the tiny model's entropies: the gate stays open and W rises by alpha each time it moves
  - {kind: stare, variant: C2, adaptive: true, alpha: 0.05, target_entropy: 10.0}
"""
STARE, BAPO = "reweighters[0] (stare)", "surrogate (bapo)"
TWO_MICRO_BATCHES = ["actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1"]  # per rank: mini-batch of 2 rows


def run(world_size: int, model_path: str, overrides: list[str], keep_entropy: bool = True) -> list[dict]:
    return spawn_ranks(step_scope_rank.run_rank, world_size, model_path, overrides, keep_entropy)


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    folder = tmp_path_factory.mktemp("step-scope")
    model_path = str(folder / "tiny-llama")
    base.save_tiny_llama(model_path)
    objective = folder / "objective.yaml"
    objective.write_text(OBJECTIVE)
    overrides = [o for o in LOSSES["rlstab"] if ".objective=" not in o]
    overrides += [f"+actor_rollout_ref.actor.policy_loss.objective={objective}"] + FP32 + TWO_MICRO_BATCHES
    return model_path, overrides, str(objective)


@pytest.fixture(scope="module")
def ranks(setup):
    model_path, overrides, _ = setup
    return run(2, model_path, overrides)


def as_batch(inputs: dict) -> rlstab.TokenBatch:
    return rlstab.TokenBatch(
        logprobs=inputs["logprobs"], old_logprobs=inputs["old_logprobs"], advantages=inputs["advantages"],
        response_mask=inputs["response_mask"], entropy=inputs.get("entropy"),
    )


def test_every_rank_trains_with_the_same_step_statistics_and_state(ranks):
    first, second = ranks
    steps_per_batch = base.BATCH // base.MINI_BATCH
    expected = (["begin_training_batch"] + ["gather"] * steps_per_batch) * step_scope_rank.TRAINING_BATCHES
    for r in ranks:
        assert [c["call"] for c in r["calls"]] == expected
    for a, b in zip(first["calls"], second["calls"]):
        for x, y in zip(a["inputs"], b["inputs"]):
            assert not torch.equal(x["advantages"], y["advantages"])  # different rows on each rank
        assert a["state"] == b["state"]  # STARE's controller and BAPO's bounds: identical, not close
        if a["call"] == "gather":
            assert a["hooks"] == b["hooks"]
            for s, t in zip(a["thresholds"], b["thresholds"]):
                assert torch.equal(s, t)


def test_the_statistics_equal_one_process_on_the_concatenated_batch(ranks, setup):
    """Replayed here on both ranks' inputs together, the same calls give the same thresholds, counts and state."""
    one = rlstab.load(setup[2]).compile()
    for a, b in zip(ranks[0]["calls"], ranks[1]["calls"]):
        batches = [as_batch(x) for x in a["inputs"] + b["inputs"]]
        if a["call"] == "begin_training_batch":
            one.begin_training_batch(batches)
        else:
            stats = one.gather(batches)
            for mine, theirs in zip(stats.thresholds, a["thresholds"]):
                assert mine.item() == pytest.approx(theirs.item(), abs=1e-6)
            assert stats.counts.tokens_valid == a["counts"].tokens_valid
            assert stats.counts.tokens_kept == a["counts"].tokens_kept
            bounds, replayed = a["hooks"][-1], stats.hooks[-1]
            assert replayed == pytest.approx(bounds, abs=1e-6)
        state = one.state_dict()
        assert state[STARE] == pytest.approx(a["state"][STARE], abs=1e-6)
        assert state[BAPO] == pytest.approx(a["state"][BAPO], abs=1e-6)


def test_stare_moves_once_per_training_batch_and_bapo_once_per_optimizer_step(ranks):
    calls = ranks[0]["calls"]
    w = [c["state"][STARE]["W"] for c in calls]
    bapo_steps = [c["state"][BAPO]["steps"] for c in calls]
    # W: 1.1 -> 1.15 at the first training batch, -> 1.2 at the second; no gather moves it
    assert w == pytest.approx([1.15, 1.15, 1.15, 1.2, 1.2, 1.2])
    assert bapo_steps == [0, 1, 2, 2, 3, 4]
    # The training batch's mean entropy is that of the whole batch on both ranks (old-log-prob pass).
    begin = calls[0]
    both = [x for r in ranks for x in r["calls"][0]["inputs"]]
    valid = torch.cat([x["response_mask"].flatten() for x in both]).bool()
    entropy = torch.cat([x["entropy"].flatten() for x in both])
    assert begin["state"][STARE]["H_bar"] == pytest.approx(entropy[valid].double().mean().item(), rel=1e-6)


def test_the_first_step_reads_the_old_pass_and_later_steps_the_moved_policy(ranks):
    for r in ranks:
        gathers = [c for c in r["calls"] if c["call"] == "gather"]
        for i, c in enumerate(gathers):
            (x,) = c["inputs"]
            if i % 2 == 0:  # a training batch's first step: the old-log-prob pass's values, no forward
                assert torch.equal(x["logprobs"], x["old_logprobs"])
            else:  # after an optimizer step: a forward of the current policy, whose log-probs moved
                moved = (x["logprobs"] - x["old_logprobs"]).abs()[x["response_mask"].bool()]
                assert moved.max() > 1e-3


def test_metrics_report_the_step_statistics_the_loss_used(ranks):
    """The loss's own metrics carry the gathered thresholds and bounds: the loss used them. veRL averages a
    metric over the step's micro-batches and ranks (one value per step), so each must equal the step's value."""
    for r in ranks:
        gathers = [c for c in r["calls"] if c["call"] == "gather"]
        thresholds = [m for batch in r["metrics"] for m in batch["actor/rlstab/mask/s2t/entropy_threshold"]]
        clip_high = [m for batch in r["metrics"] for m in batch["actor/rlstab/surrogate/clip_high"]]
        assert len(thresholds) == len(clip_high) == len(gathers)
        for c, threshold, high in zip(gathers, thresholds, clip_high):
            assert threshold == pytest.approx(c["thresholds"][0].item(), abs=1e-6)
            assert high == pytest.approx(c["hooks"][-1][1], abs=1e-6)


def test_without_the_old_entropy_one_forward_of_the_training_batch_gives_the_same_statistics(setup, ranks):
    """A worker driven without the trainer's kept entropy computes it itself: same state, same thresholds."""
    model_path, overrides, _ = setup
    alone = run(2, model_path, overrides, keep_entropy=False)
    for r, s in zip(alone, ranks):
        for a, b in zip(r["calls"], s["calls"]):
            assert a["state"][STARE] == pytest.approx(b["state"][STARE], abs=1e-6)
            if a["call"] == "gather":
                for x, y in zip(a["thresholds"], b["thresholds"]):
                    assert x.item() == pytest.approx(y.item(), abs=1e-5)


@pytest.mark.parametrize("mode", ["local", "data_parallel"])
def test_per_micro_batch_statistics_with_a_state_that_reads_the_whole_step_are_refused(setup, mode):
    model_path, overrides, _ = setup
    with pytest.raises(pytest.fail.Exception, match=rf"step_statistics = '{mode}': reweighters\[0\] \(stare\), "
                                                    r"surrogate \(bapo\) need the whole optimizer step or training batch"):
        run(2, model_path, overrides + [f"+actor_rollout_ref.actor.policy_loss.step_statistics={mode}"])


def test_adaptive_entropy_is_refused_when_the_worker_is_built(setup):
    """skywork_entropy, the other stateful preset: veRL adds its own fixed entropy bonus, in every mode."""
    model_path, overrides, _ = setup
    overrides = [o for o in overrides if ".policy_loss.objective=" not in o] + [
        "+actor_rollout_ref.actor.policy_loss.objective=skywork_entropy",
        "+actor_rollout_ref.actor.policy_loss.step_statistics=data_parallel",
    ]
    with pytest.raises(pytest.fail.Exception, match=r"regularisers\[0\] \(adaptive_entropy\): not available in veRL; "
                                                    r"veRL adds the entropy bonus itself"):
        run(2, model_path, overrides)


# ---------------------------------------------------------------- a state moved from its last measurement

CONTROLLER = "reweighters[0] (surprisal_controller)"


@pytest.fixture(scope="module")
def controlled(setup, tmp_path_factory):
    """``data_parallel``, two micro-batches per rank and optimizer step, with a controller whose value is its state's."""
    model_path, overrides, _ = setup
    objective = tmp_path_factory.mktemp("controlled") / "objective.yaml"
    objective.write_text("extends: stapo\nreweighters:\n  - {kind: surprisal_controller}\n")
    overrides = [o for o in overrides if ".policy_loss.objective=" not in o] + [
        f"+actor_rollout_ref.actor.policy_loss.objective={objective}",
        "+actor_rollout_ref.actor.policy_loss.step_statistics=data_parallel",
    ]
    return run(2, model_path, overrides), str(objective)


def test_data_parallel_moves_a_state_valued_controller_once_per_step_from_every_micro_batch_and_rank(controlled):
    """Each micro-batch applies the value of the state its step began with; the state moves once per optimizer
    step, from the measure of all four micro-batches (two per rank), as one process gathering the whole step."""
    ranks, objective = controlled
    with isolated():
        surprisal_controller.register()
        one = rlstab.load(objective).compile()
    first, second = ranks
    calls = first["calls"]
    assert [c["call"] for c in calls] == ["gather"] * 2 * 2 * step_scope_rank.TRAINING_BATCHES  # micro-batches x steps x batches
    assert [c["update_state"] for c in calls] == [True, False] * (len(calls) // 2)
    assert all(c["part_of_step"] for c in calls)
    surprisal = []
    for i in range(0, len(calls), 2):
        step = [calls[i], calls[i + 1], second["calls"][i], second["calls"][i + 1]]
        batches = [as_batch(x) for c in step for x in c["inputs"]]
        surprisal.append([-b.old_logprobs[b.response_mask.bool()].double().mean().item() for b in batches])
        whole = one.gather(batches)
        for c in step:
            assert c["hooks"][0] == pytest.approx(whole.hooks[0], abs=1e-12)  # the value of the step's first state
        for c in (calls[i + 1], second["calls"][i + 1]):  # the step's last micro-batch on each rank
            assert c["state"][CONTROLLER] == pytest.approx(one.state_dict()[CONTROLLER], abs=1e-9)
    assert one.state_dict()[CONTROLLER]["steps"] == len(calls) // 2
    # The micro-batches' mean surprisals differ: a measure of any one of them would not give the state above.
    assert all(max(s) - min(s) > 1e-3 for s in surprisal)
    # The loss applied the step's value: veRL's metric (averaged over the step's micro-batches and ranks) is it.
    scales = [m for batch in first["metrics"] for m in batch["actor/rlstab/reweight/surprisal_controller/scale"]]
    assert scales == pytest.approx([c["hooks"][0] for c in calls[::2]], abs=1e-6)
    assert scales[0] == 1.0 and all(s > 1.1 for s in scales[1:])  # -log p_old of a tiny model's tokens: about 3.9
