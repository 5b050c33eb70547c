"""TRL 1.16's second-wave loss options against rlstab's components, on TRL's own ``GRPOTrainer._compute_loss``.

Each case runs TRL's real ``_compute_loss`` with the ``GRPOConfig`` flag and rlstab's trainer with
the objective that expresses it, on identical crafted micro-batches (a tiny Llama's
log-probabilities; old log-probabilities off by noise so every clip branch is hit; advantages of
both signs; ragged completion masks with an empty row), and compares the loss and every
parameter's gradient at 1e-6:

- ``loss_type="luspo"`` (``trl/trainer/grpo_trainer.py``, ``_compute_loss``:
  ``(per_token_loss * mask).sum(-1).mean()``): the ``luspo`` preset (GSPO + ``seq-mean-token-sum``);
  with ``importance_sampling_level="token"``: ``ppo_clip`` + ``seq-mean-token-sum``.
- ``loss_type="bnpo"`` (``sum / mask.sum()`` of the micro-batch, divided by GA): ``token-mean``
  over valid tokens, exact over the step in rlstab; the two agree when every micro-batch of the
  window has the window's mean token count (always with GA = 1).
- ``delta`` (two-sided clipping; ``coef_1 = clamp(coef_1, max=delta)``): ``ppo_clip``'s ``delta``,
  also below ``1 + epsilon_high`` where it is not dual-clip.
- ``off_policy_mask_threshold`` (``get_off_policy_mask``): the ``off_policy_sequence`` mask, on
  ``old_per_token_logps`` without vLLM (``behaviour: old``) and on vLLM's
  ``sampling_per_token_logps`` (``behaviour: rollout``, the ``dsv32_mask`` preset).
- ``use_adaptive_entropy``: the ``adaptive_entropy`` regulariser (``measure: entropy``,
  ``boundary: at_or_below``, ``first_step: off``: TRL's rule), loss, gradients and the
  coefficient's trajectory over several optimizer steps.
- ``vllm_importance_sampling_mode`` x ``clip_min``: ``tis`` (+ ``icepop`` / ``rollout_rejection``
  for the ``*_mask`` modes). TRL computes the ratio in ``_generate_and_score_completions``, which
  needs vLLM; the test computes it by TRL's documented rule (the per-token or summed log-ratio
  ``old - sampling`` on the loss mask, NaN as 0, then clamped or zeroed outside
  ``[clip_min, clip_max]``) and hands it to TRL's ``_compute_loss`` as ``importance_sampling_ratio``;
  rlstab gets ``sampling_per_token_logps`` and computes its weights itself.

vLLM does not run on CPU, so where a case needs ``use_vllm`` both trainers are built without it
and given the attributes TRL sets from those flags; rlstab's objective that reads
``rollout_logprobs`` is set after the trainer is built (its config check refuses it without vLLM).
"""

import math

import pytest
import torch

import rlstab

from trl_tiny import crafted_inputs, current_logps, last_metrics, loss_and_grads, trainer_pair

NO_DUAL = {"surrogate": {"dual_clip": None}}
DAPO = {"loss_type": "dapo", "epsilon_high": 0.28}


def compare(theirs, ours, inputs, ga=1):
    loss, grads = loss_and_grads(theirs, inputs, ga)
    our_loss, our_grads = loss_and_grads(ours, inputs, ga)
    torch.testing.assert_close(our_loss, loss, rtol=1e-6, atol=1e-6)
    assert grads.keys() == our_grads.keys()
    for name in grads:
        torch.testing.assert_close(our_grads[name], grads[name], rtol=1e-6, atol=1e-6, msg=name)
    return loss


def with_objective(trainer, objective):
    """Swap the rlstab trainer's objective after construction (one that reads what only vLLM supplies)."""
    trainer.rlstab_objective = rlstab.load(objective)
    trainer.rlstab_compiled = trainer.rlstab_objective.compile()


def with_vllm(theirs, ours, correction: bool):
    """The attributes TRL sets from use_vllm / vllm_importance_sampling_correction (vLLM itself is not needed)."""
    theirs.use_vllm = ours.use_vllm = True
    theirs.vllm_importance_sampling_correction = correction
    ours.vllm_importance_sampling_correction = False  # rlstab's objective does the correction itself


def sampling_logps(inputs, seed: int, spread: float = 0.4, offset: float = 0.0, nan_at=(2, 0)) -> torch.Tensor:
    """vLLM's log-probabilities: the old ones plus ``offset`` and noise, NaN on one valid token (one vLLM could not score)."""
    g = torch.Generator().manual_seed(1000 + seed)
    old = inputs["old_per_token_logps"]
    sampled = old + offset + spread * torch.randn(old.shape, generator=g)
    if nan_at is not None and inputs["completion_mask"][nan_at]:
        sampled[nan_at] = math.nan
    return sampled


