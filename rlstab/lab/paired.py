"""Who each objective is compared with, and the grid's statistics from its runs' summaries.

Each objective is paired with one baseline: the global ``--baseline`` (the first objective by
default), or the one ``--pair OBJECTIVE=BASELINE`` names, such as the objective it extends (stapo,
20-entropy and stare extend dapo). ``tables`` gives, per regime, every objective's mean and interval
of each metric and every pair's paired differences, with Holm's correction over all the paired
differences of the grid (one report, one family). ``restate`` recomputes those from a stored
``results.json``'s run summaries, so a published grid's report can be rebuilt with new statistics
without touching its runs.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from rlstab.lab.statistics import adjust, mean_interval, paired_difference
from rlstab.lab.summary import value

METRICS = (
    "accuracy_auc", "final_accuracy", "start_accuracy", "final_reward", "final_entropy", "min_entropy",
    "entropy_ratio", "collapsed", "mean_grad_norm", "max_grad_norm", "mean_silenced_fraction", "mean_clip_fraction",
    "mean_ess_fraction", "min_ess_fraction", "mean_zero_variance_groups", "wall_time",
    "final_pass_at_k", "final_distinct_correct",
)
PAIRED_METRICS = ("accuracy_auc", "final_accuracy", "entropy_ratio", "final_entropy", "final_pass_at_k",
                  "final_distinct_correct")
"""The paired comparisons of a report, primary first: the accuracy AUC (a mean over the evaluations,
whose paired spread is a fraction of the final accuracy's single evaluation), then the final accuracy,
the entropy ratio, the final entropy, and where the runs measured them (``pass_k > 0``) the final
pass@k and distinct right answers per prompt. Holm's family is all of them, in every regime."""

MEASURED_ONLY = frozenset({"final_pass_at_k", "final_distinct_correct"})
"""Metrics that only some runs measure: a report has them only when one of its runs does."""


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


def tables(runs: Sequence[dict], labels: Sequence[str], regimes: Sequence[str], pairing: dict[str, str]) -> tuple[dict, dict]:
    """``(aggregates, paired)`` of ``results.json`` from its ``runs``, Holm-adjusted over all paired differences."""
    aggregates: dict = {}
    paired: dict = {}
    family = []
    measured = {m for r in runs for m in MEASURED_ONLY if r["summary"].get(m) is not None}
    metrics = [m for m in METRICS if m not in MEASURED_ONLY or m in measured]
    paired_metrics = [m for m in PAIRED_METRICS if m not in MEASURED_ONLY or m in measured]
    for regime in regimes:
        by_label = {label: {r["seed"]: r["summary"] for r in runs if r["regime"] == regime and r["objective"] == label}
                    for label in labels}
        aggregates[regime] = {
            label: {m: mean_interval([value(s, m) for s in by_label[label].values()]) for m in metrics} for label in labels
        }
        paired[regime] = {}
        for label, base in pairing.items():
            paired[regime][label] = {
                m: paired_difference({k: value(s, m) for k, s in by_label[label].items()},
                                     {k: value(s, m) for k, s in by_label[base].items()})
                for m in paired_metrics
            }
            family += paired[regime][label].values()
    adjust(family)
    return aggregates, paired


def restate(data: dict, given: Iterable[str] = ()) -> dict:
    """``data`` (a ``results.json``) with its aggregates and paired differences recomputed from its runs'
    summaries by this version's statistics, pairs from ``given`` (``OBJECTIVE=BASELINE``); runs untouched."""
    settings = data["settings"]
    labels = list(settings["objectives"])
    pairing = pairs(labels, settings["baseline"], given)
    aggregates, paired = tables(data["runs"], labels, list(settings["regimes"]), pairing)
    return {**data, "settings": {**settings, "pairs": pairing}, "aggregates": aggregates, "paired": paired}


def pairing_of(data: dict) -> dict[str, str]:
    """The stored pairs of a ``results.json``; one written before pairs existed pairs all with its baseline."""
    s = data["settings"]
    return s.get("pairs") or {label: s["baseline"] for label in s["objectives"] if label != s["baseline"]}
