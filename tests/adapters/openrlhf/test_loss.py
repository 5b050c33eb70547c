"""RlstabPolicyLoss beyond conformance: masks with OpenRLHF's counts, entropy, the objective's source, refusals."""

import logging
import math
import sys

import pytest
import torch

import rlstab
from rlstab.adapters.openrlhf import RlstabPolicyLoss
from rlstab.adapters.openrlhf.config import (
    OBJECTIVE_ENV,
    STEP_STATISTICS_ENV,
    build_objective,
    objective_to_env,
)
from rlstab.adapters.openrlhf.entropy import ENTROPY_ATTRIBUTE, detached_entropy
from rlstab.adapters.openrlhf.inputs import token_batch
from rlstab.errors import ConfigError

from openrlhf_batches import random_micro_batch


def test_the_openrlhf_loss_module_loads_without_openrlhf_models_init():
    assert isinstance(RlstabPolicyLoss(objective="grpo"), torch.nn.Module)
    assert "openrlhf.models" not in sys.modules and "flash_attn" not in sys.modules
    assert RlstabPolicyLoss.__mro__[1].__name__ == "PolicyLoss"


def test_kept_count_is_openrlhfs_global_count_times_the_micro_batch_kept_share():
    # 2 responses of 2 valid tokens, A = +1, r = 1, no clipping: l = -1 per token.
    # low_probability silences the token with p = 0.001 (< 0.002, A > 0): 3 of 4 kept.
    log_probs = torch.log(torch.tensor([[0.5, 0.001], [0.5, 0.5]])).requires_grad_()
    objective = {"masks": [{"kind": "low_probability"}], "surrogate": {"kind": "none"},
                 "aggregation": {"kind": "token-mean", "count": "kept"}}
    loss_fn = RlstabPolicyLoss(objective=objective, step_statistics="local")  # the micro-batch is its own step
    loss, clip_ratio, ppo_kl, vllm_kl, is_filter_ratio = loss_fn(
        log_probs, log_probs.detach(), torch.ones(2, 2), action_mask=torch.ones(2, 2, dtype=torch.bool),
        dp_size=2, batch_num_tokens=torch.tensor(40.0), global_batch_size=torch.tensor(20.0))
    # N_kept = 40 * 3/4 = 30; loss = -3 / 30 * dp_size 2 = -0.2
    assert loss.item() == pytest.approx(-0.2)
    loss.backward()
    # d loss / d logp = -A r / N_kept * dp_size = -1/15 on kept tokens, 0 on the silenced one
    assert torch.allclose(log_probs.grad, torch.tensor([[-1 / 15, 0.0], [-1 / 15, -1 / 15]]))
    assert loss_fn.last_metrics["mask/low_probability/silenced"] == 1.0
    assert (clip_ratio.item(), ppo_kl.item(), vllm_kl, is_filter_ratio) == (0.0, 0.0, None, None)


def test_entropy_reading_objective_refuses_log_probs_without_entropy():
    loss_fn = RlstabPolicyLoss(objective="stapo", step_statistics="local")
    log_probs = torch.full((1, 3), -1.0, requires_grad=True)
    args = (log_probs, log_probs.detach(), torch.ones(1, 3))
    with pytest.raises(ValueError, match=r"masks\[0\] \(s2t\) of objective 'stapo' reads the per-token entropy"):
        loss_fn(*args, action_mask=torch.ones(1, 3, dtype=torch.bool))
    setattr(log_probs, ENTROPY_ATTRIBUTE, torch.full((1, 3), 0.5))
    loss, *_ = loss_fn(*args, action_mask=torch.ones(1, 3, dtype=torch.bool))
    assert loss_fn.last_metrics["entropy/mean"] == pytest.approx(0.5)


def test_objective_comes_from_the_environment_when_not_given(monkeypatch):
    monkeypatch.delenv(OBJECTIVE_ENV, raising=False)
    with pytest.raises(ValueError, match=rf"\${OBJECTIVE_ENV} is not set: start the run with"):
        RlstabPolicyLoss()
    monkeypatch.setenv(OBJECTIVE_ENV, objective_to_env(build_objective("dapo", {"surrogate": {"eps_high": 0.3}})))
    loss_fn = RlstabPolicyLoss(clip_eps_low=0.2, clip_eps_high=0.28, dual_clip=10.0)
    assert loss_fn.objective.surrogate.eps_high == 0.3 and loss_fn.objective.surrogate.dual_clip == 10.0


