"""pass@k (Chen et al. 2021's unbiased estimator) and the distinct right answers per prompt."""

import pytest
import torch

from rlstab.trainer.passk import measure, pass_at_k, sample_seed
from rlstab.trainer.tasks import CharCodec, Problem, get_task
from rlstab.trainer.warmstart import teacher_forcing_rollout


@pytest.mark.parametrize(
    ("n", "c", "k", "expected"),
    [
        (4, 1, 2, 0.5),  # 1 - C(3, 2) / C(4, 2) = 1 - 3 / 6
        (16, 4, 1, 0.25),  # k = 1 is c / n: 1 - C(12, 1) / C(16, 1) = 1 - 12 / 16
        (5, 0, 3, 0.0),  # no right sample: 1 - C(5, 3) / C(5, 3)
        (5, 4, 2, 1.0),  # n - c = 1 < k = 2: any 2 of the 5 hold a right one
        (6, 2, 3, 0.8),  # 1 - C(4, 3) / C(6, 3) = 1 - 4 / 20
        (16, 1, 4, 0.25),  # 1 - C(15, 4) / C(16, 4) = 1 - 1365 / 1820 = 1 - 0.75
    ],
)
def test_pass_at_k_by_hand(n, c, k, expected):
    assert pass_at_k(n, c, k) == pytest.approx(expected)


@pytest.mark.parametrize(("n", "c", "k"), [(4, 5, 1), (4, -1, 1), (4, 1, 0), (4, 1, 5)])
def test_pass_at_k_refuses_impossible_counts(n, c, k):
    with pytest.raises(ValueError, match="pass@k needs"):
        pass_at_k(n, c, k)


class Scripted:
    """A policy that answers the i-th sampled prompt with ``texts[i]``, in order, whatever the generator."""

    codec = CharCodec()

    def __init__(self, texts):
        self.texts = list(texts)

    def sample(self, prompt_ids, *, max_new_tokens, temperature, generator):
        texts, self.texts = self.texts[: len(prompt_ids)], self.texts[len(prompt_ids) :]
        problems = [Problem(self.codec.decode(ids), "") for ids in prompt_ids]
        return teacher_forcing_rollout(get_task("perm3"), self.codec, problems, texts)


def test_measure_counts_right_samples_and_distinct_right_answers():
    task = get_task("perm3")
    problems = [Problem("471=", "147"), Problem("447=", "447")]
    # Prompt 1: 3 of 4 right, 2 distinct ("147" twice, "714"); prompt 2: 1 of 4 right ("474"), 1 distinct.
    policy = Scripted(["147", "147", "714", "999", "474", "4", "777", "447:"])
    out = measure(policy, task, problems, k=2, n=4, temperature=1.0, generator=torch.Generator(), batch_size=3)
    # pass@2: prompt 1: n - c = 1 < 2 -> 1; prompt 2: 1 - C(3, 2) / C(4, 2) = 1 - 3 / 6 = 0.5; mean 0.75.
    assert out == {"k": 2, "n": 4, "pass_at_k": 0.75, "distinct_correct": 1.5}  # distinct: (2 + 1) / 2


def test_distinct_right_answers_are_told_apart_by_what_the_reward_reads():
    task = get_task("perm3-echo")
    # 3 of 4 right: "147" with two different echoes (one right answer), "714"; "999,471" is wrong.
    policy = Scripted(["147,471", "147,999", "714,471", "999,471"])
    out = measure(policy, task, [Problem("471=", "147")], k=2, n=4, temperature=1.0, generator=torch.Generator())
    # pass@2: n - c = 1 < 2 -> 1; distinct right answers: {"147", "714"} = 2 (the whole responses would be 3)
    assert out == {"k": 2, "n": 4, "pass_at_k": 1.0, "distinct_correct": 2.0}


def test_the_sample_seed_is_apart_from_the_runs_streams():
    assert sample_seed(0, 0) == 1_000_003 and sample_seed(2, 5) == 3_000_014  # 1_000_003 * 3 + 5
    seeds = {sample_seed(s, step) for s in range(5) for step in range(201)}
    assert len(seeds) == 5 * 201 and not seeds & set(range(6))  # the runs' own seeds s and s + 1
