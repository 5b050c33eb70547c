"""The RL loop: the step API makes an update independent of the micro-batch size; metrics add up correctly."""

import copy

import pytest
import torch

import rlstab
from rlstab.exploration.deep_grpo import DeepGRPO, PivotExplorer
from rlstab.trainer.branching import sample_branches
from rlstab.trainer.config import TrainConfig
from rlstab.trainer.loop import (
    _token_stats_no_grad,
    combine_updates,
    response_texts,
    rl_step,
    score_grad_sq_norms,
    update,
)
from rlstab.trainer.tasks import CharCodec, get_task, training_problems
from rlstab.trainer.tiny_model import TinyConfig, TinyPolicy


def small_policy():
    torch.manual_seed(0)
    return TinyPolicy.create(CharCodec(), TinyConfig(vocab_size=CharCodec().vocab_size, d_model=32, n_layer=2, n_head=2, d_ff=64))


@pytest.mark.parametrize("preset", ["grpo", "stapo", "20-entropy", "dr_grpo"])
def test_update_gradient_does_not_depend_on_micro_batch_size(preset):
    task = get_task("add2")
    base = small_policy()
    problems = training_problems(task, 4, torch.Generator().manual_seed(0))
    G = 4
    rollout = base.sample([base.codec.encode(p.prompt) for p in problems for _ in range(G)], max_new_tokens=12,
                          temperature=1.0, generator=torch.Generator().manual_seed(1))
    # Rewards chosen so that every group has both outcomes (the untrained model never answers right).
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0] * 4)
    group_ids = torch.arange(4).repeat_interleave(G)
    loss_fn = rlstab.load(preset).compile()
    grads = []
    for micro in (3, 16):
        policy = copy.deepcopy(base)
        old = _token_stats_no_grad(policy, rollout, micro)
        optimizer = torch.optim.SGD(policy.trainable_parameters(), lr=0.0)
        config = TrainConfig(micro_batch_size=micro, max_grad_norm=1e9)
        update(policy, optimizer, loss_fn, rollout, rewards, group_ids, old[0], old, config)
        grads.append(torch.cat([p.grad.flatten() for p in policy.trainable_parameters()]))
    assert grads[0].abs().sum() > 0
    torch.testing.assert_close(grads[0], grads[1], rtol=1e-4, atol=1e-7)


def test_combine_updates_adds_counts_and_step_denominators_and_weights_the_rest():
    kinds = {"tokens/valid": "sum", "tokens/kept": "sum", "tokens/kept_fraction": "token_mean", "loss": "sum",
             "step/tokens_valid": "step", "surrogate/clip_high": "step", "clip/high_fraction": "token_mean"}
    a = {"tokens/valid": 10.0, "tokens/kept": 8.0, "tokens/kept_fraction": 0.8, "loss": 1.0, "step/tokens_valid": 10.0,
         "surrogate/clip_high": 0.2, "clip/high_fraction": 0.1}
    b = {"tokens/valid": 30.0, "tokens/kept": 30.0, "tokens/kept_fraction": 1.0, "loss": 2.0, "step/tokens_valid": 30.0,
         "surrogate/clip_high": 0.3}
    out = combine_updates([(a, kinds), (b, kinds)])
    # sums and the step denominators add: 10 + 30 valid tokens, 8 + 30 kept, losses 1 + 2
    assert out["tokens/valid"] == 40 and out["tokens/kept"] == 38 and out["loss"] == 3.0
    assert out["step/tokens_valid"] == 40
    # the rest by valid tokens: (0.8 * 10 + 1.0 * 30) / 40 = 0.95; (0.2 * 10 + 0.3 * 30) / 40 = 0.275
    assert out["tokens/kept_fraction"] == pytest.approx(0.95)
    assert out["surrogate/clip_high"] == pytest.approx(0.275)
    assert out["clip/high_fraction"] == pytest.approx(0.1)  # only update a has it: its own value
    assert combine_updates([(a, kinds)]) == a


def test_combine_updates_takes_the_extremes_of_min_and_max_metrics():
    kinds = {"tokens/valid": "sum", "mismatch/ratio_min": "min", "mismatch/ratio_max": "max"}
    a = {"tokens/valid": 10.0, "mismatch/ratio_min": 0.5, "mismatch/ratio_max": 2.0}
    b = {"tokens/valid": 0.0, "mismatch/ratio_min": 1.0, "mismatch/ratio_max": 1.0}  # no valid token: a placeholder
    c = {"tokens/valid": 5.0, "mismatch/ratio_min": 0.8, "mismatch/ratio_max": 1.5}
    out = combine_updates([(a, kinds), (b, kinds), (c, kinds)])
    assert (out["mismatch/ratio_min"], out["mismatch/ratio_max"]) == (0.5, 2.0)  # extremes, not token-weighted means


