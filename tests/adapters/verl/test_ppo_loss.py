"""The ``rlstab`` loss inside verl's real ``ppo_loss``, with a model output that carries entropy.

verl's ``ppo_loss`` passes entropy only to its entropy bonus; rlstab's wrapper makes it visible
to the registered loss. These tests build a micro-batch the way verl's trainer does (left/right
padded, then ``left_right_2_no_padding``), a model output of nested tensors as the fsdp engine
returns it, and check that S2T's mask follows the entropy it was given.
"""

import pytest
import torch
from verl.workers.utils import losses

import rlstab

from verl_batches import actor_config, micro_batch


def inputs():
    # Row 0: positive advantage; its token 1 has p = 0.001 < tau_p 0.002 -> silenced by S2T iff its
    # entropy is below the step's 80th percentile. Row 1: negative advantage (S2T never silences).
    logprobs = torch.log(torch.tensor([[0.5, 0.001, 0.4, 0.3], [0.2, 0.001, 0.6, 0.0]]))
    advantages = torch.tensor([[1.0] * 4, [-1.0] * 4])
    return logprobs, advantages, [4, 3], [2, 3]


def run_ppo_loss(entropy, **actor):
    logprobs, advantages, response_lengths, prompt_lengths = inputs()
    model_output, data, leaf, mask = micro_batch(logprobs, entropy, advantages, response_lengths, prompt_lengths)
    config = actor_config("stapo", calculate_entropy=True, **actor)
    loss, metrics = losses.ppo_loss(config=config, model_output=model_output, data=data, dp_group=None)
    loss.backward()
    return loss.detach(), leaf.grad, metrics, mask


def value(metric):
    return metric.aggregate() if hasattr(metric, "aggregate") else metric


def test_s2t_reads_the_entropy_of_the_model_output():
    # 7 valid tokens. Entropies: the low-probability token (row 0, t1) gets 0.1 in the first run,
    # 0.9 in the second. Valid entropies, run 1: 0.5 0.1 0.6 0.7 | 0.2 0.3 0.4 -> sorted
    # 0.1 0.2 0.3 0.4 0.5 0.6 0.7; Q_0.8 at position 0.8 * 6 = 4.8: 0.5 + 0.8 * 0.1 = 0.58 -> 0.1 < 0.58: silenced.
    # Run 2: 0.2 0.3 0.4 0.5 0.6 0.7 0.9, Q_0.8 = 0.6 + 0.8 * 0.1 = 0.68; 0.9 >= 0.68: kept.
    low = torch.tensor([[0.5, 0.1, 0.6, 0.7], [0.2, 0.3, 0.4, 0.0]])
    high = low.clone()
    high[0, 1] = 0.9
    loss_low, grad_low, m_low, _ = run_ppo_loss(low)
    loss_high, grad_high, m_high, _ = run_ppo_loss(high)
    assert value(m_low["actor/rlstab/mask/s2t/silenced"]) == 1.0
    assert value(m_low["actor/rlstab/mask/s2t/entropy_threshold"]) == pytest.approx(0.58)
    assert value(m_high["actor/rlstab/mask/s2t/silenced"]) == 0.0
    assert value(m_high["actor/rlstab/mask/s2t/entropy_threshold"]) == pytest.approx(0.68)
    assert grad_low[0, 1] == 0.0 and grad_high[0, 1] != 0.0
    # On-policy (r = 1), l = -A per kept token; token-mean over kept tokens, N_kept = 7 * (6/7) = 6:
    # run 1: (-3 + 3) / 6 = 0; run 2: (-4 + 3) / 7.
    assert loss_low.item() == pytest.approx(0.0, abs=1e-7)
    assert loss_high.item() == pytest.approx(-1 / 7)
    assert value(m_low["actor/pg_loss"]) == pytest.approx(0.0, abs=1e-7)


def test_same_loss_as_the_compiled_objective_on_the_padded_batch():
    g = torch.Generator().manual_seed(0)
    entropy = torch.rand(2, 4, generator=g)
    loss, grad, metrics, mask = run_ppo_loss(entropy)
    logprobs, advantages, _, _ = inputs()
    leaf = logprobs.clone().requires_grad_()
    batch = rlstab.TokenBatch(logprobs=leaf, old_logprobs=logprobs, advantages=advantages, response_mask=mask, entropy=entropy)
    out = rlstab.load("stapo").compile()(batch)
    out.loss.backward()
    assert loss.item() == pytest.approx(out.loss.item(), abs=1e-7)
    torch.testing.assert_close(grad * mask, leaf.grad * mask)
    assert value(metrics["actor/rlstab/tokens/kept"]) == out.metrics["tokens/kept"]


def test_missing_entropy_names_the_flag():
    logprobs, advantages, response_lengths, prompt_lengths = inputs()
    model_output, data, _, _ = micro_batch(logprobs, torch.zeros(2, 4), advantages, response_lengths, prompt_lengths)
    del model_output["entropy"]
    config = actor_config("stapo", calculate_entropy=True)
    with pytest.raises(ValueError, match=r"masks\[0\] \(s2t\).*calculate_entropy=True"):
        losses.ppo_loss(config=config, model_output=model_output, data=data, dp_group=None)


@pytest.mark.parametrize("mode", ["local", "data_parallel"])
@pytest.mark.parametrize("preset, label, scope", [
    ("bapo", "surrogate (bapo)", "optimizer step"),  # bounds from the step's ratios
    ("stare", "reweighters[0] (stare)", "optimizer step or training batch"),  # gate from the training batch's entropy
])
def test_every_stateful_preset_is_refused_per_micro_batch(mode, preset, label, scope):
    """BAPO and STARE read the whole step (or training batch), which these modes never see; skywork_entropy's
    adaptive_entropy is refused in every veRL mode (veRL adds its own fixed entropy bonus)."""
    with pytest.raises(ValueError) as info:
        actor_config(preset, step_statistics=mode, calculate_entropy=True)
    assert str(info.value) == (
        f"actor_rollout_ref.actor.policy_loss.step_statistics = {mode!r}: {label} needs the whole {scope} before its "
        "first micro-batch, but this mode sees one micro-batch at a time; use "
        "actor_rollout_ref.actor.policy_loss.step_statistics=optimizer_step (the default)"
    )
    actor_config(preset, step_statistics="optimizer_step", calculate_entropy=True)
