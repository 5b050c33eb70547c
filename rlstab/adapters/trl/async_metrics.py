"""rlstab's metrics through ``AsyncGRPOTrainer``'s own logging, plus its standard names where they mean the same.

The async trainer collects metrics in ``self._metrics["train"][name]`` and reduces each logging
window in ``log()`` by the value's shape and the name (``_reduce_metric``): a
``(numerator, denominator)`` pair is a rate, ``sum(num) / sum(den)``; a name whose last part has
the word ``total`` is summed, ``max`` / ``min`` an extreme; anything else is averaged. So each
rlstab metric is handed over in the form with which that reduction combines it as
[`Metrics.combines`][rlstab.metrics.Metrics.combines] declares, as far as it can:

- ``token_mean`` (fractions, means over tokens): the pair ``(sum_ranks x n, sum_ranks n)`` with
  ``n`` the micro-batch's valid tokens on the rank: the logged value is the exact token mean over
  the window's micro-batches and ranks;
- ``sum`` (counts): summed over ranks; the window averages the micro-batches' (a count per micro-batch);
- ``step`` (thresholds, step counts): the ranks' mean (they agree); the window averages the steps';
- ``min`` / ``max``: the extreme over ranks; the window averages, unless the name has TRL's word.

Under ``rlstab/<name>``. TRL's own names, computed as ``AsyncGRPOTrainer.compute_loss`` computes
them (global over ranks, then one division): ``ratio`` and ``kl`` (the mean of ``r`` and of
``(r - 1) - log r``, ``r`` the ratio to the *sampler's* log-probabilities, whichever
``old_logprobs`` is), ``entropy``, and, with a surrogate that reports clipping,
``clip_ratio/low_mean`` / ``high_mean`` / ``region_mean`` (of the objective's own clip, against its
``old_logprobs``), with ``clip_ratio/low_min`` / ``high_max`` for ``ppo_clip``; ``aux_loss`` for MoE models.
"""

from __future__ import annotations

from rlstab.adapters.trl.metrics import PREFIX, _nan_extreme, _per_completion_clip_fractions
from rlstab.batch import LossOutput, TokenBatch
from rlstab.clipping import PPOClip
from rlstab.lazy import torch
from rlstab.objective import Objective


def log_async_metrics(trainer, out: LossOutput, batch: TokenBatch, objective: Objective) -> None:
    """Append one micro-batch's metrics to ``trainer._metrics["train"]``."""
    store = trainer._metrics["train"]
    accelerator = trainer.accelerator
    device = batch.logprobs.device
    metrics = out.metrics
    n = float(metrics["tokens/valid"])
    names = [name for name in metrics if name != "loss"]
    kinds = {name: metrics.combines(name) for name in names}
    summed = [name for name in names if kinds[name] in ("sum", "step", "token_mean")]
    values = [metrics[name] * (n if kinds[name] == "token_mean" else 1.0) for name in summed]
    totals = accelerator.reduce(torch.tensor([*values, n], dtype=torch.float64, device=device), reduction="sum")
    *totals, count = totals.tolist()
    processes = accelerator.num_processes
    for name, total in zip(summed, totals):
        if kinds[name] == "token_mean":
            store[PREFIX + name].append((total, count))
        else:
            store[PREFIX + name].append(total / processes if kinds[name] == "step" else total)
    extremes = [name for name in names if kinds[name] in ("min", "max")]
    if extremes:
        gathered = accelerator.gather(torch.tensor([[metrics[name] for name in extremes]], device=device))
        for i, name in enumerate(extremes):
            column = gathered[:, i]
            store[PREFIX + name].append(float(column.min() if kinds[name] == "min" else column.max()))
    _trl_names(trainer, store, out, batch, objective)


def _trl_names(trainer, store, out: LossOutput, batch: TokenBatch, objective: Objective) -> None:
    """``ratio``, ``kl``, ``entropy`` and the clip fractions, as ``AsyncGRPOTrainer.compute_loss`` logs them."""
    accelerator = trainer.accelerator
    device = batch.logprobs.device
    mask = batch.response_mask
    sampler = batch.old_logprobs if batch.old_logprobs is not None else batch.rollout_logprobs
    log_ratio = (batch.logprobs.detach().float() - sampler.float())[mask]
    ratio = log_ratio.exp()
    sums = {"ratio": ratio.sum(), "kl": ((ratio - 1.0) - log_ratio).sum()}
    if batch.entropy is not None:
        sums["entropy"] = batch.entropy.detach().float()[mask].sum()
    n = float(out.metrics["tokens/valid"])
    clip = "clip/high_fraction" in out.metrics and "clip/low_fraction" in out.metrics
    if clip:
        sums["clip_ratio/low_mean"] = torch.tensor(out.metrics["clip/low_fraction"] * n, device=device)
        sums["clip_ratio/high_mean"] = torch.tensor(out.metrics["clip/high_fraction"] * n, device=device)
    local = torch.stack([torch.as_tensor(v, dtype=torch.float64, device=device) for v in sums.values()]
                        + [torch.tensor(float(mask.sum()), dtype=torch.float64, device=device)])
    *totals, count = accelerator.reduce(local, reduction="sum").tolist()
    means = {name: total / max(count, 1.0) for name, total in zip(sums, totals)}
    if clip:
        means["clip_ratio/region_mean"] = means["clip_ratio/low_mean"] + means["clip_ratio/high_mean"]
    for name, value in means.items():
        store[name].append(value)
    if isinstance(objective.surrogate, PPOClip):
        low, high = _per_completion_clip_fractions(batch, objective)
        store["clip_ratio/low_min"].append(_nan_extreme(accelerator.gather(_nan_extreme_local(low, torch.min)), torch.min))
        store["clip_ratio/high_max"].append(_nan_extreme(accelerator.gather(_nan_extreme_local(high, torch.max)), torch.max))


def _nan_extreme_local(values: torch.Tensor, op) -> torch.Tensor:
    """The rank's extreme of its samples' fractions, NaN when it has none (TRL's ``nanmin`` / ``nanmax``), 1-element."""
    return torch.tensor([_nan_extreme(values, op)], device=values.device)
