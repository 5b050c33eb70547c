"""The ``rlstab`` command: presets, validate, explain, schema, components (and demo, audit, compare, which register themselves)."""

from __future__ import annotations

import argparse
import json
import os
import sys
import warnings

import rlstab
from rlstab.errors import ConfigError, one_line
from rlstab.flag_parser import FlagParser
from rlstab.loading import load
from rlstab.objective import Objective
from rlstab.presets import preset_names


def _cmd_presets(args) -> int:
    width = max(map(len, preset_names()))
    for name in preset_names():
        description = " ".join((load(name).description or "").split())
        first_sentence = description.split(": ", 1)[0] if len(description) > 90 else description
        print(f"{name:<{width}}  {first_sentence[:100]}")
    return 0


def _load_or_report(source: str) -> Objective | None:
    """The objective, or None after its problems were printed to stderr: never a traceback, whatever the file."""
    try:
        return load(source)
    except ConfigError as err:
        print(err, file=sys.stderr)
    except Exception as err:  # noqa: BLE001 - a defect of rlstab's, still one line
        print(one_line(f"{source}: internal error while loading ({type(err).__name__}: {err}); please report it"), file=sys.stderr)
    return None


def _cmd_validate(args) -> int:
    failed = 0
    for path in args.files:
        objective = _load_or_report(path)
        if objective is None:
            failed += 1
        elif args.trainer is not None:
            failed += not _fits_trainer(path, objective, args.trainer)
        else:
            print(one_line(f"{path}: ok ({objective.name or 'objective'})"))
        for dropped in getattr(objective, "dropped", ()):  # notes: what its extends chain dropped (none if unloaded)
            print(one_line(str(dropped)))
    return 1 if failed else 0


def _fits_trainer(path: str, objective: Objective, key: str) -> bool:
    """Print what the adapter of ``key`` refuses (stderr) or needs (stdout), as its start-up check would; no trainer import.

    The settings it needs come with a block of the same settings to paste into the trainer's configuration.
    """
    from rlstab.adapters import trainers

    name = trainers.trainer(key).name
    problems = trainers.problems(objective, key)
    if problems:
        print(ConfigError(f"{path} (with {name})", problems), file=sys.stderr)
        return False
    print(one_line(f"{path}: ok with {name} ({objective.name or 'objective'})"))
    for setting in trainers.settings(objective, key):
        print(one_line(f"{path}: {name} needs {setting}"))
    block = trainers.paste_block(objective, key)
    if block:
        print(one_line(f"{path}: {block[0]}"))
        for line in block[1:]:
            print(one_line(line))
    return True


def _cmd_explain(args) -> int:
    objective = _load_or_report(args.objective)
    if objective is None:
        return 1
    from rlstab.explain import explain

    print(explain(objective, source=args.objective, trainer=args.trainer))
    if args.trainer is None:
        return 0
    from rlstab.adapters import trainers

    return 1 if trainers.problems(objective, args.trainer) else 0  # as validate --trainer: the adapter would refuse it


def _cmd_components(args) -> int:
    from rlstab.registry import FAMILIES, PluginWarning, problems, registrations

    with warnings.catch_warnings():  # the refusals are listed below
        warnings.simplefilter("ignore", PluginWarning)
        rows = [(r.family, r.kind, r.origin) for r in registrations() if args.family in (None, r.family)]
    rows.sort(key=lambda row: (list(FAMILIES).index(row[0]), row[1]))
    widths = [max(len(row[i]) for row in rows) for i in range(2)]
    for family, kind, origin in rows:
        print(one_line(f"{family:<{widths[0]}}  {kind:<{widths[1]}}  {origin}"))
    for problem in problems():
        print(one_line(f"refused: {problem}"), file=sys.stderr)
    return 0


def _cmd_schema(args) -> int:
    from rlstab.schema import objective_schema

    print(json.dumps(objective_schema(), indent=2))
    return 0


