"""The protocol file: baseline and pairs in YAML, merged with --baseline and --pair; gates, primary metrics and a
trend test; one line per problem, naming the YAML path and the value."""

import subprocess
import sys

import pytest

from rlstab.errors import ConfigError
from rlstab.lab.protocol import Gate, Protocol, Trend, check_arms, load_protocol, merged


def test_a_protocol_file(tmp_path):
    path = tmp_path / "token.yaml"
    path.write_text("baseline: grpo\npairs:\n  stapo: dapo\n  20-entropy: dapo\n  stare: dapo\n")
    protocol = load_protocol(path)
    assert protocol.baseline == "grpo"
    assert protocol.pair_items() == ["stapo=dapo", "20-entropy=dapo", "stare=dapo"]
    assert merged(protocol, None, ["dapo=grpo"]) == ("grpo", ["stapo=dapo", "20-entropy=dapo", "stare=dapo", "dapo=grpo"])
    assert merged(protocol, "grpo", []) == ("grpo", protocol.pair_items())
    assert merged(None, "dapo", ["stapo=dapo"]) == ("dapo", ["stapo=dapo"])
    (tmp_path / "empty.yaml").write_text("")
    assert load_protocol(tmp_path / "empty.yaml") == Protocol()


@pytest.mark.parametrize(("text", "message"), [
    ("- grpo\n", "a protocol file holds a mapping (baseline, pairs, gates, ...), not list"),
    ("baseline: grpo\npair: {stapo: dapo}\n", "pair"),
    ("pairs: [stapo, dapo]\n", "pairs"),
    ("pairs: {stapo: 3}\n", "pairs"),
    ("baseline: 7\n", "baseline"),
    ("baseline: ''\n", "baseline"),
    ("pairs: {stapo: dapo\n", "line"),
])
def test_a_bad_protocol_is_one_line(tmp_path, text, message):
    path = tmp_path / "p.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as err:
        load_protocol(path)
    assert str(err.value).startswith(f"{path}: ") and message in str(err.value)
    assert len(str(err.value).splitlines()) == 1


def test_a_missing_protocol_file_is_one_line(tmp_path):
    with pytest.raises(ConfigError) as err:
        load_protocol(tmp_path / "nope.yaml")
    assert len(str(err.value).splitlines()) == 1


def test_the_command_line_baseline_must_agree_with_the_protocols():
    with pytest.raises(ConfigError, match=r"^--baseline: 'dapo' differs from the protocol's baseline 'grpo'$"):
        merged(Protocol(baseline="grpo"), "dapo", [])


