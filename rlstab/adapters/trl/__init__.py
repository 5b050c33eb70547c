"""TRL adapter: [`RlstabGRPOTrainer`][rlstab.adapters.trl.RlstabGRPOTrainer], a ``trl.GRPOTrainer`` whose loss is an rlstab objective.

    from rlstab.adapters.trl import RlstabGRPOTrainer
    trainer = RlstabGRPOTrainer(objective="stapo", model=..., reward_funcs=..., args=GRPOConfig(...), train_dataset=...)
    trainer.train()

Importing this module imports ``trl`` (``pip install "rlstab[trl]"``); ``import rlstab`` does not.
"""

from rlstab.adapters.trl.compat import SUPPORTED_TRL
from rlstab.adapters.trl.loss import RlstabGRPOTrainer

__all__ = ["SUPPORTED_TRL", "RlstabGRPOTrainer"]
