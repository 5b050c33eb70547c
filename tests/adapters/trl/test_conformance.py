"""rlstab presets against TRL 1.16.0's own ``GRPOTrainer._compute_loss``: loss, gradients, metrics.

Both trainers run their real ``_compute_loss`` on identical crafted micro-batches (a tiny Llama's
log-probabilities, old log-probabilities off by noise so every clip branch is hit, advantages of
both signs, ragged completion masks with an empty row), on two copies of the same model.

What TRL 1.16.0 computes (trl/trainer/grpo_trainer.py, ``_compute_loss``), and the rlstab objective
that expresses it:

- grpo, dapo and dr_grpo share one clip rule: ``-min(r A, clip(r, 1 - epsilon, 1 + epsilon_high) A)``
  with ``epsilon = 0.2`` and ``epsilon_high = epsilon`` by default: PPO clip *without* dual-clip.
  ``delta`` (two-sided clip, default None) clamps r at ``delta`` before the min, which for A < 0
  bounds the loss by ``-delta A`` and zeroes the gradient above it: rlstab's ``dual_clip = delta``
  (for A > 0 it changes nothing, the clipped branch is already the min there).
- rlstab's grpo/dapo/dr_grpo presets have dual-clip (3, 10, 3, as veRL and DAPO's scripts), so
  they equal TRL with ``delta`` set to that constant, and TRL's default (``delta=None``) equals
  the preset with ``surrogate.dual_clip: null``.
- The aggregations: TRL's ``grpo`` is seq-mean-token-mean (rlstab's grpo preset is veRL's
  token-mean, so the test overrides it); ``dapo`` is token-mean over the window's valid tokens;
  ``dr_grpo`` is seq-mean-token-sum-norm with ``max_completion_length``.
- ``top_entropy_quantile = 0.2`` on dapo is the 20-entropy preset (quantile over the valid tokens
  of the micro-batch, ``>=`` threshold kept, denominator = all valid tokens).
- loss_type cispo (``epsilon_high`` = the absolute cap, 5.0 recommended), sapo (temperatures
  1.0 / 1.05) and vespo (``vespo_k_pos`` 2, ``vespo_lambda_pos`` 3, ``vespo_k_neg`` 3,
  ``vespo_lambda_neg`` 2) are the cispo, sapo and vespo presets.
- ``importance_sampling_level = "sequence"`` with loss_type grpo is GSPO with its gradient through
  the sequence ratio: the gspo preset (eps 3e-4 / 4e-4, no dual-clip, seq-mean-token-mean).
"""

import pytest
import torch
from accelerate import Accelerator

from trl_tiny import (
    crafted_inputs,
    current_logps,
    last_metrics,
    loss_and_grads,
    make_trainer,
    saved_model,
    trainer_pair,
)

NO_DUAL = {"surrogate": {"dual_clip": None}}
SEQ_MEAN = {"aggregation": {"kind": "seq-mean-token-mean", "count": "valid"}}

