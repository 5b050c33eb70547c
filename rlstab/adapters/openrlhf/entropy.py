"""The current policy's per-token entropy, detached, from the logits OpenRLHF's actor already has.

OpenRLHF 0.11.2's ``ActorPPOTrainer.training_step`` calls ``Actor.forward(..., return_output=True,
return_entropy=<--actor.entropy_coef is set>)`` and passes only the log-probs to the loss. With
``return_entropy=True``, ``Actor.forward`` computes the entropy from its float32,
temperature-scaled logits with ``compute_entropy`` (full vocabulary, *with* gradient, for the
entropy bonus), lays it out like the log-probs (un-packing ``--ds.packing_samples`` batches,
gathering ring-attention shards) and stores it as ``output.entropy``.

rlstab's masks need that entropy, detached, and must not switch on the bonus (which would add a
second backward through B x T x V). So [`wrap_actor_forward`][rlstab.adapters.openrlhf.entropy.wrap_actor_forward]
replaces ``Actor.forward`` by a wrapper that, on training forwards only (grad enabled, an
``action_mask``, ``return_output=True``):

1. asks the original forward for the entropy (``return_entropy=True``) while
   ``compute_entropy`` *in the actor module's namespace* is switched to
   [`detached_entropy`][rlstab.adapters.openrlhf.entropy.detached_entropy] (no_grad, one pass
   of [`rlstab.stats`][rlstab.stats]), so OpenRLHF's own code still does the layout, and
   nothing else changes;
2. restores ``output.entropy`` to what the caller asked for (absent unless it asked);
3. attaches the action tokens' entropy ``[B, A]`` to the returned log-prob tensor as
   ``_rlstab_entropy``, where [`RlstabPolicyLoss`][rlstab.adapters.openrlhf.RlstabPolicyLoss]
   reads it. The entropy travels with the very tensor the loss receives, so it cannot be
   paired with another micro-batch's log-probs.

When the caller asked for the entropy itself (``--actor.entropy_coef`` set), OpenRLHF's entropy
with gradient is computed as usual and a detached view of it is attached: no extra work.
Forwards under no_grad (old log-probs, reference and EMA models) are left alone.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
from collections.abc import Iterator
from contextvars import ContextVar

from rlstab.adapters.patching import patch_once
from rlstab.lazy import torch
from rlstab.stats import token_stats_from_logits
from rlstab.stats.from_logits import runs_fused

ENTROPY_ATTRIBUTE = "_rlstab_entropy"

_DETACHED: ContextVar[bool] = ContextVar("rlstab_openrlhf_detached_entropy", default=False)


def detached_entropy(logits: torch.Tensor, chunk_rows: int | None = None) -> torch.Tensor:
    """Entropy of softmax(logits) over the last dimension, detached, ``chunk_rows`` rows at a time.

    H = logsumexp(z) - sum_v softmax(z)_v z_v, by
    [`token_stats_from_logits`][rlstab.stats.token_stats_from_logits]: one pass over the logits
    (fused Triton kernels on CUDA, where ``chunk_rows`` is ignored; elsewhere chunks of
    ``chunk_rows`` tokens through a float32 buffer, None: about 16 MiB of it on CPU), instead of
    a softmax and a product of the logits' full size. Returned in the logits' dtype (float32 in
    OpenRLHF's actor), as OpenRLHF's ``compute_entropy`` returns it.
    """
    with torch.no_grad():
        _, entropy = token_stats_from_logits(logits, None, chunk_size=chunk_rows)
    return entropy.to(logits.dtype)


def entropy_of(log_probs: torch.Tensor) -> torch.Tensor | None:
    """The detached entropy that the wrapped forward attached to ``log_probs``, or None."""
    return getattr(log_probs, ENTROPY_ATTRIBUTE, None)


@contextlib.contextmanager
def detached_compute_entropy() -> Iterator[None]:
    """Within it, the switched ``compute_entropy`` is [`detached_entropy`][rlstab.adapters.openrlhf.entropy.detached_entropy].

    For the step-wide statistics' no-grad forwards, which ask ``Actor.forward`` for its entropy
    themselves (``return_entropy=True``): the wrapper above leaves no-grad forwards alone, and
    OpenRLHF's own ``compute_entropy`` would materialise a full-vocabulary softmax.
    """
    token = _DETACHED.set(True)
    try:
        yield
    finally:
        _DETACHED.reset(token)


def switch_compute_entropy(actor_module) -> None:
    """In ``openrlhf.models.actor``, make ``compute_entropy`` detached while a wrapped forward asks for it (idempotent)."""
    patch_once(actor_module, "compute_entropy", _switching, key=__name__)


def _switching(original):
    @functools.wraps(original)
    def compute_entropy(logits):
        if not _DETACHED.get():
            return original(logits)
        if logits.device.type == "cpu" or runs_fused(logits):
            return detached_entropy(logits)
        with torch.no_grad():  # a GPU without Triton: OpenRLHF's own function is the faster one there
            return original(logits)

    return compute_entropy


def wrap_actor_forward(actor_class) -> None:
    """Replace ``actor_class.forward`` (OpenRLHF's ``Actor``) by the entropy-attaching wrapper (idempotent)."""
    patch_once(actor_class, "forward", _attaching_entropy, key=__name__)


def _attaching_entropy(original):
    signature = inspect.signature(original)

    @functools.wraps(original)
    def forward(self, *args, **kwargs):
        bound = signature.bind(self, *args, **kwargs)
        bound.apply_defaults()
        arguments = bound.arguments
        if not (torch.is_grad_enabled() and arguments["action_mask"] is not None and arguments["return_output"]):
            return original(self, *args, **kwargs)
        asked = bool(arguments["return_entropy"])
        arguments["return_entropy"] = True
        token = _DETACHED.set(not asked)
        try:
            log_probs, output = original(*bound.args, **bound.kwargs)
        finally:
            _DETACHED.reset(token)
        entropy = output.entropy
        if not asked:
            delattr(output, "entropy")  # the caller did not ask for it: its output stays as it was
        action_mask = arguments["action_mask"]
        setattr(log_probs, ENTROPY_ATTRIBUTE, entropy[:, -action_mask.shape[1] :].detach())
        return log_probs, output

    return forward
