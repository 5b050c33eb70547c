"""The ``expression`` mask: hand-computed cases, and S2T written as an expression equals the component.

Hand-built batch (as tests/masks/test_s2t.py): two responses, A = (+1, -1), on-policy (r = 1, so
l = -A and dl/dlogp = -A on every kept token). Valid entropies, sorted:
0.1 0.2 0.3 0.4 0.5 0.6 0.7 0.8 0.9 (9 tokens; row 1's last is padding).
"""

import sys
from pathlib import Path

import pytest
import torch

import rlstab
from rlstab.batch import BatchError
from rlstab.explain import explain
from rlstab.expression import compile_expression
from rlstab.masks import Expression
from rlstab.testing.spawned_ranks import run_ranks
from rlstab.tokens import Tokens

from batches import random_batch
from step_worker import take

H = torch.tensor([[0.1, 0.7, 0.8, 0.4, 0.5], [0.6, 0.2, 0.3, 0.9, 5.0]])
P = torch.tensor([[0.5, 0.001, 0.001, 0.0021, 0.0019], [0.5, 0.001, 0.5, 0.5, 0.5]])
MASK = torch.tensor([[True] * 5, [True] * 4 + [False]])
A = torch.tensor([1.0, -1.0])
S2T_TEXT = "advantage > 0 and probability < 0.002 and entropy < quantile(entropy, 0.8)"


def objective(*masks, count="kept"):
    return rlstab.load({"masks": list(masks), "aggregation": {"kind": "token-mean", "count": count}})


def run(*masks, advantages=A):
    logprobs = P.log().requires_grad_()
    batch = rlstab.TokenBatch(logprobs=logprobs, advantages=advantages, response_mask=MASK, entropy=H)
    out = objective(*masks).compile()(batch)
    out.loss.backward()
    return out, logprobs.grad


# ---------------------------------------------------------------- hand-computed


def test_s2t_as_an_expression_by_hand():
    out, grad = run({"kind": "expression", "silence": S2T_TEXT})
    # Q_0.8: position 0.8 * 8 = 6.4 -> 0.7 + 0.4 * (0.8 - 0.7) = 0.74. Row 0: t1 (p 0.001, H 0.7) and t4
    # (p 0.0019, H 0.5) are silenced; t2 (H 0.8) and t3 (p 0.0021) are not; row 1 has A < 0.
    assert out.metrics["mask/expression/quantile_entropy_0.8"] == pytest.approx(0.74)
    assert out.metrics["mask/expression/silenced"] == 2
    assert out.metrics["mask/expression/kept"] == 7
    # Kept: row 0 t0 t2 t3 (l = -1), row 1 t0..t3 (l = +1): (-3 + 4) / 7.
    assert out.loss.item() == pytest.approx(1 / 7)
    expected = torch.tensor([[-1, 0, -1, -1, 0], [1, 1, 1, 1, 0]]) / 7
    assert torch.allclose(grad, expected.float(), atol=1e-7)


def test_keep_trains_the_tokens_the_condition_names():
    out, grad = run({"kind": "expression", "keep": "entropy >= quantile(entropy, 0.5)"})
    # Median: position 0.5 * 8 = 4 -> 0.5. Kept: row 0 H 0.7 0.8 0.5 (t1 t2 t4), row 1 H 0.6 0.9 (t0 t3).
    assert out.metrics["mask/expression/quantile_entropy_0.5"] == pytest.approx(0.5)
    assert out.metrics["mask/expression/kept"] == 5
    # (-1 * 3 + 1 * 2) / 5 kept
    assert out.loss.item() == pytest.approx(-1 / 5)
    expected = torch.tensor([[0, -1, -1, 0, -1], [1, 0, 0, 1, 0]]) / 5
    assert torch.allclose(grad, expected.float(), atol=1e-7)


def test_two_quantiles_and_their_metrics():
    out, _ = run({"kind": "expression", "silence": "entropy < quantile(entropy, 0.2) or entropy > quantile(entropy, 0.8)"})
    # Q_0.2: position 1.6 -> 0.2 + 0.6 * 0.1 = 0.26; Q_0.8 = 0.74.
    assert out.metrics["mask/expression/quantile_entropy_0.2"] == pytest.approx(0.26)
    assert out.metrics["mask/expression/quantile_entropy_0.8"] == pytest.approx(0.74)
    # Silenced: H 0.1 and 0.2 (< 0.26), 0.8 and 0.9 (> 0.74). Kept: row 0 t1 t3 t4 (-1 each), row 1 t0 t2 (+1).
    assert out.metrics["mask/expression/silenced"] == 4
    assert out.loss.item() == pytest.approx(-1 / 5)


