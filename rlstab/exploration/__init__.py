"""The exploration layer: how rollouts are generated (``rollout:``), and the loss of what it generates.

- [`DeepGRPO`][rlstab.exploration.DeepGRPO] (``rollout:``): branch K continuations from pivots of
  failed responses, chosen by utility P_phi(success | depth) (t/T)^gamma; executed by the trainer
  (rlstab's embedded trainer; veRL needs the authors' agent loop);
- [`DualStream`][rlstab.exploration.DualStream] (``dual_stream:``): the loss of the main rollouts
  plus lambda times that of the branches, each aggregated on its own; usable by any trainer that
  feeds branch rows (``TokenBatch.is_branch``).
"""

from rlstab.exploration.base import Rollout, StreamWeighting
from rlstab.exploration.deep_grpo import DeepGRPO, RecoverabilityModel, pivot_probabilities, segment_ends
from rlstab.exploration.dual_stream import DualStream

__all__ = ["DeepGRPO", "DualStream", "Rollout", "StreamWeighting", "RecoverabilityModel", "pivot_probabilities", "segment_ends"]
