"""rlstab's metrics under veRL's names, in veRL's own logging, combined as ``Metrics.combines`` declares.

The policy loss returns ``(loss, metrics)``, and veRL's ``ppo_loss`` makes every entry a mean over
micro-batches (``Metric(AggregationType.MEAN)``). veRL's reduction of one optimizer step
(``Metric.aggregate_dp``, verl 0.9) takes, for each metric, the mean over data-parallel ranks of
each micro-batch's value, then the mean (``MEAN``) or the sum (``SUM``) over micro-batches. So
where veRL gives the step's counts (``config.global_batch_info``: every run of its trainer), each
rlstab metric under ``actor/rlstab/`` is handed to ``ppo_loss``'s result
([`declare_metrics`][rlstab.adapters.verl.model_output.declare_metrics]) in the form that makes
veRL's reduction give [`rlstab.metrics.combine`][rlstab.metrics.combine]'s value over the step's
micro-batches on every rank. With ``R`` ranks, ``n`` the micro-batch's ``tokens/valid`` and ``N``
the step's ``step/tokens_valid``:

- ``sum`` (a count: ``tokens/valid``, ``mask/<label>/silenced``): ``SUM`` of ``x * R``, so the
  step's value is ``sum_k mean_r(x * R) = sum over every micro-batch of every rank``. The loss
  terms (``loss/policy``, ``loss/<regulariser>``) are ``SUM`` of ``x``: each rank's is already
  multiplied by ``R`` (the aggregation's ``world_size``, as veRL's own ``actor/pg_loss``).
- ``token_mean`` (a fraction of the valid tokens: ``tokens/kept_fraction``, ``approx_kl``):
  ``SUM`` of ``x * n * R / N``, so the step's value is ``sum x n / N``, weighted by tokens.
- ``step`` (a threshold, a denominator): left a ``MEAN``; it is the same in every micro-batch of
  the step, so the mean is that value.
- ``min``, ``max`` (``mismatch/ratio_min``): veRL's ``MIN`` / ``MAX``, its extreme over every
  micro-batch of every rank, with or without the step's counts (a micro-batch without a valid
  token, whose value is a placeholder, is not left out there).

Without the step's counts (a micro-batch is its own step, as in veRL, which then averages its own
``actor/pg_loss`` too) every metric stays a mean over micro-batches. veRL's standard names,
filled from the objective's, keep veRL's own reduction, so that they read as veRL's built-in
losses report them: ``actor/pg_clipfrac`` (tokens clipped by the PPO range, either side),
``actor/pg_clipfrac_lower`` (negative-advantage tokens bounded by dual-clip), ``actor/ppo_kl``
(mean of -log r), each a mean of the micro-batches' values. Across the optimizer steps of one
training batch veRL's driver (``reduce_metrics``) averages the steps' values.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rlstab.adapters.verl.counts import is_global

if TYPE_CHECKING:
    from rlstab.metrics import Metrics

PREFIX = "actor/rlstab/"
LOSS_TERMS = "loss/"
"""The prefix of the loss terms' metrics, which each rank reports already multiplied by the ranks' number."""


def verl_metrics(metrics: Metrics | dict[str, float]) -> dict[str, float]:
    """verl's standard policy metrics, then every rlstab metric under ``actor/rlstab/``, as floats."""
    out = {
        "actor/pg_clipfrac": metrics.get("clip/high_fraction", 0.0) + metrics.get("clip/low_fraction", 0.0),
        "actor/ppo_kl": metrics["approx_kl"],
        "actor/pg_clipfrac_lower": metrics.get("clip/dual_fraction", 0.0),
    }
    out.update({f"{PREFIX}{name}": value for name, value in metrics.items() if name != "loss"})
    return out


def step_combined(metrics: Metrics, info: dict) -> dict:
    """The ``actor/rlstab/`` metrics that veRL must reduce otherwise than by a mean, as veRL ``Metric``s.

    ``info``: veRL's ``config.global_batch_info`` (``dp_size``, ``batch_num_tokens``, ...); when it
    gives no step counts, only the extremes (see the module's docstring for each kind's form).
    """
    from verl.utils.metric import AggregationType, Metric

    extremes = {"min": AggregationType.MIN, "max": AggregationType.MAX}
    out = {PREFIX + name: Metric(extremes[metrics.combines(name)], value)
           for name, value in metrics.items() if metrics.combines(name) in extremes}
    if not is_global(info):
        return out
    ranks = int(info.get("dp_size") or 1)
    weight = metrics["tokens/valid"] * ranks / (metrics["step/tokens_valid"] or 1.0)
    for name, value in metrics.items():
        kind = metrics.combines(name)
        if name == "loss" or kind in ("step", "min", "max"):
            continue
        if kind == "sum":
            value = value if name.startswith(LOSS_TERMS) else value * ranks
        else:  # token_mean
            value = value * weight
        out[PREFIX + name] = Metric(AggregationType.SUM, value)
    return out
