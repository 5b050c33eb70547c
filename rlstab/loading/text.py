"""Objective files as text: a size checked before reading, and the encodings YAML 1.2 allows.

YAML 1.2 (section 5.2) reads UTF-8, UTF-16 and UTF-32, told apart by a byte order mark or by
where the zero bytes of the first character fall. Anything else (a Latin-1 file, a binary file)
is refused with the position of the first byte that is not text, rather than guessed at.
"""

from __future__ import annotations

import codecs
import os
import stat
from pathlib import Path

from rlstab.errors import ConfigError

# (leading bytes, encoding, bytes of the mark to drop), in the order YAML 1.2's table tests them.
_MARKS = (
    (codecs.BOM_UTF32_BE, "utf-32-be", 4),
    (codecs.BOM_UTF32_LE, "utf-32-le", 4),
    (codecs.BOM_UTF16_BE, "utf-16-be", 2),
    (codecs.BOM_UTF16_LE, "utf-16-le", 2),
    (codecs.BOM_UTF8, "utf-8", 3),
)


def encoding_of(data: bytes) -> tuple[str, int]:
    """``(encoding, length of the byte order mark)`` of YAML bytes (YAML 1.2, section 5.2)."""
    for mark, encoding, skip in _MARKS:
        if data.startswith(mark):
            return encoding, skip
    head = data[:4]
    if len(head) == 4 and head[:3] == b"\0\0\0":
        return "utf-32-be", 0
    if len(head) == 4 and head[1:] == b"\0\0\0":
        return "utf-32-le", 0
    if len(head) >= 2 and head[0] == 0:
        return "utf-16-be", 0
    if len(head) >= 2 and head[1] == 0:
        return "utf-16-le", 0
    return "utf-8", 0


def decode(data: bytes, source: str) -> str:
    """The text of YAML bytes; an error naming the line and column of the first byte that is not text."""
    encoding, skip = encoding_of(data)
    try:
        return data[skip:].decode(encoding)
    except UnicodeDecodeError as err:
        good = data[skip : skip + err.start].decode(encoding, errors="replace")
        line, column = good.count("\n") + 1, len(good) - good.rfind("\n")
        bad = data[skip + err.start : skip + min(err.end, err.start + 4)]
        raise ConfigError(
            source,
            [
                f"line {line}, column {column}: bytes {bad.hex(' ')} are not {encoding.upper()} text "
                "(objective files are UTF-8, or UTF-16/UTF-32 as YAML 1.2 allows; re-save the file as UTF-8)"
            ],
        ) from None


def read_text(path: Path, source: str, budget: int, limit: int) -> tuple[str, int]:
    """The text of the objective file ``path`` and its size in bytes; it may use ``budget`` of the objective's ``limit`` bytes.

    The size is checked before anything is read, and reading stops one byte past the budget, so a
    file that grows meanwhile cannot get past it either. A directory, a pipe or a device (which
    would block or never end) is refused without being opened.
    """
    try:
        info = os.stat(path)
    except (OSError, ValueError) as err:  # ValueError: a NUL byte in the name
        raise _unreadable(err, source) from None
    if not stat.S_ISREG(info.st_mode):
        raise ConfigError(source, ["not a regular file"])
    if info.st_size > budget:
        raise ConfigError(source, [_too_large(info.st_size, budget, limit)])
    try:
        with open(path, "rb") as f:
            data = f.read(budget + 1)
    except OSError as err:
        raise _unreadable(err, source) from None
    if len(data) > budget:
        raise ConfigError(source, [_too_large(len(data), budget, limit)])
    return decode(data, source), len(data)


def _unreadable(err: Exception, source: str) -> ConfigError:
    if isinstance(err, FileNotFoundError):
        return ConfigError(source, ["no such file"])
    return ConfigError(source, [f"cannot read the file: {getattr(err, 'strerror', None) or err}"])


def _too_large(size: int, budget: int, limit: int) -> str:
    if budget == limit:
        return f"{size:,} bytes; an objective file may have at most {limit:,} (the limit on objective size)"
    return (
        f"{size:,} bytes, but the files that extend it leave only {budget:,} of the {limit:,} an objective may have "
        "(the limit on objective size counts every file of an extends chain)"
    )
