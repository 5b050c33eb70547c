"""The API reference shows each pydantic model's fields as one table, built from the code.

Every table row is checked against the model it documents (the name as written in YAML, the
default, the bounds), every registered built-in component has its table on some reference page,
and no reference page shows private names (``_not_nan``, ``_chunk``, ``model_config``, ...).
"""

from __future__ import annotations

import ast
import importlib
import operator
import re
from html.parser import HTMLParser
from pathlib import Path

import pytest
from pydantic import BaseModel
from pydantic_core import PydanticUndefined

from rlstab.clipping import PPOClip
from rlstab.masks import S2T, Expression
from rlstab.registry import FAMILIES, registrations

BOUNDS = {  # pydantic's constraint attribute -> how the table writes it
    "gt": ">",
    "ge": "≥",
    "lt": "<",
    "le": "≤",
    "multiple_of": "multiple of",
    "min_length": "length ≥",
    "max_length": "length ≤",
    "pattern": "matches",
    "max_digits": "digits ≤",
    "decimal_places": "decimals ≤",
}
PRIVATE_NAMES = ["_not_nan", "_chunk", "_forward", "model_config", "class-attribute", "instance-attribute"]


class _Page(HTMLParser):
    """A built page's visible text, its ``<code>`` texts, its ``rlstab.*`` ids and its field tables."""

    def __init__(self, text: str):
        super().__init__()
        self.text: list[str] = []
        self.codes: list[str] = []
        self.ids: list[str] = []
        self.rows: list[tuple[str, str, list[str]]] = []  # (anchor id, data-field, cell texts)
        self._skip = 0  # inside <script> / <style>
        self._code: list[str] | None = None
        self._row: tuple[str | None, str, list[str]] | None = None
        self._cell: list[str] | None = None
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if attrs.get("id", "").startswith("rlstab."):
            self.ids.append(attrs["id"])
        if tag in ("script", "style"):
            self._skip += 1
        elif tag == "code":
            self._code = []
        elif tag == "tr" and "data-field" in attrs:
            self._row = (None, attrs["data-field"], [])
        elif tag == "td" and self._row is not None:
            self._cell = []
        elif tag == "a" and self._row is not None and self._row[0] is None and "id" in attrs:
            self._row = (attrs["id"], self._row[1], self._row[2])

    def handle_endtag(self, tag):
        if tag in ("script", "style"):
            self._skip -= 1
        elif tag == "code" and self._code is not None:
            self.codes.append("".join(self._code).strip())
            self._code = None
        elif tag == "td" and self._cell is not None:
            self._row[2].append(" ".join("".join(self._cell).split()))
            self._cell = None
        elif tag == "tr" and self._row is not None:
            self.rows.append(self._row)
            self._row = None

    def handle_data(self, data):
        if self._skip:
            return
        self.text.append(data)
        for part in (self._code, self._cell):
            if part is not None:
                part.append(data)


@pytest.fixture(scope="module")
def pages(built_site: Path) -> dict[str, _Page]:
    found = {
        str(path.relative_to(built_site)): _Page(path.read_text(encoding="utf-8"))
        for path in sorted((built_site / "reference").rglob("*.html"))
    }
    assert found, "no reference pages were built"
    return found


def _documented(path: str) -> object:
    """The object a documented path (``rlstab.masks.S2T``) names."""
    parts = path.split(".")
    for split in range(len(parts) - 1, 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:split]))
        except ImportError:
            continue
        for name in parts[split:]:
            obj = getattr(obj, name)
        return obj
    raise LookupError(path)


@pytest.fixture(scope="module")
def tables(pages) -> dict[type[BaseModel], dict[str, list[str]]]:
    """Each documented model's table: YAML name -> [name, type, default, bounds, description]."""
    found: dict[type[BaseModel], dict[str, list[str]]] = {}
    for page in pages.values():
        for anchor, name, cells in page.rows:
            model = _documented(anchor.rsplit(".", 1)[0])
            table = found.setdefault(model, {})
            assert table.get(name, cells) == cells, (
                f"{model.__name__}.{name} is documented twice, differently"
            )
            table[name] = cells
    return found