# ---------------------------------------------------------------- luspo, bnpo, delta

ACCUMULATION = {"ga1": (1, 1, None), "ga2": (2, 2, 57.0), "ga4-spg2": (4, 2, 31.0)}

CASES = {
    # id: (TRL GRPOConfig fields, rlstab objective)
    "luspo": (
        {"loss_type": "luspo", "importance_sampling_level": "sequence", "epsilon": 3e-4, "epsilon_high": 4e-4},
        "luspo",
    ),
    "luspo-wide-clip": (  # a clip range the crafted ratios fall inside and outside of: gradients flow
        {"loss_type": "luspo", "importance_sampling_level": "sequence", "epsilon": 0.2, "epsilon_high": 0.28},
        {"extends": "luspo", "surrogate": {"eps_low": 0.2, "eps_high": 0.28}},
    ),
    "luspo-token-level": (
        {"loss_type": "luspo", "epsilon_high": 0.28},
        {"extends": "dapo", **NO_DUAL, "aggregation": {"kind": "seq-mean-token-sum", "count": "valid"}},
    ),
    "dapo+delta1.1": ({**DAPO, "delta": 1.1}, {"extends": "dapo", "surrogate": {"dual_clip": None, "delta": 1.1}}),
    "dapo+delta1.5": ({**DAPO, "delta": 1.5}, {"extends": "dapo", "surrogate": {"dual_clip": None, "delta": 1.5}}),
    "grpo+delta0.9": (
        {"loss_type": "grpo", "delta": 0.9},
        {"extends": "grpo", "surrogate": {"dual_clip": None, "delta": 0.9},
         "aggregation": {"kind": "seq-mean-token-mean", "count": "valid"}},
    ),
}


def config(case, accumulation):
    trl_fields, objective = CASES[case]
    ga, spg, _ = ACCUMULATION[accumulation]
    shared = {"gradient_accumulation_steps": ga, "steps_per_generation": spg}
    return {**trl_fields, **shared}, objective, shared


@pytest.mark.parametrize("accumulation", list(ACCUMULATION))
@pytest.mark.parametrize("case", list(CASES))
def test_loss_options_match_trl(tmp_path, case, accumulation):
    trl_fields, objective, ours_fields = config(case, accumulation)
    theirs, ours = trainer_pair(tmp_path, objective, trl_fields, ours_fields)
    ga, _, items = ACCUMULATION[accumulation]
    for seed in range(3):
        loss = compare(theirs, ours, crafted_inputs(theirs, seed, num_items_in_batch=items), ga)
        assert loss.abs() > 1e-4  # a real loss, not two zeros


def test_delta_below_the_clip_range_is_not_dual_clip(tmp_path):
    """delta = 1.1 < 1 + epsilon_high also caps positive-advantage ratios: dual_clip = 1.1 would differ (and is refused)."""
    theirs, ours = trainer_pair(tmp_path, {"extends": "dapo", **NO_DUAL}, {**DAPO, "delta": 1.1})
    inputs = crafted_inputs(theirs, 0)
    loss, _ = loss_and_grads(theirs, inputs)
    plain, _ = loss_and_grads(ours, inputs)
    assert (loss - plain).abs() > 1e-4


@pytest.mark.parametrize("spg", [1, 2])
def test_bnpo_is_token_mean_over_valid_tokens(tmp_path, spg):
    """bnpo normalises by the micro-batch's tokens; rlstab's token-mean by the window's (TRL's num_items_in_batch).

    GA = 1: the same. GA = spg = 2 with num_items_in_batch = 2 x the micro-batch's tokens (both
    micro-batches of the window equally long): the same too.
    """
    ga = spg
    objective = {"extends": "grpo", **NO_DUAL, "aggregation": {"kind": "token-mean", "count": "valid"}}
    fields = {"gradient_accumulation_steps": ga, "steps_per_generation": spg}
    theirs, ours = trainer_pair(tmp_path, objective, {"loss_type": "bnpo", **fields}, fields)
    for seed in range(3):
        inputs = crafted_inputs(theirs, seed)
        inputs["num_items_in_batch"] = inputs["completion_mask"].sum().float() * spg
        compare(theirs, ours, inputs, ga)


