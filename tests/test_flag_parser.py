"""The ``rlstab`` parser (``rlstab.flag_parser``): one-line errors, repeated options and empty texts refused,
negative numbers in scientific notation read as values."""

from __future__ import annotations

import argparse

import pytest

from rlstab.cli import build_parser, main
from rlstab.flag_parser import NEGATIVE_NUMBER, FlagParser
from rlstab.number_flags import Refused


def refusal(argv: list[str], capsys) -> str:
    """The one stderr line of ``rlstab argv``, which argparse refuses with status 2."""
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2
    out, err = capsys.readouterr()
    assert out == "" and len(err.splitlines()) == 1, err
    return err.rstrip("\n")


def test_every_subcommand_has_the_parser():
    (sub,) = [a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    assert {type(p) for p in sub.choices.values()} == {FlagParser}


@pytest.mark.parametrize("text", ["-1e-3", "-1E-3", "-1e+3", "-2.5e10", "-.5", "-5.", "-0", "-inf", "-Infinity", "-nan"])
def test_a_negative_number_in_any_notation_is_a_value(text, capsys):
    """argparse alone reads ``--lr -1e-3`` as a flag ``-1e-3`` and says "expected one argument"."""
    args = build_parser().parse_args(["demo", "--lr", text])
    assert args.lr == Refused(text)  # kept as typed: no learning rate is negative
    assert main(["demo", "--lr", text, "--out", "unused"]) == 2
    assert capsys.readouterr().err == f"rlstab demo: --lr {text}: must be a finite number above 0, at most 1\n"


@pytest.mark.parametrize("text", ["-x", "-e5", "-1e", "-", "--", "--lr", "-1-", "-1e-3x", "-infx", "1e-3"])
def test_only_a_negative_number_looks_like_one(text):
    assert NEGATIVE_NUMBER.match(text) is None


def test_a_flag_after_a_flag_is_still_a_missing_value(capsys):
    assert refusal(["demo", "--lr", "--steps", "3"], capsys) == (
        "rlstab demo: argument --lr: expected one argument (see rlstab demo --help for usage)")


def test_the_last_trainer_no_longer_wins_silently(capsys):
    """Issue 38: ``validate --trainer verl --trainer trl`` checked the objective for TRL only, and said nothing."""
    assert refusal(["validate", "--trainer", "verl", "--trainer", "trl", "grpo"], capsys) == (
        "rlstab validate: argument --trainer: given twice (verl, then trl): give it once "
        "(see rlstab validate --help for usage)")


@pytest.mark.parametrize("argv", [["demo", "--out=a", "--out", "b"], ["demo", "--ou", "a", "--out", "b"],
                                  ["demo", "--steps", "3", "--steps", "3"]],
                         ids=["equals-form", "abbreviation", "same-value"])
def test_a_repeat_is_refused_in_any_spelling(argv, capsys):
    assert "given twice" in refusal(argv, capsys)


def test_flags_meant_to_repeat_still_append():
    args = build_parser().parse_args(["compare", "--objective", "grpo", "--objective", "dapo", "--pair", "dapo=grpo",
                                      "--out", "o", "--quiet", "--quiet"])
    assert args.objective == ["grpo", "dapo"] and args.pair == ["dapo=grpo"] and args.quiet is True


@pytest.mark.parametrize(("argv", "said"), [
    (["compare", "--objective", "grpo", "--baseline", "", "--out", "o"],
     "rlstab compare: argument --baseline: empty; give a value or leave the flag out"),
    (["demo", "--objective", " "], "rlstab demo: argument --objective: empty; give a value or leave the flag out"),
    (["compare", "--objective", " ", "--out", "o"], "rlstab compare: argument --objective: empty; give a value"),
    (["compare", "--objective", "grpo", "--out", ""], "rlstab compare: argument --out: empty; give a value"),
    (["validate", "grpo", ""], "rlstab validate: argument FILE: empty; give a value"),
])
def test_an_empty_text_is_refused(argv, said, capsys):
    """``--baseline ""`` was taken as "no baseline"; an empty ``--out`` as the working folder."""
    assert refusal(argv, capsys) == f"{said} (see rlstab {argv[0]} --help for usage)"


def test_an_empty_number_is_left_to_the_number_check(capsys):
    assert main(["demo", "--steps", "", "--out", "unused"]) == 2
    assert capsys.readouterr().err == "rlstab demo: --steps '': must be an integer from 1 to 100,000\n"


@pytest.mark.parametrize(("argv", "said"), [
    ([], "rlstab: the following arguments are required: command (see rlstab --help for usage)"),
    (["nope"], "rlstab: argument command: invalid choice: 'nope'"),
    (["validate"], "rlstab validate: the following arguments are required: FILE (see rlstab validate --help for usage)"),
    (["demo", "--nope"], "rlstab: unrecognized arguments: --nope (see rlstab --help for usage)"),
    (["validate", "--trainer", "foo", "grpo"], "rlstab validate: argument --trainer: invalid choice: 'foo'"),
])
def test_an_argparse_error_is_one_line_naming_the_help(argv, said, capsys):
    """argparse printed its usage block (up to seven lines for ``compare``) before the error."""
    assert refusal(argv, capsys).startswith(said)