_OPERATORS = {
    ast.LShift: operator.lshift,
    ast.Mult: operator.mul,
    ast.Pow: operator.pow,
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Div: operator.truediv,
    ast.USub: operator.neg,
}


def _number(text: str) -> float:
    """A number as the code writes it: ``0.002``, ``1e-06``, ``-100.0``, ``1 << 20``."""

    def value(node: ast.AST) -> float:
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
            return node.value
        if isinstance(node, ast.UnaryOp):
            return _OPERATORS[type(node.op)](value(node.operand))
        if isinstance(node, ast.BinOp):
            return _OPERATORS[type(node.op)](value(node.left), value(node.right))
        raise ValueError(text)

    return value(ast.parse(text, mode="eval").body)


def _bounds(cell: str) -> list[tuple[str, object]]:
    """``"> 0.0, < 1.0"`` -> ``[(">", 0.0), ("<", 1.0)]``; ``finite`` stays a word."""
    parsed = []
    for part in filter(None, cell.split(", ")):
        symbol = next(
            (s for s in sorted(BOUNDS.values(), key=len, reverse=True) if part.startswith(s + " ")), None
        )
        if symbol is None:
            parsed.append((part, None))
        elif symbol == "matches":
            parsed.append((symbol, part.removeprefix("matches ")))
        else:
            parsed.append((symbol, _number(part.removeprefix(symbol + " "))))
    return parsed


def _expected_bounds(field) -> list[tuple[str, object]]:
    expected = []
    for item in field.metadata:
        for key, symbol in BOUNDS.items():
            if (bound := getattr(item, key, None)) is not None:
                expected.append((symbol, bound))
        if getattr(item, "allow_inf_nan", None) is False:
            expected.append(("finite", None))
    return expected


def _default_matches(cell: str, field) -> bool:
    if field.default_factory is not None:
        factory = field.default_factory
        return cell == (
            "[]" if factory in (list, tuple, set) else "{}" if factory is dict else f"{factory.__name__}()"
        )
    default = field.default
    if default is PydanticUndefined:
        return cell == "required"
    if default is None or isinstance(default, bool):
        return cell == {None: "null", True: "true", False: "false"}[default]
    if isinstance(default, (int, float)):
        return _number(cell) == default
    return cell == str(default)


def _yaml_name(name: str, field) -> str:
    """The key a YAML file uses for a field: its validation alias when that is one name."""
    return field.validation_alias if isinstance(field.validation_alias, str) else name


def _built_in_components() -> list[type[BaseModel]]:
    return [r.cls for family in FAMILIES for r in registrations(family) if r.distribution == "rlstab"]


@pytest.mark.parametrize("component", _built_in_components(), ids=lambda cls: cls.__name__)
def test_every_built_in_component_has_a_table_of_its_yaml_fields(tables, component):
    assert component in tables, f"{component.__name__}: no field table on any reference page"
    yaml_names = {_yaml_name(name, field) for name, field in component.model_fields.items()}
    assert set(tables[component]) == yaml_names


def test_every_row_is_the_models_field(tables):
    """Name, default and bounds of every table row, as pydantic has them; a description where pydantic has one."""
    assert len(tables) >= len(_built_in_components())
    for model, table in tables.items():
        fields = {_yaml_name(name, field): field for name, field in model.model_fields.items()}
        assert set(table) == set(fields), model.__name__
        for name, (shown_name, annotation, default, bounds, description) in table.items():
            field, where = fields[name], f"{model.__name__}.{name}"
            assert shown_name == name, where
            assert annotation, f"{where}: no type"
            assert _default_matches(default, field), f"{where}: default {default!r}, the model's {field}"
            assert set(_bounds(bounds)) == set(_expected_bounds(field)), (
                f"{where}: bounds {bounds!r}, the model's {field}"
            )
            assert description or not field.description, f"{where}: no description"


