"""No module of rlstab imports another in a circle, at the top of a file or inside a function.

The imports are read from the source (``ast``), not run: a function-level import counts as much as a
top-level one, since it closes the same circle the first time the function runs. ``from a import b``
is an import of the module ``a.b`` when there is one, else of ``a``. Imports under ``if
TYPE_CHECKING:`` are left out: they never run. A package's ``__init__`` importing its own
submodules is an edge like any other.
"""

import ast
from pathlib import Path

import rlstab

ROOT = Path(rlstab.__file__).parent


def modules() -> dict[str, Path]:
    found = {}
    for path in ROOT.rglob("*.py"):
        parts = ("rlstab",) + path.relative_to(ROOT).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = path
    return found


def imports(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The rlstab modules ``name`` imports (outside ``if TYPE_CHECKING:``)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    skipped = {
        id(sub)
        for node in ast.walk(tree)
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
        for sub in ast.walk(node)
    }
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = set()
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join(anchor + ([node.module] if node.module else []))
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
        else:
            continue
        for target in targets:
            while target and target not in known:  # an attribute of a module: the module
                target = target.rpartition(".")[0]
            if target and target != name:
                out.add(target)
    return out


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def test_no_import_circles():
    known = modules()
    edges = {name: imports(name, path, known) for name, path in known.items()}
    assert cycles(edges) == []


def test_the_walk_sees_circles():
    # The walk on a made-up package: a -> b at the top, b -> a inside a function, c -> a under TYPE_CHECKING.
    edges = {"a": {"b"}, "b": {"a"}, "c": set()}
    assert cycles(edges) == [["a", "b"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_imports_are_read_at_every_depth(tmp_path):
    source = tmp_path / "m.py"
    source.write_text(
        "from typing import TYPE_CHECKING\n"
        "import rlstab.errors\n"
        "if TYPE_CHECKING:\n    from rlstab.objective import Objective\n"
        "def f():\n    from rlstab.registry import store\n"
        "from rlstab.stats import backend\n"
    )
    known = modules()
    assert imports("rlstab.m", source, known) == {"rlstab.errors", "rlstab.registry.store", "rlstab.stats.backend"}


# Packages that must not import others: the lab and the embedded trainer are built on the trainer's
# library, never on the demo's command; the trainer knows nothing of the lab.
FORBIDDEN = {"rlstab.lab": ("rlstab.demo",), "rlstab.trainer": ("rlstab.demo", "rlstab.lab")}


def test_the_lab_and_the_trainer_import_nothing_from_the_demo():
    known = modules()
    offences = sorted(
        (name, target)
        for name, path in known.items()
        for package, banned in FORBIDDEN.items()
        if name == package or name.startswith(package + ".")
        for target in imports(name, path, known)
        if target.startswith(banned)
    )
    assert offences == []
    assert any(name.startswith("rlstab.lab.") for name in known) and any(n.startswith("rlstab.trainer.") for n in known)
