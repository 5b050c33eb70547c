"""The protocol file: baseline and pairs in YAML, merged with --baseline and --pair, one line per problem."""

import subprocess
import sys

import pytest

from rlstab.errors import ConfigError
from rlstab.lab.protocol import Protocol, load_protocol, merged


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
    ("- grpo\n", "a protocol file holds a mapping (baseline, pairs), not list"),
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
