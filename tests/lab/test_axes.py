"""The lab figures' axes: whole-number steps at any run length, and a silenced-percent axis on which
STAPO's 0.028% can be read, beside nothing silenced and beside 20-Entropy's 80%."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

matplotlib = pytest.importorskip("matplotlib")
matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from rlstab.lab.axes import integer_steps, percent_axis  # noqa: E402
from rlstab.lab.report import write_curves  # noqa: E402


def shown_ticks(ax, axis: str = "y") -> list[float]:
    """The major ticks of ``axis`` inside its limits, after drawing."""
    ax.figure.canvas.draw()
    lo, hi = ax.get_ylim() if axis == "y" else ax.get_xlim()
    ticks = ax.get_yticks() if axis == "y" else ax.get_xticks()
    return [float(t) for t in ticks if lo <= t <= hi]


def test_three_steps_have_ticks_at_whole_steps_only():
    fig, ax = plt.subplots()
    ax.plot([1, 2, 3], [0.1, 0.2, 0.3])
    assert 1.5 in shown_ticks(ax, "x")  # matplotlib's own ticks, which the lab's figures had
    integer_steps(ax)
    assert shown_ticks(ax, "x") == [1.0, 2.0, 3.0]
    plt.close(fig)


def test_a_long_run_keeps_round_step_ticks():
    fig, ax = plt.subplots()
    ax.plot(range(101), range(101))
    integer_steps(ax)
    assert shown_ticks(ax, "x") == [0.0, 20.0, 40.0, 60.0, 80.0, 100.0]
    plt.close(fig)


def percent_panel(values):
    fig, ax = plt.subplots()
    ax.plot(range(len(values)), values)
    percent_axis(ax, values)
    return fig, ax


def test_stapos_fraction_beside_nothing_is_on_a_linear_axis_of_its_size():
    fig, ax = percent_panel([0.0, 0.028])
    assert ax.get_yscale() == "linear"
    lo, hi = ax.get_ylim()
    assert -0.001 < lo < 0 and hi == pytest.approx(1.1 * 0.028)  # not 0..1: 0.028 fills the panel
    assert len([t for t in shown_ticks(ax) if 0 < t < 0.028]) >= 2  # labelled values below it
    assert ax.yaxis.get_major_formatter()(0.01, 0) == "0.01"
    plt.close(fig)


def test_stapos_fraction_beside_80_percent_is_on_a_log_decade():
    fig, ax = percent_panel([0.0, 0.028, 80.0])
    assert ax.get_yscale() == "symlog"
    assert ax.yaxis.get_transform().linthresh == 0.01  # the decade of 0.028: it sits on the log part
    lo, hi = ax.get_ylim()
    assert lo == pytest.approx(-0.002) and hi == pytest.approx(120.0)
    ticks = shown_ticks(ax)
    assert {0.0, 0.01, 0.1, 1.0, 10.0, 100.0} <= set(ticks)  # 0.028 lies between labelled 0.01 and 0.1
    assert not [t for t in ticks if t < 0]  # a fraction has no negative tick
    plt.close(fig)


def test_nothing_silenced_is_a_labelled_axis_from_0():
    fig, ax = percent_panel([0.0, 0.0, float("nan")])
    assert ax.get_yscale() == "linear" and ax.get_ylim() == (-0.03, 1.0)
    plt.close(fig)


def test_a_three_step_comparison_figure(tmp_path, monkeypatch):
    """curves.png of 3 steps: whole-step ticks under every column, stapo's 0.028% readable on each."""
    runs = []
    for regime, fractions in (("a", {"grpo": 0.0, "stapo": 0.00028}), ("b", {"grpo": 0.0, "stapo": 0.00028, "entropy20": 0.8})):
        for objective, fraction in fractions.items():
            folder = f"runs/{regime}/{objective}/seed1"
            (tmp_path / folder).mkdir(parents=True)
            rows = [{"step": 0, "accuracy": 0.5}] + [
                {"step": s, "reward": 0.5, "entropy": 1.0, "grad_norm": 2.0, "silenced_fraction": fraction, "accuracy": None}
                for s in (1, 2, 3)
            ]
            (tmp_path / folder / "metrics.jsonl").write_text("\n".join(map(json.dumps, rows)))
            runs.append({"regime": regime, "objective": objective, "seed": 1, "folder": folder})
    data = {"settings": {"regimes": {"a": {}, "b": {}}, "seeds": [1]}, "runs": runs}
    figures = []
    monkeypatch.setattr(plt, "close", figures.append)
    path = write_curves(SimpleNamespace(labels=["grpo", "stapo", "entropy20"], out=tmp_path), data, tmp_path / "curves.png")
    assert Path(path).stat().st_size > 0
    (fig,) = figures
    axes = fig.axes  # row by row: 5 panels x 2 regimes
    silenced_a, silenced_b = axes[-2], axes[-1]
    for ax in axes[-2:]:
        assert shown_ticks(ax, "x") == [0.0, 1.0, 2.0, 3.0]
    assert silenced_a.get_yscale() == "linear" and silenced_a.get_ylim()[1] == pytest.approx(1.1 * 0.028)
    assert silenced_b.get_yscale() == "symlog" and silenced_b.yaxis.get_transform().linthresh == 0.01
    monkeypatch.undo()
    plt.close(fig)
