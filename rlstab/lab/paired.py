"""Who each objective is compared with, and the grid's statistics from its runs' summaries.

Each objective is paired with one baseline: the global ``--baseline`` (the first objective by
default), or the one ``--pair OBJECTIVE=BASELINE`` names, such as the objective it extends (stapo,
20-entropy and stare extend dapo). ``tables`` gives, per regime, every objective's mean and interval
of each metric and every pair's paired differences, with Holm's correction over all the paired
differences of the grid (one report, one family), or, when a protocol names primary metrics, over
the primary and over the secondary comparisons separately (``rlstab.lab.analysis`` adds the no-op
seeds, the gates and the trend test, and restates a stored grid).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from rlstab.lab.statistics import adjust, mean_interval, paired_difference
from rlstab.lab.summary import value

METRICS = (
    "accuracy_auc", "final_accuracy", "start_accuracy", "final_reward", "final_entropy", "min_entropy",
    "entropy_ratio", "collapsed", "mean_grad_norm", "max_grad_norm", "mean_silenced_fraction", "mean_clip_fraction",
    "mean_ess_fraction", "min_ess_fraction", "mean_zero_variance_groups", "wall_time",
    "final_pass_at_k", "final_distinct_correct", "late_minus_peak_reward",
)
PAIRED_METRICS = ("accuracy_auc", "final_accuracy", "entropy_ratio", "final_entropy", "final_pass_at_k",
                  "final_distinct_correct")
"""The paired comparisons of a report, primary first: the accuracy AUC (a mean over the evaluations,
whose paired spread is a fraction of the final accuracy's single evaluation), then the final accuracy,
the entropy ratio, the final entropy, and where the runs measured them (``pass_k > 0``) the final
pass@k and distinct right answers per prompt. Holm's family is all of them, in every regime, unless a
protocol names primary metrics (then the primary ones and the others are two families)."""

NAMES = {"accuracy_auc": "acc AUC", "final_accuracy": "final acc", "entropy_ratio": "entropy ratio",
         "final_entropy": "final entropy", "final_pass_at_k": "final pass@k",
         "final_distinct_correct": "final distinct right answers", "late_minus_peak_reward": "late minus peak reward"}
"""The paired metrics' names in the report (a protocol may name a metric by its key or by this name)."""

MEASURED_ONLY = frozenset({"final_pass_at_k", "final_distinct_correct", "late_minus_peak_reward"})
"""Metrics that only some runs measure, or that summaries stored before them lack (``late_minus_peak_reward``):
a report has them only when one of its runs does."""


class PairError(ValueError):
    """A ``--pair`` that cannot be used (one line naming the flag and its value)."""


def pairs(labels: Sequence[str], baseline: str, given: Iterable[str] = ()) -> dict[str, str]:
    """``{objective: its baseline}``: ``baseline`` for every other objective, then each ``OBJECTIVE=BASELINE`` of ``given``."""
    out = {label: baseline for label in labels if label != baseline}
    named: set[str] = set()
    for item in given:
        objective, sep, base = str(item).partition("=")
        objective, base = objective.strip(), base.strip()
        if not sep or not objective or not base:
            raise PairError(f"--pair {item!r}: OBJECTIVE=BASELINE, e.g. stapo=dapo")
        for name in (objective, base):
            if name not in labels:
                raise PairError(f"--pair {item}: {name!r} is not one of the objectives ({', '.join(labels)})")
        if objective == base:
            raise PairError(f"--pair {item}: an objective is not paired with itself")
        if objective in named:
            raise PairError(f"--pair {item}: {objective} is paired twice")
        named.add(objective)
        out[objective] = base
    return {label: out[label] for label in labels if label in out}


def compared_metrics(runs: Sequence[dict], primary: Sequence[str] | None = None) -> list[str]:
    """The paired metrics of a report: ``PAIRED_METRICS`` (the measured-only ones where a run measured them), then
    each primary metric not among them."""
    measured = {m for r in runs for m in MEASURED_ONLY if r["summary"].get(m) is not None}
    metrics = [m for m in PAIRED_METRICS if m not in MEASURED_ONLY or m in measured]
    return metrics + [m for m in primary or () if m not in metrics]


def tables(runs: Sequence[dict], labels: Sequence[str], regimes: Sequence[str], pairing: dict[str, str], *,
           same: dict[tuple[str, str], Sequence[int]] | None = None, primary: Sequence[str] | None = None,
           joined: Sequence[dict] = ()) -> tuple[dict, dict]:
    """``(aggregates, paired)`` of ``results.json`` from its ``runs``, Holm-adjusted.

    ``same``: ``{(regime, objective): the seeds whose run is its baseline's}`` (``rlstab.lab.no_ops``), left out of
    the effective n and the MDE. Holm's families: with ``primary`` None, all paired differences of the report
    (``"all"``); with a list of metrics, the differences of those metrics and the ``joined`` comparisons (a
    pre-registered trend test) form the ``"primary"`` family and the other differences the ``"secondary"`` one.
    """
    aggregates: dict = {}
    paired: dict = {}
    family: list[dict] = []
    secondary: list[dict] = []
    measured = {m for r in runs for m in MEASURED_ONLY if r["summary"].get(m) is not None}
    metrics = [m for m in METRICS if m not in MEASURED_ONLY or m in measured]
    paired_metrics = compared_metrics(runs, primary)
    for regime in regimes:
        by_label = {label: {r["seed"]: r["summary"] for r in runs if r["regime"] == regime and r["objective"] == label}
                    for label in labels}
        aggregates[regime] = {
            label: {m: mean_interval([value(s, m) for s in by_label[label].values()]) for m in metrics} for label in labels
        }
        paired[regime] = {}
        for label, base in pairing.items():
            seeds = (same or {}).get((regime, label), ())
            paired[regime][label] = {
                m: paired_difference({k: value(s, m) for k, s in by_label[label].items()},
                                     {k: value(s, m) for k, s in by_label[base].items()}, seeds)
                for m in paired_metrics
            }
            for m, d in paired[regime][label].items():
                (family if primary is None or m in primary else secondary).append(d)
    if primary is None:
        adjust(family)
    else:
        adjust([*family, *joined], "primary")
        adjust(secondary, "secondary")
    return aggregates, paired


def pairing_of(data: dict) -> dict[str, str]:
    """The stored pairs of a ``results.json``; one written before pairs existed pairs all with its baseline."""
    s = data["settings"]
    return s.get("pairs") or {label: s["baseline"] for label in s["objectives"] if label != s["baseline"]}
