"""Any memory layout of the batch's tensors gives the result of the contiguous batch, on every preset.

A trainer may hand over a transposed ``[T, B]`` buffer (column-major), a slice with a step, or a
per-response tensor ``expand``-ed to ``[B, T]`` (stride 0). The loss reads contiguous float32
copies where it needs them, so the loss, the gradient that reaches the caller's (non-contiguous)
``logprobs`` leaf and the metrics are exactly those of the contiguous batch, on both paths.
"""

from __future__ import annotations

import pytest
import torch

import rlstab
from rlstab import TokenBatch

from batches import column_major, random_batch, stepped, with_trainer_fields

PRESETS = rlstab.preset_names()
FIELDS = ["logprobs", "response_mask", "old_logprobs", "advantages", "entropy", "rollout_logprobs", "ref_logprobs",
          "is_weights", "rewards", "group_ids"]


def contiguous_batch(advantages: str | None) -> dict:
    b = random_batch(B=6, T=7, seed=3, advantages=advantages)
    fields = {f: getattr(b, f) for f in FIELDS}
    fields["logprobs"] = fields["logprobs"].detach()
    fields["is_weights"] = torch.rand(6, 7, generator=torch.Generator().manual_seed(4)) + 0.5
    return fields


def run(name: str, fields: dict, leaf: torch.Tensor, logprobs: torch.Tensor, path: str):
    objective = rlstab.load(name)
    loss_fn = objective.compile()
    batch = TokenBatch(**with_trainer_fields(objective, {**fields, "logprobs": logprobs}))
    out = loss_fn(batch) if path == "single" else loss_fn(batch, step=loss_fn.gather([batch]))
    out.loss.backward()
    return out, leaf.grad


@pytest.mark.parametrize("path", ["single", "gather"])
@pytest.mark.parametrize("advantages", ["token", None])
@pytest.mark.parametrize("layout", [column_major, stepped])
@pytest.mark.parametrize("name", PRESETS)
def test_strided_tensors_give_the_contiguous_result(name, layout, advantages, path):
    fields = contiguous_batch(advantages)
    reference_leaf = fields["logprobs"].clone().requires_grad_()
    expected, expected_grad = run(name, fields, reference_leaf, reference_leaf, path)

    strided = {f: None if v is None else layout(v) for f, v in fields.items()}
    leaf = strided["logprobs"].detach().requires_grad_()  # the caller's leaf, itself non-contiguous
    assert not leaf.is_contiguous() and not strided["response_mask"].is_contiguous()
    out, grad = run(name, strided, leaf, leaf, path)

    assert torch.equal(out.loss, expected.loss), name
    assert grad is not None and torch.equal(grad, expected_grad), name
    assert out.metrics == pytest.approx(expected.metrics, nan_ok=True, rel=0, abs=0), name


@pytest.mark.parametrize("name", PRESETS)
def test_expanded_tensors_give_the_contiguous_result(name):
    """Stride-0 views: per-response advantages and weights expanded to [B, T], one entropy row for
    every response, and logprobs an expanded [1, T] leaf (autograd sums its rows' gradients)."""
    fields = contiguous_batch("sequence")
    B, T = fields["logprobs"].shape
    fields["advantages"] = fields["advantages"][:, None].expand(B, T)
    fields["is_weights"] = fields["is_weights"][:, :1].expand(B, T)
    fields["entropy"] = fields["entropy"][:1].expand(B, T)
    fields["response_mask"] = fields["response_mask"][:1].expand(B, T)
    row = fields["logprobs"][:1].clone().requires_grad_()
    out, grad = run(name, fields, row, row.expand(B, T), "single")

    dense = {f: None if v is None else v.contiguous() for f, v in fields.items()}
    reference_leaf = row.detach().expand(B, T).contiguous().requires_grad_()
    expected, expected_grad = run(name, dense, reference_leaf, reference_leaf, "single")
    assert torch.equal(out.loss, expected.loss), name
    torch.testing.assert_close(grad, expected_grad.sum(0, keepdim=True), rtol=1e-6, atol=1e-7)


def test_integer_masks_in_a_column_major_buffer():
    """An int mask transposed in memory (``mask != 0`` keeps its strides): the case behind RuntimeError
    ``view size is not compatible`` before the boundary made the float32 views contiguous."""
    fields = contiguous_batch("sequence")
    reference_leaf = fields["logprobs"].clone().requires_grad_()
    expected, _ = run("grpo", fields, reference_leaf, reference_leaf, "single")
    fields["response_mask"] = column_major(fields["response_mask"].to(torch.int64))
    leaf = fields["logprobs"].clone().requires_grad_()
    out, _ = run("grpo", fields, leaf, leaf, "single")
    assert torch.equal(out.loss, expected.loss)
