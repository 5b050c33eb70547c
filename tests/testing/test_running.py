"""rlstab.testing.running: a loss and its gradients by field, and a step of micro-batches, as a trainer runs them."""

import pytest
import torch

import rlstab
from rlstab.batch import LossOutput, TokenBatch
from rlstab.testing.running import gradients, loss_and_grad, run_step

# l = -A r summed over valid tokens, advantages as given
OBJECTIVE = {"advantage": {"kind": "given"}, "surrogate": {"kind": "none"}, "aggregation": {"kind": "token-sum", "count": "valid"}}


def batch() -> TokenBatch:
    """Two responses: lengths 2 and 1, A = (2, -1), log p = old log p (r = 1)."""
    logprobs = torch.tensor([[-1.0, -2.0], [-0.5, -3.0]])
    return TokenBatch(
        logprobs=logprobs, old_logprobs=logprobs.clone(), advantages=torch.tensor([2.0, -1.0]),
        response_mask=torch.tensor([[True, True], [True, False]]),
    )


def test_loss_and_grad_by_field():
    out, grad = loss_and_grad(rlstab.load(OBJECTIVE).compile(), batch())
    # L = -(2 * 1 + 2 * 1 + (-1) * 1) = -3; dL/dlogp_t = -A r_t (r = e^(logp - old) = 1), 0 on padding
    assert out.loss.item() == pytest.approx(-3.0)
    assert set(grad) == {"logprobs"}  # the batch carries no entropy
    assert torch.equal(grad["logprobs"], torch.tensor([[-2.0, -2.0], [1.0, 0.0]]))


def test_a_step_of_micro_batches_sums_to_the_whole():
    stats, total, grad, outs = run_step(rlstab.load(OBJECTIVE).compile(), batch(), [(0, 1), (1, 2)])
    # micro-batch 0: -(2 + 2) = -4; micro-batch 1: -(-1) = 1; total -3, as the whole batch
    assert [o.loss.item() for o in outs] == pytest.approx([-4.0, 1.0])
    assert total == pytest.approx(-3.0)
    assert torch.equal(grad["logprobs"], torch.tensor([[-2.0, -2.0], [1.0, 0.0]]))  # both land in one tensor
    assert (stats.counts.tokens_valid, stats.counts.sequences_valid) == (3, 2)  # gathered over both micro-batches


def test_gradients_are_zeros_for_a_leaf_the_loss_did_not_use():
    used, unused = torch.ones(2, requires_grad=True), torch.ones(3, requires_grad=True)
    (2.0 * used).sum().backward()
    grads = gradients({"a": used, "b": unused})
    assert torch.equal(grads["a"], torch.tensor([2.0, 2.0])) and torch.equal(grads["b"], torch.zeros(3))


def test_a_loss_that_is_no_loss_output_or_no_scalar_is_refused():
    with pytest.raises(AssertionError, match="returned float, not a LossOutput"):
        loss_and_grad(lambda b, step=None: 1.0, batch())
    with pytest.raises(AssertionError, match=r"the loss has shape \(2,\), not a scalar"):
        loss_and_grad(lambda b, step=None: LossOutput(b.logprobs[:, 0], {}), batch())
