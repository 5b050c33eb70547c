"""Goldilocks: the utility target, epsilon-greedy selection, the teacher's update, its state."""

import math

import pytest
import torch

import rlstab
from rlstab.errors import ConfigError
from rlstab.sampling import Goldilocks, GoldilocksCurriculum, HashedNgrams, select_prompts, utility


def test_utility_is_the_bernoulli_std():
    # sqrt(p (1 - p)): 0 at 0 and 1, 0.5 at 0.5, sqrt(0.25 * 0.75) = 0.4330 at 0.25
    assert utility(torch.tensor([0.0, 0.25, 0.5, 1.0])).tolist() == pytest.approx([0.0, math.sqrt(0.1875), 0.5, 0.0])


def test_greedy_selection_takes_the_highest_predictions():
    predictions = torch.tensor([0.1, 0.4, 0.3, 0.2])
    assert select_prompts(predictions, 2, 0.0, torch.Generator().manual_seed(0)) == [1, 2]


def test_selection_never_repeats_and_explores_with_epsilon_one():
    predictions = torch.tensor([0.5, 0.0, 0.0, 0.0, 0.0, 0.0])
    g = torch.Generator().manual_seed(1)
    picks = [select_prompts(predictions, 3, 1.0, g) for _ in range(300)]
    assert all(len(set(p)) == 3 for p in picks)
    # uniform exploration: candidate 0 is in a random 3 of 6 half the time, not always (greedy would pick it every time)
    share = sum(0 in p for p in picks) / len(picks)
    assert 0.4 < share < 0.6


def test_an_all_equal_pool_is_chosen_from_uniformly():
    # equal predictions, greedy: ties are broken by a random key, so each of 4 candidates is chosen 1/4 of the time
    g = torch.Generator().manual_seed(2)
    counts = torch.zeros(4)
    for _ in range(4000):
        counts[select_prompts(torch.full((4,), 0.25), 1, 0.0, g)[0]] += 1
    # binomial(4000, 1/4): sd = sqrt(4000 * 0.25 * 0.75) = 27.4; 5 sd = 137
    assert (counts - 1000).abs().max() < 137


def test_hashed_ngrams_are_deterministic_and_normalised():
    f = HashedNgrams(dims=4096, ngram=2)
    x = f.features(["ab", "ab", "ba"])
    # grams "1:a", "1:b", "2:ab": three counts of 1 (no collision in 4096 buckets) -> 1 / sqrt(3) each
    assert torch.equal(x[0], x[1])
    assert sorted(x[0][x[0] > 0].tolist()) == pytest.approx([1 / math.sqrt(3)] * 3)
    assert not torch.equal(x[0], x[2])


def test_one_teacher_step_by_hand():
    config = Goldilocks(teacher_steps=1, teacher_lr=0.01, epsilon=0.0, candidates=2)
    teacher = GoldilocksCurriculum(config, seed=0)
    prompts = ["3+4=", "9*9="]
    # w = 0, b = 0: every prediction 0.5 * sigmoid(0) = 0.25
    assert teacher.predict(prompts).tolist() == [0.25, 0.25]
    chosen = teacher.choose(prompts, 1)
    # p = 0.5 -> target 0.5. MSE gradient: 2 (0.25 - 0.5) * 0.5 * sigmoid'(0) = -0.5 * 0.125 = -0.0625 on b,
    # -0.0625 phi_j on w_j. Adam's first step moves each parameter by lr * sign(gradient): b = 0.01, w_j = 0.01 where phi_j > 0.
    metrics = teacher.observe([prompts[chosen[0]]], [0.5])
    phi = config.featuriser.features([prompts[chosen[0]]])[0]
    z = 0.01 + 0.01 * float(phi[phi > 0].sum())
    assert float(teacher.predict([prompts[chosen[0]]])[0]) == pytest.approx(0.5 / (1 + math.exp(-z)), abs=1e-6)
    assert metrics["teacher_mse"] == pytest.approx((0.25 - 0.5) ** 2)
    assert metrics["selected_utility"] == 0.5
    assert metrics["selected_without_signal"] == 0.0


def test_the_teacher_learns_which_prompts_are_half_solved():
    teacher = GoldilocksCurriculum(Goldilocks(teacher_lr=0.05, epsilon=0.0), seed=0)
    half, solved, hopeless = "12+34=", "1+1=", "987*654="
    for _ in range(30):
        teacher.choose([half, solved, hopeless], 3)
        teacher.observe([half, solved, hopeless], [0.5, 1.0, 0.0])
    p = teacher.predict([half, solved, hopeless])
    assert p[0] > p[1] and p[0] > p[2]
    assert teacher.choose([solved, hopeless, half], 1) == [2]


def test_state_round_trip_continues_identically():
    config = Goldilocks(epsilon=0.5)
    a, b = GoldilocksCurriculum(config, seed=3), GoldilocksCurriculum(config, seed=99)
    pool = [f"{i}+{j}=" for i in range(4) for j in range(4)]
    a.choose(pool, 4)
    a.observe(pool[:4], [0.25, 0.5, 0.0, 1.0])
    b.load_state_dict(a.state_dict())
    for _ in range(3):
        assert a.choose(pool, 4) == b.choose(pool, 4)
        assert a.observe(pool[:4], [0.5] * 4) == b.observe(pool[:4], [0.5] * 4)


def test_rates_outside_0_1_are_refused():
    teacher = GoldilocksCurriculum(Goldilocks())
    with pytest.raises(ValueError, match=r"success rates must lie in \[0, 1\]"):
        teacher.observe(["a"], [1.5])


def test_config_errors_name_the_field():
    with pytest.raises(ConfigError, match=r"sampler\.epsilon = 1\.5"):
        rlstab.load({"extends": "goldilocks", "sampler": {"kind": "goldilocks", "epsilon": 1.5}})