def test_bnpo_depends_on_the_micro_batch_where_rlstab_does_not(tmp_path):
    """With GA = 2 and a window whose micro-batches differ in length, bnpo is not the step's token-mean."""
    objective = {"extends": "grpo", **NO_DUAL, "aggregation": {"kind": "token-mean", "count": "valid"}}
    fields = {"gradient_accumulation_steps": 2, "steps_per_generation": 2}
    theirs, ours = trainer_pair(tmp_path, objective, {"loss_type": "bnpo", **fields}, fields)
    inputs = crafted_inputs(theirs, 0, num_items_in_batch=80.0)  # the other micro-batch is longer
    loss, _ = loss_and_grads(theirs, inputs, 2)
    our_loss, _ = loss_and_grads(ours, inputs, 2)
    # TRL: sum / n_mb / 2; rlstab: sum / (80 * 2 / 2)
    n = float(inputs["completion_mask"].sum())
    assert our_loss.item() == pytest.approx(loss.item() * (2 * n) / 80.0, rel=1e-5)


# ---------------------------------------------------------------- the off-policy sequence mask

@pytest.mark.parametrize("threshold", [0.1, 0.3])
def test_off_policy_mask_on_old_logprobs_matches_trl(tmp_path, threshold):
    """Without vLLM, TRL measures the drift from ``old_per_token_logps``: ``behaviour: old``."""
    objective = {"extends": "dapo", "masks": [{"kind": "off_policy_sequence", "threshold": threshold, "behaviour": "old"}]}
    theirs, ours = trainer_pair(tmp_path, objective, {**DAPO, "delta": 10.0, "off_policy_mask_threshold": threshold})
    silenced = 0.0
    for seed in range(4):
        compare(theirs, ours, crafted_inputs(theirs, seed))
        silenced += last_metrics(ours)["rlstab/mask/off_policy_sequence/silenced"]
    assert silenced > 0  # the mask did act on these batches


@pytest.mark.parametrize("accumulation", ["ga1", "ga2"])
def test_dsv32_mask_preset_on_vllm_logprobs_matches_trl(tmp_path, accumulation):
    """With vLLM, TRL measures from ``sampling_per_token_logps``: the dsv32_mask preset (GRPO loss, delta 0.5)."""
    ga, spg, items = ACCUMULATION[accumulation]
    fields = {"gradient_accumulation_steps": ga, "steps_per_generation": spg}
    theirs, ours = trainer_pair(
        tmp_path, {"extends": "dsv32_mask", "masks": [{"kind": "off_policy_sequence", "threshold": 0.5,
                                                       "behaviour": "old"}]},
        {"loss_type": "grpo", "off_policy_mask_threshold": 0.5, **fields}, fields,
    )
    with_objective(ours, "dsv32_mask")
    with_vllm(theirs, ours, correction=False)
    silenced = 0.0
    for seed in range(4):
        inputs = crafted_inputs(theirs, seed, num_items_in_batch=items)
        # no NaN here: the adapter gives a token vLLM could not score the old log-probability (TRL's IS rule),
        # where TRL's off-policy mask counts a gap of 0 for it
        inputs["sampling_per_token_logps"] = sampling_logps(inputs, seed, spread=1.0, offset=0.4, nan_at=None)
        compare(theirs, ours, inputs, ga)
        silenced += last_metrics(ours)["rlstab/mask/off_policy_sequence/silenced"]
    assert silenced > 0


# ---------------------------------------------------------------- adaptive entropy control

def mean_entropy(trainer, inputs) -> float:
    with torch.no_grad():
        _, entropies, _ = trainer._get_per_token_logps_and_entropies(
            trainer.model,
            torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], dim=1),
            torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1),
            inputs["completion_ids"].size(1),
            compute_entropy=True,
        )
    mask = inputs["completion_mask"].bool()
    return float(entropies[mask].mean())


def test_adaptive_entropy_matches_trl_step_by_step(tmp_path):
    """Loss, gradients and the coefficient over 6 optimizer steps (GA = 1), the target between the steps' entropies."""
    controller = {"coef": 0.05, "delta": 0.02, "coef_min": 0.0, "coef_max": 0.09}
    probe, _ = trainer_pair(tmp_path / "probe", "dapo", {})
    steps = [crafted_inputs(probe, seed) for seed in range(6)]
    entropies = [mean_entropy(probe, inputs) for inputs in steps]
    target = sorted(entropies)[2] + 1e-3  # three steps at or below the target, three above
    objective = {"extends": "dapo", "regularisers": [{
        "kind": "adaptive_entropy", **controller, "target_entropy": target,
        "measure": "entropy", "boundary": "at_or_below", "first_step": "off",
    }]}
    trl_fields = {**DAPO, "delta": 10.0, "use_adaptive_entropy": True, "entropy_coef": controller["coef"],
                  "entropy_coef_delta": controller["delta"], "entropy_coef_min": controller["coef_min"],
                  "entropy_coef_max": controller["coef_max"], "entropy_target": target}
    theirs, ours = trainer_pair(tmp_path, objective, trl_fields)
    coefficients, applied = [], []
    for step, inputs in enumerate(steps):
        ours.state.global_step = step  # one optimizer step per micro-batch: the controller moves once
        compare(theirs, ours, inputs)
        state = ours.rlstab_compiled.state_dict()["regularisers[0] (adaptive_entropy)"]
        assert state["coef"] == pytest.approx(theirs.entropy_coef, abs=1e-12)
        assert state["entropy"] == pytest.approx(theirs._last_world_entropy, abs=1e-6)
        assert last_metrics(theirs)["entropy_coef"] == pytest.approx(state["coef"])
        coefficients.append(state["coef"])
        applied.append(last_metrics(ours)["rlstab/regulariser/adaptive_entropy/applied"])
    assert len(set(round(c, 9) for c in coefficients)) > 2  # the coefficient moved both ways
    assert applied[0] == 0.0 and any(a > 0 for a in applied)  # gate closed before the first measurement


