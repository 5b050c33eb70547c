"""No-op runs: an objective's run that is the same run as its baseline's on that seed.

Two objectives that differ only where a mask acts train identically on a seed where the mask never
fires: every step's rollouts, losses and gradients are the same floats. Such a seed's paired
difference is a zero by construction, not a draw of the objective's effect, so it is no evidence
about the effect: the report flags the (objective, seed) and counts the seeds where the two runs
differ (the effective n, ``rlstab.lab.statistics``).

Two runs are the same run when, at every step, every field that both runs' metrics rows report
is equal (NaN equal to NaN), except:

- ``time``, the step's wall-clock seconds (measured, so never equal);
- ``objective``, the arm's own name;
- the fields named by the arm's mask labels, which are its configuration rather than its training:
  ``masks`` (the acting masks' counts by label), the loss metrics ``mask/<label>/...`` and
  ``shadow/<label>/...`` (a shadow mask measures what it would silence, and an arm and its baseline
  may carry different shadow masks or thresholds over the same training), and ``mechanism.masks``
  (the masks' gradient shares by label).

A field only one run reports (a reweighter's ``reweight/<label>/mean``, a sampler's layer metrics)
is the arm's own and is not compared; what it acts on shows in the shared fields (the loss, the
gradient norm, the rollouts' reward and entropy, the kept and silenced token counts). The steps of
the two runs must be the same steps.

Without the per-step rows (a grid published before ``steps.json`` existed), the same test runs on
the two runs' summaries (``summary.json``: every summary field but ``wall_time``): identical
summaries of means over every step are a strong sign of identical runs, not a proof, and the report
says which was compared.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

from rlstab.lab.summary import TIMING

ROW_SKIPPED = ("time", "objective", "masks", "mechanism.masks")
"""Fields of a metrics row that are left out of the identity test (paths, ``.`` between levels)."""
LABELLED_LOSS = ("loss.mask/", "loss.shadow/")
"""Prefixes of the loss metrics named by a mask's label."""
ROWS, SUMMARIES = "per-step rows", "run summaries"
"""What the identity test compared: every metrics row, or (rows not stored) the runs' summaries."""


def flatten(record: dict, prefix: str = "") -> dict:
    """``{"a": {"b": 1}}`` -> ``{"a.b": 1}``: nested mappings as dotted paths."""
    out = {}
    for key, value in record.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(flatten(value, f"{path}."))
        else:
            out[path] = value
    return out


def _skipped(path: str, skipped: Sequence[str]) -> bool:
    return any(path == s or path.startswith(f"{s}.") for s in skipped) or path.startswith(LABELLED_LOSS)


def _equal(a, b) -> bool:
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return a == b


def same_record(a: dict, b: dict, skipped: Sequence[str] = ROW_SKIPPED) -> bool:
    """Whether every field both records report is equal, the ``skipped`` ones (and labelled loss metrics) aside."""
    fa, fb = flatten(a), flatten(b)
    return all(_equal(fa[k], fb[k]) for k in fa.keys() & fb.keys() if not _skipped(k, skipped))


def same_rows(a: Sequence[dict], b: Sequence[dict]) -> bool:
    """Whether two runs' metrics rows are the same run: the same steps, each step's rows equal as ``same_record`` says."""
    by_step = {r["step"]: r for r in b}
    if sorted(r["step"] for r in a) != sorted(by_step) or len(by_step) != len(b):
        return False
    return all(same_record(r, by_step[r["step"]]) for r in a)


def same_summaries(a: dict, b: dict) -> bool:
    """Whether two runs' summaries are equal in every field both have, the measured ``wall_time`` aside."""
    return same_record(a, b, skipped=TIMING)


def no_op_seeds(runs: Sequence[dict], regime: str, objective: str, baseline: str,
                rows: dict[tuple[str, str, int], list[dict]] | None = None) -> list[int]:
    """The seeds where ``objective``'s run under ``regime`` is the same run as ``baseline``'s.

    ``runs``: ``results.json``'s runs (regime, objective, seed, summary); ``rows``: every run's metrics rows
    by ``(regime, objective, seed)``, or None to compare the summaries.
    """
    def of(label: str) -> dict[int, dict]:
        return {r["seed"]: r for r in runs if r["regime"] == regime and r["objective"] == label}

    mine, theirs = of(objective), of(baseline)
    same = []
    for seed in sorted(mine.keys() & theirs.keys()):
        if rows is None:
            equal = same_summaries(mine[seed]["summary"], theirs[seed]["summary"])
        else:
            equal = same_rows(rows[regime, objective, seed], rows[regime, baseline, seed])
        if equal:
            same.append(seed)
    return same


def rows_by_run(steps: Iterable[dict]) -> dict[tuple[str, str, int], list[dict]]:
    """``steps.json``'s runs as ``{(regime, objective, seed): rows}``."""
    return {(r["regime"], r["objective"], r["seed"]): r["rows"] for r in steps}
