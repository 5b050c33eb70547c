"""DEEP-GRPO's dual-stream loss on a tiny tree: main rows and one pivot's branches."""

import pytest
import torch

import rlstab

TOKEN_MEAN = {"kind": "token-mean", "count": "valid"}


def tree(requires_grad=True):
    # Main rows: 2 tokens with A = 1, 1 token with A = -1. Branch rows (the suffixes after one pivot): 1 token each, A = 1, 0.
    mask = torch.tensor([[1, 1], [1, 0], [1, 0], [1, 0]], dtype=torch.bool)
    logprobs = torch.full((4, 2), -1.0, requires_grad=requires_grad)
    return rlstab.TokenBatch(
        logprobs=logprobs, response_mask=mask, advantages=torch.tensor([1.0, -1.0, 1.0, 0.0]),
        is_branch=torch.tensor([False, False, True, True]),
    )


def objective(weight, aggregation=TOKEN_MEAN):
    return rlstab.load({"dual_stream": {"kind": "dual-stream", "branch_weight": weight}, "aggregation": aggregation,
                        "surrogate": {"kind": "ppo_clip"}}).compile()


def test_each_stream_is_a_token_mean_by_hand():
    b = tree()
    out = objective(0.5)(b)
    # on-policy, r = 1: l = -A. main: (-1 - 1 + 1) / 3 tokens = -1/3; branches: (-1 + 0) / 2 tokens = -0.5
    # L = -1/3 + 0.5 * -0.5 = -0.58333
    assert out.loss.item() == pytest.approx(-1 / 3 - 0.25)
    out.loss.backward()
    # dL/dlogp = -A / 3 on main tokens, -0.5 A / 2 on branch tokens, 0 on padding
    expected = torch.tensor([[-1 / 3, -1 / 3], [1 / 3, 0.0], [-0.25, 0.0], [0.0, 0.0]])
    assert torch.allclose(b.logprobs.grad, expected)
    assert out.metrics["step/branch_tokens_valid"] == 2.0


def test_seq_mean_token_mean_is_the_papers_per_trajectory_form():
    out = objective(1.0, {"kind": "seq-mean-token-mean", "count": "valid"})(tree())
    # main: mean over 2 responses of their token means (-1, +1) = 0; branches: mean of (-1, 0) = -0.5
    assert out.loss.item() == pytest.approx(-0.5)


def test_lambda_zero_is_plain_grpo_on_the_main_rows():
    torch.manual_seed(0)
    B, T = 8, 5
    logprobs = torch.randn(B, T) - 4.0  # log-probs at most 0
    old = logprobs + 0.1 * torch.randn(B, T)
    mask = torch.rand(B, T) > 0.2
    rewards = torch.tensor([1.0, 0.0, 1.0, 0.0, 1.0, 0.0, 0.0, 1.0])
    groups = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1])
    branch = groups == 1
    both = logprobs.clone().requires_grad_()
    out = rlstab.load({"extends": "grpo", "dual_stream": {"kind": "dual-stream", "branch_weight": 0.0}}).compile()(
        rlstab.TokenBatch(logprobs=both, old_logprobs=old, response_mask=mask, rewards=rewards, group_ids=groups,
                          is_branch=branch))
    out.loss.backward()
    main = logprobs[:4].clone().requires_grad_()
    plain = rlstab.load("grpo").compile()(rlstab.TokenBatch(
        logprobs=main, old_logprobs=old[:4], response_mask=mask[:4], rewards=rewards[:4], group_ids=groups[:4]))
    plain.loss.backward()
    assert out.loss.item() == pytest.approx(plain.loss.item(), abs=1e-7)
    assert torch.allclose(both.grad[:4], main.grad, atol=1e-7)
    assert both.grad[4:].abs().max() == 0.0


def test_split_over_micro_batches_gives_the_same_gradient():
    whole = tree()
    objective(0.5)(whole).loss.backward()
    compiled = objective(0.5)
    parts = [tree(), tree()]
    halves = []
    for b, rows in zip(parts, ([0, 2], [1, 3])):
        halves.append(rlstab.TokenBatch(
            logprobs=b.logprobs[rows], response_mask=b.response_mask[rows], advantages=b.advantages[rows],
            is_branch=b.is_branch[rows]))
    stats = compiled.gather(halves)
    for h in halves:
        compiled(h, step=stats).loss.backward()
    grad = torch.zeros(4, 2)
    grad[[0, 2]] += parts[0].logprobs.grad[[0, 2]]
    grad[[1, 3]] += parts[1].logprobs.grad[[1, 3]]
    assert torch.allclose(grad, whole.logprobs.grad)


def test_a_batch_without_branch_marks_names_the_field():
    b = tree()
    b.is_branch = None
    with pytest.raises(rlstab.BatchError, match=r"dual_stream \(dual-stream\) reads TokenBatch.is_branch"):
        objective(1.0)(b)


def test_is_branch_must_be_bool():
    with pytest.raises(rlstab.BatchError, match="is_branch must be a bool"):
        rlstab.TokenBatch(logprobs=torch.zeros(2, 2), response_mask=torch.ones(2, 2), is_branch=torch.tensor([0, 1]))
