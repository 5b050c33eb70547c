"""TRL adapter: [`RlstabGRPOTrainer`][rlstab.adapters.trl.RlstabGRPOTrainer], a ``trl.GRPOTrainer`` whose loss is an rlstab objective,
and [`RlstabAsyncGRPOTrainer`][rlstab.adapters.trl.async_loss.RlstabAsyncGRPOTrainer], the same for ``trl.experimental.async_grpo.AsyncGRPOTrainer``.

    from rlstab.adapters.trl import RlstabGRPOTrainer
    trainer = RlstabGRPOTrainer(objective="stapo", model=..., reward_funcs=..., args=GRPOConfig(...), train_dataset=...)
    trainer.train()

    from rlstab.adapters.trl import RlstabAsyncGRPOTrainer
    trainer = RlstabAsyncGRPOTrainer(objective="m2po", model="Qwen/...", reward_funcs=..., args=AsyncGRPOConfig(...), ...)

Importing this module imports ``trl`` (``pip install "rlstab[trl]"``); ``import rlstab`` does not.
``RlstabAsyncGRPOTrainer`` is imported on first use, so that the ``GRPOTrainer`` adapter does not
import TRL's experimental package.
"""

from rlstab.adapters.trl.compat import SUPPORTED_TRL
from rlstab.adapters.trl.loss import RlstabGRPOTrainer

__all__ = ["SUPPORTED_TRL", "RlstabAsyncGRPOTrainer", "RlstabGRPOTrainer"]


def __getattr__(name: str):
    if name == "RlstabAsyncGRPOTrainer":
        from rlstab.adapters.trl.async_loss import RlstabAsyncGRPOTrainer

        return RlstabAsyncGRPOTrainer
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
