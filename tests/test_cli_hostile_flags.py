"""Every argument of every ``rlstab`` subcommand, fed hostile values: one clean line, exit 1 or 2, nothing written.

The table is read from the parser itself (``build_parser()``): each subcommand's arguments, sorted by
what they are (a number flag of ``rlstab.number_flags``, a folder flag of ``rlstab.path_flags``, a
choice, a switch, a text option, a positional argument), and each kind has its hostile values. A flag
added later joins the table with the values of its kind; one of a kind this file does not know fails
``test_every_argument_has_a_kind`` until it is given one. A value that a flag legitimately accepts is
listed in ``ACCEPTED``, with the reason, and shown to pass the checks instead.

Each case runs ``main(argv)`` in process, in an empty working folder, with the model loading and the
lab's backend replaced by a failure: every refusal happens before any work, in milliseconds. Asserted:
exit status 1 or 2; nothing on stdout; stderr exactly one printable line, without "Traceback", naming
the argument or the value; the working folder as it was (nothing created, not even an empty
``runs/demo``), and an outside target (``/proc/...``) not created.
"""

from __future__ import annotations

import argparse
import importlib
import os
from pathlib import Path

import pytest

import rlstab.lab.backends as backends
import rlstab.trainer.models as models
from rlstab.cli import build_parser, main
from rlstab.demo import counterfactual_command
from rlstab.demo.counterfactual_command import _flag
from rlstab.number_flags import check_numbers
from rlstab.path_flags import folder_flags

compare_command = importlib.import_module("rlstab.lab.compare_command")
lab_compare = importlib.import_module("rlstab.lab.compare")  # the module: ``rlstab.lab.compare`` is also its function

FILE_TEXT = "hostile: [not closed\n"
"""``afile``, the regular file of the cases: not YAML, so that it is no objective, regime or protocol either."""

NUMBER = ["nan", "inf", "-inf", "-1", "-1e-3", "0", "1e308", "1e20", "ten", "", "-x"]
# Places where no folder can be made or written. Permission bits do not stop root (the tests may run as
# root), so the case that holds for everyone is a path under a regular file ("afile/sub", ENOTDIR); on
# Linux, /proc refuses a new folder to root as well; a folder without write permission only stops others.
UNWRITABLE = (["/proc/rlstab-hostile"] if os.path.isdir("/proc/self") else []) + (
    ["readonly/sub"] if os.geteuid() != 0 else [])
FOLDER = ["", "afile", "afile/sub", "x" * 5000, "-x", *UNWRITABLE] + (["/dev/full"] if os.path.exists("/dev/full") else [])
CHOICE = ["nope", "", "-x"]
TEXT = ["", "nope", "adir", "afile", "-x"]
POSITIONAL = ["", "nope", "adir", "afile"]
VALUES = {"number": NUMBER, "folder": FOLDER, "choice": CHOICE, "text": TEXT, "positional": POSITIONAL, "switch": []}

ACCEPTED = {
    ("demo", "--seed", "0"): "seed 0 is a seed",
    ("audit", "--seed", "0"): "seed 0 is a seed",
    ("demo", "--warmup-steps", "0"): "no supervised warm-up: the freshly initialised model",
    ("audit", "--warmup-steps", "0"): "no supervised warm-up: the freshly initialised model",
}
"""Hostile values a flag allows, each with its reason (``rlstab demo --help`` states the ranges)."""
REPEATABLE = {"append": "a flag meant to repeat (--objective, --regime, --pair, audit's --from)",
              "switch": "a switch given twice still means on; no value is lost"}
"""The kinds of option that may be given twice, and why; every other option given twice is refused."""
NOT_VALUES = {"help": "prints the help and exits 0", "version": "prints the version and exits 0"}

REQUIRED = {"validate": {"FILE": "grpo"}, "explain": {"FILE|PRESET": "grpo"}, "demo": {"--objective": "grpo"},
            "audit": {"--objective": "grpo"}, "compare": {"--objective": "grpo", "--out": "out"}}
"""What each subcommand is given besides the argument under test (replaced when that is the one tested): what it
needs, and one objective where its default is several (each is loaded, which is most of a case's time)."""

CONTEXT = {("audit", _flag(dest)): {"--objective": "stapo", "--counterfactual": None}
           for dest in counterfactual_command.ONLY_HERE}
CONTEXT["audit", "--states"] |= {"--from": "arun"}
"""Flags that apply only beside others, given them (an objective with a mask, ``--from`` the workplace's
``arun``): a hostile value is then its one problem (``audit --lr ten`` alone has two, the value and the
flag's place, and says both)."""