# ---------------------------------------------------------------- vLLM importance-sampling modes

def trl_importance_ratio(inputs, mode: str, clip_min, clip_max) -> torch.Tensor:
    """TRL's rule (grpo_config.py's documentation of ``vllm_importance_sampling_mode``), written out for the test."""
    mask = inputs["completion_mask"]
    diff = torch.nan_to_num((inputs["old_per_token_logps"] - inputs["sampling_per_token_logps"]) * mask, nan=0.0)
    if mode.startswith("sequence"):
        diff = diff.sum(-1, keepdim=True)
    ratio = diff.exp()
    if mode.endswith("truncate"):
        return ratio.clamp(min=clip_min, max=clip_max)
    low = -math.inf if clip_min is None else clip_min
    return ratio.masked_fill((ratio < low) | (ratio > clip_max), 0.0)


def rlstab_importance_objective(mode: str, clip_min, clip_max) -> dict:
    level = "token" if mode.startswith("token") else "sequence"
    weight = {"kind": "tis", "level": level, "cap": clip_max}
    if mode.endswith("truncate"):
        return {"extends": "dapo", "reweighters": [{**weight, "floor": clip_min}]}
    low = 0.0 if clip_min is None else clip_min
    if level == "token":
        mask = {"kind": "icepop", "low": low, "high": clip_max, "rejected": "masked"}
    else:
        mask = {"kind": "rollout_rejection", "level": "sequence_sum", "divergence": "k1", "low": low,
                "high": clip_max, "rejected": "masked"}
    return {"extends": "dapo", "masks": [mask], "reweighters": [weight]}


MODES = ["token_truncate", "token_mask", "sequence_truncate", "sequence_mask"]


@pytest.mark.parametrize("clip_min", [None, 0.5])
@pytest.mark.parametrize("mode", MODES)
def test_importance_sampling_modes_match_trl(tmp_path, mode, clip_min):
    clip_max = 3.0  # TRL's default vllm_importance_sampling_clip_max
    theirs, ours = trainer_pair(tmp_path, "dapo", {**DAPO, "delta": 10.0, "vllm_importance_sampling_mode": mode,
                                                    "vllm_importance_sampling_clip_min": clip_min})
    with_objective(ours, rlstab_importance_objective(mode, clip_min, clip_max))
    with_vllm(theirs, ours, correction=True)
    changed = 0
    for seed in range(3):
        inputs = crafted_inputs(theirs, seed)
        inputs["sampling_per_token_logps"] = sampling_logps(inputs, seed, spread=0.6 if mode.startswith("token") else 0.3)
        inputs["importance_sampling_ratio"] = trl_importance_ratio(inputs, mode, clip_min, clip_max)
        ratio = inputs["importance_sampling_ratio"]
        changed += int(((ratio == 0) | (ratio == clip_max) | (ratio == (clip_min or -1))).any())
        compare(theirs, ours, inputs)
    assert changed  # the bounds did bind on these batches


def test_the_objectives_read_vllms_logprobs(tmp_path):
    """The IS-mode objectives compute their weights from sampling_per_token_logps, not from TRL's ratio."""
    theirs, ours = trainer_pair(tmp_path, "dapo", {**DAPO, "delta": 10.0})
    with_objective(ours, rlstab_importance_objective("token_truncate", None, 3.0))
    with_vllm(theirs, ours, correction=False)
    inputs = crafted_inputs(theirs, 0)
    inputs["sampling_per_token_logps"] = current_logps(theirs, inputs)
    plain, _ = loss_and_grads(theirs, inputs)
    weighted, _ = loss_and_grads(ours, inputs)
    assert (plain - weighted).abs() > 1e-4
