"""``rlstab.demo.report``: the demo's metrics.jsonl, progress bar, smoothing and summary, values worked by hand.

``write_curves`` (matplotlib, seconds to import) is drawn by the demo's own tests (tests/demo/test_demo_command.py).
"""

from __future__ import annotations

import io

import pytest

from rlstab.demo import report


class Terminal(io.StringIO):
    def isatty(self):
        return True


def row(objective, step, reward, accuracy=None, silenced=0.0, clip_high=0.0, entropy=1.0):
    return {"objective": objective, "step": step, "reward": reward, "accuracy": accuracy, "entropy": entropy,
            "silenced": silenced, "silenced_fraction": 0.0, "clip_high_fraction": clip_high,
            "clip_low_fraction": 0.0, "clip_dual_fraction": 0.0}


# Two objectives, step 0 (accuracy only) then steps 1..6; accuracy evaluated at steps 0, 3 and 6.
ROWS = [{"objective": "grpo", "step": 0, "accuracy": 0.5}]
ROWS += [row("grpo", s, reward=s / 10, accuracy={3: 0.75, 6: 0.625}.get(s), silenced=s, clip_high=0.5 if s == 6 else 0.0,
             entropy=2.0 - s / 10) for s in range(1, 7)]
ROWS += [{"objective": "stapo", "step": 0, "accuracy": 0.5}, row("stapo", 1, reward=1.0)]


def test_metrics_are_written_a_row_a_line_and_read_back(tmp_path):
    writer = report.MetricsWriter(tmp_path)
    writer.write(ROWS[0])
    assert report.read_metrics(tmp_path / "metrics.jsonl") == [ROWS[0]]  # flushed: readable while the run goes
    writer.write(ROWS[1])
    writer.close()
    assert (tmp_path / "metrics.jsonl").read_text().count("\n") == 2
    assert report.read_metrics(tmp_path / "metrics.jsonl") == ROWS[:2]
    report.MetricsWriter(tmp_path).close()  # a new run truncates the file
    assert report.read_metrics(tmp_path / "metrics.jsonl") == []


def test_the_moving_average_trails_over_what_there_is():
    # (1)/1, (1+2)/2, (1+2+3)/3, (2+3+4)/3, (3+4+8)/3
    assert report.moving_average([1, 2, 3, 4, 8], 3) == [1.0, 1.5, 2.0, 3.0, 5.0]
    assert report.moving_average([], 5) == []


def test_rows_are_grouped_by_objective_in_order():
    grouped = report.by_objective(ROWS)
    assert list(grouped) == ["grpo", "stapo"] and [len(v) for v in grouped.values()] == [7, 2]


def test_an_objectives_summary():
    s = report.objective_summary(report.by_objective(ROWS)["grpo"], wall_time=12.5)
    assert (s["start_accuracy"], s["final_accuracy"], s["best_accuracy"]) == (0.5, 0.625, 0.75)
    assert s["final_reward"] == pytest.approx(0.4)  # steps 2..6: (0.2 + 0.3 + 0.4 + 0.5 + 0.6) / 5
    assert s["final_entropy"] == pytest.approx(1.4)  # the last step's: 2 - 0.6
    assert s["silenced_total"] == 21  # 1 + 2 + ... + 6
    assert s["clip_high"] == pytest.approx(0.5 / 6) and s["clip_low"] == 0.0  # one step of six at 0.5
    only_start = report.objective_summary(ROWS[:1], wall_time=0.0)
    assert only_start["final_accuracy"] is None and only_start["final_reward"] is None  # no step yet


def test_the_summary_table_has_a_row_per_objective(tmp_path):
    table = report.summary_table(ROWS, {"grpo": 12.5})
    lines = table.splitlines()
    assert len(lines) == 4 and lines[0].count("|") == lines[1].count("|") == 12
    assert lines[2] == "| grpo | 0.500 | 0.625 | 0.750 | 0.400 | 1.400 | 21 | 0.0833 | 0.0000 | 0.0000 | 12.5 |"
    # stapo: no accuracy after the start, no wall time given: a dash, not "nan"
    assert lines[3] == "| stapo | 0.500 | – | 0.500 | 1.000 | 1.000 | 0 | 0.0000 | 0.0000 | 0.0000 | – |"
    path = report.write_summary(ROWS, {"grpo": 12.5}, tmp_path / "summary.md", ["- task: add2"])
    text = path.read_text()
    assert text.startswith("# rlstab demo summary\n\n- task: add2\n\n| objective |")
    assert table in text and report.ONE_SEED_NOTE in text


def test_off_a_terminal_the_bar_prints_every_tenth_step_and_the_last():
    stream = io.StringIO()
    bar = report.ProgressBar("grpo", 25, stream=stream, width=5)
    for step in range(1, 26):
        bar.update(step, f"s{step}")
    lines = stream.getvalue().splitlines()
    assert [line.split("|")[-1].strip() for line in lines] == ["s2", "s4", "s6", "s8", "s10", "s12", "s14", "s16",
                                                            "s18", "s20", "s22", "s24", "s25"]  # 25 // 10 = 2
    assert lines[0] == "[grpo]    2/25 |.....| s2"  # round(5 * 2 / 25) = 0 filled
    assert lines[-1] == "[grpo]   25/25 |#####| s25"


def test_on_a_terminal_the_bar_redraws_one_line():
    stream = Terminal()
    bar = report.ProgressBar("grpo", 4, stream=stream, width=4)
    bar.update(1, "a")
    bar.update(4, "b")
    text = stream.getvalue()
    assert text.count("\r") == 2 and text.endswith("\n") and text.count("\n") == 1
    assert "\r[grpo]    1/4 |#...| a" in text  # round(4 * 1 / 4) = 1 filled


def test_the_progress_text():
    text = report.progress_text({"reward": 0.456, "entropy": 1.23456, "silenced": 3.0}, 0.5, 17.0)
    assert text == "reward 0.46  held-out acc 0.50  entropy 1.235  silenced 17 so far (3 this step)"

