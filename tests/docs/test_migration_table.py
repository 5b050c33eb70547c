"""docs/adapters/migration.md: every row's objective loads, and the conformance test it names exists.

The adapter tests import their trainer, which this environment does not have, so they are read, not
imported: the named test function must be defined in the named file, and a ``[case]`` must be the
id of one of its ``parametrize`` values (or of a tuple of them), computed from the file's own
literals as pytest computes them. Where the case indexes a table of (trainer settings, objective) pairs in the test
file, the row's objective must be that objective: the page cannot drift from what is compared.

Each row names the settings it needs and the trainer's defaults hold for the rest, so each row's
conditions are checked against the trainer's defaults: the aggregation the trainer uses under
them (its default ``loss_agg_mode`` / ``loss_type`` where the row names none) must be the
objective's, and the trainer settings a veRL case is compared under must each be named in its row.
"""

from __future__ import annotations

import ast
import itertools
import re
from functools import cache
from pathlib import Path

import pytest

import rlstab
from rlstab.adapters.trainer_aggregation import VERL_DEFAULT_MODE
from rlstab.objective import Objective

ROOT = Path(__file__).parents[2]
PAGE = ROOT / "docs" / "adapters" / "migration.md"
TESTS = ROOT / "tests" / "adapters"
REFERENCE = re.compile(r"`((?:verl|trl|openrlhf|clipping|masks|regularisers|reweighters)/test_\w+\.py)::(test_\w+)"
                       r"(?:\[([^\]`]+)\])?`")
ADAPTER_TESTS = ("verl/", "trl/", "openrlhf/")  # under tests/adapters; the others (a restated reference) under tests/


def reference_file(path: str) -> Path:
    return (TESTS if path.startswith(ADAPTER_TESTS) else ROOT / "tests") / path
# Tests whose case indexes a table of what is compared, passed to the trainer pair unchanged.
CASE_TABLES = {
    ("trl/test_conformance.py", "test_preset_matches_trl_loss_type"),
    ("trl/test_catalogue_second_wave.py", "test_loss_options_match_trl"),
    ("verl/test_catalogue_conformance.py", "test_preset_matches_verl"),
}
LOSS_FIELDS = ("masks", "shadow_masks", "reweighters", "surrogate", "aggregation", "regularisers", "log_ratio_clamp")


def rows(text: str | None = None) -> list[tuple[str, str, list[tuple[str, str, str | None]], str]]:
    """(section, objective, [(file, test, case)], the trainer's settings) of every table row that names a test."""
    found, section = [], None
    for line in (PAGE.read_text() if text is None else text).splitlines():
        if line.startswith("## "):
            section = line[3:]
        cells = [c.strip() for c in line.strip().strip("|").split("|")] if line.startswith("|") else []
        if len(cells) != 3 or cells[0] in ("---",) or not REFERENCE.search(cells[2]):
            continue
        objective = re.search(r"`([^`]+)`", cells[1])
        assert objective, f"a row without an objective: {line}"
        found.append((section, objective.group(1), REFERENCE.findall(cells[2]), cells[0]))
    return found


ROWS = rows()

