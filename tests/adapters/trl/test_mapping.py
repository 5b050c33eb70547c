"""The two mappings of the adapter, by hand: TRL's micro-batch keys -> TokenBatch, TRL's normalisers -> StepCounts."""

import math

import pytest
import torch

from rlstab.adapters.trl.counts import trl_scale
from rlstab.adapters.trl.inputs import token_batch


def trl_inputs(**extra):
    inputs = {
        "completion_mask": torch.tensor([[1, 1, 0], [1, 1, 1]]),
        "advantages": torch.tensor([0.5, -1.0]),
        "old_per_token_logps": torch.full((2, 3), -1.0),
    }
    inputs.update(extra)
    return inputs


def test_keys_map_onto_the_token_batch():
    logps = torch.full((2, 3), -0.5, requires_grad=True)
    entropies = torch.ones(2, 3, requires_grad=True) * 2.0
    tool_mask = torch.tensor([[1, 0, 1], [1, 1, 1]])
    batch = token_batch(
        trl_inputs(tool_mask=tool_mask, ref_per_token_logps=torch.zeros(2, 3)),
        logps,
        entropies,
        reference=True,
    )
    assert batch.logprobs is logps
    # completion_mask * tool_mask: the tool output at [0, 1] does not train
    assert batch.response_mask.tolist() == [[True, False, False], [True, True, True]]
    assert batch.old_logprobs.tolist() == [[-1.0] * 3] * 2
    assert batch.advantages.tolist() == [0.5, -1.0]
    assert not batch.entropy.requires_grad  # detached unless an entropy bonus needs it
    assert batch.ref_logprobs is not None and batch.is_weights is None and batch.rollout_logprobs is None
    assert token_batch(trl_inputs(), logps, entropies, entropy_grad=True).entropy.requires_grad


def test_on_policy_micro_batch_has_no_old_logprobs():
    inputs = trl_inputs()
    del inputs["old_per_token_logps"]  # TRL skips computing them when generation and update are aligned
    batch = token_batch(inputs, torch.zeros(2, 3), None)
    assert batch.old_logprobs is None and batch.entropy is None


def test_per_sequence_columns_become_per_sequence_vectors():
    inputs = trl_inputs(
        advantages=torch.tensor([[0.5], [-1.0]]), importance_sampling_ratio=torch.tensor([[0.9], [1.2]])
    )
    batch = token_batch(inputs, torch.zeros(2, 3), None, is_correction=True)
    assert batch.advantages.shape == (2,) and batch.is_weights.tolist() == pytest.approx([0.9, 1.2])
    token_ratio = torch.rand(2, 3)
    batch = token_batch(
        trl_inputs(importance_sampling_ratio=token_ratio), torch.zeros(2, 3), None, is_correction=True
    )
    assert batch.is_weights is token_ratio


def test_tokens_vllm_could_not_score_get_the_old_logprob():
    sampled = torch.tensor([[-1.2, math.nan, 0.0], [-0.7, -0.8, -0.9]])
    batch = token_batch(trl_inputs(sampling_per_token_logps=sampled), torch.zeros(2, 3), None, rollout=True)
    torch.testing.assert_close(batch.rollout_logprobs, torch.tensor([[-1.2, -1.0, 0.0], [-0.7, -0.8, -0.9]]))


def test_trl_normalisers_by_hand():
    # 2 processes, 4 accumulation steps, 2 micro-batches per generation, 8 completions per micro-batch.
    scale = trl_scale(
        num_items_in_batch=120,
        micro_batch_size=8,
        padded_length=37,
        num_processes=2,
        accumulation_steps=4,
        steps_per_generation=2,
        max_completion_length=64,
        training=True,
    )
    assert scale.tokens == 240.0  # dapo: N * GA / spg = 120 * 4 / 2
    assert scale.sequences == 64.0  # grpo / dr_grpo: B * GA * P = 8 * 4 * 2
    assert (scale.max_length, scale.world_size, scale.accumulation) == (64, 2, 4)
    # evaluation: no accumulation, N as is
    scale = trl_scale(
        num_items_in_batch=120,
        micro_batch_size=8,
        padded_length=37,
        num_processes=2,
        accumulation_steps=4,
        steps_per_generation=2,
        max_completion_length=None,
        training=False,
    )
    assert (scale.tokens, scale.sequences, scale.max_length, scale.accumulation) == (120.0, 16.0, 37, 1)
