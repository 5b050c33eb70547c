"""DEEP-GRPO's rollout side: segments, candidate pivots, their utility, P_phi, the explorer."""

import pytest
import torch

from rlstab.exploration import DeepGRPO, RecoverabilityModel, pivot_probabilities, segment_ends
from rlstab.exploration.deep_grpo import PivotExplorer, candidate_pivots


def test_segments_end_after_sentences_or_every_n_tokens():
    tokens = ["1", ".", "2", ".", " ", "x"]
    assert segment_ends(tokens) == [2, 4, 6]
    assert segment_ends(tokens, "tokens", 2) == [2, 4, 6]
    assert segment_ends(tokens[:5], "tokens", 2) == [2, 4, 5]
    assert segment_ends(["a", "b."]) == [2]  # a "." on the last token ends the response, not a segment
    assert segment_ends([]) == []


def test_candidates_are_the_root_and_every_segment_end_but_the_last():
    # chain [root, s1, s2, s3]: T = 4; candidates i = 0, 1, 2 continue after 0, 2, 4 tokens at depth 1/4, 2/4, 3/4
    assert candidate_pivots([2, 4, 6]) == ([0, 2, 4], [0.25, 0.5, 0.75])
    assert candidate_pivots([3]) == ([0], [0.5])


def test_pivot_probabilities_before_p_phi_is_fitted():
    # P = 1, gamma = 2: weights (1/16, 4/16, 9/16) -> (1, 4, 9) / 14
    p = pivot_probabilities([0.25, 0.5, 0.75], RecoverabilityModel(), 2.0)
    assert p.tolist() == pytest.approx([1 / 14, 4 / 14, 9 / 14])


def test_pivot_probabilities_multiply_p_phi():
    model = RecoverabilityModel()
    model.coef = (-4.0, 2.0)  # P(d) = sigmoid(2 - 4 d): 0.7311 at 0.25, 0.2689 at 0.75
    p = pivot_probabilities([0.25, 0.75], model, 1.0)
    # Q = (0.7311 * 0.25, 0.2689 * 0.75) = (0.18278, 0.20167) -> normalised
    q = torch.tensor([torch.sigmoid(torch.tensor(1.0)).item() * 0.25, torch.sigmoid(torch.tensor(-1.0)).item() * 0.75])
    assert p.tolist() == pytest.approx((q / q.sum()).tolist())


def test_p_phi_waits_for_both_labels_then_fits_the_penalised_optimum():
    model = RecoverabilityModel(min_samples=10)
    for _ in range(11):
        model.add(0.5, True)
    model.refit()
    assert model.coef is None  # one label only: P = 1
    for d, y in [(0.1, 1), (0.2, 1), (0.3, 1), (0.4, 0), (0.6, 1), (0.7, 0), (0.8, 0), (0.9, 0)]:
        model.add(d, bool(y))
    model.refit()
    w, b = model.coef
    assert w < 0  # deeper pivots recover less often here
    # the optimum of sum logloss + w^2 / 2 (C = 1, intercept free): its gradient vanishes
    data = torch.tensor(list(model.pairs), dtype=torch.float64)
    p = torch.sigmoid(w * data[:, 0] + b)
    assert float(((p - data[:, 1]) * data[:, 0]).sum() + w) == pytest.approx(0.0, abs=1e-9)
    assert float((p - data[:, 1]).sum()) == pytest.approx(0.0, abs=1e-9)


def test_explorer_branches_failed_responses_only():
    explorer = PivotExplorer(DeepGRPO(segmentation="tokens", tokens_per_segment=1, depth_bias=100.0), seed=0)
    responses = [["1", "2", "3"], ["4", "5"], ["6"]]
    pivots = explorer.choose(responses, [1.0, 0.0, 0.0])
    # response 0 succeeded; response 1 (T = 3): gamma = 100 puts all the weight on its deepest candidate, after 1 token
    # at depth 2/3; response 2 has one token: its only candidate is the root, at depth 1/2
    assert [(p.row, p.prefix) for p in pivots] == [(1, 1), (2, 0)]
    assert [p.depth for p in pivots] == pytest.approx([2 / 3, 1 / 2])
    metrics = explorer.observe(pivots, torch.tensor([[0.0, 1.0], [0.0, 0.0]]))
    # 1 of 4 branches succeeded; 1 of 2 pivots recovered
    assert metrics["branch_success"] == 0.25 and metrics["pivot_recovered"] == 0.5
    assert list(explorer.model.pairs) == [(2 / 3, 1.0), (0.5, 0.0)]


def test_explorer_state_round_trip():
    config = DeepGRPO(segmentation="tokens", tokens_per_segment=1, min_samples=1)
    a, b = PivotExplorer(config, seed=0), PivotExplorer(config, seed=5)
    responses = [list("1234")] * 6
    a.observe(a.choose(responses, [0.0] * 6), torch.tensor([[1.0], [0.0]] * 3))
    b.load_state_dict(a.state_dict())
    assert a.choose(responses, [0.0] * 6) == b.choose(responses, [0.0] * 6)