# What each trainer aggregates its policy loss with, under a row's settings:
# - veRL: the row's `loss_agg_mode: M`, else veRL's default (ActorConfig.loss_agg_mode; checked in the veRL
#   environment), except where the row says veRL aggregates `M` "whatever `loss_agg_mode` says" (its sapo, geo_mean);
# - TRL: the aggregation of the row's `loss_type="..."` (the adapter's own table, read from its source), else the
#   section's stated convention, loss_type="dapo" (TRL 1.16's default, GRPOConfig.loss_type);
# - OpenRLHF: the row's `--actor.loss_agg_mode M`, else its default token-mean (train_ppo_ray); its gspo always
#   aggregates per sequence (PolicyLoss sets token_level_loss=False for policy_loss_type gspo);
# - the other sections: their trainer's one aggregation (FIXED_AGGREGATION).
# The sections whose trainer has one aggregation whatever its settings.
FIXED_AGGREGATION = {
    "TRL AsyncGRPO": "token-mean",  # each micro-batch's token mean (AsyncGRPOTrainer.compute_loss)
    "prime-rl": "token-mean",  # each loss component divided by its global count of trainable tokens (compute_loss)
    "TRL pull request #5591 (Target PO)": "seq-mean-token-mean",  # the mean over responses of each group's CE
    "GTPO (its authors' trainer)": "seq-mean-token-mean",  # the README's 1/G sum_i 1/|o_i| sum_t
}
TRL_CONFIG = ROOT / "rlstab" / "adapters" / "trl" / "config.py"
TRL_DEFAULT_LOSS_TYPE = "dapo"
OPENRLHF_DEFAULT_MODE = "token-mean"


@cache
def trl_loss_type_aggregation() -> dict[str, str]:
    """The TRL adapter's ``_LOSS_TYPE_AGGREGATION``, read from its source (importing it imports TRL)."""
    tree = ast.parse(TRL_CONFIG.read_text())
    (table,) = [n.value for n in tree.body if isinstance(n, ast.Assign)
                and any(getattr(t, "id", None) == "_LOSS_TYPE_AGGREGATION" for t in n.targets)]
    return ast.literal_eval(table)


def trainer_aggregation(section: str, settings: str) -> str:
    """The aggregation kind the section's trainer uses for its policy loss under a row's settings, defaults elsewhere."""
    if section == "veRL":
        fixed = re.search(r"veRL aggregates `([\w-]+)`[^|]*?whatever `loss_agg_mode` says", settings)
        named = re.search(r"loss_agg_mode: ([\w-]+)", settings)
        return fixed.group(1) if fixed else named.group(1) if named else VERL_DEFAULT_MODE
    if section in FIXED_AGGREGATION:
        return FIXED_AGGREGATION[section]
    if section == "TRL":
        loss_type = re.search(r'loss_type="(\w+)"', settings)
        return trl_loss_type_aggregation()[loss_type.group(1) if loss_type else TRL_DEFAULT_LOSS_TYPE]
    if "--actor.policy_loss_type gspo" in settings:
        return "seq-mean-token-mean"
    named = re.search(r"--actor\.loss_agg_mode ([\w-]+)", settings)
    return named.group(1) if named else OPENRLHF_DEFAULT_MODE


def named_settings(settings: str) -> dict[str, float]:
    """The veRL settings a row names with their numbers: ``clip a / b`` (clip_ratio_low / _high), ```key` value``."""
    out = {key: float(value) for key, value in re.findall(r"`(\w+)` (-?[\d.]+(?:e-?\d+)?)\b", settings)}
    clip = re.search(r"\bclip (-?[\d.]+(?:e-?\d+)?) / (-?[\d.]+(?:e-?\d+)?)", settings)
    if clip:
        out["clip_ratio_low"], out["clip_ratio_high"] = float(clip.group(1)), float(clip.group(2))
    return out


def row_problems(section: str, objective: str, references, settings: str) -> list[str]:
    """What a row's settings contradict: the objective's aggregation, the settings its veRL case compares under."""
    loaded, problems = rlstab.load(objective), []
    theirs = trainer_aggregation(section, settings)
    if (loaded.aggregation.kind, loaded.aggregation.count) != (theirs, "valid"):
        problems.append(f"{section} aggregates {theirs} over the valid tokens under {settings!r}, "
                        f"but {objective} aggregates {loaded.aggregation.kind} over the {loaded.aggregation.count} ones")
    for path, test, case in references:
        entry = case_entry(path, test, case) if case else None
        if not isinstance(entry, dict) or "preset" not in entry:
            continue
        named = named_settings(settings)
        for key, value in {**entry["verl_actor"], **entry["verl_policy_loss"]}.items():
            if named.get(key) != pytest.approx(value):
                problems.append(f"{path}::{test}[{case}] compares under {key}={value}, which the row does not name")
        fixed = (entry["fixed_aggregation"] or {}).get("kind")
        if fixed is not None and fixed != theirs:
            problems.append(f"{path}::{test}[{case}] compares veRL aggregating {fixed} whatever loss_agg_mode says")
    return problems


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
    tree = ast.parse(reference_file(path).read_text(), filename=path)
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