CASES = {
    # id: (TRL GRPOConfig fields, rlstab objective)
    "grpo": ({"loss_type": "grpo"}, {"extends": "grpo", **NO_DUAL, **SEQ_MEAN}),
    "grpo+delta3": ({"loss_type": "grpo", "delta": 3.0}, {"extends": "grpo", **SEQ_MEAN}),
    "dapo": ({"loss_type": "dapo", "epsilon_high": 0.28}, {"extends": "dapo", **NO_DUAL}),
    "dapo+delta10": ({"loss_type": "dapo", "epsilon_high": 0.28, "delta": 10.0}, "dapo"),
    "dr_grpo": ({"loss_type": "dr_grpo"}, {"extends": "dr_grpo", **NO_DUAL}),
    "dr_grpo+delta3": ({"loss_type": "dr_grpo", "delta": 3.0}, "dr_grpo"),
    # TRL's GSPO: sequence-level ratio (mean log-ratio over the completion) with the grpo aggregation
    "gspo": (
        {"loss_type": "grpo", "importance_sampling_level": "sequence", "epsilon": 3e-4, "epsilon_high": 4e-4},
        "gspo",
    ),
    # CISPO: REINFORCE with the detached ratio truncated above at epsilon_high (an absolute bound in TRL), dapo's normaliser
    "cispo": ({"loss_type": "cispo", "epsilon_high": 5.0}, "cispo"),
    # SAPO: the soft gate with TRL's default temperatures 1.0 / 1.05, grpo's normaliser
    "sapo": ({"loss_type": "sapo"}, "sapo"),
    # VESPO: -sg(phi(W)) A logp with TRL's default vespo_* parameters, dapo's normaliser (more in test_vespo.py)
    "vespo": ({"loss_type": "vespo"}, "vespo"),
    "20-entropy": (
        {"loss_type": "dapo", "epsilon_high": 0.28, "delta": 10.0, "top_entropy_quantile": 0.2},
        "20-entropy",
    ),
}
# (gradient_accumulation_steps, steps_per_generation, num_items_in_batch or None = the micro-batch's tokens)
ACCUMULATION = {
    "ga1": (1, 1, None),
    "ga2": (2, 2, 57.0),
    "ga4-spg2": (4, 2, 31.0),
}
# Completion lengths for the entropy quantile: 24 valid tokens, so the 0.8-quantile sits at
# position 0.8 * 23 = 18.4, strictly between two order statistics (no tie at the threshold).
ENTROPY_LENGTHS = [0, 3, 7, 5, 2, 7]
# TRL logs no clip_ratio/* for cispo, sapo and vespo, and averages gspo's over completions (rlstab: over tokens)
OWN_METRICS = ("gspo", "cispo", "sapo", "vespo")
TRL_METRICS = [
    "entropy",
    "clip_ratio/low_mean",
    "clip_ratio/high_mean",
    "clip_ratio/region_mean",
    "clip_ratio/low_min",
    "clip_ratio/high_max",
]


def config(case: str, accumulation: str) -> tuple[dict, object, dict]:
    trl_fields, objective = CASES[case]
    ga, spg, _ = ACCUMULATION[accumulation]
    shared = {"gradient_accumulation_steps": ga, "steps_per_generation": spg}
    if case.startswith("dr_grpo"):  # the dr_grpo preset's advantages are not std-normalised: say so to TRL
        shared["scale_rewards"] = "none"
    return {**trl_fields, **shared}, objective, shared


def compare(theirs, ours, inputs, ga, training=True, metrics=TRL_METRICS):
    loss, grads = loss_and_grads(theirs, inputs, ga, training)
    our_loss, our_grads = loss_and_grads(ours, inputs, ga, training)
    torch.testing.assert_close(our_loss, loss, rtol=1e-6, atol=1e-6)
    assert grads.keys() == our_grads.keys()
    for name in grads:
        torch.testing.assert_close(our_grads[name], grads[name], rtol=1e-6, atol=1e-6, msg=name)
    mode = "train" if training else "eval"
    theirs_m, ours_m = last_metrics(theirs, mode), last_metrics(ours, mode)
    for name in metrics:
        assert ours_m[name] == pytest.approx(theirs_m[name], abs=1e-6), name
    return loss


@pytest.mark.parametrize("accumulation", list(ACCUMULATION))
@pytest.mark.parametrize("case", list(CASES))
def test_preset_matches_trl_loss_type(tmp_path, case, accumulation):
    trl_fields, objective, ours_fields = config(case, accumulation)
    theirs, ours = trainer_pair(tmp_path, objective, trl_fields, ours_fields)
    ga, _, items = ACCUMULATION[accumulation]
    lengths = ENTROPY_LENGTHS if case == "20-entropy" else None
    for seed in range(3):
        inputs = crafted_inputs(theirs, seed, lengths=lengths, num_items_in_batch=items)
        loss = compare(theirs, ours, inputs, ga, metrics=["entropy"] if case in OWN_METRICS else TRL_METRICS)
        assert loss.abs() > 1e-3  # a real loss, not two zeros


