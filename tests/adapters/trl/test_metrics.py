"""rlstab's metrics in TRL's ``_metrics``: ``rlstab/<name>``, and TRL's names (entropy, clip ratios, kl) as TRL computes them.

One process: the real trainer's accelerator reduces over itself, so the values are the micro-batch's.
"""

import math

import pytest
import torch

import rlstab
from rlstab.adapters.trl.metrics import (
    _kl_per_token,
    _nan_extreme,
    _per_completion_clip_fractions,
    log_metrics,
)
from rlstab.batch import TokenBatch

from trl_tiny import make_trainer


@pytest.fixture(scope="module")
def trainer(tmp_path_factory):
    return make_trainer(tmp_path_factory.mktemp("trl_metrics"), "grpo")


def clipped_batch(**fields) -> TokenBatch:
    # Row 0 (A = +1): ratios 1.5, 1.0 -> one token above 1 + 0.2; row 1 (A = -1): ratios 0.5, 1.0 -> one below 1 - 0.2.
    logprobs = torch.log(torch.tensor([[0.6, 0.5], [0.2, 0.5]]))
    old = torch.log(torch.tensor([[0.4, 0.5], [0.4, 0.5]]))
    return TokenBatch(logprobs=logprobs, old_logprobs=old, response_mask=torch.ones(2, 2, dtype=torch.bool),
                      advantages=torch.tensor([1.0, -1.0]), **fields)


def test_per_completion_clip_fractions_count_each_side_with_its_advantage_sign():
    low, high = _per_completion_clip_fractions(clipped_batch(), rlstab.load("grpo"))
    # row 0: 0 of 2 below, 1 of 2 above; row 1: 1 of 2 below, 0 above
    assert low.tolist() == [0.0, 0.5] and high.tolist() == [0.5, 0.0]


def test_an_empty_completion_has_nan_fractions_and_the_extremes_skip_it():
    batch = TokenBatch(logprobs=torch.zeros(2, 2), response_mask=torch.tensor([[True, False], [False, False]]),
                       advantages=torch.tensor([1.0, 1.0]))
    low, high = _per_completion_clip_fractions(batch, rlstab.load("grpo"))
    assert low[0] == 0.0 and math.isnan(low[1]) and math.isnan(high[1])
    assert _nan_extreme(torch.tensor([float("nan"), 0.25, 0.5]), torch.min) == 0.25
    assert math.isnan(_nan_extreme(torch.tensor([float("nan")]), torch.max))


def test_kl_is_the_valid_token_mean_of_trls_k3_and_only_with_a_kl_regulariser():
    # delta = ref - logp = ln 2 on one token, 0 on two; k3 = e^d - d - 1: 1 - ln 2, then 0, 0; the padding token ignored
    logprobs = torch.log(torch.tensor([[0.25, 0.5], [0.5, 0.9]]))
    ref = torch.log(torch.tensor([[0.5, 0.5], [0.5, 0.1]]))
    batch = TokenBatch(logprobs=logprobs, ref_logprobs=ref, response_mask=torch.tensor([[True, True], [True, False]]),
                       advantages=torch.ones(2))
    with_kl = rlstab.load({"extends": "grpo", "regularisers": [{"kind": "kl", "coef": 0.1}]})
    assert _kl_per_token(batch, with_kl) == pytest.approx((1 - math.log(2)) / 3)
    assert _kl_per_token(batch, rlstab.load("grpo")) is None


def test_log_metrics_appends_rlstab_and_trl_names(trainer):
    objective = trainer.rlstab_objective
    batch = clipped_batch(entropy=torch.tensor([[0.1, 0.3], [0.5, 0.7]]))
    out = trainer.rlstab_compiled(batch)
    trainer._metrics["train"].clear()
    log_metrics(trainer, "train", out, batch, objective)
    logged = {name: values for name, values in trainer._metrics["train"].items()}
    assert all(len(values) == 1 for values in logged.values())  # one value per micro-batch
    assert logged["rlstab/tokens/valid"] == [4.0]
    assert logged["rlstab/clip/high_fraction"] == [0.25] and logged["rlstab/clip/low_fraction"] == [0.25]
    assert "rlstab/loss" not in logged
    # TRL's names: entropy (0.1 + 0.3 + 0.5 + 0.7) / 4 = 0.4; clip 1/4 each side, region 1/2; per completion min/max
    assert logged["entropy"] == [pytest.approx(0.4)]
    assert logged["clip_ratio/low_mean"] == [0.25] and logged["clip_ratio/high_mean"] == [0.25]
    assert logged["clip_ratio/region_mean"] == [0.5]
    assert logged["clip_ratio/low_min"] == [0.0] and logged["clip_ratio/high_max"] == [0.5]
    assert "kl" not in logged  # grpo has no kl regulariser
