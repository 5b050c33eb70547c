"""``rlstab.stats.arguments``: the argument checks the token statistics' torch and Triton paths share."""

import pytest
import torch

from rlstab.stats.arguments import check_logits_arguments

LOGITS = torch.zeros(2, 3, 5)  # [B, T, V]
LABELS = torch.zeros(2, 3, dtype=torch.long)


def test_sound_arguments_pass():
    check_logits_arguments(LOGITS, LABELS, 1.0, None)
    check_logits_arguments(LOGITS, None, 0.7, 1)  # no labels; the smallest chunk


@pytest.mark.parametrize("temperature", [0.0, -1.0, float("nan")])
def test_temperature_must_be_positive(temperature):
    with pytest.raises(ValueError, match=f"temperature must be > 0, got {temperature}"):
        check_logits_arguments(LOGITS, LABELS, temperature, None)


def test_chunk_size_must_be_at_least_one():
    with pytest.raises(ValueError, match="chunk_size must be >= 1, got 0"):
        check_logits_arguments(LOGITS, LABELS, 1.0, 0)


def test_labels_must_have_the_logits_shape_without_the_vocabulary():
    with pytest.raises(ValueError, match=r"labels \(2, 5\) must be logits' shape without its last dimension \(2, 3, 5\)"):
        check_logits_arguments(LOGITS, torch.zeros(2, 5, dtype=torch.long), 1.0, None)
