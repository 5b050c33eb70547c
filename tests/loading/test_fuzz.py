"""Fuzzing the objective-file boundary: whatever the text, ``rlstab.load`` returns an Objective or raises a clean ConfigError.

Three campaigns (hypothesis; ``pytest --fuzz-long`` runs 25 times as many examples):

- **hostile documents**: objective files whose values are hostile scalars, and YAML built from a
  grammar of what breaks loaders (block and flow
  collections nested past the limit, anchors and aliases incl. forward, recursive and exponential
  ones, tags, directives, several documents, complex, duplicate, merge and non-text keys,
  YAML 1.1 scalars, huge integers, control characters, bidi overrides, lone surrogates, objective
  fields with wrong values, ``extends:`` to presets and to nothing);
- **mutated presets**: each preset's text with random edits (characters inserted, deleted,
  swapped, lines duplicated, hostile scalars spliced in at random places);
- **Python mappings**: nested dicts, lists, tuples, sets, bytes, NaN, huge integers and non-text
  keys handed to ``rlstab.load`` directly.

The property, for every input: no other exception escapes; a ConfigError's text is at most
``MAX_SHOWN + 1`` lines, each starting with the source, printable (no control character reaches a
terminal) and at most ``MAX_LINE`` characters after it; and a loaded objective survives
``to_yaml`` and back unchanged.
"""

from __future__ import annotations

import math

from hypothesis import event, given
from hypothesis import strategies as st

import rlstab
from rlstab import ConfigError
from rlstab.errors import MAX_LINE, MAX_SHOWN
from rlstab.presets import preset_path

from fuzzing import fuzz_settings

PRESET_TEXTS = {name: preset_path(name).read_text() for name in rlstab.preset_names()}

HOSTILE_SCALARS = [
    "1:20", "yes", "No", "on", "OFF", "y", "1_000", "0b101", "0o17", "0x1F", "010", "-007", "1e-6", "1e999", "-1e999",
    ".inf", "-.inf", ".nan", "~", "null", "", "true", "9" * 30, "-" + "9" * 25, "0x" + "f" * 40, "1" * 5000,
    "2001-12-14", "'quoted'", '"\\e[31mred\\a"', '"\\x00\\x1b\\u202e"', '"\\ud800"', '"a\\nb"', "café", "\u202eevil",
    "|\n  block\n", ">\n  folded\n", "&a x", "*a", "*undefined", "!!python/object/apply:os.system ['id']",
    "!!str 3", "!custom x", "! x", "[1, 2", "{a: 1", "a: b: c", "- x", "? x", "@", "`", "%", "\t", "0.5", "1.5",
    "0.0", "-1", "2", "256", "1e38", "kept", "valid", "s2t", "token-mean", "grpo", "stapo", "icepop", "linear",
]
FIELDS = [
    "name", "description", "advantage", "masks", "reweighters", "surrogate", "aggregation", "regularisers",
    "reward_shaping", "group_filter", "lr_scale", "log_ratio_clamp", "quantile_mode", "extends", "kind", "count",
    "tau_p", "entropy_quantile", "eps_low", "eps_high", "dual_clip", "coef", "keep", "top_p", "adaptive", "w",
    "target", "<<", "'<<'", "? [a, b]", "? {kind: s2t}", "1", "null", "true", '"a\\nb"', '"\\e[2J"', "k" * 300,
]
KINDS = ["s2t", "entropy_quantile", "expression", "ppo_clip", "token-mean", "grpo", "stare", "bapo", "kl", "nope", "", "1"]
PRESETS = list(rlstab.preset_names()) + ["no-such-preset", "missing.yaml", "../x.yml", "a\0b.yaml", "x" * 300 + ".yaml"]


# What a ConfigError is about, for ``pytest --hypothesis-show-statistics`` (the first that its first problem mentions).
OUTCOMES = [
    "malformed YAML", "the limit on", "YAML tag", "duplicate key", "is not text", "merge keys", "leading zero",
    "out of range", "alias", "a second YAML document", "mapping key that is a list", "not UTF", "is text in YAML 1.2",
    "extends", "unknown field", "unknown kind", "required field", "'kind' field is required", "expected a mapping",
    "is empty", "Input should", "Value error",
]


def check(source, label_start: str | None = None) -> None:
    """Load ``source``: an Objective that round-trips through YAML, or a ConfigError that is safe to print."""
    try:
        objective = rlstab.load(source)
    except ConfigError as err:
        event("ConfigError: " + next((o for o in OUTCOMES if o in err.problems[0]), "other"))
        lines = str(err).splitlines()
        assert 1 <= len(lines) <= MAX_SHOWN + 1, lines
        assert len(err.problems) >= len(lines) - 1
        for line in lines:
            assert line.startswith(err.source + ": "), (line, err.source)
            assert line.isprintable(), repr(line)
            assert len(line) <= len(err.source) + 2 + MAX_LINE, len(line)
        if label_start is not None:
            assert err.source.startswith(label_start) or err.source.startswith("preset "), err.source
        return
    event("loaded")
    assert isinstance(objective, rlstab.Objective)
    assert rlstab.load(objective.to_yaml()) == objective


