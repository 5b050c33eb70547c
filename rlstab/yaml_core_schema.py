"""YAML 1.2's core schema, both ways: which plain scalars are null, booleans and numbers, and YAML text out.

The patterns are the core schema's (YAML 1.2.2, section 10.3.2): ``null``/``~``/empty, ``true``/``false``
in three cases, decimal integers, ``0o`` octal and ``0x`` hexadecimal integers, floats, ``.inf`` and
``.nan``. The reader, ``rlstab.loading.yaml12``, resolves plain scalars with them; ``dump_yaml``
quotes text that they, or YAML 1.1, would read as something else. A leaf: ``Objective.to_yaml`` writes with it, and the data model imports nothing
of the loading that builds it.
"""

from __future__ import annotations

import re
from typing import Any

import yaml

NULL = re.compile(r"~|null|Null|NULL|")
BOOL = {"true": True, "True": True, "TRUE": True, "false": False, "False": False, "FALSE": False}
DECIMAL = re.compile(r"[-+]?[0-9]+")
OCTAL = re.compile(r"0o[0-7]+")
HEXADECIMAL = re.compile(r"0x[0-9a-fA-F]+")
FLOAT = re.compile(r"[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?")
INFINITY = re.compile(r"[-+]?\.(?:inf|Inf|INF)")
NAN = re.compile(r"\.(?:nan|NaN|NAN)")


class _Dumper(yaml.SafeDumper):
    """PyYAML's safe dumper, which also quotes text that YAML 1.2 would read as a number (``1e5``, ``0o17``).

    PyYAML quotes a string only when YAML 1.1 would read it as something else; with YAML 1.2's
    patterns added, a string is quoted when either version would, so the output means the same to
    rlstab and to any YAML 1.1 tool.
    """


_Dumper.add_implicit_resolver("tag:yaml.org,2002:int", re.compile(r"(?:[-+]?[0-9]+|0o[0-7]+|0x[0-9a-fA-F]+)\Z"), list("-+0123456789"))
_Dumper.add_implicit_resolver(
    "tag:yaml.org,2002:float", re.compile(rf"(?:{FLOAT.pattern}|{INFINITY.pattern}|{NAN.pattern})\Z"), list("-+.0123456789")
)


def dump_yaml(data: Any) -> str:
    """YAML text of plain data that ``parse_yaml`` and YAML 1.1 readers both read back as ``data``."""
    return yaml.dump(data, Dumper=_Dumper, sort_keys=False)