def test_a_bad_protocol_on_the_command_line_is_one_line_and_status_2(tmp_path):
    path = tmp_path / "p.yaml"
    path.write_text("pairs: {stapo: ppo}\n")
    done = subprocess.run([sys.executable, "-m", "rlstab", "compare", "--objective", "grpo", "--objective", "stapo",
                           "--protocol", str(path), "--out", str(tmp_path / "out"), "--quiet"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    assert done.stderr == "rlstab compare: --pair stapo=ppo: 'ppo' is not one of the objectives (grpo, stapo)\n"
    assert not (tmp_path / "out").exists()


FULL = """
baseline: dapo-shadow
gates:
  stapo: {mask: s2t, at_least: 1.0e-4, on_share_of_steps: 0.2}
  dapo-shadow: {mask: shadow/s2t, at_least: 1.0e-4, on_share_of_steps: 1}
fallback: "if a gate fails: another dose"
primary: [entropy_ratio, final distinct right answers]
trend:
  arms: [dapo-shadow, stapo-low, stapo, stapo-high]
  doses: [0, 0.002, 0.01, 0.05]
  metric: entropy ratio
"""


def test_gates_primary_metrics_and_a_trend(tmp_path):
    path = tmp_path / "protocol.yaml"
    path.write_text(FULL)
    protocol = load_protocol(path)
    assert protocol.gates == {"stapo": Gate(mask="s2t", at_least=1e-4, on_share_of_steps=0.2),
                              "dapo-shadow": Gate(mask="shadow/s2t", at_least=1e-4, on_share_of_steps=1.0)}
    assert protocol.fallback == "if a gate fails: another dose"
    # a metric by its key or by the report's name; the protocol holds the keys
    assert protocol.primary == ["entropy_ratio", "final_distinct_correct"]
    assert protocol.trend == Trend(arms=["dapo-shadow", "stapo-low", "stapo", "stapo-high"], doses=[0, 0.002, 0.01, 0.05],
                                   metric="entropy_ratio")
    assert protocol.decides and not Protocol(baseline="grpo").decides


@pytest.mark.parametrize(("text", "line"), [
    ("gates: {stapo: {mask: s2t, at_least: 0, on_share_of_steps: 0.2}}",
     "gates.stapo.at_least = 0: Input should be greater than 0"),
    ("gates: {stapo: {mask: s2t, at_least: 1.5, on_share_of_steps: 0.2}}",
     "gates.stapo.at_least = 1.5: Input should be less than or equal to 1"),
    ("gates: {stapo: {mask: s2t, at_least: .nan, on_share_of_steps: 0.2}}",
     "gates.stapo.at_least = nan: Input should be a finite number"),
    ("gates: {stapo: {mask: s2t, at_least: 1.0e-4, on_share_of_steps: -1}}",
     "gates.stapo.on_share_of_steps = -1: Input should be greater than 0"),
    ("gates: {stapo: {mask: s2t, at_least: '1e-4', on_share_of_steps: 0.2}}",
     "gates.stapo.at_least = '1e-4': Input should be a valid number"),
    ("gates: {stapo: {mask: 's2t now', at_least: 1.0e-4, on_share_of_steps: 0.2}}",
     "gates.stapo.mask = 's2t now': String should match pattern"),
    ("gates: {stapo: {mask: s2t, at_least: 1.0e-4}}", "gates.stapo.on_share_of_steps: required field is missing"),
    ("gates: {stapo: {mask: s2t, at_least: 1.0e-4, on_share_of_steps: 0.2, share: 1}}",
     "gates.stapo.share: unknown field (value 1)"),
    ("gates: [stapo]", "gates = ['stapo']: Input should be a valid dictionary"),
    ("fallback: 7", "fallback = 7: Input should be a valid string"),
    ("primary: []", "primary = []: List should have at least 1 item"),
    ("primary: [entropy_ratios]", "primary[0] = 'entropy_ratios': not a summary metric the report compares; "
                                  "did you mean 'entropy_ratio'?"),
    ("primary: [wall_time]", "primary[0] = 'wall_time': not a summary metric the report compares"),
    ("primary: [entropy_ratio, entropy_ratio]", "primary[1] = 'entropy_ratio': given twice"),
    ("primary: [entropy_ratio, entropy ratio]", "primary[1] = 'entropy ratio': given twice"),
    ("trend: {arms: [a, b, c], doses: [0, 1], metric: entropy_ratio}",
     "trend.doses = [0, 1]: List should have at least 3 items"),
    ("trend: {arms: [a, b, c], doses: [0, 1, 2, 3], metric: entropy_ratio}",
     "trend.doses = [0.0, 1.0, 2.0, 3.0]: one dose per arm (3 arms, 4 doses)"),
    ("trend: {arms: [a, b, a], doses: [0, 1, 2], metric: entropy_ratio}", "trend.arms[2] = 'a': given twice"),
    ("trend: {arms: [a, b, c], doses: [0, 1, 1], metric: entropy_ratio}",
     "trend.doses[2] = 1.0: given twice; the doses are ranked, so each arm needs its own"),
    ("trend: {arms: [a, b, c], doses: [0, 1, 2], metric: entropy}", "trend.metric = 'entropy': not a summary metric"),
    ("trend: {arms: [a, b, c], doses: [0, 1, .inf], metric: entropy_ratio}", "trend.doses[2] = inf: Input should be a finite number"),
    ("trend: {arms: [a, b, c], metric: entropy_ratio}", "trend.doses: required field is missing"),
])
def test_a_bad_gate_primary_or_trend_is_one_line_naming_its_path(tmp_path, text, line):
    path = tmp_path / "p.yaml"
    path.write_text(text + "\n")
    with pytest.raises(ConfigError) as err:
        load_protocol(path)
    assert str(err.value).startswith(f"{path}: {line}"), str(err.value)
    assert len(str(err.value).splitlines()) == 1


def test_the_arms_and_masks_are_checked_against_the_objectives():
    protocol = Protocol(gates={"stapo": Gate(mask="s2t_0", at_least=1e-4, on_share_of_steps=0.2),
                               "ppo": Gate(mask="s2t", at_least=1e-4, on_share_of_steps=0.2)},
                        trend=Trend(arms=["grpo", "stapo", "dapo"], doses=[0, 1, 2], metric="entropy_ratio"))
    assert check_arms(protocol, ["grpo", "stapo"], {"grpo": [], "stapo": ["s2t"]}) == [
        "protocol gates.stapo.mask = 's2t_0': stapo has no such mask (its masks: s2t)",
        "protocol gates.ppo: 'ppo' is not one of the objectives (grpo, stapo)",
        "protocol trend.arms[2] = 'dapo': not one of the objectives (grpo, stapo)",
    ]
    assert check_arms(Protocol(gates={"stapo": Gate(mask="s2t", at_least=1e-4, on_share_of_steps=0.2)}),
                      ["grpo", "stapo"], {"grpo": [], "stapo": ["s2t"]}) == []


def test_a_gate_on_a_mask_its_objective_lacks_is_refused_before_anything_runs(tmp_path):
    path = tmp_path / "p.yaml"
    path.write_text("gates: {stapo: {mask: shadow/s2t, at_least: 1.0e-4, on_share_of_steps: 0.2}}\n")
    done = subprocess.run([sys.executable, "-m", "rlstab", "compare", "--objective", "grpo", "--objective", "stapo",
                           "--protocol", str(path), "--out", str(tmp_path / "out"), "--quiet"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    assert done.stderr == ("rlstab compare: protocol gates.stapo.mask = 'shadow/s2t': stapo has no such mask "
                           "(its masks: s2t)\n")
    assert not (tmp_path / "out").exists()
