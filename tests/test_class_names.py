"""Names that say what a thing is: one class per name where two would be confused (issue 40)."""

from __future__ import annotations

import ast
from pathlib import Path

import rlstab

PACKAGE = Path(rlstab.__file__).parent


def classes_named(*names: str) -> dict[str, list[str]]:
    """``{name: the files of rlstab that define a class of that name}``, read as text (nothing imported)."""
    found: dict[str, list[str]] = {name: [] for name in names}
    for path in sorted(PACKAGE.rglob("*.py")):
        text = path.read_text(encoding="utf-8")
        if not any(f"class {name}" in text for name in names):
            continue
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.ClassDef) and node.name in found:
                found[node.name].append(path.relative_to(PACKAGE.parent).as_posix())
    return found


def test_one_class_is_named_plan():
    """The compiler's plan of an objective; the lab's plan of a grid of runs is a GridPlan."""
    assert classes_named("Plan", "GridPlan") == {"Plan": ["rlstab/compiler/plan.py"], "GridPlan": ["rlstab/lab/compare.py"]}