# ----------------------------------------------------------------------------- hostile documents


def scalars() -> st.SearchStrategy[str]:
    return st.one_of(
        st.sampled_from(HOSTILE_SCALARS),
        st.sampled_from(KINDS),
        st.text(st.characters(codec="utf-8"), max_size=12).map(lambda s: s.replace("\n", " ")),
        st.floats(allow_nan=True, allow_infinity=True).map(repr),
        st.integers(-(2**70), 2**70).map(str),
    )


def keys() -> st.SearchStrategy[str]:
    return st.one_of(st.sampled_from(FIELDS), st.text("abcxyz_-<>?&*!:", min_size=1, max_size=6))


@st.composite
def flow(draw, depth: int = 0) -> str:
    """A flow value: scalar, ``[...]``, ``{...}``, maybe anchored, maybe an alias."""
    choice = draw(st.integers(0, 9 if depth < 3 else 3))
    anchor = f"&{draw(st.sampled_from('abc'))} " if draw(st.integers(0, 7)) == 0 else ""
    if choice <= 2:
        value = draw(scalars())
    elif choice == 3:
        value = f"*{draw(st.sampled_from('abcz'))}"  # defined before, later, never, or around this value
        anchor = ""
    elif choice <= 6:
        items = draw(st.lists(flow(depth + 1), max_size=3))
        value = "[" + ", ".join(items) + "]"
    else:
        pairs = draw(st.lists(st.tuples(keys(), flow(depth + 1)), max_size=3))
        value = "{" + ", ".join(f"{k}: {v}" for k, v in pairs) + "}"
    return anchor + value


@st.composite
def block(draw, indent: int = 0, depth: int = 0) -> str:
    """A block mapping of objective-like fields at ``indent`` spaces."""
    pad = " " * indent
    lines = []
    for _ in range(draw(st.integers(1, 4))):
        key = draw(keys())
        form = draw(st.integers(0, 6 if depth < 2 else 2))
        if form <= 2:
            lines.append(f"{pad}{key}: {draw(flow())}")
        elif form == 3:
            lines.append(f"{pad}{key}:\n{draw(block(indent + 2, depth + 1))}")
        elif form == 4:
            items = draw(st.lists(block(indent + 4, depth + 1), min_size=1, max_size=2))
            lines.append(f"{pad}{key}:\n" + "\n".join(f"{pad}  - " + item.lstrip() for item in items))
        elif form == 5:
            lines.append(f"{pad}{key}: {'[' * draw(st.integers(30, 60))}")  # deep, unterminated (test_limits goes deeper)
        else:
            lines.append(f"{pad}{key}: &{draw(st.sampled_from('abc'))} [" + ", ".join(["*b"] * 10) + "]")
    return "\n".join(lines)


COMPONENTS = {
    "advantage": ["{kind: grpo, normalize_std: %s}", "{kind: rloo}", "{kind: %s}"],
    "masks": ["[{kind: s2t, tau_p: %s}]", "[{kind: entropy_quantile, rho: %s}]", "[{kind: expression, keep: '%s'}]", "%s"],
    "reweighters": ["[{kind: stare, adaptive: %s}]", "[{kind: tis, cap: %s}]", "[%s]"],
    "surrogate": ["{kind: ppo_clip, eps_high: %s}", "{kind: bapo, target: %s}", "{kind: sapo, tau_pos: %s}"],
    "aggregation": ["{kind: token-mean, count: %s}", "{kind: %s, count: kept}"],
    "regularisers": ["[{kind: kl, coef: %s}]", "[{kind: entropy_bonus, coef: %s}]"],
    "log_ratio_clamp": ["%s"],
    "quantile_mode": ["%s"],
    "name": ["%s"],
}
PLAUSIBLE = ["0.5", "0.2", "0.002", "1e-3", "1.5", "2.0", "true", "false", "kept", "valid", "exact", "histogram", "grpo"]
EXPRESSIONS = ["entropy < 0.5", "probability != 1", "log(ratio) > quantile(entropy, 0.8)", "x <", "__import__('os')"]


@st.composite
def objective_like(draw) -> str:
    """A well-formed objective file whose values are drawn from hostile scalars: the fields' own checks answer."""
    lines = [f"extends: {draw(st.sampled_from(PRESETS[:24]))}"]
    for field in draw(st.lists(st.sampled_from(sorted(COMPONENTS)), min_size=1, max_size=4, unique=True)):
        template = draw(st.sampled_from(COMPONENTS[field]))
        value = draw(st.one_of(*map(st.sampled_from, (PLAUSIBLE, PLAUSIBLE, HOSTILE_SCALARS, EXPRESSIONS, KINDS))))
        if "'%s'" in template:
            value = value.replace("'", "''")
        lines.append(f"{field}: {template.replace('%s', value)}")
    return "\n".join(lines) + "\n"


