"""docs/adapters/migration.md: every row's objective loads, and the conformance test it names exists.

The adapter tests import their trainer, which this environment does not have, so they are read, not
imported: the named test function must be defined in the named file, and a ``[case]`` must be the
id of one of its ``parametrize`` values (or of a tuple of them), computed from the file's own
literals as pytest computes them. Where the case indexes a table of (trainer settings, objective) pairs in the test
file, the row's objective must be that objective: the page cannot drift from what is compared.
"""

from __future__ import annotations

import ast
import re
from functools import cache
from pathlib import Path

import pytest

import rlstab
from rlstab.objective import Objective

ROOT = Path(__file__).parents[2]
PAGE = ROOT / "docs" / "adapters" / "migration.md"
TESTS = ROOT / "tests" / "adapters"
REFERENCE = re.compile(r"`((?:verl|trl|openrlhf)/test_\w+\.py)::(test_\w+)(?:\[([^\]`]+)\])?`")
# Tests whose case indexes a table of what is compared, passed to the trainer pair unchanged.
CASE_TABLES = {
    ("trl/test_conformance.py", "test_preset_matches_trl_loss_type"),
    ("trl/test_catalogue_second_wave.py", "test_loss_options_match_trl"),
    ("verl/test_catalogue_conformance.py", "test_preset_matches_verl"),
}
LOSS_FIELDS = ("masks", "shadow_masks", "reweighters", "surrogate", "aggregation", "regularisers", "log_ratio_clamp")


def rows() -> list[tuple[str, str, list[tuple[str, str, str | None]]]]:
    """(section, objective, [(file, test, case)]) of every table row that names a test."""
    found, section = [], None
    for line in PAGE.read_text().splitlines():
        if line.startswith("## "):
            section = line[3:]
        cells = [c.strip() for c in line.strip().strip("|").split("|")] if line.startswith("|") else []
        if len(cells) != 3 or cells[0] in ("---",) or not REFERENCE.search(cells[2]):
            continue
        objective = re.search(r"`([^`]+)`", cells[1])
        assert objective, f"a row without an objective: {line}"
        found.append((section, objective.group(1), REFERENCE.findall(cells[2])))
    return found


ROWS = rows()


def _id(value) -> str | None:
    """pytest's id of one parameter value (None where pytest would number it instead)."""
    if isinstance(value, str | int | float | bool) or value is None:
        return str(value)
    return None


@cache
def module(path: str) -> tuple[ast.Module, dict]:
    """The test file's syntax tree and the values of its top-level literal tables.

    Only assignments and plain functions are run (helpers such as a ``case(...)`` builder); one
    that needs an import (torch, the trainer) is left out, so its axis cannot be named by a case.
    """
    tree = ast.parse((TESTS / path).read_text(), filename=path)
    namespace: dict = {}
    for node in tree.body:
        if isinstance(node, ast.Assign | ast.AnnAssign) or (isinstance(node, ast.FunctionDef) and not node.decorator_list):
            try:
                exec(compile(ast.Module(body=[node], type_ignores=[]), path, "exec"), namespace)
            except Exception:  # noqa: BLE001 - a value built from an import: not a case table
                continue
    return tree, namespace


def parametrize_axes(path: str, test: str) -> list[tuple[ast.expr, list[str]]]:
    """(values expression, ids) of each ``pytest.mark.parametrize`` of the test; asserts the test exists."""
    tree, namespace = module(path)
    function = next((n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == test), None)
    assert function is not None, f"{path}: no test {test}"
    axes = []
    for decorator in function.decorator_list:
        if not (isinstance(decorator, ast.Call) and getattr(decorator.func, "attr", None) == "parametrize"):
            continue
        names, values_node = decorator.args[:2]
        several = "," in ast.literal_eval(names) if isinstance(names, ast.Constant) else True
        ids_node = next((k.value for k in decorator.keywords if k.arg == "ids"), None)
        try:
            values = eval(compile(ast.Expression(values_node), path, "eval"), dict(namespace))  # noqa: S307 - the repo's own test file
            if ids_node is not None:
                ids = list(eval(compile(ast.Expression(ids_node), path, "eval"), dict(namespace)))  # noqa: S307
            elif several:  # the joined id of each tuple, and the id of each of its values (a case names one)
                ids = ["-".join(str(_id(v)) for v in value) for value in values]
                ids += [_id(v) for value in values for v in value]
            else:
                ids = [_id(v) for v in values]
        except Exception:  # noqa: BLE001 - values built from an import
            ids = []
        axes.append((values_node, [i for i in ids if i is not None]))
    return axes


def case_objective(path: str, test: str, case: str):
    """The objective a test's case compares, where its file keeps one per case (``CASE_TABLES``); None otherwise."""
    if (path, test) not in CASE_TABLES:
        return None
    _, namespace = module(path)
    for values_node, _ in parametrize_axes(path, test):
        table = values_node.args[0].id if (
            isinstance(values_node, ast.Call) and getattr(values_node.func, "id", None) == "list"
            and values_node.args and isinstance(values_node.args[0], ast.Name)) else None
        entry = namespace.get(table, {}).get(case) if isinstance(namespace.get(table), dict) else None
        if isinstance(entry, tuple) and len(entry) == 2 and isinstance(entry[1], str | dict):
            return entry[1], LOSS_FIELDS  # (TRL's GRPOConfig fields, rlstab objective)
        if isinstance(entry, dict) and "preset" in entry:  # veRL's case(): the preset and its surrogate overrides
            objective = {"extends": entry["preset"]}
            if entry["surrogate"]:
                objective["surrogate"] = entry["surrogate"]
            return objective, tuple(f for f in LOSS_FIELDS if f != "aggregation")  # compared under every mode
    raise AssertionError(f"{path}::{test}[{case}]: the case's objective was not found in the file")


def loss_fields(objective: Objective, fields: tuple[str, ...]) -> dict:
    return objective.model_dump(include=set(fields))


def test_the_page_has_rows_for_every_trainer():
    sections = {section for section, _, _ in ROWS}
    assert sections == {"veRL", "TRL", "OpenRLHF"}
    assert len(ROWS) >= 50
    assert all(references for _, _, references in ROWS)


@pytest.mark.parametrize(("section", "objective", "references"), ROWS, ids=[f"{s}:{o}" for s, o, _ in ROWS])
def test_row_objective_loads_and_its_tests_exist(section, objective, references):
    loaded = rlstab.load(objective)  # a preset name, or an objective file's YAML on one line
    assert isinstance(loaded, Objective)
    for path, test, case in references:
        assert (TESTS / path).is_file(), path
        axes = parametrize_axes(path, test)
        if case:
            ids = {i for _, axis in axes for i in axis}
            assert case in ids, f"{path}::{test}: no case {case!r} (cases: {sorted(ids)})"
            compared = case_objective(path, test, case)
            if compared is not None:
                theirs, fields = compared
                assert loss_fields(loaded, fields) == loss_fields(rlstab.load(theirs), fields), (
                    f"{objective} is not what {path}::{test}[{case}] compares")


def test_every_test_the_page_names_outside_the_tables_exists_too():
    named = REFERENCE.findall(PAGE.read_text())
    in_rows = {reference for _, _, references in ROWS for reference in references}
    for path, test, case in set(named) - in_rows:
        ids = {i for _, axis in parametrize_axes(path, test) for i in axis}
        assert not case or case in ids, f"{path}::{test}: no case {case!r}"
