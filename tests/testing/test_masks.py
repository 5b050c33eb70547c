"""rlstab.testing.masks: the silenced-token check passes a binary mask that fires, and refuses a mask that
silences nothing, silences everything, or is no mask."""

import pytest

from rlstab.masks.expression import Expression
from rlstab.masks.s2t import S2T
from rlstab.regularisers.kl import KLPenalty
from rlstab.testing.masks import check_silenced_tokens_get_zero_gradient

PREFIX = "masks kind 'expression' (rlstab.masks.expression.Expression): check_silenced_tokens_get_zero_gradient: "


def test_a_mask_that_fires_on_the_kits_batch_passes():
    check_silenced_tokens_get_zero_gradient(S2T())
    check_silenced_tokens_get_zero_gradient(Expression(silence="position < 3"))


def test_a_mask_that_silences_nothing_proves_nothing():
    with pytest.raises(AssertionError) as caught:
        check_silenced_tokens_get_zero_gradient(Expression(keep="position >= 0"))
    assert str(caught.value).startswith(PREFIX + "silences no valid token of the kit's batch")


def test_a_mask_that_silences_everything_proves_nothing():
    with pytest.raises(AssertionError) as caught:
        check_silenced_tokens_get_zero_gradient(Expression(silence="position >= 0"))
    assert str(caught.value) == PREFIX + "silences every valid token of the kit's batch: the check would prove nothing"


def test_it_applies_to_masks_only():
    with pytest.raises(AssertionError, match="check_silenced_tokens_get_zero_gradient: applies to masks only"):
        check_silenced_tokens_get_zero_gradient(KLPenalty())