def test_silence_and_keep_of_the_negation_are_the_same_mask():
    silence, grad_silence = run({"kind": "expression", "silence": S2T_TEXT})
    keep, grad_keep = run({"kind": "expression", "keep": f"not ({S2T_TEXT})"})
    assert keep.loss.item() == silence.loss.item()
    assert torch.equal(grad_keep, grad_silence)


def test_an_empty_quantile_population_silences_nothing():
    # No token has A > 5, so quantile(..., advantage > 5) has no population: the mask keeps every token
    # this step (as S2T with population: positive does) and reports no threshold.
    mask = {"kind": "expression", "silence": "entropy < quantile(entropy, 0.8, advantage > 5)"}
    out, _ = run(mask)
    assert out.metrics["mask/expression/kept"] == 9
    assert not any(k.startswith("mask/expression/quantile") for k in out.metrics)
    batch = rlstab.TokenBatch(logprobs=P.log(), advantages=A, response_mask=MASK, entropy=H)
    assert objective(mask).compile().gather([batch]).thresholds == ((None,),)


def test_next_to_an_s2t_component_in_one_objective():
    logprobs = P.log().requires_grad_()
    batch = rlstab.TokenBatch(logprobs=logprobs, advantages=A, response_mask=MASK, entropy=H)
    out = objective({"kind": "s2t"}, {"kind": "expression", "silence": "position == 0"}).compile()(batch)
    # S2T silences row 0 t1 t4, the expression each row's t0: kept row 0 t2 t3 (-1), row 1 t1 t2 t3 (+1).
    assert out.metrics["mask/s2t/entropy_threshold"] == pytest.approx(0.74)
    assert out.metrics["mask/expression/silenced"] == 2
    assert out.metrics["tokens/kept"] == 5
    assert out.loss.item() == pytest.approx(1 / 5)


# ---------------------------------------------------------------- S2T, the component vs the expression

S2T_EQUIVALENTS = [
    ({"kind": "s2t"}, {"silence": S2T_TEXT}),
    (
        {"kind": "s2t", "population": "positive"},
        {"silence": "advantage > 0 and probability < 0.002 and entropy < quantile(entropy, 0.8, advantage > 0)"},
    ),
    (
        {"kind": "s2t", "entropy_side": "high"},
        {"silence": "advantage > 0 and probability < 0.002 and entropy >= quantile(entropy, 0.8)"},
    ),
    (
        {"kind": "s2t", "prob_source": "old"},
        {"silence": "advantage > 0 and old_probability < 0.002 and entropy < quantile(entropy, 0.8)"},
    ),
    (
        {"kind": "s2t", "tau_p": 0.0025, "entropy_quantile": 0.5, "interpolation": "nearest"},
        {"silence": "0 < advantage and 0.0025 > probability and quantile(entropy, 0.5) > entropy",
         "interpolation": "nearest"},
    ),
    ({"kind": "s2t"}, {"keep": f"not ({S2T_TEXT})"}),
]
IDS = ["s2t", "positive", "high", "old", "tau-q-nearest", "keep-not"]


def leaf_of(batch):
    return batch.logprobs.detach().clone().requires_grad_()


def whole_step(loss_fn, batch):
    leaf = leaf_of(batch)
    out = loss_fn(take(batch, 0, len(leaf), leaf))
    out.loss.backward()
    return out, leaf.grad


@pytest.mark.parametrize("advantages", [None, "sequence", "token"])
@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize(("component", "expression"), S2T_EQUIVALENTS, ids=IDS)
def test_s2t_expression_equals_the_component_exactly(component, expression, seed, advantages):
    batch = random_batch(B=16, T=24, seed=seed, advantages=advantages)
    s2t_fn = objective(component).compile()
    expr_fn = objective({"kind": "expression", **expression}).compile()
    s2t_out, s2t_grad = whole_step(s2t_fn, batch)
    expr_out, expr_grad = whole_step(expr_fn, batch)
    # the same tokens, bit for bit
    s2t_keep, expr_keep = masks_of(s2t_fn, batch), masks_of(expr_fn, batch)
    assert torch.equal(expr_keep, s2t_keep)
    # so the same loss and gradients, bit for bit, and the same threshold
    assert expr_out.loss.item() == s2t_out.loss.item()
    assert torch.equal(expr_grad, s2t_grad)
    (name,) = [k for k in expr_out.metrics if k.startswith("mask/expression/quantile")]
    assert expr_out.metrics[name] == s2t_out.metrics["mask/s2t/entropy_threshold"]
    for what in ("kept", "silenced", "kept_fraction"):
        assert expr_out.metrics[f"mask/expression/{what}"] == s2t_out.metrics[f"mask/s2t/{what}"]


