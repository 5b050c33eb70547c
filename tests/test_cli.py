"""The ``rlstab`` command: presets, validate, explain, schema."""

from __future__ import annotations

import errno
import io
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import rlstab
from rlstab.cli import main


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text).lstrip())
    return path


def run_cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "rlstab", *args], capture_output=True, text=True, cwd=cwd, timeout=120
    )


GOOD = """
extends: stapo
name: my-stapo
masks:
  - {kind: s2t, tau_p: 0.001}
"""

# name: (yaml text, substrings naming the YAML path / problem, the offending value)
BAD = {
    "unknown_kind": ("extends: stapo\nmasks:\n  - {kind: s2tt}\n", ["masks[0].kind", "'s2tt'"]),
    "misspelled_field": (
        "extends: stapo\nmasks:\n  - {kind: entropy_quantile, entropy_quantil: 0.3}\n",
        ["masks[0].entropy_quantil", "0.3"],
    ),
    "out_of_range": ("extends: stapo\nmasks:\n  - {kind: s2t, tau_p: 1.5}\n", ["masks[0].tau_p", "1.5"]),
    "wrong_type": ("extends: dapo\nsurrogate: {eps_high: abc}\n", ["surrogate.eps_high", "'abc'"]),
    "malformed": ("extends: dapo\nsurrogate: {eps_high: 0.3\nmasks: []\n", ["malformed YAML", "line 3"]),
    "python_tag": (
        'extends: dapo\nname: !!python/object/apply:os.system ["echo hacked"]\n',
        ["line 2", "python/object/apply:os.system"],
    ),
    "duplicate_key": ("extends: dapo\nname: a\nname: b\n", ["duplicate key 'name'", "line 3"]),
    "not_a_mapping": ("- grpo\n- dapo\n", ["<top level>", "list"]),
    "missing_count": ("name: x\naggregation: {kind: token-mean}\n", ["aggregation.count", "missing"]),
    "circular": ("extends: circular.yaml\n", ["circular"]),
    "bad_extends": ("extends: no-such-preset\n", ["extends", "'no-such-preset'"]),
}


# ----------------------------------------------------------------------------- presets


def test_presets_one_line_each(capsys):
    assert main(["presets"]) == 0
    out, err = capsys.readouterr()
    assert err == ""
    lines = out.splitlines()
    names = rlstab.preset_names()
    assert len(lines) == len(names)
    assert [line.split()[0] for line in lines] == list(names)
    for line in lines:
        assert len(line.split()) > 1  # a description follows the name


# ----------------------------------------------------------------------------- validate


def test_validate_good_file(tmp_path, capsys):
    path = write(tmp_path / "good.yaml", GOOD)
    assert main(["validate", str(path)]) == 0
    out, err = capsys.readouterr()
    assert err == ""
    assert out.strip() == f"{path}: ok (my-stapo)"


def test_validate_preset_name(capsys):
    assert main(["validate", "stapo"]) == 0
    assert "ok" in capsys.readouterr().out


@pytest.mark.parametrize("case", sorted(BAD))
def test_validate_bad_file(tmp_path, capsys, case):
    text, expected = BAD[case]
    path = write(tmp_path / f"{case}.yaml", text)
    code = main(["validate", str(path)])
    out, err = capsys.readouterr()
    assert code != 0
    assert out == ""
    message = err.strip()
    assert len(message.splitlines()) == 1, message
    assert len(message) < 300, message
    assert str(tmp_path) in message and ".yaml" in message  # names the file
    for part in expected:
        assert part in message, (part, message)
    assert "Traceback" not in err


def test_validate_python_tag_not_executed(tmp_path, capsys):
    marker = tmp_path / "hacked"
    path = write(
        tmp_path / "evil.yaml", f'extends: dapo\nname: !!python/object/apply:os.system ["touch {marker}"]\n'
    )
    assert main(["validate", str(path)]) != 0
    capsys.readouterr()
    assert not marker.exists()


def test_validate_several_files_one_bad(tmp_path, capsys):
    good = write(tmp_path / "good.yaml", GOOD)
    bad = write(tmp_path / "bad.yaml", BAD["out_of_range"][0])
    good2 = write(tmp_path / "good2.yaml", "extends: grpo\n")
    code = main(["validate", str(good), str(bad), str(good2)])
    out, err = capsys.readouterr()
    assert code != 0
    assert f"{good}: ok" in out
    assert f"{good2}: ok" in out
    assert str(bad) not in out
    assert str(bad) in err and "masks[0].tau_p" in err
    assert str(good) not in err
    assert "Traceback" not in err