def case_ids(path: str, test: str) -> set[str]:
    """Every id a case of the test may have: each axis's, and with stacked ``parametrize`` decorators their
    combinations, joined as pytest joins them (the decorator nearest the function first)."""
    axes = [axis for _, axis in parametrize_axes(path, test)]
    ids = {i for axis in axes for i in axis}
    if len(axes) > 1:
        ids |= {"-".join(combo) for combo in itertools.product(*reversed(axes))}
    return ids


def case_entry(path: str, test: str, case: str):
    """The entry of a test's case table for ``case`` (``CASE_TABLES``); None where the file keeps none."""
    if (path, test) not in CASE_TABLES:
        return None
    _, namespace = module(path)
    for values_node, _ in parametrize_axes(path, test):
        table = values_node.args[0].id if (
            isinstance(values_node, ast.Call) and getattr(values_node.func, "id", None) == "list"
            and values_node.args and isinstance(values_node.args[0], ast.Name)) else None
        entry = namespace.get(table, {}).get(case) if isinstance(namespace.get(table), dict) else None
        if (isinstance(entry, tuple) and len(entry) == 2) or (isinstance(entry, dict) and "preset" in entry):
            return entry
    return None


def case_objective(path: str, test: str, case: str):
    """The objective a test's case compares, where its file keeps one per case (``CASE_TABLES``); None otherwise."""
    if (path, test) not in CASE_TABLES:
        return None
    entry = case_entry(path, test, case)
    if entry is not None:
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
    sections = {section for section, _, _, _ in ROWS}
    assert sections == {"veRL", "TRL", "OpenRLHF", *FIXED_AGGREGATION}
    assert len(ROWS) >= 50
    assert all(references for _, _, references, _ in ROWS)


IDS = [f"{s}:{o}:{i}" for i, (s, o, _, _) in enumerate(ROWS)]


@pytest.mark.parametrize(("section", "objective", "references", "settings"), ROWS, ids=IDS)
def test_row_objective_loads_and_its_tests_exist(section, objective, references, settings):
    loaded = rlstab.load(objective)  # a preset name, or an objective file's YAML on one line
    assert isinstance(loaded, Objective)
    for path, test, case in references:
        assert reference_file(path).is_file(), path
        ids = case_ids(path, test)
        if case:
            assert case in ids, f"{path}::{test}: no case {case!r} (cases: {sorted(ids)})"
            compared = case_objective(path, test, case)
            if compared is not None:
                theirs, fields = compared
                assert loss_fields(loaded, fields) == loss_fields(rlstab.load(theirs), fields), (
                    f"{objective} is not what {path}::{test}[{case}] compares")


@pytest.mark.parametrize(("section", "objective", "references", "settings"), ROWS, ids=IDS)
def test_row_gives_the_trainers_loss_under_its_settings_and_the_trainers_defaults(section, objective, references, settings):
    assert row_problems(section, objective, references, settings) == []


