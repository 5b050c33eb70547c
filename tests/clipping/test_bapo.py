"""BAPO: hand-computed bound searches (paper and authors' code), step-wide and cross-rank bounds, state, gradients."""

import math

import pytest
import torch
from clipping import bapo_rank
from clipping.cases import off_policy_batch, one_row, ratio, rlstab_loss_and_grad, token_mean_reference

import rlstab
from rlstab.clipping.bapo import _sum_max, _sum_min
from rlstab.testing.spawned_ranks import run_ranks

from step_worker import take

AGG = {"kind": "token-mean", "count": "valid"}


def bounds(out):
    return out.metrics["surrogate/clip_low"], out.metrics["surrogate/clip_high"], out.metrics["surrogate/positive_share"]


# One response: a positive token (A = +1) with ratio r_pos, and two negative ones: A = -1 at r = 0.5, A = -2 at r = 1.
# P(c_high) = min(r_pos, c_high);  N(c_low) = 1 * max(0.5, c_low) + 2 * max(1, c_low) = c_low + 2 for c_low in [0.5, 1].
def three_tokens(r_pos, surrogate):
    return one_row([math.log(r_pos), math.log(0.5), 0.0], [1.0, -1.0, -2.0], surrogate)


def test_paper_search_raises_the_upper_bound_first():
    out, grad = three_tokens(2.0, {"kind": "bapo"})  # paper: rho_0 0.4, [0.6, 0.9] step 0.02, [1.2, 3.0] step 0.05
    # start (0.6, 1.2): share = 1.2 / (1.2 + 2.6) = 0.3158 < 0.4
    # c_high = 1.2 + 0.05 k: k = 10 -> 1.70 / 4.30 = 0.3953 < 0.4;  k = 11 -> 1.75 / 4.35 = 0.4023 >= 0.4: stop
    low, high, share = bounds(out)
    assert (low, high) == pytest.approx((0.6, 1.75))
    assert share == pytest.approx(1.75 / 4.35)
    # the loss is PPO clip between those bounds: r = 2 > 1.75 for A > 0 is clipped (l = -1.75, no gradient);
    # r = 0.5 < 0.6 for A = -1 is clipped (l = 0.6, no gradient); r = 1 for A = -2: l = 2, dl/dlogp = 2
    assert out.loss.item() == pytest.approx((-1.75 + 0.6 + 2.0) / 3, abs=1e-6)
    assert torch.allclose(grad, torch.tensor([0.0, 0.0, 2.0]) / 3, atol=1e-7)


def test_paper_search_then_raises_the_lower_bound():
    out, _ = three_tokens(1.3, {"kind": "bapo"})
    # P <= 1.3 whatever c_high, N >= 2.6: the share never reaches 0.4. Algorithm 1 raises c_high to b+ = 3.0
    # (36 steps of 0.05), then c_low by 0.02 while c_low + 0.02 <= b- = 0.9: up to 0.9 (15 steps).
    low, high, share = bounds(out)
    assert (low, high) == pytest.approx((0.9, 3.0))
    assert share == pytest.approx(1.3 / (1.3 + 2.9))  # 0.3095 at the final bounds


def test_target_met_at_the_start():
    out, _ = three_tokens(2.0, {"kind": "bapo", "target": 0.3})  # 0.3158 >= 0.3: the start bounds stay
    assert bounds(out)[:2] == pytest.approx((0.6, 1.2))


def test_authors_code_search_raises_the_lower_bound_first():
    surrogate = {"kind": "bapo", "search": "authors_code", "target": 0.5, "lower_start": 0.8, "lower_max": 0.95,
                 "lower_step": 0.05, "upper_start": 1.2, "upper_max": 2.0, "upper_step": 0.1}  # their run script
    out, _ = three_tokens(2.0, surrogate)
    # criterion P / N: start (0.8, 1.2): 1.2 / 2.8 = 0.4286 < 0.5. Lower bound first: 0.85, 0.9, 0.95 (N grows,
    # the criterion falls: 1.2 / 2.95 = 0.4068). Then the upper bound: 1.3 -> 0.4407, 1.4 -> 0.4746, 1.5 -> 0.5085: stop.
    low, high, share = bounds(out)
    assert (low, high) == pytest.approx((0.95, 1.5))
    assert share == pytest.approx(1.5 / (1.5 + 2.95))  # the metric is always the share P / (P + N)


