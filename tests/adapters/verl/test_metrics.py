"""rlstab's metrics through veRL's own reduction of a step: each combines as ``Metrics.combines`` declares.

Two data-parallel ranks of two micro-batches each, through veRL's real ``ppo_loss`` (with veRL's
global counts, as its trainer passes them), merged as veRL's engine merges them: each rank's
micro-batches with ``append_to_dict``, the ranks with ``Metric.aggregate_dp``
(``TrainingWorker.train_mini_batch``, verl 0.9.1). Hand-computed values.
"""

import pytest
import torch
from verl.utils.metric import Metric
from verl.utils.py_functional import append_to_dict
from verl.workers.utils import losses

from verl_batches import actor_config, micro_batch

# Micro-batch A: row 0 (A = +1) has token 1 at p = 0.001 < tau_p = 0.002, entropy 0.1; row 1 has A = -1.
# 7 valid tokens; entropies 0.5 0.1 0.6 0.7 | 0.2 0.3 0.4: Q_0.8 = 0.58 (tests/adapters/verl/test_ppo_loss.py),
# 0.1 < 0.58: S2T silences 1 token, keeps 6.
A = (
    torch.log(torch.tensor([[0.5, 0.001, 0.4, 0.3], [0.2, 0.001, 0.6, 0.0]])),
    torch.tensor([[0.5, 0.1, 0.6, 0.7], [0.2, 0.3, 0.4, 0.0]]),
    torch.tensor([[1.0] * 4, [-1.0] * 4]), [4, 3], [2, 3],
)
# Micro-batch B: one row (A = +1), 4 valid tokens; entropies sorted 0.5 0.6 0.7 0.9: Q_0.8 at 0.8 * 3 = 2.4,
# 0.7 + 0.4 * 0.2 = 0.78; the p = 0.001 token has entropy 0.9 >= 0.78: kept. Silences 0, keeps 4.
B = (
    torch.log(torch.tensor([[0.5, 0.001, 0.4, 0.3]])),
    torch.tensor([[0.5, 0.9, 0.6, 0.7]]),
    torch.tensor([[1.0] * 4]), [4], [2],
)
# The step: rank 0 runs A then B, rank 1 runs B then A. veRL's counts over both ranks: 22 tokens, 6 responses.
RANKS = [(A, B), (B, A)]


def step_metrics() -> dict[str, float]:
    config = actor_config("stapo", calculate_entropy=True)
    per_rank = []
    for micro_batches in RANKS:
        merged = {}
        for logprobs, entropy, advantages, lengths, prompts in micro_batches:
            model_output, data, _, _ = micro_batch(
                logprobs, entropy, advantages, lengths, prompts, dp_size=2, batch_num_tokens=22, global_batch_size=6
            )
            _, metrics = losses.ppo_loss(config=config, model_output=model_output, data=data, dp_group=None)
            append_to_dict(merged, metrics)  # veRL's engine: one Metric per name, a value per micro-batch
        per_rank.append(merged)
    return {
        name: Metric.aggregate_dp([rank[name] for rank in per_rank])
        for name, metric in per_rank[0].items() if isinstance(metric, Metric)
    }


def test_counts_add_up_over_the_micro_batches_and_ranks():
    m = step_metrics()
    # S2T silences 1 (A) + 0 (B) + 0 (B) + 1 (A) = 2 tokens of the step (veRL's mean would say 0.5).
    assert m["actor/rlstab/mask/s2t/silenced"] == pytest.approx(2.0)
    assert m["actor/rlstab/mask/s2t/kept"] == pytest.approx(6 + 4 + 4 + 6)
    assert m["actor/rlstab/tokens/valid"] == pytest.approx(7 + 4 + 4 + 7)  # veRL's count: 22 (its mean: 5.5)


def test_fractions_are_weighted_by_tokens():
    m = step_metrics()
    # kept / valid over the step: 20 / 22 = 10/11 (the mean of the micro-batches' fractions: (6/7 + 1 + 1 + 6/7) / 4 = 13/14).
    assert m["actor/rlstab/mask/s2t/kept_fraction"] == pytest.approx(10 / 11)
    assert m["actor/rlstab/tokens/kept_fraction"] == pytest.approx(10 / 11)


def test_step_values_and_the_loss_read_as_veRL_reads_them():
    m = step_metrics()
    # Each micro-batch its own threshold (step_statistics=local): the mean of 0.58, 0.78, 0.78, 0.58.
    assert m["actor/rlstab/mask/s2t/entropy_threshold"] == pytest.approx(0.68)
    assert m["actor/rlstab/step/tokens_valid"] == pytest.approx(22.0)
    # The policy term, already multiplied by the ranks' number on each rank, reads as veRL's own actor/pg_loss.
    assert m["actor/rlstab/loss/policy"] == pytest.approx(m["actor/pg_loss"], abs=1e-7)


@pytest.mark.parametrize("info", [{}, {"dp_size": 2, "batch_num_tokens": 10, "global_batch_size": 2}])
def test_extremes_reduce_as_veRL_min_and_max(info):
    """A ``min``/``max`` metric becomes veRL's MIN/MAX, with or without the step's counts: the extreme over
    every micro-batch of every rank (here two ranks of one micro-batch each)."""
    from rlstab.adapters.verl.metrics import step_combined
    from rlstab.metrics import Metrics

    def rank(lo, hi):
        names = ["tokens/valid", "step/tokens_valid", "mismatch/ratio_min", "mismatch/ratio_max"]
        return step_combined(Metrics(names, [5.0, 10.0, lo, hi], kinds=["sum", "step", "min", "max"]), info)

    ranks = [rank(0.5, 2.0), rank(0.25, 1.5)]
    name = "actor/rlstab/mismatch/ratio_min"
    assert Metric.aggregate_dp([r[name] for r in ranks]) == 0.25
    assert Metric.aggregate_dp([r["actor/rlstab/mismatch/ratio_max"] for r in ranks]) == 2.0
