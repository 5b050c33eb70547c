"""veRL adapter: ``policy_loss.loss_mode=rlstab`` in verl 0.9.x.

``import verl`` loads this module in every process (driver and Ray workers) through the
``verl.plugins`` entry point that rlstab declares, so nothing has to be imported by hand. On
import it:

1. registers the policy loss ``rlstab`` in verl's ``POLICY_LOSS_REGISTRY``
   ([`rlstab_policy_loss`][rlstab.adapters.verl.loss.rlstab_policy_loss]);
2. wraps ``verl.workers.utils.losses.ppo_loss`` so that the loss can read the model output's
   per-token entropy (verl hands entropy only to its entropy bonus)
   ([`model_output`][rlstab.adapters.verl.model_output]);
3. adds start-up checks to ``ActorConfig`` (entropy switched on when the objective reads it,
   ``loss_mode`` and ``_target_`` consistent) ([`check_actor`][rlstab.adapters.verl.config.check_actor]);
4. wraps ``TrainingWorker.set_loss_fn`` so that an actor whose loss is rlstab's computes its
   entropy with ``rlstab.stats`` instead of keeping a ``[tokens, V]`` softmax in the graph
   ([`entropy`][rlstab.adapters.verl.entropy]);
5. wraps ``apply_bypass_mode`` so that veRL's bypass mode keeps an rlstab loss instead of replacing
   it by veRL's own ([`bypass`][rlstab.adapters.verl.bypass]);
6. refuses, when its loss is set, veRL's Tinker-style worker with ``step_statistics: optimizer_step``,
   which it cannot run (``rlstab.adapters.verl.tinker``).

The objective is chosen in verl's config with
[`RlstabPolicyLossConfig`][rlstab.adapters.verl.config.RlstabPolicyLossConfig]; see the docs page
"veRL" for the Hydra overrides.
"""

from rlstab.adapters.verl.config import RlstabPolicyLossConfig
from rlstab.adapters.verl.install import SUPPORTED_VERL, install

install()

__all__ = ["SUPPORTED_VERL", "RlstabPolicyLossConfig", "install"]
