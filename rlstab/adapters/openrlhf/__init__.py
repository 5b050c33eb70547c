"""OpenRLHF adapter: any rlstab objective as OpenRLHF 0.11.2's policy loss.

Start a run with the launcher, which takes OpenRLHF's own ``train_ppo_ray`` arguments::

    python -m rlstab.adapters.openrlhf --objective stapo <train_ppo_ray arguments>

It validates the objective in the driver, then runs ``openrlhf.cli.train_ppo_ray`` with a Ray
``worker_process_setup_hook`` ([`setup_hook`][rlstab.adapters.openrlhf.hook.setup_hook]) that,
in every Ray worker, makes OpenRLHF's ``ActorPPOTrainer`` build
[`RlstabPolicyLoss`][rlstab.adapters.openrlhf.RlstabPolicyLoss] instead of ``PolicyLoss``, and
(when the objective reads entropy) wraps ``Actor.forward`` to hand the loss the per-token
entropy, detached ([`entropy`][rlstab.adapters.openrlhf.entropy]).

Importing this package is cheap (the launcher validates objectives before anything heavy is
imported): ``RlstabPolicyLoss``, which loads OpenRLHF's loss module and deepspeed, is imported on
first access.
"""

from rlstab.adapters.openrlhf.config import OBJECTIVE_ENV, build_objective
from rlstab.adapters.openrlhf.hook import install
from rlstab.adapters.openrlhf.source import SUPPORTED_OPENRLHF

__all__ = ["OBJECTIVE_ENV", "SUPPORTED_OPENRLHF", "RlstabPolicyLoss", "build_objective", "install"]


def __getattr__(name):
    if name == "RlstabPolicyLoss":
        from rlstab.adapters.openrlhf.loss import RlstabPolicyLoss

        return RlstabPolicyLoss
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
