"""No module of rlstab imports another in a circle: at the top of a file, inside a function, for types only, or by name.

The imports are read from the source (``ast``), not run: a function-level import counts as much as a
top-level one, since it closes the same circle the first time the function runs, and an import under
``if TYPE_CHECKING:`` counts too: it never runs, but it says that the module is written against the
other, which a circle of types ties as much as a circle of calls. ``from a import b`` is an import of
the module ``a.b`` when there is one, else of ``a``. A package's ``__init__`` importing its own
submodules is an edge like any other.

A module found by name (``importlib.import_module("rlstab.x")``, ``__import__("rlstab.x")``, a
literal string) is an edge too, a *late-bound* one. Exactly the late-bound edges of ``LATE_BOUND``
may close a circle, each declared with its reason; a late-bound import of rlstab that is not
declared there fails, so that no hidden edge creeps in. (A name built at run time cannot be read;
rlstab has none that names one of its own modules.)
"""

import ast
from pathlib import Path

import rlstab

ROOT = Path(rlstab.__file__).parent

LATE_BOUND = {
    ("rlstab.objective", "rlstab.compiled"): (
        "Objective.compile(), the one alias of rlstab.compile(objective), kept because it is the README's API: "
        "the objective is data and imports nothing of the compiler, which it finds by name when compile() is called"
    ),
}
"""The late-bound edges allowed to close a circle: ``(module, the module it finds by name)`` -> why."""
LOADERS = ("importlib.import_module", "import_module", "__import__")


def modules() -> dict[str, Path]:
    found = {}
    for path in ROOT.rglob("*.py"):
        parts = ("rlstab",) + path.relative_to(ROOT).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = path
    return found


def imports(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The rlstab modules ``name`` imports with an import statement, under ``if TYPE_CHECKING:`` too."""
    tree = ast.parse(path.read_text(), filename=str(path))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = set()
    for node in ast.walk(tree):
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
        out |= _modules_of(targets, name, known)
    return out


def late_bound_imports(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The rlstab modules ``name`` finds by name: ``importlib.import_module(NAME)`` (or ``import_module``,
    ``__import__``) where NAME is a literal string, or a module-level constant bound to one."""
    tree = ast.parse(path.read_text(), filename=str(path))
    constants = {
        target.id: node.value.value
        for node in tree.body
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)
        for target in node.targets
        if isinstance(target, ast.Name)
    }
    targets = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and ast.unparse(node.func) in LOADERS and node.args:
            first = node.args[0]
            if isinstance(first, ast.Constant) and isinstance(first.value, str):
                targets.append(first.value)
            elif isinstance(first, ast.Name) and first.id in constants:
                targets.append(constants[first.id])
    return _modules_of([t for t in targets if t.split(".")[0] == "rlstab"], name, known)


def _modules_of(targets: list[str], name: str, known: dict[str, Path]) -> set[str]:
    out = set()
    for target in targets:
        while target and target not in known:  # an attribute of a module: the module
            target = target.rpartition(".")[0]
        if target and target != name:
            out.add(target)
    return out


def edges_of(known: dict[str, Path]) -> dict[str, set[str]]:
    """Every module's imports and late-bound imports, but the late-bound edges that ``LATE_BOUND`` declares."""
    return {
        name: imports(name, path, known)
        | {t for t in late_bound_imports(name, path, known) if (name, t) not in LATE_BOUND}
        for name, path in known.items()
    }


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
    assert cycles(edges_of(modules())) == []


def test_every_late_bound_import_is_declared_and_every_declared_one_is_there():
    known = modules()
    found = {(name, target) for name, path in known.items() for target in late_bound_imports(name, path, known)}
    assert found == set(LATE_BOUND)


def test_the_walk_sees_circles():
    # The walk on a made-up package: a -> b at the top, b -> a inside a function or under TYPE_CHECKING.
    edges = {"a": {"b"}, "b": {"a"}, "c": set()}
    assert cycles(edges) == [["a", "b"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_imports_are_read_at_every_depth_for_types_and_by_name(tmp_path):
    source = tmp_path / "m.py"
    source.write_text(
        "import importlib\n"
        "from typing import TYPE_CHECKING\n"
        "import rlstab.errors\n"
        "if TYPE_CHECKING:\n    from rlstab.objective import Objective\n"
        "def f():\n    from rlstab.registry import store\n"
        "FACADE = 'rlstab.compiled'\n"
        "def g(name):\n"
        "    importlib.import_module('rlstab.quantile').Population\n"
        "    importlib.import_module(FACADE).CompiledObjective\n"
        "    importlib.import_module(name), importlib.import_module('torch')\n"  # not a constant; not rlstab
        "from rlstab.stats import backend\n"
    )
    known = modules()
    assert imports("rlstab.m", source, known) == {"rlstab.errors", "rlstab.objective", "rlstab.registry.store",
                                                  "rlstab.stats.backend"}
    assert late_bound_imports("rlstab.m", source, known) == {"rlstab.quantile", "rlstab.compiled"}


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


# The objective is data (issue 40): it imports nothing of what reads or builds it, for types neither; the
# compiler it finds by name only (LATE_BOUND). A component knows nothing of the objective that holds it.
DATA = {
    "rlstab.objective": ("rlstab.compiler", "rlstab.compiled", "rlstab.explain", "rlstab.adapters", "rlstab.loading"),
    "rlstab.masks": ("rlstab.objective", "rlstab.compiler", "rlstab.compiled"),
}


def test_the_objective_and_its_masks_import_nothing_that_reads_them():
    known = modules()
    edges = edges_of(known)
    offences = sorted(
        (name, target)
        for name in known
        for package, banned in DATA.items()
        if name == package or name.startswith(package + ".")
        for target in edges[name]
        if target.startswith(banned)
    )
    assert offences == []
