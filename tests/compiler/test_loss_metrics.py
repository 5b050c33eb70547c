"""The loss's own diagnostics, hand-computed: each mask's silenced tokens by advantage sign, and the
trainer/inference mismatch of an objective that reads the rollout's log-probabilities."""

import math

import pytest
import torch

import rlstab

# Two responses of 3 tokens (the last of row 1 padding). Trainer (old) and inference probabilities:
TRAIN = [[0.5, 0.2, 0.9], [0.4, 0.1, 0.3]]
INFER = [[0.25, 0.2, 0.3], [0.5, 0.4, 0.9]]
MASK = [[True, True, True], [True, True, False]]


def batch(advantages):
    old = torch.tensor(TRAIN).log()
    return rlstab.TokenBatch(logprobs=old.clone(), old_logprobs=old, rollout_logprobs=torch.tensor(INFER).log(),
                             response_mask=torch.tensor(MASK), advantages=torch.tensor(advantages))


def test_the_mismatch_of_an_objective_that_reads_the_rollout():
    # ratios pi_train/pi_infer on the 5 valid tokens: 2, 1, 3, 0.8, 0.25 (padding's 1/3 left out).
    # k1: mean of -log r = -(ln 2 + 0 + ln 3 + ln 0.8 + ln 0.25) / 5 = -(0.693147 + 1.098612 - 0.223144 - 1.386294) / 5
    #     = -0.182322 / 5 = -0.0364643
    # k3: mean of r - 1 - log r = (0.306853 + 0 + 0.901388 + 0.023144 + 0.636294) / 5 = 1.867679 / 5 = 0.3735358
    out = rlstab.load("tis").compile()(batch([1.0, -1.0]))
    assert out.metrics["mismatch/kl_k1"] == pytest.approx(-0.0364643, abs=1e-6)
    assert out.metrics["mismatch/kl_k3"] == pytest.approx(0.3735358, abs=1e-6)
    # before tis's truncation at 2: the extremes are 0.25 and 3
    assert (out.metrics["mismatch/ratio_min"], out.metrics["mismatch/ratio_max"]) == pytest.approx((0.25, 3.0))
    for name, kind in (("mismatch/kl_k1", "token_mean"), ("mismatch/ratio_min", "min"), ("mismatch/ratio_max", "max")):
        assert out.metrics.combines(name) == kind


def test_no_mismatch_metrics_without_the_rollout():
    out = rlstab.load("grpo").compile()(batch([1.0, -1.0]))
    assert not [name for name in out.metrics if name.startswith("mismatch/")]


@pytest.mark.parametrize("rows", [0, 2])
def test_a_micro_batch_without_a_valid_token_reports_ratio_extremes_of_one(rows):
    # no row at all, or two rows of padding holding far-off ratios: finite placeholders, which combine leaves out
    empty = rlstab.TokenBatch(logprobs=torch.zeros(rows, 3), old_logprobs=torch.zeros(rows, 3),
                              rollout_logprobs=torch.full((rows, 3), -5.0), response_mask=torch.zeros(rows, 3, dtype=torch.bool),
                              advantages=torch.zeros(rows))
    out = rlstab.load("tis").compile()(empty)
    assert (out.metrics["mismatch/ratio_min"], out.metrics["mismatch/ratio_max"]) == (1.0, 1.0)
    assert all(math.isfinite(v) for v in out.metrics.values())


def test_each_mask_splits_its_silenced_tokens_by_the_advantage_sign():
    # icepop [0.5, 5] silences the ratios 0.25 (row 1, A = -1); a token rejection k1 in [1/1.5, 1.5] the ratios 2, 3
    # (row 0, A = +1) and 0.25; rows' advantages +1 and -1, then 0 for row 1: a zero advantage is neither sign.
    objective = {"extends": "grpo", "masks": [{"kind": "icepop"}, {"kind": "rollout_rejection", "high": 1.5, "rejected": "masked"}]}
    loss_fn = rlstab.load(objective).compile()
    m = loss_fn(batch([1.0, -1.0])).metrics
    assert (m["mask/icepop/silenced"], m["mask/icepop/silenced_positive"], m["mask/icepop/silenced_negative"]) == (1, 0, 1)
    assert (m["mask/rollout_rejection/silenced"], m["mask/rollout_rejection/silenced_positive"],
            m["mask/rollout_rejection/silenced_negative"]) == (3, 2, 1)
    m = loss_fn(batch([1.0, 0.0])).metrics
    assert (m["mask/rollout_rejection/silenced_positive"], m["mask/rollout_rejection/silenced_negative"]) == (2, 0)


def test_a_shadow_mask_splits_its_silenced_tokens_too():
    # S2T-like shadow rule on probability alone (expression): silence A > 0 and p < 0.3: row 0's 0.2 (A = +1)
    objective = {"extends": "grpo", "shadow_masks": [{"kind": "expression", "silence": "advantage > 0 and probability < 0.3"}]}
    m = rlstab.load(objective).compile()(batch([1.0, -1.0])).metrics
    assert (m["shadow/expression/silenced"], m["shadow/expression/silenced_positive"],
            m["shadow/expression/silenced_negative"]) == (1, 1, 0)
