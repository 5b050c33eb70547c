"""rlstab.sampling.base: the sampler family, executed by a trainer through a seeded curriculum."""

from typing import Literal

import pytest

from rlstab.registry import family_of
from rlstab.sampling.base import Sampler
from rlstab.sampling.goldilocks import Goldilocks, GoldilocksCurriculum


class NoCurriculum(Sampler):
    kind: Literal["kit-no-curriculum"] = "kit-no-curriculum"


def test_the_family():
    assert family_of(NoCurriculum).name == "sampler" and family_of(Goldilocks).name == "sampler"
    assert family_of(Goldilocks).scope == "trainer"  # the loss never runs it


def test_a_sampler_without_a_curriculum_says_so():
    with pytest.raises(NotImplementedError):
        NoCurriculum().curriculum(0)


def test_a_builtin_curriculum_has_the_runtime_interface():
    # the interface the base's docstring names, on the class (building one builds its teacher's optimizer)
    for name in ("pool_size", "choose", "observe", "state_dict", "load_state_dict"):
        assert callable(getattr(GoldilocksCurriculum, name, None)), name
