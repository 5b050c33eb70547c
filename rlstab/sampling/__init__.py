"""The sample layer (``sampler:``): which prompts a step trains on. Executed by the trainer, not the loss.

- [`Goldilocks`][rlstab.sampling.Goldilocks]: a teacher predicts each prompt's utility sqrt(p (1 - p))
  for the current student and picks the most useful prompts of a candidate pool, epsilon-greedily;
  [`GoldilocksCurriculum`][rlstab.sampling.GoldilocksCurriculum] runs it (the embedded trainer and
  ``rlstab.adapters.verl.sampler.GoldilocksDataset`` in veRL use it).
"""

from rlstab.sampling.base import Sampler
from rlstab.sampling.goldilocks import (
    Goldilocks,
    GoldilocksCurriculum,
    HashedNgrams,
    select_prompts,
    utility,
)

__all__ = ["Sampler", "Goldilocks", "GoldilocksCurriculum", "HashedNgrams", "select_prompts", "utility"]