def test_s2t_tau_p(tables):
    name, annotation, default, bounds, _ = tables[S2T]["tau_p"]
    assert (annotation, default, bounds) == ("float", "0.002", "> 0.0, < 1.0")
    assert _bounds(bounds) == [(">", 0.0), ("<", 1.0)]


def test_ppo_clip_ranges(tables):
    assert tables[PPOClip]["eps_high"][2:4] == ["0.2", "≥ 0.0, ≤ 10.0"]
    assert tables[PPOClip]["eps_low"][2:4] == ["0.2", "≥ 0.0, < 1.0"]
    assert tables[PPOClip]["dual_clip"][2:4] == ["null", "> 1.0"]


def test_expression_shows_keep_not_keep_when(pages, tables):
    assert "keep" in tables[Expression] and "keep_when" not in tables[Expression]
    masks = pages["reference/masks/index.html"]
    assert "keep_when" not in "".join(masks.text)


@pytest.mark.parametrize("name", PRIVATE_NAMES)
def test_no_reference_page_shows(pages, name):
    pattern = re.compile(rf"(?<![\w-]){re.escape(name)}\b")  # default_chunk_rows is not _chunk
    shown = [path for path, page in pages.items() if pattern.search("".join(page.text))]
    assert not shown, f"{name} on {shown}"


def test_no_private_name_is_shown_or_anchored(pages):
    """No ``<code>`` names a private object (``_DPPO``, ``rlstab.stats._chunk``) and no anchor is one."""
    private = re.compile(r"^(rlstab\.\S*\.)?_(?!_)")  # dunders (__getitems__) are protocol methods
    for path, page in pages.items():
        assert not [code for code in page.codes if private.match(code)], path
        assert not [anchor for anchor in page.ids if re.search(r"\._(?!_)", anchor)], path


def test_every_attribute_of_tokens_is_in_the_reference(built_site):
    """A plugin author reads ``Tokens`` (what a component's methods receive) in the API reference:
    each of its fields is a row of its attributes table, with a description."""
    import dataclasses

    from rlstab.tokens import Tokens

    html = (built_site / "reference" / "registry" / "index.html").read_text(encoding="utf-8")
    start = html.index('id="rlstab.tokens.Tokens"')
    end = re.compile(r'id="rlstab\.(?!tokens\.Tokens)').search(html, start)  # the next object's heading
    section = html[start : end.start() if end else len(html)]
    rows = dict(re.findall(r'<span title="rlstab\.tokens\.Tokens\.(\w+)">\w+</span></code></td>(.*?)</tr>', section, re.S))
    fields = [f.name for f in dataclasses.fields(Tokens)]
    assert list(rows) == fields
    for name, cells in rows.items():
        description = re.sub(r"<[^>]+>", "", cells.rsplit("<td>", 1)[-1]).strip()
        assert len(description) > 10, name


def test_every_familys_base_class_is_in_the_reference(pages):
    """A plugin author derives from a family's base class (docs/plugins.md): each one, and the
    ``Component`` they share, has a heading of its own on a reference page."""
    from rlstab.components import Component

    anchored = {}
    for path, page in pages.items():
        for anchor in page.ids:
            try:
                anchored.setdefault(_documented(anchor), path)
            except (LookupError, AttributeError):
                pass  # a member's anchor (a field, a parameter): not an object of its own
    for base in [Component, *(family.base for family in FAMILIES.values())]:
        assert base in anchored, f"{base.__module__}.{base.__name__}: on no reference page"


def test_the_mask_base_says_when_keep_gets_no_threshold(pages):
    """``Mask.keep``'s ``threshold`` is None when the step has no token to take a quantile of: the
    reference says so where a plugin author reads the method (docs/plugins.md links it)."""
    text = " ".join("".join(pages["reference/masks/index.html"].text).split())
    assert "threshold is None" in text and "no valid token" in text
