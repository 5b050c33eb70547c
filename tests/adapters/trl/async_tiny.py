"""A tiny real ``AsyncGRPOTrainer`` setup on the CPU: the trainer's class, loss call and optimizer step are TRL's.

``trl.experimental.async_grpo.AsyncGRPOTrainer`` normally gets its rollouts from a vLLM server
through its rollout worker, syncs weights to that server over NCCL, and runs attention with
FlashAttention-3 over a prefix tree. None of these exist here, so three seams are filled, each
the narrowest the class offers:

- ``rollout_worker=`` (the class's ``RolloutWorkerProtocol``, documented for stubs in tests):
  [`StandInRolloutWorker`] samples completions token by token from a tiny model (a *stale* copy
  of the policy: its weights are perturbed, so the sampler's log-probabilities differ from the
  trainer's as a lagging vLLM's do), scores them with a reward in code, normalises the rewards
  per group as TRL's worker does, and queues real ``RolloutSample``s with the sampler's
  log-probabilities;
- ``weight_transfer=`` (``WeightTransferProtocol``): a no-op, as TRL's docstring suggests;
- the CUDA-only lookups ([`on_the_cpu`]): the FlashAttention-3 kernel behind TRL's ``tree_fa3`` attention (downloaded from the Hub on a
  GPU): a torch function computes the same varlen causal attention, so TRL's own ``tree_attention``
  (the K/V gather along each segment's root-to-segment path) still runs; and the card's peak FLOPs
  (for MFU metrics only).

Nothing is downloaded: the model is the tiny Llama of ``trl_tiny``, saved to a folder, because
the async trainer loads its model from a path.
"""

from __future__ import annotations

import contextlib
import math
import queue
import types

import numpy as np
import torch
from trl.experimental.async_grpo import AsyncGRPOConfig, AsyncGRPOTrainer, packing
from trl.experimental.async_grpo import async_grpo_trainer as trainer_module
from trl.experimental.async_grpo.async_rollout_worker import RolloutSample

from trl_tiny import PROMPTS, dataset, tiny_model, tokenizer

NUM_GENERATIONS = 4
MAX_COMPLETION = 6


