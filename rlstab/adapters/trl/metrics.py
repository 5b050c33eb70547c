"""rlstab's metrics through TRL's own logging, plus TRL's standard names where they mean the same.

``GRPOTrainer`` collects metrics in ``self._metrics[mode][name]`` (one value per micro-batch),
averages each list in ``log()`` and writes the averages into ``trainer.state.log_history`` and
every configured logger. So metrics appended here appear there, like TRL's own:

- ``rlstab/<name>`` for every metric of the objective (``rlstab/mask/s2t/silenced``,
  ``rlstab/mask/s2t/entropy_threshold``, ``rlstab/tokens/kept_fraction``, ``rlstab/clip/high_fraction``,
  ...), averaged over processes here and over micro-batches by TRL, whose ``log()`` has no other
  reduction: so they do not combine as ``Metrics.combines`` declares. Counts are per micro-batch
  and per process; fractions are unweighted means of the micro-batches'; step values the mean of
  the logged steps' (docs/adapters/trl.md).
- TRL's names, global over processes as TRL computes them: ``entropy`` (mean over loss-mask
  tokens); with a surrogate that reports clipping, ``clip_ratio/low_mean`` (A < 0 and
  r < 1 - eps_low), ``clip_ratio/high_mean`` (A > 0 and r > 1 + eps_high), ``clip_ratio/region_mean``
  (their sum), and for the token-level ``ppo_clip`` ``clip_ratio/low_min`` and ``clip_ratio/high_max``
  (the extreme per-completion fractions); with a ``kl`` regulariser, ``kl`` (mean of TRL's k3 estimate).
"""

from __future__ import annotations

from rlstab.batch import LossOutput, TokenBatch
from rlstab.clipping import PPOClip
from rlstab.lazy import torch
from rlstab.objective import Objective
from rlstab.regularisers import KLPenalty

PREFIX = "rlstab/"


def log_metrics(trainer, mode: str, out: LossOutput, batch: TokenBatch, objective: Objective) -> None:
    """Append one micro-batch's metrics to ``trainer._metrics[mode]``."""
    store = trainer._metrics[mode]
    accelerator = trainer.accelerator
    device = batch.logprobs.device
    names = [name for name in out.metrics if name != "loss"]
    values = accelerator.reduce(
        torch.tensor([out.metrics[n] for n in names], device=device), reduction="mean"
    )
    for name, value in zip(names, values.tolist()):
        store[PREFIX + name].append(value)

    # TRL's global means: sums over processes, then one division (tokens differ between processes).
    n = out.metrics["tokens/valid"]
    sums = {"entropy": out.metrics.get("entropy/mean")}
    clip = "clip/high_fraction" in out.metrics and "clip/low_fraction" in out.metrics
    if clip:
        sums["clip_ratio/high_mean"] = out.metrics["clip/high_fraction"]
        sums["clip_ratio/low_mean"] = out.metrics["clip/low_fraction"]
    kl = _kl_per_token(batch, objective)
    if kl is not None:
        sums["kl"] = kl
    sums = {k: v for k, v in sums.items() if v is not None}
    totals = accelerator.reduce(
        torch.tensor([v * n for v in sums.values()] + [n], device=device), reduction="sum"
    )
    totals = totals.tolist()
    count = max(totals[-1], 1.0)
    means = {k: total / count for k, total in zip(sums, totals)}
    if clip:
        means["clip_ratio/region_mean"] = means["clip_ratio/low_mean"] + means["clip_ratio/high_mean"]
    for name, value in means.items():
        store[name].append(value)
    if isinstance(objective.surrogate, PPOClip):
        low, high = _per_completion_clip_fractions(batch, objective)
        store["clip_ratio/low_min"].append(_nan_extreme(accelerator.gather(low), torch.min))
        store["clip_ratio/high_max"].append(_nan_extreme(accelerator.gather(high), torch.max))


def _kl_per_token(batch: TokenBatch, objective: Objective) -> float | None:
    """Mean over valid tokens of TRL's per-token KL, exp(ref - logp) - (ref - logp) - 1."""
    if batch.ref_logprobs is None or not any(isinstance(r, KLPenalty) for r in objective.regularisers):
        return None
    delta = batch.ref_logprobs.detach().float() - batch.logprobs.detach().float()
    k3 = delta.exp() - delta - 1.0
    mask = batch.response_mask.float()
    return float((k3 * mask).sum() / mask.sum().clamp(min=1.0))


def _per_completion_clip_fractions(
    batch: TokenBatch, objective: Objective
) -> tuple[torch.Tensor, torch.Tensor]:
    """``[B]`` fraction of each completion's tokens clipped below (A < 0) and above (A > 0); NaN when empty."""
    surrogate = objective.surrogate
    logprobs = batch.logprobs.detach().float()
    old = logprobs if batch.old_logprobs is None else batch.old_logprobs.float()
    ratio = torch.exp(logprobs - old)
    adv = batch.advantages.float()
    adv = adv.unsqueeze(-1) if adv.dim() == 1 else adv
    mask = batch.response_mask.float()
    low = ((ratio < 1.0 - surrogate.eps_low) & (adv < 0)).float()
    high = ((ratio > 1.0 + surrogate.eps_high) & (adv > 0)).float()
    rows = mask.sum(-1)
    return (low * mask).sum(-1) / rows, (high * mask).sum(-1) / rows


def _nan_extreme(values: torch.Tensor, op) -> float:
    values = values[~torch.isnan(values)]
    return float(op(values)) if values.numel() else float("nan")