@st.composite
def documents(draw) -> str:
    if draw(st.booleans()):
        return draw(objective_like())
    parts = []
    if draw(st.booleans()):
        parts.append(f"extends: {draw(st.sampled_from(PRESETS))}")
    if draw(st.integers(0, 9)) == 0:
        parts.insert(0, draw(st.sampled_from(["%YAML 1.1\n---", "%TAG ! tag:evil,2000:\n---", "---", "--- !!map"])))
    parts.append(draw(block()))
    if draw(st.integers(0, 9)) == 0:
        parts.append(draw(st.sampled_from(["---\nextends: dapo", "...", "--- |\n  text"])))
    text = "\n".join(parts) + "\n"
    if draw(st.integers(0, 4)) == 0:  # a stray character anywhere
        at = draw(st.integers(0, len(text)))
        text = text[:at] + draw(st.sampled_from(["\x00", "\x1b", "\t", "\ufeff", "\ud800", ":", "\n  ", "'", "#"])) + text[at:]
    return text


@fuzz_settings(max_examples=400)
@given(text=documents())
def test_hostile_documents_load_or_fail_cleanly(text):
    check(text)


# ----------------------------------------------------------------------------- mutated presets


@st.composite
def mutated_presets(draw) -> str:
    text = PRESET_TEXTS[draw(st.sampled_from(sorted(PRESET_TEXTS)))]
    for _ in range(draw(st.integers(1, 4))):
        op = draw(st.integers(0, 5))
        at = draw(st.integers(0, len(text)))
        if op == 0:  # insert characters
            text = text[:at] + draw(st.text(st.characters(codec="utf-8"), min_size=1, max_size=4)) + text[at:]
        elif op == 1:  # delete a span
            text = text[:at] + text[at + draw(st.integers(1, 20)) :]
        elif op == 2:  # splice in a hostile scalar
            text = text[:at] + draw(st.sampled_from(HOSTILE_SCALARS)) + text[at:]
        elif op == 3:  # duplicate a line
            lines = text.splitlines(keepends=True) or [""]
            i = draw(st.integers(0, len(lines) - 1))
            text = "".join(lines[: i + 1] + lines[i:])
        elif op == 4:  # swap two lines
            lines = text.splitlines(keepends=True)
            if len(lines) > 1:
                i, j = draw(st.integers(0, len(lines) - 1)), draw(st.integers(0, len(lines) - 1))
                lines[i], lines[j] = lines[j], lines[i]
                text = "".join(lines)
        else:  # replace a value after a colon
            colon = text.find(": ", at)
            if colon >= 0:
                end = text.find("\n", colon)
                end = len(text) if end < 0 else end
                text = text[: colon + 2] + draw(st.sampled_from(HOSTILE_SCALARS)) + text[end:]
    return text


@fuzz_settings(max_examples=400)
@given(text=mutated_presets())
def test_mutated_presets_load_or_fail_cleanly(text):
    check(text)


@fuzz_settings(max_examples=60)
@given(text=mutated_presets(), encoding=st.sampled_from(["utf-8", "utf-16", "utf-32", "latin-1", "cp1252"]))
def test_mutated_preset_files_in_any_encoding_load_or_fail_cleanly(tmp_path_factory, text, encoding):
    path = tmp_path_factory.mktemp("fuzz") / "objective.yaml"
    try:
        path.write_bytes(text.encode(encoding, errors="surrogatepass"))
    except UnicodeEncodeError:
        return  # a character this encoding cannot hold: not a file anyone could write
    check(path, label_start=str(path.parent))


# ----------------------------------------------------------------------------- python mappings

leaves = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**80), 2**80), st.floats(allow_nan=True), st.sampled_from(HOSTILE_SCALARS),
    st.sampled_from(KINDS), st.binary(max_size=4), st.just(math.inf), st.just(()),
)
plain = st.recursive(
    leaves,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.tuples(inner, inner),
        st.frozensets(st.integers(0, 3), max_size=3),
        st.dictionaries(st.one_of(st.sampled_from(FIELDS), st.sampled_from(FIELDS), st.integers(0, 3), st.none()), inner, max_size=5),
    ),
    max_leaves=25,
)


@fuzz_settings(max_examples=300)
@given(data=st.dictionaries(st.sampled_from(FIELDS[:17]), plain, max_size=8), base=st.sampled_from([None, *PRESETS[:6]]))
def test_python_mappings_load_or_fail_cleanly(data, base):
    if base is not None:
        data = {"extends": base, **data}
    check(data, label_start="<dict>")
