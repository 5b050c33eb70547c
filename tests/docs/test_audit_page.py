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