@pytest.mark.parametrize("case", ["grpo", "dapo+delta10", "dr_grpo+delta3", "20-entropy"])
def test_process_count_enters_as_in_trl(tmp_path, monkeypatch, case):
    """With 2 processes TRL divides dapo's N by P and DDP averages: the same scaling in both trainers.

    The process count is what ``accelerator.num_processes`` reports; both trainers read that
    property (collectives stay single-process, so each trainer sees only its own micro-batch).
    """
    trl_fields, objective, ours_fields = config(case, "ga2")
    theirs, ours = trainer_pair(tmp_path, objective, trl_fields, ours_fields)
    monkeypatch.setattr(Accelerator, "num_processes", property(lambda self: 2))
    assert theirs.accelerator.num_processes == ours.accelerator.num_processes == 2
    lengths = ENTROPY_LENGTHS if case == "20-entropy" else None
    inputs = crafted_inputs(theirs, 5, lengths=lengths, num_items_in_batch=80.0)
    compare(theirs, ours, inputs, 2)


@pytest.mark.parametrize("case", ["grpo", "dapo+delta10", "dr_grpo+delta3", "20-entropy"])
def test_evaluation_loss_matches_trl(tmp_path, case):
    """In eval TRL neither accumulates nor rescales num_items_in_batch."""
    trl_fields, objective, ours_fields = config(case, "ga4-spg2")
    theirs, ours = trainer_pair(tmp_path, objective, trl_fields, ours_fields)
    lengths = ENTROPY_LENGTHS if case == "20-entropy" else None
    inputs = crafted_inputs(theirs, 7, lengths=lengths, num_items_in_batch=40.0)
    with torch.no_grad():
        compare(theirs, ours, inputs, 4, training=False)


def test_the_inputs_hit_every_clip_branch(tmp_path):
    """The crafted micro-batches are not trivially inside the clip range."""
    _, ours = trainer_pair(tmp_path, "dapo", {}, {})
    inputs = crafted_inputs(ours, 0)
    loss_and_grads(ours, inputs)
    m = last_metrics(ours)
    assert m["rlstab/clip/high_fraction"] > 0
    assert m["rlstab/clip/low_fraction"] > 0
    _, ours = trainer_pair(tmp_path / "grpo", "grpo", {}, {})
    loss_and_grads(ours, crafted_inputs(ours, 0))
    assert last_metrics(ours)["rlstab/clip/dual_fraction"] > 0  # ratios above c = 3 with A < 0


def test_dual_clip_is_what_distinguishes_the_presets_from_trls_default(tmp_path):
    """The dapo preset (dual-clip 10) differs from TRL's dapo without delta: the comparison can fail."""
    theirs, ours = trainer_pair(tmp_path, "grpo", {"loss_type": "dapo"}, {})
    inputs = crafted_inputs(theirs, 0, spread=2.0)  # ratios far above 3 with A < 0
    loss, _ = loss_and_grads(theirs, inputs)
    our_loss, _ = loss_and_grads(ours, inputs)
    assert (our_loss - loss).abs() > 1e-3


KL_CASES = {
    "dapo+kl": ({"loss_type": "dapo", "epsilon_high": 0.28, "delta": 10.0}, "dapo"),
    "grpo+kl": ({"loss_type": "grpo", "delta": 3.0}, {"extends": "grpo", **SEQ_MEAN}),
    "20-entropy+kl": (
        {"loss_type": "dapo", "epsilon_high": 0.28, "delta": 10.0, "top_entropy_quantile": 0.2},
        "20-entropy",
    ),
}