def test_authors_code_grid_ends_exactly_at_the_maximum():
    s = rlstab.load({"surrogate": {"kind": "bapo", "search": "authors_code", "lower_start": 0.6, "lower_max": 0.9,
                                   "lower_step": 0.07}, "aggregation": AGG}).surrogate
    # min(c + 0.07, 0.9) from 0.6: 0.67, 0.74, 0.81, 0.88, then 0.9
    assert s.candidates()[1] == pytest.approx([0.6, 0.67, 0.74, 0.81, 0.88, 0.9])
    paper = rlstab.load({"surrogate": {"kind": "bapo", "lower_step": 0.07}, "aggregation": AGG}).surrogate
    assert paper.candidates()[1] == pytest.approx([0.6, 0.67, 0.74, 0.81, 0.88])  # c_low + 0.07 <= 0.9
    assert len(paper.candidates()[0]) == 37  # 1.2 + 36 * 0.05 = 3.0 is reached despite float rounding


def test_no_contribution_keeps_the_start_bounds():
    out, grad = one_row([0.3, -0.2], [0.0, 0.0], {"kind": "bapo"})
    assert bounds(out) == pytest.approx((0.6, 1.2, 0.0))
    assert torch.equal(grad, torch.zeros(2))


def test_candidate_sums_match_a_brute_force_loop():
    g = torch.Generator().manual_seed(0)
    w = torch.rand(500, generator=g, dtype=torch.float64)
    r = torch.exp(torch.randn(500, generator=g, dtype=torch.float64))
    r[:20] = 1.25  # ties with a bound
    b = torch.tensor([0.6 + 0.05 * k for k in range(30)], dtype=torch.float64)
    assert torch.allclose(_sum_min(w, r, b), torch.stack([(w * torch.minimum(r, c)).sum() for c in b]))
    assert torch.allclose(_sum_max(w, r, b), torch.stack([(w * torch.maximum(r, c)).sum() for c in b]))


@pytest.mark.parametrize("search", ["paper", "authors_code"])
@pytest.mark.parametrize("seed", range(4))
def test_closed_form_gradient_matches_autograd(seed, search):
    batch = off_policy_batch(seed, spread=1.0)
    out, grad = rlstab_loss_and_grad({"kind": "bapo", "search": search, "dual_clip": 4.0}, batch)
    low, high, _ = bounds(out)

    def per_token(lp):  # PPO clip with the chosen bounds and dual-clip 4, written the textbook way
        r, A = ratio(lp, batch), batch.advantages
        clipped = torch.maximum(-A * r, -A * r.clamp(low, high))
        return torch.where(A < 0, torch.minimum(clipped, -A * 4.0), clipped)

    ref, ref_grad = token_mean_reference(per_token, batch)
    assert out.loss.item() == pytest.approx(ref.item(), abs=1e-6)
    assert torch.allclose(grad, ref_grad, atol=1e-7)
    # and the bounds are those of the search, recomputed from the batch
    valid = batch.response_mask
    A, r = batch.advantages[valid].double(), ratio(batch.logprobs.detach(), batch)[valid].double()
    P = (A.clamp(min=0) * r.clamp(max=high)).sum()
    N = (A.clamp(max=0).abs() * r.clamp(min=low)).sum()
    assert out.metrics["surrogate/positive_share"] == pytest.approx((P / (P + N)).item())


SPLITS = [(0, 3), (3, 8), (8, 12)]


def split(batch, leaf):
    return [take(batch, lo, hi, leaf) for lo, hi in SPLITS]


