"""MkDocs hook: every formula of the site rendered to MathML when the site is built.

``pymdownx.arithmatex`` (generic mode) wraps the TeX of the pages and of the docstrings that
mkdocstrings renders in ``<span class="arithmatex">\\(...\\)</span>`` and
``<div class="arithmatex">\\[...\\]</div>``. This hook replaces each of them by a ``<math>`` element
(converted by latex2mathml), which browsers render natively (MathML Core): no script, font or CDN is
needed, so the site reads the same offline, and the search index holds the formulas' text, not TeX.

A formula that cannot be converted faithfully (an unknown macro, a malformed result) fails the build
with the page and the formula named: the site never shows raw TeX.
"""

from __future__ import annotations

import html
import re
from xml.etree import ElementTree

from latex2mathml.converter import convert
from latex2mathml.symbols_parser import convert_symbol
from mkdocs.exceptions import PluginError

MATHML = "http://www.w3.org/1998/Math/MathML"
ElementTree.register_namespace("", MATHML)

# What arithmatex's generic mode emits (its TeX is HTML-escaped, so it holds no "<").
ARITHMATEX = re.compile(r'<(span|div) class="arithmatex">(.*?)</\1>', re.S)
DELIMITERS = {"span": ("\\(", "\\)"), "div": ("\\[", "\\]")}

# Environments latex2mathml renders wrongly, rewritten to ones it renders well.
ENVIRONMENTS = {
    "aligned": ("\\begin{align*}", "\\end{align*}"),
    "gathered": ("\\begin{array}{c}", "\\end{array}"),
}
# Text-mode escapes that latex2mathml leaves as they are in \text{...} and \texttt{...}.
TEXT_ESCAPE = re.compile(r"\\([_%&#${}])")
# MathML 3 named spaces (in em); MathML Core, and so Chromium, knows none of them.
NAMED_SPACES = {
    f"{sign}{name}mathspace": f"{'-' if sign else ''}{eighteenths / 18:.4f}em"
    for sign in ("", "negative")
    for eighteenths, name in enumerate(
        ("veryverythin", "verythin", "thin", "medium", "thick", "verythick", "veryverythick"), start=1
    )
}
# MathML Core renders mathvariant="normal" only: other variants become the Unicode mathematical
# alphanumeric characters (A, a and 0 of each block, then the letters Unicode placed elsewhere).
ALPHANUMERICS = {
    "bold": (0x1D400, 0x1D41A, 0x1D7CE),
    "italic": (0x1D434, 0x1D44E, None),
    "bold-italic": (0x1D468, 0x1D482, None),
    "script": (0x1D49C, 0x1D4B6, None),
    "bold-script": (0x1D4D0, 0x1D4EA, None),
    "fraktur": (0x1D504, 0x1D51E, None),
    "double-struck": (0x1D538, 0x1D552, 0x1D7D8),
    "bold-fraktur": (0x1D56C, 0x1D586, None),
    "sans-serif": (0x1D5A0, 0x1D5BA, 0x1D7E2),
    "bold-sans-serif": (0x1D5D4, 0x1D5EE, 0x1D7EC),
    "sans-serif-italic": (0x1D608, 0x1D622, None),
    "monospace": (0x1D670, 0x1D68A, 0x1D7F6),
}
LETTERLIKE = {
    "italic": {"h": "\u210e"},
    "script": dict(zip("BEFHILMRego", "\u212c\u2130\u2131\u210b\u2110\u2112\u2133\u211b\u212f\u210a\u2134")),
    "fraktur": dict(zip("CHIRZ", "\u212d\u210c\u2111\u211c\u2128")),
    "double-struck": dict(zip("CHNPQRZ", "\u2102\u210d\u2115\u2119\u211a\u211d\u2124")),
}
# Children that a MathML layout element needs (latex2mathml writes fewer for, e.g., "\\frac{a}").
ARITY = {"mfrac": 2, "msub": 2, "msup": 2, "msubsup": 3, "mover": 2, "munder": 2, "munderover": 3, "mroot": 2}
MO = f"{{{MATHML}}}mo"
NAME_TOKENS = {f"{{{MATHML}}}mi", MO}
SCRIPTED = {f"{{{MATHML}}}{tag}" for tag in ("msub", "msup", "msubsup", "munder", "mover", "munderover")}
OPERATOR_NAME = re.compile(r"[A-Za-z]{2,}")
OPENING = set("([{|\u2016\u27e8\u230a\u2308")
CLOSING = set(")]}|\u2016\u27e9\u230b\u2309!")
SIGNS = {"-", "+", "\u2212", "\u00b1", "\u2213"}
TOKENS = {f"{{{MATHML}}}{tag}" for tag in ("mi", "mn", "mo")}


class UnsupportedTeX(ValueError):
    """A formula that latex2mathml cannot render faithfully."""


