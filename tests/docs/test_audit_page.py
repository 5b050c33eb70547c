"""docs/audit.md's numbers are those of the stored audits: the SmolLM2 mechanism (docs/audits/smollm2-mechanism.json, one
batch; smollm2-mechanism-along.json, along training) and the counterfactual audits (docs/audits/counterfactual-*.json)."""

import json
import math
from pathlib import Path

import pytest

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


# ----------------------------------------------------------------------------- the counterfactual audit

PAGE = (ROOT / "docs" / "audit.md").read_text()
COUNTERFACTUAL = json.loads((ROOT / "docs" / "audits" / "counterfactual-tiny.json").read_text())
AT_PAPERS_THRESHOLD = json.loads((ROOT / "docs" / "audits" / "counterfactual-tiny-stapo.json").read_text())
MEASURES = ("entropy_change", "batch_entropy_change", "kl", "update_norm", "update_angle", "reward_change")


def two_sided_p(x0: float, null: list[float]) -> float:
    """(1 + #{k: |x_k - c| >= |x_0 - c|}) / (K + 1), c the median of the K + 1 values (recomputed here)."""
    values = sorted([x0, *null])
    n = len(values)
    c = values[n // 2] if n % 2 else (values[n // 2 - 1] + values[n // 2]) / 2
    return (1 + sum(abs(x - c) >= abs(x0 - c) for x in null)) / (len(null) + 1)


def fisher_p(ps: list[float]) -> float:
    """P(chi2 with 2S degrees of freedom >= -2 sum ln p) = exp(-X/2) sum_{i<S} (X/2)^i / i!."""
    half = -sum(math.log(p) for p in ps)
    return math.exp(-half) * sum(half**i / math.factorial(i) for i in range(len(ps)))


def in_page(text: str) -> bool:
    return " ".join(text.split()) in PROSE


def test_the_counterfactual_p_values_ranks_and_combination_are_those_of_the_stored_nulls():
    states = COUNTERFACTUAL["states"]
    assert len(states) == 8 and all(s["tests"] is not None for s in states)
    for s in states:
        assert s["null_draws"] == 50 and s["restore_check"] == 0.0
        for arm in ("mask", "probability_only"):
            for m in MEASURES:
                x0, null = s["arms"][arm][m], s["null"][m]
                assert len(null) == 50
                assert s["tests"][arm][m]["p"] == two_sided_p(x0, null)
                assert s["tests"][arm][m]["rank"] == 1 + sum(x < x0 for x in null) + sum(x == x0 for x in null) / 2
    for arm in ("mask", "probability_only"):
        ps = {m: fisher_p([s["tests"][arm][m]["p"] for s in states]) for m in MEASURES}
        ordered = sorted(MEASURES, key=ps.get)
        holm, running = {}, 0.0
        for i, m in enumerate(ordered):  # Holm's step-down over the six measures
            running = max(running, min(1.0, (len(MEASURES) - i) * ps[m]))
            holm[m] = running
        for m in MEASURES:
            combined = COUNTERFACTUAL["combined"][arm][m]
            assert combined["p"] == pytest.approx(ps[m], rel=1e-9) and combined["p_holm"] == pytest.approx(holm[m], rel=1e-9)
            medians = [s["tests"][arm][m]["null_median"] for s in states]
            assert combined["above_null_median"] == sum(s["arms"][arm][m] > c for s, c in zip(states, medians))
            assert combined["below_null_median"] == sum(s["arms"][arm][m] < c for s, c in zip(states, medians))
    assert all(s["restore_check"] == 0.0 for s in AT_PAPERS_THRESHOLD["states"])


def test_the_counterfactual_tables_are_the_stored_audits():
    from rlstab.demo.counterfactual_report import (
        combined_table,
        first_order_line,
        first_order_table,
        measure_table,
        states_table,
        tokens_line,
    )

    for table in (states_table(COUNTERFACTUAL), tokens_line(COUNTERFACTUAL), combined_table(COUNTERFACTUAL),
                  measure_table(COUNTERFACTUAL, "entropy_change"), measure_table(COUNTERFACTUAL, "update_angle"),
                  first_order_table(COUNTERFACTUAL), first_order_line(COUNTERFACTUAL)):
        assert in_page(table), table.splitlines()[0]


def test_the_counterfactual_prose_is_the_stored_audits():
    cf, states = COUNTERFACTUAL, COUNTERFACTUAL["states"]
    s = cf["settings"]
    assert (s["prompts"], s["group_size"], s["temperature"], s["null_draws"]) == (64, 8, 1.0, 50)
    assert {x["held_out_problems"] for x in states} == {98} and "`perm3`'s 98 held-out problems" in PROSE
    runs = cf["source"]["runs"]
    assert [(r["seed"], r["regime"], r["objective"], r["steps"]) for r in runs] == [
        (seed, "collapse", "dapo", [5, 10, 15, 20]) for seed in (0, 1)]
    assert "seeds 0 and 1, 20 steps, checkpoints kept every 5 steps: 8 states" in PROSE
    from rlstab.lab.regimes import load_regime

    collapse = load_regime("collapse")
    assert {x["lr"] for x in states} == {collapse.lr} == {3e-4} and collapse.updates_per_step == 4
    assert "(`perm3`, Adam 3e-4, four updates per rollout batch)" in PROSE
    assert {round(x["tokens"] / x["responses"]) for x in states} == {4} and "`perm3`'s answers are 4 tokens" in PROSE
    # at the paper's threshold nothing is silenced anywhere
    assert [x["silenced"] for x in AT_PAPERS_THRESHOLD["states"]] == [0] * 8 and AT_PAPERS_THRESHOLD["objective"] == "stapo"
    assert "silences no token in any of the 8 states" in PROSE
    assert all(1900 < x["tokens"] < 2100 for x in states) and "a batch holds about 2,000" in PROSE
    import rlstab

    (mask,) = rlstab.load(str(ROOT / "docs" / "audits" / "stapo-tau0.1.yaml")).masks
    assert (mask.kind, mask.tau_p, mask.entropy_quantile) == ("s2t", 0.1, 0.8) and cf["objective"] == "stapo-tau0.1"
    assert mask.tau_p / rlstab.load("stapo").masks[0].tau_p == pytest.approx(50) and "fifty-fold" in PROSE

    def span(values, fmt):
        return f"{fmt(min(values))} to {fmt(max(values))}"

    g3 = lambda x: f"{x:.3g}"  # noqa: E731
    assert f"silences {span([x['silenced'] for x in states], str)} tokens a state (all digits) of " \
           f"{span([x['positive_tokens'] for x in states], str)} with A > 0" in PROSE
    assert all(text.isdigit() for x in states for text in x["silenced_tokens"])
    angles = [x["arms"]["mask"]["update_angle"] for x in states]
    medians = [x["tests"]["mask"]["update_angle"]["null_median"] for x in states]
    assert f"{g3(min(angles))}° to {g3(max(angles))}°" in PROSE and f"median {g3(min(medians))}° to {g3(max(medians))}°" in PROSE
    assert all(x["tests"]["mask"]["update_angle"]["rank"] == 51 for x in states) and "the largest of the 51 in every state" in PROSE
    c = cf["combined"]["mask"]
    assert f"(Holm p {g3(c['update_angle']['p_holm'])} over the states)" in PROSE
    assert c["update_norm"]["below_null_median"] == 7 and f"7 of 8 states, Holm p {g3(c['update_norm']['p_holm'])})" in PROSE
    assert c["kl"]["below_null_median"] == 8 and f"8 of 8, Holm p {g3(c['kl']['p_holm'])})" in PROSE
    drops = [-x["arms"]["all_tokens"]["entropy_change"] for x in states]
    effects = [x["arms"]["mask"]["entropy_change"] - x["arms"]["all_tokens"]["entropy_change"] for x in states]
    assert min(drops) > 0 and f"entropy by {g3(min(drops))} to {g3(max(drops))} nats" in PROSE
    assert f"by {g3(min(effects)).replace('-', '−')} to +{g3(max(effects))} nats" in PROSE
    assert c["entropy_change"]["below_null_median"] == 7
    assert (f"below the null median in 7 of 8 states (Holm p {g3(c['entropy_change']['p_holm'])}; on the batch's own "
            f"tokens, Holm p {g3(c['batch_entropy_change']['p_holm'])})") in PROSE
    assert f"(Fisher p {g3(c['reward_change']['p'])})" in PROSE
    rewards = [abs(x["arms"][arm]["reward_change"] - x["arms"]["all_tokens"]["reward_change"])
               for x in states for arm in ("mask", "probability_only")] + [
        abs(v - x["arms"]["all_tokens"]["reward_change"]) for x in states for v in x["null"]["reward_change"]]
    assert max(rewards) <= 1 / 98 + 1e-12 and "by more than one of the 98 problems" in PROSE
    same = sum(x["probability_only_overlap"] == x["silenced"] for x in states)
    others = ", ".join(f"{x['probability_only_overlap']} of {x['silenced']}" for x in states
                       if x["probability_only_overlap"] != x["silenced"])
    assert f"the mask's in {same} of the 8 states (and {others} in the others)" in PROSE
    assert all(x["first_order"]["covariance"] < 0 for x in states) and "$c_S < 0$ in all 8 states" in PROSE
    tally = cf["combined"]["first_order"]
    assert (tally["held_out"]["agree"], tally["held_out"]["decided"], tally["batch"]["agree"]) == (7, 8, 7)
    assert "the measured sign agrees in 7 of 8" in PROSE
    assert (f"agrees {tally['held_out']['null_agree']} times in {tally['held_out']['null_decided']} held out and "
            f"{tally['batch']['null_agree']} in {tally['batch']['null_decided']} on the batch") in PROSE
    seconds = [x["seconds"] for x in states]
    assert f"{cf['seconds']:.0f} s for the 8 states ({min(seconds):.0f} to {max(seconds):.0f} s each, " \
           f"{s['null_draws'] + 4} updates a state" in PROSE
    assert f"{AT_PAPERS_THRESHOLD['seconds']:.0f} s for the audit at the paper's threshold" in PROSE


def test_the_counterfactual_methods_numbers_are_the_codes():
    from rlstab.demo.counterfactual import METHODS, MICRO_BATCH

    assert MICRO_BATCH == 64 and "micro-batches of 64 responses" in PROSE
    assert "seed * 100000 + the state's index" in METHODS["null"] and "seeded by `seed x 100000 +` the state's index" in PROSE
    assert f"{1 / 51:.3g}" == "0.0196" and "$1/(K+1)$, 0.0196 at K = 50" in PROSE


def test_the_smollm2_counterfactual_is_its_stored_audit():
    """Its one published state silenced nothing: the page says so with the stored numbers, and ranks nothing."""
    cf = json.loads((ROOT / "docs" / "audits" / "counterfactual-smollm2.json").read_text())
    s = cf["settings"]
    assert (s["prompts"], s["group_size"], s["temperature"], s["null_draws"], s["held_out"]) == (32, 8, 1.0, 50, 16)
    assert cf["objective"] == "stapo-0.05" and cf["source"]["model"] == "smollm2" and cf["source"]["task"] == "add1"
    (run,) = cf["source"]["runs"]
    assert (run["seed"], run["regime"], run["objective"], run["steps"]) == (0, "small-lm-collapse", "dapo-shadow", [10])
    (state,) = cf["states"]
    assert state["silenced"] == 0 and state["null_draws"] == 0 and cf["combined"]["states"] == 0
    assert in_page(f"on its batch of {state['tokens']} response tokens ({state['responses']} responses, "
                   f"{state['positive_tokens']} tokens with A > 0), S2T at `tau_p` 0.05 silences no token")
    assert in_page(f"no null was drawn ({state['seconds']:.0f} s;")
    assert state["held_out_problems"] == 13 and in_page("`add1` holds 13 held-out problems")


def test_the_smollm2_second_state_is_its_stored_audit():
    """The second state's p-values from its stored null, its tables and the prose's numbers."""
    from rlstab.demo.counterfactual_report import (
        first_order_line,
        first_order_table,
        measure_table,
        states_table,
        tokens_line,
    )

    cf = json.loads((ROOT / "docs" / "audits" / "counterfactual-smollm2-seed1.json").read_text())
    s = cf["settings"]
    assert (s["prompts"], s["null_draws"], cf["objective"]) == (32, 50, "stapo-0.05")
    (run,) = cf["source"]["runs"]
    assert (run["seed"], run["regime"], run["objective"], run["steps"]) == (1, "small-lm-collapse", "dapo-shadow", [10])
    (state,) = cf["states"]
    assert (state["tokens"], state["positive_tokens"], state["silenced"], state["silenced_tokens"]) == (682, 96, 1, {"7": 1})
    assert state["restore_check"] == 0.0 and state["probability_only_overlap"] == 1
    for arm in ("mask", "probability_only"):
        for m in MEASURES:
            x0, null = state["arms"][arm][m], state["null"][m]
            assert len(null) == 50 and state["tests"][arm][m]["p"] == two_sided_p(x0, null)
    # one null draw is the mask's own token: equal on every measure
    assert all(sum(v == state["arms"]["mask"][m] for v in state["null"][m]) >= 1 for m in MEASURES)
    assert in_page(f"{1 - (95 / 96) ** 50:.2f}") and in_page(f"2/51 = {2 / 51:.3g}, not 1/51")
    ps = {m: state["tests"]["mask"][m]["p"] for m in MEASURES}
    holm, running = {}, 0.0
    for i, m in enumerate(sorted(MEASURES, key=ps.get)):  # Holm's step-down over the six measures
        running = max(running, min(1.0, (len(MEASURES) - i) * ps[m]))
        holm[m] = running
    for m in MEASURES:
        assert cf["combined"]["mask"][m]["p_holm"] == pytest.approx(holm[m], rel=1e-9)
    assert in_page(f"Holm over the six measures gives {min(holm.values()):.3g} at best ({min(ps.values()):.3g} x 6)")
    for table in (states_table(cf), tokens_line(cf), measure_table(cf, "entropy_change"), measure_table(cf, "update_angle"),
                  first_order_table(cf), first_order_line(cf)):
        assert in_page(table), table.splitlines()[0]
    all_tokens, mask = state["arms"]["all_tokens"], state["arms"]["mask"]
    change = mask["entropy_change"] - all_tokens["entropy_change"]
    assert in_page(f"lowers the held-out entropy by {-all_tokens['entropy_change']:.3g} nats; without the `7` it falls "
                   f"by {-change:.2g} nats more")
    assert in_page(f"The update turns by {mask['update_angle']:.3g}°")
    assert in_page("3314 s for its 54 updates") and round(state["seconds"]) == 3314
    assert in_page(f"$c_S = {state['first_order']['covariance']:.3g} < 0$")
    # one state's smallest two-sided p at K = 50 is 1/51; Holm's first step over six measures is 0.05/6
    assert in_page(f"0.05/6 = {0.05 / 6:.2g}: its smallest possible p, 1/51 = {1 / 51:.3g}, is above it")


def _mechanism_along():
    data = json.loads((ROOT / "docs" / "audits" / "smollm2-mechanism-along.json").read_text())
    return data, [s for part in data["invocations"] for s in part["states"]]


def test_the_smollm2_mechanism_tables_are_its_stored_audit():
    from rlstab.demo.mechanism_along_report import fixed_p_table, state_table

    data, states = _mechanism_along()
    merged = {"states": states, "combined": {"fixed_p_pooled": None}}
    assert in_page(state_table(merged)) and in_page(fixed_p_table(merged))
    assert len(states) == 20 and {(s["run_seed"], s["step"]) for s in states} == {
        (seed, step) for seed in range(4) for step in (5, 10, 15, 20, 25)}
    for part in data["invocations"]:
        assert part["objective"] == "stapo-0.05" and part["settings"]["null_draws"] == 50
        assert (part["settings"]["prompts"], part["settings"]["group_size"]) == (32, 8)
        assert {r["temperature"] for r in part["source"]["runs"]} == {1.0}
    assert in_page(f"the two invocations took {data['invocations'][0]['seconds']:.0f} s and "
                   f"{data['invocations'][1]['seconds']:.0f} s")
    ratios = [r["summary"]["entropy_ratio"] for r in data["training"]["runs"]]
    assert all(r["summary"]["collapsed"] for r in data["training"]["runs"])
    assert in_page(f"(entropy ratios {min(ratios):.3f} to {max(ratios):.3f})")


def test_the_smollm2_mechanism_reading_is_its_stored_audit():
    """Its p-values, recomputed from the stored null shares; the protocol's reading for under 5 informative states."""
    data, states = _mechanism_along()
    informative = [s for s in states if s["informative"]]
    assert len(informative) == 4 < 5 and in_page("**Too few informative states to read: 4 of the 20**")
    assert [s["silenced"] for s in informative] == [1] * 4 and all(s["silenced"] == 0 for s in states if not s["informative"])
    texts = [t for s in informative for t in s["silenced_tokens"]]
    assert in_page("The four silenced tokens are the digits " + ", ".join(f"`{t}`" for t in texts[:-1])
                   + f" and `{texts[-1]}`")
    for s in informative:
        for name in ("a", "b"):
            null = s[f"null_{name}"]
            assert len(null["shares"]) == 50
            assert null["p"] == (1 + sum(x >= s["share"] for x in null["shares"])) / 51  # one-sided, ties against
    pct = lambda x: f"{100 * x:.0f}%"  # noqa: E731
    shares, cosines = [s["share"] for s in informative], [s["cosine"] for s in informative]
    assert in_page(f"Each carries {pct(min(shares))} to {pct(max(shares))} of the norm of the step's full gradient "
                   f"(cosine {min(cosines):.2f} to {max(cosines):.2f})")
    medians = [s["null_a"]["median"] for s in informative]
    assert in_page(f"carry a median of {100 * min(medians):.2f}% to {100 * max(medians):.1f}%")
    p_a = [s["null_a"]["p"] for s in informative]
    pa = fisher_p(p_a)
    pb = fisher_p([s["null_b"]["p"] for s in informative])
    holm_a = min(1.0, 2 * min(pa, pb))  # Holm over the two nulls: the smaller one first, times 2
    assert pa < pb and in_page(f"the one-sided p within null A is {min(p_a):.4f} to {max(p_a):.4f} per state "
                               f"(Fisher over the four, p {pa:.2g}; Holm over the two nulls, {holm_a:.2g})")
    pools = sorted({s["probability_condition_tokens"] for s in informative})
    assert pools == [1, 2] and in_page("the tokens with A > 0 and p < 0.05 number 1 or 2 in the informative states")
    p_b = sorted(s["null_b"]["p"] for s in informative)
    assert p_b[1:] == [1.0] * 3 and in_page(f"(p_B {p_b[0]:.2f} in one state, 1 in three)")


def test_the_smollm2_fixed_p_correlation_is_its_stored_audit():
    import statistics

    _, states = _mechanism_along()
    for key, words in (("direction", "the mean over the 20 states is"), ("norm", "Weighted by $|c_t|$, it is")):
        values = [s["fixed_p"][key] for s in states]
        text = (f"{words} {statistics.mean(values):+.3f} (range {min(values):+.3f} to {max(values):+.3f})"
                .replace("-", "−"))
        assert in_page(text), text
    direction = [s["fixed_p"]["direction"] for s in states]
    assert min(direction) > 0 and statistics.mean(direction) > 0.1  # the protocol's "opposite" reading
    assert in_page("the coefficient-free $\\lVert e_y - \\pi \\rVert$ rises with the entropy in every state")
    assert -0.1 < statistics.mean(s["fixed_p"]["norm"] for s in states) < 0.1
