"""Step-level components: they act on the step's data and rewards, or hand the trainer a factor.

- [`DynamicSampling`][rlstab.step.DynamicSampling] (``group_filter:``), with
  [`filter_groups`][rlstab.step.filter_groups] for trainers that filter before training;
- [`OverlongPenalty`][rlstab.step.OverlongPenalty] (``reward_shaping:``), with
  [`overlong_penalty`][rlstab.step.overlong_penalty];
- [`ESSLearningRateScale`][rlstab.step.ESSLearningRateScale] (``lr_scale:``), with
  [`ess_lr_scale`][rlstab.step.ess_lr_scale]: returned as ``StepStats.lr_scale``.
"""

from rlstab.step.base import GroupFilter, LearningRateScale, RewardShaping
from rlstab.step.dynamic_sampling import DynamicSampling, filter_groups, uniform_groups
from rlstab.step.ess import ESSLearningRateScale, effective_sample_size, ess_lr_scale
from rlstab.step.level import StepLevel, fit_step_level, shaped_rewards
from rlstab.step.overlong import OverlongPenalty, overlong_penalty

__all__ = [
    "DynamicSampling",
    "GroupFilter",
    "LearningRateScale",
    "ESSLearningRateScale",
    "OverlongPenalty",
    "RewardShaping",
    "StepLevel",
    "effective_sample_size",
    "ess_lr_scale",
    "filter_groups",
    "fit_step_level",
    "overlong_penalty",
    "shaped_rewards",
    "uniform_groups",
]
