"""STARE: top-P surprisal selection, W / M weights, the entropy gate and the adaptive controller, hand-computed."""

import math

import pytest
import torch

import rlstab
from rlstab.reweighters.stare import top_count

MASK = torch.tensor([[True, True, True, True], [True, True, True, False]])
# Row 0 (A = +1): p = 0.9, 0.05, 0.5, 0.2 -> surprisal -log p = 0.105, 2.996, 0.693, 1.609.
# Row 1 (A = -1): p = 0.1, 0.8, 0.3      -> surprisal 2.303, 0.223, 1.204 (last token is padding).
PROBS = torch.tensor([[0.9, 0.05, 0.5, 0.2], [0.1, 0.8, 0.3, 0.5]])
ADV = torch.tensor([1.0, -1.0])


def objective(**stare):
    return rlstab.load({
        "reweighters": [{"kind": "stare", **stare}],
        "surrogate": {"kind": "none"},
        "aggregation": {"kind": "token-sum", "count": "valid"},
    })


def batch(entropy: float = 0.2, probs=PROBS, adv=ADV, mask=MASK):
    logprobs = probs.log().requires_grad_()
    return rlstab.TokenBatch(
        logprobs=logprobs, advantages=adv, response_mask=mask, entropy=torch.full(probs.shape, entropy)
    )


def close(actual, expected):
    torch.testing.assert_close(actual, torch.tensor(expected), rtol=0, atol=1e-6)


def loss_and_grad(obj, b):
    out = obj.compile()(b)
    out.loss.backward()
    return out, b.logprobs.grad


def test_top_count_is_the_authors_tolerant_ceiling():
    assert top_count(100, 0.07) == 7  # 0.07 * 100 = 7.000000000000001: a bare ceil would give 8
    assert math.ceil(100 * 0.07) == 8
    assert top_count(30, 0.1) == 3
    assert top_count(31, 0.1) == 4  # ceil(3.1)
    assert top_count(4, 0.1) == 1  # ceil(0.4) = 1
    assert top_count(5, 0.01) == 1  # at least one
    assert top_count(5, 1.0) == 5
    assert top_count(0, 0.1) == 0 and top_count(5, 0.0) == 0


def test_o1_weights_the_most_surprising_positive_token():
    # Gate open (H_bar = 0.2 < 0.3). A > 0: 4 candidates, k = ceil(0.4) = 1: row 0 token 1 (s = 2.996) gets W = 1.1.
    # surrogate none, r = 1: l = -A w. token-sum: row 0: -(1 + 1.1 + 1 + 1) = -4.1; row 1: +(1 + 1 + 1) = 3.
    out, grad = loss_and_grad(objective(), batch())
    assert out.loss.item() == pytest.approx(-1.1)
    # d l / d logp = -A w r = -A w
    close(grad, [[-1.0, -1.1, -1.0, -1.0], [1.0, 1.0, 1.0, 0.0]])
    assert out.metrics["reweight/stare/gate"] == 1.0
    assert out.metrics["reweight/stare/H_bar"] == pytest.approx(0.2)
    assert (out.metrics["reweight/stare/W"], out.metrics["reweight/stare/M"]) == pytest.approx((1.1, 0.9))
    # mean factor over the 7 kept tokens: (6 + 1.1) / 7
    assert out.metrics["reweight/stare/mean"] == pytest.approx(7.1 / 7)


def test_c2_also_weights_the_most_surprising_negative_token():
    # A < 0: 3 candidates, k = 1: row 1 token 0 (s = 2.303) gets M = 0.9: row 1 = +(0.9 + 1 + 1) = 2.9; -4.1 + 2.9
    out, grad = loss_and_grad(objective(variant="C2"), batch())
    assert out.loss.item() == pytest.approx(-1.2)
    close(grad[1], [0.9, 1.0, 1.0, 0.0])


def test_larger_p_selects_the_ceiling_of_each_sign():
    # P = 0.5: A > 0: k = ceil(2) = 2: s = 2.996 (t1) and 1.609 (t3). A < 0: k = ceil(1.5) = 2: 2.303 (t0), 1.204 (t2).
    out, grad = loss_and_grad(objective(variant="C2", top_p=0.5, w=1.2, m=0.7), batch())
    close(grad, [[-1.0, -1.2, -1.0, -1.2], [0.7, 1.0, 0.7, 0.0]])
    # -(1 + 1.2 + 1 + 1.2) + (0.7 + 1 + 0.7) = -4.4 + 2.4
    assert out.loss.item() == pytest.approx(-2.0)