@pytest.mark.parametrize("case", list(KL_CASES))
def test_kl_regulariser_matches_trl_beta(tmp_path, case):
    """TRL's KL term (beta, k3, use_bias_correction_kl=False) is rlstab's kl regulariser with coef = beta.

    TRL adds ``beta * k3`` to every masked token's loss after its entropy mask and normalises it
    like the policy term; rlstab's regularisers average over every valid token with the
    objective's aggregation: the same number. The reference model is built from a saved copy.
    """
    trl_fields, preset = KL_CASES[case]
    objective = preset if isinstance(preset, dict) else {"extends": preset}
    objective = {**objective, "regularisers": [{"kind": "kl", "coef": 0.04, "estimator": "k3"}]}
    kl = {
        "beta": 0.04,
        "use_bias_correction_kl": False,
        "gradient_accumulation_steps": 2,
        "steps_per_generation": 2,
    }
    path = saved_model(tmp_path / "model")
    theirs = make_trainer(tmp_path / "trl", None, model=path, **trl_fields, **kl)
    ours = make_trainer(tmp_path / "rlstab", objective, model=path, **kl)
    lengths = ENTROPY_LENGTHS if "entropy" in case else None
    for seed in range(2):
        inputs = crafted_inputs(theirs, seed, lengths=lengths, num_items_in_batch=50.0)
        g = torch.Generator().manual_seed(100 + seed)
        # |ref - logp| stays below 2.6, where rlstab's k3 reaches its clamp at 10 (veRL's low_var_kl); TRL's is unclamped
        noise = (0.5 * torch.randn(6, 7, generator=g)).clamp(-2.0, 2.0)
        inputs["ref_per_token_logps"] = current_logps(theirs, inputs) + noise
        compare(theirs, ours, inputs, 2)
        assert last_metrics(ours)["kl"] == pytest.approx(last_metrics(theirs)["kl"], abs=1e-6)
        assert last_metrics(ours)["kl"] > 0.01


def test_entropy_bonus_regulariser_matches_trl_entropy_coef_on_one_micro_batch(tmp_path):
    """rlstab's entropy_bonus gets TRL's entropies with their gradient.

    TRL's bonus is each micro-batch's mean token entropy divided by GA; rlstab's is aggregated over
    the step like the policy term (token-mean: sum over the step's tokens / their number). With one
    micro-batch per step (GA = 1, spg = 1, one process) both are -coef * mean(H) over the micro-batch.
    """
    theirs, ours = trainer_pair(
        tmp_path,
        {"extends": "dapo", "regularisers": [{"kind": "entropy_bonus", "coef": 0.05}]},
        {"loss_type": "dapo", "epsilon_high": 0.28, "delta": 10.0, "entropy_coef": 0.05},
    )
    for seed in range(2):
        inputs = crafted_inputs(theirs, seed)
        compare(theirs, ours, inputs, 1)
    assert abs(last_metrics(ours)["rlstab/loss/entropy_bonus"]) > 1.0  # -mean(H), about -5 nats


@pytest.mark.parametrize("shape", ["token", "sequence"])
def test_vllm_importance_sampling_ratio_is_applied_where_trl_applies_it(tmp_path, shape):
    """TRL multiplies each token's policy loss by ``importance_sampling_ratio`` when ``use_vllm`` and
    ``vllm_importance_sampling_correction`` are on: ``[B, T]`` in token_* modes, ``[B, 1]`` in sequence_* modes.

    vLLM does not run on CPU, so both trainers are built without it and then given the two
    attributes TRL sets from those flags; TRL's ``_compute_loss`` runs unchanged.
    """
    theirs, ours = trainer_pair(tmp_path, "dapo", {"loss_type": "dapo", "epsilon_high": 0.28, "delta": 10.0})
    for trainer in (theirs, ours):
        trainer.use_vllm = True
        trainer.vllm_importance_sampling_correction = True
    g = torch.Generator().manual_seed(3)
    inputs = crafted_inputs(theirs, 3)
    size = (6, 7) if shape == "token" else (6, 1)
    inputs["importance_sampling_ratio"] = torch.rand(size, generator=g) * 2.0
    loss = compare(theirs, ours, inputs, 1)
    inputs.pop("importance_sampling_ratio")
    for trainer in (theirs, ours):
        trainer.use_vllm = False
    unweighted = compare(theirs, ours, inputs, 1)
    assert (loss - unweighted).abs() > 1e-3  # the weights did change the loss
