"""The demo's outputs: ``metrics.jsonl``, ``curves.png`` and ``summary.md``, plus the progress bar.

``metrics.jsonl`` is written row by row while the run goes, so a long run can be watched (and a
crashed one still says how far it got); the figure and the summary are written at the end.
matplotlib is imported inside :func:`write_curves` (Agg backend, no display needed), so neither
``rlstab --help`` nor the tests of the other outputs pay for it.
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TextIO

METRICS_FILE = "metrics.jsonl"
CURVES_FILE = "curves.png"
SUMMARY_FILE = "summary.md"
ONE_SEED_NOTE = (
    "One seed: this shows what each objective does, not which trains better; differences of a few points are "
    "within seed-to-seed noise. `rlstab compare --objective A --objective B --seeds 5` reports them with 95% intervals."
)


class MetricsWriter:
    """Appends one JSON row per line to ``<out>/metrics.jsonl`` (truncated when opened)."""

    def __init__(self, out: Path):
        self.path = Path(out) / METRICS_FILE
        self._file = self.path.open("w")

    def write(self, row: dict) -> None:
        self._file.write(json.dumps(row, sort_keys=False) + "\n")
        self._file.flush()

    def close(self) -> None:
        self._file.close()


def read_metrics(path: Path) -> list[dict]:
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


class ProgressBar:
    """A one-line text progress bar on stderr; one line per update when stderr is not a terminal.

    Off a terminal (CI logs, files) only every ``total // 10``-th step and the last are printed,
    so logs stay short.
    """

    def __init__(self, label: str, total: int, stream: TextIO | None = None, width: int = 24):
        self.label, self.total, self.width = label, total, width
        self.stream = stream or sys.stderr
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self._every = max(1, total // 10)

    def update(self, step: int, text: str) -> None:
        filled = round(self.width * step / max(1, self.total))
        line = f"[{self.label}] {step:>4}/{self.total} |{'#' * filled}{'.' * (self.width - filled)}| {text}"
        if self.tty:
            self.stream.write("\r" + line.ljust(120)[:160])
            if step == self.total:
                self.stream.write("\n")
        elif step % self._every == 0 or step == self.total:
            self.stream.write(line + "\n")
        self.stream.flush()


def progress_text(row: dict, accuracy: float, silenced_so_far: float) -> str:
    """The progress bar's text after a step: its reward, the latest held-out ``accuracy``, its entropy, and
    the valid tokens the masks silenced over the run so far (at the last step, the summary's total), with
    this step's count after it: a mask that silences a few tokens in some steps (STAPO) shows them even
    where the bar prints only every tenth step."""
    return (f"reward {row['reward']:.2f}  held-out acc {accuracy:.2f}  entropy {row['entropy']:.3f}  "
            f"silenced {int(silenced_so_far)} so far ({int(row['silenced'])} this step)")


def _series(rows: Sequence[dict], field: str) -> tuple[list[int], list[float]]:
    points = [(r["step"], r[field]) for r in rows if r.get(field) is not None]
    return [p[0] for p in points], [p[1] for p in points]


def by_objective(rows: Sequence[dict]) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for row in rows:
        out.setdefault(row["objective"], []).append(row)
    return out


def moving_average(values: Sequence[float], window: int) -> list[float]:
    """Trailing mean over up to ``window`` values (the first points average what there is)."""
    out, total = [], 0.0
    for i, v in enumerate(values):
        total += v
        if i >= window:
            total -= values[i - window]
        out.append(total / min(i + 1, window))
    return out


SMOOTHING = 5  # steps in the solid line of the noisy panels


def write_curves(rows: Sequence[dict], path: Path, title: str) -> Path:
    """Four panels against the RL step, one colour per objective: held-out accuracy, rollout
    reward, mean token entropy and the percentage of valid tokens the objective's masks silenced.

    Per-step values of the three noisy panels are drawn faint, with a solid trailing
    ``SMOOTHING``-step mean over them; accuracy is drawn as measured (markers at evaluated steps).
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    smooth_note = f"faint: per step, solid: {SMOOTHING}-step mean"
    panels = [
        ("accuracy", "Held-out accuracy (greedy, exact match)", "accuracy", 1.0),
        ("reward", f"Rollout reward ({smooth_note})", "mean reward of the samples", 1.0),
        ("entropy", f"Policy entropy ({smooth_note})", "nats per response token", 1.0),
        ("silenced_fraction", f"Tokens silenced by masks ({smooth_note})", "% of valid tokens", 100.0),
    ]
    fig, axes = plt.subplots(2, 2, figsize=(12, 8), sharex=True)
    for (field, panel_title, ylabel, scale), ax in zip(panels, axes.flat):
        for name, obj_rows in by_objective(rows).items():
            x, y = _series(obj_rows, field)
            y = [v * scale for v in y]
            if field == "accuracy":
                ax.plot(x, y, marker="o", markersize=3, linewidth=1.8, label=name)
            else:
                (line,) = ax.plot(x, moving_average(y, SMOOTHING), linewidth=1.8, label=name)
                ax.plot(x, y, linewidth=0.8, alpha=0.3, color=line.get_color())
        ax.set_title(panel_title, fontsize=10.5)
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    for ax in axes[1]:
        ax.set_xlabel("RL step")
    axes[0, 0].set_ylim(0, 1)
    top = max(axes[1, 1].get_ylim()[1], 1e-3)
    axes[1, 1].set_ylim(-0.03 * top, top)  # a little room below 0, so an objective without masks shows
    axes[0, 0].legend(title="objective", loc="upper left")
    fig.suptitle(title, fontsize=12)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return Path(path)


def _fmt(x: float | None, digits: int = 3) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "–"
    return f"{x:.{digits}f}"


def objective_summary(rows: Sequence[dict], wall_time: float) -> dict:
    """The summary numbers of one objective's rows (step 0 first)."""
    steps = [r for r in rows if r["step"] > 0]
    accuracies = [r["accuracy"] for r in rows if r.get("accuracy") is not None]
    last = steps[-1] if steps else {}
    tail = steps[-5:]

    def mean(field):
        values = [r[field] for r in steps]
        return sum(values) / len(values) if values else None

    return {
        "start_accuracy": accuracies[0] if accuracies else None,
        "final_accuracy": accuracies[-1] if len(accuracies) > 1 else None,
        "best_accuracy": max(accuracies) if accuracies else None,
        "final_reward": sum(r["reward"] for r in tail) / len(tail) if tail else None,
        "final_entropy": last.get("entropy"),
        "silenced_total": sum(r["silenced"] for r in steps),
        "clip_high": mean("clip_high_fraction"),
        "clip_low": mean("clip_low_fraction"),
        "clip_dual": mean("clip_dual_fraction"),
        "wall_time": wall_time,
    }


def summary_table(rows: Sequence[dict], wall_times: dict[str, float]) -> str:
    """The markdown table of :func:`write_summary`, one row per objective."""
    lines = [
        "| objective | start acc | final acc | best acc | reward (last 5) | entropy | silenced tokens "
        "| clip high | clip low | clip dual | wall time (s) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, obj_rows in by_objective(rows).items():
        s = objective_summary(obj_rows, wall_times.get(name, float("nan")))
        lines.append(
            f"| {name} | {_fmt(s['start_accuracy'])} | {_fmt(s['final_accuracy'])} | {_fmt(s['best_accuracy'])} "
            f"| {_fmt(s['final_reward'])} | {_fmt(s['final_entropy'])} | {int(s['silenced_total'])} "
            f"| {_fmt(s['clip_high'], 4)} | {_fmt(s['clip_low'], 4)} | {_fmt(s['clip_dual'], 4)} "
            f"| {_fmt(s['wall_time'], 1)} |"
        )
    return "\n".join(lines)


def write_summary(rows: Sequence[dict], wall_times: dict[str, float], path: Path, header: Sequence[str]) -> Path:
    """``summary.md``: the run's settings, then one table row per objective."""
    text = "\n".join(
        [
            "# rlstab demo summary",
            "",
            *header,
            "",
            summary_table(rows, wall_times),
            "",
            ONE_SEED_NOTE,
            "",
            "start acc: the warm-started policy's held-out accuracy (greedy exact match) before RL; final acc: after "
            "the last step. reward: mean exact-match reward of the sampled responses, over the last 5 steps. entropy: "
            "mean next-token entropy over the last step's response tokens. silenced tokens: valid tokens that the "
            "objective's masks removed from the loss, summed over all steps. clip: fraction of valid tokens whose "
            "gradient the clip removed, averaged over steps. wall time: the objective's RL steps and evaluations "
            "(the shared warm start not included).",
            "",
        ]
    )
    Path(path).write_text(text)
    return Path(path)