CONFLICTS = [
    ("demo", ["--model", "smollm2", "--warmup-steps", "5"], "--warmup-steps applies to --model tiny only"),
    ("demo", ["--model", "smollm2", "--cache-dir", "adir"], "--cache-dir applies to --model tiny only"),
    ("audit", ["--model", "smollm2", "--warmup-steps", "5"], "--warmup-steps applies to --model tiny only"),
    ("audit", ["--model", "smollm2", "--cache-dir", "adir"], "--cache-dir applies to --model tiny only"),
    ("compare", ["--model", "smollm2", "--cache-dir", "adir"], "--cache-dir applies to --model tiny only"),
    ("compare", ["--ray-address", "auto", "--workers", "2"], "--workers 2 and --ray-address auto"),
]
"""Flags that contradict each other (not derivable from the parser): each pair refused in one line."""


def subparsers() -> dict[str, argparse.ArgumentParser]:
    (sub,) = [a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(sub.choices)


def kind(parser: argparse.ArgumentParser, action: argparse.Action) -> str | None:
    """What the argument is, hence which hostile values it gets; None for a kind this file does not know."""
    if isinstance(action, argparse._HelpAction):
        return "help"
    if isinstance(action, argparse._VersionAction):
        return "version"
    if action.dest in (parser.get_default("_number_flags") or {}):
        return "number"
    if action.dest in folder_flags(parser):
        return "folder"
    if not action.option_strings:
        return "positional" if isinstance(action, argparse._StoreAction) else None
    if action.choices is not None:
        return "choice"
    if isinstance(action, argparse._StoreTrueAction):
        return "switch"
    if isinstance(action, (argparse._StoreAction, argparse._AppendAction)) and action.type is None:
        return "text"
    return None


def name(action: argparse.Action) -> str:
    return action.option_strings[-1] if action.option_strings else action.metavar or action.dest


def arguments() -> list[tuple[str, argparse.ArgumentParser, argparse.Action]]:
    return [(command, parser, action) for command, parser in subparsers().items() for action in parser._actions]


def argv_for(command: str, tested: str | None = None, values: tuple[str, ...] = ()) -> list[str]:
    """``command`` with its required arguments but ``tested``, then ``tested`` given ``values`` (one each)."""
    required = REQUIRED.get(command, {}) | CONTEXT.get((command, tested), {})
    options = [word for flag, value in required.items() if flag.startswith("--") and flag != tested
               for word in (flag, value) if word is not None]
    positionals = [value for flag, value in required.items() if not flag.startswith("--")]
    if tested is None:
        return [command, *options, *positionals]
    if tested.startswith("--"):
        return [command, *options, *[word for value in values for word in (tested, value)], *positionals]
    return [command, *options, *values]  # the positional argument under test


CASES = [(command, name(action), value) for command, parser, action in arguments()
         for value in VALUES.get(kind(parser, action), [])]
REPEATS = [(command, name(action), kind(parser, action)) for command, parser, action in arguments()
           if action.option_strings and kind(parser, action) in ("number", "folder", "choice", "text", "switch")
           and not isinstance(action, argparse._AppendAction)]


@pytest.fixture
def workplace(tmp_path, monkeypatch):
    """An empty working folder but ``afile`` (not YAML), ``adir/`` and ``arun/``; any work fails the test. Ray and the smollm2
    extra count as installed, so that a case shows its own problem only, whatever this environment has (Ray's
    absence is tested in tests/lab/test_compare_command.py, the extra's in tests/demo/test_demo_command.py)."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "afile").write_text(FILE_TEXT)
    (tmp_path / "adir").mkdir()
    (tmp_path / "arun" / "checkpoints").mkdir(parents=True)  # a lab run's folder as --from reads it, unloaded
    (tmp_path / "arun" / "spec.json").write_text(
        '{"label": "stapo", "model": "tiny", "task": "add2", "seed": 0, "regime": {"name": "r"}}')
    (tmp_path / "arun" / "checkpoints" / "step5.pt").write_bytes(b"")
    if os.geteuid() != 0:
        (tmp_path / "readonly").mkdir(mode=0o555)
    monkeypatch.setattr(models, "load_policy", lambda *a, **k: pytest.fail("loaded a model: the value was not refused"))
    monkeypatch.setattr(backends, "backend", lambda *a, **k: pytest.fail("started the runs: the value was not refused"))
    monkeypatch.setattr(compare_command, "installed", lambda module: True)
    monkeypatch.setattr(lab_compare, "_check_smollm2", lambda: None)
    return tmp_path


def tree(folder: Path) -> list[tuple[str, int]]:
    return sorted((str(p.relative_to(folder)), p.stat().st_mode) for p in folder.rglob("*"))


def refused_in_one_line(argv: list[str], folder: Path, capsys) -> str:
    """Run ``rlstab argv``; assert the refusal's form and that nothing was written; return its line."""
    before = tree(folder)
    capsys.readouterr()
    try:
        status = main(argv)
    except SystemExit as exit_:  # argparse's own refusals
        status = exit_.code
    out, err = capsys.readouterr()
    shown = f"rlstab {argv!r}"
    assert status in (1, 2), (shown, status, err)
    assert out == "", shown
    assert "Traceback" not in err, shown
    lines = err.splitlines()
    assert len(lines) == 1 and err.endswith("\n") and lines[0].strip() and lines[0].isprintable(), (shown, err)
    assert tree(folder) == before, shown
    return lines[0]


def test_every_argument_has_a_kind():
    unknown = [(command, name(action)) for command, parser, action in arguments() if kind(parser, action) is None]
    assert unknown == [], "give these a kind (and its hostile values) in this file"


def test_the_table_covers_every_command_and_kind():
    """Not vacuous: the walk finds the subcommands, and each kind of argument in them."""
    assert set(subparsers()) == {"presets", "validate", "explain", "schema", "components", "demo", "audit", "compare"}
    kinds = {kind(parser, action) for _, parser, action in arguments()}
    assert kinds == set(VALUES) | {"help"} and set(NOT_VALUES) >= kinds - set(VALUES)
    flags = {(command, flag) for command, flag, _ in CASES}
    assert {("demo", "--out"), ("audit", "--cache-dir"), ("compare", "--ray-address"), ("validate", "--trainer"),
            ("components", "--family"), ("demo", "--lr"), ("explain", "FILE|PRESET")} <= flags
    assert len(CASES) > 250


@pytest.mark.parametrize(("command", "flag", "value"), CASES, ids=[f"{c} {f} {v[:20]!r}" for c, f, v in CASES])
def test_a_hostile_value_is_one_line_and_nothing_written(command, flag, value, workplace, capsys):
    argv = argv_for(command, flag, (value,))
    if (command, flag, value) in ACCEPTED:
        args = build_parser().parse_args(argv)
        assert check_numbers(args, f"rlstab {command}") and getattr(args, flag[2:].replace("-", "_")) == 0
        return
    line = refused_in_one_line(argv, workplace, capsys)
    assert flag in line or (value.strip() and value[:100] in line), line  # names the argument or the value
    if value.startswith("/"):
        assert not Path(value).exists() or value == "/dev/full"


@pytest.mark.parametrize(("command", "flag", "kind_"), REPEATS, ids=[f"{c} {f} twice" for c, f, _ in REPEATS])
def test_a_single_value_option_given_twice_is_refused(command, flag, kind_, workplace, capsys):
    if kind_ == "switch":  # REPEATABLE: still on
        args = build_parser().parse_args(argv_for(command) + [flag, flag])
        assert getattr(args, flag[2:].replace("-", "_")) is True
        return
    action = next(a for a in subparsers()[command]._actions if flag in a.option_strings)
    value = str(list(action.choices)[0]) if kind_ == "choice" else "1" if kind_ == "number" else "adir"
    line = refused_in_one_line(argv_for(command, flag, (value, value)), workplace, capsys)
    assert f"argument {flag}: given twice (" in line and line.endswith(f": give it once (see rlstab {command} --help for usage)")


def test_only_flags_meant_to_repeat_may_repeat():
    appended = {(command, name(action)) for command, _, action in arguments() if isinstance(action, argparse._AppendAction)}
    assert appended == {("demo", "--objective"), ("audit", "--objective"), ("audit", "--from"), ("compare", "--objective"),
                        ("compare", "--pair"), ("compare", "--regime")}, REPEATABLE["append"]


@pytest.mark.parametrize(("command", "flags", "said"), CONFLICTS, ids=[" ".join([c, *f]) for c, f, _ in CONFLICTS])
def test_conflicting_flags_are_one_line(command, flags, said, workplace, capsys):
    line = refused_in_one_line(argv_for(command) + flags, workplace, capsys)
    assert line.startswith(f"rlstab {command}: {said}"), line


@pytest.mark.parametrize("word", ["nope", "", "-x", "--nope"])
def test_a_bad_subcommand_is_one_line(word, workplace, capsys):
    line = refused_in_one_line([word], workplace, capsys)
    assert line.startswith("rlstab: ") and line.endswith("(see rlstab --help for usage)")


def test_the_accepted_values_are_within_their_ranges():
    """Each exception of the table is a value the flag's own check accepts: the reason is the field's range."""
    for (command, flag, value), reason in ACCEPTED.items():
        assert reason
        args = build_parser().parse_args([command, flag, value])
        assert check_numbers(args, f"rlstab {command}"), (command, flag)
