"""One run's summary numbers, computed from its metrics rows (step 0 first, then one row per RL step).

Definitions (the report repeats them):

- ``final_accuracy``: held-out accuracy (greedy exact match) after the last step;
  ``start_accuracy``: before the first;
- ``accuracy_auc``: the area under the held-out accuracy curve (trapezoids between the evaluated
  steps, step 0 included) divided by the number of steps: the mean accuracy over training, in [0, 1];
- ``final_entropy``: mean token entropy of the rollouts over the last ``TAIL`` of the steps (at
  least one); ``start_entropy``: of step 1's rollouts; ``min_entropy``: the lowest step's;
- ``entropy_ratio``: ``final_entropy / start_entropy``, the share of step 1's entropy left at the end
  (derived by ``value`` for summaries written before it was stored);
- ``collapsed``: 1 when ``entropy_ratio < COLLAPSE_RATIO`` (the policy lost more than half its
  entropy), else 0: a threshold on the ratio, so a run at 0.501 and one at 0.499 differ by a whole
  count; the report gives the ratio with its interval and the count only beside it;
- ``late_minus_peak_reward``: how far the rollouts' reward ends below its best, a primary endpoint of
  a collapse that loses reward (docs/lab.md, "STAPO on SmolLM2-135M"). With ``r_1 .. r_n`` the
  rollouts' mean reward at each RL step and ``W = REWARD_WINDOW`` (5), the moving means
  ``m_t = (r_{t-W+1} + ... + r_t) / W`` for ``t = W .. n``: ``m_n - max_t m_t``, the mean reward over
  the last W steps minus the highest mean over any W consecutive steps. At most 0, and 0 when the
  last W steps are the best; None with fewer than W steps;
- ``mean_*``: means over all RL steps (fractions of valid tokens for silenced and clipped; ESS /
  N of the rollouts' sequence importance weights, 1.0 on-policy; the share of prompt groups whose
  G rewards are all equal, which carry no GRPO signal, None in runs recorded before it was);
- ``start_pass_at_k``, ``final_pass_at_k``, ``start_distinct_correct``, ``final_distinct_correct``
  (runs with ``pass_k > 0`` only): held-out pass@k and the distinct right answers per prompt
  (``rlstab.trainer.passk``) at step 0 and at the last evaluation;
- ``wall_time``: seconds of the RL steps and evaluations (measured, so never identical across runs);
- ``layers`` (an objective with a ``sampler:`` or ``rollout:`` only): the mean over the steps of each
  of their metrics (Goldilocks' ``sampler/teacher_mse``, DEEP-GRPO's ``rollout/branch_success``, ...).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

TAIL = 0.1
COLLAPSE_RATIO = 0.5
REWARD_WINDOW = 5
"""Steps of the moving mean of ``late_minus_peak_reward``: the late reward is the last window's mean."""

TIMING = ("wall_time",)
"""Summary fields that are measured rather than computed: left out of every identity check."""


def _mean(values: Sequence[float]) -> float | None:
    values = [v for v in values if v is not None]
    return sum(values) / len(values) if values else None


def accuracy_auc(rows: Sequence[dict]) -> float | None:
    """Trapezoid area under the evaluated accuracies over the evaluated span (step 0 to the last step,
    which is always evaluated), divided by that span; None with fewer than two evaluations."""
    points = [(r["step"], r["accuracy"]) for r in rows if r.get("accuracy") is not None]
    if len(points) < 2:
        return None
    area = sum((x1 - x0) * (y0 + y1) / 2 for (x0, y0), (x1, y1) in zip(points, points[1:]))
    return area / (points[-1][0] - points[0][0])


def late_minus_peak(rewards: Sequence[float], window: int = REWARD_WINDOW) -> float | None:
    """The mean of the last ``window`` rewards minus the largest mean of any ``window`` consecutive ones
    (``late_minus_peak_reward`` above); None with fewer than ``window`` rewards."""
    if len(rewards) < window:
        return None
    means = [sum(rewards[t - window:t]) / window for t in range(window, len(rewards) + 1)]
    return means[-1] - max(means)


def run_summary(rows: Sequence[dict]) -> dict:
    steps = [r for r in rows if r["step"] > 0]
    accuracies = [r["accuracy"] for r in rows if r.get("accuracy") is not None]
    n = len(steps)
    tail = steps[-max(1, math.ceil(TAIL * n)):] if n else []
    start_entropy = steps[0]["entropy"] if steps else None
    final_entropy = _mean([r["entropy"] for r in tail])
    return {
        "steps": n,
        "start_accuracy": accuracies[0] if accuracies else None,
        "final_accuracy": accuracies[-1] if len(accuracies) > 1 else None,
        "accuracy_auc": accuracy_auc(rows),
        "final_reward": _mean([r["reward"] for r in tail]),
        "mean_reward": _mean([r["reward"] for r in steps]),
        "late_minus_peak_reward": late_minus_peak([r["reward"] for r in steps]),
        "start_entropy": start_entropy,
        "final_entropy": final_entropy,
        "min_entropy": min((r["entropy"] for r in steps), default=None),
        "entropy_ratio": _ratio(final_entropy, start_entropy),
        "collapsed": None if final_entropy is None else float(final_entropy < COLLAPSE_RATIO * start_entropy),
        "mean_grad_norm": _mean([r["grad_norm"] for r in steps]),
        "max_grad_norm": max((r["grad_norm"] for r in steps), default=None),
        "mean_silenced_fraction": _mean([r["silenced_fraction"] for r in steps]),
        "mean_clip_fraction": _mean([r["clip_high_fraction"] + r["clip_low_fraction"] + r["clip_dual_fraction"] for r in steps]),
        "mean_ess_fraction": _mean([r.get("ess_fraction") for r in steps]),
        "min_ess_fraction": min((r["ess_fraction"] for r in steps if r.get("ess_fraction") is not None), default=None),
        "mean_zero_variance_groups": _mean([r.get("zero_variance_groups") for r in steps]),
        "wall_time": sum(r.get("time", 0.0) for r in steps),
        **_pass_at_k(rows),
        **_layer_means(steps),
    }


def _pass_at_k(rows: Sequence[dict]) -> dict:
    """Start and final pass@k and distinct right answers, for a run that measured them (else nothing)."""
    measured = [r["pass_at_k"] for r in rows if r.get("pass_at_k") is not None]
    if not measured:
        return {}
    first, last = measured[0], measured[-1]
    return {
        "start_pass_at_k": first["pass_at_k"], "final_pass_at_k": last["pass_at_k"],
        "start_distinct_correct": first["distinct_correct"], "final_distinct_correct": last["distinct_correct"],
    }


def _ratio(final: float | None, start: float | None) -> float | None:
    return None if final is None or not start else final / start


def value(summary: dict, metric: str) -> float | None:
    """``summary[metric]``, or for ``entropy_ratio`` in a summary stored before it existed, ``final_entropy / start_entropy``."""
    if metric == "entropy_ratio" and metric not in summary:
        return _ratio(summary.get("final_entropy"), summary.get("start_entropy"))
    return summary.get(metric)


def _layer_means(steps: Sequence[dict]) -> dict:
    """``{"layers": {metric: mean over the steps that report it}}`` for an objective with a sampler or rollout."""
    names = dict.fromkeys(name for r in steps for name in r.get("layers", {}))
    if not names:
        return {}
    return {"layers": {name: _mean([r.get("layers", {}).get(name) for r in steps]) for name in names}}