# Rows of the table before issue 38: each relied on a loss_agg_mode it did not name (veRL's default is token-mean).
UNNAMED_AGGREGATION = """## veRL
| `dppo_tv`, clip 0.15 / 0.15, `clip_ratio_c` 10000 | `dppo_tv` | `verl/test_catalogue_conformance.py::test_preset_matches_verl[dppo_tv]` |
| `dppo_kl`, clip 0.2 / 0.02, `clip_ratio_c` 3 | `{extends: dppo_kl, surrogate: {delta_low: 0.2, delta_high: 0.02, is_cap: 3.0}}` | `verl/test_catalogue_conformance.py::test_preset_matches_verl[dppo_kl-cap]` |
| `gspo`, clip 3e-4 / 4e-4 (veRL's is GSPO-token) | `{extends: gspo, surrogate: {gradient: token}}` | `verl/test_catalogue_conformance.py::test_preset_matches_verl[gspo]` |
| `sapo`, `tau_pos` 1.0, `tau_neg` 1.05 | `sapo` | `verl/test_catalogue_conformance.py::test_preset_matches_verl[sapo]` |
| `cispo`, clip 1.0 / 4.0 | `{extends: cispo, aggregation: {kind: seq-mean-token-mean, count: valid}}` | `verl/test_catalogue_conformance.py::test_preset_matches_verl[cispo]` |
| `dppo_tv`, `loss_agg_mode: seq-mean-token-sum-norm`, clip 0.15 / 0.15 | `dppo_tv` | `verl/test_catalogue_conformance.py::test_preset_matches_verl[dppo_tv]` |
## TRL
| `loss_type="grpo"` | `{extends: grpo, surrogate: {dual_clip: null}}` | `trl/test_conformance.py::test_preset_matches_trl_loss_type[grpo]` |
## OpenRLHF
| `--actor.policy_loss_type ppo --actor.eps_clip_low_high 0.2 0.28` | `{extends: dapo, aggregation: {kind: seq-mean-token-mean, count: valid}}` | `openrlhf/test_conformance.py::test_matches_openrlhf_policy_loss[ppo-token]` |
"""


def test_the_check_fails_a_row_that_relies_on_a_setting_it_does_not_name():
    """Not vacuous: the old dppo/gspo rows, sapo without veRL's fixed aggregation, a case's setting left unnamed."""
    found = [row_problems(*row) for row in rows(UNNAMED_AGGREGATION)]
    assert found[0] == [
        "veRL aggregates token-mean over the valid tokens under '`dppo_tv`, clip 0.15 / 0.15, `clip_ratio_c` 10000', "
        "but dppo_tv aggregates seq-mean-token-sum-norm over the valid ones"]
    assert [p.split(" under ")[0] for p in found[1]] == ["veRL aggregates token-mean over the valid tokens"]
    assert [p.split(" under ")[0] for p in found[2]] == ["veRL aggregates token-mean over the valid tokens"]
    assert found[2][0].endswith("but {extends: gspo, surrogate: {gradient: token}} aggregates seq-mean-token-mean "
                                "over the valid ones")
    assert found[3] == [  # the case compares veRL's fixed aggregation, and the row does not say so
        "veRL aggregates token-mean over the valid tokens under '`sapo`, `tau_pos` 1.0, `tau_neg` 1.05', but sapo "
        "aggregates seq-mean-token-mean over the valid ones",
        "verl/test_catalogue_conformance.py::test_preset_matches_verl[sapo] compares veRL aggregating "
        "seq-mean-token-mean whatever loss_agg_mode says"]
    assert [p.split(" under ")[0] for p in found[4]] == ["veRL aggregates token-mean over the valid tokens"]
    assert found[5] == ["verl/test_catalogue_conformance.py::test_preset_matches_verl[dppo_tv] compares under "
                        "clip_ratio_c=10000.0, which the row does not name"]
    assert [p.split(" under ")[0] for p in found[6]] == ["TRL aggregates seq-mean-token-mean over the valid tokens"]
    assert [p.split(" under ")[0] for p in found[7]] == ["OpenRLHF aggregates token-mean over the valid tokens"]


def test_every_test_the_page_names_outside_the_tables_exists_too():
    named = REFERENCE.findall(PAGE.read_text())
    in_rows = {reference for _, _, references, _ in ROWS for reference in references}
    for path, test, case in set(named) - in_rows:
        assert not case or case in case_ids(path, test), f"{path}::{test}: no case {case!r}"
