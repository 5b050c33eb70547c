"""Let a registered policy loss see the model output (for the per-token entropy) and the data-parallel group.

verl 0.9's ``ppo_loss(config, model_output, data, dp_group)`` holds the entropy the engine
computed (``model_output["entropy"]``, present when ``actor.calculate_entropy`` is on) but calls
the registered policy loss with log-probs, advantages and masks only. The narrowest fix is to
wrap ``ppo_loss`` so that, while it runs, the model output and the micro-batch are visible to the
rlstab loss through a context variable; ``ppo_loss`` itself runs unchanged.

Modules that bound ``ppo_loss`` by ``from ... import ppo_loss`` before the wrap are patched too;
modules imported later bind the wrapped function.

The way back: ``ppo_loss`` wraps every metric of a policy loss as a mean over micro-batches
(``Metric.from_dict(..., AggregationType.MEAN)``, and refuses a loss's own ``Metric`` of another
kind). The rlstab loss hands its metrics with the aggregation each needs to
[`declare_metrics`][rlstab.adapters.verl.model_output.declare_metrics], and the wrapper puts them in
``ppo_loss``'s result in place of the means ([`metrics`][rlstab.adapters.verl.metrics]).
"""

from __future__ import annotations

import functools
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

from rlstab.adapters.patching import patch_once
from rlstab.lazy import torch


@dataclass
class _Call:
    """One running ``ppo_loss`` call: what it was given, and the metrics the rlstab loss declared in it."""

    model_output: Any
    data: Any
    dp_group: Any
    metrics: dict | None = None


_CURRENT: ContextVar[_Call | None] = ContextVar("rlstab_verl_model_output", default=None)

# Modules of verl 0.9.1 that call ``ppo_loss`` by a name bound at import time.
_CALLERS = ("verl.workers.utils.losses", "verl.workers.engine_workers", "verl.trainer.distillation.losses")


def wrap_ppo_loss(modules: dict) -> None:
    """Replace ``ppo_loss`` in verl's loss module and in every already-imported caller (idempotent)."""
    import verl.workers.utils.losses as losses

    callers = [modules[name] for name in _CALLERS if modules.get(name) is not None]
    patch_once(losses, "ppo_loss", _with_model_output, key=__name__, also=callers)


def _with_model_output(ppo_loss):
    @functools.wraps(ppo_loss)
    def ppo_loss_with_model_output(*args, **kwargs):
        model_output = kwargs.get("model_output", args[1] if len(args) > 1 else None)
        data = kwargs.get("data", args[2] if len(args) > 2 else None)
        dp_group = kwargs.get("dp_group", args[3] if len(args) > 3 else None)
        call = _Call(model_output, data, dp_group)
        token = _CURRENT.set(call)
        try:
            result = ppo_loss(*args, **kwargs)
        finally:
            _CURRENT.reset(token)
        if call.metrics:
            result[1].update(call.metrics)  # (policy_loss, metrics)
        return result

    return ppo_loss_with_model_output


def current_entropy() -> torch.Tensor | None:
    """The running micro-batch's per-token entropy as ``[B, T]`` (padded like the log-probs), detached.

    None when the loss was not called from ``ppo_loss`` or the engine computed no entropy.
    """
    current = _CURRENT.get()
    if current is None:
        return None
    model_output, data = current.model_output, current.data
    entropy = model_output.get("entropy") if model_output is not None else None
    if entropy is None:
        return None
    from verl.workers.utils.padding import no_padding_2_padding

    return no_padding_2_padding(entropy.detach(), data)


def current_dp_group():
    """The data-parallel process group ``ppo_loss`` was called with (None outside ``ppo_loss``)."""
    current = _CURRENT.get()
    return None if current is None else current.dp_group


def declare_metrics(metrics: dict) -> bool:
    """Within ``ppo_loss``: ``metrics`` (name -> veRL ``Metric``) replace the entries ``ppo_loss`` returns
    under those names. Whether the loss runs inside ``ppo_loss`` (else nothing happens)."""
    current = _CURRENT.get()
    if current is None:
        return False
    current.metrics = metrics
    return True