def test_gate_closed_at_or_above_the_target_entropy():
    # H_tgt = 0.5 (exact in float32): H_bar = 0.5 is not < 0.5, nor is 0.75: every weight is 1: -4 + 3 = -1.
    for entropy in (0.5, 0.75):
        out, grad = loss_and_grad(objective(variant="C2", target_entropy=0.5), batch(entropy=entropy))
        assert out.loss.item() == pytest.approx(-1.0)
        assert out.metrics["reweight/stare/gate"] == 0.0


def test_gate_uses_the_step_mean_entropy_of_valid_tokens():
    # Valid entropies: row 0 = 0.1, 0.2, 0.3, 0.4 (sum 1.0); row 1 = 0.0, 0.1, 0.2 (sum 0.3); padding 9 is ignored.
    # H_bar = 1.3 / 7 = 0.1857 < 0.3: open. With target 0.18 it is closed. (gather: NaN padding is ignored too)
    entropy = torch.tensor([[0.1, 0.2, 0.3, 0.4], [0.0, 0.1, 0.2, 9.0]])
    nan_padding = entropy.clone()
    nan_padding[1, 3] = float("nan")
    stats = objective().compile().gather([rlstab.TokenBatch(logprobs=PROBS.log(), advantages=ADV, response_mask=MASK,
                                                            entropy=nan_padding)])
    assert stats.hooks[0]["H_bar"] == pytest.approx(1.3 / 7)
    b = rlstab.TokenBatch(logprobs=PROBS.log(), advantages=ADV, response_mask=MASK, entropy=entropy)
    out = objective().compile()(b)
    assert out.metrics["reweight/stare/H_bar"] == pytest.approx(1.3 / 7)
    assert out.metrics["reweight/stare/gate"] == 1.0
    assert objective(target_entropy=0.18).compile()(b).metrics["reweight/stare/gate"] == 0.0


def test_selection_runs_per_micro_batch_and_the_gate_per_step():
    # Two rows, A = +1 each: row 0 p = 0.05, 0.5 (s = 3.0, 0.69); row 1 p = 0.9, 0.2 (s = 0.11, 1.61).
    # Whole batch: 4 candidates, k = 1: only row 0 token 0. Micro-batches of one row: k = 1 in each:
    # row 0 token 0 and row 1 token 1.
    probs = torch.tensor([[0.05, 0.5], [0.9, 0.2]])
    mask = torch.ones(2, 2, dtype=torch.bool)
    # entropy: row 0 = 0.1, row 1 = 0.4: micro-batch means 0.1 and 0.4; step mean 0.25 < 0.3 opens both.
    entropy = torch.tensor([[0.1, 0.1], [0.4, 0.4]])
    leaf = probs.log().requires_grad_()

    def mb(rows):
        return rlstab.TokenBatch(logprobs=leaf[rows], advantages=torch.ones(len(rows)), response_mask=mask[rows],
                                 entropy=entropy[rows])

    loss_fn = objective().compile()
    whole = loss_fn(mb([0, 1]))
    (g_whole,) = torch.autograd.grad(whole.loss, leaf)
    close(g_whole, [[-1.1, -1.0], [-1.0, -1.0]])
    micro = [mb([0]), mb([1])]
    stats = loss_fn.gather(micro)
    total = sum(loss_fn(m, step=stats).loss for m in micro)
    (g_micro,) = torch.autograd.grad(total, leaf)
    close(g_micro, [[-1.1, -1.0], [-1.0, -1.1]])
    # alone, the second micro-batch (H = 0.4) would have closed the gate; the step's 0.25 keeps it open
    assert loss_fn(micro[1]).metrics["reweight/stare/gate"] == 0.0
    assert loss_fn(micro[1], step=stats).metrics["reweight/stare/gate"] == 1.0


def test_ties_at_the_kth_surprisal_go_to_the_first_position():
    # A > 0, four tokens with equal p = 0.5, P = 0.5: k = 2: the first two positions.
    probs = torch.full((1, 4), 0.5)
    b = rlstab.TokenBatch(logprobs=probs.log().requires_grad_(), advantages=torch.ones(1),
                          response_mask=torch.ones(1, 4, dtype=torch.bool), entropy=torch.zeros(1, 4))
    _, grad = loss_and_grad(objective(top_p=0.5), b)
    close(grad, [[-1.1, -1.1, -1.0, -1.0]])