def test_bounds_are_chosen_over_the_whole_step():
    batch = off_policy_batch(5, spread=1.0)
    fn = bapo_rank.objective().compile()
    whole = fn(batch)
    (whole_grad,) = torch.autograd.grad(whole.loss, batch.logprobs)
    leaf = batch.logprobs.detach().clone().requires_grad_()
    micro = split(batch, leaf)
    stats = fn.gather(micro)
    total = 0.0
    for mb in micro:
        out = fn(mb, step=stats)
        out.loss.backward()
        total += out.loss.item()
        assert bounds(out) == bounds(whole)  # every micro-batch uses the step's bounds
    assert bounds(whole)[:2] != (0.6, 1.2)  # the search moved
    assert total == pytest.approx(whole.loss.item(), abs=1e-6)
    assert torch.allclose(leaf.grad, whole_grad, atol=1e-7)
    # each micro-batch alone would choose other bounds
    alone = {bounds(fn(mb))[:2] for mb in micro}
    assert alone != {bounds(whole)[:2]}


def test_state_records_the_bounds_and_survives_a_checkpoint():
    steps = [off_policy_batch(s, spread=1.0) for s in range(4)]
    fn = bapo_rank.objective().compile()
    assert fn.state_dict() == {"surrogate (bapo)": {"clip_low": 0.6, "clip_high": 1.2, "steps": 0}}
    uninterrupted = []
    for i, b in enumerate(steps):
        out = fn(b)
        uninterrupted.append((bounds(out), out.loss.item()))
        if i == 1:
            saved = fn.state_dict()
    low, high, _ = uninterrupted[1][0]  # metrics are float32; the state holds the float64 bounds
    state = saved["surrogate (bapo)"]
    assert (state["clip_low"], state["clip_high"], state["steps"]) == (pytest.approx(low), pytest.approx(high), 2)

    resumed = bapo_rank.objective().compile()
    resumed.load_state_dict(saved)
    assert resumed.state_dict() == saved
    for b, expected in zip(steps[2:], uninterrupted[2:]):
        out = resumed(b)
        assert (bounds(out), out.loss.item()) == expected
    assert resumed.state_dict() == fn.state_dict()
    assert fn.state_dict()["surrogate (bapo)"]["steps"] == 4


def test_gather_without_update_leaves_the_state():
    fn = bapo_rank.objective().compile()
    before = fn.state_dict()
    fn.gather([off_policy_batch(0)], update_state=False)
    assert fn.state_dict() == before


def test_two_ranks_choose_the_same_bounds_as_one_process():
    results = run_ranks(bapo_rank.run_rank, world=2)

    batch = off_policy_batch(5, spread=1.0)
    fn = bapo_rank.objective().compile()
    whole = fn(batch)
    (whole_grad,) = torch.autograd.grad(whole.loss, batch.logprobs)
    for rank in (0, 1):
        step_value, state, grad = results[rank]
        assert step_value == pytest.approx(bounds(whole))
        assert state == fn.state_dict()
        assert torch.allclose(grad, whole_grad, atol=1e-7)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"lower_start": 0.95, "lower_max": 0.9}, "lower_start"),
        ({"upper_start": 3.5}, "upper_start"),
        ({"dual_clip": 3.0}, "dual_clip"),
        ({"upper_start": 0.9}, "upper_start"),
        ({"search": "fastest"}, "search"),
    ],
)
def test_configuration_is_checked(fields, message):
    with pytest.raises(rlstab.ConfigError, match=message):
        rlstab.load({"surrogate": {"kind": "bapo", **fields}, "aggregation": AGG})


def test_preset_has_the_paper_values():
    s = rlstab.load("bapo").surrogate
    assert (s.target, s.lower_start, s.lower_max, s.lower_step) == (0.4, 0.6, 0.9, 0.02)
    assert (s.upper_start, s.upper_max, s.upper_step, s.search, s.dual_clip) == (1.2, 3.0, 0.05, "paper", None)