def test_openrlhf_settings_the_objective_overrides_are_logged(caplog):
    with caplog.at_level(logging.WARNING):
        RlstabPolicyLoss(clip_eps_low=0.2, clip_eps_high=0.28, dual_clip=10.0, objective="dapo")
    assert caplog.text == ""  # OpenRLHF's settings agree with DAPO's
    with caplog.at_level(logging.WARNING):
        RlstabPolicyLoss(token_level_loss=False, objective="stapo")
    assert "clip range 0.2/0.2 (the objective's is 0.2/0.28)" in caplog.text
    assert "dual_clip=None (the objective's is 10.0)" in caplog.text
    assert "loss_agg_mode seq-mean-token-mean (the objective aggregates with token-mean)" in caplog.text


def test_openrlhf_validates_its_own_arguments():
    with pytest.raises(ValueError, match="is_correction_level must be off/token/seq"):
        RlstabPolicyLoss(is_correction_level="tokens", objective="grpo")


def test_unsupported_components_are_refused_with_the_openrlhf_flag():
    with pytest.raises(ConfigError, match=r"regularisers\[0\] \(entropy_bonus\): not available in OpenRLHF; .*--actor.entropy_coef"):
        build_objective("grpo", {"regularisers": [{"kind": "entropy_bonus", "coef": 0.01}]})


def test_detached_entropy_is_exact_in_chunks_and_has_no_graph():
    logits = (torch.randn(2, 5, 7) * 3).requires_grad_()
    exact = -(torch.softmax(logits, -1) * torch.log_softmax(logits, -1)).sum(-1)
    got = detached_entropy(logits, chunk_rows=3)  # 10 rows in chunks of 3, 3, 3, 1
    torch.testing.assert_close(got, exact.detach(), rtol=1e-5, atol=1e-6)
    assert not got.requires_grad
    uniform = detached_entropy(torch.zeros(1, 4))
    assert uniform.item() == pytest.approx(math.log(4))  # H of a uniform over 4 = log 4


def test_rollout_reading_components_name_the_openrlhf_flag(monkeypatch):
    loss_fn = RlstabPolicyLoss(objective="grpo", step_statistics="local")
    # as for any component that reads TokenBatch.rollout_logprobs (rollout rejection masks)
    monkeypatch.setattr(loss_fn.compiled, "readers", lambda f: ["masks[1] (probe)"] if f == "rollout_logprobs" else [])
    log_probs = torch.full((1, 2), -1.0, requires_grad=True)
    with pytest.raises(ValueError, match=r"masks\[1\] \(probe\) reads vLLM's log-probabilities, .*is_correction_level"):
        loss_fn(log_probs, log_probs.detach(), torch.ones(1, 2), action_mask=torch.ones(1, 2, dtype=torch.bool))


def test_step_wide_mode_is_the_default_and_refuses_a_call_without_the_steps_statistics(monkeypatch):
    monkeypatch.delenv(STEP_STATISTICS_ENV, raising=False)
    loss_fn = RlstabPolicyLoss(objective="grpo")
    assert loss_fn.step_statistics == "optimizer_step"
    log_probs = torch.full((1, 2), -1.0, requires_grad=True)
    # outside ppo_train nothing gathered the step: refused, never silently a step of its own
    with pytest.raises(RuntimeError, match=r"without the optimizer step's statistics: .*step_statistics='local'"):
        loss_fn(log_probs, log_probs.detach(), torch.ones(1, 2), action_mask=torch.ones(1, 2, dtype=torch.bool))
    monkeypatch.setenv(STEP_STATISTICS_ENV, "local")
    assert RlstabPolicyLoss(objective="grpo").step_statistics == "local"
    monkeypatch.setenv(STEP_STATISTICS_ENV, "locl")
    with pytest.raises(ConfigError, match=r"RLSTAB_OPENRLHF_STEP_STATISTICS.*'locl': must be one of optimizer_step, local"):
        RlstabPolicyLoss(objective="grpo")
    with pytest.raises(ConfigError, match=r"step_statistics=\.\.\.\).*'micro': must be one of"):
        RlstabPolicyLoss(objective="grpo", step_statistics="micro")


