"""A grid's statistics under its protocol: the tables, the no-op seeds, the firing gates and the trend test.

``analyse`` turns a grid's runs (their summaries, and where there are any their per-step rows) and its
protocol (``rlstab.lab.protocol``) into the parts of ``results.json`` that are computed rather than
measured:

- ``aggregates`` and ``paired`` (``rlstab.lab.paired.tables``), the paired differences' effective n and
  MDE counting only the seeds where an objective's run differs from its baseline's;
- ``no_ops``: ``{"compared": "per-step rows" | "run summaries", "seeds": {regime: {objective: [seeds]}}}``,
  the (objective, seed) runs that are their baseline's run (``rlstab.lab.no_ops``);
- ``gates`` (a protocol with ``gates:``): ``{regime: [outcome per gate]}`` (``rlstab.lab.gates``);
- ``trend`` (a protocol with ``trend:``): ``{regime: the trend test}`` (``rlstab.lab.trend``), in the primary
  Holm family.

``restate`` recomputes them for a stored ``results.json`` (and its ``steps.json`` rows, when they were kept)
with this version's statistics, leaving its runs as they are: a published grid's report is rebuilt this way.
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterable, Sequence
from pathlib import Path

import rlstab
from rlstab.lab.gates import gate_outcomes
from rlstab.lab.no_ops import ROWS, SUMMARIES, no_op_seeds, rows_by_run
from rlstab.lab.paired import pairs, tables
from rlstab.lab.protocol import Protocol, ProtocolMismatch, check_arms
from rlstab.lab.summary import value
from rlstab.lab.trend import trend_test


def analyse(runs: Sequence[dict], labels: Sequence[str], regimes: Sequence[str], pairing: dict[str, str],
            protocol: Protocol | None = None, rows: dict[tuple[str, str, int], list[dict]] | None = None) -> dict:
    """``{"aggregates", "paired", "no_ops"}``, and ``"gates"`` and ``"trend"`` when the protocol has them.

    ``rows``: every run's metrics rows by ``(regime, objective, seed)``, or None when they were not kept (the
    no-op test then compares summaries, and gates cannot be checked). Raises ``ProtocolMismatch`` (one line)
    for a protocol that does not fit the runs.
    """
    protocol = protocol or Protocol()
    problems = check_arms(protocol, list(labels))
    if problems:
        raise ProtocolMismatch(problems[0])
    _check_measured(runs, protocol)
    same = {(regime, label): no_op_seeds(runs, regime, label, base, rows) for regime in regimes
            for label, base in pairing.items()}
    trends = {regime: _trend(runs, regime, protocol) for regime in regimes} if protocol.trend else {}
    primary = list(protocol.primary or []) if protocol.primary is not None or protocol.trend else None
    aggregates, paired = tables(runs, labels, regimes, pairing, same=same, primary=primary, joined=list(trends.values()))
    out = {
        "aggregates": aggregates,
        "paired": paired,
        "no_ops": {"compared": SUMMARIES if rows is None else ROWS,
                   "seeds": {regime: {label: list(same[regime, label]) for label in pairing} for regime in regimes}},
    }
    if protocol.gates:
        if rows is None:
            raise ProtocolMismatch("protocol gates: checking them needs every run's per-step rows (steps.json), "
                                   "which these results do not have")
        out["gates"] = {regime: gate_outcomes(protocol.gates, runs, regime, rows) for regime in regimes}
    if trends:
        out["trend"] = trends
    return out


def _check_measured(runs: Sequence[dict], protocol: Protocol) -> None:
    """A primary or trend metric that no run has (pass@k without ``pass_k``) is a mismatch, not an empty comparison."""
    named = [(f"primary[{i}]", m) for i, m in enumerate(protocol.primary or [])]
    if protocol.trend is not None:
        named.append(("trend.metric", protocol.trend.metric))
    for path, metric in named:
        if all(value(r["summary"], metric) is None for r in runs):
            raise ProtocolMismatch(f"protocol {path} = {metric!r}: no run measured it")


def _trend(runs: Sequence[dict], regime: str, protocol: Protocol) -> dict:
    t = protocol.trend
    per_arm = []
    for i, arm in enumerate(t.arms):
        values = {r["seed"]: value(r["summary"], t.metric) for r in runs if r["regime"] == regime and r["objective"] == arm}
        if not values:
            raise ProtocolMismatch(f"protocol trend.arms[{i}] = {arm!r}: no runs under regime {regime}")
        per_arm.append(values)
    return {"arms": list(t.arms), "doses": list(t.doses), "metric": t.metric, **trend_test(per_arm, t.doses)}


def restate(data: dict, given: Iterable[str] = (), steps: Sequence[dict] | None = None,
            protocol: Protocol | None = None) -> dict:
    """``data`` (a ``results.json``) with its statistics recomputed from its runs by this version, runs untouched.

    ``given``: ``OBJECTIVE=BASELINE`` pairs; ``steps``: ``steps.json``'s runs, when the grid kept them (the no-op
    test then compares rows, and gates can be checked); ``protocol``: the protocol, by default the one stored in
    ``settings.protocol`` (none for grids run before protocols were stored).
    """
    settings = data["settings"]
    labels = list(settings["objectives"])
    pairing = pairs(labels, settings["baseline"], given)
    if protocol is None and settings.get("protocol") is not None:
        protocol = Protocol.model_validate(settings["protocol"])
    rows = rows_by_run(steps) if steps is not None else None
    computed = analyse(data["runs"], labels, list(settings["regimes"]), pairing, protocol, rows)
    kept = {k: v for k, v in data.items() if k not in ("aggregates", "paired", "no_ops", "gates", "trend", "restated")}
    pairs_note = "".join(f", --pair {p}" for p in given)
    note = (f"recomputed from the stored runs' {'per-step rows and summaries' if rows is not None else 'summaries'} by "
            f"rlstab {rlstab.__version__}'s rlstab.lab.analysis.restate{' with ' + pairs_note[2:] if pairs_note else ''}; "
            "the runs are unchanged")
    settings_out = {**settings, "pairs": pairing}
    if protocol is not None and protocol.decides:
        settings_out["protocol"] = protocol.model_dump()
    return {**kept, "settings": settings_out, **computed, "restated": note}


def published_steps(results: Path) -> list[dict] | None:
    """The per-step rows kept beside a results file: ``steps.json`` in its folder (as ``compare`` writes them), or
    ``<stem>/steps.json.gz`` (as ``docs/lab/`` keeps them, compressed); None when there are none."""
    results = Path(results)
    beside, compressed = results.with_name("steps.json"), results.with_suffix("") / "steps.json.gz"
    if beside.exists():
        return json.loads(beside.read_text())["runs"]
    if compressed.exists():
        return json.loads(gzip.decompress(compressed.read_bytes()))["runs"]
    return None


def restate_published(results: Path) -> dict:
    """A stored ``results.json`` restated (``restate``) with its own pairs and protocol, and its per-step rows where kept."""
    data = json.loads(Path(results).read_text())
    s = data["settings"]
    own = [f"{k}={v}" for k, v in (s.get("pairs") or {}).items() if v != s["baseline"]]
    return restate(data, own, published_steps(results))