def test_adaptive_controller_moves_w_and_m_then_clips():
    # alpha = 0.1, W0 = 1.1, M0 = 0.9, H_tgt = 0.5, bounds [1, 1.3] and [0.7, 1] (entropies exact in float32).
    # step H_bar: 0.25 (below: W 1.2, M 0.8, gate open), 0.25 (W 1.3, M 0.7), 0.25 (clipped: W 1.3, M 0.7),
    # 0.75 (above: W 1.2, M 0.8, gate closed), 0.5 (equal: sgn 0, unchanged, gate closed).
    settings = dict(variant="C2", adaptive=True, alpha=0.1, w_max=1.3, m_min=0.7, target_entropy=0.5)
    loss_fn = objective(**settings).compile()
    seen = []
    for h in (0.25, 0.25, 0.25, 0.75, 0.5):
        m = loss_fn(batch(entropy=h)).metrics
        seen.append((m["reweight/stare/W"], m["reweight/stare/M"], m["reweight/stare/gate"]))
    expected = [(1.2, 0.8, 1.0), (1.3, 0.7, 1.0), (1.3, 0.7, 1.0), (1.2, 0.8, 0.0), (1.2, 0.8, 0.0)]
    assert seen == [pytest.approx(e) for e in expected]
    # The updated weights are the ones this step uses: step 1 ran with W = 1.2, M = 0.8:
    # -(1 + 1.2 + 1 + 1) + (0.8 + 1 + 1) = -4.2 + 2.8 = -1.4
    fresh = objective(**settings).compile()
    assert fresh(batch(entropy=0.25)).loss.item() == pytest.approx(-1.4)


def test_fixed_weights_do_not_move():
    loss_fn = objective(variant="C2").compile()
    for h in (0.1, 0.9, 0.1):
        m = loss_fn(batch(entropy=h)).metrics
        assert (m["reweight/stare/W"], m["reweight/stare/M"]) == pytest.approx((1.1, 0.9))


def test_a_step_without_valid_tokens_leaves_the_controller_alone():
    loss_fn = objective(adaptive=True).compile()
    loss_fn(batch(entropy=0.5))  # gate closed, W = 1.09
    before = loss_fn.state_dict()
    empty = batch(entropy=0.1, mask=torch.zeros(2, 4, dtype=torch.bool))
    out = loss_fn(empty)
    assert out.loss.item() == 0.0
    assert loss_fn.state_dict() == before


def test_needs_entropy():
    b = rlstab.TokenBatch(logprobs=PROBS.log(), advantages=ADV, response_mask=MASK)
    with pytest.raises(rlstab.BatchError, match=r"reweighters\[0\] \(stare\) reads TokenBatch\.entropy"):
        objective().compile()(b)


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"top_p": 1.5}, r"reweighters\[0\]\.top_p = 1\.5"),
        ({"w": 0.9}, r"reweighters\[0\]\.w = 0\.9"),
        ({"w": 1.6}, r"w \(1\.6\) must not exceed w_max \(1\.5\)"),
        ({"m": 0.4}, r"m \(0\.4\) must not be below m_min \(0\.5\)"),
        ({"variant": "C3"}, r"reweighters\[0\]\.variant = 'C3'"),
        ({"selection": "step"}, r"reweighters\[0\]\.selection = 'step'"),
    ],
)
def test_bad_fields_are_refused_with_their_path(fields, message):
    with pytest.raises(rlstab.ConfigError, match=message):
        objective(**fields)


def test_the_stare_preset_is_the_papers_main_configuration():
    o = rlstab.load("stare")
    (s,) = o.reweighters
    assert (s.kind, s.variant, s.top_p, s.w, s.target_entropy, s.adaptive) == ("stare", "O1", 0.1, 1.1, 0.3, False)
    # the authors' script: clip 0.2/0.28, clip_ratio_c 10, token-mean
    assert (o.surrogate.eps_low, o.surrogate.eps_high, o.surrogate.dual_clip) == (0.2, 0.28, 10.0)
    assert (o.aggregation.kind, o.aggregation.count) == ("token-mean", "valid")