def test_response_texts_drop_eos_and_padding():
    policy = small_policy()
    codec = policy.codec
    from rlstab.trainer.policy import Rollout

    ids = torch.tensor([codec.encode("1+2=3:3") + [codec.eos_id, codec.pad_id]])
    rollout = Rollout([codec.encode("1+2=")], ids, torch.tensor([[True] * 8 + [False]]))
    assert response_texts(policy, rollout) == ["1+2=3:3"]


def test_score_gradient_norms_are_each_responses_own():
    # One batched forward, one backward per row of it (rows of a causal LM batch are independent), against the
    # trainer's one forward per response: the same per-response gradient, whatever the padding around it.
    task = get_task("add2")
    policy = small_policy()
    problems = training_problems(task, 2, torch.Generator().manual_seed(0))
    rollout = policy.sample([policy.codec.encode(p.prompt) for p in problems for _ in range(3)], max_new_tokens=6,
                            temperature=1.0, generator=torch.Generator().manual_seed(1))
    params = policy.trainable_parameters()
    logprobs, _ = policy.token_stats(rollout)
    expected = []
    for i in range(len(rollout.prompt_ids)):
        grads = torch.autograd.grad(logprobs[i][rollout.response_mask[i]].sum(), params, retain_graph=True, allow_unused=True)
        expected.append(sum(float(g.double().pow(2).sum()) for g in grads if g is not None))
    got = score_grad_sq_norms(policy, rollout)
    assert got.min() > 0
    torch.testing.assert_close(got, torch.tensor(expected, dtype=torch.float64), rtol=1e-4, atol=0.0)


def test_branches_continue_each_pivot_and_are_scored_on_the_whole_answer():
    task = get_task("add2")
    policy = small_policy()
    problems = training_problems(task, 2, torch.Generator().manual_seed(0))
    G, K = 2, 3
    rollout = policy.sample([policy.codec.encode(p.prompt) for p in problems for _ in range(G)],
                            max_new_tokens=task.max_new_tokens, temperature=1.0, generator=torch.Generator().manual_seed(1))
    rewards = torch.tensor([0.0, 1.0, 0.0, 0.0])  # row 1 succeeded: never branched
    explorer = PivotExplorer(DeepGRPO(branches=K, segmentation="tokens", tokens_per_segment=1), seed=0)
    branches = sample_branches(explorer, policy, rollout, rewards, problems, G, task, 1.0, torch.Generator().manual_seed(2))
    assert branches.metrics["pivots"] == 3.0
    assert branches.parents.tolist() == [0] * K + [1] * K + [1] * K
    assert branches.pivot_ids.tolist() == [0] * K + [1] * K + [2] * K
    responses = [ids[m].tolist() for ids, m in zip(rollout.response_ids, rollout.response_mask)]
    for j in range(3 * K):
        row = [0, 2, 3][j // K]
        prompt = policy.codec.encode(problems[row // G].prompt)
        prefix = branches.rollout.prompt_ids[j][len(prompt):]
        assert branches.rollout.prompt_ids[j][: len(prompt)] == prompt
        assert prefix == responses[row][: len(prefix)]  # the pivot's prefix is the failed response's own start
        suffix = branches.rollout.response_ids[j][branches.rollout.response_mask[j]].tolist()
        answer = policy.codec.decode(prefix + suffix)
        assert branches.rewards[j] == task.reward(problems[row // G], answer)


def test_an_rl_step_trains_main_and_branch_rows():
    task = get_task("add2")
    policy = small_policy()
    # deep_grpo's parts without its group filter, which would drop every group of this all-failed step
    loss_fn = rlstab.load({"extends": "grpo", "dual_stream": {"kind": "dual-stream"}, "rollout": {
        "kind": "deep-grpo", "branches": 2, "segmentation": "tokens", "tokens_per_segment": 1}}).compile()
    explorer = PivotExplorer(loss_fn.objective.rollout, seed=0)
    optimizer = torch.optim.SGD(policy.trainable_parameters(), lr=0.0)
    config = TrainConfig(group_size=2, prompts_per_step=2, micro_batch_size=4, updates_per_step=2)
    problems = training_problems(task, 2, torch.Generator().manual_seed(0))
    metrics = rl_step(policy, optimizer, loss_fn, task, problems, torch.Generator().manual_seed(1), config,
                      explorer=explorer)
    # the untrained model fails all 4 responses: 4 pivots, 2 branches each, trained with the root rows
    assert metrics["layers"]["rollout/pivots"] == 4.0
    # two updates (one prompt each), each with its prompt's 2 pivots x 2 branches: 4 + 4 branch responses
    assert metrics["loss_metrics"]["step/branch_responses"] == 8.0
    assert len(metrics["prompt_rates"]) == 2 and metrics["zero_variance_groups"] == 1.0