def tex_to_mathml(tex: str, display: bool = False) -> str:
    """The ``<math>`` element of one formula (TeX without its delimiters)."""
    source = tex
    for name, (begin, end) in ENVIRONMENTS.items():
        source = source.replace(f"\\begin{{{name}}}", begin).replace(f"\\end{{{name}}}", end)
    try:
        markup = convert(source.strip(), display="block" if display else "inline")
    except Exception as error:  # latex2mathml raises its own exception types, and IndexError etc.
        raise UnsupportedTeX(f"latex2mathml: {type(error).__name__} {error}".strip()) from error
    try:
        root = ElementTree.fromstring(markup)
    except ElementTree.ParseError as error:
        raise UnsupportedTeX(f"latex2mathml wrote malformed MathML ({error})") from error
    for element in root.iter():
        tag = element.tag.removeprefix(f"{{{MATHML}}}")
        if tag == "merror":
            raise UnsupportedTeX("latex2mathml reported an error")
        if tag in ARITY and len(element) != ARITY[tag]:
            raise UnsupportedTeX(f"<{tag}> with {len(element)} arguments instead of {ARITY[tag]}")
        if tag == "mtext" and element.text:
            element.text = TEXT_ESCAPE.sub(r"\1", element.text)
        if tag == "mo" and element.text and convert_symbol(element.text.strip()):
            # A delimiter named by a macro after \bigl and the like, which latex2mathml leaves as it is.
            element.text = chr(int(convert_symbol(element.text.strip()), 16))
        if element.text and "\\" in element.text:
            raise UnsupportedTeX(f"latex2mathml does not know {element.text.strip()!r}")
        if tag == "mspace" and element.get("width") in NAMED_SPACES:
            element.set("width", NAMED_SPACES[element.get("width")])
        variant = element.get("mathvariant")
        if element.tag in TOKENS and variant in ALPHANUMERICS and element.text:
            text = _alphanumerics(element.text, variant)
            if text is not None:
                element.text = text
                del element.attrib["mathvariant"]
    _space_operator_names(root)
    _mark_unary_signs(root)
    return ElementTree.tostring(root, encoding="unicode")


def _mark_unary_signs(root: ElementTree.Element) -> None:
    """A sign that starts a row or follows an opening bracket, a comma or a relation (``(-A r``,
    ``= -x``) is unary: as TeX does, no space around it (MathML Core spaces an infix sign)."""
    for parent in root.iter():
        previous = None
        for child in parent:
            if child.tag == MO and (child.text or "").strip() in SIGNS and "form" not in child.attrib:
                if previous is None or (previous.tag == MO and (previous.text or "").strip() not in CLOSING):
                    child.set("form", "prefix")
            previous = child


def _space_operator_names(root: ElementTree.Element) -> None:
    """TeX's spacing around operator names (\\log, \\max, \\operatorname{...}): a thin space on
    each side, none before an opening bracket or after an operator. latex2mathml writes some as
    <mo>, which MathML Core spaces as an unknown operator (a thick space on each side), so they
    become <mi> (upright, being several letters), with explicit spaces."""
    for parent in list(root.iter()):
        if parent.tag in SCRIPTED:  # its first child is a base, spaced as the whole element
            continue
        children = list(parent)
        for index in reversed(range(len(children))):
            unit = children[index]
            token = unit[0] if unit.tag in SCRIPTED and len(unit) else unit
            if token.tag not in NAME_TOKENS or not OPERATOR_NAME.fullmatch(token.text or ""):
                continue
            token.tag = f"{{{MATHML}}}mi"
            token.attrib.clear()
            after = children[index + 1] if index + 1 < len(children) else None
            before = children[index - 1] if index > 0 else None
            if after is not None and not (after.tag == MO and (after.text or "").strip() in OPENING):
                parent.insert(index + 1, ElementTree.Element(f"{{{MATHML}}}mspace", width="0.1667em"))
            if before is not None and before.tag != MO:
                parent.insert(index, ElementTree.Element(f"{{{MATHML}}}mspace", width="0.1667em"))


def _alphanumerics(text: str, variant: str) -> str | None:
    """``text`` in the Unicode mathematical alphabet ``variant``; None if a character has none."""
    upper, lower, digits = ALPHANUMERICS[variant]
    exceptions = LETTERLIKE.get(variant, {})
    out = []
    for char in text:
        if char in exceptions:
            out.append(exceptions[char])
        elif "A" <= char <= "Z":
            out.append(chr(upper + ord(char) - ord("A")))
        elif "a" <= char <= "z":
            out.append(chr(lower + ord(char) - ord("a")))
        elif "0" <= char <= "9" and digits is not None:
            out.append(chr(digits + ord(char) - ord("0")))
        else:
            return None
    return "".join(out)


def render_math(content: str, where: str) -> str:
    """``content`` (a page's HTML) with each arithmatex formula replaced by its MathML."""
    failures = []

    def replace(match: re.Match) -> str:
        tag, escaped = match.groups()
        tex = html.unescape(escaped).strip()
        opening, closing = DELIMITERS[tag]
        if tex.startswith(opening) and tex.endswith(closing):
            tex = tex[len(opening) : -len(closing)]
        try:
            mathml = tex_to_mathml(tex, display=tag == "div")
        except UnsupportedTeX as error:
            failures.append(f"  {tex!r}: {error}")
            return match.group()
        return f'<div class="math-display">{mathml}</div>' if tag == "div" else mathml

    content = ARITHMATEX.sub(replace, content)
    if failures:
        raise PluginError(f"{where}: formulas that cannot be rendered to MathML:\n" + "\n".join(failures))
    if 'class="arithmatex"' in content:
        raise PluginError(f"{where}: arithmatex markup the MathML hook did not recognise")
    return content


def on_page_content(html: str, page, **kwargs) -> str:
    return render_math(html, page.file.src_uri)
