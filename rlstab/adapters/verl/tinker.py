"""veRL's Tinker-style worker (``verl.workers.engine_workers_tinker.TinkerTrainingWorker``) refused at start-up.

Its ``forward_backward`` calls the loss without ``TrainingWorker.train_batch``, where the rlstab loss's
default ``step_statistics: optimizer_step`` gathers the step's statistics: without this check the run
stops at its first micro-batch. The wrapper of ``set_loss_fn`` (called when the worker is built)
refuses that combination there, in one line naming the setting; ``local`` or ``data_parallel`` run.
"""

from __future__ import annotations

import functools

from rlstab.adapters.patching import patch_once
from rlstab.adapters.verl.config import CONFIG_PATH, RlstabPolicyLossConfig


def refusal(loss_fn) -> str | None:
    """Why the Tinker worker cannot run ``loss_fn`` (veRL's ``partial(ppo_loss, config=...)``), or None."""
    config = getattr(loss_fn, "keywords", {}).get("config")
    policy_loss = getattr(config, "policy_loss", None)
    if isinstance(policy_loss, RlstabPolicyLossConfig) and policy_loss.step_statistics == "optimizer_step":
        return (
            f"{CONFIG_PATH}.step_statistics = 'optimizer_step' needs TrainingWorker.train_batch, which veRL's "
            "Tinker-style worker (TinkerTrainingWorker.forward_backward) does not call; set step_statistics=local "
            "(each call its own step) or data_parallel"
        )
    return None


def wrap_tinker_worker(worker_class: type) -> None:
    """Refuse, in ``worker_class.set_loss_fn``, an rlstab loss the Tinker worker cannot run (idempotent)."""
    patch_once(worker_class, "set_loss_fn", _refusing, key=__name__)


def _refusing(original):
    @functools.wraps(original)  # keeps verl's dispatch registration (function attributes)
    def set_loss_fn(self, loss_fn):
        problem = refusal(loss_fn)
        if problem is not None:
            raise RuntimeError(problem)
        return original(self, loss_fn)

    return set_loss_fn
