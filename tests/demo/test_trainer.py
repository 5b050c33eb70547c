"""The RL loop: the step API makes an update independent of the micro-batch size; metrics add up correctly."""

import copy

import pytest
import torch

import rlstab
from rlstab.demo.tasks import CharCodec, get_task, training_problems
from rlstab.demo.tiny_model import TinyConfig, TinyPolicy
from rlstab.demo.trainer import TrainConfig, _token_stats_no_grad, aggregate_metrics, response_texts, update


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


def test_aggregate_metrics_adds_counts_and_weights_fractions():
    a = {"tokens/valid": 10.0, "tokens/kept": 8.0, "tokens/kept_fraction": 0.8, "mask/s2t/silenced": 2.0,
         "mask/s2t/kept": 8.0, "mask/s2t/entropy_threshold": 0.5, "clip/high_fraction": 0.1, "loss": 1.0,
         "loss/policy": 1.0, "step/tokens_valid": 40.0}
    b = {"tokens/valid": 30.0, "tokens/kept": 30.0, "tokens/kept_fraction": 1.0, "mask/s2t/silenced": 0.0,
         "mask/s2t/kept": 30.0, "mask/s2t/entropy_threshold": 0.5, "clip/high_fraction": 0.0, "loss": 2.0,
         "loss/policy": 2.0, "step/tokens_valid": 40.0}
    out = aggregate_metrics([a, b])
    assert out["tokens/valid"] == 40 and out["tokens/kept"] == 38 and out["mask/s2t/silenced"] == 2
    assert out["tokens/kept_fraction"] == pytest.approx(38 / 40)
    assert out["clip/high_fraction"] == pytest.approx(1 / 40)
    assert out["loss"] == 3.0 and out["loss/policy"] == 3.0
    assert out["mask/s2t/entropy_threshold"] == 0.5 and out["step/tokens_valid"] == 40


def test_response_texts_drop_eos_and_padding():
    policy = small_policy()
    codec = policy.codec
    from rlstab.demo.policy import Rollout

    ids = torch.tensor([codec.encode("1+2=3:3") + [codec.eos_id, codec.pad_id]])
    rollout = Rollout([codec.encode("1+2=")], ids, torch.tensor([[True] * 8 + [False]]))
    assert response_texts(policy, rollout) == ["1+2=3:3"]
