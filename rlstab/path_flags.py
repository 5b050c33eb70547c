"""Folder command-line flags (``--out``, ``--cache-dir``), checked with the number flags, before any work.

A folder flag of ``rlstab demo``, ``audit`` or ``compare`` names a folder the command creates if
needed and writes in. :func:`folder` adds one and lists it in the parser's defaults;
:func:`check_paths` then prints one line per flag whose folder cannot be used, naming the flag, the
text and why, before anything is loaded, trained or created: an empty text, an existing file (or
device) where the folder should be, a file on the way to it (``--out notes.txt/run``), a place where
no folder can be created or written (a read-only or full file system, a folder without write
permission, ``/proc``), a broken link, a name too long. The check itself creates nothing that
stays: it tries to create and remove a folder in the nearest folder that exists, which asks the
operating system rather than the permission bits (those do not stop ``root``, who is still refused
by a read-only file system or ``/proc``).

Imports nothing heavy: ``rlstab --help`` builds every parser.
"""

from __future__ import annotations

import argparse
import os
import shlex
import stat
import sys
import tempfile

from rlstab.errors import one_line

_FOLDERS = "_folder_flags"
"""The parser default that lists a command's folder flags: ``[dest, ...]``."""


def folder(parser: argparse.ArgumentParser, flag: str, *, help: str, default: str | None = None,
           required: bool = False) -> None:
    """Add ``flag`` (``--out``), a folder the command creates if needed and writes in, checked by :func:`check_paths`."""
    dest = flag.lstrip("-").replace("-", "_")
    parser.add_argument(flag, default=default, required=required, metavar="DIR", help=help)
    parser.set_defaults(**{_FOLDERS: [*(parser.get_default(_FOLDERS) or []), dest]})


def folder_flags(parser: argparse.ArgumentParser) -> list[str]:
    """The dests of ``parser``'s folder flags."""
    return list(parser.get_default(_FOLDERS) or [])


def check_paths(args: argparse.Namespace, command: str, *, skip: tuple[str, ...] = ()) -> bool:
    """Whether every folder flag of ``args`` (but those in ``skip``, and those left at None) names a usable folder;
    prints one line on stderr for each that does not, ``COMMAND: --FLAG TEXT: WHY``."""
    ok = True
    for dest in getattr(args, _FOLDERS, None) or []:
        value = getattr(args, dest)
        if dest in skip or value is None:
            continue
        problem = folder_problem(value)
        if problem is not None:
            flag = "--" + dest.replace("_", "-")
            print(one_line(f"{command}: {flag} {shlex.quote(value)}: {problem}"), file=sys.stderr)
            ok = False
    return ok


def folder_problem(text: str) -> str | None:
    """Why no folder can be used (created if needed, written in) at ``text``, or None; creates nothing that stays."""
    if not text.strip():
        return "empty; name a folder"
    if "\0" in text:
        return "contains a NUL character"
    path = os.path.normpath(text)
    candidate = path
    while True:  # the nearest existing thing on the way: the folder itself, or the one to create it in
        try:
            mode = os.stat(candidate).st_mode
            break
        except (FileNotFoundError, NotADirectoryError):
            if os.path.lexists(candidate):
                return f"{_named(candidate, path)} is a link to nothing"
            parent = os.path.dirname(candidate) or "."
            if parent == candidate:
                return "no folder on its way exists"
            candidate = parent
        except OSError as err:
            return f"cannot reach {_named(candidate, path)}: {err.strerror or err}"
    if not stat.S_ISDIR(mode):
        if candidate == path:
            return "is a file, not a folder" if stat.S_ISREG(mode) else "exists and is not a folder"
        kind = "a file" if stat.S_ISREG(mode) else "not a folder"
        return f"{candidate} is {kind}, so no folder can be made under it"
    try:  # can a folder be created in it (and so files written there)? Ask the file system, then remove it
        os.rmdir(tempfile.mkdtemp(prefix=".rlstab-check-", dir=candidate))
    except OSError as err:
        return f"cannot write in {_named(candidate, path)}: {err.strerror or err}"
    return None


def _named(candidate: str, path: str) -> str:
    """``candidate`` as the message names it: "it" for the flag's own folder."""
    return "it" if candidate == path else "the current folder" if candidate == "." else candidate
