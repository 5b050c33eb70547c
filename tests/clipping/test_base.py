"""``rlstab.clipping.base``: what every surrogate provides, and the two helpers its closed forms use."""

import pytest
import torch

from rlstab.batch import TokenBatch
from rlstab.clipping.base import Surrogate, SurrogateResult, indicator, unclamped
from rlstab.tokens import Tokens


def test_indicator_is_a_float_zero_one_compare():
    out = indicator(torch.gt, torch.tensor([0.5, 1.0, 1.5]), 1.0)
    assert out.dtype == torch.float32 and out.tolist() == [0.0, 0.0, 1.0]
    assert indicator(torch.le, torch.tensor([0.5, 1.0, 1.5]), 1.0).tolist() == [1.0, 1.0, 0.0]


def test_unclamped_is_one_where_the_log_ratio_kept_its_value():
    # log_ratio_clamp 1: log-ratios 0.5, 1.5, -2, -0.25 -> clamped to 0.5, 1, -1, -0.25; |x| < 1 at tokens 0 and 3
    old = torch.tensor([[-1.0, -2.0, -1.0, -1.0]])
    logprobs = old + torch.tensor([[0.5, 1.5, -2.0, -0.25]])
    batch = TokenBatch(logprobs=logprobs, old_logprobs=old, response_mask=torch.ones(1, 4, dtype=torch.bool),
                       advantages=torch.ones(1))
    assert unclamped(Tokens.from_batch(batch, 1.0)).tolist() == [[1.0, 0.0, 0.0, 1.0]]


def test_a_surrogate_must_implement_evaluate():
    with pytest.raises(NotImplementedError):
        Surrogate.evaluate(object(), None, None)


def test_a_result_carries_the_loss_its_gradient_and_counts():
    result = SurrogateResult(torch.tensor(1.0), torch.zeros(1, 2), {"clip/high_fraction": torch.tensor(0.0)})
    assert (result.loss.item(), result.grad.shape, list(result.counts)) == (1.0, (1, 2), ["clip/high_fraction"])