def _family_names() -> list[str]:
    from rlstab.registry import FAMILIES

    return list(FAMILIES)


def _trainer_flag(parser: argparse.ArgumentParser, help: str) -> None:
    from rlstab.adapters.trainers import TRAINERS

    parser.add_argument("--trainer", type=str.lower, choices=list(TRAINERS), default=None, help=help)


def build_parser() -> argparse.ArgumentParser:
    parser = FlagParser(prog="rlstab", description="Stable RL objectives for LLMs, composed in YAML.")
    parser.add_argument("--version", action="version", version=f"rlstab {rlstab.__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("presets", help="list the shipped presets, one line each").set_defaults(func=_cmd_presets)
    p = sub.add_parser("validate", help="validate objective YAML files (non-zero exit on any error)")
    p.add_argument("files", nargs="+", metavar="FILE")
    _trainer_flag(p, "also check it as that trainer's adapter does at start-up: one line per part it refuses, "
                     "and the trainer settings it needs")
    p.set_defaults(func=_cmd_validate)
    p = sub.add_parser("explain", help="print an objective as a formula with every parameter")
    p.add_argument("objective", metavar="FILE|PRESET")
    _trainer_flag(p, "say where each part runs with that trainer, what its adapter refuses and which settings it needs")
    p.set_defaults(func=_cmd_explain)
    sub.add_parser("schema", help="print the JSON Schema of objective files").set_defaults(func=_cmd_schema)
    p = sub.add_parser("components", help="list the registered component kinds, one line each: family, kind, origin")
    p.add_argument("--family", choices=_family_names(), help="only this family (an objective field)")
    p.set_defaults(func=_cmd_components)
    # The demo's commands register themselves; their heavy imports happen only when they run.
    from rlstab.demo import audit_command, demo_command
    from rlstab.lab import compare_command

    demo_command.register(sub)
    audit_command.register(sub)
    compare_command.register(sub)
    return parser


def _one_line_warnings() -> None:
    """A plugin refused at load is one ``warning:`` line on stderr, not Python's two-line warning format."""
    from rlstab.registry import PluginWarning

    default = warnings.showwarning

    def show(message, category, filename, lineno, file=None, line=None):
        if issubclass(category, PluginWarning):
            print(one_line(f"warning: {message}"), file=sys.stderr)
        else:
            default(message, category, filename, lineno, file, line)

    warnings.showwarning = show


def main(argv: list[str] | None = None) -> int:
    """The ``rlstab`` command: its exit status (argparse's mistakes exit 2 by ``SystemExit``, in one line).

    An output that cannot be written (a full disk, ``rlstab schema > /dev/full``, a folder made read-only
    meanwhile) is one line and status 1, never a traceback.
    """
    for stream in (sys.stdout, sys.stderr):  # a name or path the terminal cannot encode is escaped, not a crash
        if hasattr(stream, "reconfigure"):
            stream.reconfigure(errors="backslashreplace")
    _one_line_warnings()
    args = build_parser().parse_args(argv)
    try:
        status = args.func(args)
        sys.stdout.flush()  # a full disk behind stdout shows here, not at exit
        return status
    except BrokenPipeError:  # `rlstab schema | head`
        sys.stderr.close()
        return 0
    except OSError as err:
        where = f": {err.filename}" if err.filename else ""
        print(one_line(f"rlstab {args.command}: {err.strerror or err}{where}"), file=sys.stderr)
        _discard_stdout()
        return 1


def _discard_stdout() -> None:
    """If stdout cannot take what it still holds, send that to the null device: flushed at exit, it would print a
    traceback. A stdout that works is left as it is (the failed write was another file's)."""
    try:
        sys.stdout.flush()
        return
    except OSError:
        pass
    try:
        fd = sys.stdout.fileno()
    except (OSError, ValueError):  # not a file (a test's capture): nothing is flushed at exit
        return
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, fd)
    os.close(null)


if __name__ == "__main__":
    sys.exit(main())