def masks_of(loss_fn, batch):
    stats = loss_fn.gather([batch])
    t = Tokens.from_batch(batch, 20.0)
    t.set_advantages(batch.advantages if stats.advantage is None else
                     loss_fn.objective.advantage.apply(stats.advantage, batch.rewards, batch.group_ids))
    (mask,) = loss_fn.masks
    (threshold,) = stats.thresholds
    return mask.keep(t, threshold) * t.valid


@pytest.mark.parametrize(
    ("component", "text"),
    [({"kind": "entropy_quantile", "rho": 0.2}, "entropy >= quantile(entropy, 0.8)"),
     ({"kind": "entropy_quantile", "rho": 0.3, "side": "bottom"}, "entropy < quantile(entropy, 0.3)")],
    ids=["top", "bottom"],
)
def test_20_entropy_as_an_expression_equals_the_component(component, text):
    batch = random_batch(B=16, T=24, seed=4, advantages="sequence")
    eq_out, eq_grad = whole_step(objective(component, count="valid").compile(), batch)
    ex_out, ex_grad = whole_step(objective({"kind": "expression", "keep": text}, count="valid").compile(), batch)
    assert ex_out.loss.item() == eq_out.loss.item()
    assert torch.equal(ex_grad, eq_grad)
    assert ex_out.metrics["mask/expression/kept"] == eq_out.metrics["mask/entropy_quantile/kept"]


def test_the_comparison_silences_tokens_at_all():
    # The equivalence would hold trivially if nothing were silenced: check the batches exercise the mask.
    for seed in (0, 1, 2):
        out, _ = whole_step(objective({"kind": "expression", "silence": S2T_TEXT}).compile(), random_batch(seed=seed))
        assert out.metrics["mask/expression/silenced"] > 0


SPLITS = [(0, 3), (3, 8), (8, 8), (8, 16)]  # uneven, one empty


@pytest.mark.parametrize("advantages", [None, "sequence"])
@pytest.mark.parametrize(("component", "expression"), S2T_EQUIVALENTS[:3], ids=IDS[:3])
def test_s2t_expression_equals_the_component_through_the_step_api(component, expression, advantages):
    batch = random_batch(B=16, T=24, seed=7, advantages=advantages)
    results = {}
    for name, mask in (("s2t", component), ("expression", {"kind": "expression", **expression})):
        loss_fn = objective(mask).compile()
        leaf = leaf_of(batch)
        micro = [take(batch, lo, hi, leaf) for lo, hi in SPLITS]
        stats = loss_fn.gather(micro)
        outs = [loss_fn(mb, step=stats) for mb in micro]
        for out in outs:
            out.loss.backward()
        results[name] = (stats, outs, leaf.grad)
    s2t_stats, s2t_outs, s2t_grad = results["s2t"]
    expr_stats, expr_outs, expr_grad = results["expression"]
    assert expr_stats.thresholds == ((s2t_stats.thresholds[0],),)
    assert [o.loss.item() for o in expr_outs] == [o.loss.item() for o in s2t_outs]
    assert torch.equal(expr_grad, s2t_grad)
    # and the split step equals the whole step
    whole, whole_grad = whole_step(objective({"kind": "expression", **expression}).compile(), batch)
    assert sum(o.loss.item() for o in expr_outs) == pytest.approx(whole.loss.item(), abs=1e-6)
    assert torch.allclose(expr_grad, whole_grad, atol=1e-6, rtol=0)


# ---------------------------------------------------------------- two gloo ranks


