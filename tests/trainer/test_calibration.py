"""The warm start calibrated into a held-out accuracy band: the band rule, on a toy model."""

import pytest
import torch

from rlstab.trainer.calibration import CHECK_EVERY, banded_warm_start, distance, train_into_band
from rlstab.trainer.tasks import CharCodec, get_task
from rlstab.trainer.tiny_model import TinyConfig

TOY = TinyConfig(vocab_size=CharCodec().vocab_size, d_model=16, n_layer=1, n_head=2, d_ff=32, max_len=16)
TASK = get_task("perm3")


@pytest.mark.parametrize(
    ("accuracy", "expected"),
    [(0.6, 0.0), (0.5, 0.0), (0.75, 0.0), (0.25, 0.25), (0.9, 0.15)],  # 0.5 - 0.25; 0.9 - 0.75
)
def test_distance_to_the_band(accuracy, expected):
    assert distance(accuracy, (0.5, 0.75)) == pytest.approx(expected)


def test_the_first_check_inside_the_band_ends_the_warm_start():
    # Every accuracy lies in [0, 1], so the first check (after CHECK_EVERY = 5 steps) ends it.
    policy, facts = train_into_band(TASK, seed=0, band=(0.0, 1.0), max_steps=50, eval_size=16, config=TOY)
    assert facts["steps"] == CHECK_EVERY == 5 and facts["in_band"] is True
    assert 0.0 <= facts["accuracy"] <= 1.0


def test_a_band_never_reached_keeps_the_nearest_check_and_says_so():
    # A toy model cannot answer every held-out problem in 10 steps: accuracy 1 is never reached.
    _, facts = train_into_band(TASK, seed=0, band=(1.0, 1.0), max_steps=10, eval_size=16, config=TOY)
    assert facts["in_band"] is False and facts["steps"] in (5, 10)  # the two checks
    again, same = train_into_band(TASK, seed=0, band=(1.0, 1.0), max_steps=10, eval_size=16, config=TOY)
    assert same == facts  # deterministic


def test_the_calibrated_warm_start_is_cached_under_its_band(tmp_path):
    first = banded_warm_start(TASK, seed=1, band=(0.0, 1.0), max_steps=20, eval_size=16, cache_dir=tmp_path, config=TOY)
    again = banded_warm_start(TASK, seed=1, band=(0.0, 1.0), max_steps=20, eval_size=16, cache_dir=tmp_path, config=TOY)
    other = banded_warm_start(TASK, seed=1, band=(0.0, 0.9), max_steps=20, eval_size=16, cache_dir=tmp_path, config=TOY)
    assert (first.warm_start.cache_hit, again.warm_start.cache_hit, other.warm_start.cache_hit) == (False, True, False)
    assert again.warm_start.facts == first.warm_start.facts and first.warm_start.facts["steps"] == 5
    assert other.warm_start.key != first.warm_start.key
    for a, b in zip(first.model.state_dict().values(), again.model.state_dict().values()):
        assert torch.equal(a, b)


def test_a_band_upside_down_is_refused(tmp_path):
    with pytest.raises(ValueError, match="0 <= low <= high <= 1"):
        banded_warm_start(TASK, band=(0.8, 0.5), cache_dir=tmp_path, config=TOY)
