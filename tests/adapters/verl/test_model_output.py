"""The ``ppo_loss`` wrapper: the model output, micro-batch and group are visible to the loss while it runs, and only then.

Runs veRL's real ``ppo_loss`` (wrapped when the adapter is imported) on a micro-batch built as veRL's
trainer builds it; S2T's reading of the entropy is in test_ppo_loss.py, the metrics' reduction in test_metrics.py.
"""

import sys

import torch
from verl.workers.utils import losses

from rlstab.adapters.patching import patched_by
from rlstab.adapters.verl import model_output
from rlstab.adapters.verl.model_output import (
    current_dp_group,
    current_entropy,
    declare_metrics,
    wrap_ppo_loss,
)

from verl_batches import actor_config, micro_batch

KEY = "rlstab.adapters.verl.model_output"


def batch(entropy):
    # two responses of 3 and 2 tokens, prompts of 2 and 3 (verl_batches.micro_batch pads them as veRL does)
    logprobs = torch.log(torch.tensor([[0.5, 0.4, 0.3], [0.2, 0.6, 0.0]]).clamp(min=1e-3))
    return micro_batch(logprobs, entropy, torch.ones(2, 3), [3, 2], [2, 3])


def test_outside_ppo_loss_there_is_nothing_to_see_or_declare():
    assert current_entropy() is None and current_dp_group() is None
    assert declare_metrics({"actor/rlstab/x": 1.0}) is False


def test_inside_ppo_loss_the_loss_sees_the_entropy_padded_like_the_log_probs(monkeypatch):
    seen = {}

    def policy_loss(*args, **kwargs):
        seen["entropy"], seen["group"] = current_entropy(), current_dp_group()
        seen["declared"] = declare_metrics({"actor/rlstab/mask/x/silenced": 7.0})
        return original(*args, **kwargs)

    original = losses.get_policy_loss_fn("vanilla")
    monkeypatch.setattr(losses, "get_policy_loss_fn", lambda name: policy_loss)
    entropy = torch.tensor([[0.1, 0.2, 0.3], [0.4, 0.5, 0.0]])
    output, data, _, _ = batch(entropy)
    group = object()
    loss, metrics = losses.ppo_loss(config=actor_config("grpo"), model_output=output, data=data, dp_group=group)
    # [B, T] as the log-probs: response tokens in place, padding 0; detached
    assert torch.allclose(seen["entropy"], entropy) and not seen["entropy"].requires_grad
    assert seen["group"] is group and seen["declared"] is True
    # the declared metric replaces the entry ppo_loss returns under that name
    assert metrics["actor/rlstab/mask/x/silenced"] == 7.0
    assert current_entropy() is None  # the call is over


def test_no_entropy_in_the_model_output_reads_as_none(monkeypatch):
    seen = {}

    def policy_loss(*args, **kwargs):
        seen["entropy"] = current_entropy()
        return original(*args, **kwargs)

    original = losses.get_policy_loss_fn("vanilla")
    monkeypatch.setattr(losses, "get_policy_loss_fn", lambda name: policy_loss)
    output, data, _, _ = batch(torch.zeros(2, 3))
    del output["entropy"]  # actor.calculate_entropy off
    losses.ppo_loss(actor_config("grpo"), output, data, None)  # positionally, as a caller may
    assert "entropy" in seen and seen["entropy"] is None


def test_wrapping_again_changes_nothing_and_callers_bound_by_name_call_the_wrapper():
    import verl.workers.engine_workers as engine_workers  # binds ppo_loss by `from ... import ppo_loss`

    wrapped = losses.ppo_loss
    assert patched_by(wrapped) == (KEY,)
    wrap_ppo_loss(sys.modules)
    assert losses.ppo_loss is wrapped and patched_by(losses.ppo_loss) == (KEY,)
    assert engine_workers.ppo_loss is wrapped
    assert "verl.workers.engine_workers" in model_output._CALLERS