def test_two_ranks_with_two_micro_batches_each_equal_one_process(monkeypatch):
    here = Path(__file__).parent
    monkeypatch.syspath_prepend(str(here))  # the spawned ranks import expression_rank from here
    import expression_rank

    results = run_ranks(expression_rank.run_rank, world=2)

    batch = expression_rank.batch()
    loss_fn = expression_rank.objective().compile()
    whole_stats = loss_fn.gather([batch])
    whole = loss_fn(batch, step=whole_stats)
    (whole_grad,) = torch.autograd.grad(whole.loss, batch.logprobs)
    (whole_thresholds,) = whole_stats.thresholds
    assert len(whole_thresholds) == 2 and all(t is not None for t in whole_thresholds)
    assert whole.metrics["mask/expression/silenced"] > 0
    for rank in (0, 1):
        grad, thresholds, counts = results[rank]
        assert thresholds == [t.item() for t in whole_thresholds]  # exact, over both ranks
        assert torch.allclose(torch.tensor(grad), whole_grad, atol=1e-6, rtol=0)
        assert counts == (whole_stats.counts.tokens_valid, whole_stats.counts.tokens_kept)
    assert sys.modules["expression_rank"] is expression_rank


# ---------------------------------------------------------------- the component itself


def test_reads_follow_the_features_used():
    assert Expression(silence=S2T_TEXT).reads == {"entropy"}
    assert Expression(keep="probability > 0.01 and ratio < 2").reads == set()
    assert Expression(keep="rollout_logprob > -5").reads == {"rollout_logprobs"}
    batch = rlstab.TokenBatch(logprobs=P.log(), advantages=A, response_mask=MASK)  # no entropy
    with pytest.raises(BatchError, match=r"masks\[0\] \(expression\) reads TokenBatch.entropy"):
        objective({"kind": "expression", "silence": S2T_TEXT}).compile()(batch)
    out = objective({"kind": "expression", "silence": "advantage > 0 and probability < 0.002"}).compile()(batch)
    assert out.metrics["mask/expression/silenced"] == 3  # row 0 t1 t2 t4 (p < 0.002, A > 0)
    with pytest.raises(BatchError, match="reads TokenBatch.rollout_logprobs"):
        objective({"kind": "expression", "keep": "rollout_logprob > -5"}).compile()(batch)


def test_exactly_one_of_silence_and_keep():
    for mask, _ in (({"kind": "expression"}, None), ({"kind": "expression", "silence": "entropy < 1", "keep": "entropy > 2"}, None)):
        with pytest.raises(rlstab.ConfigError, match=r"masks\[0\] = .*give exactly one of 'silence' .* and 'keep'"):
            objective(mask)
    with pytest.raises(rlstab.ConfigError, match=r"masks\[0\]\.keep_when: unknown field"):
        objective({"kind": "expression", "keep_when": "entropy < 1"})
    with pytest.raises(rlstab.ConfigError, match=r"masks\[0\]\.silence = 0\.5: Input should be a valid string"):
        objective({"kind": "expression", "silence": 0.5})


def test_yaml_round_trip_keeps_the_keep_key():
    text = """
aggregation: {kind: token-mean, count: kept}
masks:
  - kind: expression
    keep: "entropy >= quantile(entropy, 0.5)"
    interpolation: lower
"""
    obj = rlstab.load(text)
    (mask,) = obj.masks
    assert mask.keep_when == "entropy >= quantile(entropy, 0.5)" and mask.silence is None
    dumped = obj.to_yaml()
    assert "keep: entropy >= quantile(entropy, 0.5)" in dumped and "keep_when" not in dumped
    assert rlstab.load(dumped) == obj


def test_describe_and_explain():
    mask = Expression(silence="advantage>0 and probability<1/500 and entropy<quantile(entropy,0.8)")
    assert mask.describe() == (
        "expression: silence iff advantage > 0 and probability < 0.002 and entropy < quantile(entropy, 0.8) "
        "(quantiles over the step's valid tokens, linear)"
    )
    assert Expression(keep="position < 100").describe() == "expression: keep iff position < 100"
    explained = explain(objective({"kind": "expression", "keep": "position < 100"}))
    assert "masks[0] expression: keep iff position < 100" in explained


def test_masks_are_frozen_and_compare_by_their_fields():
    a, b = Expression(silence=S2T_TEXT), Expression(silence=S2T_TEXT)
    assert a == b and hash(a) == hash(b)
    assert a != Expression(keep=S2T_TEXT)
    with pytest.raises(Exception, match="frozen"):
        a.silence = "entropy < 1"


def test_an_expression_equals_its_recompiled_self():
    # Equality (a YAML round trip, a fingerprint check) must not depend on the compile cache: compiled
    # closures compare by identity, so a mask compiled again after an eviction must still be equal.
    first = Expression(silence=S2T_TEXT)
    compile_expression.cache_clear()
    again = Expression(silence=S2T_TEXT)
    assert first.program is not again.program
    assert first == again
    assert first != Expression(silence=S2T_TEXT.replace("0.8", "0.9"))
