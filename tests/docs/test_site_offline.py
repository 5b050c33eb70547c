"""The built site reads offline: it loads no script, stylesheet, font or image from elsewhere, and
every formula is MathML rendered at build time (docs_build/mathml.py), in the pages and in the
search index alike; no raw TeX is left."""

from __future__ import annotations

import importlib.util
import json
import re
from html.parser import HTMLParser
from pathlib import Path

import pytest
from mkdocs.exceptions import PluginError

ROOT = Path(__file__).parents[2]

# Link relations that make the browser fetch their href.
FETCHING_RELS = {
    "stylesheet",
    "preload",
    "prefetch",
    "preconnect",
    "dns-prefetch",
    "modulepreload",
    "icon",
    "manifest",
}
EXTERNAL = re.compile(r"^\s*(https?:)?//", re.I)
CSS_URL = re.compile(r"""@import\s+(?:url\()?\s*['"]?([^'")\s;]+)|url\(\s*['"]?([^'")\s]+)""", re.I)
# TeX that a reader must never see: math delimiters, arithmatex's markup, macros in running text.
RAW_TEX = re.compile(
    r"\\\(|\\\)|\\\[|\\\]|\$\$|arithmatex|\\(?:frac|mathrm|operatorname|text|left|right|big)\b"
)
CODE = re.compile(r"<(pre|code|script|style)\b.*?</\1>", re.S | re.I)
# Formulas on a few pages (at least; the pages held 7, 22, 134 and 63 when this test was written).
FORMULAS = {
    "index.html": 7,
    "concepts/index.html": 20,
    "reference/clipping/index.html": 120,
    "papers/index.html": 60,
}


class Resources(HTMLParser):
    """The URLs a page makes the browser fetch by itself (links a reader clicks are left out)."""

    def __init__(self) -> None:
        super().__init__()
        self.urls: list[str] = []
        self._in_style = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        attributes = {name: value or "" for name, value in attrs}
        if tag == "link" and FETCHING_RELS & set(attributes.get("rel", "").lower().split()):
            self.urls.append(attributes.get("href", ""))
        if tag in {"script", "img", "iframe", "source", "audio", "video", "embed", "track", "input"}:
            self.urls.append(attributes.get("src", ""))
        if tag in {"img", "source"} and attributes.get("srcset"):
            self.urls += [part.split()[0] for part in attributes["srcset"].split(",") if part.strip()]
        if tag in {"object"}:
            self.urls.append(attributes.get("data", ""))
        if tag == "video":
            self.urls.append(attributes.get("poster", ""))
        self.urls += _css_urls(attributes.get("style", ""))
        self._in_style = tag == "style"

    def handle_endtag(self, tag: str) -> None:
        self._in_style = False

    def handle_data(self, data: str) -> None:
        if self._in_style:
            self.urls += _css_urls(data)


def _css_urls(css: str) -> list[str]:
    return [a or b for a, b in CSS_URL.findall(css)]


def _pages(site: Path) -> list[Path]:
    pages = sorted(site.rglob("*.html"))
    assert len(pages) > 20, "the site has lost its pages"
    return pages


def external_resources(site: Path) -> list[str]:
    """Each URL elsewhere that a page of ``site``, or a stylesheet of it, makes the browser fetch."""
    found = []
    for page in _pages(site):
        parser = Resources()
        parser.feed(page.read_text(encoding="utf-8"))
        found += [f"{page.relative_to(site)}: {url}" for url in parser.urls if EXTERNAL.match(url)]
    for stylesheet in sorted(site.rglob("*.css")):
        urls = _css_urls(stylesheet.read_text(encoding="utf-8"))
        found += [f"{stylesheet.relative_to(site)}: {url}" for url in urls if EXTERNAL.match(url)]
    return found


def raw_tex(site: Path) -> list[str]:
    """Each piece of TeX left in the pages of ``site`` outside code blocks, code and scripts."""
    found = []
    for page in _pages(site):
        text = CODE.sub("", page.read_text(encoding="utf-8"))
        found += [
            f"{page.relative_to(site)}: {text[max(m.start() - 40, 0) : m.end() + 40]!r}"
            for m in RAW_TEX.finditer(text)
        ]
    return found