def test_dynamic_batching_is_refused_when_the_trainer_is_built_in_step_wide_mode():
    from types import SimpleNamespace as NS

    from rlstab.adapters.openrlhf.step_scope import check_trainer

    trainer = NS(args=NS(train=NS(dynamic_batch_enable=True)), strategy=NS())
    with pytest.raises(ValueError, match=r"^rlstab: step_statistics='optimizer_step' does not support "
                                         r"--train.dynamic_batch_enable"):
        check_trainer(trainer, RlstabPolicyLoss(objective="stapo", step_statistics="optimizer_step"))
    check_trainer(trainer, RlstabPolicyLoss(objective="stapo", step_statistics="local"))  # one rank: allowed


def test_a_gpu_without_the_kernels_gets_openrlhfs_entropy_under_no_grad(monkeypatch):
    # The switched compute_entropy, asked for the detached entropy of logits off the CPU for which rlstab
    # would run its torch path (no Triton): OpenRLHF's own function, without a graph. The meta device
    # stands for such a GPU.
    from types import SimpleNamespace

    from rlstab.adapters.openrlhf import entropy

    seen = []

    def original(logits):
        seen.append((logits.device.type, torch.is_grad_enabled()))
        return logits.sum(-1)

    module = SimpleNamespace(compute_entropy=original)
    entropy.switch_compute_entropy(module)
    monkeypatch.setattr(entropy, "runs_fused", lambda logits: False)
    token = entropy._DETACHED.set(True)
    try:
        module.compute_entropy(torch.zeros(2, 5, device="meta", requires_grad=True))
        cpu = module.compute_entropy(torch.zeros(2, 5, requires_grad=True))  # the CPU: rlstab's detached entropy
    finally:
        entropy._DETACHED.reset(token)
    assert seen == [("meta", False)]
    assert not cpu.requires_grad and torch.allclose(cpu, torch.full((2,), math.log(5)))  # uniform over 5


def test_a_rejection_into_padding_leaves_openrlhfs_counts_as_it_leaves_the_whole_step():
    """OpenRLHF counts tokens from ``action_mask``; a rejection with ``rejected: padding`` takes them out of the step.

    One micro-batch on one rank is the whole step: with OpenRLHF's counts of it, the loss and the
    gradient are those of the objective computed on it at once (tests/adapters/verl/test_rejection.py
    holds two ranks to the same).
    """
    batch = random_micro_batch(seed=4)
    objective = {"extends": "grpo", "masks": [
        {"kind": "rollout_rejection", "level": "token", "divergence": "k1", "high": 1.5, "rejected": "padding"}]}
    mask = batch["action_mask"]
    loss_fn = RlstabPolicyLoss(objective=objective, step_statistics="local", is_correction_level="token",
                               is_correction_mode="clip", is_correction_threshold=(0.0, 100.0))
    leaf = batch["log_probs"].clone().requires_grad_()
    loss, *_ = loss_fn(leaf, batch["old_log_probs"], batch["advantages"], action_mask=mask,
                       rollout_log_probs=batch["rollout_log_probs"], dp_size=1,
                       batch_num_tokens=mask.sum().float(), global_batch_size=(mask.sum(-1) > 0).sum().float())
    loss.backward()
    whole_leaf = batch["log_probs"].clone().requires_grad_()
    whole, _, _ = token_batch(loss_fn, whole_leaf, batch["old_log_probs"], batch["advantages"], mask,
                              batch["rollout_log_probs"], None)
    out = rlstab.load(objective).compile()(whole)
    out.loss.backward()
    assert 0 < out.metrics["tokens/valid"] < mask.sum().item()  # the mask rejected tokens
    assert loss.item() == pytest.approx(out.loss.item(), rel=1e-6)
    torch.testing.assert_close(leaf.grad, whole_leaf.grad)
