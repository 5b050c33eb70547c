"""rlstab.testing.padding: padding filled with anything changes nothing, and a batch without a valid token
gives a zero loss; each check fails on a component that breaks it."""

from typing import Literal

import pytest
import torch

import rlstab
from rlstab.aggregation import Aggregation
from rlstab.batch import TokenBatch
from rlstab.masks.base import Mask, below
from rlstab.masks.s2t import S2T
from rlstab.registry import isolated
from rlstab.testing.padding import (
    EXTRA_ROWS,
    FILLS,
    check_no_valid_token_gives_zero_loss,
    check_padding_changes_nothing,
    padded,
)


class BatchMaxMask(Mask):
    """Reads padding across rows: keep iff the entropy is below the batch's maximum over every position."""

    kind: Literal["kit-batch-max"] = "kit-batch-max"
    reads = frozenset({"entropy"})

    def keep(self, t, threshold):
        return below(t.entropy, t.entropy.max())

    def describe(self) -> str:
        return "kit-batch-max: keep iff H < max H"


class UnclampedTokenMean(Aggregation):
    """Divides by the step's token count without a floor: 1 / 0 on a step without a valid token."""

    kind: Literal["kit-unclamped-mean"] = "kit-unclamped-mean"

    def scale(self, step, row_tokens):
        return step.world_size / torch.tensor(step.tokens(self.count), dtype=torch.float32)

    def describe(self) -> str:
        return "kit-unclamped-mean: sum over tokens / number of tokens (unfloored)"


@pytest.fixture(scope="module", autouse=True)
def registered():
    with isolated():
        rlstab.register(BatchMaxMask)
        rlstab.register(UnclampedTokenMean)
        yield


def test_padded_fills_every_padding_position_and_appends_two_rows():
    batch = TokenBatch(
        logprobs=torch.tensor([[-1.0, -2.0]]), old_logprobs=torch.tensor([[-1.5, -2.5]]),
        advantages=torch.tensor([0.5]), group_ids=torch.tensor([3]), response_mask=torch.tensor([[True, False]]),
    )
    out = padded(batch, [7.0])
    # 1 row + EXTRA_ROWS (2) rows of padding; a valid token keeps its value, every padding position holds 7
    assert EXTRA_ROWS == 2 and out.response_mask.tolist() == [[True, False], [False, False], [False, False]]
    assert out.logprobs.tolist() == [[-1.0, 7.0], [7.0, 7.0], [7.0, 7.0]]
    assert out.old_logprobs.tolist() == [[-1.5, 7.0], [7.0, 7.0], [7.0, 7.0]]
    assert out.advantages.tolist() == [0.5, 7.0, 7.0]  # per response: the rows without a response token
    assert out.group_ids.tolist() == [3, 10_001, 10_002]  # padding rows get ids no response has
    assert out.logprobs.requires_grad and not out.old_logprobs.requires_grad


def test_the_fills_include_non_finite_and_overflowing_values():
    values = [v for fills in FILLS.values() for v in fills]
    assert any(v != v for v in values) and float("inf") in values and float("-inf") in values
    assert 3e38 in values  # 3e38 * 2 overflows float32 (max 3.4e38)


def test_a_component_blind_to_padding_passes():
    check_padding_changes_nothing(S2T())
    check_no_valid_token_gives_zero_loss(S2T())


def test_a_mask_reading_padding_of_other_rows_fails():
    with pytest.raises(AssertionError) as caught:
        check_padding_changes_nothing(BatchMaxMask())
    message = str(caught.value)
    assert message.startswith("masks kind 'kit-batch-max' (") and "check_padding_changes_nothing: padding filled with" in message


def test_a_loss_without_a_floor_on_its_denominator_fails_on_a_batch_without_tokens():
    with pytest.raises(AssertionError) as caught:
        check_no_valid_token_gives_zero_loss(UnclampedTokenMean(count="valid"))
    message = str(caught.value)
    # 0 valid tokens: scale = 1 / 0 = inf, and 0 * inf = NaN in the loss, which the compiled objective refuses
    assert "check_no_valid_token_gives_zero_loss: raised FloatingPointError: the loss is not finite" in message, message