def raw_tex_in_search_index(site: Path) -> list[str]:
    """Each piece of TeX in the search index of ``site`` (titles and texts), outside code."""
    entries = json.loads((site / "search" / "search_index.json").read_text(encoding="utf-8"))["docs"]
    assert len(entries) > 100, "the search index has lost its entries"
    found = []
    for entry in entries:
        for field in ("title", "text"):
            text = CODE.sub("", entry.get(field, ""))
            found += [
                f"{entry['location']}: {text[max(m.start() - 40, 0) : m.end() + 40]!r}"
                for m in RAW_TEX.finditer(text)
            ]
    return found


def formula_count(site: Path, page: str) -> int:
    return len(re.findall(r"<math\b", (site / page).read_text(encoding="utf-8")))


def test_the_site_loads_nothing_from_elsewhere(built_site):
    assert external_resources(built_site) == []


def test_no_page_shows_raw_tex(built_site):
    assert raw_tex(built_site) == []


@pytest.mark.parametrize("page", sorted(FORMULAS))
def test_the_formulas_are_mathml(built_site, page):
    assert formula_count(built_site, page) >= FORMULAS[page]


def test_display_formulas_are_blocks_that_scroll_on_their_own(built_site):
    clipping = (built_site / "reference" / "clipping" / "index.html").read_text(encoding="utf-8")
    displays = re.findall(r'<div class="math-display"><math [^>]*display="block"', clipping)
    assert len(displays) >= 10
    css = (built_site / "stylesheets" / "extra.css").read_text(encoding="utf-8")
    assert re.search(r"\.math-display\s*\{[^}]*overflow-x:\s*auto", css)


def test_the_search_index_holds_no_raw_tex(built_site):
    assert raw_tex_in_search_index(built_site) == []


# The hook on its own: what it renders, and what it refuses.


def _hook():
    spec = importlib.util.spec_from_file_location(
        "rlstab_docs_mathml_hook", ROOT / "docs_build" / "mathml.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(
    "tex",
    [
        r"\operatorname{sg}(x) + \operatorname{mean}_g R",
        r"\text{keep iff } \texttt{normalize\_std: false}",
        r"\mathrm{clip}(r, 1 - \epsilon, 1 + \epsilon)",
        r"\mathbb{1}[x > 0] \cdot \mathbb{E}[X]",
        r"\lvert x \rvert + \lVert y \rVert + \bigl\| z \bigr\|",
        r"\left( \frac{a}{b} \right) \big( x \big) \Bigl[ y \Bigr]",
        r"\min(a, b) \max_x f(x) \log\pi_\theta \exp\!\Bigl(-\dfrac{x^2}{2}\Bigr)",
        r"\hat{A}_t \tilde{x} \bar{R} \overline{\log\pi} \tfrac{1}{2} \sqrt{n} \binom{n}{k}",
        r"\tau = \begin{cases} \tau_{pos} & A > 0\\ \tau_{neg} & A \le 0 \end{cases}",
        r"\begin{aligned} a &= b + c \\ d &= e \end{aligned}",
        r"\sum_{i=1}^{n} x_i \prod_t r_t \lfloor x \rfloor \lceil y \rceil \mathcal{L}",
    ],
)
def test_the_hook_renders_the_macros_the_docs_use(tex):
    mathml = _hook().tex_to_mathml(tex, display=True)
    assert mathml.startswith('<math xmlns="http://www.w3.org/1998/Math/MathML" display="block">')
    assert "\\" not in mathml and 'mathvariant="double-struck"' not in mathml


def test_the_hook_replaces_arithmatex_markup():
    page = (
        '<p>with <span class="arithmatex">\\(p &lt; 0.002\\)</span>:</p>\n'
        '<div class="arithmatex">\\[l = -A\\,\\mathrm{clip}(r)\\]</div>'
    )
    html = _hook().render_math(page, "page.md")
    assert "arithmatex" not in html and "\\(" not in html and "\\[" not in html
    assert re.search(r'<p>with <math [^>]*display="inline">.*<mo>&lt;</mo>.*</math>:</p>', html)
    assert re.search(r'<div class="math-display"><math [^>]*display="block">.*</math></div>$', html)


@pytest.mark.parametrize("tex", [r"\unknownmacro{x} + y", r"x^", r"\begin{cases} a & b", r"\frac{a}"])
def test_a_formula_the_hook_cannot_render_fails_the_build_naming_page_and_formula(tex):
    page = (
        f'<p>ok <span class="arithmatex">\\(x\\)</span> bad <span class="arithmatex">\\({tex}\\)</span></p>'
    )
    with pytest.raises(PluginError) as error:
        _hook().render_math(page, "reference/clipping.md")
    message = str(error.value)
    assert message.startswith("reference/clipping.md: ") and repr(tex) in message