def _varlen_attention(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale=None,
                      causal=True, window_size=(-1, -1), **_):
    """FlashAttention's ``flash_attn_varlen_func`` in torch: segment s's queries attend to its keys, causally.

    ``q`` ``[Nq, H, D]``, ``k``/``v`` ``[Nk, Hkv, D]`` (grouped-query heads repeated). Causal is
    FlashAttention's bottom-right alignment: query i of a segment with ``Lq`` queries and ``Lk``
    keys sees keys ``j <= i + Lk - Lq`` (its path's prefix, then its own segment up to itself).
    """
    assert causal and tuple(window_size) == (-1, -1)
    heads, kv_heads = q.shape[1], k.shape[1]
    k = k.repeat_interleave(heads // kv_heads, dim=1)
    v = v.repeat_interleave(heads // kv_heads, dim=1)
    scale = softmax_scale if softmax_scale is not None else q.shape[-1] ** -0.5
    out = torch.empty_like(q)
    for s in range(cu_seqlens_q.numel() - 1):
        q0, q1 = int(cu_seqlens_q[s]), int(cu_seqlens_q[s + 1])
        k0, k1 = int(cu_seqlens_k[s]), int(cu_seqlens_k[s + 1])
        qs, ks, vs = q[q0:q1].transpose(0, 1), k[k0:k1].transpose(0, 1), v[k0:k1].transpose(0, 1)
        scores = (qs.float() @ ks.float().transpose(-1, -2)) * scale
        lq, lk = q1 - q0, k1 - k0
        allowed = torch.arange(lk).unsqueeze(0) <= torch.arange(lq).unsqueeze(1) + (lk - lq)
        scores = scores.masked_fill(~allowed, float("-inf"))
        out[q0:q1] = (scores.softmax(-1) @ vs.float()).transpose(0, 1).to(q.dtype)
    return out


CPU_FLASH = types.SimpleNamespace(flash_attn_varlen_func=_varlen_attention)


@contextlib.contextmanager
def on_the_cpu():
    """Within it, the two CUDA-only lookups of the async trainer answer on the CPU.

    TRL's ``tree_fa3`` attention asks ``packing._flash_attn()`` for its kernel: it gets
    [`_varlen_attention`]. ``AsyncGRPOTrainer.__init__`` asks ``get_peak_flops_per_device`` for the
    card's peak (``torch.cuda.get_device_name``), only for its MFU metrics: it gets None, which the
    trainer reads as "unknown" and then logs no MFU. The vLLM client, which ``__init__`` builds but
    this setup never calls (``token_budget`` is set and the weight transfer is injected), is
    [`NoServer`] (TRL's needs ``requests``, which the test environment lacks).
    """
    originals = packing._flash_attn, trainer_module.get_peak_flops_per_device, trainer_module.VLLMClient
    packing._flash_attn = lambda: CPU_FLASH
    trainer_module.get_peak_flops_per_device = lambda accelerator, dtype: None
    trainer_module.VLLMClient = NoServer
    try:
        yield
    finally:
        packing._flash_attn, trainer_module.get_peak_flops_per_device, trainer_module.VLLMClient = originals


class NoServer:
    """The vLLM client of a run without a server: built, never called (a call fails the test)."""

    def __init__(self, server_url: str, server_timeout: float = 240.0):
        self.server_url = server_url

    def __getattr__(self, name):
        raise AssertionError(f"the test has no vLLM server, yet the trainer called VLLMClient.{name}")


def digit_reward(text: str) -> float:
    """The fraction of digits in a completion (so rewards differ within a group)."""
    return sum(ch.isdigit() for ch in text) / max(len(text), 1)


class NoWeightTransfer:
    """``WeightTransferProtocol`` without a server: every call does nothing."""

    def init_weight_transfer(self): ...
    def pause(self): ...
    def send_weights(self, iterator):
        for _ in iterator:
            pass
    def resume(self): ...
    def destroy(self): ...


class StandInRolloutWorker:
    """``RolloutWorkerProtocol``: groups of completions sampled from a stale copy of the policy, scored, queued.

    The rollouts are made at construction (deterministic under ``seed``) and queued by ``start()``,
    as TRL's worker starts producing once the trainer's first weight sync is done. Each sample
    carries the sampler's per-token log-probabilities of its completion tokens (0 on prompt
    tokens, as TRL's worker zero-fills context), the group-normalised advantage
    ``(R - mean) / (std + 1e-8)`` (population std, TRL's ``_score_group``) and model version 0.
    """

    def __init__(self, *, seed: int = 0, groups: int = 4, staleness_noise: float = 0.3, sharpen: float = 8.0):
        self.rollout_buffer: queue.Queue = queue.Queue()
        self.metrics_queue: queue.Queue = queue.Queue()
        self.versions: list[int] = []
        self.samples = rollouts(seed=seed, groups=groups, staleness_noise=staleness_noise, sharpen=sharpen)

    def start(self) -> None:
        for sample in self.samples:
            self.rollout_buffer.put(sample)

    def stop(self) -> None: ...

    def update_model_version(self, model_version: int) -> None:
        self.versions.append(model_version)

    def check_health(self, stale_after_s: float) -> None:
        raise RuntimeError("the stand-in rollout worker has no more samples")


@torch.no_grad()
def rollouts(*, seed: int, groups: int, staleness_noise: float, sharpen: float) -> list[RolloutSample]:
    tok = tokenizer()
    sampler = tiny_model(sharpen=sharpen)
    g = torch.Generator().manual_seed(seed + 1)
    for p in sampler.parameters():  # a stale policy: the trainer's weights plus noise
        p.add_(staleness_noise * p.abs().mean() * torch.randn(p.shape, generator=g))
    sampler.eval()
    samples = []
    for group in range(groups):
        prompt = PROMPTS[group % len(PROMPTS)]
        prompt_ids = tok(prompt)["input_ids"]
        drawn = [_sample(sampler, prompt_ids, tok.eos_token_id, g) for _ in range(NUM_GENERATIONS)]
        rewards = np.array([digit_reward(tok.decode(ids)) for ids, _ in drawn])
        advantages = (rewards - rewards.mean()) / (rewards.std() + 1e-8)
        for (ids, logps), advantage, reward in zip(drawn, advantages, rewards):
            samples.append(RolloutSample(
                prompt=[{"role": "user", "content": prompt}],
                completion=[{"role": "assistant", "content": tok.decode(ids)}],
                input_ids=np.asarray(prompt_ids + ids, dtype=np.int64),
                completion_mask=np.asarray([0] * len(prompt_ids) + [1] * len(ids), dtype=np.int64),
                old_log_probs=np.asarray([0.0] * len(prompt_ids) + logps, dtype=np.float32),
                advantage=float(advantage),
                model_version=0,
                group_id=group,
                metrics={"reward": float(reward), "reward_std": float(rewards.std())},
            ))
    return samples


def _sample(model, prompt_ids: list[int], eos: int, g: torch.Generator) -> tuple[list[int], list[float]]:
    """One completion sampled at temperature 1, with each token's log-probability under the sampler."""
    ids, logps = [], []
    for _ in range(MAX_COMPLETION):
        logits = model(torch.tensor([prompt_ids + ids])).logits[0, -1].float()
        logp = logits.log_softmax(-1)
        token = int(torch.multinomial(logp.exp(), 1, generator=g))
        ids.append(token)
        logps.append(float(logp[token]))
        if token == eos:
            break
    return ids, logps


def saved_policy(directory, sharpen: float = 8.0) -> str:
    """The tiny model and its tokenizer saved in ``directory`` (the async trainer loads its model from a path)."""
    tiny_model(sharpen=sharpen).save_pretrained(directory)
    tokenizer().save_pretrained(directory)
    return str(directory)


def async_config(tmp_path, **overrides) -> AsyncGRPOConfig:
    """A CPU float32 AsyncGRPOConfig: one optimizer step of 4 samples per micro-batch, fixed-count batches."""
    fields = dict(
        output_dir=str(tmp_path / "out"),
        per_device_train_batch_size=4,
        gradient_accumulation_steps=1,
        num_generations=NUM_GENERATIONS,
        max_completion_length=MAX_COMPLETION,
        max_steps=1,
        token_budget=0,  # FixedCountBatcher: no vLLM server to ask for max_model_len
        logging_steps=1,
        learning_rate=1e-2,
        report_to=[],
        save_strategy="no",
        use_cpu=True,
        seed=0,
        disable_tqdm=True,
    )
    fields.update(overrides)
    return AsyncGRPOConfig(**fields)


def make_async_trainer(tmp_path, cls=AsyncGRPOTrainer, worker=None, **kwargs):
    """``cls`` (TRL's AsyncGRPOTrainer or rlstab's subclass) on the saved tiny model, with the stand-in worker."""
    config = kwargs.pop("args", None) or async_config(tmp_path, **kwargs.pop("config", {}))
    return cls(
        model=saved_policy(tmp_path / "policy"),
        args=config,
        train_dataset=dataset(),
        processing_class=tokenizer(),
        rollout_worker=worker if worker is not None else StandInRolloutWorker(),
        weight_transfer=NoWeightTransfer(),
        **kwargs,
    )


def micro_batches(trainer, count: int = 1) -> list[dict]:
    """The first ``count`` micro-batches of the trainer's own dataloader (queue, batcher, collator: TRL's)."""
    trainer.rollout_worker.start()
    iterator = iter(trainer.get_train_dataloader())
    return [next(iterator) for _ in range(count)]


def finite(values) -> bool:
    return all(math.isfinite(v) for v in values)
