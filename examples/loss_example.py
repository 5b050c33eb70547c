"""The stapo objective on a small random batch: loss, gradient and what each component did.

Run: python examples/loss_example.py
"""

import math

import torch

import rlstab

torch.manual_seed(0)
B, T = 8, 64  # 8 responses (2 prompts x 4 samples), up to 64 tokens each

# A policy that is confident on most tokens, with a tail of unlikely ones.
logprobs = -torch.distributions.Exponential(4.0).sample((B, T))
logprobs[torch.rand(B, T) < 0.02] = math.log(1e-3)
logprobs.requires_grad_()
lengths = torch.randint(T // 2, T + 1, (B,))
batch = rlstab.TokenBatch(
    logprobs=logprobs,
    old_logprobs=logprobs.detach() + 0.05 * torch.randn(B, T),
    response_mask=torch.arange(T) < lengths[:, None],
    entropy=torch.distributions.Exponential(2.0).sample((B, T)),
    rewards=torch.tensor([1.0, 0.0, 1.0, 1.0, 0.0, 0.0, 1.0, 0.0]),
    group_ids=torch.tensor([0, 0, 0, 0, 1, 1, 1, 1]),
)

loss_fn = rlstab.load("stapo").compile()
out = loss_fn(batch)  # advantages come from the rewards with the objective's GRPO estimator
out.loss.backward()

print(f"loss = {out.loss.item():.6f}, |grad| = {logprobs.grad.norm():.6f}")
for name, value in out.metrics.items():
    print(f"  {name:32s} {value:.6g}")
