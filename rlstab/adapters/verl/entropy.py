"""The actor engine's per-token entropy through ``rlstab.stats`` when the policy loss is rlstab's.

With ``calculate_entropy=True``, verl 0.9's FSDP engine computes the entropy from the
``[tokens, V]`` logits with ``entropy_from_logits`` (a softmax, a log-sum-exp and a product over
the whole vocabulary), inside the autograd graph: autograd keeps the ``[tokens, V]`` softmax for
a backward that is taken only when ``entropy_coeff`` is nonzero. An rlstab objective reads the
entropy detached (S2T, entropy quantiles, STARE's gate), so that memory and those passes buy
nothing. When the actor's loss is rlstab's, the engine's entropy function becomes
``rlstab.stats.token_stats_from_logits``: one pass over the logits the engine already has (fused
Triton kernels on CUDA, chunked torch code elsewhere), keeping a few numbers per token. Its
gradient is still exact (recomputed from the logits in backward), so verl's entropy bonus works
unchanged on top of an rlstab objective.

On a GPU without Triton, rlstab's torch path is slower than verl's function (measured on an H100:
130 ms against 26 ms at 16,384 x 151,936 bf16 logits, for 0.03 GiB against 9.3 GiB; ``docs/gpu.md``),
so rlstab's function then calls verl's: rlstab's entropy runs where it is the fast one, on CUDA logits
with Triton (every CUDA build of torch ships it) and on the CPU.

Where: ``TrainingWorker.set_loss_fn`` is where a worker learns its loss, ``partial(ppo_loss,
config=actor_config)``; the wrap looks at that config and, for ``loss_mode=rlstab`` with
``policy_loss.entropy_function=rlstab`` (the default), replaces the engine's
``compute_entropy_from_logits``. Engines without that attribute (Megatron's vocabulary-parallel
entropy) and verl's fused-kernel path (``use_fused_kernels``, which never builds the logits) keep
their own. ``use_remove_padding=False`` calls verl's function directly and also keeps it.
"""

from __future__ import annotations

import functools
import logging

from rlstab.adapters.patching import patch_once
from rlstab.lazy import torch
from rlstab.stats import token_stats_from_logits
from rlstab.stats.from_logits import runs_fused

_log = logging.getLogger(__name__)


def entropy_from_logits(logits: torch.Tensor, chunk_size: int | None = None) -> torch.Tensor:
    """Entropy of ``softmax(logits)`` per row, float32, with an exact gradient when one is asked for.

    Same signature as verl's ``entropy_from_logits_with_chunking``; ``chunk_size`` is accepted and
    ignored, because rlstab picks its own work sizes (no chunks in the Triton kernels on CUDA,
    ``default_chunk_rows`` on the torch path). On a GPU without Triton it is verl's own
    ``entropy_from_logits``, which is faster there than rlstab's torch path.
    """
    if logits.device.type != "cpu" and not runs_fused(logits):
        from verl.utils.torch_functional import entropy_from_logits as verls

        return verls(logits)
    return token_stats_from_logits(logits, None, entropy_grad=True)[1]


def wrap_set_loss_fn(training_worker_class: type) -> None:
    """After ``TrainingWorker.set_loss_fn``, give the engine rlstab's entropy if the loss is rlstab's (idempotent)."""
    patch_once(training_worker_class, "set_loss_fn", _giving_entropy, key=__name__)


def _giving_entropy(original):
    @functools.wraps(original)  # keeps verl's dispatch registration (function attributes)
    def set_loss_fn(self, loss_fn):
        result = original(self, loss_fn)
        use_rlstab_entropy(getattr(self, "engine", None), loss_fn)
        return result

    return set_loss_fn


def use_rlstab_entropy(engine, loss_fn) -> bool:
    """Replace ``engine.compute_entropy_from_logits`` when ``loss_fn`` is verl's loss with rlstab's config.

    Returns whether it did.
    """
    # veRL's config classes: imported with veRL
    from rlstab.adapters.verl.config import RlstabPolicyLossConfig

    config = getattr(loss_fn, "keywords", {}).get("config")  # partial(ppo_loss, config=actor_config)
    policy_loss = getattr(config, "policy_loss", None)
    if not isinstance(policy_loss, RlstabPolicyLossConfig) or policy_loss.entropy_function != "rlstab":
        return False
    if not hasattr(engine, "compute_entropy_from_logits"):
        _log.info("rlstab: %s computes entropy its own way; kept", type(engine).__name__)
        return False
    engine.compute_entropy_from_logits = entropy_from_logits
    return True
