"""docs/audit.md's SmolLM2 mechanism numbers are those of the stored audit (docs/audits/smollm2-mechanism.json)."""

import json
from pathlib import Path

ROOT = Path(__file__).parents[2]
PROSE = " ".join((ROOT / "docs" / "audit.md").read_text().split())
AUDIT = json.loads((ROOT / "docs" / "audits" / "smollm2-mechanism.json").read_text())


def test_the_sample_line_is_the_stored_audits():
    a = AUDIT
    assert (a["model"], a["task"], a["prompts"], a["group_size"], a["seed"]) == ("smollm2", "add1", 128, 8, 0)
    assert (f"{a['responses']:,} responses ({a['prompts']} prompts x {a['group_size']}) on `add1`, "
            f"{a['tokens']:,} response tokens, {a['mixed_groups']} of {a['prompts']} groups with mixed rewards") in PROSE


def test_the_mechanism_table_and_prose_are_the_stored_audits():
    stapo, shadow = AUDIT["objectives"]
    low, high = stapo["mechanism"]["masks"]["s2t"], shadow["mechanism"]["masks"]["shadow/s2t_1"]
    assert shadow["mechanism"]["masks"]["shadow/s2t_0"] == low  # the same mask, acting or shadow, on the same sample
    tokens = AUDIT["tokens"]
    for name, m in (("S2T, `tau_p` 0.002 (stapo's)", low), ("S2T, `tau_p` 0.02 (a shadow mask)", high)):
        row = f"| {name} | {m['silenced']} ({100 * m['silenced'] / tokens:.2g}%) | {m['share']:.3f} | {m['cosine']:.3f} |"
        assert row in PROSE, row
    assert f"2 tokens of {tokens:,} carry {100 * low['share']:.0f}% of the norm" in PROSE
    assert f"(cosine {low['cosine']:.2f})" in PROSE and f"carry {100 * high['share']:.0f}%" in PROSE
    spearman = stapo["mechanism"]["logit_grad"]["spearman"]
    assert f"(Spearman {spearman['direction_vs_probability']:.2f})".replace("-", "−") in PROSE
    assert f"entropy (+{spearman['direction_vs_entropy']:.2f})" in PROSE
    assert (f"correlations are {spearman['norm_vs_probability']:.2f} and "
            f"+{spearman['norm_vs_entropy']:.2f}").replace("-", "−") in PROSE


def test_the_silenced_tokens_are_named_as_what_they_are():
    """Issue 39: the two tokens S2T silences on SmolLM2 are trailing whitespace before ``<|im_end|>``."""
    (s2t,) = AUDIT["objectives"][0]["masks"]
    found = [(e["context"], e["text"], e["position"]) for e in s2t["examples"]]
    # each response is a one-digit answer, the silenced whitespace, then the end of the turn
    assert found == [("2⟦␣⟧<|im_end|>", "␣", 1), ("9⟦␣\\n⟧<|im_end|>", "␣\\n", 1)]
    assert all(e["advantage"] > 0 for e in s2t["examples"])  # rewarded responses
    assert len(found) == s2t["silenced"] == 2
    assert ("The two are trailing whitespace, each the last token of a rewarded one-digit answer before "
            "`<|im_end|>`: a space (`␣`) after `2` and a space with a newline (`␣\\n`) after `9`.") in PROSE
    assert "no null distribution" in PROSE and "no count-matched random tokens were drawn" in PROSE


def test_the_entropy_correlation_is_read_with_its_sign():
    """The paper: the gradient magnitude falls with the entropy. Here it rises (both correlations positive)."""
    spearman = AUDIT["objectives"][0]["mechanism"]["logit_grad"]["spearman"]
    assert spearman["direction_vs_probability"] < 0 and spearman["norm_vs_probability"] < 0  # as the paper claims
    assert spearman["direction_vs_entropy"] > 0 and spearman["norm_vs_entropy"] > 0  # the opposite of its claim
    assert "The first claim shows" not in PROSE and "the paper's second claim shows" not in PROSE
    assert (f"rises with the entropy (+{spearman['direction_vs_entropy']:.2f}), the opposite sign. Weighted by the "
            f"tokens' coefficients (their advantages) the correlations are "
            f"{spearman['norm_vs_probability']:.2f} and +{spearman['norm_vs_entropy']:.2f}: the same signs. "
            "So on this batch the probability half of the claim holds and the entropy half does not.").replace("-", "−") in PROSE