def test_validate_missing_file(tmp_path, capsys):
    missing = tmp_path / "missing.yaml"
    assert main(["validate", str(missing)]) != 0
    out, err = capsys.readouterr()
    assert str(missing) in err
    assert "Traceback" not in err


def test_validate_needs_a_file(capsys):
    with pytest.raises(SystemExit) as info:
        main(["validate"])
    assert info.value.code != 0
    capsys.readouterr()


@pytest.mark.parametrize("case", ["out_of_range", "python_tag", "malformed"])
def test_validate_subprocess_bad(tmp_path, case):
    text, expected = BAD[case]
    marker = tmp_path / "hacked"
    if case == "python_tag":
        text = f'extends: dapo\nname: !!python/object/apply:os.system ["touch {marker}"]\n'
        expected = ["python/object/apply:os.system"]
    path = write(tmp_path / f"{case}.yaml", text)
    result = run_cli("validate", str(path))
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    assert result.stdout == ""
    message = result.stderr.strip()
    assert len(message.splitlines()) == 1
    assert message.startswith(f"{path}: ")
    for part in expected:
        assert part in message
    assert not marker.exists()


def test_validate_subprocess_good_and_relative_extends(tmp_path):
    write(tmp_path / "base" / "base.yaml", "extends: dapo\nname: base\n")
    write(tmp_path / "cfg" / "child.yaml", "extends: ../base/base.yaml\nname: child\n")
    result = run_cli("validate", "cfg/child.yaml", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "cfg/child.yaml: ok (child)"
    assert result.stderr == ""


def test_validate_subprocess_several_files(tmp_path):
    good = write(tmp_path / "good.yaml", GOOD)
    bad = write(tmp_path / "bad.yaml", BAD["unknown_kind"][0])
    result = run_cli("validate", str(good), str(bad))
    assert result.returncode == 1
    assert f"{good}: ok" in result.stdout
    assert str(bad) in result.stderr and "masks[0].kind" in result.stderr
    assert "Traceback" not in result.stderr


# ----------------------------------------------------------------------------- explain


def test_explain_stapo(capsys):
    assert main(["explain", "stapo"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0] == "stapo"
    assert "0.002" in out  # tau_p
    assert "Q_0.8" in out  # the 0.8 entropy quantile
    assert "clip(r, 0.8, 1.28)" in out
    assert "-10 A" in out and "dual-clip" in out
    assert "kept tokens" in out
    assert "masks[0] s2t" in out


def test_explain_dr_grpo_differs(capsys):
    assert main(["explain", "dr_grpo"]) == 0
    out = capsys.readouterr().out
    assert "seq-mean-token-sum-norm" in out
    assert "Dr.GRPO" in out
    assert "M   =" not in out  # no masks


def test_explain_file(tmp_path, capsys):
    path = write(
        tmp_path / "mine.yaml",
        """
        extends: stapo
        name: mine
        masks:
          - {kind: entropy_quantile, rho: 0.35, side: bottom}
        surrogate: {eps_high: 0.4}
        regularisers:
          - {kind: kl, coef: 0.05, estimator: k2}
        """,
    )
    assert main(["explain", str(path)]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0] == "mine"
    assert "entropy_quantile" in out and "Q_0.35" in out
    acting = [line.split(":")[0].strip() for line in out.splitlines() if line.strip().startswith("masks[")]
    assert acting == ["masks[0] entropy_quantile"]  # the list override replaced the s2t mask...
    assert f"{path}: note: masks replaces the masks of preset stapo, dropping s2t (masks[0])" in out  # ...and says so
    assert "clip(r, 0.8, 1.4)" in out
    assert "0.05" in out and "k2" in out


def test_explain_bad_file(tmp_path, capsys):
    path = write(tmp_path / "bad.yaml", BAD["wrong_type"][0])
    assert main(["explain", str(path)]) != 0
    out, err = capsys.readouterr()
    assert out == ""
    assert str(path) in err and "surrogate.eps_high" in err


def test_explain_subprocess():
    result = run_cli("explain", "stapo")
    assert result.returncode == 0
    assert "0.002" in result.stdout
    result = run_cli("explain", "no-such-thing")
    assert result.returncode != 0
    assert "no-such-thing" in result.stderr
    assert "Traceback" not in result.stderr


# ----------------------------------------------------------------------------- schema


def _resolve_ref(schema: dict, node: dict) -> dict:
    ref = node.get("$ref")
    if ref is None:
        return node
    assert ref.startswith("#/$defs/")
    return schema["$defs"][ref.split("/")[-1]]


def test_schema(capsys):
    assert main(["schema"]) == 0
    schema = json.loads(capsys.readouterr().out)
    props = schema["properties"]
    assert {"masks", "surrogate", "aggregation", "advantage", "regularisers", "extends"} <= set(props)
    assert schema.get("additionalProperties") is False
    assert props["masks"]["type"] == ["array", "object"]  # a list, or {append: [...]} / {replace: [...]}
    items = props["masks"]["items"]
    mask_kinds = {"s2t", "low_probability", "entropy_quantile", "expression", "icepop", "rollout_rejection",
                  "rollout_veto", "lopti", "random_silence", "bypass_rejection", "off_policy_sequence",
                  "gtpo_entropy_filter"}
    assert set(items["properties"]["kind"]["enum"]) == mask_kinds
    kinds = set()
    for rule in items["allOf"]:  # if kind is k then k's own schema
        definition = _resolve_ref(schema, rule["then"])
        kinds.add(definition["properties"]["kind"]["const"])
        assert rule["if"]["properties"]["kind"]["const"] == definition["properties"]["kind"]["const"]
        assert definition.get("additionalProperties") is False
    assert kinds == mask_kinds
    s2t = schema["$defs"]["S2T"]["properties"]["tau_p"]
    assert s2t["default"] == 0.002
    assert s2t["exclusiveMaximum"] == 1.0


def test_schema_subprocess_is_json():
    result = run_cli("schema")
    assert result.returncode == 0
    schema = json.loads(result.stdout)
    assert "surrogate" in schema["properties"]


def test_no_command_is_usage_error():
    result = run_cli()
    assert result.returncode == 2
    assert "usage" in result.stderr
    assert "Traceback" not in result.stderr


# ----------------------------------------------------------------------------- hostile files


def hostile_corpus(directory: Path) -> dict[str, bytes | None]:
    """The files that once gave a traceback, a hang or a forged line: name -> bytes (None: made apart)."""
    corpus = {
        "deep_flow.yaml": b"a: " + b"[" * 5000,
        "deep_map.yaml": b"a: " + b"{a: " * 5000,
        "deep_block.yaml": "".join(" " * i + "a:\n" for i in range(400)).encode(),
        "latin1.yaml": "extends: grpo\nname: café\n".encode("latin-1"),
        "utf16.yaml": "extends: grpo\nname: ok16\n".encode("utf-16"),
        "utf32.yaml": "extends: grpo\nname: ok32\n".encode("utf-32"),
        "via_utf16.yaml": b"extends: utf16.yaml\nname: via16\n",
        "via_latin1.yaml": b"extends: latin1.yaml\n",
        "complex_key.yaml": b"extends: grpo\n? [a, b]\n: 1\n",
        "complex_kind_key.yaml": b"extends: grpo\n? {kind: s2t}\n: 1\n",
        "bigint.yaml": b"extends: grpo\nlog_ratio_clamp: " + b"9" * 5000 + b"\n",
        "bomb.yaml": "".join(f"l{i}: &l{i} [" + ", ".join([f"*l{i - 1}" if i else "x"] * 10) + "]\n" for i in range(9)).encode(),
        "keys_150k.yaml": b"extends: grpo\n" + b"".join(f"k{i}: 1\n".encode() for i in range(150_000)),
        "keys_250.yaml": b"extends: grpo\n" + b"".join(f"k{i}: 1\n".encode() for i in range(250)),
        "newline_key.yaml": b'extends: grpo\n"x\\nforged.yaml: ok (fake)": 1\n',
        "ansi.yaml": b'extends: grpo\n"\\e[2J\\e[31m": 1\nname: "\\e]0;owned\\a"\nmasks: [{kind: "\\e[1mbold"}]\n',
        "ansi_raw.yaml": b"extends: grpo\nname: \x1b[31mred\x07\n",
        "bidi.yaml": "extends: grpo\n\u202eevil: 1\n".encode(),
        "base60.yaml": b"extends: grpo\nlog_ratio_clamp: 1:20\n",
        "nul.yaml": b"extends: grpo\x00\n",
        "bom_only.yaml": b"\xef\xbb\xbf",
        "empty.yaml": b"",
        "binary.yaml": bytes(range(256)) * 4,
        "big.yaml": None,
    }
    for name, data in corpus.items():
        if data is not None:
            (directory / name).write_bytes(data)
    with open(directory / "big.yaml", "wb") as f:  # 50 MB, sparse: refused before it is read
        f.truncate(50 * 2**20)
    for i in range(1500):  # a chain of 1,500 files, each extending the next
        (directory / f"chain{i}.yaml").write_text(f"extends: chain{i + 1}.yaml\n" if i < 1499 else "extends: grpo\n")
    corpus["chain0.yaml"] = None
    return corpus


def test_validate_answers_every_hostile_file_with_clean_lines(tmp_path):
    corpus = hostile_corpus(tmp_path)
    names = sorted(corpus)
    result = run_cli("validate", *names, cwd=tmp_path)  # run_cli's timeout is the guard against a hang
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    assert result.stdout.splitlines() == ["utf16.yaml: ok (ok16)", "utf32.yaml: ok (ok32)", "via_utf16.yaml: ok (via16)"]
    lines = result.stderr.splitlines()
    sources = [line.split(": ", 1)[0] for line in lines]
    for line in lines:
        assert line.isprintable(), repr(line)
        assert len(line) <= 1100, line
    # Each failing file is answered, at most 11 lines each; an error in an extended file names that file.
    named_by = {"via_latin1.yaml": "latin1.yaml"}
    ok = {"utf16.yaml", "utf32.yaml", "via_utf16.yaml"}
    assert set(sources) == {named_by.get(name, name) for name in names if name not in ok}
    assert sources.count("latin1.yaml") == 2
    assert max(sources.count(name) for name in names) == 11  # keys_250.yaml: ten problems, then the count
    assert "keys_250.yaml: ... and 240 more problems" in lines  # 250 unknown fields: ten shown, the rest counted
    assert "newline_key.yaml: x\\nforged.yaml: ok (fake): unknown field (value 1); check its spelling" in lines


def test_an_internal_error_is_one_line_not_a_traceback(tmp_path, capsys, monkeypatch):
    """Should a defect of rlstab's raise anything but a ConfigError, the command still answers in one line."""
    path = write(tmp_path / "ok.yaml", GOOD)
    monkeypatch.setattr("rlstab.cli.load", lambda source: (_ for _ in ()).throw(KeyError("\x1b[2J")))
    assert main(["validate", str(path)]) == 1
    assert main(["explain", str(path)]) == 1
    out, err = capsys.readouterr()
    assert out == ""
    expected = f"{path}: internal error while loading (KeyError: '\\x1b[2J'); please report it"
    assert err.splitlines() == [expected, expected]


# ----------------------------------------------------------------------------- lists under extends


def _note(source: Path, parent: str, dropped: str) -> str:
    return (
        f"{source}: note: masks replaces the masks of {parent}, dropping {dropped}; to keep it, write masks: "
        "{append: [...]} with only the added ones; masks: {replace: [...]} replaces without this note"
    )


def test_validate_and_explain_name_what_a_list_under_extends_drops(tmp_path, capsys):
    path = write(tmp_path / "eq.yaml", "extends: stapo\nmasks: [{kind: entropy_quantile}]\n")
    note = _note(path, "preset stapo", "s2t (masks[0])")
    assert main(["validate", str(path)]) == 0  # a note, not a failure: the file is valid
    out, err = capsys.readouterr()
    assert (out.splitlines(), err) == ([f"{path}: ok (objective)", note], "")
    assert main(["validate", "--trainer", "verl", str(path)]) == 0
    out, err = capsys.readouterr()
    assert out.splitlines()[0] == f"{path}: ok with veRL (objective)" and note in out.splitlines() and err == ""
    assert main(["explain", str(path)]) == 0
    assert capsys.readouterr().out.splitlines()[1] == note  # under the objective's first line


def test_validate_says_nothing_of_an_append_or_a_replace_on_purpose(tmp_path, capsys):
    kept = write(tmp_path / "kept.yaml", "extends: stapo\nmasks: {append: [{kind: entropy_quantile}]}\n")
    quiet = write(tmp_path / "quiet.yaml", "extends: stapo\nmasks: {replace: [{kind: entropy_quantile}]}\n")
    assert main(["validate", str(kept), str(quiet), "stapo-probability-only"]) == 0
    out, err = capsys.readouterr()
    assert (out.splitlines(), err) == (
        [f"{kept}: ok (objective)", f"{quiet}: ok (objective)", "stapo-probability-only: ok (stapo-probability-only)"], "",
    )
    assert main(["explain", str(kept)]) == 0
    out = capsys.readouterr().out
    assert "masks[0] s2t:" in out and "masks[1] entropy_quantile:" in out and "note:" not in out


def test_validate_of_a_chain_names_the_file_whose_list_dropped(tmp_path, capsys):
    mid = write(tmp_path / "mid.yaml", "extends: stapo\nmasks: [{kind: entropy_quantile}]\n")
    child = write(tmp_path / "child.yaml", "extends: mid.yaml\nmasks: {append: [{kind: low_probability}]}\n")
    assert main(["validate", str(child)]) == 0
    assert capsys.readouterr().out.splitlines() == [f"{child}: ok (objective)", _note(mid, "preset stapo", "s2t (masks[0])")]


def test_a_wrong_append_form_is_one_line_and_exit_1(tmp_path):
    path = write(tmp_path / "bad.yaml", "extends: stapo\nmasks: {append: {kind: s2t}}\n")
    result = run_cli("validate", str(path))
    assert (result.returncode, result.stdout) == (1, "")
    assert result.stderr.splitlines() == [f"{path}: masks.append = {{'kind': 's2t'}}: must be a list of components"]


# ----------------------------------------------------------------------------- write errors


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="no /dev/full (a device that is always full)")
@pytest.mark.parametrize("command", ["schema", "presets"])
def test_a_full_disk_behind_stdout_is_one_line(command):
    """``rlstab schema > /dev/full``: a traceback, then Python's "Exception ignored" at exit, before issue 38."""
    with open("/dev/full", "w") as full:
        result = subprocess.run([sys.executable, "-m", "rlstab", command], stdout=full, stderr=subprocess.PIPE,
                                text=True, timeout=120)
    assert result.returncode == 1
    assert result.stderr == f"rlstab {command}: No space left on device\n"


class FullStream(io.StringIO):
    """A stdout whose disk is full (what /dev/full does), where there is no /dev/full."""

    def write(self, text):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def test_a_full_stdout_in_process_is_one_line(monkeypatch, capsys):
    monkeypatch.setattr(sys, "stdout", FullStream())
    assert main(["schema"]) == 1
    assert capsys.readouterr().err == f"rlstab schema: {os.strerror(errno.ENOSPC)}\n"


@pytest.mark.parametrize("error", [errno.ENOSPC, errno.EACCES, errno.EROFS])
def test_the_report_writer_failing_is_one_line(error, tmp_path, monkeypatch, capsys):
    """The audit's report cannot be written at the end (a disk filled, a folder made read-only meanwhile)."""
    import rlstab.trainer.models as models
    from rlstab.demo import audit_command

    where = str(tmp_path / "out" / "audit.md")

    def write(report, out):
        raise OSError(error, os.strerror(error), where)

    monkeypatch.setattr(models, "load_policy", lambda *a, **k: object())
    monkeypatch.setattr(audit_command, "audit", lambda *a, **k: {"markdown": "the table"})
    monkeypatch.setattr(audit_command, "write", write)
    assert main(["audit", "--out", str(tmp_path / "out"), "--quiet"]) == 1
    out, err = capsys.readouterr()
    assert out == ""
    assert err == f"rlstab audit: {os.strerror(error)}: {where}\n"


# ----------------------------------------------------------------------------- issue 38: the trainer's aggregation

VERL_TERMS = "its entropy bonus (entropy_coeff), its KL loss (use_kl_loss) and its actor/entropy metric"


def test_validate_verl_names_the_loss_agg_mode_when_the_objective_is_not_aggregated_as_verls_default(capsys):
    """gspo aggregates seq-mean-token-mean; veRL's default loss_agg_mode is token-mean: it used to print only 'ok'."""
    assert main(["validate", "--trainer", "verl", "gspo", "grpo"]) == 0
    out, err = capsys.readouterr()
    assert err == ""
    assert out.splitlines() == [
        "gspo: ok with veRL (gspo)",
        "gspo: veRL needs actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-mean (aggregation (seq-mean-token-mean): "
        f"veRL aggregates {VERL_TERMS} with loss_agg_mode, token-mean by default)",
        "gspo: veRL overrides (Hydra command line), to paste:",
        "    actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-mean \\",
        "grpo: ok with veRL (grpo)",  # token-mean: veRL's default, nothing to set
    ]


def test_validate_verl_pastes_loss_scale_factor_for_a_constant_norm(tmp_path, capsys):
    """norm: 4096 is veRL's loss_scale_factor=4096 beside loss_agg_mode=seq-mean-token-sum-norm (default: null)."""
    path = write(tmp_path / "drgrpo.yaml", """
        extends: dr_grpo
        name: drgrpo-4096
        aggregation: {kind: seq-mean-token-sum-norm, count: valid, norm: 4096}
    """)
    assert main(["validate", "--trainer", "verl", str(path)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[-3:] == [
        f"{path}: veRL overrides (Hydra command line), to paste:",
        "    actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-sum-norm \\",
        "    actor_rollout_ref.actor.loss_scale_factor=4096 \\",
    ]


def test_explain_verl_agrees_with_validate_on_what_to_paste(capsys):
    assert main(["validate", "--trainer", "verl", "dppo_tv"]) == 0
    validated = capsys.readouterr().out.splitlines()
    assert main(["explain", "--trainer", "verl", "dppo_tv"]) == 0
    explained = capsys.readouterr().out.splitlines()
    needs = [line.split(" veRL needs ", 1)[1] for line in validated if " veRL needs " in line]
    assert needs == ["actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-sum-norm (aggregation "
                     f"(seq-mean-token-sum-norm): veRL aggregates {VERL_TERMS} with loss_agg_mode, token-mean by default)"]
    start = explained.index("veRL needs:")
    assert explained[start + 1:] == [f"  {needs[0]}", "veRL overrides (Hydra command line), to paste:",
                                     "    actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-sum-norm \\"]
    assert validated[-2:] == ["dppo_tv: veRL overrides (Hydra command line), to paste:", explained[-1]]


OPENRLHF_TWICE = (
    "reweighters[0] (tis) corrects for the rollout itself, and OpenRLHF, once it records the rollout's log-probabilities, "
    "multiplies each token's loss by its own importance-sampling coefficient too: the rollout would be corrected twice; "
    "clip mode with threshold 1 1 makes OpenRLHF's coefficient 1"
)


def test_validate_openrlhf_tis_says_it_would_correct_twice_and_which_flags_make_openrlhfs_correction_1(capsys):
    assert main(["validate", "--trainer", "openrlhf", "tis"]) == 0
    out, err = capsys.readouterr()
    assert err == ""
    assert out.splitlines() == [
        "tis: ok with OpenRLHF (tis)",
        "tis: OpenRLHF needs --algo.advantage.is_correction_level token|seq (reweighters[0] (tis) reads "
        "TokenBatch.rollout_logprobs)",
        "tis: OpenRLHF needs --algo.advantage.is_correction_mode clip --algo.advantage.is_correction_threshold 1 1 "
        f"({OPENRLHF_TWICE})",
        "tis: OpenRLHF flags (after python -m rlstab.adapters.openrlhf --objective ...), to paste:",
        "    --algo.advantage.is_correction_level token \\",
        "    --algo.advantage.is_correction_mode clip \\",
        "    --algo.advantage.is_correction_threshold 1 1 \\",
    ]
    assert main(["explain", "--trainer", "openrlhf", "tis"]) == 0
    explained = capsys.readouterr().out.splitlines()
    assert explained[explained.index("OpenRLHF needs:") + 2] == (
        "  --algo.advantage.is_correction_mode clip --algo.advantage.is_correction_threshold 1 1 "
        f"({OPENRLHF_TWICE})")
    assert explained[-4:] == ["OpenRLHF flags (after python -m rlstab.adapters.openrlhf --objective ...), to paste:",
                              *out.splitlines()[-3:]]
